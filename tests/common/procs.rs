//! Multi-process jobs for tests: spawn one process per rank, wait with a bound, kill all on
//! the first failure, and report every rank's output. A thin layer over the workspace's one
//! local launcher (`nuvec-local`): what is the tests' own is re-running this test binary as a
//! rank (`this_test`, `is_child`), one job at a time (`exclusive`), and panicking with every
//! rank's output.
#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

pub use nuvec_local::Finished;
use nuvec_local::{Job, Until};

/// The environment variable that makes a test binary act as one rank of a job.
pub const CHILD: &str = "NUVEC_TEST_CHILD";

/// Holds every other job of this test binary off while one runs: the machines have two cores,
/// and jobs of several processes each would otherwise compete for them.
pub fn exclusive() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A scratch directory of this test process, fresh for this name.
pub fn scratch(name: &str) -> PathBuf {
    nuvec_local::scratch(name).expect("create a scratch directory")
}

/// Writes MLX's ring hostfile for `nodes` into `dir` and returns its path.
pub fn write_hostfile(dir: &Path, nodes: &[Vec<String>]) -> PathBuf {
    nuvec_local::write_hostfile(dir, nodes).expect("write the hostfile")
}

/// A command that re-runs this test binary as a child running only `test`.
pub fn this_test(test: &str) -> Command {
    let mut cmd = Command::new(std::env::current_exe().expect("current test binary"));
    cmd.args([test, "--exact", "--nocapture", "--test-threads=1"]);
    cmd.env(CHILD, test);
    cmd
}

/// Whether this process is a child running as a rank of `test`.
pub fn is_child(test: &str) -> bool {
    std::env::var(CHILD).is_ok_and(|v| v == test)
}

/// Runs one process per command, each with its output going to `dir/rank<r>.log`, until all
/// exit, one fails (then the others are killed), or `timeout` passes (then all are killed).
/// Returns every rank's status and output.
pub fn run_all(dir: &Path, commands: Vec<Command>, timeout: Duration) -> Vec<Finished> {
    run(dir, commands, timeout, Until::FirstFailure)
}

/// As [`run_all`], but waits only until the ranks in `ranks` have exited (whatever their
/// status), then kills the others.
pub fn run_until(
    dir: &Path,
    commands: Vec<Command>,
    timeout: Duration,
    ranks: &[usize],
) -> Vec<Finished> {
    run(dir, commands, timeout, Until::Exited(ranks.to_vec()))
}

/// As [`run_all`], but a failing rank does not stop the others: each runs to its end (or the
/// timeout).
pub fn run_each(dir: &Path, commands: Vec<Command>, timeout: Duration) -> Vec<Finished> {
    run(dir, commands, timeout, Until::Each)
}

/// The job of `commands` in `dir`, through the workspace's one local launcher.
fn run(dir: &Path, commands: Vec<Command>, timeout: Duration, until: Until) -> Vec<Finished> {
    Job::new(dir, commands)
        .timeout(timeout)
        .until(until)
        .run()
        .unwrap_or_else(|e| panic!("running a job of local ranks: {e}"))
}

/// Panics with every rank's output unless all exited with 0.
pub fn assert_all_ok(what: &str, finished: &[Finished]) {
    if finished.iter().all(|f| f.code == Some(0)) {
        return;
    }
    let mut report = format!("{what} failed:\n");
    for (r, f) in finished.iter().enumerate() {
        report += &format!(
            "---- rank {r}: exit {:?} ----\n{}\n",
            f.code,
            f.output.trim_end()
        );
    }
    panic!("{report}");
}
