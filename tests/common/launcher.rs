//! The `nuvec-launch` binary (the workspace crate `launch/`) for tests: built once per test

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The path of the `nuvec-launch` binary, built (or brought up to date) on first use.
pub fn nuvec_launch() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| super::built::artifact("nuvec-launch", "nuvec-launch"))
}
