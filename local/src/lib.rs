//! Local ranks: run N processes as the ranks of one job on this machine, over loopback, and
//! wait for them with a bound. The examples (`-n 4`), `benches/allreduce/` and the process
//! tests (`tests/common/procs.rs`) all start their ranks through [`Job`].
//!
//! ```no_run
//! # fn main() -> Result<(), nuvec_local::Error> {
//! if std::env::var_os("MLX_RANK").is_none() {
//!     // The launcher: this program again, as 4 ranks of a ring of 1 connection per
//!     // neighbour; rank 0's output is shown, the others' kept in `rank<r>.log`.
//!     return nuvec_local::Job::this_program("my-job", 4)?.ring(1)?.run_ok();
//! }
//! // A rank: `nuvec_distributed::init(true)` reads MLX_HOSTFILE and MLX_RANK.
//! # Ok(())
//! # }
//! ```
//!
//! What a job promises: every wait is bounded ([`Job::timeout`]); by default the first rank
//! that fails stops the others ([`Until`] says otherwise); every rank's standard output and
//! error are kept, merged, in `rank<r>.log` of the job's directory and returned
//! ([`Finished::output`]), except rank 0's when [`Job::show_rank0`] sends it to this process's
//! own; a rank left running when the wait ends, or when [`Job::run`] fails, is killed.
//!
//! # Why a crate of the workspace, not a module of `nuvec_distributed`
//!
//! The library's public API is what the README documents: `init`, the backends and their
//! building blocks. Starting processes is a launcher's job, and the README's launcher for local
//! ranks is `nuvec-launch -n 4 -- <program>` (as MLX's is `mlx.launch`, outside `mlx.core`);
//! a second, public way of doing it in the library would be API to keep stable for a
//! convenience of this repository. So this is a dev-dependency of the workspace
//! (`publish = false`): examples, benches and tests may use it, and an example's rank code is
//! what a user copies, its `-n` launcher the equivalent of running it under `nuvec-launch`. It
//! writes its hostfiles with the library's own writer (`nuvec_distributed::hostfile`), so a
//! job reads back exactly what MLX's launcher would give it.
//!
//! Nor is it `nuvec-launch` (`launch/`) as a library: that is a binary for users' programs,
//! local or over ssh, with MLX's options and environment and rank-prefixed output lines; what
//! the workspace's programs need is a call that returns each rank's status and output, and
//! the tests' policies of when to stop ([`Until`]).

use std::ffi::{OsStr, OsString};
use std::fmt::Write as _;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The launch variables of both backends: removed from every rank of
/// [`Job::this_program`] before the job's own are set (a parent's job must not leak into its
/// ranks, and JACCL's `JACCL_*` names would win over the `MLX_*` ones).
pub const LAUNCH_VARS: [&str; 9] = [
    "MLX_RANK",
    "MLX_HOSTFILE",
    "MLX_IBV_DEVICES",
    "MLX_JACCL_COORDINATOR",
    "MLX_JACCL_RING",
    "JACCL_RANK",
    "JACCL_IBV_DEVICES",
    "JACCL_COORDINATOR",
    "JACCL_RING",
];

/// How long [`Job::run`] waits unless [`Job::timeout`] says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// Why a job could not run, or did not succeed.
#[derive(Debug)]
pub enum Error {
    /// Setting the job up, starting a rank or waiting for one failed.
    Io {
        /// What was being done.
        what: String,
        /// The error.
        source: std::io::Error,
    },
    /// A rank exited with a failure, was killed, or did not finish in time.
    Failed(String),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Io { what, source } => write!(f, "{what}: {source}"),
            Error::Failed(report) => f.write_str(report),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            Error::Failed(_) => None,
        }
    }
}

/// Makes an `io::Error` an [`Error::Io`] saying what was being done.
fn io(what: impl FnOnce() -> String) -> impl FnOnce(std::io::Error) -> Error {
    move |source| Error::Io {
        what: what(),
        source,
    }
}

/// When [`Job::run`] stops waiting, before its timeout.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Until {
    /// When every rank has exited, or as soon as one fails (the others are then killed).
    #[default]
    FirstFailure,
    /// When every rank has exited, whatever their status: a failure does not stop the others.
    Each,
    /// As soon as these ranks have exited, whatever their status (the others are then killed).
    Exited(Vec<usize>),
}

/// One finished rank.
#[derive(Debug)]
pub struct Finished {
    /// Its exit status (`None` if it was killed, by a signal or by the job).
    pub code: Option<i32>,
    /// Its standard output and error, merged (empty for a rank shown by
    /// [`Job::show_rank0`]).
    pub output: String,
}

/// A job of local ranks: one command per rank, started together and waited for.
#[derive(Debug)]
pub struct Job {
    /// Where the logs (and any hostfile) go.
    dir: PathBuf,
    /// Rank r's command at index r.
    commands: Vec<Command>,
    /// The bound of the whole wait.
    timeout: Duration,
    /// When the wait ends early.
    until: Until,
    /// Whether rank 0's output goes to this process's own instead of its log.
    show_rank0: bool,
    /// Whether the job made `dir` (and removes it when done).
    owns_dir: bool,
    /// The hostfile [`Job::ring`] wrote.
    hostfile: Option<PathBuf>,
}

impl Job {
    /// A job of `commands`, rank r's at index r, keeping its logs in `dir` (which must exist).
    pub fn new(dir: impl Into<PathBuf>, commands: Vec<Command>) -> Self {
        Job {
            dir: dir.into(),
            commands,
            timeout: DEFAULT_TIMEOUT,
            until: Until::default(),
            show_rank0: false,
            owns_dir: false,
            hostfile: None,
        }
    }

    /// This program run again as `ranks` ranks, in a fresh [`scratch`] directory named
    /// `name` (removed when the job is done: the outputs are returned): each with this
    /// process's arguments, without [`LAUNCH_VARS`], with `MLX_RANK` set; rank 0's output
    /// shown.
    pub fn this_program(name: &str, ranks: usize) -> Result<Self, Error> {
        let exe = std::env::current_exe().map_err(io(|| "finding this program".into()))?;
        let args: Vec<OsString> = std::env::args_os().skip(1).collect();
        let commands = (0..ranks)
            .map(|r| {
                let mut command = Command::new(&exe);
                command.args(&args);
                for var in LAUNCH_VARS {
                    command.env_remove(var);
                }
                command.env("MLX_RANK", r.to_string());
                command
            })
            .collect();
        let mut job = Job::new(scratch(name)?, commands).show_rank0();
        job.owns_dir = true;
        Ok(job)
    }

    /// Makes the job a ring over loopback: `conns` free loopback addresses per rank in a
    /// hostfile `hostfile.json` of the job's directory, named by `MLX_HOSTFILE` on every rank.
    pub fn ring(self, conns: usize) -> Result<Self, Error> {
        let nodes = free_nodes(self.commands.len(), conns)?;
        let path = write_hostfile(&self.dir, &nodes)?;
        let mut job = self.env("MLX_HOSTFILE", &path);
        job.hostfile = Some(path);
        Ok(job)
    }

    /// The hostfile [`ring`](Self::ring) wrote, if it did.
    pub fn hostfile(&self) -> Option<&Path> {
        self.hostfile.as_deref()
    }

    /// Sets `key` to `value` on every rank.
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        for command in &mut self.commands {
            command.env(&key, &value);
        }
        self
    }

    /// Bounds the whole wait (default [`DEFAULT_TIMEOUT`]); the ranks still running then are
    /// killed.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// When the wait ends early (default [`Until::FirstFailure`]).
    pub fn until(mut self, until: Until) -> Self {
        self.until = until;
        self
    }

    /// Sends rank 0's standard output and error to this process's own, as they come (the
    /// others' stay in their logs).
    pub fn show_rank0(mut self) -> Self {
        self.show_rank0 = true;
        self
    }

    /// The job's directory: its logs and any hostfile.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Starts every rank and waits as [`Until`] says, at most the timeout; kills the ranks
    /// still running then. Returns every rank's status and output, rank r's at index r.
    pub fn run(self) -> Result<Vec<Finished>, Error> {
        let mut running = Running(Vec::with_capacity(self.commands.len()));
        for (r, mut command) in self.commands.into_iter().enumerate() {
            let log = self.dir.join(format!("rank{r}.log"));
            command.stdin(Stdio::null());
            if !(self.show_rank0 && r == 0) {
                let file = std::fs::File::create(&log)
                    .map_err(io(|| format!("creating {}", log.display())))?;
                let err = file
                    .try_clone()
                    .map_err(io(|| format!("opening {}", log.display())))?;
                command.stdout(Stdio::from(file)).stderr(Stdio::from(err));
            }
            let child = command
                .spawn()
                .map_err(io(|| format!("starting rank {r}")))?;
            running
                .0
                .push((child, (!(self.show_rank0 && r == 0)).then_some(log)));
        }
        let deadline = Instant::now() + self.timeout;
        let mut codes: Vec<Option<Option<i32>>> = vec![None; running.0.len()];
        loop {
            for (code, (child, _)) in codes.iter_mut().zip(&mut running.0) {
                if code.is_none()
                    && let Some(status) = child.try_wait().map_err(io(|| "waiting".into()))?
                {
                    *code = Some(status.code());
                }
            }
            let done = codes.iter().all(Option::is_some)
                || match &self.until {
                    Until::FirstFailure => codes
                        .iter()
                        .any(|c| matches!(c, Some(code) if *code != Some(0))),
                    Until::Each => false,
                    Until::Exited(ranks) => ranks
                        .iter()
                        .all(|&r| codes.get(r).is_some_and(Option::is_some)),
                };
            if done || Instant::now() >= deadline {
                break;
            }
            // Polling the ranks' status: std has no wait with a timeout for a set of children.
            std::thread::sleep(Duration::from_millis(20));
        }
        let finished = std::mem::take(&mut running.0)
            .into_iter()
            .zip(codes)
            .map(|((mut child, log), code)| {
                let code = code.unwrap_or_else(|| {
                    let _ = child.kill();
                    let _ = child.wait();
                    None
                });
                Finished {
                    code,
                    output: log
                        .and_then(|log| std::fs::read_to_string(log).ok())
                        .unwrap_or_default(),
                }
            })
            .collect();
        if self.owns_dir {
            remove_scratch(&self.dir);
        }
        Ok(finished)
    }

    /// [`run`](Self::run), then [`check`]: an error naming every rank that did not exit with 0,
    /// with its output.
    pub fn run_ok(self) -> Result<(), Error> {
        check(&self.run()?)
    }
}

/// The ranks started so far: killed if [`Job::run`] returns early.
struct Running(Vec<(Child, Option<PathBuf>)>);

impl Drop for Running {
    fn drop(&mut self) {
        for (child, _) in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `Err(Error::Failed)` with the status and output of every rank that did not exit with 0,
/// unless all did.
pub fn check(finished: &[Finished]) -> Result<(), Error> {
    if finished.iter().all(|f| f.code == Some(0)) {
        return Ok(());
    }
    let mut report = String::new();
    for (r, f) in finished.iter().enumerate() {
        if f.code == Some(0) {
            continue;
        }
        let status = match f.code {
            Some(code) => format!("exited with {code}"),
            None => "was killed or did not finish in time".into(),
        };
        let _ = write!(report, "rank {r} {status}");
        if !f.output.trim().is_empty() {
            let _ = write!(report, ":\n{}", f.output.trim_end());
        }
        report.push('\n');
    }
    Err(Error::Failed(report.trim_end().to_owned()))
}

/// A fresh directory `name` under a directory of this process in the system's temporary one.
pub fn scratch(name: &str) -> Result<PathBuf, Error> {
    let dir = std::env::temp_dir()
        .join(format!("nuvec-local-{}", std::process::id()))
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    // Another job of this process removes the process's directory once it is empty (as
    // `Job::run` does when it owns its directory), which can fall between creating that
    // directory and creating `dir` in it: then both are created again, a few times at most.
    let mut tries = 0;
    loop {
        match std::fs::create_dir_all(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && tries < 8 => tries += 1,
            Err(e) => return Err(io(|| format!("creating {}", dir.display()))(e)),
        }
    }
}

/// Removes a directory made by [`scratch`], and the directory of this process's scratches once
/// it holds no other (best effort: what cannot be removed stays).
pub fn remove_scratch(dir: &Path) {
    let _ = std::fs::remove_dir_all(dir);
    if let Some(parent) = dir.parent() {
        let _ = std::fs::remove_dir(parent);
    }
}

/// `ranks` entries of `conns` free loopback addresses each, as MLX's hostfile lists them.
///
/// The ports are found by binding port 0 and releasing it, so another process could take one
/// in between; nothing retries, so a collision shows as a rank's setup error naming the
/// address.
pub fn free_nodes(ranks: usize, conns: usize) -> Result<Vec<Vec<String>>, Error> {
    // Every listener is held until all are bound, so no two entries get the same port.
    let listeners = (0..ranks)
        .map(|_| {
            (0..conns)
                .map(|_| TcpListener::bind("127.0.0.1:0"))
                .collect()
        })
        .collect::<std::io::Result<Vec<Vec<TcpListener>>>>()
        .map_err(io(|| "binding a loopback port".into()))?;
    listeners
        .iter()
        .map(|row| {
            row.iter()
                .map(|l| l.local_addr().map(|a| a.to_string()))
                .collect()
        })
        .collect::<std::io::Result<_>>()
        .map_err(io(|| "reading a loopback port".into()))
}

/// One free loopback address (a port bound and released, as [`free_nodes`]).
pub fn free_address() -> Result<String, Error> {
    let listener =
        TcpListener::bind("127.0.0.1:0").map_err(io(|| "binding a loopback port".into()))?;
    let address = listener
        .local_addr()
        .map_err(io(|| "reading a loopback port".into()))?;
    Ok(address.to_string())
}

/// Writes MLX's ring hostfile for `nodes` as `hostfile.json` in `dir` (the library's
/// [`nuvec_distributed::hostfile::write`]) and returns its path.
pub fn write_hostfile(dir: &Path, nodes: &[Vec<String>]) -> Result<PathBuf, Error> {
    let path = dir.join("hostfile.json");
    let text = nuvec_distributed::hostfile::write(nodes) + "\n";
    std::fs::write(&path, text).map_err(io(|| format!("writing {}", path.display())))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scratch directory removed at the end of a test (with this process's, once empty).
    struct Dir(PathBuf);

    impl Dir {
        fn new(name: &str) -> Self {
            Dir(scratch(name).expect("scratch"))
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            remove_scratch(&self.0);
        }
    }

    /// A command of the shell running `script`.
    fn sh(script: &str) -> Command {
        let mut command = Command::new("sh");
        command.args(["-c", script]);
        command
    }

    #[test]
    fn every_rank_s_output_is_kept_and_returned() {
        let dir = Dir::new("unit-output");
        let finished = Job::new(&dir.0, vec![sh("echo zero"), sh("echo one >&2")])
            .run()
            .expect("run");
        assert_eq!(finished[0].code, Some(0));
        assert_eq!(finished[0].output, "zero\n");
        assert_eq!(finished[1].output, "one\n");
        assert!(dir.0.join("rank1.log").exists());
        assert!(check(&finished).is_ok());
    }

    #[test]
    fn a_failing_rank_stops_the_others() {
        let dir = Dir::new("unit-failure");
        let started = Instant::now();
        let finished = Job::new(&dir.0, vec![sh("echo broken; exit 3"), sh("sleep 30")])
            .timeout(Duration::from_secs(20))
            .run()
            .expect("run");
        assert!(started.elapsed() < Duration::from_secs(10));
        assert_eq!(finished[0].code, Some(3));
        assert_eq!(finished[1].code, None);
        let report = check(&finished).expect_err("a failure").to_string();
        assert!(report.contains("rank 0 exited with 3:\nbroken"), "{report}");
        assert!(report.contains("rank 1 was killed"), "{report}");
    }

    #[test]
    fn each_rank_runs_to_its_end_when_failures_do_not_stop_the_others() {
        let dir = Dir::new("unit-each");
        let finished = Job::new(&dir.0, vec![sh("exit 1"), sh("sleep 0.2; echo done")])
            .until(Until::Each)
            .run()
            .expect("run");
        assert_eq!(finished[0].code, Some(1));
        assert_eq!(finished[1].code, Some(0));
        assert_eq!(finished[1].output, "done\n");
    }

    #[test]
    fn the_timeout_kills_every_rank_still_running() {
        let dir = Dir::new("unit-timeout");
        let started = Instant::now();
        let finished = Job::new(&dir.0, vec![sh("sleep 30")])
            .timeout(Duration::from_millis(200))
            .run()
            .expect("run");
        assert!(started.elapsed() < Duration::from_secs(10));
        assert_eq!(finished[0].code, None);
    }

    #[test]
    fn a_ring_s_hostfile_lists_distinct_loopback_ports_for_every_rank() {
        let dir = Dir::new("unit-ring");
        let job = Job::new(&dir.0, vec![sh("true"), sh("true"), sh("true")])
            .ring(2)
            .expect("ring");
        let path = job.hostfile().expect("a hostfile");
        let nodes = nuvec_distributed::hostfile::read(path).expect("read it back");
        assert_eq!(nodes.len(), 3);
        let mut all: Vec<&String> = nodes.iter().flatten().collect();
        assert!(all.iter().all(|a| a.starts_with("127.0.0.1:")));
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 6);
    }
}
