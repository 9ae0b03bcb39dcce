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
//! The wire protocol of JACCL has changed several times. This module follows MLX 0.32.4
//! (`mlx==0.32.4`): the sources at commit `846d176` (0.32.2-dev) for everything 0.32.4 did not
//! change, and 0.32.4's own JACCL headers (`mlx/include/mlx/distributed/jaccl/lib/jaccl/` in the
//! wheel) and its `mesh.cpp` for what it did. Peers must run that version and the same frame rule
//! ([`FrameRule`]: large frames on macOS 26.3 and later). What was compared, header by header,
//! between `846d176` and 0.32.4, and which one each part follows:
//!
//! | part | 846d176 → 0.32.4 | followed |
//! | --- | --- | --- |
//! | `rdma.h`: frames (`FRAME_SIZE`, 8 size classes, `NUM_BUFFERS` 2, the macOS 26.3 rule), work requests, `Destination`, the side channel's `all_gather`, `barrier` | unchanged | both ([`frames`], [`side_channel`]) |
//! | `tcp.h` (the side channel's sockets), `types.h`, `group.h`, `reduction_ops.h` | unchanged | both |
//! | `ring.h`; `ring_impl.h`'s all-reduce, sum-scatter, send/recv | unchanged but for `dispatch_wires` moving to `threadpool.h` (no byte changes) | both ([`ring`]) |
//! | `ring_impl.h`'s all-gather | fixed (MLX PR #4443): direction 1 carries the second half of every block, the pass limit is n·R | 0.32.4 |
//! | `mesh.h`, `mesh.cpp`: one `MeshImpl` over one queue pair per peer | several wires: `n_wires_` `MeshImpl`s, one per wire, each over its own queue pairs and buffers; `split_wires`; a thread pool runs the wires at once (`dispatch_wires`) | 0.32.4 ([`mesh`]) |
//! | `mesh_impl.h`: `all_gather(in, out, n)`, `sum_scatter(in, out, count)` | a stride argument each (`MESH_MULTI_WIRE_MIN_BYTES` = 512 KiB added) | 0.32.4 |
//! | the mesh all-reduce's choice (R > 2 and above 32 KiB: scatter-gather) | made on the whole operation, then per wire on its range | 0.32.4 (the same with one wire) |
//! | `jaccl.h`: `get_mesh_connectivity` → one device per peer | one list of devices per wire | 0.32.4 ([`Config::mesh_wire_devices`]) |
//! | the mesh's bring-up: one all-gather of R `Destination`s | every queue pair of every wire to INIT, then one all-gather of W·R, wire-major | 0.32.4 ([`SideChannel::exchange_mesh`]) |
//! | `mlx.distributed_config`: one device per mesh entry | a list of one device per cable when every pair has two or more; `mlx.launch`: the #4284 host-file checks | 0.32.4 (`nuvec-launch` passes both forms on) |
//!
//! ## The multi-wire mesh
//!
//! When the device file lists, for a pair of ranks, several devices (one per cable), the mesh
//! has W wires, W the least number of devices of an entry over all pairs (the first W devices
//! of every entry are used, the w-th on both ends being one cable): [`Topology::Mesh`]'s
//! `wires`. Each rank opens one queue pair per wire per peer, the channel `(peer, link w)`;
//! over TCP one connection per cable. The operations of at least 512 KiB are cut into W
//! contiguous ranges of `⌈total/W⌉` (elements for the reductions, bytes for the all-gather and
//! send/recv; the last range takes the remainder), and each wire runs the one-wire algorithm
//! on its range ([`mesh`] says how that maps onto fabric steps); below 512 KiB wire 0 carries
//! the whole operation. The threshold is compared with the all-reduce's buffer, the
//! all-gather's per-rank block, the sum-scatter's output shard and the message of a send.
//! With one cable per pair the bytes are those of `846d176`.
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
//!   send/recv to any peer, each cut across the mesh's wires from 512 KiB on; the ring's all-reduce (one direction of one wire below MLX's
//!   thresholds, else two directions of every wire), sum-scatter, all-gather and neighbour send/recv. Every
//!   message is a whole frame, as many per queue pair as MLX sends.
//! - [`comm`]: [`JacclCommunicator`], the `nuvec_core` communicator over any fabric: checked
//!   arguments, a deadline per operation, errors naming the peer, a sticky failure.
//! - [`tcp`]: the cables as TCP connections, for tests and trials without RDMA.
//! - `rdma` (cargo feature `jaccl` only): the RDMA fabric over MLX's UC queue pairs (the
//!   verbs library loaded at run time), with `connect`, `devices()`, `available()` and
//!   `unavailable()`; `budget` (same feature): what a topology asks of each device against
//!   the limits the device reports (`ibv_query_device`), or Apple's reported ones (10 queue
//!   pairs, 100 memory regions, 63 work requests per queue) when it cannot be asked, checked
//!   before any queue pair is created.
//!
//! Everything but `rdma` builds without the `jaccl` feature.
//!
//! # Differences from MLX
//!
//! - **Deadlines and dead peers.** MLX's JACCL waits forever for a completion: a rank whose
//!   peer died spins (MLX issues #3910, #4278). Here every operation fails by its deadline with
//!   an error naming the peer it was waiting for, and sooner when a peer dies: the side
//!   channel's connections stay open for the group's life, and a waiting operation looks at
//!   them (without sending anything) at most every 250 ms once it has heard nothing for
//!   100 ms; rank 0 watches every rank and the others watch rank 0, and a rank whose group
//!   fails closes its connections, so a death reaches every rank in two hops, in well under a
//!   second ([`side_channel::protocol::liveness`]). A stopped rank keeps its connections and
//!   is failed at the deadline. `JACCL_PROGRESS_TIMEOUT_S` (or `MLX_JACCL_PROGRESS_TIMEOUT_S`,
//!   as MLX's PR #4530 names it) bounds every wait without progress too.
//! - **Deterministic sum-scatter.** MLX reduces the shards of its `sum_scatter` (and of the large
//!   mesh all-reduce) into the rank's own shard in the order messages complete, so float sums
//!   vary from run to run; here the peers' shards follow the own one in rank order, one of
//!   MLX's possible results (checked against MLX 0.32.4's own `mesh_impl.h`:
//!   `tests/processes/jaccl_mlx.rs`), the same on every run and rank.
//! - **Wires in step.** MLX 0.32.4 runs each wire of a multi-wire mesh on a thread of its own
//!   (`dispatch_wires`), so one wire may be a phase ahead of another; here the wires of an
//!   operation advance phase by phase together (one fabric step per phase). What each queue
//!   pair carries, and in which order, is MLX's; only when a wire posts its next phase's
//!   receives can differ, which matters, as between MLX's own ranks, only to UC's drop rule.
//! - **Both-NaN sums.** When both operands of a float addition are NaN, which NaN MLX's loop
//!   returns depends on how its compiler laid the loop out; here it is always the received
//!   one ([`reduce`](crate::reduce)'s docs). The mixed jobs allow exactly that (an element NaN
//!   on both sides, where two or more of its inputs are NaN or infinite), and give MLX's code
//!   only 0/1 booleans (another byte in a C++ `bool` is undefined behaviour).
//!
//! # What is verified
//!
//! - In simulation (`tests/sim/jaccl.rs`, over the simulator's UC message channels): results
//!   bit-identical on every rank and equal to an independent model's fold, for every dtype and
//!   op, 2 to 8 ranks, 1 to 4 ring wires and 1 to 3 mesh wires (`tests/sim/jaccl_wires.rs`),
//!   both frame rules and sizes around every threshold (32 KiB and 512 KiB included); the
//!   exact list of messages on every queue pair; and under lost messages, error completions,
//!   dead or stalled peers and UC's drop rule, every rank fails naming a peer by its deadline
//!   and none returns wrong data. That last guarantee rests on numbered messages: the
//!   simulator numbers them, and the RDMA fabric sends each with its number as immediate data
//!   (a difference from MLX, whose lost frame lets the next one take its place unnoticed).
//! - Across processes over TCP (`tests/processes/jaccl.rs`): meshes of 2 to 4 ranks and rings
//!   of 2 to 4 ranks with 1 or 2 wires, through `nuvec_distributed::init` and
//!   `nuvec_core::distributed`, every dtype against the model, and a lost peer; meshes of 2 to
//!   8 ranks with 1 to 3 wires, every collective against the model
//!   (`tests/processes/jaccl_wires.rs`).
//! - Across processes over the RDMA fabric (feature `jaccl`) driving the software RDMA
//!   provider of `fabric-sim/verbs/`: the same jobs, bit-identical to TCP, and lost messages,
//!   error completions, silent deaths and strict UC drops ending in errors naming a peer
//!   (`tests/processes/jaccl.rs`, `tests/processes/jaccl_rdma.rs`, `tests/processes/launch.rs`); multi-wire meshes
//!   of 2 to 8 ranks, every wire on devices of its own (`tests/processes/jaccl_wires.rs`).
//! - Against MLX 0.32.4's own algorithm code, over the software RDMA provider
//!   (`tests/processes/jaccl_mlx.rs`): ranks compiled from the wheel's JACCL headers,
//!   unchanged (`mesh_impl.h`, `ring_impl.h`, `reduction_ops.h` and the posting and polling
//!   inline in `rdma.h`; the bring-up, side channel and group glue the wheel does not ship
//!   are the test's own, from the reference), mixed with Rust ranks in jobs started by
//!   `nuvec-launch`: meshes of 2–4 ranks over 1–2 wires and rings of 2–4 ranks over 1–2
//!   wires, every collective (sum-scatter included) and dtype, sizes either side of every
//!   threshold, both frame rules. Every rank's bits and every queue pair's messages (the
//!   provider's log: sizes, order, count) equal those of a job whose ranks all run MLX's code,
//!   but for the two documented differences above (the mesh's completion order, both-NaN
//!   sums). What it found: the rank-order fold of the sum-scatter's shards (and of the large
//!   mesh all-reduce's) was none of MLX's results from rank 2 on, and the ring sum-scatter was
//!   missing; both are now MLX's.
//! - **Not verified**: the RDMA fabric on Thunderbolt hardware, MLX's JACCL as Apple builds it
//!   (its `libjaccl.dylib`, arm64's NaN rules, native half types), and the layout of Apple's
//!   `ibv_gid` in [`Destination`].

#[cfg(feature = "jaccl")]
pub mod budget;
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
