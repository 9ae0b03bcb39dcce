//! The ring's connection setup state machine (`tcp::setup::Setup`) fed random events and time:
//! MLX's order, no wait past the deadline, every stranger dropped, a finished setup complete.
//!
//! The properties live in `fuzz/src/properties/ring_setup.rs`, shared with the stable replay
//! test `tests/fuzz_corpus.rs`.
#![no_main]

#[path = "../src/properties/mod.rs"]
mod properties;

libfuzzer_sys::fuzz_target!(|data: &[u8]| properties::ring_setup(data));
