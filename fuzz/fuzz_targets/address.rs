//! Arbitrary text as a `"host:port"` address: `hostfile::split_address` never panics, and what it
//! accepts round-trips.
//!
//! The properties live in `fuzz/src/properties/address.rs`, shared with the stable replay test
//! `tests/fuzz_corpus.rs`.
#![no_main]

#[path = "../src/properties/mod.rs"]
mod properties;

libfuzzer_sys::fuzz_target!(|data: &[u8]| properties::address(data));
