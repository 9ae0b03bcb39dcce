//! The real RDMA fabric of the JACCL backend (cargo feature `jaccl`): MLX's unreliable
//! connected (UC) queue pairs, brought up exactly as MLX does (reference §3.4), behind the
//! crate's [`Fabric`] trait as [message channels](ChannelKind::Message).
//!
//! - [`devices`] lists the RDMA devices, [`available`] says whether there is at least one;
//! - [`RdmaFabric::connect`] opens one queue pair per connection of the [`Config`]'s topology,
//!   exchanges their details over the [`SideChannel`] in MLX's order, and ends with MLX's
//!   side-channel barrier;
//! - [`RdmaFabric`] then moves each [`Transfer`] as one `IBV_WR_SEND` / one posted receive.
//!
//! # Bring-up, per connection (as MLX)
//!
//! Open the device whose name matches exactly; allocate a protection domain; create a
//! completion queue of 64 entries (no completion channel: completions are busy-polled);
//! create a UC queue pair on it (32 send and 32 receive work requests, 1 SGE each way, no
//! inline data, `sq_sig_all` 0); register the frames (local write, remote read, remote write);
//! move to INIT (port 1, pkey index 0, the same access flags); read the LID of port 1 and the
//! first IPv4-mapped GID of its GID table; advertise packet sequence number 7. After the
//! side-channel exchange ([`SideChannel::exchange_mesh`] or
//! [`SideChannel::exchange_ring`]): RTR (MTU 1024, the remote PSN, the remote QP number, the
//! remote LID, port 1, and when the remote GID's interface id is not zero a global route to it
//! with source GID index 1 — MLX hard-codes 1 — and hop limit 1), RTS (send PSN 7). Once every
//! queue pair is ready to send, [`SideChannel::barrier`].
//!
//! # Channels
//!
//! - **Mesh**: one queue pair per peer, the channel `(peer, link 0)`; it connects to the
//!   peer's queue pair towards this rank.
//! - **Ring** of R > 2 ranks with C cables per direction: the queue pair of MLX's `right_[w]`
//!   is the channel `(right neighbour, link w)` and that of `left_[w]` the channel
//!   `(left neighbour, link w)`, w in `0..C`.
//! - **Ring of 2 ranks**: both neighbours are the same peer, with `2C` links: `right_[w]` is
//!   link `w` and `left_[w]` link `C + w`.
//!
//! My `right_[w]` connects to my right neighbour's `left_[w]` (and my `left_[w]` to my left
//! neighbour's `right_[w]`), so this numbering is [`Wiring::ring`](crate::fabric::Wiring::ring)'s:
//! every rank "opens" its right links and "accepts" its left ones.
//!
//! # Data path
//!
//! Every queue pair owns page-aligned registered frames of [`MAX_FRAME`] bytes (512 KiB,
//! MLX's largest size class, so that any message fits whatever frame size the peers use):
//! [`IN_FLIGHT`] send frames and [`RECV_AHEAD`] receive frames.
//!
//! - A [`Transfer::Send`] of n bytes (1 ≤ n ≤ [`MAX_FRAME`]) is staged into a free send frame
//!   and posted as one signaled `IBV_WR_SEND` of exactly those n bytes; at most
//!   [`IN_FLIGHT`] sends are in flight per queue pair (MLX's `NUM_BUFFERS`); it completes with
//!   its (local) work completion. A larger send fails with [`FailureKind::Invalid`].
//! - The fabric keeps [`RECV_AHEAD`] receives posted on every queue pair from the moment it is
//!   ready to receive, twice MLX's depth of 2, so that a peer that runs ahead of this rank by
//!   one step of two messages still finds a receive. A message that completes a receive waits
//!   in its frame, in arrival order, until a [`Transfer::Recv`] takes it; its frame is posted
//!   again once delivered. So a receive takes exactly one message: its completion status must
//!   be success (else [`FailureKind::Completion`] naming the status) and its length must be the
//!   receive's (else [`FailureKind::MessageSize`]); the bytes are handed to the landing at
//!   once (`landing.deliver(0, bytes)`).
//! - Transfers of no bytes complete at once and move nothing (no message).
//! - Completions are busy-polled; the step's deadline is checked against [`Fabric::now`], a
//!   monotonic clock started when the fabric was created. When it passes, the step fails with
//!   [`FailureKind::TimedOut`] naming the transfer that made the least progress
//!   ([`most_stuck`]): on UC a dead peer produces no error completion, only silence.
//! - Transfers on the same channel and direction run in the order given.
//! - [`Fabric::last_heard`] is when a message from the peer last completed a receive.
//!
//! Dropping the fabric destroys, per queue pair, the queue pair, then the completion queue,
//! deregisters the frames, deallocates the protection domain and closes the device, in that
//! order; failures while releasing are ignored (there is nobody to report them to).
//!
//! # Building
//!
//! The feature depends on the `ibverbs` crate (device listing) and its bindings crate
//! `ibverbs-sys` 0.3.2 (the raw verbs calls). `ibverbs-sys`'s build script compiles the
//! rdma-core sources it vendors (version 55) with CMake, runs bindgen on their `verbs.h`, and
//! links the system's `libibverbs`. It reads no environment variable for other headers or
//! libraries: there is no `RDMA_CORE_INCLUDE_DIR`, `RDMA_CORE_LIB_DIR` or `IBVERBS_HEADER_DIR`
//! in that version. On Linux it needs `cmake`, `pkg-config`, libnl 3 (with its route
//! library), libclang and `libibverbs` (Debian: `cmake pkg-config libnl-3-dev
//! libnl-route-3-dev libclang-dev libibverbs-dev`). A binary built with the feature links
//! `libibverbs` and does not start where it is missing (MLX `dlopen`s its library and reports
//! JACCL unavailable instead); [`available`] is then about devices only.
//!
//! **macOS 26.2 and later** (Apple's `librdma.dylib`, the Thunderbolt provider MLX uses): the
//! feature does **not** build there as published, because rdma-core's CMake build needs Linux
//! (libnl, Linux kernel headers) and the link asks for `libibverbs`, not `librdma`. Making it
//! build needs bindings generated from the `verbs.h` of the macOS 26.2 SDK and a link to
//! `librdma` (a patched `ibverbs-sys` through `[patch.crates-io]`, or a loader that resolves
//! MLX's 16 `ibv_*` symbols with `dlopen` as MLX does). The code of this module uses only
//! those 16 functions and the `post_send`, `post_recv` and `poll_cq` entries of the context's
//! operation table, as MLX does, so it would not change.
//!
//! # What is verified
//!
//! - That it builds on Linux against rdma-core, with every lint of the crate.
//! - That on a machine without RDMA hardware [`devices`] returns without panicking (an empty
//!   list, or an error saying that no RDMA device is available) and [`available`] is false.
//! - The pure parts (channel numbering, GID selection, decoding of a peer's details, step
//!   checks), by unit tests.
//!
//! **Not verified**: the bring-up and the data path on real hardware (Thunderbolt 5 Macs, or
//! any RDMA device); interoperation with MLX's C++ peers. The hardware test of
//! `tests/jaccl_rdma.rs` is there for that, run under `mlx.launch --backend jaccl`.

use std::collections::VecDeque;
use std::ffi::CStr;
use std::fmt;
use std::io;
use std::os::raw::{c_int, c_void};
use std::ptr::{self, NonNull};
use std::time::{Duration, Instant};

use ibverbs_sys as ffi;

use super::config::{Config, Topology};
use super::side_channel::{Destination, SideChannel};
use crate::error::Error;
use crate::fabric::{
    Channel, ChannelKind, Direction, Fabric, FabricError, FailureKind, Landing, Transfer,
    most_stuck,
};

/// The largest frame, and the size of every registered frame: MLX's largest size class,
/// 4096 · 2^7 bytes.
pub use super::frames::MAX_FRAME;

/// Sends in flight per queue pair (MLX's `NUM_BUFFERS`).
pub use super::frames::IN_FLIGHT;

/// Receives kept posted per queue pair (MLX keeps 2).
pub const RECV_AHEAD: usize = 4;

/// The port every queue pair uses (MLX: 1).
const PORT: u8 = 1;

/// The packet sequence number both directions start at (MLX: 7).
const PSN: u32 = 7;

/// Entries of each completion queue (MLX: `MAX_SEND_WR` + `MAX_RECV_WR`).
const CQ_ENTRIES: c_int = 64;

/// Work requests per queue of a queue pair (MLX's `MAX_SEND_WR`, `MAX_RECV_WR`).
const MAX_WR: u32 = 32;

/// The source GID index of a global route (MLX hard-codes 1, whatever GID it advertised).
const SGID_INDEX: u8 = 1;

/// The hop limit of a global route (MLX: 1).
const HOP_LIMIT: u8 = 1;

/// The alignment of frames: a multiple of the page size of every system this runs on (4 KiB
/// on x86-64 Linux, 16 KiB on Apple silicon), as MLX's page-aligned buffers.
const FRAME_ALIGN: usize = 16 << 10;

/// Work completions taken per poll.
const POLL_BATCH: usize = 16;

/// The kinds of work request, in the upper half of a work request id.
const WR_SEND: u64 = 1;
const WR_RECV: u64 = 2;

/// The RDMA device names of this machine, in the library's order.
///
/// # Errors
///
/// [`Error::Config`] naming the failing call when the verbs library cannot list devices; on a
/// machine without RDMA support the message says that no RDMA device is available.
pub fn devices() -> Result<Vec<String>, Error> {
    let list = ibverbs::devices().map_err(|e| {
        Error::Config(format!(
            "jaccl: no RDMA device is available: listing the RDMA devices \
             (ibv_get_device_list) failed: {e}{}",
            no_device_hint(&e)
        ))
    })?;
    Ok(list
        .iter()
        .map(|d| {
            d.name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        })
        .collect())
}

/// Whether this machine can run the RDMA fabric: the verbs library lists at least one device
/// (whether it is cabled and has an address is only known when connecting).
pub fn available() -> bool {
    devices().is_ok_and(|d| !d.is_empty())
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
fn no_device_hint(e: &io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(ENOSYS | ENOENT | ENODEV) => {
            " (the kernel has no RDMA support loaded; on a Mac, enable RDMA with `rdma_ctl \
             enable` in recoveryOS and reboot)"
        }
        _ => "",
    }
}

/// Which of MLX's ring queue pairs: `left_[w]` or `right_[w]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Left,
    Right,
}

/// The channel of ring queue pair `side`, wire `wire`, at `rank` of `size` with `wires`
/// cables per direction (see the [module docs](self)).
fn ring_channel(rank: usize, size: usize, wires: usize, side: Side, wire: usize) -> Channel {
    let left = (rank + size - 1) % size;
    let right = (rank + 1) % size;
    match side {
        Side::Right => Channel::new(right, wire),
        Side::Left if size == 2 => Channel::new(left, wires + wire),
        Side::Left => Channel::new(left, wire),
    }
}

/// Whether `gid` is IPv4-mapped (`::ffff:a.b.c.d`): bytes 0–9 zero, bytes 10–11 `0xff`.
fn is_ipv4_mapped(gid: &[u8; 16]) -> bool {
    gid[..10].iter().all(|b| *b == 0) && gid[10] == 0xff && gid[11] == 0xff
}

/// The interface id of a GID: its last 8 bytes, big-endian.
fn interface_id(gid: &[u8; 16]) -> u64 {
    u64::from_be_bytes([
        gid[8], gid[9], gid[10], gid[11], gid[12], gid[13], gid[14], gid[15],
    ])
}

/// A peer's queue pair as RTR needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Remote {
    lid: u16,
    qpn: u32,
    psn: u32,
    /// The GID to route to, when its interface id is not zero (MLX's test).
    gid: Option<[u8; 16]>,
}

/// Checks the details `peer` advertised: a 16-bit LID, a 24-bit QP number and PSN.
fn remote(peer: usize, d: &Destination) -> Result<Remote, String> {
    let lid = u16::try_from(d.local_id).map_err(|_| {
        format!(
            "rank {peer} advertised LID {}, which is not a 16-bit LID (a placeholder entry, or \
             ranks disagreeing on the topology)",
            d.local_id
        )
    })?;
    let qpn = u32::try_from(d.queue_pair_number)
        .ok()
        .filter(|q| *q < 1 << 24)
        .ok_or_else(|| {
            format!(
                "rank {peer} advertised queue pair number {}, not a 24-bit number",
                d.queue_pair_number
            )
        })?;
    let psn = u32::try_from(d.packet_sequence_number)
        .ok()
        .filter(|p| *p < 1 << 24)
        .ok_or_else(|| {
            format!(
                "rank {peer} advertised packet sequence number {}, not a 24-bit number",
                d.packet_sequence_number
            )
        })?;
    let gid = (interface_id(&d.global_identifier) != 0).then_some(d.global_identifier);
    Ok(Remote { lid, qpn, psn, gid })
}

/// The name of a work completion status.
fn status_name(status: ffi::ibv_wc_status::Type) -> String {
    use ffi::ibv_wc_status as s;
    let name = match status {
        s::IBV_WC_SUCCESS => "IBV_WC_SUCCESS",
        s::IBV_WC_LOC_LEN_ERR => "IBV_WC_LOC_LEN_ERR (local length error)",
        s::IBV_WC_LOC_QP_OP_ERR => "IBV_WC_LOC_QP_OP_ERR (local QP operation error)",
        s::IBV_WC_LOC_EEC_OP_ERR => "IBV_WC_LOC_EEC_OP_ERR",
        s::IBV_WC_LOC_PROT_ERR => "IBV_WC_LOC_PROT_ERR (local protection error)",
        s::IBV_WC_WR_FLUSH_ERR => "IBV_WC_WR_FLUSH_ERR (flushed: the queue pair is in error)",
        s::IBV_WC_MW_BIND_ERR => "IBV_WC_MW_BIND_ERR",
        s::IBV_WC_BAD_RESP_ERR => "IBV_WC_BAD_RESP_ERR",
        s::IBV_WC_LOC_ACCESS_ERR => "IBV_WC_LOC_ACCESS_ERR (local access error)",
        s::IBV_WC_REM_INV_REQ_ERR => "IBV_WC_REM_INV_REQ_ERR (remote invalid request)",
        s::IBV_WC_REM_ACCESS_ERR => "IBV_WC_REM_ACCESS_ERR",
        s::IBV_WC_REM_OP_ERR => "IBV_WC_REM_OP_ERR (remote operation error)",
        s::IBV_WC_RETRY_EXC_ERR => "IBV_WC_RETRY_EXC_ERR",
        s::IBV_WC_RNR_RETRY_EXC_ERR => "IBV_WC_RNR_RETRY_EXC_ERR",
        s::IBV_WC_LOC_RDD_VIOL_ERR => "IBV_WC_LOC_RDD_VIOL_ERR",
        s::IBV_WC_REM_INV_RD_REQ_ERR => "IBV_WC_REM_INV_RD_REQ_ERR",
        s::IBV_WC_REM_ABORT_ERR => "IBV_WC_REM_ABORT_ERR (remote aborted)",
        s::IBV_WC_INV_EECN_ERR => "IBV_WC_INV_EECN_ERR",
        s::IBV_WC_INV_EEC_STATE_ERR => "IBV_WC_INV_EEC_STATE_ERR",
        s::IBV_WC_FATAL_ERR => "IBV_WC_FATAL_ERR (fatal error)",
        s::IBV_WC_RESP_TIMEOUT_ERR => "IBV_WC_RESP_TIMEOUT_ERR (response timeout)",
        s::IBV_WC_GENERAL_ERR => "IBV_WC_GENERAL_ERR (general error)",
        other => return format!("unknown status {other}"),
    };
    name.to_owned()
}

/// Why `transfer` cannot run on a fabric whose channels are `exists`: a channel that does not
/// exist, a message larger than a frame, a sink whose length is not a whole number of grains.
fn check_transfer(transfer: &Transfer<'_>, exists: bool) -> Option<String> {
    let channel = transfer.channel();
    if !exists {
        return Some(format!("there is no RDMA queue pair for {channel}"));
    }
    let len = transfer.len();
    if len > MAX_FRAME {
        let what = match transfer.direction() {
            Direction::Send => "a send",
            Direction::Recv => "a receive",
        };
        return Some(format!(
            "{what} of {len} bytes on {channel}: one RDMA message holds at most {MAX_FRAME} bytes \
             (one frame)"
        ));
    }
    if let Transfer::Recv {
        landing: landing @ Landing::Sink { .. },
        ..
    } = transfer
    {
        let grain = landing.grain();
        if !len.is_multiple_of(grain) {
            return Some(format!(
                "a receive of {len} bytes on {channel} into a sink of {grain}-byte grains: the \
                 length must be a whole number of grains"
            ));
        }
    }
    None
}

/// A page-aligned, zeroed block of memory, freed on drop.
struct Region {
    ptr: NonNull<u8>,
    layout: std::alloc::Layout,
}

impl Region {
    /// `len` (non-zero) bytes aligned to [`FRAME_ALIGN`]; `None` when out of memory.
    fn new(len: usize) -> Option<Region> {
        let layout = std::alloc::Layout::from_size_align(len.max(1), FRAME_ALIGN).ok()?;
        // SAFETY: `layout` has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        NonNull::new(ptr).map(|ptr| Region { ptr, layout })
    }

    fn len(&self) -> usize {
        self.layout.size()
    }

    fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The bytes, while no work request is using them.
    fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` points to `len` initialised (zeroed, then written) bytes owned by this
        // region; the fabric only reads a frame while no posted receive targets it, so the
        // device does not write it during the borrow.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len()) }
    }

    /// The bytes, mutably, while no work request is using them.
    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, and `&mut self` makes the borrow unique; the fabric only
        // writes a send frame that is not in flight, so the device does not read it meanwhile.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len()) }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: `ptr` was allocated by `alloc_zeroed` with `layout` and is freed only here.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// A registered frame: the memory and its memory region (deregistered by [`Qp`]'s drop,
/// before the memory is freed).
struct Frame {
    mem: Region,
    mr: *mut ffi::ibv_mr,
    lkey: u32,
}

/// The state of a send frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    /// Not in flight.
    Free,
    /// Posted; the transfer of the current step it carries, if any (a send left in flight by
    /// a failed step has none).
    Busy(Option<usize>),
}

/// A receive that completed and waits for a [`Transfer::Recv`] to take it.
#[derive(Clone, Copy, Debug)]
struct Arrival {
    frame: usize,
    /// `None` on success, else the status and the vendor error.
    error: Option<(ffi::ibv_wc_status::Type, u32)>,
    len: usize,
}

type PostSend = unsafe extern "C" fn(
    *mut ffi::ibv_qp,
    *mut ffi::ibv_send_wr,
    *mut *mut ffi::ibv_send_wr,
) -> c_int;
type PostRecv = unsafe extern "C" fn(
    *mut ffi::ibv_qp,
    *mut ffi::ibv_recv_wr,
    *mut *mut ffi::ibv_recv_wr,
) -> c_int;
type PollCq = unsafe extern "C" fn(*mut ffi::ibv_cq, c_int, *mut ffi::ibv_wc) -> c_int;

/// The data-path entries of a device context's operation table (the inline `ibv_post_send`,
/// `ibv_post_recv` and `ibv_poll_cq` of `verbs.h` call through them).
#[derive(Clone, Copy)]
struct Ops {
    post_send: PostSend,
    post_recv: PostRecv,
    poll_cq: PollCq,
}

/// One queue pair with everything it owns: the device context, protection domain, completion
/// queue and frames. The pointers are null until created; drop releases what exists in MLX's
/// order.
struct Qp {
    /// "device rdma_en3 (queue pair to rank 2, link 0)", for messages.
    what: String,
    channel: Channel,
    ctx: *mut ffi::ibv_context,
    pd: *mut ffi::ibv_pd,
    cq: *mut ffi::ibv_cq,
    qp: *mut ffi::ibv_qp,
    ops: Option<Ops>,
    send: Vec<Frame>,
    slots: [Slot; IN_FLIGHT],
    recv: Vec<Frame>,
    arrived: VecDeque<Arrival>,
    /// This queue pair's details for the peer.
    local: Destination,
}

// SAFETY: the verbs objects behind the pointers are not tied to the thread that created them
// (libibverbs is thread-safe), and `Qp` owns them exclusively: moving it to another thread
// moves that ownership. It is not `Sync` (nothing here is shared).
unsafe impl Send for Qp {}

impl Drop for Qp {
    fn drop(&mut self) {
        // Return codes are ignored: there is nobody to report them to, and what follows must
        // still be released.
        if !self.qp.is_null() {
            // SAFETY: `qp` was created by `ibv_create_qp` and is destroyed only here.
            unsafe { ffi::ibv_destroy_qp(self.qp) };
        }
        if !self.cq.is_null() {
            // SAFETY: `cq` was created by `ibv_create_cq`; its queue pair is gone.
            unsafe { ffi::ibv_destroy_cq(self.cq) };
        }
        for frame in self.send.iter_mut().chain(self.recv.iter_mut()) {
            if !frame.mr.is_null() {
                // SAFETY: `mr` was registered by `ibv_reg_mr`; the queue pair that could use
                // it is destroyed, and the memory is freed only after this (field drop).
                unsafe { ffi::ibv_dereg_mr(frame.mr) };
                frame.mr = ptr::null_mut();
            }
        }
        if !self.pd.is_null() {
            // SAFETY: `pd` was allocated by `ibv_alloc_pd`; its queue pair and memory regions
            // are gone.
            unsafe { ffi::ibv_dealloc_pd(self.pd) };
        }
        if !self.ctx.is_null() {
            // SAFETY: `ctx` was opened by `ibv_open_device`; everything created on it is gone.
            unsafe { ffi::ibv_close_device(self.ctx) };
        }
    }
}

/// The device list of the verbs library, freed on drop.
struct DeviceList {
    list: *mut *mut ffi::ibv_device,
    len: usize,
}

impl DeviceList {
    fn get() -> io::Result<DeviceList> {
        let mut n: c_int = 0;
        // SAFETY: `n` is a valid place for the count.
        let list = unsafe { ffi::ibv_get_device_list(&mut n) };
        if list.is_null() {
            return Err(io::Error::last_os_error());
        }
        Ok(DeviceList {
            list,
            len: usize::try_from(n).unwrap_or(0),
        })
    }

    /// Device `i` and its name.
    fn device(&self, i: usize) -> Option<(*mut ffi::ibv_device, String)> {
        // SAFETY: `ibv_get_device_list` returned `len` device pointers at `list`, which stay
        // valid until the list is freed in drop.
        let devices = unsafe { std::slice::from_raw_parts(self.list, self.len) };
        let device = *devices.get(i)?;
        if device.is_null() {
            return None;
        }
        // SAFETY: `device` is a device of the live list.
        let name = unsafe { ffi::ibv_get_device_name(device) };
        if name.is_null() {
            return Some((device, String::new()));
        }
        // SAFETY: `ibv_get_device_name` returns a NUL-terminated string that lives as long as
        // the list; it is copied at once.
        let name = unsafe { CStr::from_ptr(name) };
        Some((device, name.to_string_lossy().into_owned()))
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: `list` came from `ibv_get_device_list` and is freed only here; contexts
        // opened from it stay valid.
        unsafe { ffi::ibv_free_device_list(self.list) };
    }
}

/// The last OS error, for a verbs call that returned null.
fn os_error() -> io::Error {
    io::Error::last_os_error()
}

impl Qp {
    /// MLX's bring-up up to INIT, and the local details (LID, first IPv4-mapped GID, PSN 7).
    fn open(device: &str, channel: Channel, what: String) -> Result<Qp, String> {
        let mut qp = Qp {
            what,
            channel,
            ctx: ptr::null_mut(),
            pd: ptr::null_mut(),
            cq: ptr::null_mut(),
            qp: ptr::null_mut(),
            ops: None,
            send: Vec::new(),
            slots: [Slot::Free; IN_FLIGHT],
            recv: Vec::new(),
            arrived: VecDeque::new(),
            local: Destination::default(),
        };
        qp.ctx = open_device(device)?;
        qp.ops = Some(qp.read_ops()?);

        // SAFETY: `ctx` is an open device context.
        qp.pd = unsafe { ffi::ibv_alloc_pd(qp.ctx) };
        if qp.pd.is_null() {
            return Err(format!("ibv_alloc_pd failed: {}", os_error()));
        }
        // SAFETY: `ctx` is an open device context; no completion channel, vector 0, as MLX.
        qp.cq =
            unsafe { ffi::ibv_create_cq(qp.ctx, CQ_ENTRIES, ptr::null_mut(), ptr::null_mut(), 0) };
        if qp.cq.is_null() {
            return Err(format!(
                "ibv_create_cq of {CQ_ENTRIES} entries failed: {}",
                os_error()
            ));
        }
        let mut init = ffi::ibv_qp_init_attr {
            qp_context: ptr::null_mut(),
            send_cq: qp.cq,
            recv_cq: qp.cq,
            srq: ptr::null_mut(),
            cap: ffi::ibv_qp_cap {
                max_send_wr: MAX_WR,
                max_recv_wr: MAX_WR,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: ffi::ibv_qp_type::IBV_QPT_UC,
            sq_sig_all: 0,
        };
        // SAFETY: `pd` is a live protection domain and `init` a valid attribute block whose
        // completion queues are live.
        qp.qp = unsafe { ffi::ibv_create_qp(qp.pd, &mut init) };
        if qp.qp.is_null() {
            return Err(format!(
                "ibv_create_qp (UC, {MAX_WR} send and {MAX_WR} receive work requests, 1 SGE) \
                 failed: {}",
                os_error()
            ));
        }

        for _ in 0..IN_FLIGHT {
            let frame = qp.register()?;
            qp.send.push(frame);
        }
        for _ in 0..RECV_AHEAD {
            let frame = qp.register()?;
            qp.recv.push(frame);
        }

        let mut attr = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_INIT,
            pkey_index: 0,
            port_num: PORT,
            qp_access_flags: access().0,
            ..Default::default()
        };
        let mask = ffi::ibv_qp_attr_mask::IBV_QP_STATE
            | ffi::ibv_qp_attr_mask::IBV_QP_PKEY_INDEX
            | ffi::ibv_qp_attr_mask::IBV_QP_PORT
            | ffi::ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS;
        qp.modify(&mut attr, mask, "INIT")?;

        let (lid, gid_table_len) = qp.query_port()?;
        let gid = qp.first_ipv4_mapped_gid(device, gid_table_len)?;
        // SAFETY: `qp` is a live queue pair.
        let qpn = unsafe { (*qp.qp).qp_num };
        qp.local = Destination {
            local_id: i32::from(lid),
            queue_pair_number: i32::try_from(qpn).map_err(|_| {
                format!("the queue pair number {qpn} does not fit MLX's 32-bit signed field")
            })?,
            packet_sequence_number: PSN as i32,
            global_identifier: gid,
        };
        Ok(qp)
    }

    /// The data-path entries of the context's operation table.
    fn read_ops(&self) -> Result<Ops, String> {
        // SAFETY: `ctx` is an open device context; its operation table is read, not kept.
        let ops = unsafe { &(*self.ctx).ops };
        match (ops.post_send, ops.post_recv, ops.poll_cq) {
            (Some(post_send), Some(post_recv), Some(poll_cq)) => Ok(Ops {
                post_send,
                post_recv,
                poll_cq,
            }),
            _ => Err(
                "the device's provider has no post_send, post_recv or poll_cq operation".to_owned(),
            ),
        }
    }

    /// Allocates and registers one frame of [`MAX_FRAME`] bytes.
    fn register(&mut self) -> Result<Frame, String> {
        let mem = Region::new(MAX_FRAME)
            .ok_or_else(|| format!("allocating a {MAX_FRAME}-byte frame: out of memory"))?;
        // SAFETY: `pd` is a live protection domain and `mem` a live block of `len` bytes that
        // outlives the registration (Qp's drop deregisters before the memory is freed).
        let mr = unsafe {
            ffi::ibv_reg_mr(
                self.pd,
                mem.as_ptr().cast::<c_void>(),
                mem.len(),
                access().0 as c_int,
            )
        };
        if mr.is_null() {
            return Err(format!(
                "ibv_reg_mr of a {MAX_FRAME}-byte frame failed: {}",
                os_error()
            ));
        }
        // SAFETY: `mr` is the live memory region just registered.
        let lkey = unsafe { (*mr).lkey };
        Ok(Frame { mem, mr, lkey })
    }

    /// `ibv_modify_qp` to `state`.
    fn modify(
        &mut self,
        attr: &mut ffi::ibv_qp_attr,
        mask: ffi::ibv_qp_attr_mask,
        state: &str,
    ) -> Result<(), String> {
        // SAFETY: `qp` is a live queue pair and `attr` a valid attribute block for `mask`.
        let rc = unsafe { ffi::ibv_modify_qp(self.qp, attr, mask.0 as c_int) };
        if rc != 0 {
            return Err(format!(
                "ibv_modify_qp to {state} failed: {}",
                io::Error::from_raw_os_error(rc)
            ));
        }
        Ok(())
    }

    /// The LID and GID table length of port 1.
    fn query_port(&self) -> Result<(u16, i32), String> {
        let mut attr = ffi::ibv_port_attr::default();
        // SAFETY: `ctx` is an open device context; `attr` is a full `ibv_port_attr`, at least
        // as large as the compatibility layout the exported symbol fills.
        let rc = unsafe {
            ffi::ibv_query_port(
                self.ctx,
                PORT,
                (&raw mut attr).cast::<ffi::_compat_ibv_port_attr>(),
            )
        };
        if rc != 0 {
            return Err(format!(
                "ibv_query_port of port {PORT} failed: {}",
                io::Error::from_raw_os_error(rc)
            ));
        }
        Ok((attr.lid, attr.gid_tbl_len))
    }

    /// The first IPv4-mapped GID of port 1 (MLX's scan).
    fn first_ipv4_mapped_gid(&self, device: &str, len: i32) -> Result<[u8; 16], String> {
        for index in 0..len.max(0) {
            let mut gid = ffi::ibv_gid::default();
            // SAFETY: `ctx` is an open device context and `gid` a valid place for one GID.
            let rc = unsafe { ffi::ibv_query_gid(self.ctx, PORT, index, &mut gid) };
            if rc != 0 {
                continue;
            }
            // SAFETY: every bit pattern of the union is a valid `[u8; 16]`.
            let raw = unsafe { gid.raw };
            if is_ipv4_mapped(&raw) {
                return Ok(raw);
            }
        }
        Err(format!(
            "no IPv4-mapped GID on port {PORT} of {device} (of {len} GID entries): the \
             Thunderbolt interface of this device needs an IPv4 address; assign a link-local \
             address, e.g. `ifconfig <interface> inet 169.254.0.1 netmask 255.255.0.0 alias`"
        ))
    }

    /// RTR to `remote`, the receives posted, RTS.
    fn connect(&mut self, remote: &Remote) -> Result<(), String> {
        let mut attr = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_RTR,
            path_mtu: ffi::IBV_MTU_1024,
            rq_psn: remote.psn,
            dest_qp_num: remote.qpn,
            ..Default::default()
        };
        attr.ah_attr.dlid = remote.lid;
        attr.ah_attr.sl = 0;
        attr.ah_attr.src_path_bits = 0;
        attr.ah_attr.port_num = PORT;
        if let Some(gid) = remote.gid {
            attr.ah_attr.is_global = 1;
            attr.ah_attr.grh.dgid = ffi::ibv_gid { raw: gid };
            attr.ah_attr.grh.sgid_index = SGID_INDEX;
            attr.ah_attr.grh.hop_limit = HOP_LIMIT;
        }
        let mask = ffi::ibv_qp_attr_mask::IBV_QP_STATE
            | ffi::ibv_qp_attr_mask::IBV_QP_AV
            | ffi::ibv_qp_attr_mask::IBV_QP_PATH_MTU
            | ffi::ibv_qp_attr_mask::IBV_QP_DEST_QPN
            | ffi::ibv_qp_attr_mask::IBV_QP_RQ_PSN;
        self.modify(&mut attr, mask, "RTR")?;

        for frame in 0..self.recv.len() {
            self.post_recv(frame)?;
        }

        let mut attr = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_RTS,
            sq_psn: PSN,
            ..Default::default()
        };
        let mask = ffi::ibv_qp_attr_mask::IBV_QP_STATE | ffi::ibv_qp_attr_mask::IBV_QP_SQ_PSN;
        self.modify(&mut attr, mask, "RTS")
    }

    fn ops(&self) -> Result<Ops, String> {
        self.ops
            .ok_or_else(|| "the queue pair is not open".to_owned())
    }

    /// Posts receive frame `frame` (its whole length).
    fn post_recv(&mut self, frame: usize) -> Result<(), String> {
        let ops = self.ops()?;
        let f = &self.recv[frame];
        let mut sge = ffi::ibv_sge {
            addr: f.mem.as_ptr() as u64,
            length: MAX_FRAME as u32,
            lkey: f.lkey,
        };
        let mut wr = ffi::ibv_recv_wr {
            wr_id: WR_RECV << 32 | frame as u64,
            next: ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        let mut bad = ptr::null_mut();
        // SAFETY: `qp` is a live queue pair of the context whose table `post_recv` came from;
        // `wr` and `sge` are valid for the call, and the frame stays registered and untouched
        // until its completion is polled.
        let rc = unsafe { (ops.post_recv)(self.qp, &mut wr, &mut bad) };
        if rc != 0 {
            return Err(format!(
                "ibv_post_recv failed: {}",
                io::Error::from_raw_os_error(rc)
            ));
        }
        Ok(())
    }

    /// Stages `data` into free send slot `slot` and posts it as one signaled SEND.
    fn post_send(&mut self, slot: usize, data: &[u8]) -> Result<(), String> {
        let ops = self.ops()?;
        let f = &mut self.send[slot];
        f.mem.bytes_mut()[..data.len()].copy_from_slice(data);
        let mut sge = ffi::ibv_sge {
            addr: f.mem.as_ptr() as u64,
            length: data.len() as u32,
            lkey: f.lkey,
        };
        let mut wr = ffi::ibv_send_wr {
            wr_id: WR_SEND << 32 | slot as u64,
            next: ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
            opcode: ffi::ibv_wr_opcode::IBV_WR_SEND,
            send_flags: ffi::ibv_send_flags::IBV_SEND_SIGNALED.0,
            ..Default::default()
        };
        let mut bad = ptr::null_mut();
        // SAFETY: `qp` is a live queue pair of the context whose table `post_send` came from;
        // `wr` and `sge` are valid for the call, and the frame stays registered and is not
        // written until its completion is polled.
        let rc = unsafe { (ops.post_send)(self.qp, &mut wr, &mut bad) };
        if rc != 0 {
            return Err(format!(
                "ibv_post_send of {} bytes failed: {}",
                data.len(),
                io::Error::from_raw_os_error(rc)
            ));
        }
        Ok(())
    }

    /// Polls the completion queue into `wcs`; the number taken.
    fn poll(&mut self, wcs: &mut [ffi::ibv_wc; POLL_BATCH]) -> Result<usize, String> {
        let ops = self.ops()?;
        // SAFETY: `cq` is a live completion queue of the context whose table `poll_cq` came
        // from, and `wcs` has room for `POLL_BATCH` completions.
        let n = unsafe { (ops.poll_cq)(self.cq, POLL_BATCH as c_int, wcs.as_mut_ptr()) };
        usize::try_from(n).map_err(|_| format!("ibv_poll_cq failed (returned {n})"))
    }
}

/// The access flags of MLX's memory regions and queue pairs.
fn access() -> ffi::ibv_access_flags {
    ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
        | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ
        | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
}

/// Opens the device named exactly `name`.
fn open_device(name: &str) -> Result<*mut ffi::ibv_context, String> {
    let list = DeviceList::get().map_err(|e| {
        format!(
            "no RDMA device is available: ibv_get_device_list failed: {e}{}",
            no_device_hint(&e)
        )
    })?;
    let mut names = Vec::new();
    for i in 0..list.len {
        let Some((device, found)) = list.device(i) else {
            continue;
        };
        if found == name {
            // SAFETY: `device` is a device of the live list.
            let ctx = unsafe { ffi::ibv_open_device(device) };
            if ctx.is_null() {
                return Err(format!("ibv_open_device failed: {}", os_error()));
            }
            return Ok(ctx);
        }
        names.push(found);
    }
    Err(if names.is_empty() {
        format!(
            "no RDMA device named {name}: this machine lists no RDMA device at all (on a Mac, \
             enable RDMA with `rdma_ctl enable` in recoveryOS and reboot)"
        )
    } else {
        format!(
            "no RDMA device named {name}; this machine has {} (check the device file)",
            names.join(", ")
        )
    })
}

/// MLX's RDMA fabric: UC queue pairs as [message channels](ChannelKind::Message). See the
/// [module docs](self) for the bring-up, the channel numbering and the data path.
pub struct RdmaFabric {
    rank: usize,
    size: usize,
    topology: Topology,
    start: Instant,
    qps: Vec<Qp>,
    /// `by_peer[peer][link]`: the index of the channel's queue pair in `qps`.
    by_peer: Vec<Vec<usize>>,
    /// Per peer, when a message from it last completed a receive ([`Fabric::last_heard`]).
    heard: Vec<Option<Duration>>,
}

impl fmt::Debug for RdmaFabric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RdmaFabric")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("topology", &self.topology)
            .field("queue_pairs", &self.qps.len())
            .finish()
    }
}

impl RdmaFabric {
    /// Connects this rank's queue pairs for the topology that `config` gives
    /// ([`Config::topology`]), exchanging their details over `side` and ending with MLX's
    /// side-channel barrier.
    ///
    /// Every wait on a peer is the side channel's, each bounded by its own timeout; the verbs
    /// calls do not wait on peers. `timeout` bounds the whole bring-up on top of that: it is
    /// checked before each exchange and before the barrier.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] when the configuration has no topology;
    /// [`Error::InvalidArgument`] when `side` is not this rank's side channel of the same
    /// group; [`Error::Connect`] naming the device, the peer and the failing verbs call (a
    /// missing device, no IPv4-mapped GID, a refused queue pair…), a peer's malformed
    /// details, or `timeout` passing; and the side channel's errors.
    pub fn connect(
        config: &Config,
        side: &mut SideChannel,
        timeout: Duration,
    ) -> Result<RdmaFabric, Error> {
        let begun = Instant::now();
        let (rank, size) = (config.rank(), config.size());
        if side.rank() != rank || side.size() != size {
            return Err(Error::InvalidArgument {
                rank,
                op: "jaccl rdma connect",
                what: format!(
                    "the side channel is rank {} of {} but the configuration is rank {rank} of \
                     {size}",
                    side.rank(),
                    side.size()
                ),
            });
        }
        let topology = config.topology()?;
        let fail = |what: String| Error::Connect {
            rank,
            what: format!("jaccl: rdma: {what}"),
        };
        let in_time = |next: &str| {
            let waited = begun.elapsed();
            if waited > timeout {
                Err(fail(format!(
                    "the bring-up took {waited:.3?}, more than the timeout of {timeout:?}, \
                     before {next}"
                )))
            } else {
                Ok(())
            }
        };
        let mut fabric = RdmaFabric {
            rank,
            size,
            topology,
            start: Instant::now(),
            qps: Vec::new(),
            by_peer: vec![Vec::new(); size],
            heard: vec![None; size],
        };
        match topology {
            Topology::Mesh => {
                let names = config.mesh_devices()?;
                let mut mine = vec![
                    Destination {
                        local_id: -1,
                        ..Destination::default()
                    };
                    size
                ];
                for (peer, name) in names.iter().enumerate() {
                    let Some(name) = name else { continue };
                    let channel = Channel::new(peer, 0);
                    let what = format!("device {name} (queue pair to rank {peer})");
                    let qp = Qp::open(name, channel, what.clone())
                        .map_err(|e| fail(format!("{what}: {e}")))?;
                    mine[peer] = qp.local;
                    fabric.add(qp);
                }
                in_time("exchanging the queue pairs' details")?;
                let all = side.exchange_mesh(&mine)?;
                for qp in &mut fabric.qps {
                    let peer = qp.channel.peer;
                    let theirs = all.get(peer).and_then(|row| row.get(rank)).ok_or_else(|| {
                        fail(format!("rank {peer} sent no details for rank {rank}"))
                    })?;
                    let remote =
                        remote(peer, theirs).map_err(|e| fail(format!("{}: {e}", qp.what)))?;
                    qp.connect(&remote)
                        .map_err(|e| fail(format!("{}: {e}", qp.what)))?;
                }
            }
            Topology::Ring { wires } => {
                let (left_names, right_names) = config.ring_devices()?;
                let left_peer = (rank + size - 1) % size;
                let right_peer = (rank + 1) % size;
                let mut left = Vec::with_capacity(wires);
                let mut right = Vec::with_capacity(wires);
                // MLX's order: the left connections, then the right ones.
                for (side_of, names, peer, into) in [
                    (Side::Left, left_names, left_peer, &mut left),
                    (Side::Right, right_names, right_peer, &mut right),
                ] {
                    for (w, name) in names.iter().enumerate().take(wires) {
                        let channel = ring_channel(rank, size, wires, side_of, w);
                        let what = format!(
                            "device {name} (queue pair to the {} neighbour rank {peer}, wire {w}, \
                             link {})",
                            if side_of == Side::Left {
                                "left"
                            } else {
                                "right"
                            },
                            channel.link
                        );
                        let qp = Qp::open(name, channel, what.clone())
                            .map_err(|e| fail(format!("{what}: {e}")))?;
                        into.push(fabric.qps.len());
                        fabric.add(qp);
                    }
                }
                let mine_left: Vec<Destination> =
                    left.iter().map(|&i| fabric.qps[i].local).collect();
                let mine_right: Vec<Destination> =
                    right.iter().map(|&i| fabric.qps[i].local).collect();
                in_time("exchanging the queue pairs' details")?;
                let all = side.exchange_ring(&mine_left, &mine_right)?;
                for (ids, remotes, peer) in [
                    (&left, all.remote_for_left(rank), left_peer),
                    (&right, all.remote_for_right(rank), right_peer),
                ] {
                    for (w, &i) in ids.iter().enumerate() {
                        let qp = &mut fabric.qps[i];
                        let theirs = remotes.get(w).ok_or_else(|| {
                            fail(format!("rank {peer} sent no details for wire {w}"))
                        })?;
                        let remote =
                            remote(peer, theirs).map_err(|e| fail(format!("{}: {e}", qp.what)))?;
                        qp.connect(&remote)
                            .map_err(|e| fail(format!("{}: {e}", qp.what)))?;
                    }
                }
            }
        }
        in_time("the final barrier")?;
        side.barrier()?;
        fabric.start = Instant::now();
        Ok(fabric)
    }

    /// Adds a queue pair under its channel.
    fn add(&mut self, qp: Qp) {
        let Channel { peer, link } = qp.channel;
        let links = &mut self.by_peer[peer];
        if links.len() <= link {
            links.resize(link + 1, usize::MAX);
        }
        links[link] = self.qps.len();
        self.qps.push(qp);
    }

    /// The topology the fabric was built for.
    pub fn topology(&self) -> Topology {
        self.topology
    }

    /// The index of `channel`'s queue pair.
    fn qp_of(&self, channel: Channel) -> Option<usize> {
        self.by_peer
            .get(channel.peer)
            .and_then(|links| links.get(channel.link))
            .copied()
            .filter(|i| *i < self.qps.len())
    }
}

/// A failure of transfer `t` of `step`.
fn failure(step: &[Transfer<'_>], t: usize, done: &[bool], kind: FailureKind) -> FabricError {
    let transfer = &step[t];
    FabricError {
        channel: transfer.channel(),
        direction: transfer.direction(),
        done: if done[t] { transfer.len() } else { 0 },
        total: transfer.len(),
        kind,
    }
}

impl Fabric for RdmaFabric {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn kind(&self) -> ChannelKind {
        ChannelKind::Message
    }

    fn links(&self, peer: usize) -> usize {
        self.by_peer.get(peer).map_or(0, Vec::len)
    }

    fn now(&self) -> Duration {
        self.start.elapsed()
    }

    fn last_heard(&self, peer: usize) -> Option<Duration> {
        self.heard.get(peer).copied().flatten()
    }

    fn run(&mut self, step: &mut [Transfer<'_>], deadline: Duration) -> Result<(), FabricError> {
        let started = self.now();
        let n = step.len();
        let mut done = vec![false; n];
        let mut owner = Vec::with_capacity(n);
        for (t, transfer) in step.iter().enumerate() {
            let qp = self.qp_of(transfer.channel());
            if let Some(what) = check_transfer(transfer, qp.is_some()) {
                return Err(failure(step, t, &done, FailureKind::Invalid(what)));
            }
            owner.push(qp.unwrap_or(usize::MAX));
        }
        // Per queue pair, the transfers of this step in order.
        let mut sends: Vec<VecDeque<usize>> = vec![VecDeque::new(); self.qps.len()];
        let mut recvs: Vec<VecDeque<usize>> = vec![VecDeque::new(); self.qps.len()];
        let mut remaining = 0usize;
        for (t, transfer) in step.iter().enumerate() {
            if transfer.is_empty() {
                done[t] = true;
                continue;
            }
            remaining += 1;
            match transfer.direction() {
                Direction::Send => sends[owner[t]].push_back(t),
                Direction::Recv => recvs[owner[t]].push_back(t),
            }
        }
        // Sends left in flight by an earlier, failed step belong to no transfer of this one.
        for qp in &mut self.qps {
            for slot in &mut qp.slots {
                if let Slot::Busy(owner) = slot {
                    *owner = None;
                }
            }
        }
        let mut wcs = [ffi::ibv_wc::default(); POLL_BATCH];
        while remaining > 0 {
            let mut progressed = false;
            for (q, qp) in self.qps.iter_mut().enumerate() {
                let busy = qp.slots.iter().any(|s| *s != Slot::Free);
                if sends[q].is_empty() && recvs[q].is_empty() && !busy {
                    continue;
                }
                // Post the sends in order while a frame is free.
                while let Some(&t) = sends[q].front() {
                    let Some(slot) = qp.slots.iter().position(|s| *s == Slot::Free) else {
                        break;
                    };
                    let data: &[u8] = match &step[t] {
                        Transfer::Send { data, .. } => data,
                        Transfer::Recv { .. } => &[],
                    };
                    qp.post_send(slot, data).map_err(|e| {
                        failure(
                            step,
                            t,
                            &done,
                            FailureKind::Transport(format!("{}: {e}", qp.what)),
                        )
                    })?;
                    qp.slots[slot] = Slot::Busy(Some(t));
                    sends[q].pop_front();
                    progressed = true;
                }
                // Take the completions.
                let polled = qp.poll(&mut wcs).map_err(|e| {
                    let t = recvs[q].front().or(sends[q].front()).copied();
                    match t {
                        Some(t) => failure(
                            step,
                            t,
                            &done,
                            FailureKind::Transport(format!("{}: {e}", qp.what)),
                        ),
                        None => FabricError {
                            channel: qp.channel,
                            direction: Direction::Send,
                            done: 0,
                            total: 0,
                            kind: FailureKind::Transport(format!("{}: {e}", qp.what)),
                        },
                    }
                })?;
                for wc in &wcs[..polled] {
                    progressed = true;
                    let id = wc.wr_id();
                    let index = (id & 0xffff_ffff) as usize;
                    match id >> 32 {
                        WR_SEND if index < IN_FLIGHT => {
                            let owner = match qp.slots[index] {
                                Slot::Busy(owner) => owner,
                                Slot::Free => None,
                            };
                            qp.slots[index] = Slot::Free;
                            if let Some((status, vendor)) = wc.error() {
                                let kind = FailureKind::Completion(format!(
                                    "{} (vendor error {vendor:#x}) on {}",
                                    status_name(status),
                                    qp.what
                                ));
                                return Err(match owner {
                                    Some(t) => failure(step, t, &done, kind),
                                    None => FabricError {
                                        channel: qp.channel,
                                        direction: Direction::Send,
                                        done: 0,
                                        total: 0,
                                        kind,
                                    },
                                });
                            }
                            if let Some(t) = owner {
                                done[t] = true;
                                remaining -= 1;
                            }
                        }
                        WR_RECV if index < RECV_AHEAD => {
                            qp.arrived.push_back(Arrival {
                                frame: index,
                                error: wc.error(),
                                len: wc.len(),
                            });
                            if wc.error().is_none()
                                && let Some(heard) = self.heard.get_mut(qp.channel.peer)
                            {
                                *heard = Some(self.start.elapsed());
                            }
                        }
                        _ => {
                            let kind = FailureKind::Transport(format!(
                                "{}: a work completion with an unknown id {id:#x}",
                                qp.what
                            ));
                            return Err(FabricError {
                                channel: qp.channel,
                                direction: Direction::Recv,
                                done: 0,
                                total: 0,
                                kind,
                            });
                        }
                    }
                }
                // Hand arrived messages to the receives, in order.
                while let (Some(&t), Some(&arrival)) = (recvs[q].front(), qp.arrived.front()) {
                    qp.arrived.pop_front();
                    recvs[q].pop_front();
                    progressed = true;
                    if let Some((status, vendor)) = arrival.error {
                        let kind = FailureKind::Completion(format!(
                            "{} (vendor error {vendor:#x}) on {}",
                            status_name(status),
                            qp.what
                        ));
                        return Err(failure(step, t, &done, kind));
                    }
                    let want = step[t].len();
                    if arrival.len != want {
                        let kind = FailureKind::MessageSize {
                            want,
                            got: arrival.len,
                        };
                        return Err(failure(step, t, &done, kind));
                    }
                    if let Transfer::Recv { landing, .. } = &mut step[t] {
                        landing.deliver(0, &qp.recv[arrival.frame].mem.bytes()[..want]);
                    }
                    qp.post_recv(arrival.frame).map_err(|e| {
                        failure(
                            step,
                            t,
                            &done,
                            FailureKind::Transport(format!(
                                "{}: re-posting a receive: {e}",
                                qp.what
                            )),
                        )
                    })?;
                    done[t] = true;
                    remaining -= 1;
                }
            }
            if remaining == 0 {
                break;
            }
            let now = self.now();
            if now >= deadline {
                let t = most_stuck(step, |i| if done[i] { step[i].len() } else { 0 });
                let waited = now.saturating_sub(started);
                return Err(match t {
                    Some(t) => failure(step, t, &done, FailureKind::TimedOut { waited }),
                    None => FabricError {
                        channel: Channel::new(self.rank, 0),
                        direction: Direction::Recv,
                        done: 0,
                        total: 0,
                        kind: FailureKind::TimedOut { waited },
                    },
                });
            }
            if !progressed {
                std::hint::spin_loop();
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_of_more_than_two_numbers_both_sides_from_zero() {
        // Rank 1 of 4, 2 wires: right is rank 2, left rank 0.
        assert_eq!(ring_channel(1, 4, 2, Side::Right, 1), Channel::new(2, 1));
        assert_eq!(ring_channel(1, 4, 2, Side::Left, 0), Channel::new(0, 0));
        assert_eq!(ring_channel(0, 3, 1, Side::Left, 0), Channel::new(2, 0));
    }

    #[test]
    fn a_ring_of_two_puts_the_left_queue_pairs_after_the_right_ones() {
        assert_eq!(ring_channel(0, 2, 3, Side::Right, 2), Channel::new(1, 2));
        assert_eq!(ring_channel(0, 2, 3, Side::Left, 0), Channel::new(1, 3));
        assert_eq!(ring_channel(1, 2, 3, Side::Left, 2), Channel::new(0, 5));
    }

    #[test]
    fn the_ring_numbering_is_the_wiring_of_a_ring() {
        use crate::fabric::Wiring;
        for (size, wires) in [(2, 1), (2, 3), (3, 2), (5, 4)] {
            let wiring = Wiring::ring(size, wires);
            for rank in 0..size {
                for w in 0..wires {
                    // My right_[w] connects to my right neighbour's left_[w].
                    let mine = ring_channel(rank, size, wires, Side::Right, w);
                    let right = (rank + 1) % size;
                    let theirs = ring_channel(right, size, wires, Side::Left, w);
                    assert_eq!(
                        wiring.far_end(rank, mine),
                        Some((right, theirs.link)),
                        "size {size}, wires {wires}, rank {rank}, wire {w}"
                    );
                }
            }
        }
    }

    #[test]
    fn only_gids_of_the_form_ffff_ipv4_are_ipv4_mapped() {
        let mut gid = [0u8; 16];
        gid[10] = 0xff;
        gid[11] = 0xff;
        gid[12..].copy_from_slice(&[169, 254, 0, 1]);
        assert!(is_ipv4_mapped(&gid));
        let mut link_local = [0u8; 16];
        link_local[0] = 0xfe;
        link_local[1] = 0x80;
        link_local[15] = 1;
        assert!(!is_ipv4_mapped(&link_local));
        let mut half = gid;
        half[11] = 0;
        assert!(!is_ipv4_mapped(&half));
    }

    #[test]
    fn a_peer_gid_is_routed_to_only_when_its_interface_id_is_set() {
        let mut d = Destination {
            local_id: 3,
            queue_pair_number: 0x1234,
            packet_sequence_number: 7,
            global_identifier: [0; 16],
        };
        assert_eq!(
            remote(1, &d).unwrap(),
            Remote {
                lid: 3,
                qpn: 0x1234,
                psn: 7,
                gid: None
            }
        );
        d.global_identifier[15] = 9;
        assert_eq!(remote(1, &d).unwrap().gid, Some(d.global_identifier));
        // A subnet prefix alone does not count (MLX tests the interface id).
        d.global_identifier = [0; 16];
        d.global_identifier[0] = 0xfe;
        assert_eq!(remote(1, &d).unwrap().gid, None);
    }

    #[test]
    fn malformed_peer_details_are_errors_naming_the_peer() {
        let good = Destination {
            local_id: 1,
            queue_pair_number: 2,
            packet_sequence_number: 7,
            global_identifier: [0; 16],
        };
        for (bad, what) in [
            (
                Destination {
                    local_id: -1,
                    ..good
                },
                "LID -1",
            ),
            (
                Destination {
                    local_id: 70_000,
                    ..good
                },
                "LID 70000",
            ),
            (
                Destination {
                    queue_pair_number: -5,
                    ..good
                },
                "queue pair number -5",
            ),
            (
                Destination {
                    queue_pair_number: 1 << 24,
                    ..good
                },
                "queue pair number 16777216",
            ),
            (
                Destination {
                    packet_sequence_number: -7,
                    ..good
                },
                "packet sequence number -7",
            ),
        ] {
            let e = remote(4, &bad).unwrap_err();
            assert!(e.contains("rank 4") && e.contains(what), "{e}");
        }
    }

    #[test]
    fn completion_statuses_are_named() {
        assert!(status_name(ffi::ibv_wc_status::IBV_WC_WR_FLUSH_ERR).contains("WR_FLUSH_ERR"));
        assert!(status_name(ffi::ibv_wc_status::IBV_WC_LOC_LEN_ERR).contains("LOC_LEN_ERR"));
        assert_eq!(status_name(999), "unknown status 999");
    }

    #[test]
    fn steps_the_fabric_cannot_carry_are_refused_with_a_reason() {
        let big = vec![0u8; MAX_FRAME + 1];
        let send = Transfer::Send {
            channel: Channel::new(1, 0),
            data: &big,
        };
        let e = check_transfer(&send, true).unwrap();
        assert!(
            e.contains("524289 bytes") && e.contains("at most 524288"),
            "{e}"
        );
        let e = check_transfer(&send, false).unwrap();
        assert!(e.contains("no RDMA queue pair for rank 1 link 0"), "{e}");

        let fits = vec![0u8; MAX_FRAME];
        let send = Transfer::Send {
            channel: Channel::new(1, 0),
            data: &fits,
        };
        assert_eq!(check_transfer(&send, true), None);

        let mut sink = |_: usize, _: &[u8]| {};
        let recv = Transfer::Recv {
            channel: Channel::new(2, 1),
            landing: Landing::Sink {
                len: 10,
                grain: 4,
                sink: &mut sink,
            },
        };
        let e = check_transfer(&recv, true).unwrap();
        assert!(e.contains("whole number of grains"), "{e}");
    }

    #[test]
    fn frames_are_aligned_to_the_largest_page_size() {
        let region = Region::new(MAX_FRAME).unwrap();
        assert_eq!(region.as_ptr() as usize % FRAME_ALIGN, 0);
        assert_eq!(region.len(), MAX_FRAME);
        assert!(region.bytes().iter().all(|b| *b == 0));
    }

    #[test]
    fn listing_devices_never_panics() {
        // With or without hardware: a list, or an error that says what failed.
        match devices() {
            Ok(names) => assert_eq!(available(), !names.is_empty()),
            Err(e) => {
                assert!(e.to_string().contains("no RDMA device"), "{e}");
                assert!(!available());
            }
        }
    }
}
