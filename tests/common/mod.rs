//! The code the test binaries share, and their one way in: a binary declares `mod common;`
//! once (`#[path = "../common/mod.rs"] mod common;` from a binary of its own folder) and names
//! what it uses as `crate::common::…`.
//!
//! - [`procs`]: jobs of local processes, each rank this test binary run again;
//!   [`rank_threads`]: a job's ranks as threads of this process; [`ports`]: free loopback
//!   addresses; [`built`], [`launcher`], [`emu`]: other packages' artifacts (the
//!   `nuvec-launch` binary, the software RDMA provider, the examples) built with the running
//!   test's profile; [`run`]: one process run to its end with a bound, and the tagged lines
//!   of a job's output; [`venv`]: the MLX venv.
//! - [`mlx_model`], [`jaccl_model`]: independent models of MLX's ring and JACCL bytes;
//!   [`values`]: random element values; [`pattern`]: the input pattern the Python MLX ranks
//!   share; [`group`]: the sum and gather over a `Group` the split tests check.
//!
//! Every binary compiles its own copy of this module and uses only part of it, and rustc's
//! dead-code analysis is per crate: the simulator's binary never starts a process, the
//! processes' binary never folds a model in virtual time. So the module allows `dead_code`
//! here, once, for all of them, rather than on every `mod common;` (a binary added later
//! would otherwise repeat it) or behind cargo features (a feature per helper would make the
//! plain `cargo test` choose between binaries). `unreachable_pub` is allowed for the same
//! reason: nothing in a test crate is reachable from outside it, and `pub` here is the
//! module's interface to the binaries.
#![allow(dead_code, unreachable_pub)]

pub mod built;
pub mod emu;
pub mod group;
pub mod jaccl_model;
pub mod jaccl_wires;
pub mod launcher;
pub mod mlx_model;
pub mod pattern;
pub mod ports;
pub mod procs;
pub mod rank_threads;
pub mod run;
pub mod values;
pub mod venv;
