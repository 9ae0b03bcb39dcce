//! The properties the fuzz targets check, one file per target, shared by the cargo-fuzz
//! binaries (`fuzz/fuzz_targets/*.rs`) and the stable replay test (`tests/fuzz_corpus.rs`),
//! which both include this file with `#[path]` (the files of this folder are its submodules).
//!
//! Each target is a function `<name>(data: &[u8])` in `<name>.rs`: it takes the raw fuzzer
//! input and panics when a property fails; it returns normally for every input that the code
//! under test handles correctly, including inputs it rightly refuses. [`script`] reads inputs
//! as scripts of small numbers. Nothing here depends on a fuzzing crate, so the replay test
//! builds on stable with the crate's ordinary dependencies; no target opens a socket or starts
//! a thread, so every input runs in microseconds and alike on every machine.
//!
//! To add a target: write `<name>.rs` here with `pub(crate) fn <name>(data: &[u8])`, declare it
//! below and add it to [`TARGETS`], add `fuzz/fuzz_targets/<name>.rs` (a copy of an existing
//! one calling it) and a `[[bin]]` in `fuzz/Cargo.toml`, and seed `fuzz/corpus/<name>/`.

// Every target uses one of these functions.
#![allow(dead_code)]

mod address;
mod auth_handshake;
mod hostfile;
mod jaccl_destination;
mod jaccl_devices;
mod jaccl_env;
mod jaccl_frames;
mod jaccl_side_channel;
mod ring_schedule;
mod ring_setup;
mod script;
mod stream_reassembly;

pub(crate) use address::address;
pub(crate) use auth_handshake::auth_handshake;
pub(crate) use hostfile::hostfile;
pub(crate) use jaccl_destination::jaccl_destination;
pub(crate) use jaccl_devices::jaccl_devices;
pub(crate) use jaccl_env::jaccl_env;
pub(crate) use jaccl_frames::jaccl_frames;
pub(crate) use jaccl_side_channel::jaccl_side_channel;
pub(crate) use ring_schedule::ring_schedule;
pub(crate) use ring_setup::ring_setup;
pub(crate) use stream_reassembly::stream_reassembly;

/// A property: panics when the input shows a bug.
pub(crate) type Property = fn(&[u8]);

/// Every target by name (the directory names under `fuzz/corpus/` and `fuzz/artifacts/`).
pub(crate) const TARGETS: &[(&str, Property)] = &[
    ("hostfile", hostfile),
    ("address", address),
    ("stream_reassembly", stream_reassembly),
    ("ring_schedule", ring_schedule),
    ("jaccl_devices", jaccl_devices),
    ("jaccl_env", jaccl_env),
    ("jaccl_destination", jaccl_destination),
    ("jaccl_side_channel", jaccl_side_channel),
    ("auth_handshake", auth_handshake),
    ("jaccl_frames", jaccl_frames),
    ("ring_setup", ring_setup),
];
