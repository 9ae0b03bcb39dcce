//! Scripted socket reads through `stream::Reassembly`: whole grains, in order, never past the end.
//!
//! The properties live in `fuzz/src/properties/stream_reassembly.rs`, shared with the stable replay
//! test `tests/fuzz_corpus.rs`.
#![no_main]

#[path = "../src/properties/mod.rs"]
mod properties;

libfuzzer_sys::fuzz_target!(|data: &[u8]| properties::stream_reassembly(data));
