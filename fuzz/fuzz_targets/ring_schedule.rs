//! Fuzzed (E, s, R, C) through `ring::schedule`: parts, segments and point-to-point splits
//! partition the bytes.
//!
//! The properties live in `fuzz/src/properties/ring_schedule.rs`, shared with the stable replay
//! test `tests/fuzz_corpus.rs`.
#![no_main]

#[path = "../src/properties/mod.rs"]
mod properties;

libfuzzer_sys::fuzz_target!(|data: &[u8]| properties::ring_schedule(data));
