//! The examples run as the README says: all_sum on local ranks; data-parallel training (under
//! `nuvec-launch` on 2 and 4 ranks and in the simulator) lowering the loss with identical
//! parameters on every rank, and resuming from its checkpoint to the same bits as a run
//! without a break; tensor-parallel decoding matching the one-process model (on 2 and 4 ranks
//! and in the simulator); each printing the wire its job agreed on; and the simulator showing
//! a crash's errors.

use std::process::Command;
use std::time::Duration;

use crate::common::{built, launcher, ports, procs, run};

/// Runs an example to its end (bounded; one job at a time) and returns its standard output.
fn run(name: &str, args: &[&str]) -> String {
    run_with(name, args, &[])
}

/// [`run`] with environment variables set for the example (and so for its ranks).
fn run_with(name: &str, args: &[&str], env: &[(&str, &str)]) -> String {
    let _job = procs::exclusive();
    let mut cmd = Command::new(built::example(name));
    cmd.args(args)
        .env_remove("MLX_RANK")
        .env_remove("MLX_HOSTFILE")
        .env_remove("NUVEC_DISTRIBUTED_WIRE");
    cmd.envs(env.iter().copied());
    let done = run::run(&mut cmd, Duration::from_secs(240));
    assert_eq!(done.code, Some(0), "{name} {args:?}: {}", done.describe());
    done.stdout
}

/// Runs an example as `ranks` ranks under `nuvec-launch` (bounded; one job at a time), with
/// the `VAR=value`s of `env` set on every rank, and returns what rank 0 printed, without its
/// prefix.
fn launched(name: &str, ranks: u16, args: &[&str], env: &[&str]) -> String {
    let example = built::example(name);
    let _job = procs::exclusive();
    let port = ports::consecutive(ranks).to_string();
    let ranks = ranks.to_string();
    let mut cmd = Command::new(launcher::nuvec_launch());
    cmd.args(["-n", &ranks, "--starting-port", &port])
        .env_remove("MLX_RANK")
        .env_remove("MLX_HOSTFILE")
        .env_remove("NUVEC_DISTRIBUTED_WIRE");
    for var in env {
        cmd.args(["--env", var]);
    }
    cmd.arg("--").arg(&example).args(args);
    let done = run::run(&mut cmd, Duration::from_secs(240));
    assert_eq!(done.code, Some(0), "{name} {args:?}: {}", done.describe());
    done.stdout
        .lines()
        .filter_map(|l| l.strip_prefix("[rank 0] "))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// The losses a data-parallel run printed, in order.
fn losses(out: &str) -> Vec<f32> {
    out.lines()
        .filter_map(|l| l.split("loss ").nth(1))
        .map(|v| v.trim().parse().expect("a loss"))
        .collect()
}

/// The checksum of the parameters a data-parallel run printed.
fn checksum(out: &str) -> String {
    out.lines()
        .find_map(|l| l.split("(checksum ").nth(1))
        .map(|c| c.trim_end_matches(')').to_owned())
        .unwrap_or_else(|| panic!("no checksum in {out}"))
}

/// Checks a data-parallel run on `ranks` ranks: identical parameters, a falling loss, the
/// time per step with the measured share of its one all_sum.
fn assert_trained(out: &str, ranks: usize) {
    assert!(
        out.contains(&format!(
            "parameters identical on all {ranks} ranks (checksum "
        )),
        "{out}"
    );
    assert!(
        out.contains("ms per step") && out.contains("inside 1 all_sum(s) per step (measured"),
        "{out}"
    );
    let losses = losses(out);
    assert!(losses.len() >= 3, "{out}");
    let (first, last) = (losses[0], losses[losses.len() - 1]);
    assert!(
        last < first / 2.0,
        "the loss fell from {first} to {last} only: {out}"
    );
}

#[test]
fn all_sum_runs_on_two_local_ranks() {
    let out = run("all_sum", &["-n", "2", "--max-bytes", "1048576"]);
    assert!(out.contains("all_sum([rank, 1]) = [1.0, 2.0]"), "{out}");
    assert!(out.contains("1048576"), "{out}");
}

#[test]
fn data_parallel_training_on_two_ranks_under_nuvec_launch_lowers_the_loss_with_identical_parameters()
 {
    let out = launched("data_parallel", 2, &[], &[]);
    assert_trained(&out, 2);
    assert!(out.contains("wire: nuvec"), "{out}");
}

#[test]
fn data_parallel_training_on_four_ranks_over_mlx_wire_lowers_the_loss_with_identical_parameters() {
    let out = launched("data_parallel", 4, &[], &["NUVEC_DISTRIBUTED_WIRE=mlx"]);
    assert_trained(&out, 4);
    assert!(out.contains("wire: mlx"), "{out}");
}

#[test]
fn data_parallel_training_in_the_simulator_lowers_the_loss_with_identical_parameters() {
    let out = run("data_parallel", &["-n", "2", "--simulate"]);
    assert_trained(&out, 2);
    assert!(out.contains("wire: nuvec"), "{out}");
    assert!(out.contains("simulated: 2 ranks"), "{out}");
}

#[test]
fn data_parallel_training_resumed_from_its_checkpoint_ends_with_the_bits_of_a_run_without_a_break()
{
    let dir = std::env::temp_dir().join(format!("nuvec-examples-resume-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    let path = dir.join("checkpoint.safetensors");
    let path_arg = path.to_str().expect("a UTF-8 path");
    let straight = run("data_parallel", &["-n", "2", "--steps", "40"]);
    let half = run(
        "data_parallel",
        &["-n", "2", "--steps", "20", "--checkpoint", path_arg],
    );
    assert!(
        half.contains(&format!("checkpoint: {path_arg} (step 20)")),
        "{half}"
    );
    let resumed = run(
        "data_parallel",
        &[
            "-n",
            "2",
            "--steps",
            "40",
            "--checkpoint",
            path_arg,
            "--resume",
        ],
    );
    assert!(
        resumed.contains(&format!("resumed from {path_arg} at step 20")),
        "{resumed}"
    );
    assert_eq!(
        checksum(&straight),
        checksum(&resumed),
        "40 steps straight:\n{straight}\n20 steps:\n{half}\nresumed to 40:\n{resumed}"
    );
    assert_ne!(checksum(&half), checksum(&resumed), "{resumed}");
    assert_eq!(losses(&straight).last(), losses(&resumed).last());
    // Rank 0 alone wrote it, through a temporary file renamed into place.
    let names: Vec<_> = std::fs::read_dir(&dir)
        .expect("the scratch directory")
        .map(|e| e.expect("an entry").file_name())
        .collect();
    assert_eq!(names, ["checkpoint.safetensors"], "{names:?}");
    let _ = std::fs::remove_dir_all(&dir);
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
    assert!(out.contains("wire: nuvec"), "{out}");
    assert!(out.contains("(measured: "), "{out}");
}

#[test]
fn tensor_parallel_decoding_on_four_ranks_matches_the_one_process_model() {
    let out = run_with(
        "tensor_parallel",
        &["-n", "4", "--tokens", "8"],
        &[("NUVEC_DISTRIBUTED_WIRE", "mlx")],
    );
    assert!(
        out.contains("tokens identical to the single-process model's on all 4 ranks"),
        "{out}"
    );
    assert!(out.contains("collectives"), "{out}");
    assert!(out.contains("wire: mlx"), "{out}");
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
    assert!(out.contains("wire: nuvec"), "{out}");
}
