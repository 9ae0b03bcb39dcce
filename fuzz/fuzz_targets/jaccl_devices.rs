//! Arbitrary text as MLX's JACCL device file: `jaccl::parse_devices` never panics, what it accepts
//! round-trips, and `Config`'s validity checks, topology and device queries follow MLX's rules.
//!
//! The properties live in `fuzz/src/properties/jaccl_devices.rs`, shared with the stable replay
//! test `tests/fuzz_corpus.rs`.
#![no_main]

#[path = "../src/properties/mod.rs"]
mod properties;

libfuzzer_sys::fuzz_target!(|data: &[u8]| properties::jaccl_devices(data));
