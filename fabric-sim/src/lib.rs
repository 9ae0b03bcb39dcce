//! A deterministic, in-process simulator of `nuvec-distributed`'s [`Fabric`].
//!
//! All ranks of a job run in one process, each on its own thread, but **only one runs at a
//! time**: when the running rank blocks in the fabric (or finishes), a scheduler driven by one
//! seeded generator ([`ChaCha8Rng`]) chooses which rank runs next, or, when none can, advances
//! **virtual time** to the next event. Ordinary blocking algorithm code therefore runs
//! deterministically: the same seed gives the same interleaving, the same fragment sizes, the
//! same latencies and faults, and the same [trace hash](Report::trace_hash). A 30 s timeout
//! takes microseconds.
//!
//! The network model, per directed channel (one direction of one connection of a
//! [`Wiring`]):
//!
//! - **stream semantics**: the sender's bytes are cut into fragments of random sizes and
//!   delivered in order; a receive completes with exactly the bytes it asked for;
//! - **flow control**: at most [`Sim::window`] bytes are in flight or unread per direction, as a
//!   socket buffer, so a rank that sends without receiving blocks as it would on TCP;
//! - **latency, jitter and bandwidth** per fragment; channels are independent, so bytes of
//!   different channels arrive in an order the seed chooses;
//! - **faults** ([`Fault`]): a rank crashes (its connections close), stalls for a while (it is
//!   not scheduled; its peers see silence), or a link is cut (both directions close).
//!
//! [`Sim::run`] runs a closure per rank, hands each its [`SimFabric`], and returns every rank's
//! [`Outcome`] with the trace hash and, on request, every byte each channel carried (to compare
//! the wire against an independent model of MLX's protocol). When a property fails, print
//! [`Report::replay`]: the seed replays the same run.
//!
//! # Code map
//!
//! One file per job; every module is private and the public API is re-exported below.
//!
//! - `sim`: the builder ([`Sim`]) and the runners (`run`, `run_ring`, `run_jaccl`);
//! - `fault`: [`Fault`] and how each enters the world;
//! - `split`: `Group::split` in a simulated job: new channels between the members, joined to
//!   the world deterministically;
//! - `report`: [`Outcome`] and [`Report`];
//! - `fabric`: [`SimFabric`] (the [`Fabric`] the communicators drive: counts, validates and
//!   dispatches each step) and [`SimClock`];
//! - `turn`: the turn hand-off between rank threads;
//! - `stream`: the stream step engine and the stream network model (fragments, windows);
//! - `uc`: UC message channels ([`Uc`], [`Unexpected`]): their step engine and network model;
//! - `world`: the shared state behind the one lock: ranks, wires, events, virtual time, the
//!   generator, the trace, and the scheduler;
//! - [`campaign`]: seeded fault campaigns over the whole crate (public: the campaign example
//!   and test drive it).
//!
//! A fabric call goes `fabric` → `stream` or `uc` (under the lock of `turn`'s `Shared`,
//! mutating the `world`) → `turn` while it waits; `sim` starts the threads and `report`
//! collects what the world recorded.

pub mod campaign;
mod default_group;
mod fabric;
mod fault;
mod report;
mod sim;
mod split;
mod stream;
mod turn;
mod uc;
mod world;

pub use fabric::{EPOCH_US, SimClock, SimFabric};
pub use fault::Fault;
pub use report::{Outcome, Report};
pub use sim::{SEED_VAR, Sim};
pub use uc::{Uc, Unexpected};

#[cfg(doc)]
use nuvec_distributed::fabric::{Fabric, Wiring};
#[cfg(doc)]
use rand_chacha::ChaCha8Rng;
