//! Liveness across processes over loopback: a rank that is only busy or stopped is waited
//! for (the others say, at the warning interval, what they wait for, and nothing fails, even
//! with a link timeout far shorter than the pause), also with no operation timeout at all;
//! and the default warning interval, proven once.
//!
//! A cut cable or a dead host cannot be made here (a stopped process's kernel keeps
//! answering); `tests/cluster.rs` pulls cables.

use crate::common::ports;
use crate::common::procs;

use std::time::{Duration, Instant};

use nuvec_core::distributed::{self, Group};
use nuvec_core::ops;

const CHILD_TEST: &str = concat!(module_path!(), "::a_rank_runs_its_liveness_scenario");
const SCENARIO: &str = "NUVEC_TEST_SCENARIO";
/// How long the last rank pauses, in seconds.
const PAUSE: &str = "NUVEC_TEST_PAUSE_S";

/// The last rank is busy (sleeps) for the pause before its second all_sum of 16 MiB; every
/// rank reports how its all_sum went and how long it took.
fn busy(group: &Group, pause: Duration) {
    let x = ops::full([4usize << 20], 1.0f32);
    distributed::all_sum(&x, Some(group))
        .eval()
        .expect("first all_sum");
    if group.rank() + 1 == group.size() {
        // A rank at work elsewhere (a checkpoint): a fixed pause, not a wait for anything.
        std::thread::sleep(pause);
    }
    report(group, &x);
}

/// The last rank stops itself (SIGSTOP) before its second all_sum of 16 MiB, and a helper
/// continues it after the pause.
fn stopped(group: &Group, pause: Duration) {
    let x = ops::full([4usize << 20], 1.0f32);
    distributed::all_sum(&x, Some(group))
        .eval()
        .expect("first all_sum");
    if group.rank() + 1 == group.size() {
        let pid = std::process::id().to_string();
        let cont = format!("sleep {}; kill -CONT {pid}", pause.as_secs_f64());
        // Not waited for: each outlives or ends with this process.
        #[allow(clippy::zombie_processes)]
        std::process::Command::new("sh")
            .args(["-c", &cont])
            .spawn()
            .expect("run the helper that continues this rank");
        // Waited for: the rank stops inside this wait, before its second all_sum sends a
        // byte (a `kill` left to run on its own could stop it anywhere in the all_sum, after
        // its first steps' bytes had gone, and the others would then wait on another rank).
        std::process::Command::new("kill")
            .args(["-STOP", &pid])
            .status()
            .expect("run kill");
    }
    report(group, &x);
}

/// Runs a second all_sum of `x` and prints how it went.
fn report(group: &Group, x: &nuvec_core::Array) {
    let started = Instant::now();
    let result = distributed::all_sum(x, Some(group)).eval();
    match result {
        Ok(()) => println!("SUCCEEDED"),
        Err(e) => println!("ERROR {e}"),
    }
    println!("WAITED_MS {}", started.elapsed().as_millis());
}

#[test]
fn a_rank_runs_its_liveness_scenario() {
    if !procs::is_child(CHILD_TEST) {
        return;
    }
    let scenario = std::env::var(SCENARIO).expect("scenario");
    let pause: f64 = std::env::var(PAUSE)
        .expect("pause")
        .parse()
        .expect("seconds");
    let pause = Duration::from_secs_f64(pause);
    let group = nuvec_distributed::init(true).unwrap_or_else(|e| {
        println!("INIT FAILED {e}");
        std::process::exit(3)
    });
    match scenario.as_str() {
        "busy" => busy(&group, pause),
        "stopped" => stopped(&group, pause),
        other => panic!("unknown scenario {other}"),
    }
}

/// Runs 3 ranks of `scenario` with the last one pausing for `pause_secs`, each with `env`.
fn job(name: &str, scenario: &str, pause_secs: &str, env: &[(&str, &str)]) -> Vec<procs::Finished> {
    let _one_job_at_a_time = procs::exclusive();
    let dir = procs::scratch(name);
    let nodes = ports::free_nodes(3, 1);
    let hostfile = procs::write_hostfile(&dir, &nodes);
    let commands = (0..3)
        .map(|r| {
            let mut cmd = procs::this_test(CHILD_TEST);
            cmd.env(SCENARIO, scenario)
                .env(PAUSE, pause_secs)
                .env("MLX_HOSTFILE", &hostfile)
                .env("MLX_RANK", r.to_string())
                .envs(env.iter().copied());
            cmd
        })
        .collect();
    procs::run_all(&dir, commands, Duration::from_secs(180))
}

/// The warnings in a rank's output.
fn warnings(output: &str) -> Vec<&str> {
    output
        .lines()
        .filter(|l| l.contains("has waited"))
        .collect()
}

/// The seconds a warning says its operation has waited ("has waited 4.0 s for …").
fn waited_secs(warning: &str) -> Option<f64> {
    let (_, rest) = warning.split_once("has waited ")?;
    rest.split_whitespace().next()?.parse().ok()
}

/// The warnings in a rank's output about its second all_sum (`#1`), the one the pause is in.
/// A warning about the first is a real wait of more than the interval before anyone paused
/// (a rank slow to reach it on a loaded machine, as when the whole suite runs at once): not
/// what these tests are about, and not theirs to forbid.
fn warnings_of_the_pause(output: &str) -> Vec<&str> {
    warnings(output)
        .into_iter()
        .filter(|w| w.contains("all_sum #1 ("))
        .collect()
}

/// Checks that every rank completed its second all_sum, and that rank 0 (which waits for the
/// paused rank 2 directly) warned at least `at_least` times while rank 2 was paused (`pause`
/// seconds), naming rank 2, the operation and a live link; rank 2 warned of nothing in that
/// operation. A warning due as the pause ends (within half a second of it) may come after rank
/// 2 has resumed, when rank 0 can be waiting on rank 1's share of the step instead: what it
/// names is not checked.
fn every_rank_completes_and_rank_zero_warns(
    finished: &[procs::Finished],
    at_least: usize,
    pause: f64,
) {
    procs::assert_all_ok("the job", finished);
    for (rank, f) in finished.iter().enumerate() {
        assert!(
            f.output.contains("SUCCEEDED"),
            "rank {rank} failed:\n{}",
            f.output
        );
    }
    let zero: Vec<&str> = warnings_of_the_pause(&finished[0].output)
        .into_iter()
        .filter(|w| waited_secs(w).is_none_or(|secs| secs < pause - 0.5))
        .collect();
    assert!(
        zero.len() >= at_least,
        "rank 0 warned {} times while rank 2 was paused, not {at_least}:\n{}",
        zero.len(),
        finished[0].output
    );
    for line in &zero {
        assert!(
            line.contains("warning: all_sum #1 (16 MiB) has waited")
                && line.contains("for rank 2 (link 0")
                && line.contains("the link is alive"),
            "{line}"
        );
    }
    assert!(
        warnings_of_the_pause(&finished[2].output).is_empty(),
        "{}",
        finished[2].output
    );
}

#[test]
fn a_rank_busy_longer_than_the_link_timeout_is_waited_for_and_the_others_say_so() {
    if procs::is_child(CHILD_TEST) {
        return;
    }
    // Rank 1's 16 MiB fill rank 2's buffers: its window stays closed for 4 s, four times the
    // link timeout, and that is not silence.
    let finished = job(
        "busy-rank",
        "busy",
        "4",
        &[
            ("NUVEC_DISTRIBUTED_TIMEOUT", "60"),
            ("NUVEC_DISTRIBUTED_LINK_TIMEOUT", "1"),
            ("NUVEC_DISTRIBUTED_WARN_AFTER", "1"),
        ],
    );
    every_rank_completes_and_rank_zero_warns(&finished, 2, 4.0);
}

#[test]
fn with_no_timeout_a_stopped_rank_is_waited_for_with_warnings_until_it_is_continued() {
    if procs::is_child(CHILD_TEST) {
        return;
    }
    let finished = job(
        "stopped-rank",
        "stopped",
        "5",
        &[
            ("NUVEC_DISTRIBUTED_TIMEOUT", "0"),
            ("NUVEC_DISTRIBUTED_LINK_TIMEOUT", "1"),
            ("NUVEC_DISTRIBUTED_WARN_AFTER", "1"),
        ],
    );
    every_rank_completes_and_rank_zero_warns(&finished, 3, 5.0);
    let waited: u64 = finished[0]
        .output
        .lines()
        .find_map(|l| l.split_once("WAITED_MS ").map(|(_, ms)| ms.trim()))
        .and_then(|ms| ms.parse().ok())
        .expect("rank 0's wait");
    assert!(
        waited >= 4000,
        "rank 0 waited only {waited} ms for a 5 s stop"
    );
}

#[test]
fn by_default_a_rank_busy_for_longer_than_thirty_seconds_is_waited_for_with_one_warning() {
    if procs::is_child(CHILD_TEST) {
        return;
    }
    // The defaults, all three: a 10 minute backstop, a 15 s link timeout (the busy rank's
    // window stays closed for twice that) and the first warning after 30 s. The one test of
    // the defaults, and a long one.
    let finished = job("busy-rank-defaults", "busy", "33", &[]);
    every_rank_completes_and_rank_zero_warns(&finished, 1, 33.0);
    let zero = warnings(&finished[0].output);
    assert_eq!(zero.len(), 1, "{zero:?}");
    assert!(zero[0].contains("has waited 30 s"), "{}", zero[0]);
}
