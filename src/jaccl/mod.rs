//! MLX's JACCL backend: collectives over RDMA on Thunderbolt 5 (macOS 26.2 and later) and
//! verbs devices; **experimental**. Its algorithms are verified in simulation and across
//! processes over TCP; the RDMA fabric builds and finds devices, but has not run on Thunderbolt
//! hardware (see [What is verified](#what-is-verified)).
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
//! details over a TCP star through rank 0, the [`SideChannel`]. `nuvec_distributed::init`
//! (or `init_backend(_, Backend::Jaccl)`) does all of that and returns the group;
//! `NUVEC_JACCL_FABRIC=tcp` runs the same job over TCP connections instead of queue pairs
//! ([`tcp`]), and `NUVEC_JACCL_FRAMES=large` selects macOS 26.3's large frames.
//!
//! # Version
//!
//! The wire protocol of JACCL has changed several times. This module follows MLX 0.32.x (the
//! sources at commit `846d176`, `mlx==0.32.4`), with the ring `all_gather` as fixed upstream in
//! MLX PR #4443 (the two directions carry the two halves of every rank's block). Peers must run
//! that version and the same frame rule ([`FrameRule`]: large frames on macOS 26.3 and later).
//!
//! # The pieces
//!
//! - [`config`]: the device file, the environment, MLX's validity rules for a mesh and a ring,
//!   the topology choice and its limits. Pure logic.
//! - [`side_channel`]: MLX's TCP side channel byte for byte, every wait bounded.
//! - [`frames`]: frame sizes, message counts and the ring's slices, as pure arithmetic.
//! - [`mesh`] and [`ring`]: the algorithms, written once over
//!   [`Fabric`](crate::fabric::Fabric): the mesh's all-reduce (a rank-order fold; reduce-scatter,
//!   all-gather and tail above 32 KiB with more than 2 ranks), sum-scatter, all-gather and
//!   send/recv to any peer; the ring's all-reduce (one direction of one wire below MLX's
//!   thresholds, else two directions of every wire), all-gather and neighbour send/recv. Every
//!   message is a whole frame, as many per queue pair as MLX sends.
//! - [`comm`]: [`JacclCommunicator`], the `nuvec_core` communicator over any fabric: checked
//!   arguments, a deadline per operation, errors naming the peer, a sticky failure.
//! - [`tcp`]: the cables as TCP connections, for tests and trials without RDMA.
//! - `rdma` (cargo feature `jaccl` only): the RDMA fabric over MLX's UC queue pairs (the
//!   verbs library loaded at run time), with `connect`, `devices()`, `available()` and
//!   `unavailable()`.
//!
//! Everything but `rdma` builds without the `jaccl` feature.
//!
//! # Differences from MLX
//!
//! - **Deadlines.** MLX's JACCL waits forever for a completion: a rank whose peer died spins
//!   (MLX issues #3910, #4278). Here every operation fails by its deadline with an error naming
//!   the peer it was waiting for.
//! - **Deterministic sum-scatter.** MLX reduces the shards of its `sum_scatter` (and of the large
//!   mesh all-reduce) in the order messages complete, so float sums vary from run to run; here
//!   they fold in rank order, one of MLX's possible results, the same on every run and rank.
//! - **Not implemented**: the ring's `reduce_scatter` (MLX's JACCL ring `sum_scatter`).
//!
//! # What is verified
//!
//! - In simulation (`tests/sim_jaccl.rs`, over the simulator's UC message channels): results
//!   bit-identical on every rank and equal to an independent model's fold, for every dtype and
//!   op, 2 to 8 ranks, 1 to 4 wires, both frame rules and sizes around every threshold; the
//!   exact list of messages on every queue pair; and under lost messages, error completions,
//!   dead or stalled peers and UC's drop rule, every rank fails naming a peer by its deadline
//!   and none returns wrong data. That last guarantee rests on numbered messages: the
//!   simulator numbers them, and the RDMA fabric sends each with its number as immediate data
//!   (a difference from MLX, whose lost frame lets the next one take its place unnoticed).
//! - Across processes over TCP (`tests/jaccl_processes.rs`): meshes of 2 to 4 ranks and rings
//!   of 2 to 4 ranks with 1 or 2 wires, through `nuvec_distributed::init` and
//!   `nuvec_core::distributed`, every dtype against the model, and a lost peer.
//! - Across processes over the RDMA fabric (feature `jaccl`) driving the software RDMA
//!   provider of `fabric-sim/verbs/`: the same jobs, bit-identical to TCP, and lost messages,
//!   error completions, silent deaths and strict UC drops ending in errors naming a peer
//!   (`tests/jaccl_processes.rs`, `tests/jaccl_rdma.rs`, `tests/launch.rs`).
//! - **Not verified**: the RDMA fabric on Thunderbolt hardware, interoperation with MLX's C++
//!   JACCL, and the layout of Apple's `ibv_gid` in [`Destination`].

pub mod comm;
pub mod config;
pub(crate) mod env;
pub mod frames;
pub mod mesh;
#[cfg(feature = "jaccl")]
pub mod rdma;
pub mod ring;
pub mod side_channel;
pub(crate) mod split;
pub use split::check_cables;
#[cfg(feature = "jaccl")]
pub(crate) mod split_rdma;
pub mod tcp;
mod wire;

pub use comm::{JacclCommunicator, Layout};
pub use config::{Config, MESH_MAX_PEERS, RING_MAX_CONNS, Topology, parse_devices};
pub use env::JacclFabric;
pub use frames::FrameRule;
#[cfg(feature = "jaccl")]
pub use rdma::devices;
pub use side_channel::{Destination, RingDestinations, SideChannel};
pub use wire::Scratch;
