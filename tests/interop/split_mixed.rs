//! `Group::split` in a ring with a Python MLX rank (MLX 0.32.4): the Rust ranks get a clear
//! error by the parent's deadline, saying that Python MLX ranks cannot split, instead of a
//! hang; MLX's own ring refuses `split` too.
//!
//! Needs the venv made by `.ci/setup-venv` (`mlx[cpu]==0.32.4`); without it the test prints
//! why and passes, except under CI (`CI=true`), where a missing venv fails it.

use crate::common::ports;
use crate::common::procs;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use nuvec_core::Array;
use nuvec_core::distributed;

const RANK_TEST: &str = concat!(module_path!(), "::a_rust_rank_sums_then_splits");

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn a_rust_rank_sums_then_splits() {
    if !procs::is_child(RANK_TEST) {
        return;
    }
    let group = nuvec_distributed::init(true).expect("init");
    let total = distributed::all_sum(&Array::from_slice(&[group.rank() as f32], [1]), None)
        .to_vec::<f32>()
        .expect("all_sum");
    println!("RUST SUM {}", total[0]);
    let began = Instant::now();
    match group.split(0, -1) {
        Ok(_) => println!("RUST SPLIT OK"),
        Err(e) => println!(
            "RUST SPLIT FAILED after {} ms: {e}",
            began.elapsed().as_millis()
        ),
    }
}

#[test]
fn a_ring_with_a_python_mlx_rank_fails_split_by_the_deadline_saying_why() {
    let Some(python) = crate::common::venv::python("the mixed split test") else {
        return;
    };
    let _one_job_at_a_time = procs::exclusive();
    let dir = procs::scratch("split-mixed");
    let hostfile = procs::write_hostfile(&dir, &ports::free_nodes(3, 1));
    let commands = (0..3)
        .map(|r| {
            let mut cmd = if r == 2 {
                let mut c = Command::new(&python);
                c.arg(repo().join("tests/interop/mlx_idle_rank.py"));
                c
            } else {
                procs::this_test(RANK_TEST)
            };
            cmd.env("MLX_HOSTFILE", &hostfile)
                .env("MLX_RANK", r.to_string())
                .env("NUVEC_DISTRIBUTED_TIMEOUT", "3");
            cmd
        })
        .collect();
    // Wait for the Rust ranks only; the idle MLX rank is stopped then.
    let finished = procs::run_until(&dir, commands, Duration::from_secs(60), &[0, 1]);
    for (r, f) in finished.iter().enumerate().take(2) {
        assert_eq!(f.code, Some(0), "rank {r}:\n{}", f.output);
        assert!(f.output.contains("RUST SUM 3"), "rank {r}:\n{}", f.output);
        let line = f
            .output
            .lines()
            .find(|l| l.starts_with("RUST SPLIT"))
            .unwrap_or_else(|| panic!("rank {r} did not split:\n{}", f.output));
        assert!(
            line.contains("Python MLX ranks never do"),
            "rank {r}: {line}"
        );
        // Within the parent's deadline (3 s), with room for a loaded machine.
        let ms: u64 = line
            .split(" after ")
            .nth(1)
            .and_then(|rest| rest.split(" ms").next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("rank {r}: no time in {line}"));
        assert!(ms <= 6000, "rank {r} waited {ms} ms: {line}");
    }
    let mlx = &finished[2].output;
    assert!(mlx.contains("MLX SUM 3"), "the MLX rank:\n{mlx}");
    assert!(mlx.contains("MLX SPLIT REFUSED"), "the MLX rank:\n{mlx}");
}
