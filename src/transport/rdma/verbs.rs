//! The verbs library, loaded at run time: a typed table of exactly the functions the fabric
//! calls, resolved once per process.
//!
//! MLX's JACCL does the same (`dlopen("librdma.dylib", RTLD_NOW | RTLD_GLOBAL)` and 16
//! `dlsym`s, `is_available` false when either fails), so that one build runs everywhere and a
//! machine without RDMA says so instead of failing to start. Here:
//!
//! - the library is [`NUVEC_JACCL_VERBS`] when set (a path, e.g. the software provider of
//!   `fabric-sim/verbs/`), else on macOS `/usr/lib/librdma.dylib` and then the bare name
//!   `librdma.dylib` (the library lives in the dyld shared cache, where only the loader finds
//!   it), and on other systems `libibverbs.so.1`;
//! - it is opened with `RTLD_NOW | RTLD_GLOBAL`, as MLX, and never closed (its providers keep
//!   threads and state for the life of the process);
//! - the first of the candidates that loads and has every function is used (one that loads
//!   but lacks a function is passed over, and named if none serves);
//! - the 16 symbols of [`nuvec_verbs_abi::SYMBOLS`] are resolved into typed function pointers,
//!   and `ibv_query_device` when the library has it (MLX does not call it; the bring-up reads
//!   each device's limits with it, see `limits.rs`);
//!   the data path's `post_send`, `post_recv` and `poll_cq` are read from each opened
//!   context's operation table, as `verbs.h`'s inline functions do;
//! - [`Unavailable`] says which of the three conditions failed: the library did not load, a
//!   symbol is missing, or the library lists no device.

use std::ffi::{CStr, OsString, c_char, c_int};
use std::fmt;
use std::io;
use std::sync::OnceLock;

use nuvec_verbs_abi as abi;

/// The environment variable naming the verbs library to load instead of the system's.
pub const NUVEC_JACCL_VERBS: &str = "NUVEC_JACCL_VERBS";

/// Why the RDMA fabric cannot run on this machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unavailable {
    /// No candidate library could be loaded: each path tried with the loader's message.
    Library(Vec<(String, String)>),
    /// The library loaded but lacks a function.
    Symbol {
        /// The library's path.
        library: String,
        /// The function that did not resolve.
        symbol: &'static str,
    },
    /// The library lists no device, or listing failed.
    NoDevice {
        /// The library's path.
        library: String,
        /// What the listing said.
        why: String,
    },
}

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unavailable::Library(tried) => {
                write!(f, "the verbs library could not be loaded (tried ")?;
                for (i, (path, why)) in tried.iter().enumerate() {
                    if i > 0 {
                        write!(f, "; ")?;
                    }
                    write!(f, "{path}: {why}")?;
                }
                write!(
                    f,
                    "); on a Mac it is macOS 26.2's librdma.dylib, on Linux rdma-core's \
                     libibverbs.so.1; {NUVEC_JACCL_VERBS}=<path> loads another"
                )
            }
            Unavailable::Symbol { library, symbol } => write!(
                f,
                "the verbs library {library} has no function {symbol} (it is not a verbs \
                 library, or too old)"
            ),
            Unavailable::NoDevice { library, why } => {
                write!(f, "no RDMA device is available: {library} {why}")
            }
        }
    }
}

/// The functions of the verbs library, typed by `verbs.h`'s prototypes.
pub(crate) struct Verbs {
    /// The path or name it was loaded from.
    pub(crate) library: String,
    pub(crate) get_device_list: abi::GetDeviceList,
    pub(crate) get_device_name: abi::GetDeviceName,
    pub(crate) open_device: abi::OpenDevice,
    pub(crate) free_device_list: abi::FreeDeviceList,
    pub(crate) close_device: abi::CloseDevice,
    pub(crate) alloc_pd: abi::AllocPd,
    pub(crate) create_qp: abi::CreateQp,
    pub(crate) create_cq: abi::CreateCq,
    pub(crate) destroy_cq: abi::DestroyCq,
    pub(crate) destroy_qp: abi::DestroyQp,
    pub(crate) dealloc_pd: abi::DeallocPd,
    pub(crate) query_port: abi::QueryPort,
    pub(crate) query_gid: abi::QueryGid,
    pub(crate) modify_qp: abi::ModifyQp,
    pub(crate) reg_mr: abi::RegMr,
    pub(crate) dereg_mr: abi::DeregMr,
    /// `ibv_query_device`, not among MLX's 16: a library without it leaves the fabric on
    /// Apple's reported limits.
    pub(crate) query_device: Option<abi::QueryDevice>,
}

impl fmt::Debug for Verbs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Verbs")
            .field("library", &self.library)
            .finish_non_exhaustive()
    }
}

/// The libraries to try, in order.
fn candidates(chosen: Option<OsString>) -> Vec<OsString> {
    if let Some(path) = chosen.filter(|p| !p.is_empty()) {
        return vec![path];
    }
    if cfg!(target_os = "macos") {
        vec!["/usr/lib/librdma.dylib".into(), "librdma.dylib".into()]
    } else {
        vec!["libibverbs.so.1".into()]
    }
}

/// The verbs library of this process, loaded on first use.
pub(crate) fn verbs() -> Result<&'static Verbs, Unavailable> {
    static VERBS: OnceLock<Result<Verbs, Unavailable>> = OnceLock::new();
    VERBS
        .get_or_init(|| load(&candidates(std::env::var_os(NUVEC_JACCL_VERBS))))
        .as_ref()
        .map_err(Clone::clone)
}

/// Loads the first of `paths` that loads and resolves every function, as the fabric's own
/// library is loaded, and returns the path it came from: for the project's tests, since the
/// process's library is loaded once, from the environment.
pub fn load_library(paths: &[OsString]) -> Result<String, Unavailable> {
    load(paths).map(|verbs| verbs.library)
}

/// Loads the first of `paths` that loads and resolves every symbol from it, trying the next
/// one after a library that does not load or lacks a function. When none serves: the first
/// library that loaded but lacked a function, named with that function (the likelier mistake
/// than a path that does not exist), else every path with the loader's reason.
#[cfg(unix)]
fn load(paths: &[OsString]) -> Result<Verbs, Unavailable> {
    use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};
    let mut tried = Vec::new();
    let mut lacking = None;
    for path in paths {
        let shown = path.to_string_lossy().into_owned();
        // SAFETY: loading a library runs its initialisers; the verbs library (the system's,
        // or the one the user named in NUVEC_JACCL_VERBS) is a C library whose initialisers
        // have no precondition on the caller.
        let opened = unsafe { Library::open(Some(path), RTLD_NOW | RTLD_GLOBAL) };
        let library = match opened {
            Ok(library) => library,
            Err(e) => {
                tried.push((shown, e.to_string()));
                continue;
            }
        };
        // The library stays loaded for the life of the process, even one passed over (its
        // initialisers have run, and unloading a C library is not always safe): the pointers
        // below are copied out of it.
        let library: &'static Library = Box::leak(Box::new(library));
        match resolve(library, shown) {
            Ok(verbs) => return Ok(verbs),
            Err(e) => {
                lacking.get_or_insert(e);
            }
        }
    }
    Err(lacking.unwrap_or(Unavailable::Library(tried)))
}

/// Resolves every function of the table from `library`, loaded from `shown`; the optional
/// `ibv_query_device` is `None` when it is missing.
#[cfg(unix)]
fn resolve(
    library: &'static libloading::os::unix::Library,
    shown: String,
) -> Result<Verbs, Unavailable> {
    /// Resolves `name` as a function of type `T`.
    fn get<T: Copy>(
        library: &'static libloading::os::unix::Library,
        shown: &str,
        name: &'static str,
    ) -> Result<T, Unavailable> {
        // SAFETY: `T` is the function type `nuvec_verbs_abi` declares for `name`, the
        // prototype of `verbs.h` (checked against rdma-core's header by the layout test);
        // the library is never unloaded, so the pointer stays valid.
        let found = unsafe { library.get::<T>(name) };
        found.map(|s| *s).map_err(|_| Unavailable::Symbol {
            library: shown.to_owned(),
            symbol: name,
        })
    }
    let l = library;
    let s = shown.as_str();
    Ok(Verbs {
        get_device_list: get(l, s, abi::SYMBOLS[0])?,
        get_device_name: get(l, s, abi::SYMBOLS[1])?,
        open_device: get(l, s, abi::SYMBOLS[2])?,
        free_device_list: get(l, s, abi::SYMBOLS[3])?,
        close_device: get(l, s, abi::SYMBOLS[4])?,
        alloc_pd: get(l, s, abi::SYMBOLS[5])?,
        create_qp: get(l, s, abi::SYMBOLS[6])?,
        create_cq: get(l, s, abi::SYMBOLS[7])?,
        destroy_cq: get(l, s, abi::SYMBOLS[8])?,
        destroy_qp: get(l, s, abi::SYMBOLS[9])?,
        dealloc_pd: get(l, s, abi::SYMBOLS[10])?,
        query_port: get(l, s, abi::SYMBOLS[11])?,
        query_gid: get(l, s, abi::SYMBOLS[12])?,
        modify_qp: get(l, s, abi::SYMBOLS[13])?,
        reg_mr: get(l, s, abi::SYMBOLS[14])?,
        dereg_mr: get(l, s, abi::SYMBOLS[15])?,
        query_device: get(l, s, abi::QUERY_DEVICE).ok(),
        library: shown,
    })
}

/// Loads nothing: the RDMA fabric runs on Unix systems only.
#[cfg(not(unix))]
fn load(_paths: &[OsString]) -> Result<Verbs, Unavailable> {
    Err(Unavailable::Library(vec![(
        "the verbs library".to_owned(),
        "this system has none".to_owned(),
    )]))
}

/// `ENOSYS`: the verbs library finds no RDMA support in the kernel.
#[cfg(target_os = "linux")]
const ENOSYS: i32 = 38;
/// `ENOSYS`: the verbs library finds no RDMA support in the kernel.
#[cfg(not(target_os = "linux"))]
const ENOSYS: i32 = 78;
/// `ENOENT` and `ENODEV`: no device files.
const ENOENT: i32 = 2;
const ENODEV: i32 = 19;

/// What to do about a failed device listing.
pub(crate) fn no_device_hint(e: &io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(ENOSYS | ENOENT | ENODEV) => {
            " (the kernel has no RDMA support loaded; on a Mac, enable RDMA with `rdma_ctl \
             enable` in recoveryOS and reboot)"
        }
        _ => "",
    }
}

/// The device list of the verbs library, freed on drop.
pub(crate) struct DeviceList {
    verbs: &'static Verbs,
    list: *mut *mut abi::ibv_device,
    len: usize,
}

impl DeviceList {
    /// Lists the devices.
    pub(crate) fn get(verbs: &'static Verbs) -> io::Result<DeviceList> {
        let mut n: c_int = 0;
        // SAFETY: `n` is a valid place for the count.
        let list = unsafe { (verbs.get_device_list)(&mut n) };
        if list.is_null() {
            return Err(io::Error::last_os_error());
        }
        Ok(DeviceList {
            verbs,
            list,
            len: usize::try_from(n).unwrap_or(0),
        })
    }

    /// How many devices are listed.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Device `i` and its name.
    pub(crate) fn device(&self, i: usize) -> Option<(*mut abi::ibv_device, String)> {
        if i >= self.len {
            return None;
        }
        // SAFETY: `ibv_get_device_list` returned `len` device pointers at `list`, which stay
        // valid until the list is freed in drop.
        let devices = unsafe { std::slice::from_raw_parts(self.list, self.len) };
        let device = devices[i];
        if device.is_null() {
            return None;
        }
        // SAFETY: `device` is a device of the live list.
        let name: *const c_char = unsafe { (self.verbs.get_device_name)(device) };
        if name.is_null() {
            return Some((device, String::new()));
        }
        // SAFETY: `ibv_get_device_name` returns a NUL-terminated string that lives as long as
        // the list; it is copied at once.
        let name = unsafe { CStr::from_ptr(name) };
        Some((device, name.to_string_lossy().into_owned()))
    }

    /// Every device's name, in the library's order.
    pub(crate) fn names(&self) -> Vec<String> {
        (0..self.len)
            .filter_map(|i| self.device(i).map(|(_, name)| name))
            .collect()
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: `list` came from `ibv_get_device_list` and is freed only here; contexts
        // opened from it stay valid.
        unsafe { (self.verbs.free_device_list)(self.list) };
    }
}

/// The RDMA device names of this machine, or why there are none to be had: the library does
/// not load, lacks a function, or cannot list devices.
pub(crate) fn device_names() -> Result<Vec<String>, Unavailable> {
    let verbs = verbs()?;
    let list = DeviceList::get(verbs).map_err(|e| Unavailable::NoDevice {
        library: verbs.library.clone(),
        why: format!(
            "could not list RDMA devices (ibv_get_device_list failed: {e}){}",
            no_device_hint(&e)
        ),
    })?;
    Ok(list.names())
}

/// Whether the fabric can run here: the library loads, every function resolves and at least
/// one device is listed; else which of the three failed.
pub(crate) fn check_available() -> Result<(), Unavailable> {
    let names = device_names()?;
    if names.is_empty() {
        return Err(Unavailable::NoDevice {
            library: verbs().map(|v| v.library.clone()).unwrap_or_default(),
            why: "lists no RDMA device (on a Mac, enable RDMA with `rdma_ctl enable` in \
                  recoveryOS and reboot)"
                .to_owned(),
        });
    }
    Ok(())
}

/// The name of a work completion status.
pub(crate) fn status_name(status: abi::ibv_wc_status) -> String {
    let name = match status {
        abi::IBV_WC_SUCCESS => "IBV_WC_SUCCESS",
        abi::IBV_WC_LOC_LEN_ERR => "IBV_WC_LOC_LEN_ERR (local length error)",
        abi::IBV_WC_LOC_QP_OP_ERR => "IBV_WC_LOC_QP_OP_ERR (local QP operation error)",
        abi::IBV_WC_LOC_EEC_OP_ERR => "IBV_WC_LOC_EEC_OP_ERR",
        abi::IBV_WC_LOC_PROT_ERR => "IBV_WC_LOC_PROT_ERR (local protection error)",
        abi::IBV_WC_WR_FLUSH_ERR => "IBV_WC_WR_FLUSH_ERR (flushed: the queue pair is in error)",
        abi::IBV_WC_MW_BIND_ERR => "IBV_WC_MW_BIND_ERR",
        abi::IBV_WC_BAD_RESP_ERR => "IBV_WC_BAD_RESP_ERR",
        abi::IBV_WC_LOC_ACCESS_ERR => "IBV_WC_LOC_ACCESS_ERR (local access error)",
        abi::IBV_WC_REM_INV_REQ_ERR => "IBV_WC_REM_INV_REQ_ERR (remote invalid request)",
        abi::IBV_WC_REM_ACCESS_ERR => "IBV_WC_REM_ACCESS_ERR",
        abi::IBV_WC_REM_OP_ERR => "IBV_WC_REM_OP_ERR (remote operation error)",
        abi::IBV_WC_RETRY_EXC_ERR => "IBV_WC_RETRY_EXC_ERR",
        abi::IBV_WC_RNR_RETRY_EXC_ERR => "IBV_WC_RNR_RETRY_EXC_ERR",
        abi::IBV_WC_LOC_RDD_VIOL_ERR => "IBV_WC_LOC_RDD_VIOL_ERR",
        abi::IBV_WC_REM_INV_RD_REQ_ERR => "IBV_WC_REM_INV_RD_REQ_ERR",
        abi::IBV_WC_REM_ABORT_ERR => "IBV_WC_REM_ABORT_ERR (remote aborted)",
        abi::IBV_WC_INV_EECN_ERR => "IBV_WC_INV_EECN_ERR",
        abi::IBV_WC_INV_EEC_STATE_ERR => "IBV_WC_INV_EEC_STATE_ERR",
        abi::IBV_WC_FATAL_ERR => "IBV_WC_FATAL_ERR (fatal error)",
        abi::IBV_WC_RESP_TIMEOUT_ERR => "IBV_WC_RESP_TIMEOUT_ERR (response timeout)",
        abi::IBV_WC_GENERAL_ERR => "IBV_WC_GENERAL_ERR (general error)",
        other => return format!("unknown status {other}"),
    };
    name.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chosen_library_is_the_only_one_tried() {
        assert_eq!(
            candidates(Some("/x/libv.so".into())),
            vec![OsString::from("/x/libv.so")]
        );
        assert!(!candidates(Some(OsString::new())).is_empty());
        let default = candidates(None);
        if cfg!(target_os = "macos") {
            assert_eq!(default[0], OsString::from("/usr/lib/librdma.dylib"));
        } else {
            assert_eq!(default, vec![OsString::from("libibverbs.so.1")]);
        }
    }

    #[test]
    fn a_library_that_does_not_load_is_named_with_the_loaders_reason() {
        let e = load(&["/nonexistent/libverbs-missing.so".into()]).unwrap_err();
        let m = e.to_string();
        assert!(matches!(e, Unavailable::Library(_)), "{e:?}");
        assert!(m.contains("/nonexistent/libverbs-missing.so"), "{m}");
        assert!(m.contains(NUVEC_JACCL_VERBS), "{m}");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_library_without_the_verbs_functions_names_the_first_missing_one() {
        // The C library loads everywhere and has none of them.
        let e = load(&["libc.so.6".into()]).unwrap_err();
        assert_eq!(
            e,
            Unavailable::Symbol {
                library: "libc.so.6".to_owned(),
                symbol: "ibv_get_device_list"
            }
        );
        assert!(
            e.to_string()
                .contains("has no function ibv_get_device_list")
        );
    }

    #[test]
    fn completion_statuses_are_named() {
        assert!(status_name(abi::IBV_WC_WR_FLUSH_ERR).contains("WR_FLUSH_ERR"));
        assert!(status_name(abi::IBV_WC_LOC_LEN_ERR).contains("LOC_LEN_ERR"));
        assert_eq!(status_name(999), "unknown status 999");
    }
}
