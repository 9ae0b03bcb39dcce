//! Artifacts cargo does not build for this crate's tests (other packages' binaries and
//! libraries: the launcher, the software RDMA provider; the examples), built with the running
//! test's profile.
//!
//! They are built as one selection, the whole workspace's libraries, binaries and examples:
//! that is what `cargo test --workspace` (the README's command) builds besides its tests, with
//! the same features, so after it every artifact is already there and the build takes a
//! fraction of a second. Building one package (`-p nuvec-launch`) or one example alone makes
//! cargo resolve features for that selection alone, and the dependencies they change
//! (proc-macro crates, `serde`, `rand`, ...) are compiled again: minutes on CI's two cores.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock, PoisonError};

/// The path of `file` in the running test's profile directory (`nuvec-launch`,
/// `libnuvec_verbs_emu.so`), the workspace built (or brought up to date) first, once per test
/// process.
pub fn artifact(file: &str) -> PathBuf {
    existing(workspace().join(file))
}

/// `package` built with `features`, its artifact `file` copied to `copy` beside it; then the
/// workspace is built again, so that the artifact at its own path is the plain build again,
/// which other tests expect.
pub fn artifact_with_features(package: &str, file: &str, features: &str, copy: &str) -> PathBuf {
    // Held from the build to the copy: a workspace build meanwhile would put the plain
    // artifact back at the path before it is copied.
    let _builds = BUILDS.lock().unwrap_or_else(PoisonError::into_inner);
    let dir = profile_dir();
    cargo_build(&["-p", package, "--features", features]);
    let built = existing(dir.join(file));
    let target = built.with_file_name(copy);
    std::fs::copy(&built, &target)
        .unwrap_or_else(|e| panic!("copy {} to {}: {e}", built.display(), target.display()));
    cargo_build(WORKSPACE);
    target
}

/// The example `name`, the workspace built (or brought up to date) first, once per test
/// process.
pub fn example(name: &str) -> PathBuf {
    existing(workspace().join("examples").join(name))
}

/// One build (or build and copy) at a time within a test process.
static BUILDS: Mutex<()> = Mutex::new(());

/// What the workspace build builds: the selection `cargo test --workspace` builds besides its
/// tests.
const WORKSPACE: &[&str] = &["--workspace", "--lib", "--bins", "--examples"];

/// Builds the workspace's libraries, binaries and examples once per test process and returns
/// the profile directory.
fn workspace() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let _builds = BUILDS.lock().unwrap_or_else(PoisonError::into_inner);
        cargo_build(WORKSPACE);
        profile_dir()
    })
}

/// `target/<profile>` of the running test binary.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("this test binary");
    exe.parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps")
        .to_path_buf()
}

/// Runs `cargo build ARGS` with the running test's profile.
fn cargo_build(args: &[&str]) {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut build = Command::new(cargo);
    build
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["build", "--quiet", "--ignore-rust-version"])
        .args(args);
    if profile_dir().ends_with("release") {
        build.arg("--release");
    }
    let status = build.status().expect("run cargo build");
    assert!(status.success(), "cargo build {args:?} failed");
}

/// `path`, which the build must have made.
fn existing(path: PathBuf) -> PathBuf {
    assert!(path.exists(), "{} is not built", path.display());
    path
}
