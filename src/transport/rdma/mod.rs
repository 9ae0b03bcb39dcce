//! The RDMA transport: MLX's unreliable connected (UC) queue pairs, brought up exactly as MLX
//! does (reference §3.4), behind the crate's [`Fabric`](crate::fabric::Fabric) trait as
//! [message channels](crate::fabric::ChannelKind::Message).
//!
//! - [`verbs`]: the verbs library, loaded at run time (`librdma.dylib` on macOS,
//!   `libibverbs.so.1` on Linux, or `NUVEC_JACCL_VERBS`), with a typed table of exactly the
//!   functions used; [`Unavailable`] says why the fabric cannot run here.
//! - [`queue_pair`]: one queue pair and what it owns; its bring-up and data-path calls.
//! - [`fabric`]: [`RdmaFabric`], the queue pairs of one rank, and its step loop.
//! - [`memory`]: the page-aligned memory of registered frames.
//!
//! The backend (`crate::jaccl::rdma`) decides which queue pairs to open on which device and
//! exchanges their details with the peers over JACCL's side channel.
//!
//! # Bring-up, per queue pair (as MLX)
//!
//! Open the device whose name matches exactly; allocate a protection domain; create a
//! completion queue of 64 entries (no completion channel: completions are busy-polled);
//! create a UC queue pair on it (32 send and 32 receive work requests, 1 SGE each way, no
//! inline data, `sq_sig_all` 0); register the frames (local write, remote read, remote write);
//! move to INIT (port 1, pkey index 0, the same access flags); read the LID of port 1 and the
//! first IPv4-mapped GID of its GID table; advertise packet sequence number 7. After the peers'
//! details are known: RTR (MTU 1024, the remote PSN, the remote QP number, the remote LID,
//! port 1, and when the remote GID's interface id is not zero a global route to it with source
//! GID index 1 — MLX hard-codes 1 — and hop limit 1), the receives posted, RTS (send PSN 7).
//!
//! # Data path
//!
//! Every queue pair owns page-aligned registered frames of [`MAX_FRAME`] bytes (512 KiB,
//! MLX's largest size class, so that any message fits whatever frame size the peers use):
//! [`IN_FLIGHT`] send frames and [`RECV_AHEAD`] receive frames.
//!
//! - A send of n bytes (1 ≤ n ≤ [`MAX_FRAME`]) is staged into a free send frame and posted as
//!   one signaled `IBV_WR_SEND` of exactly those n bytes; at most [`IN_FLIGHT`] sends are in
//!   flight per queue pair (MLX's `NUM_BUFFERS`); it completes with its (local) work
//!   completion. A larger send fails with
//!   [`FailureKind::Invalid`](crate::fabric::FailureKind::Invalid).
//! - The fabric keeps [`RECV_AHEAD`] receives posted on every queue pair from the moment it is
//!   ready to receive, twice MLX's depth of 2, so that a peer that runs ahead of this rank by
//!   one step of two messages still finds a receive. A message that completes a receive waits
//!   in its frame, in arrival order, until a receive transfer takes it; its frame is posted
//!   again once delivered. So a receive takes exactly one message: its completion status must
//!   be success (else `FailureKind::Completion` naming the status) and its length must be the
//!   receive's (else `FailureKind::MessageSize`); the bytes are handed to the landing at once.
//! - **Difference from MLX: messages are numbered.** Each send is an
//!   `IBV_WR_SEND_WITH_IMM` whose immediate data is the queue pair's message count (0, 1, 2 …,
//!   big-endian, wrapping), and a received message that carries one must carry the number
//!   due, else the receive fails with `FailureKind::Lost`: on UC a lost message is otherwise
//!   replaced, without a word, by the next one, and the collective would return wrong data.
//!   The bytes and the message count on the wire are MLX's; MLX's peers post the same receives
//!   and ignore the immediate data, and a message from them carries none, so it is taken
//!   unchecked. A provider that refuses immediate data on the first send (`EINVAL` or
//!   `EOPNOTSUPP`) gets plain SENDs from then on.
//! - Transfers of no bytes complete at once and move nothing (no message).
//! - Completions are busy-polled; the step's deadline is checked against the fabric's
//!   monotonic clock. When it passes, the step fails with `FailureKind::TimedOut` naming the
//!   transfer that made the least progress: on UC a dead peer produces no error completion,
//!   only silence.
//! - Transfers on the same channel and direction run in the order given.
//! - `last_heard` is when a message from the peer last completed a receive.
//!
//! Dropping the fabric destroys, per queue pair, the queue pair, then the completion queue,
//! deregisters the frames, deallocates the protection domain and closes the device, in that
//! order; failures while releasing are ignored (there is nobody to report them to).
//!
//! # Limits
//!
//! Per queue pair: 1 protection domain, 1 completion queue, [`IN_FLIGHT`] + [`RECV_AHEAD`]
//! memory regions, at most 32 work requests posted per queue. Apple's provider is reported to
//! allow 10 queue pairs and 100 memory regions per device and 63 work requests per queue: a
//! mesh of 8 ranks opens 7 queue pairs (one per device) and a ring of 4 wires 2 per device.

mod fabric;
mod memory;
mod queue_pair;
mod verbs;

pub use fabric::RdmaFabric;
pub(crate) use queue_pair::{Local, Qp, Remote};
pub use verbs::{NUVEC_JACCL_VERBS, Unavailable};
pub(crate) use verbs::{check_available, device_names, verbs};

/// The largest frame, and the size of every registered frame: MLX's largest size class,
/// 4096 · 2^7 bytes.
pub const MAX_FRAME: usize = 4096 << 7;

/// Sends in flight per queue pair (MLX's `NUM_BUFFERS`).
pub const IN_FLIGHT: usize = 2;

/// Receives kept posted per queue pair (MLX keeps 2).
pub const RECV_AHEAD: usize = 4;
