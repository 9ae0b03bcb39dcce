//! Arbitrary bytes as MLX's 32-byte JACCL `Destination` record: decode never panics, accepts only 32
//! bytes, and decode and encode round-trip (up to the padding).
//!
//! The properties live in `fuzz/src/properties/jaccl_destination.rs`, shared with the stable replay
//! test `tests/fuzz_corpus.rs`.
#![no_main]

#[path = "../src/properties/mod.rs"]
mod properties;

libfuzzer_sys::fuzz_target!(|data: &[u8]| properties::jaccl_destination(data));
