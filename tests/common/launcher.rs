//! The `nuvec-launch` binary (the workspace crate `launch/`) for tests: built once per test
//! process, with the rest of the workspace (see `built`).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The path of the `nuvec-launch` binary, built (or brought up to date) on first use.
pub fn nuvec_launch() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| super::built::artifact("nuvec-launch"))
}

/// `nuvec-launch` built with its feature `jaccl` (the RDMA fabric in its probes and the
/// doctor's sweep), as `nuvec-launch-jaccl` beside the plain one; built on first use.
pub fn nuvec_launch_jaccl() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        super::built::artifact_with_features(
            "nuvec-launch",
            "nuvec-launch",
            "jaccl",
            "nuvec-launch-jaccl",
        )
    })
}
