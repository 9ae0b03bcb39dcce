//! MLX's JACCL backend: collectives over RDMA on Thunderbolt 5 (macOS 26.2 and later).
//! **Incomplete**: this module has the configuration and the side channel; the RDMA fabric and
//! the algorithms are still to come (see [What remains](#what-remains)).
//!
//! # JACCL
//!
//! JACCL is MLX's backend for Macs cabled together with Thunderbolt 5 and RDMA enabled
//! (`rdma_ctl enable` in recoveryOS, once per Mac). Each Thunderbolt port is an RDMA device
//! (`rdma_en3`, …); JACCL opens Unreliable Connected (UC) queue pairs on them and moves data
//! with two-sided SEND/RECV only, in fixed-size frames, with no acknowledgement and no
//! retransmission. The ranks are cabled either as a **mesh** (every pair, at most
//! [`MESH_MAX_PEERS`] ranks) or as a **ring** (each rank to its two neighbours, with up to
//! [`RING_MAX_CONNS`] cables per direction); the device file says which device reaches which
//! rank ([`parse_devices`], [`Config`]), and [`Config::topology`] picks the topology as MLX does.
//!
//! `mlx.launch --backend jaccl` (or `jaccl-ring`) starts one process per Mac and writes the
//! environment that [`Config::from_env`] reads: `MLX_RANK`, `MLX_IBV_DEVICES` (the path of the
//! device file), `MLX_JACCL_COORDINATOR` (`ip:port` of rank 0) and, for `jaccl-ring`,
//! `MLX_JACCL_RING`. Before any RDMA resource is used, the ranks exchange their queue pairs'
//! details over a TCP star through rank 0, the [`SideChannel`].
//!
//! # Version
//!
//! The wire protocol of JACCL has changed several times. This module follows MLX 0.32.x (the
//! sources at commit `846d176`, `mlx==0.32.4`), with the ring `all_gather` as fixed upstream in
//! MLX PR #4443 (the two directions carry the two halves of every rank's block). Peers must run
//! that version and the same macOS frame-size rule (large frames on macOS 26.3 and later).
//!
//! # What is here
//!
//! - [`config`]: the device file, the environment, MLX's validity rules for a mesh and
//!   a ring, the topology choice and its limits. Pure logic.
//! - [`side_channel`]: MLX's TCP side channel byte for byte (the rank hello, the
//!   star all-gather, the typed all-gathers, the barrier, the 32-byte [`Destination`] records and
//!   the mesh and ring exchanges in MLX's order), with every wait bounded.
//! - `rdma` (cargo feature `jaccl` only): the RDMA fabric over MLX's UC queue pairs, with
//!   `devices()` and `available()`; its docs say what is verified (not the hardware path yet).
//!
//! Both build without the `jaccl` cargo feature, which will gate only the real RDMA fabric.
//!
//! # What remains
//!
//! Nothing here moves tensor data yet. Still to be written:
//!
//! - **The RDMA fabric** (feature `jaccl`, macOS): `dlopen` of `librdma.dylib` and its 16
//!   `ibv_*` symbols; per connection a device, a protection domain, a completion queue of 64
//!   entries and a UC queue pair (32 send and 32 receive work requests, 1 SGE), taken through
//!   INIT, the side-channel exchange, RTR (MTU 1024, PSN 7, port 1, GID index 1 when the remote
//!   GID is set) and RTS, then the side-channel [`barrier`](SideChannel::barrier) — in MLX's
//!   order (reference §3.4). The local [`Destination`] needs the port's LID and its first
//!   IPv4-mapped GID.
//! - **Frames**: page-aligned registered buffers of 4 KiB · 2^k (k = 0..7), two per size class,
//!   with MLX's frame-size rule (the largest frame not above the message, only on macOS 26.3
//!   and later; 4 KiB otherwise).
//! - **UC message channels**: every message exactly one frame long whatever its payload, the
//!   same number of messages per queue pair as MLX, receives posted ahead as MLX does (2 per
//!   queue pair), completions polled with a deadline and their status checked.
//! - **The algorithms**: the mesh's `all_reduce` (rank-ordered fold; reduce-scatter plus
//!   all-gather plus tail above 32 KiB with more than 2 ranks), `sum_scatter`, `all_gather`,
//!   `send`/`recv`; the ring's `all_reduce` (one or two directions over one or all wires),
//!   `reduce_scatter`, `all_gather` (as fixed by #4443) and neighbour `send`/`recv`.
//! - **The group**: a `Communicator` over the chosen topology, `init` and
//!   `is_available` wiring, an emulated fabric to test the algorithms without hardware.

pub mod comm;
pub mod config;
pub mod frames;
pub mod mesh;
#[cfg(feature = "jaccl")]
pub mod rdma;
pub mod ring;
pub mod side_channel;
pub mod tcp;
mod wire;

pub use comm::{JacclCommunicator, Layout};
pub use config::{Config, MESH_MAX_PEERS, RING_MAX_CONNS, Topology, parse_devices};
pub use frames::FrameRule;
#[cfg(feature = "jaccl")]
pub use rdma::devices;
pub use side_channel::{Destination, RingDestinations, SideChannel};
pub use wire::Scratch;
