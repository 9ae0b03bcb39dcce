//! A software RDMA provider: a shared library exporting the verbs ABI (the 16 functions of
//! `nuvec_verbs_abi::SYMBOLS`, `ibv_query_device`, and the `poll_cq`, `post_send` and `post_recv` entries of each
//! context's operation table) that behaves like an RDMA device with Unreliable Connected
//! queue pairs between processes on one machine.
//!
//! # Why
//!
//! nuvec-distributed's RDMA fabric follows MLX's JACCL: it loads the verbs library at run time
//! and drives Apple's Thunderbolt 5 provider through it. Without a Mac pair nothing of that
//! code would ever run. Loading this library instead (`NUVEC_JACCL_VERBS=<path of
//! libnuvec_verbs_emu.so>`) runs the real fabric, unchanged, across processes: device
//! listing, bring-up, the side-channel exchange of addresses, registered frames, posts,
//! completions and teardown, with the checks a real provider makes (and that fail on hardware
//! only as `errno 22`) made here, and with faults on demand.
//!
//! # What is modelled
//!
//! - Devices `rdma_en0` … `rdma_en7`, one active port, LID 0, two GIDs per (process, device)
//!   (`device`).
//! - The UC queue-pair state machine with the specification's attribute masks and value
//!   checks (`qp_state`).
//! - UC delivery, registration checks, the error state and flushing (`qp`), completion
//!   queues with overrun (`cq`), Apple's limits and object accounting (`objects`).
//! - The wire: abstract Unix sockets between processes on one machine, or TCP between
//!   processes on different hosts or network namespaces (`transport`).
//! - Faults from the environment (`faults`) and the configuration (`config`).
//!
//! # Environment
//!
//! | Variable | Effect |
//! |---|---|
//! | `NUVEC_VERBS_EMU_DEVICES` | comma-separated device names instead of `rdma_en0` … `rdma_en7` (empty: no device) |
//! | `NUVEC_VERBS_EMU_NO_IPV4=1` | GID index 1 empty: only a `fe80::` GID (index 0) |
//! | `NUVEC_VERBS_EMU_NO_IMM=1` | `IBV_WR_SEND_WITH_IMM` refused with `EINVAL` |
//! | `NUVEC_VERBS_EMU_LOSS=<p>` | each sent message lost with probability `p` |
//! | `NUVEC_VERBS_EMU_SEED=<n>` | the loss generator's seed (default 0) |
//! | `NUVEC_VERBS_EMU_FAIL_WR=<k>` | the k-th posted work request completes with `IBV_WC_GENERAL_ERR` |
//! | `NUVEC_VERBS_EMU_DIE_AFTER=<n>` | the process kills itself (SIGKILL) after its n-th sent message |
//! | `NUVEC_VERBS_EMU_UNEXPECTED=hold\|drop` | a message that finds no receive posted is held until one is (default, as Apple's provider appears to) or dropped (InfiniBand's UC) |
//! | `NUVEC_VERBS_EMU_WIRE=unix\|tcp\|tcp:<address>` | how messages travel: abstract Unix sockets (default, one machine and network namespace), or TCP on the given IPv4 address of this host or (`tcp`) the first one of an interface that is up and not loopback (127.0.0.1 when there is none) |
//! | `NUVEC_VERBS_EMU_MAX_QP=<n>`, `_MAX_MR=<n>`, `_MAX_QP_WR=<n>` | every device's limits on queue pairs, memory regions and work requests per queue, as `ibv_query_device` reports them (default Apple's reported 10, 100 and 63; a Mac behind a hub reports 3 queue pairs) |
//! | `NUVEC_VERBS_EMU_FAIL_DEREG=1` | `ibv_dereg_mr` fails with `EBUSY` and leaves the region registered, as a device still using it |
//! | `NUVEC_VERBS_EMU_LEDGER=<path>` | each `ibv_close_device` appends `close pid=… device=… qps=… cqs=… mrs=… pds=…` |
//! | `NUVEC_VERBS_EMU_TRACE=<path>` | the per-queue-pair message log: every send handed to the wire and every message landing in a posted receive appends `send\|recv rank=<MLX_RANK> device=<name> qp=<k> bytes=<n>`, `k` the queue pair's place among those the process created on the device (`trace`), so that two jobs of one shape can be compared queue pair by queue pair |
//!
//! A bad value prints a message naming the variable and makes `ibv_get_device_list` return
//! null with errno `EINVAL`.
//!
//! # What is not modelled
//!
//! RC and UD queue pairs (`EOPNOTSUPP`), RDMA read/write and atomics, inline data, shared receive queues, completion channels and events, address handles, memory
//! windows, PSN checking, packetisation and link speed (over TCP, the real link's). Linux only (abstract
//! sockets, `getifaddrs`).
//!
//! # Errors
//!
//! As rdma-core's providers: functions returning a pointer return null and set `errno`;
//! functions returning `int` return the errno value; `poll_cq` returns a negative value on
//! error. No panic crosses the C boundary: every entry point catches unwinding and reports
//! `EIO` if one ever happened.
#![cfg(target_os = "linux")]

mod config;
mod cq;
mod device;
mod faults;
mod objects;
mod qp;
mod qp_state;
mod trace;
mod transport;

use core::ffi::{c_char, c_int, c_void};
use nuvec_verbs_abi::*;
use std::panic::{AssertUnwindSafe, catch_unwind};

/// Sets the calling thread's `errno`.
fn set_errno(value: c_int) {
    // SAFETY: `__errno_location` has no preconditions; it returns the calling thread's errno.
    let errno = unsafe { libc::__errno_location() };
    // SAFETY: that pointer is valid for writes for the life of the thread.
    unsafe { *errno = value };
}

/// Runs `f`, turning a panic into `on_panic` with errno `EIO`.
fn guard<T>(on_panic: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        set_errno(libc::EIO);
        on_panic
    })
}

/// A pointer result as C sees it: the pointer, or null with errno set.
fn pointer<T>(result: Result<*mut T, c_int>) -> *mut T {
    result.unwrap_or_else(|e| {
        set_errno(e);
        core::ptr::null_mut()
    })
}

/// A status result as C sees it: 0, or the errno value (also stored in errno).
fn status(result: Result<(), c_int>) -> c_int {
    match result {
        Ok(()) => 0,
        Err(e) => {
            set_errno(e);
            e
        }
    }
}

// The exported functions have exactly the ABI crate's function types.
const _: GetDeviceList = ibv_get_device_list;
const _: FreeDeviceList = ibv_free_device_list;
const _: GetDeviceName = ibv_get_device_name;
const _: OpenDevice = ibv_open_device;
const _: CloseDevice = ibv_close_device;
const _: AllocPd = ibv_alloc_pd;
const _: DeallocPd = ibv_dealloc_pd;
const _: CreateQp = ibv_create_qp;
const _: DestroyQp = ibv_destroy_qp;
const _: CreateCq = ibv_create_cq;
const _: DestroyCq = ibv_destroy_cq;
const _: QueryDevice = ibv_query_device;
const _: QueryPort = ibv_query_port;
const _: QueryGid = ibv_query_gid;
const _: ModifyQp = ibv_modify_qp;
const _: RegMr = ibv_reg_mr;
const _: DeregMr = ibv_dereg_mr;
const _: PollCq = poll_cq;
const _: PostSend = post_send;
const _: PostRecv = post_recv;

/// `ibv_get_device_list`: the devices, null-terminated; their count in `*num_devices`.
///
/// # Safety
///
/// `num_devices` is null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device {
    let listed = guard(Err(libc::EIO), objects::get_device_list);
    let count = listed.as_ref().map_or(0, |&(_, n)| n);
    if !num_devices.is_null() {
        // SAFETY: not null, so writable by the contract.
        unsafe { num_devices.write(count) };
    }
    pointer(listed.map(|(list, _)| list))
}

/// `ibv_free_device_list`.
///
/// # Safety
///
/// `list` is null or a list from `ibv_get_device_list` (anything else is ignored).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    guard((), || objects::free_device_list(list));
}

/// `ibv_get_device_name`: the device's name, valid for the life of the process.
///
/// # Safety
///
/// None beyond C's: an unknown pointer gives null with errno `EINVAL`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_get_device_name(device: *mut ibv_device) -> *const c_char {
    match guard(Err(libc::EIO), || objects::device_name(device)) {
        Ok(name) => name,
        Err(e) => {
            set_errno(e);
            core::ptr::null()
        }
    }
}

/// `ibv_open_device`.
///
/// # Safety
///
/// None beyond C's: an unknown pointer gives null with errno `EINVAL`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context {
    pointer(guard(Err(libc::EIO), || objects::open_device(device)))
}

/// `ibv_close_device`: frees what the context still holds and writes the ledger line.
///
/// # Safety
///
/// Nothing of the context is used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_close_device(context: *mut ibv_context) -> c_int {
    status(guard(Err(libc::EIO), || objects::close_device(context)))
}

/// `ibv_alloc_pd`.
///
/// # Safety
///
/// None beyond C's: an unknown context gives null with errno `EINVAL`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd {
    pointer(guard(Err(libc::EIO), || objects::alloc_pd(context)))
}

/// `ibv_dealloc_pd`: `EBUSY` while memory regions or queue pairs use it.
///
/// # Safety
///
/// The protection domain is not used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    status(guard(Err(libc::EIO), || objects::dealloc_pd(pd)))
}

/// `ibv_create_cq`.
///
/// # Safety
///
/// None beyond C's: an unknown context gives null with errno `EINVAL`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_cq(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    pointer(guard(Err(libc::EIO), || {
        objects::create_cq(context, cqe, cq_context, channel, comp_vector)
    }))
}

/// `ibv_destroy_cq`: `EBUSY` while queue pairs use it.
///
/// # Safety
///
/// The completion queue is not used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    status(guard(Err(libc::EIO), || objects::destroy_cq(cq)))
}

/// `ibv_create_qp`: UC only.
///
/// # Safety
///
/// `attr` is null or a readable and writable `ibv_qp_init_attr`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_qp(
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    pointer(guard(Err(libc::EIO), || {
        // SAFETY: the caller's contract is `create_qp`'s.
        unsafe { objects::create_qp(pd, attr) }
    }))
}

/// `ibv_destroy_qp`.
///
/// # Safety
///
/// The queue pair is not used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    status(guard(Err(libc::EIO), || objects::destroy_qp(qp)))
}

/// `ibv_query_device`: the device's limits (`NUVEC_VERBS_EMU_MAX_*`, Apple's by default).
///
/// # Safety
///
/// `attr` is null or a writable `ibv_device_attr`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_device(
    context: *mut ibv_context,
    attr: *mut ibv_device_attr,
) -> c_int {
    status(guard(Err(libc::EIO), || {
        // SAFETY: the caller's contract is `query_device`'s.
        unsafe { objects::query_device(context, attr) }
    }))
}

/// `ibv_query_port`: fills the first `COMPAT_PORT_ATTR_BYTES` bytes of `attr`.
///
/// # Safety
///
/// `attr` is null or has `COMPAT_PORT_ATTR_BYTES` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_port(
    context: *mut ibv_context,
    port_num: u8,
    attr: *mut ibv_port_attr,
) -> c_int {
    status(guard(Err(libc::EIO), || {
        // SAFETY: the caller's contract is `query_port`'s.
        unsafe { objects::query_port(context, port_num, attr) }
    }))
}

/// `ibv_query_gid`.
///
/// # Safety
///
/// `gid` is null or a writable `union ibv_gid`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_gid(
    context: *mut ibv_context,
    port_num: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    status(guard(Err(libc::EIO), || {
        // SAFETY: the caller's contract is `query_gid`'s.
        unsafe { objects::query_gid(context, port_num, index, gid) }
    }))
}

/// `ibv_modify_qp`: `EINVAL` for any transition the UC state machine refuses.
///
/// # Safety
///
/// `attr` is null or a readable `ibv_qp_attr`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_modify_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    attr_mask: c_int,
) -> c_int {
    status(guard(Err(libc::EIO), || {
        // SAFETY: the caller's contract is `modify_qp`'s.
        unsafe { objects::modify_qp(qp, attr, attr_mask) }
    }))
}

/// `ibv_reg_mr`.
///
/// # Safety
///
/// `addr .. addr + length` stays valid readable and writable memory until the region is
/// deregistered; messages land in it from the provider's receiver threads.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut ibv_mr {
    pointer(guard(Err(libc::EIO), || {
        // SAFETY: the caller's contract is `reg_mr`'s.
        unsafe { objects::reg_mr(pd, addr, length, access) }
    }))
}

/// `ibv_dereg_mr`.
///
/// # Safety
///
/// The region is not used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    status(guard(Err(libc::EIO), || objects::dereg_mr(mr)))
}

/// The SGEs of a work request.
///
/// # Safety
///
/// `list` is null or points to `n` readable SGEs that outlive the returned slice's use.
unsafe fn sges<'a>(list: *mut ibv_sge, n: c_int) -> Result<&'a [ibv_sge], c_int> {
    match usize::try_from(n) {
        Ok(0) => Ok(&[]),
        Ok(n) if !list.is_null() => {
            // SAFETY: not null, so `n` readable SGEs by the contract.
            Ok(unsafe { core::slice::from_raw_parts(list, n) })
        }
        _ => Err(libc::EINVAL),
    }
}

/// A link of a chain of work requests, send or receive.
trait WorkRequest: Copy {
    /// The next link, or null.
    fn next(&self) -> *mut Self;
    /// Its scatter/gather list and length.
    fn sge_list(&self) -> (*mut ibv_sge, c_int);
}

impl WorkRequest for ibv_send_wr {
    fn next(&self) -> *mut Self {
        self.next
    }
    fn sge_list(&self) -> (*mut ibv_sge, c_int) {
        (self.sg_list, self.num_sge)
    }
}

impl WorkRequest for ibv_recv_wr {
    fn next(&self) -> *mut Self {
        self.next
    }
    fn sge_list(&self) -> (*mut ibv_sge, c_int) {
        (self.sg_list, self.num_sge)
    }
}

/// Posts the chain `wr` to `qp` one request at a time with `post`; on error returns the errno
/// and points `*bad_wr` at the first request not posted (the one `post_send` and `post_recv`
/// of every verbs provider share).
///
/// # Safety
///
/// `wr` is null or a readable chain whose SGE lists are readable; `bad_wr` is null or writable.
unsafe fn post_chain<W: WorkRequest>(
    qp: *mut ibv_qp,
    wr: *mut W,
    bad_wr: *mut *mut W,
    post: impl Fn(&qp::Qp, &W, &[ibv_sge]) -> Result<(), c_int>,
) -> c_int {
    let result = guard(Err((libc::EIO, wr)), || {
        let qp = objects::qp_of(qp).ok_or((libc::EINVAL, wr))?;
        let mut cur = wr;
        while !cur.is_null() {
            // SAFETY: a non-null link of the chain is readable by the contract.
            let request = unsafe { *cur };
            let (list, n) = request.sge_list();
            // SAFETY: its SGE list is readable by the contract.
            let list = unsafe { sges(list, n) }.map_err(|e| (e, cur))?;
            post(&qp, &request, list).map_err(|e| (e, cur))?;
            cur = request.next();
        }
        Ok(())
    });
    match result {
        Ok(()) => 0,
        Err((e, at)) => {
            if !bad_wr.is_null() {
                // SAFETY: not null, so writable by the contract.
                unsafe { bad_wr.write(at) };
            }
            e
        }
    }
}

/// The context's `post_send`: posts a chain of send work requests; on error returns the
/// errno and points `*bad_wr` at the first request not posted.
///
/// # Safety
///
/// `wr` is null or a readable chain of `ibv_send_wr` with readable SGE lists; `bad_wr` is
/// null or writable.
pub(crate) unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    // SAFETY: the caller's contract is `post_chain`'s.
    unsafe {
        post_chain(qp, wr, bad_wr, |qp, request, list| {
            qp.post_send(request, list)
        })
    }
}

/// The context's `post_recv`: posts a chain of receive work requests; on error returns the
/// errno and points `*bad_wr` at the first request not posted.
///
/// # Safety
///
/// `wr` is null or a readable chain of `ibv_recv_wr` with readable SGE lists; `bad_wr` is
/// null or writable.
pub(crate) unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: the caller's contract is `post_chain`'s.
    unsafe {
        post_chain(qp, wr, bad_wr, |qp, request, list| {
            qp.post_recv(request.wr_id, list)
        })
    }
}

/// The context's `poll_cq`: up to `num_entries` completions into `wc`; their count, or a
/// negative errno (`-EOVERFLOW` after an overrun, `-EINVAL` for a bad argument).
///
/// # Safety
///
/// `wc` is null or has room for `num_entries` completions.
pub(crate) unsafe extern "C" fn poll_cq(
    cq: *mut ibv_cq,
    num_entries: c_int,
    wc: *mut ibv_wc,
) -> c_int {
    guard(-libc::EIO, || {
        let Some(cq) = objects::cq_of(cq) else {
            return -libc::EINVAL;
        };
        match usize::try_from(num_entries) {
            Ok(0) => 0,
            Ok(n) if !wc.is_null() => {
                // SAFETY: not null, so room for `n` completions by the contract; the caller
                // does not touch them during the call.
                let out = unsafe { core::slice::from_raw_parts_mut(wc, n) };
                cq.poll(out)
            }
            _ => -libc::EINVAL,
        }
    })
}
