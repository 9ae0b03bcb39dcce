//! Arbitrary text as a ring hostfile: `hostfile::parse` never panics, and what it accepts
//! round-trips through `hostfile::write`.
//!
//! The properties live in `fuzz/src/properties/hostfile.rs`, shared with the stable replay test
//! `tests/fuzz_corpus.rs`.
#![no_main]

#[path = "../src/properties/mod.rs"]
mod properties;

libfuzzer_sys::fuzz_target!(|data: &[u8]| properties::hostfile(data));
