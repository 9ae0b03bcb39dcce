//! The C ABI of the verbs library, as far as nuvec-distributed's RDMA fabric uses it: the
//! `repr(C)` structs, the constants and the function types of rdma-core's `infiniband/verbs.h`
//! (Linux's `libibverbs.so.1`), which Apple's `librdma.dylib` (macOS 26.2 and later, the
//! Thunderbolt 5 provider MLX's JACCL uses) is taken to share. No code: no function here calls
//! anything, and nothing links to a library.
//!
//! Two crates speak this ABI, which is why it is a crate of its own: nuvec-distributed's RDMA
//! fabric, which loads the verbs library at run time and calls it through these types, and the
//! software RDMA provider `nuvec-verbs-emu` (`fabric-sim/verbs/`), which exports the same
//! functions so that the fabric runs across processes without RDMA hardware.
//!
//! # What is known and what is assumed
//!
//! - **Linux (rdma-core)**: every struct (its size, alignment and every field's offset and size)
//!   and every constant are checked against rdma-core's own header, through bindgen's output for
//!   it (the `ibverbs-sys` crate's, and for `ibv_wc`, which `ibverbs-sys` declares by hand, and
//!   the compatibility port attributes, the check's own), by the layout test in
//!   `verbs-abi/layout-check/` (run by CI). Structs that hold a `pthread_mutex_t` or
//!   `pthread_cond_t` carry them as opaque words of the target's size.
//! - **macOS (Apple's `verbs.h`)**: Apple's SDK header was not available when this was
//!   written. MLX's JACCL compiles against it with rdma-core's names (`ctx->ops.post_send`,
//!   `wc.status`, `wc.byte_len`, `union ibv_gid`'s `raw` and `global.interface_id`,
//!   `ibv_qp_attr.ah_attr.grh.sgid_index` …) and resolves the same 16 function names with
//!   `dlsym`, so the layout is **assumed** to be rdma-core's for the fields used. Two points are
//!   open until checked against the SDK: the alignment of `union ibv_gid` (8 here, from its two
//!   `__be64` fields; it sets the size of JACCL's `Destination` record, 32 bytes), and the
//!   position of `post_send`, `post_recv` and `poll_cq` in `struct ibv_context_ops` (entries
//!   25, 26 and 11 here). The sizes of `pthread_mutex_t` (64 bytes) and `pthread_cond_t`
//!   (48 bytes) on macOS are Apple's documented ones.
//!
//! # Prefixes
//!
//! The fabric only reads `ibv_context.ops`, `ibv_qp.qp_num`, `ibv_mr.lkey` and the completion
//! fields, and hands every other object back to the library as an opaque pointer:
//! [`ibv_device`], [`ibv_comp_channel`], [`ibv_srq`], [`ibv_ah`] and [`ibv_mw`] are declared
//! without fields.
//!
//! Names are the C names, so that each item can be found in `verbs.h`. The file is long because
//! it is one table of declarations, kept together so that the layout check compares all of
//! them and nothing is declared twice.
#![no_std]
#![allow(non_camel_case_types)]

use core::ffi::{c_char, c_int, c_uint, c_void};

/// Apple's Thunderbolt 5 provider: queue pairs per device at most, across processes (the
/// eleventh `ibv_create_qp` fails with `EBUSY`; measured on macOS 26.5.1, MLX issue #3162 and
/// PR #4209). Not a constant of `verbs.h`: a property of the provider, kept here so that the
/// RDMA fabric's bring-up check and the software provider enforce one number.
pub const APPLE_MAX_QP_PER_DEVICE: usize = 10;

/// Apple's Thunderbolt 5 provider: memory regions per device at most (about 100, MLX issues
/// #3162 and #3205).
pub const APPLE_MAX_MR_PER_DEVICE: usize = 100;

/// Apple's Thunderbolt 5 provider: work requests outstanding per queue of a queue pair at most
/// (63 sends and 63 receives are accepted whatever capacity `ibv_create_qp` reports,
/// measured by hellas-ai/thunderbolt-ibverbs).
pub const APPLE_MAX_WR_PER_QUEUE: u32 = 63;

/// The size in bytes of the verbs library's `pthread_mutex_t` on this target.
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
const MUTEX_BYTES: usize = 40;
/// The size in bytes of the verbs library's `pthread_mutex_t` on this target.
#[cfg(all(target_os = "linux", not(target_arch = "x86_64")))]
const MUTEX_BYTES: usize = 48;
/// The size in bytes of the verbs library's `pthread_mutex_t` on this target.
#[cfg(not(target_os = "linux"))]
const MUTEX_BYTES: usize = 64;

/// The size in bytes of `pthread_cond_t` (48 on Linux and on macOS).
const COND_BYTES: usize = 48;

/// A `pthread_mutex_t` inside a verbs object: its bytes, never touched by Rust code.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct pthread_mutex_t {
    /// The mutex's storage.
    pub opaque: [u64; MUTEX_BYTES / 8],
}

/// A `pthread_cond_t` inside a verbs object: its bytes, never touched by Rust code.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct pthread_cond_t {
    /// The condition variable's storage.
    pub opaque: [u64; COND_BYTES / 8],
}

/// `struct ibv_device`: opaque, only passed back to the library.
#[repr(C)]
#[derive(Debug)]
pub struct ibv_device {
    _opaque: [u8; 0],
}

/// `struct ibv_comp_channel`: opaque (the fabric uses none).
#[repr(C)]
#[derive(Debug)]
pub struct ibv_comp_channel {
    _opaque: [u8; 0],
}

/// `struct ibv_srq`: opaque (the fabric uses none).
#[repr(C)]
#[derive(Debug)]
pub struct ibv_srq {
    _opaque: [u8; 0],
}

/// `struct ibv_ah`: opaque (the fabric uses none).
#[repr(C)]
#[derive(Debug)]
pub struct ibv_ah {
    _opaque: [u8; 0],
}

/// `struct ibv_mw`: opaque (the fabric uses none).
#[repr(C)]
#[derive(Debug)]
pub struct ibv_mw {
    _opaque: [u8; 0],
}

/// The two halves of a GID, big-endian on the wire (`union ibv_gid`'s `global`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ibv_gid_global {
    /// The subnet prefix (`fe80::` for link-local GIDs), big-endian.
    pub subnet_prefix: u64,
    /// The interface id, big-endian.
    pub interface_id: u64,
}

/// `union ibv_gid`: 16 bytes, 8-byte aligned (see the crate docs for Apple's).
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_gid {
    /// The GID's bytes in network order.
    pub raw: [u8; 16],
    /// The same bytes as two big-endian words.
    pub global: ibv_gid_global,
}

impl Default for ibv_gid {
    fn default() -> Self {
        ibv_gid { raw: [0; 16] }
    }
}

impl core::fmt::Debug for ibv_gid {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        // SAFETY: every bit pattern of the union is a valid `[u8; 16]`.
        let raw = unsafe { self.raw };
        f.debug_tuple("ibv_gid").field(&raw).finish()
    }
}

/// `int (*poll_cq)(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc)`.
pub type PollCq =
    unsafe extern "C" fn(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int;

/// `int (*post_send)(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr)`.
pub type PostSend = unsafe extern "C" fn(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int;

/// `int (*post_recv)(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)`.
pub type PostRecv = unsafe extern "C" fn(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int;

/// `struct ibv_context_ops`: 32 function pointers, of which the data path uses three
/// (`verbs.h`'s inline `ibv_poll_cq`, `ibv_post_send` and `ibv_post_recv` call through them).
/// The others are compatibility entries and operations the fabric does not use, kept as
/// opaque pointers so that the three sit at their offsets.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_context_ops {
    /// Entries 0–10: `_compat_query_device` … `_compat_create_cq`.
    pub reserved_0: [*mut c_void; 11],
    /// Entry 11.
    pub poll_cq: Option<PollCq>,
    /// Entries 12–24: `req_notify_cq` … `_compat_destroy_qp`.
    pub reserved_12: [*mut c_void; 13],
    /// Entry 25.
    pub post_send: Option<PostSend>,
    /// Entry 26.
    pub post_recv: Option<PostRecv>,
    /// Entries 27–31: `_compat_create_ah` … `_compat_async_event`.
    pub reserved_27: [*mut c_void; 5],
}

/// `struct ibv_context`: an open device.
#[repr(C)]
#[derive(Debug)]
pub struct ibv_context {
    /// The device it was opened from.
    pub device: *mut ibv_device,
    /// The provider's operations.
    pub ops: ibv_context_ops,
    /// The command file descriptor.
    pub cmd_fd: c_int,
    /// The asynchronous event file descriptor.
    pub async_fd: c_int,
    /// Completion vectors.
    pub num_comp_vectors: c_int,
    /// The library's lock.
    pub mutex: pthread_mutex_t,
    /// The library's compatibility data.
    pub abi_compat: *mut c_void,
}

/// `struct ibv_pd`: a protection domain.
#[repr(C)]
#[derive(Debug)]
pub struct ibv_pd {
    /// The context it belongs to.
    pub context: *mut ibv_context,
    /// The kernel handle.
    pub handle: u32,
}

/// `struct ibv_mr`: a memory region.
#[repr(C)]
#[derive(Debug)]
pub struct ibv_mr {
    /// The context it belongs to.
    pub context: *mut ibv_context,
    /// Its protection domain.
    pub pd: *mut ibv_pd,
    /// The first byte registered.
    pub addr: *mut c_void,
    /// How many bytes are registered.
    pub length: usize,
    /// The kernel handle.
    pub handle: u32,
    /// The key local work requests name it by.
    pub lkey: u32,
    /// The key remote accesses name it by.
    pub rkey: u32,
}

/// `struct ibv_cq`: a completion queue.
#[repr(C)]
#[derive(Debug)]
pub struct ibv_cq {
    /// The context it belongs to.
    pub context: *mut ibv_context,
    /// Its completion channel (none in the fabric).
    pub channel: *mut ibv_comp_channel,
    /// The user's pointer.
    pub cq_context: *mut c_void,
    /// The kernel handle.
    pub handle: u32,
    /// Its number of entries.
    pub cqe: c_int,
    /// The library's lock.
    pub mutex: pthread_mutex_t,
    /// The library's condition variable.
    pub cond: pthread_cond_t,
    /// Completion events acknowledged.
    pub comp_events_completed: u32,
    /// Asynchronous events acknowledged.
    pub async_events_completed: u32,
}

/// `enum ibv_qp_state`.
pub type ibv_qp_state = c_uint;
/// `IBV_QPS_RESET`.
pub const IBV_QPS_RESET: ibv_qp_state = 0;
/// `IBV_QPS_INIT`.
pub const IBV_QPS_INIT: ibv_qp_state = 1;
/// `IBV_QPS_RTR`: ready to receive.
pub const IBV_QPS_RTR: ibv_qp_state = 2;
/// `IBV_QPS_RTS`: ready to send.
pub const IBV_QPS_RTS: ibv_qp_state = 3;
/// `IBV_QPS_SQD`.
pub const IBV_QPS_SQD: ibv_qp_state = 4;
/// `IBV_QPS_SQE`.
pub const IBV_QPS_SQE: ibv_qp_state = 5;
/// `IBV_QPS_ERR`.
pub const IBV_QPS_ERR: ibv_qp_state = 6;

/// `enum ibv_qp_type`.
pub type ibv_qp_type = c_uint;
/// `IBV_QPT_RC`: reliable connected (Apple's provider refuses it).
pub const IBV_QPT_RC: ibv_qp_type = 2;
/// `IBV_QPT_UC`: unreliable connected, what JACCL uses.
pub const IBV_QPT_UC: ibv_qp_type = 3;
/// `IBV_QPT_UD`: unreliable datagram.
pub const IBV_QPT_UD: ibv_qp_type = 4;

/// `struct ibv_qp`: a queue pair.
#[repr(C)]
#[derive(Debug)]
pub struct ibv_qp {
    /// The context it belongs to.
    pub context: *mut ibv_context,
    /// The user's pointer.
    pub qp_context: *mut c_void,
    /// Its protection domain.
    pub pd: *mut ibv_pd,
    /// Its send completion queue.
    pub send_cq: *mut ibv_cq,
    /// Its receive completion queue.
    pub recv_cq: *mut ibv_cq,
    /// Its shared receive queue (none in the fabric).
    pub srq: *mut ibv_srq,
    /// The kernel handle.
    pub handle: u32,
    /// The queue pair number a peer addresses it by (24 bits).
    pub qp_num: u32,
    /// Its state.
    pub state: ibv_qp_state,
    /// Its type.
    pub qp_type: ibv_qp_type,
    /// The library's lock.
    pub mutex: pthread_mutex_t,
    /// The library's condition variable.
    pub cond: pthread_cond_t,
    /// Events acknowledged.
    pub events_completed: u32,
}

/// `struct ibv_qp_cap`: a queue pair's capacities.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ibv_qp_cap {
    /// Send work requests outstanding at most.
    pub max_send_wr: u32,
    /// Receive work requests outstanding at most.
    pub max_recv_wr: u32,
    /// Scatter/gather entries per send at most.
    pub max_send_sge: u32,
    /// Scatter/gather entries per receive at most.
    pub max_recv_sge: u32,
    /// Inline bytes per send at most.
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`: what `ibv_create_qp` creates.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_qp_init_attr {
    /// The user's pointer.
    pub qp_context: *mut c_void,
    /// The send completion queue.
    pub send_cq: *mut ibv_cq,
    /// The receive completion queue.
    pub recv_cq: *mut ibv_cq,
    /// A shared receive queue, or null.
    pub srq: *mut ibv_srq,
    /// The capacities asked for (the library writes back what it gave).
    pub cap: ibv_qp_cap,
    /// The queue pair type.
    pub qp_type: ibv_qp_type,
    /// Whether every send is signaled.
    pub sq_sig_all: c_int,
}

/// `enum ibv_mtu`.
pub type ibv_mtu = c_uint;
/// `IBV_MTU_256`.
pub const IBV_MTU_256: ibv_mtu = 1;
/// `IBV_MTU_512`.
pub const IBV_MTU_512: ibv_mtu = 2;
/// `IBV_MTU_1024`: what JACCL asks for.
pub const IBV_MTU_1024: ibv_mtu = 3;
/// `IBV_MTU_2048`.
pub const IBV_MTU_2048: ibv_mtu = 4;
/// `IBV_MTU_4096`.
pub const IBV_MTU_4096: ibv_mtu = 5;

/// `struct ibv_global_route`: the global routing header of an address.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_global_route {
    /// The destination GID.
    pub dgid: ibv_gid,
    /// The flow label.
    pub flow_label: u32,
    /// The index of the source GID in the port's table.
    pub sgid_index: u8,
    /// The hop limit.
    pub hop_limit: u8,
    /// The traffic class.
    pub traffic_class: u8,
}

/// `struct ibv_ah_attr`: an address vector.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_ah_attr {
    /// The global route, used when `is_global` is 1.
    pub grh: ibv_global_route,
    /// The destination LID.
    pub dlid: u16,
    /// The service level.
    pub sl: u8,
    /// The source path bits.
    pub src_path_bits: u8,
    /// The static rate.
    pub static_rate: u8,
    /// Whether `grh` is used.
    pub is_global: u8,
    /// The local port.
    pub port_num: u8,
}

/// `struct ibv_qp_attr`: what `ibv_modify_qp` changes, as named by the attribute mask.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_qp_attr {
    /// The state to move to ([`IBV_QP_STATE`]).
    pub qp_state: ibv_qp_state,
    /// The current state ([`IBV_QP_CUR_STATE`]).
    pub cur_qp_state: ibv_qp_state,
    /// The path MTU ([`IBV_QP_PATH_MTU`]).
    pub path_mtu: ibv_mtu,
    /// The path migration state.
    pub path_mig_state: c_uint,
    /// The Q_Key (UD only).
    pub qkey: u32,
    /// The receive queue's first PSN ([`IBV_QP_RQ_PSN`]).
    pub rq_psn: u32,
    /// The send queue's first PSN ([`IBV_QP_SQ_PSN`]).
    pub sq_psn: u32,
    /// The peer's queue pair number ([`IBV_QP_DEST_QPN`]).
    pub dest_qp_num: u32,
    /// The remote access flags ([`IBV_QP_ACCESS_FLAGS`]).
    pub qp_access_flags: c_uint,
    /// The capacities ([`IBV_QP_CAP`]).
    pub cap: ibv_qp_cap,
    /// The peer's address ([`IBV_QP_AV`]).
    pub ah_attr: ibv_ah_attr,
    /// The alternate path's address.
    pub alt_ah_attr: ibv_ah_attr,
    /// The partition key index ([`IBV_QP_PKEY_INDEX`]).
    pub pkey_index: u16,
    /// The alternate partition key index.
    pub alt_pkey_index: u16,
    /// Asynchronous notice when the send queue is drained.
    pub en_sqd_async_notify: u8,
    /// Whether the send queue is draining (query only).
    pub sq_draining: u8,
    /// Outstanding RDMA reads and atomics as initiator (RC only).
    pub max_rd_atomic: u8,
    /// Outstanding RDMA reads and atomics as target (RC only).
    pub max_dest_rd_atomic: u8,
    /// The minimum RNR NAK timer (RC only).
    pub min_rnr_timer: u8,
    /// The local port ([`IBV_QP_PORT`]).
    pub port_num: u8,
    /// The local ACK timeout (RC only).
    pub timeout: u8,
    /// The retry count (RC only).
    pub retry_cnt: u8,
    /// The RNR retry count (RC only).
    pub rnr_retry: u8,
    /// The alternate path's port.
    pub alt_port_num: u8,
    /// The alternate path's timeout.
    pub alt_timeout: u8,
    /// The rate limit in kbps.
    pub rate_limit: u32,
}

/// `enum ibv_qp_attr_mask`: which fields of an [`ibv_qp_attr`] a modification sets.
pub type ibv_qp_attr_mask = c_int;
/// `IBV_QP_STATE`.
pub const IBV_QP_STATE: ibv_qp_attr_mask = 1 << 0;
/// `IBV_QP_CUR_STATE`.
pub const IBV_QP_CUR_STATE: ibv_qp_attr_mask = 1 << 1;
/// `IBV_QP_EN_SQD_ASYNC_NOTIFY`.
pub const IBV_QP_EN_SQD_ASYNC_NOTIFY: ibv_qp_attr_mask = 1 << 2;
/// `IBV_QP_ACCESS_FLAGS`.
pub const IBV_QP_ACCESS_FLAGS: ibv_qp_attr_mask = 1 << 3;
/// `IBV_QP_PKEY_INDEX`.
pub const IBV_QP_PKEY_INDEX: ibv_qp_attr_mask = 1 << 4;
/// `IBV_QP_PORT`.
pub const IBV_QP_PORT: ibv_qp_attr_mask = 1 << 5;
/// `IBV_QP_QKEY`.
pub const IBV_QP_QKEY: ibv_qp_attr_mask = 1 << 6;
/// `IBV_QP_AV`.
pub const IBV_QP_AV: ibv_qp_attr_mask = 1 << 7;
/// `IBV_QP_PATH_MTU`.
pub const IBV_QP_PATH_MTU: ibv_qp_attr_mask = 1 << 8;
/// `IBV_QP_TIMEOUT`.
pub const IBV_QP_TIMEOUT: ibv_qp_attr_mask = 1 << 9;
/// `IBV_QP_RETRY_CNT`.
pub const IBV_QP_RETRY_CNT: ibv_qp_attr_mask = 1 << 10;
/// `IBV_QP_RNR_RETRY`.
pub const IBV_QP_RNR_RETRY: ibv_qp_attr_mask = 1 << 11;
/// `IBV_QP_RQ_PSN`.
pub const IBV_QP_RQ_PSN: ibv_qp_attr_mask = 1 << 12;
/// `IBV_QP_MAX_QP_RD_ATOMIC`.
pub const IBV_QP_MAX_QP_RD_ATOMIC: ibv_qp_attr_mask = 1 << 13;
/// `IBV_QP_ALT_PATH`.
pub const IBV_QP_ALT_PATH: ibv_qp_attr_mask = 1 << 14;
/// `IBV_QP_MIN_RNR_TIMER`.
pub const IBV_QP_MIN_RNR_TIMER: ibv_qp_attr_mask = 1 << 15;
/// `IBV_QP_SQ_PSN`.
pub const IBV_QP_SQ_PSN: ibv_qp_attr_mask = 1 << 16;
/// `IBV_QP_MAX_DEST_RD_ATOMIC`.
pub const IBV_QP_MAX_DEST_RD_ATOMIC: ibv_qp_attr_mask = 1 << 17;
/// `IBV_QP_PATH_MIG_STATE`.
pub const IBV_QP_PATH_MIG_STATE: ibv_qp_attr_mask = 1 << 18;
/// `IBV_QP_CAP`.
pub const IBV_QP_CAP: ibv_qp_attr_mask = 1 << 19;
/// `IBV_QP_DEST_QPN`.
pub const IBV_QP_DEST_QPN: ibv_qp_attr_mask = 1 << 20;
/// `IBV_QP_RATE_LIMIT`.
pub const IBV_QP_RATE_LIMIT: ibv_qp_attr_mask = 1 << 25;

/// `enum ibv_access_flags`.
pub type ibv_access_flags = c_int;
/// `IBV_ACCESS_LOCAL_WRITE`.
pub const IBV_ACCESS_LOCAL_WRITE: ibv_access_flags = 1;
/// `IBV_ACCESS_REMOTE_WRITE`.
pub const IBV_ACCESS_REMOTE_WRITE: ibv_access_flags = 1 << 1;
/// `IBV_ACCESS_REMOTE_READ`.
pub const IBV_ACCESS_REMOTE_READ: ibv_access_flags = 1 << 2;
/// `IBV_ACCESS_REMOTE_ATOMIC`.
pub const IBV_ACCESS_REMOTE_ATOMIC: ibv_access_flags = 1 << 3;

/// `struct ibv_sge`: one scatter/gather entry.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ibv_sge {
    /// The first byte's address.
    pub addr: u64,
    /// How many bytes.
    pub length: u32,
    /// The key of the memory region holding them.
    pub lkey: u32,
}

/// `enum ibv_wr_opcode`.
pub type ibv_wr_opcode = c_uint;
/// `IBV_WR_RDMA_WRITE`.
pub const IBV_WR_RDMA_WRITE: ibv_wr_opcode = 0;
/// `IBV_WR_RDMA_WRITE_WITH_IMM`.
pub const IBV_WR_RDMA_WRITE_WITH_IMM: ibv_wr_opcode = 1;
/// `IBV_WR_SEND`: the only operation JACCL posts.
pub const IBV_WR_SEND: ibv_wr_opcode = 2;
/// `IBV_WR_SEND_WITH_IMM`.
pub const IBV_WR_SEND_WITH_IMM: ibv_wr_opcode = 3;
/// `IBV_WR_RDMA_READ`.
pub const IBV_WR_RDMA_READ: ibv_wr_opcode = 4;

/// `enum ibv_send_flags`.
pub type ibv_send_flags = c_uint;
/// `IBV_SEND_FENCE`.
pub const IBV_SEND_FENCE: ibv_send_flags = 1;
/// `IBV_SEND_SIGNALED`: the send produces a work completion.
pub const IBV_SEND_SIGNALED: ibv_send_flags = 1 << 1;
/// `IBV_SEND_SOLICITED`.
pub const IBV_SEND_SOLICITED: ibv_send_flags = 1 << 2;
/// `IBV_SEND_INLINE`.
pub const IBV_SEND_INLINE: ibv_send_flags = 1 << 3;

/// `struct ibv_send_wr`: a send work request. The unions the fabric leaves at zero (the
/// RDMA/atomic/UD addressing, the XRC target, the memory-window bind and TSO header) are
/// declared as words of their size.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_send_wr {
    /// The caller's id, returned in the completion.
    pub wr_id: u64,
    /// The next request of a chain, or null.
    pub next: *mut ibv_send_wr,
    /// The scatter/gather list.
    pub sg_list: *mut ibv_sge,
    /// Its length.
    pub num_sge: c_int,
    /// The operation.
    pub opcode: ibv_wr_opcode,
    /// [`IBV_SEND_SIGNALED`] and others.
    pub send_flags: c_uint,
    /// Immediate data, big-endian (a union with `invalidate_rkey`).
    pub imm_data: u32,
    /// The union `wr` (`rdma`, `atomic`, `ud`): 32 bytes.
    pub wr: [u64; 4],
    /// The union `qp_type` (`xrc.remote_srqn`).
    pub qp_type: u32,
    /// The anonymous union of `bind_mw` and `tso`: 48 bytes.
    pub bind_mw: [u64; 6],
}

/// `struct ibv_recv_wr`: a receive work request.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_recv_wr {
    /// The caller's id, returned in the completion.
    pub wr_id: u64,
    /// The next request of a chain, or null.
    pub next: *mut ibv_recv_wr,
    /// The scatter/gather list.
    pub sg_list: *mut ibv_sge,
    /// Its length.
    pub num_sge: c_int,
}

/// `enum ibv_wc_status`.
pub type ibv_wc_status = c_uint;
/// `IBV_WC_SUCCESS`.
pub const IBV_WC_SUCCESS: ibv_wc_status = 0;
/// `IBV_WC_LOC_LEN_ERR`: a message longer than the posted receive.
pub const IBV_WC_LOC_LEN_ERR: ibv_wc_status = 1;
/// `IBV_WC_LOC_QP_OP_ERR`.
pub const IBV_WC_LOC_QP_OP_ERR: ibv_wc_status = 2;
/// `IBV_WC_LOC_EEC_OP_ERR`.
pub const IBV_WC_LOC_EEC_OP_ERR: ibv_wc_status = 3;
/// `IBV_WC_LOC_PROT_ERR`: an SGE outside its memory region or with the wrong key.
pub const IBV_WC_LOC_PROT_ERR: ibv_wc_status = 4;
/// `IBV_WC_WR_FLUSH_ERR`: flushed because the queue pair is in the error state.
pub const IBV_WC_WR_FLUSH_ERR: ibv_wc_status = 5;
/// `IBV_WC_MW_BIND_ERR`.
pub const IBV_WC_MW_BIND_ERR: ibv_wc_status = 6;
/// `IBV_WC_BAD_RESP_ERR`.
pub const IBV_WC_BAD_RESP_ERR: ibv_wc_status = 7;
/// `IBV_WC_LOC_ACCESS_ERR`.
pub const IBV_WC_LOC_ACCESS_ERR: ibv_wc_status = 8;
/// `IBV_WC_REM_INV_REQ_ERR`.
pub const IBV_WC_REM_INV_REQ_ERR: ibv_wc_status = 9;
/// `IBV_WC_REM_ACCESS_ERR`.
pub const IBV_WC_REM_ACCESS_ERR: ibv_wc_status = 10;
/// `IBV_WC_REM_OP_ERR`.
pub const IBV_WC_REM_OP_ERR: ibv_wc_status = 11;
/// `IBV_WC_RETRY_EXC_ERR`.
pub const IBV_WC_RETRY_EXC_ERR: ibv_wc_status = 12;
/// `IBV_WC_RNR_RETRY_EXC_ERR`.
pub const IBV_WC_RNR_RETRY_EXC_ERR: ibv_wc_status = 13;
/// `IBV_WC_LOC_RDD_VIOL_ERR`.
pub const IBV_WC_LOC_RDD_VIOL_ERR: ibv_wc_status = 14;
/// `IBV_WC_REM_INV_RD_REQ_ERR`.
pub const IBV_WC_REM_INV_RD_REQ_ERR: ibv_wc_status = 15;
/// `IBV_WC_REM_ABORT_ERR`.
pub const IBV_WC_REM_ABORT_ERR: ibv_wc_status = 16;
/// `IBV_WC_INV_EECN_ERR`.
pub const IBV_WC_INV_EECN_ERR: ibv_wc_status = 17;
/// `IBV_WC_INV_EEC_STATE_ERR`.
pub const IBV_WC_INV_EEC_STATE_ERR: ibv_wc_status = 18;
/// `IBV_WC_FATAL_ERR`.
pub const IBV_WC_FATAL_ERR: ibv_wc_status = 19;
/// `IBV_WC_RESP_TIMEOUT_ERR`.
pub const IBV_WC_RESP_TIMEOUT_ERR: ibv_wc_status = 20;
/// `IBV_WC_GENERAL_ERR`.
pub const IBV_WC_GENERAL_ERR: ibv_wc_status = 21;

/// `enum ibv_wc_opcode`.
pub type ibv_wc_opcode = c_uint;
/// `IBV_WC_SEND`.
pub const IBV_WC_SEND: ibv_wc_opcode = 0;
/// `IBV_WC_RECV`.
pub const IBV_WC_RECV: ibv_wc_opcode = 1 << 7;

/// `enum ibv_wc_flags`.
pub type ibv_wc_flags = c_uint;
/// `IBV_WC_GRH`: the received message had a global routing header.
pub const IBV_WC_GRH: ibv_wc_flags = 1;
/// `IBV_WC_WITH_IMM`: the completion carries immediate data.
pub const IBV_WC_WITH_IMM: ibv_wc_flags = 1 << 1;

/// `struct ibv_wc`: a work completion.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ibv_wc {
    /// The work request's id.
    pub wr_id: u64,
    /// How it ended.
    pub status: ibv_wc_status,
    /// What completed.
    pub opcode: ibv_wc_opcode,
    /// The provider's own error code.
    pub vendor_err: u32,
    /// Bytes received (receives only).
    pub byte_len: u32,
    /// Immediate data (a union with `invalidated_rkey`).
    pub imm_data: u32,
    /// The local queue pair's number.
    pub qp_num: u32,
    /// The remote queue pair's number (UD only).
    pub src_qp: u32,
    /// Flags.
    pub wc_flags: c_uint,
    /// The partition key index (GSI only).
    pub pkey_index: u16,
    /// The source LID (UD only).
    pub slid: u16,
    /// The service level (UD only).
    pub sl: u8,
    /// The destination LID path bits (UD only).
    pub dlid_path_bits: u8,
}

/// `enum ibv_port_state`.
pub type ibv_port_state = c_uint;
/// `IBV_PORT_ACTIVE`.
pub const IBV_PORT_ACTIVE: ibv_port_state = 4;

/// `struct ibv_port_attr`. The exported `ibv_query_port` fills the compatibility layout, the
/// fields up to `flags` (48 bytes); the last two fields come only through rdma-core's
/// extended query, which the fabric does not use.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ibv_port_attr {
    /// The port's state.
    pub state: ibv_port_state,
    /// The largest MTU.
    pub max_mtu: ibv_mtu,
    /// The MTU in use.
    pub active_mtu: ibv_mtu,
    /// The length of the GID table.
    pub gid_tbl_len: c_int,
    /// Capability flags.
    pub port_cap_flags: u32,
    /// The largest message.
    pub max_msg_sz: u32,
    /// Bad P_Key counter.
    pub bad_pkey_cntr: u32,
    /// Q_Key violation counter.
    pub qkey_viol_cntr: u32,
    /// The length of the P_Key table.
    pub pkey_tbl_len: u16,
    /// The port's LID.
    pub lid: u16,
    /// The subnet manager's LID.
    pub sm_lid: u16,
    /// The LID mask control.
    pub lmc: u8,
    /// Virtual lanes.
    pub max_vl_num: u8,
    /// The subnet manager's service level.
    pub sm_sl: u8,
    /// The subnet timeout.
    pub subnet_timeout: u8,
    /// Init type reply.
    pub init_type_reply: u8,
    /// The active link width.
    pub active_width: u8,
    /// The active link speed.
    pub active_speed: u8,
    /// The physical state.
    pub phys_state: u8,
    /// The link layer (InfiniBand, Ethernet).
    pub link_layer: u8,
    /// Flags.
    pub flags: u8,
    /// More capability flags (extended query only).
    pub port_cap_flags2: u16,
    /// The extended active speed (extended query only).
    pub active_speed_ex: u32,
}

/// The size in bytes of the compatibility layout of [`ibv_port_attr`] that the exported
/// `ibv_query_port` fills: every field up to and including `flags`.
pub const COMPAT_PORT_ATTR_BYTES: usize = 48;

/// `struct ibv_device_attr`: what `ibv_query_device` says of a device. The RDMA fabric reads
/// `max_qp`, `max_qp_wr` and `max_mr` to budget a configuration against the device's own
/// limits (MLX does not query them: Apple's provider reports 11 queue pairs on some Macs and 3
/// behind a hub, ml-explore/mlx#3205).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ibv_device_attr {
    /// The firmware version, a NUL-terminated string.
    pub fw_ver: [c_char; 64],
    /// The node GUID (big-endian).
    pub node_guid: u64,
    /// The system image GUID (big-endian).
    pub sys_image_guid: u64,
    /// The largest memory region.
    pub max_mr_size: u64,
    /// The page sizes supported.
    pub page_size_cap: u64,
    /// The vendor id.
    pub vendor_id: u32,
    /// The vendor's part id.
    pub vendor_part_id: u32,
    /// The hardware version.
    pub hw_ver: u32,
    /// Queue pairs at most.
    pub max_qp: c_int,
    /// Work requests per queue of a queue pair at most.
    pub max_qp_wr: c_int,
    /// Capability flags.
    pub device_cap_flags: c_uint,
    /// Scatter/gather entries per work request at most.
    pub max_sge: c_int,
    /// Scatter/gather entries per RDMA read at most.
    pub max_sge_rd: c_int,
    /// Completion queues at most.
    pub max_cq: c_int,
    /// Entries per completion queue at most.
    pub max_cqe: c_int,
    /// Memory regions at most.
    pub max_mr: c_int,
    /// Protection domains at most.
    pub max_pd: c_int,
    /// The remaining limits, from `max_qp_rd_atom` to `max_srq_sge` (20 `int`s), which the
    /// fabric does not read.
    pub other_limits: [c_int; 20],
    /// P_Keys at most.
    pub max_pkeys: u16,
    /// The local CA ACK delay.
    pub local_ca_ack_delay: u8,
    /// The number of physical ports.
    pub phys_port_cnt: u8,
}

impl Default for ibv_device_attr {
    fn default() -> Self {
        // SAFETY: every field is an integer or an array of them: all-zero bytes are valid.
        unsafe { core::mem::zeroed() }
    }
}

/// Implements `Default` as all-zero bytes for verbs structs with pointer fields.
macro_rules! zeroed_default {
    ($($t:ty),* $(,)?) => {$(
        impl Default for $t {
            fn default() -> Self {
                // SAFETY: every field of the struct is an integer, an array of them, a raw
                // pointer or an `Option` of a function pointer, for which all-zero bytes are a
                // valid value (0, null, `None`).
                unsafe { core::mem::zeroed() }
            }
        }
    )*};
}

zeroed_default!(
    ibv_context_ops,
    ibv_context,
    ibv_pd,
    ibv_mr,
    ibv_cq,
    ibv_qp,
    ibv_qp_init_attr,
    ibv_send_wr,
    ibv_recv_wr,
);

/// `struct ibv_device **ibv_get_device_list(int *num_devices)`.
pub type GetDeviceList = unsafe extern "C" fn(num_devices: *mut c_int) -> *mut *mut ibv_device;
/// `void ibv_free_device_list(struct ibv_device **list)`.
pub type FreeDeviceList = unsafe extern "C" fn(list: *mut *mut ibv_device);
/// `const char *ibv_get_device_name(struct ibv_device *device)`.
pub type GetDeviceName = unsafe extern "C" fn(device: *mut ibv_device) -> *const c_char;
/// `struct ibv_context *ibv_open_device(struct ibv_device *device)`.
pub type OpenDevice = unsafe extern "C" fn(device: *mut ibv_device) -> *mut ibv_context;
/// `int ibv_close_device(struct ibv_context *context)`.
pub type CloseDevice = unsafe extern "C" fn(context: *mut ibv_context) -> c_int;
/// `struct ibv_pd *ibv_alloc_pd(struct ibv_context *context)`.
pub type AllocPd = unsafe extern "C" fn(context: *mut ibv_context) -> *mut ibv_pd;
/// `int ibv_dealloc_pd(struct ibv_pd *pd)`.
pub type DeallocPd = unsafe extern "C" fn(pd: *mut ibv_pd) -> c_int;
/// `struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr)`.
pub type CreateQp =
    unsafe extern "C" fn(pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> *mut ibv_qp;
/// `int ibv_destroy_qp(struct ibv_qp *qp)`.
pub type DestroyQp = unsafe extern "C" fn(qp: *mut ibv_qp) -> c_int;
/// `struct ibv_cq *ibv_create_cq(struct ibv_context *context, int cqe, void *cq_context,
/// struct ibv_comp_channel *channel, int comp_vector)`.
pub type CreateCq = unsafe extern "C" fn(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq;
/// `int ibv_destroy_cq(struct ibv_cq *cq)`.
pub type DestroyCq = unsafe extern "C" fn(cq: *mut ibv_cq) -> c_int;
/// `int ibv_query_device(struct ibv_context *context, struct ibv_device_attr
/// *device_attr)`: not among MLX's 16 [`SYMBOLS`]; the fabric resolves it when the library
/// has it ([`QUERY_DEVICE`]).
pub type QueryDevice =
    unsafe extern "C" fn(context: *mut ibv_context, device_attr: *mut ibv_device_attr) -> c_int;
/// `int ibv_query_port(struct ibv_context *context, uint8_t port_num, struct
/// _compat_ibv_port_attr *port_attr)` (the exported symbol; see [`COMPAT_PORT_ATTR_BYTES`]).
pub type QueryPort = unsafe extern "C" fn(
    context: *mut ibv_context,
    port_num: u8,
    attr: *mut ibv_port_attr,
) -> c_int;
/// `int ibv_query_gid(struct ibv_context *context, uint8_t port_num, int index, union ibv_gid
/// *gid)`.
pub type QueryGid = unsafe extern "C" fn(
    context: *mut ibv_context,
    port_num: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int;
/// `int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask)`.
pub type ModifyQp =
    unsafe extern "C" fn(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, attr_mask: c_int) -> c_int;
/// `struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)`.
pub type RegMr = unsafe extern "C" fn(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut ibv_mr;
/// `int ibv_dereg_mr(struct ibv_mr *mr)`.
pub type DeregMr = unsafe extern "C" fn(mr: *mut ibv_mr) -> c_int;

/// The 16 functions MLX's JACCL resolves with `dlsym` (its `is_available` is true when all
/// do), in MLX's order. The data path's `ibv_post_send`, `ibv_post_recv` and `ibv_poll_cq` are
/// inline functions of `verbs.h` that call through [`ibv_context_ops`]: they are not symbols.
pub const SYMBOLS: [&str; 16] = [
    "ibv_get_device_list",
    "ibv_get_device_name",
    "ibv_open_device",
    "ibv_free_device_list",
    "ibv_close_device",
    "ibv_alloc_pd",
    "ibv_create_qp",
    "ibv_create_cq",
    "ibv_destroy_cq",
    "ibv_destroy_qp",
    "ibv_dealloc_pd",
    "ibv_query_port",
    "ibv_query_gid",
    "ibv_modify_qp",
    "ibv_reg_mr",
    "ibv_dereg_mr",
];

/// The symbol of [`QueryDevice`]: optional, a library without it leaves the fabric on Apple's
/// reported limits ([`APPLE_MAX_QP_PER_DEVICE`] …).
pub const QUERY_DEVICE: &str = "ibv_query_device";

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{align_of, offset_of, size_of};

    #[test]
    fn the_data_path_entries_sit_where_verbs_h_puts_them() {
        let word = size_of::<*mut c_void>();
        assert_eq!(offset_of!(ibv_context_ops, poll_cq), 11 * word);
        assert_eq!(offset_of!(ibv_context_ops, post_send), 25 * word);
        assert_eq!(offset_of!(ibv_context_ops, post_recv), 26 * word);
        assert_eq!(size_of::<ibv_context_ops>(), 32 * word);
        assert_eq!(offset_of!(ibv_context, ops), word);
    }

    #[test]
    fn a_gid_is_sixteen_bytes_aligned_to_eight() {
        assert_eq!(size_of::<ibv_gid>(), 16);
        assert_eq!(align_of::<ibv_gid>(), 8);
    }

    #[test]
    fn work_requests_and_completions_have_rdma_cores_sizes() {
        assert_eq!(size_of::<ibv_sge>(), 16);
        assert_eq!(size_of::<ibv_recv_wr>(), 32);
        assert_eq!(size_of::<ibv_send_wr>(), 128);
        assert_eq!(offset_of!(ibv_send_wr, wr), 40);
        assert_eq!(size_of::<ibv_wc>(), 48);
        assert_eq!(size_of::<ibv_qp_attr>(), 144);
        assert_eq!(offset_of!(ibv_qp_attr, ah_attr), 56);
        assert_eq!(offset_of!(ibv_qp_attr, pkey_index), 120);
        assert_eq!(size_of::<ibv_qp_init_attr>(), 64);
        assert_eq!(size_of::<ibv_port_attr>(), 56);
        assert_eq!(offset_of!(ibv_port_attr, lid), 34);
        assert_eq!(offset_of!(ibv_qp, qp_num), 52);
    }

    #[test]
    fn device_attributes_have_rdma_cores_layout() {
        assert_eq!(size_of::<ibv_device_attr>(), 232);
        assert_eq!(offset_of!(ibv_device_attr, max_qp), 108);
        assert_eq!(offset_of!(ibv_device_attr, max_qp_wr), 112);
        assert_eq!(offset_of!(ibv_device_attr, max_mr), 136);
        assert_eq!(offset_of!(ibv_device_attr, max_pkeys), 224);
        assert_eq!(offset_of!(ibv_device_attr, phys_port_cnt), 227);
    }
}
