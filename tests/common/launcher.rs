//! The `nuvec-launch` binary (the workspace crate `launch/`) for tests: built once per test
//! binary with this test's profile (a binary of another package has no
//! `CARGO_BIN_EXE_nuvec-launch`). A test binary that includes it includes `common/built.rs` as
//! `built` too.
#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The path of the `nuvec-launch` binary, built (or brought up to date) on first use.
pub fn nuvec_launch() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| crate::built::artifact("nuvec-launch", "nuvec-launch"))
}
