//! The examples run as the README says: all_sum on local ranks, data-parallel training with
//! identical parameters on every rank, tensor-parallel decoding matching the one-process model
//! (on 2 and 4 ranks and in the simulator), and the simulator showing a crash's errors.

use std::process::Command;
use std::time::Duration;

use crate::common::{built, procs, run};

/// Runs an example to its end (bounded; one job at a time) and returns its standard output.
fn run(name: &str, args: &[&str]) -> String {
    let _job = procs::exclusive();
    let mut cmd = Command::new(built::example(name));
    cmd.args(args)
        .env_remove("MLX_RANK")
        .env_remove("MLX_HOSTFILE");
    let done = run::run(&mut cmd, Duration::from_secs(240));
    assert_eq!(done.code, Some(0), "{name} {args:?}: {}", done.describe());
    done.stdout
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
    assert!(out.contains("ms per step"), "{out}");
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

#[test]
fn tensor_parallel_decoding_on_two_ranks_matches_the_one_process_model() {
    let out = run("tensor_parallel", &["-n", "2", "--tokens", "8"]);
    assert!(
        out.contains("tokens identical to the single-process model's on all 2 ranks"),
        "{out}"
    );
    assert!(out.contains("tokens/s"), "{out}");
}

#[test]
fn tensor_parallel_decoding_on_four_ranks_matches_the_one_process_model() {
    let out = run("tensor_parallel", &["-n", "4", "--tokens", "8"]);
    assert!(
        out.contains("tokens identical to the single-process model's on all 4 ranks"),
        "{out}"
    );
    assert!(out.contains("collectives"), "{out}");
}

#[test]
fn tensor_parallel_decoding_in_the_simulator_matches_the_one_process_model() {
    let out = run(
        "tensor_parallel",
        &["-n", "2", "--tokens", "4", "--simulate"],
    );
    assert!(
        out.contains("tokens identical to the single-process model's on all 2 ranks"),
        "{out}"
    );
    assert!(out.contains("simulated: 2 ranks"), "{out}");
}
