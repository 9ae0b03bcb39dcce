//! The verbs objects (contexts, protection domains, completion queues, queue pairs, memory
//! regions), their registry and the limits on them.
//!
//! Every object the provider hands out is a `repr(C)` struct of `nuvec-verbs-abi`, allocated
//! here and recorded in one process-wide registry by its address. Every call looks its
//! arguments up there first, so a stale, foreign or doubly freed pointer is `EINVAL` instead
//! of undefined behaviour, and the registry answers the questions real providers answer:
//! what is still alive at `ibv_close_device` (the ledger line), whether a completion queue
//! still has queue pairs (`EBUSY`), whether a protection domain still has regions or queue
//! pairs (`EBUSY`), how many queue pairs and regions a device has (Apple's limits).
//!
//! Limits are counted per device across the process (every context opened on it), as a
//! device's resources are: at most [`limits`]`().qps` queue pairs and `.mrs` memory regions
//! (`ENOMEM` beyond), at most `.wrs` send and receive work requests per queue pair (`EINVAL`
//! when `ibv_create_qp` asks more): Apple's reported limits, or the environment's
//! (`NUVEC_VERBS_EMU_MAX_QP`, `_MAX_MR`, `_MAX_QP_WR`), which `ibv_query_device` reports. Queue pair types other than UC are refused with
//! `EOPNOTSUPP` (95 on Linux, 102 on macOS, the errno Apple's provider is reported to give for
//! RC). Not modelled: shared receive queues, completion channels (both refused), memory
//! windows, address handles, pinning (registering unmapped memory is not detected).

use crate::config;
use crate::cq::Cq;
use crate::device::{self, Device};
use crate::qp::{Pd, Qp, Region};
use crate::qp_state::PORT_NUM;
use crate::trace;
use crate::transport::Endpoint;
use core::ffi::{c_char, c_int, c_void};
use nuvec_verbs_abi::*;
use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, PoisonError};

/// What every device allows: the configuration's (Apple's limits by default, as the RDMA
/// fabric's bring-up checks them), or the defaults when the configuration is bad (nothing can
/// be opened then anyway).
pub(crate) fn limits() -> config::Limits {
    config::get()
        .as_ref()
        .map_or_else(|_| config::Limits::default(), |c| c.limits)
}
/// Scatter/gather entries per work request at most.
pub(crate) const MAX_SGE: u32 = 16;
/// Completion queue entries at most.
pub(crate) const MAX_CQE: c_int = 4096;

/// An open device.
#[derive(Debug)]
pub(crate) struct Context {
    /// The device.
    pub(crate) device: &'static Device,
    /// The process's endpoint on it.
    pub(crate) endpoint: Arc<Endpoint>,
}

/// A memory region's record.
#[derive(Debug)]
struct MrRec {
    /// Its context.
    ctx: usize,
    /// Its protection domain.
    pd: Arc<Pd>,
    /// Its key.
    lkey: u32,
}

/// Every live object, by the address of its verbs struct.
#[derive(Debug, Default)]
struct Registry {
    /// Device lists handed out, with their lengths (the null terminator included).
    lists: HashMap<usize, usize>,
    /// Contexts.
    contexts: HashMap<usize, Arc<Context>>,
    /// Protection domains.
    pds: HashMap<usize, Arc<Pd>>,
    /// Completion queues.
    cqs: HashMap<usize, Arc<Cq>>,
    /// Queue pairs.
    qps: HashMap<usize, Arc<Qp>>,
    /// Memory regions.
    mrs: HashMap<usize, MrRec>,
}

impl Registry {
    /// The device index of a context.
    fn device_of(&self, ctx: usize) -> Option<usize> {
        self.contexts.get(&ctx).map(|c| c.device.index)
    }
}

/// The registry, locked.
fn registry() -> MutexGuard<'static, Registry> {
    static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(Mutex::default);
    REGISTRY.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Moves `value` to the heap and returns its address.
fn leak<T>(value: T) -> usize {
    Box::into_raw(Box::new(value)) as usize
}

/// Frees a struct allocated by [`leak`].
///
/// # Safety
///
/// `ptr` came from `leak::<T>` and has not been freed; nothing uses it afterwards.
unsafe fn free<T>(ptr: usize) {
    // SAFETY: the caller's contract: `ptr` is a live `Box<T>` turned into an address.
    drop(unsafe { Box::from_raw(ptr as *mut T) });
}

/// A fresh memory key, unique in the process and never 0.
fn next_key() -> u32 {
    static NEXT: LazyLock<AtomicU32> =
        LazyLock::new(|| AtomicU32::new(std::process::id().wrapping_mul(0x9E37_79B1) | 1));
    loop {
        let key = NEXT.fetch_add(0x101, Ordering::Relaxed);
        if key != 0 {
            return key;
        }
    }
}

/// `ibv_get_device_list`: the list and its length.
pub(crate) fn get_device_list() -> Result<(*mut *mut ibv_device, c_int), c_int> {
    let devices = device::devices()?;
    let mut list: Vec<*mut ibv_device> = devices.iter().map(device::device_ptr).collect();
    list.push(core::ptr::null_mut());
    let len = list.len();
    let ptr = Box::into_raw(list.into_boxed_slice()) as *mut *mut ibv_device;
    registry().lists.insert(ptr as usize, len);
    Ok((ptr, (len - 1) as c_int))
}

/// `ibv_free_device_list`.
pub(crate) fn free_device_list(list: *mut *mut ibv_device) {
    let Some(len) = registry().lists.remove(&(list as usize)) else {
        return;
    };
    let slice = core::ptr::slice_from_raw_parts_mut(list, len);
    // SAFETY: `list` was handed out by `get_device_list` as a boxed slice of `len` pointers
    // and was still recorded, so it has not been freed.
    drop(unsafe { Box::from_raw(slice) });
}

/// `ibv_get_device_name`.
pub(crate) fn device_name(dev: *mut ibv_device) -> Result<*const c_char, c_int> {
    device::device_at(dev)
        .map(|d| d.name.as_ptr())
        .ok_or(libc::EINVAL)
}

/// `ibv_open_device`.
pub(crate) fn open_device(dev: *mut ibv_device) -> Result<*mut ibv_context, c_int> {
    let device = device::device_at(dev).ok_or(libc::EINVAL)?;
    let endpoint = device.endpoint()?;
    let ops = ibv_context_ops {
        poll_cq: Some(crate::poll_cq),
        post_send: Some(crate::post_send),
        post_recv: Some(crate::post_recv),
        ..Default::default()
    };
    let ctx = leak(ibv_context {
        device: dev,
        ops,
        cmd_fd: -1,
        async_fd: -1,
        num_comp_vectors: 1,
        ..Default::default()
    });
    registry()
        .contexts
        .insert(ctx, Arc::new(Context { device, endpoint }));
    Ok(ctx as *mut ibv_context)
}

/// `ibv_close_device`: appends the ledger line, then frees whatever the context still holds
/// (as the kernel does when a process closes its verbs file).
pub(crate) fn close_device(ctx: *mut ibv_context) -> Result<(), c_int> {
    let ctx = ctx as usize;
    let mut reg = registry();
    let context = reg.contexts.remove(&ctx).ok_or(libc::EINVAL)?;
    let qps: Vec<usize> = reg
        .qps
        .iter()
        .filter(|(_, q)| q.ctx == ctx)
        .map(|(&p, _)| p)
        .collect();
    let cqs: Vec<usize> = reg
        .cqs
        .iter()
        .filter(|(_, c)| c.ctx == ctx)
        .map(|(&p, _)| p)
        .collect();
    let mrs: Vec<usize> = reg
        .mrs
        .iter()
        .filter(|(_, m)| m.ctx == ctx)
        .map(|(&p, _)| p)
        .collect();
    let pds: Vec<usize> = reg
        .pds
        .iter()
        .filter(|(_, p)| p.ctx == ctx)
        .map(|(&p, _)| p)
        .collect();
    if let Ok(config::Config {
        ledger: Some(path), ..
    }) = config::get()
    {
        let line = format!(
            "close pid={} device={} qps={} cqs={} mrs={} pds={}\n",
            std::process::id(),
            context.device.name.to_string_lossy(),
            qps.len(),
            cqs.len(),
            mrs.len(),
            pds.len()
        );
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .and_then(|mut f| f.write_all(line.as_bytes()));
        if let Err(e) = written {
            eprintln!(
                "nuvec-verbs-emu: cannot append to NUVEC_VERBS_EMU_LEDGER={}: {e}",
                path.display()
            );
        }
    }
    for ptr in qps {
        if let Some(qp) = reg.qps.remove(&ptr) {
            retire_qp(&qp);
        }
    }
    for ptr in mrs {
        if let Some(mr) = reg.mrs.remove(&ptr) {
            mr.pd
                .regions
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&mr.lkey);
            // SAFETY: `ptr` was recorded as a live `ibv_mr` allocated by `reg_mr`, and is
            // no longer recorded.
            unsafe { free::<ibv_mr>(ptr) };
        }
    }
    for ptr in cqs {
        reg.cqs.remove(&ptr);
        // SAFETY: `ptr` was recorded as a live `ibv_cq` allocated by `create_cq`, and is no
        // longer recorded.
        unsafe { free::<ibv_cq>(ptr) };
    }
    for ptr in pds {
        reg.pds.remove(&ptr);
        // SAFETY: `ptr` was recorded as a live `ibv_pd` allocated by `alloc_pd`, and is no
        // longer recorded.
        unsafe { free::<ibv_pd>(ptr) };
    }
    drop(reg);
    // SAFETY: `ctx` was recorded as a live `ibv_context` allocated by `open_device`, and is
    // no longer recorded.
    unsafe { free::<ibv_context>(ctx) };
    Ok(())
}

/// The context of a context pointer.
fn context_of(ctx: *mut ibv_context) -> Result<Arc<Context>, c_int> {
    registry()
        .contexts
        .get(&(ctx as usize))
        .cloned()
        .ok_or(libc::EINVAL)
}

/// `ibv_alloc_pd`.
pub(crate) fn alloc_pd(ctx: *mut ibv_context) -> Result<*mut ibv_pd, c_int> {
    let mut reg = registry();
    if !reg.contexts.contains_key(&(ctx as usize)) {
        return Err(libc::EINVAL);
    }
    let ptr = leak(ibv_pd {
        context: ctx,
        handle: next_key(),
    });
    let pd = Pd {
        ptr,
        ctx: ctx as usize,
        regions: Mutex::new(HashMap::new()),
    };
    reg.pds.insert(ptr, Arc::new(pd));
    Ok(ptr as *mut ibv_pd)
}

/// `ibv_dealloc_pd`: `EBUSY` while regions or queue pairs use it.
pub(crate) fn dealloc_pd(pd: *mut ibv_pd) -> Result<(), c_int> {
    let ptr = pd as usize;
    let mut reg = registry();
    if !reg.pds.contains_key(&ptr) {
        return Err(libc::EINVAL);
    }
    let used =
        reg.mrs.values().any(|m| m.pd.ptr == ptr) || reg.qps.values().any(|q| q.pd.ptr == ptr);
    if used {
        return Err(libc::EBUSY);
    }
    reg.pds.remove(&ptr);
    // SAFETY: `ptr` was recorded as a live `ibv_pd` allocated by `alloc_pd`, and is no
    // longer recorded.
    unsafe { free::<ibv_pd>(ptr) };
    Ok(())
}

/// `ibv_create_cq`.
pub(crate) fn create_cq(
    ctx: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> Result<*mut ibv_cq, c_int> {
    let mut reg = registry();
    if !reg.contexts.contains_key(&(ctx as usize))
        || !(1..=MAX_CQE).contains(&cqe)
        || comp_vector != 0
    {
        return Err(libc::EINVAL);
    }
    if !channel.is_null() {
        return Err(libc::EOPNOTSUPP);
    }
    let ptr = leak(ibv_cq {
        context: ctx,
        cq_context,
        handle: next_key(),
        cqe,
        ..Default::default()
    });
    reg.cqs
        .insert(ptr, Arc::new(Cq::new(ptr, ctx as usize, cqe as usize)));
    Ok(ptr as *mut ibv_cq)
}

/// `ibv_destroy_cq`: `EBUSY` while queue pairs use it.
pub(crate) fn destroy_cq(cq: *mut ibv_cq) -> Result<(), c_int> {
    let ptr = cq as usize;
    let mut reg = registry();
    if !reg.cqs.contains_key(&ptr) {
        return Err(libc::EINVAL);
    }
    if reg
        .qps
        .values()
        .any(|q| q.send_cq.ptr == ptr || q.recv_cq.ptr == ptr)
    {
        return Err(libc::EBUSY);
    }
    reg.cqs.remove(&ptr);
    // SAFETY: `ptr` was recorded as a live `ibv_cq` allocated by `create_cq`, and is no
    // longer recorded.
    unsafe { free::<ibv_cq>(ptr) };
    Ok(())
}

/// The completion queue of a pointer.
pub(crate) fn cq_of(cq: *mut ibv_cq) -> Option<Arc<Cq>> {
    registry().cqs.get(&(cq as usize)).cloned()
}

/// The queue pair of a pointer.
pub(crate) fn qp_of(qp: *mut ibv_qp) -> Option<Arc<Qp>> {
    registry().qps.get(&(qp as usize)).cloned()
}

/// `ibv_create_qp`: a UC queue pair in RESET; writes the capacities given back to `attr`.
///
/// # Safety
///
/// `attr` is null or points to a readable and writable `ibv_qp_init_attr`.
pub(crate) unsafe fn create_qp(
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> Result<*mut ibv_qp, c_int> {
    if attr.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: `attr` is not null, so by the contract it is a readable `ibv_qp_init_attr`.
    let init = unsafe { *attr };
    let mut reg = registry();
    let pd_rec = reg.pds.get(&(pd as usize)).cloned().ok_or(libc::EINVAL)?;
    if init.qp_type != IBV_QPT_UC {
        return Err(libc::EOPNOTSUPP);
    }
    let send_cq = reg
        .cqs
        .get(&(init.send_cq as usize))
        .cloned()
        .ok_or(libc::EINVAL)?;
    let recv_cq = reg
        .cqs
        .get(&(init.recv_cq as usize))
        .cloned()
        .ok_or(libc::EINVAL)?;
    let cap = init.cap;
    let bad = !init.srq.is_null()
        || send_cq.ctx != pd_rec.ctx
        || recv_cq.ctx != pd_rec.ctx
        || cap.max_send_wr > limits().wrs
        || cap.max_recv_wr > limits().wrs
        || cap.max_send_sge > MAX_SGE
        || cap.max_recv_sge > MAX_SGE
        || cap.max_inline_data > 0;
    if bad {
        return Err(libc::EINVAL);
    }
    let device = reg.device_of(pd_rec.ctx).ok_or(libc::EINVAL)?;
    let on_device = reg
        .qps
        .values()
        .filter(|q| reg.device_of(q.ctx) == Some(device))
        .count();
    if on_device >= limits().qps {
        return Err(libc::ENOMEM);
    }
    let context = reg.contexts.get(&pd_rec.ctx).ok_or(libc::EINVAL)?;
    let endpoint = Arc::clone(&context.endpoint);
    let ordinal = context.device.qps_created.fetch_add(1, Ordering::Relaxed);
    let label = trace::label(
        &trace::rank(),
        &context.device.name.to_string_lossy(),
        ordinal,
    );
    let qpn = endpoint.next_qpn()?;
    let ptr = leak(ibv_qp {
        context: pd_rec.ctx as *mut ibv_context,
        qp_context: init.qp_context,
        pd,
        send_cq: init.send_cq,
        recv_cq: init.recv_cq,
        handle: qpn,
        qp_num: qpn,
        state: IBV_QPS_RESET,
        qp_type: IBV_QPT_UC,
        ..Default::default()
    });
    let qp = Arc::new(Qp::new(
        ptr,
        pd_rec.ctx,
        qpn,
        pd_rec,
        send_cq,
        recv_cq,
        Arc::clone(&endpoint),
        cap,
        init.sq_sig_all != 0,
        label,
    ));
    endpoint.attach(qpn, Arc::clone(&qp));
    reg.qps.insert(ptr, qp);
    // SAFETY: `attr` is not null, so by the contract it is a writable `ibv_qp_init_attr`.
    unsafe { (*attr).cap = cap };
    Ok(ptr as *mut ibv_qp)
}

/// Detaches a queue pair that is no longer recorded and frees its `ibv_qp`.
fn retire_qp(qp: &Qp) {
    qp.endpoint.detach(qp.qpn);
    qp.mark_destroyed();
    qp.send_cq.clean(qp.qpn);
    qp.recv_cq.clean(qp.qpn);
    // SAFETY: `qp.ptr` is the `ibv_qp` allocated by `create_qp`; the queue pair is no longer
    // recorded and is marked destroyed, so no call and no receiver thread touches it again.
    unsafe { free::<ibv_qp>(qp.ptr) };
}

/// `ibv_destroy_qp`.
pub(crate) fn destroy_qp(qp: *mut ibv_qp) -> Result<(), c_int> {
    let removed = registry().qps.remove(&(qp as usize)).ok_or(libc::EINVAL)?;
    retire_qp(&removed);
    Ok(())
}

/// `ibv_query_device`: the limits every device of the provider enforces ([`limits`]), one
/// port, and the rest zero.
///
/// # Safety
///
/// `out` is null or points to a writable `ibv_device_attr`.
pub(crate) unsafe fn query_device(
    ctx: *mut ibv_context,
    out: *mut ibv_device_attr,
) -> Result<(), c_int> {
    context_of(ctx)?;
    if out.is_null() {
        return Err(libc::EINVAL);
    }
    let limits = limits();
    let int = |n: usize| c_int::try_from(n).unwrap_or(c_int::MAX);
    let attr = ibv_device_attr {
        max_qp: int(limits.qps),
        max_qp_wr: int(limits.wrs as usize),
        max_sge: MAX_SGE as c_int,
        max_cq: int(limits.qps),
        max_cqe: MAX_CQE,
        max_mr: int(limits.mrs),
        max_pd: int(limits.qps),
        phys_port_cnt: PORT_NUM,
        ..ibv_device_attr::default()
    };
    // SAFETY: `out` is not null, so by the contract it is a writable `ibv_device_attr`.
    unsafe { out.write(attr) };
    Ok(())
}

/// `ibv_query_port`: fills the compatibility layout (the first
/// [`COMPAT_PORT_ATTR_BYTES`] bytes).
///
/// # Safety
///
/// `out` is null or points to [`COMPAT_PORT_ATTR_BYTES`] writable bytes.
pub(crate) unsafe fn query_port(
    ctx: *mut ibv_context,
    port: u8,
    out: *mut ibv_port_attr,
) -> Result<(), c_int> {
    context_of(ctx)?;
    if port != PORT_NUM || out.is_null() {
        return Err(libc::EINVAL);
    }
    let attr = device::port_attr();
    let src = (&attr as *const ibv_port_attr).cast::<u8>();
    // SAFETY: `attr` is a live local of more than COMPAT_PORT_ATTR_BYTES bytes; `out` is not
    // null, so by the contract it has that many writable bytes; they cannot overlap.
    unsafe { core::ptr::copy_nonoverlapping(src, out.cast::<u8>(), COMPAT_PORT_ATTR_BYTES) };
    Ok(())
}

/// `ibv_query_gid`.
///
/// # Safety
///
/// `out` is null or points to a writable `union ibv_gid`.
pub(crate) unsafe fn query_gid(
    ctx: *mut ibv_context,
    port: u8,
    index: c_int,
    out: *mut ibv_gid,
) -> Result<(), c_int> {
    let context = context_of(ctx)?;
    let table = device::gids_of(&context.endpoint);
    let entry = usize::try_from(index).ok().and_then(|i| table.get(i));
    let (Some(gid), true, false) = (entry, port == PORT_NUM, out.is_null()) else {
        return Err(libc::EINVAL);
    };
    // SAFETY: `out` is not null, so by the contract it is a writable `union ibv_gid`.
    unsafe { out.write(*gid) };
    Ok(())
}

/// `ibv_modify_qp`.
///
/// # Safety
///
/// `attr` is null or points to a readable `ibv_qp_attr`.
pub(crate) unsafe fn modify_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    mask: c_int,
) -> Result<(), c_int> {
    let qp = qp_of(qp).ok_or(libc::EINVAL)?;
    if attr.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: `attr` is not null, so by the contract it is a readable `ibv_qp_attr`.
    let attr = unsafe { *attr };
    qp.modify(&attr, mask)
}

/// `ibv_reg_mr`.
///
/// # Safety
///
/// `addr .. addr + length` stays readable and writable memory, used by nothing else while a
/// message may land in it, until the region is deregistered (or its context closed): the
/// data path reads and writes it through the SGEs that name it.
pub(crate) unsafe fn reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> Result<*mut ibv_mr, c_int> {
    let mut reg = registry();
    let pd_rec = reg.pds.get(&(pd as usize)).cloned().ok_or(libc::EINVAL)?;
    let remote = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;
    let bad = addr.is_null()
        || length == 0
        || (addr as usize).checked_add(length).is_none()
        || (access & remote != 0 && access & IBV_ACCESS_LOCAL_WRITE == 0);
    if bad {
        return Err(libc::EINVAL);
    }
    let device = reg.device_of(pd_rec.ctx).ok_or(libc::EINVAL)?;
    let on_device = reg
        .mrs
        .values()
        .filter(|m| reg.device_of(m.ctx) == Some(device))
        .count();
    if on_device >= limits().mrs {
        return Err(libc::ENOMEM);
    }
    let lkey = next_key();
    let ptr = leak(ibv_mr {
        context: pd_rec.ctx as *mut ibv_context,
        pd,
        addr,
        length,
        handle: lkey,
        lkey,
        rkey: lkey,
    });
    pd_rec
        .regions
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(
            lkey,
            Region {
                addr: addr as u64,
                len: length as u64,
                access,
            },
        );
    reg.mrs.insert(
        ptr,
        MrRec {
            ctx: pd_rec.ctx,
            pd: pd_rec,
            lkey,
        },
    );
    Ok(ptr as *mut ibv_mr)
}

/// `ibv_dereg_mr`; `EBUSY`, the region left registered, when the configuration asks for it
/// (`NUVEC_VERBS_EMU_FAIL_DEREG=1`).
pub(crate) fn dereg_mr(mr: *mut ibv_mr) -> Result<(), c_int> {
    let mut reg = registry();
    if !reg.mrs.contains_key(&(mr as usize)) {
        return Err(libc::EINVAL);
    }
    if config::get().as_ref().is_ok_and(|c| c.fail_dereg) {
        return Err(libc::EBUSY);
    }
    let rec = reg.mrs.remove(&(mr as usize)).ok_or(libc::EINVAL)?;
    drop(reg);
    rec.pd
        .regions
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .remove(&rec.lkey);
    // SAFETY: `mr` was recorded as a live `ibv_mr` allocated by `reg_mr`, and is no longer
    // recorded.
    unsafe { free::<ibv_mr>(mr as usize) };
    Ok(())
}
