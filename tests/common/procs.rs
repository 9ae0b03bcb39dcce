//! Multi-process jobs for tests: spawn one process per rank, wait with a bound, kill all on
//! the first failure, and report every rank's output.
#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The environment variable that makes a test binary act as one rank of a job.
pub const CHILD: &str = "NUVEC_TEST_CHILD";

/// One finished rank.
#[derive(Debug)]
pub struct Finished {
    /// Its exit status (`None` if it was killed).
    pub code: Option<i32>,
    /// Its standard output and error, merged.
    pub output: String,
}

/// Holds every other job of this test binary off while one runs: the machines have two cores,
/// and jobs of several processes each would otherwise compete for them.
pub fn exclusive() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A scratch directory under the target directory, fresh for this name.
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir()
        .join(format!("nuvec-dist-tests-{}", std::process::id()))
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create a scratch directory");
    dir
}

/// Writes MLX's ring hostfile for `nodes` into `dir` and returns its path.
pub fn write_hostfile(dir: &Path, nodes: &[Vec<String>]) -> PathBuf {
    let path = dir.join("hostfile.json");
    let text = serde_json::to_string(nodes).expect("hostfile json");
    std::fs::write(&path, text + "\n").expect("write the hostfile");
    path
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
    run(dir, commands, timeout, true, None)
}

/// As [`run_all`], but waits only until the ranks in `ranks` have exited (whatever their
/// status), then kills the others.
pub fn run_until(
    dir: &Path,
    commands: Vec<Command>,
    timeout: Duration,
    ranks: &[usize],
) -> Vec<Finished> {
    run(dir, commands, timeout, false, Some(ranks))
}

/// As [`run_all`], but a failing rank does not stop the others: each runs to its end (or the
/// timeout).
pub fn run_each(dir: &Path, commands: Vec<Command>, timeout: Duration) -> Vec<Finished> {
    run(dir, commands, timeout, false, None)
}

fn run(
    dir: &Path,
    commands: Vec<Command>,
    timeout: Duration,
    stop_on_failure: bool,
    until: Option<&[usize]>,
) -> Vec<Finished> {
    let mut children: Vec<(Child, PathBuf)> = commands
        .into_iter()
        .enumerate()
        .map(|(r, mut cmd)| {
            let log = dir.join(format!("rank{r}.log"));
            let file = std::fs::File::create(&log).expect("rank log");
            let err = file.try_clone().expect("rank log");
            let child = cmd
                .stdin(Stdio::null())
                .stdout(Stdio::from(file))
                .stderr(Stdio::from(err))
                .spawn()
                .unwrap_or_else(|e| panic!("spawning rank {r}: {e}"));
            (child, log)
        })
        .collect();
    let deadline = Instant::now() + timeout;
    let mut codes: Vec<Option<Option<i32>>> = vec![None; children.len()];
    loop {
        for (i, (child, _)) in children.iter_mut().enumerate() {
            if codes[i].is_none()
                && let Ok(Some(status)) = child.try_wait()
            {
                codes[i] = Some(status.code());
            }
        }
        let failed = stop_on_failure
            && codes
                .iter()
                .any(|c| matches!(c, Some(code) if *code != Some(0)));
        let enough = until.is_some_and(|ranks| ranks.iter().all(|&r| codes[r].is_some()));
        if codes.iter().all(Option::is_some) || failed || enough || Instant::now() >= deadline {
            break;
        }
        // Polling the children's status: std has no wait-with-timeout for a set of children.
        std::thread::sleep(Duration::from_millis(20));
    }
    children
        .into_iter()
        .zip(codes)
        .map(|((mut child, log), code)| {
            let code = match code {
                Some(code) => code,
                None => {
                    let _ = child.kill();
                    let _ = child.wait();
                    None
                }
            };
            Finished {
                code,
                output: std::fs::read_to_string(log).unwrap_or_default(),
            }
        })
        .collect()
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
