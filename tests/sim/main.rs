//! Everything that runs in one process without a socket: the algorithms over the
//! deterministic simulator (`nuvec-fabric-sim`, virtual time) against independent models of
//! MLX's bytes, fault campaigns, the failure model, and the input pattern shared with the
//! Python MLX ranks.
//!
//! - [`ring`]: MLX's ring (results, wire bytes, faults, determinism), property-tested;
//! - [`jaccl`]: JACCL's mesh and ring over UC message channels; [`jaccl_wires`]: the
//!   multi-wire mesh of MLX 0.32.4;
//! - [`campaign`]: a bounded fault campaign; [`failure_semantics`]: one failure model;
//! - [`split`]: `Group::split` over the ring and JACCL in the simulator;
//! - [`wire`]: the nuvec wire (results, hops, mismatched calls), property-tested;
//! - [`wire_agreement`]: the ranks' agreement on a wire, for every set of connections that
//!   are not native;
//! - [`smoke`]: a first run; [`pattern_golden`]: the interop pattern against its golden file.

#[path = "../common/mod.rs"]
mod common;

mod campaign;
mod failure_semantics;
mod jaccl;
mod jaccl_wires;
mod pattern_golden;
mod ring;
mod smoke;
mod split;
mod usability;
mod wire;
mod wire_agreement;
