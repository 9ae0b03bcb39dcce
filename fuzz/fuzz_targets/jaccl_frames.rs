//! Fuzzed (E, s, R, C, frame rule) through `jaccl::frames`: frames, slices and pieces
//! partition the bytes, and the plans follow MLX's thresholds.
//!
//! The properties live in `fuzz/src/properties/jaccl_frames.rs`, shared with the stable replay test
//! `tests/fuzz_corpus.rs`.
#![no_main]

#[path = "../src/properties/mod.rs"]
mod properties;

libfuzzer_sys::fuzz_target!(|data: &[u8]| properties::jaccl_frames(data));
