//! The RDMA transport: MLX's unreliable connected (UC) queue pairs, brought up exactly as MLX
//! does (reference §3.4), behind the crate's [`Fabric`](crate::fabric::Fabric) trait as
//! [message channels](crate::fabric::ChannelKind::Message).
//!
//! - [`verbs`]: the verbs library, loaded at run time (`librdma.dylib` on macOS,
//!   `libibverbs.so.1` on Linux, or `NUVEC_JACCL_VERBS`), with a typed table of exactly the
//!   functions used; [`Unavailable`] says why the fabric cannot run here.
//! - [`queue_pair`]: one queue pair and what it owns; its bring-up and data-path calls.
//! - [`queue`]: a queue pair's bookkeeping during a step, without a verbs call (which frame
//!   carries which transfer, which message goes to which receive, what a completion means).
//! - [`fabric`]: [`RdmaFabric`], the queue pairs of one rank, and its step loop.
//! - [`memory`]: the page-aligned memory of registered frames.
//! - [`limits`]: what a device allows (`ibv_query_device`), Apple's reported limits when it
//!   cannot be asked.
//!
//! The backend (`crate::jaccl::rdma`) decides which queue pairs to open on which device and
//! exchanges their details with the peers over JACCL's side channel.
//!
//! The bring-up and the data path are stated on [`RdmaFabric`], where users of
//! `jaccl::rdma` see them.
//!
//! # Limits
//!
//! Per queue pair: 1 protection domain, 1 completion queue, [`IN_FLIGHT`] + [`RECV_AHEAD`]
//! memory regions, a capacity of [`WORK_REQUESTS`] per queue. `jaccl::rdma::connect` asks
//! each device it will open for its limits (`ibv_query_device`: users report 11 queue pairs
//! on some Macs and 3 behind a hub), falling back to Apple's reported 10 queue pairs and 100
//! memory regions per device and 63 work requests per queue (`nuvec_verbs_abi::APPLE_MAX_*`),
//! counts what a configuration needs of each device and refuses one that would pass a limit
//! before any queue pair exists.

mod fabric;
mod limits;
mod memory;
mod queue;
mod queue_pair;
mod verbs;

pub use fabric::RdmaFabric;
pub(crate) use limits::of_device as device_limits;
pub use limits::{DeviceLimits, LimitSource};
pub use queue_pair::leaked_regions;
pub(crate) use queue_pair::{Local, Qp, Remote};
pub use verbs::{NUVEC_JACCL_VERBS, Unavailable, load_library};
pub(crate) use verbs::{check_available, device_names, verbs};

/// The largest frame, and the size of every registered frame: MLX's largest size class,
/// 4096 · 2^7 bytes.
pub const MAX_FRAME: usize = 4096 << 7;

/// Sends in flight per queue pair (MLX's `NUM_BUFFERS`).
pub const IN_FLIGHT: usize = 2;

/// Receives kept posted per queue pair (MLX keeps 2).
pub const RECV_AHEAD: usize = 4;

/// The capacity asked of each queue of a queue pair, sends and receives (MLX's `MAX_SEND_WR`,
/// `MAX_RECV_WR`); at most [`IN_FLIGHT`] sends and [`RECV_AHEAD`] receives are ever posted.
pub(crate) const WORK_REQUESTS: u32 = 32;

/// The memory regions each queue pair registers: one per frame.
pub(crate) const REGIONS_PER_QUEUE_PAIR: usize = IN_FLIGHT + RECV_AHEAD;
