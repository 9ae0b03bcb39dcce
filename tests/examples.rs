//! The examples run as the README says: all_sum on local ranks, data-parallel training with
//! identical parameters on every rank, and the simulator showing a crash's errors.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// The path of an example, built (or brought up to date) with the profile of this test.
fn example(name: &str) -> PathBuf {
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
        "--example",
        name,
    ]);
    if profile_dir.ends_with("release") {
        build.arg("--release");
    }
    let status = build.status().expect("run cargo build");
    assert!(status.success(), "building the example {name} failed");
    profile_dir.join("examples").join(name)
}

/// Runs an example to its end (bounded) and returns its standard output.
fn run(name: &str, args: &[&str]) -> String {
    let path = example(name);
    assert!(path.exists(), "{} is not built", path.display());
    let mut child = Command::new(&path)
        .args(args)
        .env_remove("MLX_RANK")
        .env_remove("MLX_HOSTFILE")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start the example");
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            let mut out = String::new();
            use std::io::Read;
            child
                .stdout
                .take()
                .expect("stdout")
                .read_to_string(&mut out)
                .expect("read stdout");
            assert!(
                status.success(),
                "{name} {args:?} failed ({status}):\n{out}"
            );
            return out;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            panic!("{name} {args:?} did not finish in time");
        }
        // Polling the child: std has no wait with a timeout.
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn all_sum_runs_on_two_local_ranks() {
    let out = run("all_sum", &["-n", "2", "--max-bytes", "1048576"]);
    assert!(out.contains("all_sum([rank, 1]) = [1.0, 2.0]"), "{out}");
    assert!(out.contains("1048576"), "{out}");
}

#[test]
fn data_parallel_training_converges_with_identical_parameters() {
    let out = run("data_parallel", &["-n", "2"]);
    assert!(out.contains("parameters identical on all 2 ranks"), "{out}");
    let last_loss: f32 = out
        .lines()
        .rev()
        .find_map(|l| l.split("loss ").nth(1))
        .expect("a loss line")
        .trim()
        .parse()
        .expect("a number");
    assert!(last_loss < 0.05, "{out}");
}

#[test]
fn tensor_parallel_training_over_split_groups_converges_with_identical_parameters() {
    let out = run("data_parallel", &["-n", "4", "--tensor-parallel", "2"]);
    assert!(
        out.contains(
            "parameters identical on all 4 ranks (2-way tensor parallel × 2-way data parallel)"
        ),
        "{out}"
    );
    let last_loss: f32 = out
        .lines()
        .rev()
        .find_map(|l| l.split("loss ").nth(1))
        .expect("a loss line")
        .trim()
        .parse()
        .expect("a number");
    assert!(last_loss < 0.05, "{out}");
}

#[test]
fn simulate_shows_the_error_of_a_crashed_rank() {
    let out = run("simulate", &["--ranks", "4", "--crash", "2"]);
    assert!(out.contains("rank 2: crashed"), "{out}");
    assert!(
        out.contains("the connection was closed by the peer"),
        "{out}"
    );
    let again = run("simulate", &["--ranks", "4", "--crash", "2"]);
    assert_eq!(out, again, "the same seed must replay the same run");
}
