//! Fuzzed handshake messages through `auth::Acceptor` and `auth::Opener`: refused unless they carry
//! the correct HMAC proof, never a panic.
//!
//! The properties live in `fuzz/src/properties/auth_handshake.rs`, shared with the stable replay
//! test `tests/fuzz_corpus.rs`.
#![no_main]

#[path = "../src/properties/mod.rs"]
mod properties;

libfuzzer_sys::fuzz_target!(|data: &[u8]| properties::auth_handshake(data));
