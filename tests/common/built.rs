//! Artifacts cargo does not build for this crate's tests, built once with the running test's
//! profile: other packages' (the software RDMA provider, the launcher) and the examples.

use std::path::PathBuf;
use std::process::Command;

/// Builds `package` (or brings it up to date) with the profile of the running test binary
/// and returns the path of its artifact `file` in that profile's directory.
pub fn artifact(package: &str, file: &str) -> PathBuf {
    build(&["-p", package], file)
}

/// [`artifact`] with `features` of `package`, copied to `copy` beside it; then the artifact
/// is built again without them, so that the one at its own path stays the plain build that
/// other tests expect.
pub fn artifact_with_features(package: &str, file: &str, features: &str, copy: &str) -> PathBuf {
    let built = build(&["-p", package, "--features", features], file);
    let target = built.with_file_name(copy);
    std::fs::copy(&built, &target)
        .unwrap_or_else(|e| panic!("copy {} to {}: {e}", built.display(), target.display()));
    artifact(package, file);
    target
}

/// Builds the example `name` (or brings it up to date) with the profile of the running test
/// binary and returns its path.
pub fn example(name: &str) -> PathBuf {
    build(&["--example", name], &format!("examples/{name}"))
}

/// Runs `cargo build ARGS` with the running test's profile and returns the path of `file` in
/// that profile's directory, which must then exist.
fn build(args: &[&str], file: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("this test binary");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut build = Command::new(cargo);
    build
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["build", "--quiet", "--ignore-rust-version"])
        .args(args);
    if profile_dir.ends_with("release") {
        build.arg("--release");
    }
    let status = build.status().expect("run cargo build");
    assert!(status.success(), "cargo build {args:?} failed");
    let path = profile_dir.join(file);
    assert!(path.exists(), "{} is not built", path.display());
    path
}
