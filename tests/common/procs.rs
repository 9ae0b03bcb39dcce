//! Multi-process jobs for tests: spawn one process per rank, wait with a bound, kill all on

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

/// A scratch directory of this test process, fresh for this name: removed when the test that
/// made it ends (the directory of this process's scratches too, once it is empty), kept when
/// the test fails, with its ranks' logs in it.
pub fn scratch(name: &str) -> Scratch {
    Scratch(nuvec_local::scratch(name).expect("create a scratch directory"))
}

/// A test's scratch directory (see [`scratch`]): a [`Path`] while it lives. Bind it to a name
/// that lives as long as the directory is used: a temporary (`scratch(name).join(file)`) takes
/// the directory with it at the end of its statement.
pub struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            nuvec_local::remove_scratch(&self.0);
        }
    }
}

/// Writes MLX's ring hostfile for `nodes` into `dir` and returns its path.
pub fn write_hostfile(dir: &Path, nodes: &[Vec<String>]) -> PathBuf {
    nuvec_local::write_hostfile(dir, nodes).expect("write the hostfile")
}

/// The name the test harness gives `test`: a test's path as
/// `concat!(module_path!(), "::name")` spells it in the test's own module, less the crate's
/// name (the harness leaves that out). Written so, a test's name follows it when its file
/// moves to another module or binary, and `--exact` keeps finding it.
pub fn harness_name(test: &str) -> &str {
    test.split_once("::").map_or(test, |(_, path)| path)
}

/// The command line that re-runs this test binary running only `test` (a path as
/// [`harness_name`] takes it), its output not captured, on one thread.
pub fn this_test_argv(test: &str) -> Vec<String> {
    let exe = std::env::current_exe().expect("current test binary");
    [
        exe.display().to_string(),
        harness_name(test).to_owned(),
        "--exact".to_owned(),
        "--nocapture".to_owned(),
        "--test-threads=1".to_owned(),
    ]
    .into()
}

/// A command that re-runs this test binary as a child running only `test` (a path as
/// [`harness_name`] takes it), with [`CHILD`] saying so.
pub fn this_test(test: &str) -> Command {
    let argv = this_test_argv(test);
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]);
    cmd.env(CHILD, test);
    cmd
}

/// Whether this process is a child running as a rank of `test` (the path given to
/// [`this_test`]).
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
