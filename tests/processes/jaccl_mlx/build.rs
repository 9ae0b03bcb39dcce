//! The C++ ranks of MLX's JACCL code: found headers, compiled once per test run.

use crate::common::venv;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// The C++ sources, each supplying what the wheel declares but does not ship.
pub(super) const SOURCES: [&str; 4] = ["side_channel.cpp", "rdma.cpp", "groups.cpp", "main.cpp"];

/// The MLX venv's JACCL headers (the directory holding `jaccl/`), or why not.
pub(super) fn headers() -> Result<PathBuf, String> {
    let bin = venv::bin_with("python", "the JACCL jobs of MLX's own code")
        .ok_or("no MLX venv (.ci/setup-venv makes it)")?;
    let lib = bin.join("../lib");
    let entries = std::fs::read_dir(&lib).map_err(|e| format!("{}: {e}", lib.display()))?;
    for entry in entries.flatten() {
        let dir = entry
            .path()
            .join("site-packages/mlx/include/mlx/distributed/jaccl/lib");
        if dir.join("jaccl/mesh_impl.h").exists() && dir.join("jaccl/ring_impl.h").exists() {
            return Ok(dir);
        }
    }
    Err(format!(
        "no jaccl/mesh_impl.h in the MLX venv under {}",
        lib.display()
    ))
}

/// The C++ ranks, one per frame rule (`[small, large]`), built once per test run into the
/// cargo target's tmp directory (kept while newer than every source and header), or why they
/// cannot be. Under `CI=true` they must build.
pub(super) fn harness() -> Option<&'static [PathBuf; 2]> {
    static BUILT: OnceLock<Result<[PathBuf; 2], String>> = OnceLock::new();
    match BUILT.get_or_init(build_harness) {
        Ok(paths) => Some(paths),
        Err(why) => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "the C++ ranks of MLX's JACCL code: {why}, but CI=true requires them"
            );
            eprintln!("skipped: the C++ ranks of MLX's JACCL code: {why}");
            None
        }
    }
}

pub(super) fn build_harness() -> Result<[PathBuf; 2], String> {
    let include = headers()?;
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/processes/jaccl_mlx");
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("jaccl-mlx");
    std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let mut inputs: Vec<PathBuf> = SOURCES.iter().map(|s| src.join(s)).collect();
    if let Ok(entries) = std::fs::read_dir(include.join("jaccl")) {
        inputs.extend(entries.flatten().map(|e| e.path()));
    }
    let newest = inputs.iter().filter_map(|p| modified(p)).max();
    let targets = [out.join("jaccl-rank-small"), out.join("jaccl-rank-large")];
    if targets
        .iter()
        .all(|t| modified(t).is_some_and(|m| Some(m) >= newest))
    {
        return Ok(targets);
    }
    let compiler = std::env::var("CXX").unwrap_or_else(|_| "g++".to_owned());
    let compile = |source: &str, rule: &str, object: &Path| {
        let mut cmd = Command::new(&compiler);
        // -O1: at -O0 the build is a third quicker, but MLX's busy polling, unoptimised,
        // makes the jobs of 4 ranks several times slower on two cores (they pass all the same).
        cmd.args(["-std=c++20", "-O1", "-c", "-include", "cstring"])
            // The frame rule's macOS-version test: 0 is macOS 26.2's 4 KiB frames, 1 the
            // large frames of 26.3 and later.
            .arg(format!("-D__builtin_available(...)={rule}"))
            .arg("-I")
            .arg(&include)
            .arg(src.join(source))
            .arg("-o")
            .arg(object);
        cmd
    };
    // Every source once per rule, never an object of one rule in the other's binary: the rule
    // lives in `rdma.h`'s `buffer_size_from_message`, of internal linkage, which the headers'
    // inline members call, and a translation unit that emits one of those (as g++ -O0 does in
    // main.cpp for `RingImpl::all_gather_wire`) would give the linker its copy, of its rule.
    let object = |source: &str, name: &str| out.join(format!("{source}-{name}.o"));
    let mut jobs = Vec::new();
    for (rule, name) in [("0", "small"), ("1", "large")] {
        for source in SOURCES {
            jobs.push(compile(source, rule, &object(source, name)));
        }
    }
    // All at once (the machines have two cores; groups.cpp's take the longest).
    let mut running = Vec::new();
    for cmd in &mut jobs {
        let shown = format!("{cmd:?}");
        let child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot run {compiler} ({e})"))?;
        running.push((shown, child));
    }
    for (shown, child) in running {
        let output = child
            .wait_with_output()
            .map_err(|e| format!("waiting for {compiler} ({e})"))?;
        if !output.status.success() {
            return Err(format!(
                "{shown} failed:\n{}",
                String::from_utf8_lossy(&output.stderr)
            ));
        }
    }
    for (target, name) in targets.iter().zip(["small", "large"]) {
        let mut link = Command::new(&compiler);
        for source in SOURCES {
            link.arg(object(source, name));
        }
        link.args(["-ldl", "-pthread", "-o"]).arg(target);
        let output = link
            .output()
            .map_err(|e| format!("cannot run {compiler} ({e})"))?;
        if !output.status.success() {
            return Err(format!(
                "linking {} failed:\n{}",
                target.display(),
                String::from_utf8_lossy(&output.stderr)
            ));
        }
    }
    Ok(targets)
}
