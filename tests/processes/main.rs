//! The crate over real sockets on this machine: ranks as processes (this test binary run
//! again as each rank, or the examples, or `sh` scripts under `nuvec-launch`), or as threads of
//! this process.
//!
//! - [`ring`], [`jaccl`]: the ring and JACCL's algorithms across processes over loopback
//!   (JACCL also over the RDMA fabric with the feature `jaccl`); [`jaccl_wires`]: the
//!   multi-wire mesh; [`jaccl_dead_peer`]: killed and stopped JACCL ranks;
//! - [`jaccl_rdma`]: the RDMA fabric's availability, bring-up and hardware exchange (feature
//!   `jaccl`, over the software RDMA provider);
//! - [`jaccl_mlx`]: mixed JACCL jobs of ranks built from MLX 0.32.4's own headers and Rust
//!   ranks (feature `jaccl`, over the software RDMA provider);
//! - [`liveness`]: busy and stopped ranks are waited for, and the others say what they
//!   wait for;
//! - [`launch`]: `nuvec-launch`, and its environment against `mlx.launch`'s;
//! - [`examples`]: the examples as the README runs them;
//! - [`threads`]: the ring with its ranks as threads; [`mismatch`]: the nuvec wire's check of
//!   every call over TCP and local links;
//! - [`wire`]: the nuvec wire's negotiation (probe, handshake, agreement), ranks as threads;
//! - [`split`], [`split_ring`], [`split_jaccl`]: `Group::split` across processes, and over
//!   loopback with the ranks as threads.
//!
//! The machines have two cores: every job of several processes holds
//! [`common::procs::exclusive`], so that no two of them share the cores.

#[path = "../common/mod.rs"]
mod common;

mod examples;
mod jaccl;
mod jaccl_dead_peer;
mod jaccl_mlx;
mod jaccl_rdma;
mod jaccl_wires;
mod launch;
mod liveness;
mod mismatch;
mod record;
mod ring;
mod split;
mod split_jaccl;
mod split_ring;
mod threads;
mod upstream;
mod wire;
