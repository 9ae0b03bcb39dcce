//! The JACCL side channel's state machine as a rank ≥ 1 fed a scripted rank 0's bytes, with no
//! socket: MLX's bytes, the model's results, errors (never panics) on a misbehaving, cut or
//! corrupted stream.
//!
//! The properties live in `fuzz/src/properties/jaccl_side_channel.rs`, shared with the stable
//! replay test `tests/fuzz_corpus.rs`.
#![no_main]

#[path = "../src/properties/mod.rs"]
mod properties;

libfuzzer_sys::fuzz_target!(|data: &[u8]| properties::jaccl_side_channel(data));
