//! A workspace package's artifact for tests, built once with this test's profile: the
//! software RDMA provider and the launcher are other packages, whose artifacts cargo does not
//! build for this crate's tests.
#![allow(dead_code, unreachable_pub)]

use std::path::PathBuf;
use std::process::Command;

/// Builds `package` (or brings it up to date) with the profile of the running test binary
/// and returns the path of its artifact `file` in that profile's directory.
pub fn artifact(package: &str, file: &str) -> PathBuf {
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
        package,
    ]);
    if profile_dir.ends_with("release") {
        build.arg("--release");
    }
    let status = build.status().expect("run cargo build");
    assert!(status.success(), "building {package} failed");
    let path = profile_dir.join(file);
    assert!(path.exists(), "{} is not built", path.display());
    path
}
