//! The `nuvec-launch` binary (the workspace crate `launch/`) for tests: built once per test
//! binary with this test's profile (a binary of another package has no
//! `CARGO_BIN_EXE_nuvec-launch`).
#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The path of the `nuvec-launch` binary, built (or brought up to date) on first use.
pub fn nuvec_launch() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let exe = std::env::current_exe().expect("this test binary");
        let profile_dir = exe
            .parent()
            .and_then(|deps| deps.parent())
            .expect("target/<profile>/deps");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut build = Command::new(cargo);
        build.current_dir(env!("CARGO_MANIFEST_DIR")).args([
            "build",
            "--quiet",
            "--ignore-rust-version",
            "-p",
            "nuvec-launch",
        ]);
        if profile_dir.ends_with("release") {
            build.arg("--release");
        }
        let status = build.status().expect("run cargo build");
        assert!(status.success(), "building nuvec-launch failed");
        let path = profile_dir.join("nuvec-launch");
        assert!(path.exists(), "{} is not built", path.display());
        path
    })
}
