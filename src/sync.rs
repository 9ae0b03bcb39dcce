//! The crate's locks: std's, or loom's under `RUSTFLAGS="--cfg loom"`, so the loom models in
//! `tests/loom.rs` explore every interleaving of the real code that takes them.
//!
//! Shared-memory state that several threads may touch goes through these types (the
//! communicator core's sticky failure state, `crate::collective::core`; the counters and flags
//! of a local link's queues, `transport::tcp::local::queue`). Under `cfg(loom)` they only work
//! inside `loom::model`, so only the loom test runs in such a build.
//!
//! Not here: the process-wide registry of initialised groups (`backend.rs`, a `static` needs
//! `Mutex::new` in a const context, which loom's is not), and the simulator's turn hand-off
//! (`nuvec-fabric-sim`, a separate crate whose scoped threads loom cannot run; `tests/loom.rs`
//! models a replica of it).

#[cfg(loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard, atomic};
#[cfg(not(loom))]
pub(crate) use std::sync::{Mutex, MutexGuard, atomic};
