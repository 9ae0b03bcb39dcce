//! The JACCL side channel as a rank ≥ 1 against a scripted rank 0 over loopback: MLX's bytes, the
//! model's results, errors (never panics or hangs) on a misbehaving, cut or corrupted stream.
//!
//! The properties live in `fuzz/src/properties.rs`, shared with the stable replay test
//! `tests/fuzz_corpus.rs`.
#![no_main]

#[path = "../src/properties.rs"]
mod properties;

libfuzzer_sys::fuzz_target!(|data: &[u8]| properties::jaccl_side_channel(data));
