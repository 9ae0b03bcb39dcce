//! A fuzzed environment and device file through `jaccl::Config::from_vars`: exactly the documented
//! rules, errors naming the variable, never a panic.
//!
//! The properties live in `fuzz/src/properties/jaccl_env.rs`, shared with the stable replay test
//! `tests/fuzz_corpus.rs`.
#![no_main]

#[path = "../src/properties/mod.rs"]
mod properties;

libfuzzer_sys::fuzz_target!(|data: &[u8]| properties::jaccl_env(data));
