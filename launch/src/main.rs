//! `nuvec-launch`: MLX's `mlx.launch` for the ring and JACCL backends, without Python.
//!
//! ```text
//! nuvec-launch -n 4 target/release/examples/all_sum               # 4 local ranks, ring
//! nuvec-launch --hosts 10.0.0.1,10.0.0.2 ./my_program             # one rank per host, ssh
//! nuvec-launch --hostfile jaccl.json --backend jaccl-ring ./prog  # MLX's JSON host file
//! nuvec-launch config --hosts mac1,mac2 --output-hostfile h.json  # mlx.distributed_config
//! ```
//!
//! `nuvec-launch config ...` and `nuvec-launch doctor ...` (first argument `config` or
//! `doctor`) are [`config`]'s and [`doctor`]'s (`probe`, hidden, is the doctor's probe); a
//! program of any of these names is launched as `nuvec-launch -- config`. How a rank's
//! process is made (its command, the shared generated file) is [`start`]'s, shared with the
//! doctor's probes.
//!
//! The command line ([`args`]), the hosts ([`hosts`]), the ports, the hostfile
//! (`MLX_HOSTFILE`) or device file (`MLX_IBV_DEVICES`) and the exported variables ([`plan`])
//! and the scripts sent through `ssh` ([`script`]) are `mlx.launch`'s; this file starts and
//! supervises the processes. Ranks on `127.0.0.1` or `localhost` are started directly, with
//! one shared temporary file that is removed when the job ends; other ranks are started with
//! `ssh -tt HOST SCRIPT`, the script `mlx.launch` sends (it writes the file with `mktemp` on
//! that host).
//!
//! This file is the one job of supervising a job's processes (`Job`: start, relay output and
//! standard input, stop on the first failure, tear down); everything that can be decided
//! without a process is in the modules above, unit-tested.
//!
//! Each line a rank prints goes to the same stream of `nuvec-launch`, prefixed with
//! `[rank R] `, and standard input is copied to every rank (only while `nuvec-launch` is in
//! the terminal's foreground when standard input is a terminal). When a rank exits with a
//! failure, every other rank is stopped ([`failure::SETTLE`] later, so that a rank already
//! failing on its own is reaped as a failure: SIGTERM to it and its descendants, SIGKILL
//! after 5 s; remote ranks also through `mlx.launch`'s PID-file kill script). Then the
//! failure summary ([`failure`]) names the first rank to fail *by time* (not the lowest
//! rank), with its status or signal and its last lines, keeps MLX's `Node with rank R exited
//! with code C` lines (the culprit's first), says what the others did in consequence, and
//! under it the ranks' flight records, merged ([`records`]); `nuvec-launch` exits with the
//! culprit's status (128 + N when signal N ended it).
//!
//! Every rank gets `NUVEC_DISTRIBUTED_RECORD_DIR`, a directory per job ([`collect`]): the
//! ranks write their flight records there when they fail, when asked, and as they exit.
//! When every rank exits 0 the launcher still merges them: where the ranks' programs disagree
//! (on MLX's wire a mismatched collective returns wrong numbers without an error) it prints
//! them and exits 1. The first Ctrl-C,
//! or `--hang-report S` seconds without a completed operation, asks every rank for its
//! record and prints the merged table (the hang report); the second Ctrl-C stops the job
//! (exit 130). `nuvec-launch diagnose DIR` merges a directory of records left by any
//! launcher (`--dump-records DIR` keeps this one's).
//!
//! # The output pump
//!
//! A thread per rank pipe (stdout, stderr) reads lines and sends them on one bounded
//! `crossbeam_channel`; the main thread is the only writer of this process's stdout and
//! stderr (so lines of different ranks never mix) and waits with `select!` on the lines, a
//! ticker and, while ranks are being stopped, the SIGKILL and give-up deadlines. The readers
//! stay threads because std's pipes only block (polling them needs `unsafe` or `mio`), and a
//! full channel holds a chatty rank back as its pipe did. Exit statuses are still polled
//! (`try_wait` on each tick, [`POLL`]): a thread blocked in `wait` would reap the child while
//! the main thread may still signal its PID, which could by then be another process's.
//!
//! This file is the one that has side effects (processes, pipes, the temporary file, the
//! watchdog, the reports), which is why it is longer than the others (about 1100 lines): the rest of the
//! crate is pure and unit-tested, this file is tested end to end by the main crate's
//! `tests/processes/launch.rs`.
//!
//! Signals: SIGINT is handled (by `signal-hook`'s thread, which turns it into a message on
//! a channel the main loop selects on; installing a handler is `unsafe`, which this crate
//! leaves to that crate). So that a Ctrl-C in the terminal reaches the launcher only, every
//! rank (its process, or its `ssh`) is started in a process group of its own; the ranks
//! never read the terminal (their standard input is a pipe or `/dev/null`), so being out of
//! its foreground group changes nothing for them. SIGTERM, SIGKILL and SIGHUP keep their
//! default action: when `nuvec-launch` itself dies, a small watchdog process (`sh`, in its
//! own process group, which notices the end of its standard input) waits 1 s, sends SIGTERM
//! to the ranks still running and removes the temporary file and record directory.

mod args;
mod collect;
mod config;
mod doctor;
mod failure;
mod hosts;
mod output;
mod plan;
mod records;
mod script;
mod start;
mod table;

use std::io::{BufRead, BufReader, IsTerminal, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, after, never, select, tick};

use crate::failure::{Ending, Exit, Level};
use crate::hosts::HostList;
use crate::plan::{Plan, RankPlan};
use crate::start::TempFile;

/// How long stopped ranks get between SIGTERM and SIGKILL.
const GRACE: Duration = Duration::from_secs(5);
/// How long to wait for killed ranks (and remote kill scripts) after SIGKILL.
const KILL_WAIT: Duration = Duration::from_secs(5);
/// How often the ranks' exit status is checked when nothing else wakes the loop.
const POLL: Duration = Duration::from_millis(20);
/// How long the ranks' output is still forwarded once every rank has exited (a process they
/// left behind may keep their output open).
const DRAIN: Duration = Duration::from_secs(1);

fn main() {
    let code = run();
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    std::process::exit(code);
}

fn run() -> i32 {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if argv.get(1).is_some_and(|a| a == "config") {
        return config::main(argv[1..].to_vec());
    }
    if argv.get(1).is_some_and(|a| a == "doctor") {
        return doctor::main(argv[1..].to_vec());
    }
    if argv.get(1).is_some_and(|a| a == "probe") {
        // Hidden: what `doctor` starts on every host, as a rank.
        return doctor::probe::main(argv[1..].to_vec());
    }
    if argv.get(1).is_some_and(|a| a == "diagnose") {
        return diagnose(&argv[1..]);
    }
    let args = match args::parse(argv) {
        Ok(args) => args,
        Err(e) => return args::exit_code(&e),
    };
    let list = match &args.hostfile {
        Some(path) => HostList::from_file(path),
        None => HostList::from_list(&args.hosts, args.repeat_hosts),
    };
    let list = match list {
        Ok(list) => list,
        Err(e) => return usage_failure(&e),
    };
    for w in &list.warnings {
        warn(w);
    }
    let terminal = plan::terminal_size(
        std::env::var("COLUMNS").ok().as_deref(),
        std::env::var("LINES").ok().as_deref(),
        tty_size(),
    );
    let plan = match plan::plan(&args, list, terminal) {
        Ok(plan) => plan,
        Err(e) => return usage_failure(&e),
    };
    for e in &plan.ignored {
        warn(&format!(
            "'{e}' is an invalid environment variable so it is ignored"
        ));
    }
    info(
        plan.verbose,
        &format!("Running {}", script::shell_join(&args.command)),
    );
    let interrupts = interrupts(plan.verbose);
    let extras = Extras {
        dump_records: args.dump_records.clone(),
        hang_report: args.hang_report,
        interrupts,
    };
    Job::new(plan, extras).run()
}

/// SIGINT as a channel: a thread of `signal-hook` sends one message per Ctrl-C. Installing
/// it replaces the default action (ending this process), which is what lets the first
/// Ctrl-C print the hang report; if it cannot be installed, Ctrl-C ends the launcher as
/// before (its watchdog then stops the ranks).
fn interrupts(verbose: bool) -> Receiver<()> {
    let (tx, rx) = crossbeam_channel::unbounded();
    match signal_hook::iterator::Signals::new([signal_hook::consts::SIGINT]) {
        Ok(mut signals) => {
            std::thread::spawn(move || {
                for _ in signals.forever() {
                    if tx.send(()).is_err() {
                        return;
                    }
                }
            });
        }
        Err(e) => info(verbose, &format!("no SIGINT handler: {e}")),
    }
    rx
}

/// What a job needs besides its plan.
struct Extras {
    /// `--dump-records`.
    dump_records: Option<PathBuf>,
    /// `--hang-report`.
    hang_report: Option<Duration>,
    /// One message per SIGINT.
    interrupts: Receiver<()>,
}

/// `nuvec-launch diagnose [--json] DIR`: prints the merged records of `DIR`; exits 1 when
/// the directory cannot be read or holds no record.
fn diagnose(argv: &[std::ffi::OsString]) -> i32 {
    let args = match args::parse_diagnose(argv) {
        Ok(args) => args,
        Err(e) => return args::exit_code(&e),
    };
    let (found, problems) = match records::read_dir(&args.dir) {
        Ok(read) => read,
        Err(e) => {
            log("31", "[ERROR]", &format!("cannot read the records: {e}"));
            return 1;
        }
    };
    let empty = found.is_empty();
    let diagnosis = records::diagnose(&found, None, &[], &[], problems);
    let text = if args.json {
        match serde_json::to_string_pretty(&diagnosis) {
            Ok(text) => text + "\n",
            Err(e) => {
                log("31", "[ERROR]", &format!("cannot write JSON: {e}"));
                return 1;
            }
        }
    } else {
        records::render(&diagnosis)
    };
    // A closed pipe (`| head`) is not an error worth a panic.
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
    if empty {
        log(
            "31",
            "[ERROR]",
            &format!("no rank-R.jsonl record in {}", args.dir.display()),
        );
        return 1;
    }
    0
}

fn usage_failure(e: &args::UsageError) -> i32 {
    args::exit_code(&args::to_clap(e))
}

/// `mlx.launch`'s log line: `[TAG] message`, coloured when standard error is a terminal.
fn log(color: &str, tag: &str, message: &str) {
    let stderr = std::io::stderr();
    let colored = stderr.is_terminal();
    let mut out = stderr.lock();
    let _ = if colored {
        writeln!(out, "\x1b[{color}m{tag} {message} \x1b[0m")
    } else {
        writeln!(out, "{tag} {message}")
    };
}

fn info(verbose: bool, message: &str) {
    if verbose {
        log("32", "[INFO]", message);
    }
}

fn warn(message: &str) {
    log("33", "[WARN]", message);
}

/// The terminal size of standard output as `(columns, lines)`, from `stty size`.
fn tty_size() -> Option<(i64, i64)> {
    let stdout = std::io::stdout();
    if !stdout.is_terminal() {
        return None;
    }
    let tty = stdout.as_fd().try_clone_to_owned().ok()?;
    let out = Command::new("stty")
        .arg("size")
        .stdin(Stdio::from(tty))
        .stderr(Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?;
    let mut words = text.split_whitespace();
    let lines = words.next()?.parse().ok()?;
    let columns = words.next()?.parse().ok()?;
    Some((columns, lines))
}

/// Whether standard input is copied to the ranks: always unless it is a terminal of which
/// this process is not in the foreground (reading it would stop this process, SIGTTIN).
fn forward_stdin() -> bool {
    if !std::io::stdin().is_terminal() {
        return true;
    }
    Command::new("ps")
        .args(["-o", "stat=", "-p", &std::process::id().to_string()])
        .stderr(Stdio::null())
        .output()
        .is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).contains('+'))
}

/// Sends `signal` (`TERM`, `KILL`) to `pids` with the `kill` command; false if it could not
/// run.
fn signal(signal: &str, pids: &[u32]) -> bool {
    if pids.is_empty() {
        return true;
    }
    Command::new("kill")
        .args(["-s", signal])
        .args(pids.iter().map(u32::to_string))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

/// The descendants of `root` (children first), from one `ps` snapshot.
fn descendants(root: u32) -> Vec<u32> {
    let Ok(out) = Command::new("ps")
        .args(["-A", "-o", "pid=", "-o", "ppid="])
        .stderr(Stdio::null())
        .output()
    else {
        return Vec::new();
    };
    let pairs: Vec<(u32, u32)> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            Some((w.next()?.parse().ok()?, w.next()?.parse().ok()?))
        })
        .collect();
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        for &(pid, ppid) in &pairs {
            if ppid == parent && !found.contains(&pid) {
                found.push(pid);
            }
        }
        i += 1;
    }
    found.remove(0);
    found
}

/// How a process ended, from its status.
fn ending(status: &ExitStatus) -> Ending {
    match (status.code(), status.signal()) {
        (Some(code), _) => Ending::Code(code),
        (None, Some(sig)) => Ending::Signal(sig),
        (None, None) => Ending::Code(1),
    }
}

/// The watchdog: `sh` in its own process group that learns the ranks' PIDs on its standard
/// input (`add PID`, `del PID`). When its input ends while ranks are listed (this process
/// died without stopping them), it waits 1 s, sends them SIGTERM, waits up to 5 s for them to
/// end, and removes the temporary files in any case.
const WATCHDOG: &str = r#"pids=
while IFS= read -r line; do
  case $line in
    "add "*) pids="$pids ${line#add }" ;;
    "del "*) keep=; for p in $pids; do [ "$p" = "${line#del }" ] || keep="$keep $p"; done; pids=$keep ;;
  esac
done
alive() { for p in $pids; do kill -0 "$p" 2>/dev/null && return 0; done; return 1; }
if [ -n "$pids" ]; then
  sleep 1
  if alive; then
    kill -s TERM $pids 2>/dev/null
    i=0
    while [ $i -lt 50 ] && alive; do sleep 0.1; i=$((i+1)); done
  fi
fi
rm -rf -- "$@"
"#;

struct Watchdog(Option<(Child, ChildStdin)>);

impl Watchdog {
    fn start(files: &[&Path], verbose: bool) -> Watchdog {
        let spawned = Command::new("sh")
            .arg("-c")
            .arg(WATCHDOG)
            .arg("nuvec-launch-watchdog")
            .args(files)
            .stdin(Stdio::piped())
            .process_group(0)
            .spawn();
        match spawned {
            Ok(mut child) => match child.stdin.take() {
                Some(stdin) => Watchdog(Some((child, stdin))),
                None => Watchdog(None),
            },
            Err(e) => {
                info(verbose, &format!("no watchdog (sh: {e})"));
                Watchdog(None)
            }
        }
    }

    fn tell(&mut self, what: &str, pid: u32) {
        if let Some((_, stdin)) = &mut self.0 {
            let _ = writeln!(stdin, "{what} {pid}");
            let _ = stdin.flush();
        }
    }

    /// Ends the watchdog once every rank it was told about is deleted: it removes the files
    /// (already removed) and exits.
    fn finish(&mut self) {
        if let Some((child, stdin)) = self.0.take() {
            drop(stdin);
            drop(child);
        }
    }
}

/// How many lines of the ranks' output may wait for the main thread before their readers
/// (and so the ranks, once their pipes fill) wait too.
const PENDING_LINES: usize = 1024;

/// What a reader thread tells the main thread about a rank's pipe.
enum Output {
    /// A line (with its `\n`, unless the stream ended without one).
    Line {
        /// The rank.
        rank: usize,
        /// Whether the line is from the rank's standard error.
        stderr: bool,
        /// The bytes.
        line: Vec<u8>,
    },
    /// A rank's stream ended.
    Closed,
}

/// One rank while the job runs.
struct Rank {
    plan: RankPlan,
    child: Option<Child>,
    /// How it ended once known (or the code of a failed start).
    code: Option<Ending>,
    /// When its end was seen: the poll that reaped it and the time since the job started.
    seen: Option<(u64, Duration)>,
    /// Its last lines of standard error (of its terminal too, for an ssh rank, whose
    /// standard error is merged in it), for the failure summary.
    tail: failure::Tail,
    /// Whether this launcher stopped it.
    stopped: bool,
    /// The remote PID file the rank's script printed first (remote ranks only).
    pidfile: Option<String>,
    /// Whether its standard output is still read for the PID file line (remote ranks only).
    awaiting_pidfile: bool,
}

impl Rank {
    /// Whether it was started and has not ended yet.
    fn running(&self) -> bool {
        self.child.is_some() && self.code.is_none()
    }
}

struct Job {
    plan: Plan,
    ranks: Vec<Rank>,
    output: (Sender<Output>, Receiver<Output>),
    open_streams: usize,
    /// Remote kill scripts started to stop remote ranks.
    kill_scripts: Vec<Child>,
    /// When the job started.
    start: Instant,
    /// `--dump-records`, `--hang-report`, the SIGINTs.
    extras: Extras,
    /// The job's record directory, when it could be made.
    records: Option<collect::RecordDir>,
    /// Whether a second Ctrl-C stopped the job.
    interrupted: bool,
    /// How many times the ranks' exit statuses were polled.
    polls: u64,
}

impl Job {
    fn new(plan: Plan, extras: Extras) -> Job {
        let ranks = plan
            .ranks
            .iter()
            .map(|r| Rank {
                plan: r.clone(),
                child: None,
                code: None,
                seen: None,
                tail: failure::Tail::default(),
                stopped: false,
                pidfile: None,
                awaiting_pidfile: !r.local,
            })
            .collect();
        Job {
            plan,
            ranks,
            output: crossbeam_channel::bounded(PENDING_LINES),
            open_streams: 0,
            kill_scripts: Vec::new(),
            start: Instant::now(),
            polls: 0,
            extras,
            records: None,
            interrupted: false,
        }
    }

    fn run(mut self) -> i32 {
        let file = if self.plan.ranks.iter().any(|r| r.local) {
            match TempFile::create(self.plan.file_var, &self.plan.file_bytes()) {
                Ok(f) => Some(f),
                Err(e) => {
                    log(
                        "31",
                        "[ERROR]",
                        &format!("cannot write the {} file: {e}", self.plan.file_var),
                    );
                    return 1;
                }
            }
        } else {
            None
        };
        self.records = match collect::RecordDir::create(self.extras.dump_records.as_deref()) {
            Ok(dir) => Some(dir),
            Err(e) => {
                warn(&format!("no flight records for this job: {e}"));
                None
            }
        };
        let mut files: Vec<&Path> = file.iter().map(TempFile::path).collect();
        if let Some(dir) = self.records.as_ref().filter(|d| d.temporary()) {
            files.push(dir.path());
        }
        let mut watchdog = Watchdog::start(&files, self.plan.verbose);
        let launcher_cwd = std::env::current_dir()
            .map(|d| d.to_string_lossy().into_owned())
            .unwrap_or_else(|_| ".".to_owned());
        let file_path = file
            .as_ref()
            .map(|f| f.path().to_string_lossy().into_owned())
            .unwrap_or_default();

        let stdin_wanted = forward_stdin();
        let mut stdins = Vec::new();
        let mut failed = false;
        for i in 0..self.ranks.len() {
            match self.spawn(i, &file_path, &launcher_cwd, stdin_wanted) {
                Ok(mut child) => {
                    watchdog.tell("add", child.id());
                    stdins.extend(child.stdin.take());
                    self.ranks[i].child = Some(child);
                }
                Err(code) => {
                    self.ranks[i].code = Some(Ending::Code(code));
                    self.ranks[i].seen = Some((0, self.start.elapsed()));
                    failed = true;
                    break;
                }
            }
        }
        if stdin_wanted {
            broadcast_stdin(stdins);
        } else {
            drop(stdins);
        }

        self.supervise(failed, &mut watchdog);
        self.drain();
        self.finish_kill_scripts();
        let mut code = self.summarize();
        if code != 0 && !self.interrupted {
            self.print_records();
        } else if code == 0 && !self.interrupted {
            code = self.check_records();
        } else if let Some(dir) = &self.records {
            // Kept records of remote ranks come back, whatever the outcome; the remote
            // directories of temporary ones go.
            if dir.temporary() {
                dir.remove_remote(&self.remote_ranks(), &[]);
            } else {
                dir.fetch(&self.remote_ranks(), true);
            }
        }
        if let Some(dir) = self.records.as_ref().filter(|d| !d.temporary()) {
            info(
                true,
                &format!("flight records kept in {}", dir.path().display()),
            );
        }
        self.records = None;
        drop(file);
        watchdog.finish();
        code
    }

    /// Prints the failure summary ([`failure::summary`]) and returns the job's status: the
    /// first failure's, 0 when every rank succeeded.
    fn summarize(&self) -> i32 {
        let mut exits: Vec<Exit> = self
            .ranks
            .iter()
            .filter_map(|r| {
                let ending = r.code?;
                let (poll, seen) = r.seen.unwrap_or((u64::MAX, Duration::MAX));
                Some(Exit {
                    rank: r.plan.rank,
                    ending,
                    poll,
                    seen,
                    stopped: r.stopped,
                    tail: r.tail.lines(),
                })
            })
            .collect();
        exits.sort_by_key(|e| (e.poll, e.rank));
        for (level, line) in failure::summary(&exits) {
            match level {
                Level::Error => log("31", "[ERROR]", &line),
                Level::Warn => warn(&line),
            }
        }
        match failure::culprit(&exits) {
            Some(c) => exits[c].ending.status(),
            None if self.interrupted => 128 + libc::SIGINT,
            None => exits
                .iter()
                .find(|e| e.ending.failed())
                .map_or(0, |e| e.ending.status()),
        }
    }

    /// The remote ranks, as `(rank, host)`.
    fn remote_ranks(&self) -> Vec<(usize, String)> {
        remote(&self.ranks, |_| true)
    }

    /// After a failure: the ranks' flight records, merged, under the summary (nothing when
    /// no rank wrote one, as a program that does not use nuvec-distributed).
    fn print_records(&self) {
        if let Some(diagnosis) = self.merged_records() {
            print_diagnosis("the ranks' flight records:", &diagnosis);
        }
    }

    /// After every rank exited 0: the records they wrote as they exited, merged. Where the
    /// ranks' programs disagree, a rank returned numbers computed from another operation's
    /// bytes (MLX's wire carries no call to check): the merged records are printed and the
    /// job's status is 1, not 0.
    fn check_records(&self) -> i32 {
        match self.merged_records() {
            Some(diagnosis) if diagnosis.disagree => {
                print_diagnosis(
                    "every rank exited 0, but the ranks' programs disagree: what some returned \
                     is wrong; the ranks' flight records:",
                    &diagnosis,
                );
                1
            }
            _ => 0,
        }
    }

    /// The job's records (remote ones fetched over ssh, whose directories then go), merged;
    /// `None` when no rank wrote one.
    fn merged_records(&self) -> Option<records::Diagnosis> {
        let dir = self.records.as_ref()?;
        dir.fetch(&self.remote_ranks(), true);
        let (found, problems) = dir.read();
        if found.is_empty() {
            return None;
        }
        // The ranks that failed on their own: one that left no record (a signal) or none
        // with an error (a panic) is named as the cause when the others' errors blame it.
        let ended: Vec<(usize, String)> = self
            .ranks
            .iter()
            .filter(|r| !r.stopped)
            .filter_map(|r| Some((r.plan.rank, r.code.filter(|e| e.failed())?.describe())))
            .collect();
        Some(records::diagnose(
            &found,
            Some(self.ranks.len()),
            &[],
            &ended,
            problems,
        ))
    }

    /// The hang report: asks every rank still running for its record, waits for their
    /// answers (at most [`collect::ANSWER_WAIT`], printing the ranks' output meanwhile) and
    /// prints the merged records.
    fn hang_report(&mut self, why: &str) {
        let hosts: Vec<String> = remote(&self.ranks, Rank::running)
            .into_iter()
            .map(|(_, host)| host)
            .collect();
        let Some(dir) = &mut self.records else {
            warn(&format!("{why}: no record directory, so no report"));
            return;
        };
        let id = dir.request(&hosts);
        let running: std::collections::BTreeSet<usize> = self
            .ranks
            .iter()
            .filter(|r| r.running())
            .map(|r| r.plan.rank)
            .collect();
        let lines = self.output.1.clone();
        let deadline = after(collect::ANSWER_WAIT);
        let look = tick(Duration::from_millis(50));
        loop {
            select! {
                recv(lines) -> output => {
                    if let Ok(output) = output {
                        self.print(output);
                    }
                }
                recv(look) -> _ => {
                    let Some(dir) = &self.records else { return };
                    let (found, _) = dir.read();
                    if running.is_subset(&records::answered(&found, id)) {
                        break;
                    }
                }
                recv(deadline) -> _ => break,
            }
        }
        let remote = self.remote_ranks();
        let Some(dir) = &self.records else { return };
        dir.fetch(&remote, false);
        let (found, problems) = dir.read();
        let gone: Vec<usize> = self
            .ranks
            .iter()
            .filter(|r| !r.running())
            .map(|r| r.plan.rank)
            .collect();
        let diagnosis = records::diagnose(&found, Some(self.ranks.len()), &gone, &[], problems);
        warn(&format!(
            "{why}: where every rank is (request {id}; {} of {} answered):",
            records::answered(&found, id).len(),
            running.len()
        ));
        let _ = std::io::stderr()
            .lock()
            .write_all(records::render(&diagnosis).as_bytes());
    }

    /// Starts rank `i`; on failure reports it and returns the shell's status for it (127 for
    /// a command not found, else 126).
    fn spawn(
        &mut self,
        i: usize,
        file_path: &str,
        launcher_cwd: &str,
        stdin: bool,
    ) -> Result<Child, i32> {
        let rank = self.ranks[i].plan.clone();
        let start = start::rank_command(
            &self.plan,
            &rank,
            file_path,
            launcher_cwd,
            self.records.as_ref(),
        );
        if let Some(line) = &start.cwd_failure {
            self.say(rank.rank, true, line);
        }
        if let Some(shown) = &start.shown {
            info(
                self.plan.verbose,
                &format!("Rank {} on {}: {shown}", rank.rank, rank.host),
            );
        }
        let mut cmd = start.command;
        // Its own process group: a Ctrl-C in the terminal reaches this launcher only, which
        // reports, then stops the ranks itself.
        cmd.stdin(if stdin { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        match cmd.spawn() {
            Ok(mut child) => {
                if let Some(out) = child.stdout.take() {
                    self.read(rank.rank, out, false);
                }
                if let Some(err) = child.stderr.take() {
                    self.read(rank.rank, err, true);
                }
                Ok(child)
            }
            Err(e) => {
                let program = if rank.local {
                    &self.plan.command[0]
                } else {
                    "ssh"
                };
                self.say(
                    rank.rank,
                    true,
                    &format!(
                        "nuvec-launch: cannot run {}: {e}",
                        script::shell_quote(program)
                    ),
                );
                let code = if e.kind() == std::io::ErrorKind::NotFound {
                    127
                } else {
                    126
                };
                Err(code)
            }
        }
    }

    /// Prints one line as if rank `rank` had printed it (kept for the failure summary when
    /// on standard error).
    fn say(&mut self, rank: usize, to_stderr: bool, line: &str) {
        if to_stderr {
            self.keep(rank, line.as_bytes());
        }
        let text = format!("[rank {rank}] {line}\n");
        if to_stderr {
            let _ = std::io::stderr().lock().write_all(text.as_bytes());
        } else {
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(text.as_bytes());
            let _ = out.flush();
        }
    }

    /// Starts the thread that reads a rank's stream line by line and sends each line to the
    /// main thread ([`Job::print`]).
    fn read(&mut self, rank: usize, stream: impl Read + Send + 'static, stderr: bool) {
        self.open_streams += 1;
        let output = self.output.0.clone();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stream);
            loop {
                let mut line = Vec::new();
                match reader.read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
                if output.send(Output::Line { rank, stderr, line }).is_err() {
                    return;
                }
            }
            let _ = output.send(Output::Closed);
        });
    }

    /// Handles what a reader sent: prints a line prefixed with its rank, except a remote
    /// rank's PID file line (its first line that is one, see [`script::pidfile_path`]), which
    /// is kept rather than printed.
    fn print(&mut self, output: Output) {
        let (rank, stderr, line) = match output {
            Output::Closed => {
                self.open_streams -= 1;
                return;
            }
            Output::Line { rank, stderr, line } => (rank, stderr, line),
        };
        let r = &mut self.ranks[rank];
        if !stderr && r.awaiting_pidfile {
            // Lines before the PID file's (a login banner) are the rank's output; only a path
            // `script::pidfile_path` accepts ever reaches the kill script.
            let text = String::from_utf8_lossy(&line);
            if let Some(path) = script::pidfile_path(&text) {
                r.awaiting_pidfile = false;
                r.pidfile = Some(path.to_owned());
                return;
            }
        }
        if stderr || !r.plan.local {
            self.keep(rank, &line);
        }
        let text = output::prefixed(rank, &line);
        if stderr {
            let _ = std::io::stderr().lock().write_all(&text);
        } else {
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(&text);
            let _ = out.flush();
        }
    }

    /// Keeps `line` as one of rank `rank`'s last lines.
    fn keep(&mut self, rank: usize, line: &[u8]) {
        self.ranks[rank].tail.push(&String::from_utf8_lossy(line));
    }

    /// Waits for every rank, printing their output; once one fails (`failed`: a rank could
    /// not start), stops the others, [`failure::SETTLE`] later so that a rank already
    /// failing on its own is reaped rather than stopped.
    fn supervise(&mut self, mut failed: bool, watchdog: &mut Watchdog) {
        let verbose = self.plan.verbose;
        let lines = self.output.1.clone();
        let ticker = tick(POLL);
        // Stopping the ranks still running, SIGKILL for them, then giving up on them.
        let mut stop_at = never();
        let mut kill_at = never();
        let mut give_up_at = never();
        let mut settling = false;
        let mut stopping = false;
        let mut stop_now = false;
        let mut check = true;
        let interrupts = self.extras.interrupts.clone();
        let mut ctrl_c = 0;
        // `--hang-report`: the ranks' progress files, looked at every second.
        let hang = self.extras.hang_report;
        let progress_tick = if hang.is_some() {
            tick(Duration::from_secs(1))
        } else {
            never()
        };
        let mut last_progress = (Vec::new(), Instant::now());
        let mut stall_reported = false;
        // When remote ranks' progress was last fetched, and whether it was said that no
        // rank's progress could be read.
        let mut last_fetch = Instant::now();
        let mut unreadable_said = false;
        loop {
            if check {
                check = false;
                failed |= self.reap(watchdog);
                if !self.ranks.iter().any(Rank::running) {
                    break;
                }
            }
            if failed && !settling {
                settling = true;
                stop_at = after(failure::SETTLE);
            }
            if stop_now && !stopping {
                stopping = true;
                kill_at = after(GRACE);
                // The PID file lines already read, so that the kill scripts can use them.
                while let Ok(output) = lines.try_recv() {
                    self.print(output);
                }
                let mut scripts = Vec::new();
                for r in self.ranks.iter_mut().filter(|r| r.running()) {
                    scripts.extend(stop(r, verbose));
                }
                self.kill_scripts.extend(scripts);
            }
            select! {
                recv(lines) -> output => {
                    if let Ok(output) = output {
                        self.print(output);
                    }
                }
                recv(ticker) -> _ => check = true,
                recv(interrupts) -> _ => {
                    ctrl_c += 1;
                    if ctrl_c == 1 && !stopping {
                        self.hang_report("Ctrl-C (press it again to stop the job)");
                    } else if !stopping {
                        warn("Ctrl-C again: stopping the job");
                        self.interrupted = true;
                        stop_now = true;
                    }
                }
                recv(progress_tick) -> _ => {
                    let Some(dir) = &self.records else { continue };
                    let Some(limit) = hang else { continue };
                    let view = |dir: &collect::RecordDir| {
                        let mut now: Vec<(usize, u64)> =
                            dir.progress().iter().map(|p| (p.rank, p.completed)).collect();
                        now.sort_unstable();
                        now
                    };
                    let mut now = view(dir);
                    let waited = !stopping && last_progress.1.elapsed() >= limit;
                    if waited && now == last_progress.0 && last_fetch.elapsed() >= limit {
                        // Remote ranks write their progress on their own hosts: fetched when
                        // the local view says no rank moved for the whole period, at most once
                        // a period, a report or not (a job that moves again must be seen to).
                        let remote = remote(&self.ranks, Rank::running);
                        if !remote.is_empty() {
                            dir.fetch_progress(&remote);
                            last_fetch = Instant::now();
                            now = view(dir);
                        }
                    }
                    if now != last_progress.0 {
                        last_progress = (now, Instant::now());
                        stall_reported = false;
                    } else if waited && !stall_reported && now.is_empty() {
                        // No rank's progress yet (ranks of Python MLX and programs without
                        // nuvec-distributed write none; a rank may not have started it yet): a
                        // hang cannot be told from a long computation until one does.
                        stall_reported = true;
                        if !unreadable_said {
                            unreadable_said = true;
                            warn(&format!(
                                "--hang-report: no rank's progress could be read in {:.0} s \
                                 (ranks of Python MLX or of programs without nuvec-distributed \
                                 write none): hangs are reported once a rank's can be read; \
                                 Ctrl-C asks for the records",
                                limit.as_secs_f64()
                            ));
                        }
                    } else if waited && !stall_reported {
                        stall_reported = true;
                        self.hang_report(&format!(
                            "no rank completed an operation for {:.0} s",
                            limit.as_secs_f64()
                        ));
                    }
                }
                recv(stop_at) -> _ => {
                    stop_at = never();
                    stop_now = true;
                }
                recv(kill_at) -> _ => {
                    kill_at = never();
                    give_up_at = after(KILL_WAIT);
                    for r in self.ranks.iter_mut().filter(|r| r.running()) {
                        if let Some(child) = &mut r.child {
                            signal("KILL", &descendants(child.id()));
                            let _ = child.kill();
                        }
                    }
                }
                recv(give_up_at) -> _ => {
                    warn("some ranks did not end after SIGKILL; giving up on them");
                    break;
                }
            }
        }
    }

    /// Collects the exit status of every rank that has ended since the last call, with
    /// when it was seen; true if one of them failed on its own (not stopped by the
    /// launcher). The lines saying how each ended are the summary's ([`Job::summarize`]).
    fn reap(&mut self, watchdog: &mut Watchdog) -> bool {
        let verbose = self.plan.verbose;
        self.polls += 1;
        let seen = (self.polls, self.start.elapsed());
        let mut failed = false;
        for r in &mut self.ranks {
            let Some(child) = &mut r.child else { continue };
            if r.code.is_some() {
                continue;
            }
            let status = match child.try_wait() {
                Ok(Some(status)) => status,
                Ok(None) => continue,
                Err(e) => {
                    warn(&format!("cannot wait for rank {}: {e}", r.plan.rank));
                    ExitStatus::from_raw(1 << 8)
                }
            };
            watchdog.tell("del", child.id());
            let end = ending(&status);
            r.code = Some(end);
            r.seen = Some(seen);
            if !end.failed() {
                info(
                    verbose,
                    &format!("Node with rank {} completed", r.plan.rank),
                );
            } else if !r.stopped {
                failed = true;
            }
        }
        failed
    }

    /// Prints what is left of the ranks' output, for at most [`DRAIN`].
    fn drain(&mut self) {
        let lines = self.output.1.clone();
        let deadline = after(DRAIN);
        while self.open_streams > 0 {
            select! {
                recv(lines) -> output => match output {
                    Ok(output) => self.print(output),
                    Err(_) => break,
                },
                recv(deadline) -> _ => break,
            }
        }
    }

    /// Waits for the remote kill scripts, for at most [`GRACE`], then kills them.
    fn finish_kill_scripts(&mut self) {
        let deadline = Instant::now() + GRACE;
        for script in &mut self.kill_scripts {
            loop {
                match script.try_wait() {
                    Ok(Some(_)) | Err(_) => break,
                    Ok(None) if Instant::now() >= deadline => {
                        let _ = script.kill();
                        let _ = script.wait();
                        break;
                    }
                    Ok(None) => {
                        // Nothing to wake on: a kill script is a short ssh command.
                        std::thread::sleep(POLL);
                    }
                }
            }
        }
    }
}

/// The ranks of `ranks` on other hosts for which `which` holds, as `(rank, host)`.
fn remote(ranks: &[Rank], which: impl Fn(&Rank) -> bool) -> Vec<(usize, String)> {
    ranks
        .iter()
        .filter(|r| !r.plan.local && which(r))
        .map(|r| (r.plan.rank, r.plan.host.clone()))
        .collect()
}

/// Stops a running rank: SIGTERM to its process and its descendants; for a remote rank also
/// the kill script through ssh (`mlx.launch`'s SIGTERM, then SIGKILL after [`GRACE`] on the
/// rank's host), when its PID file is known (returned).
fn stop(r: &mut Rank, verbose: bool) -> Option<Child> {
    r.stopped = true;
    let child = r.child.as_mut()?;
    let mut pids = vec![child.id()];
    pids.extend(descendants(child.id()));
    if !signal("TERM", &pids) {
        let _ = child.kill();
    }
    if r.plan.local {
        return None;
    }
    let pidfile = r.pidfile.clone()?;
    let argv = script::kill_command(&r.plan.host, &pidfile, GRACE);
    info(
        verbose,
        &format!(
            "Stopping rank {}: {}",
            r.plan.rank,
            script::shell_join(&argv)
        ),
    );
    Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()
}

/// Copies this process's standard input to every rank's, closing theirs when it ends.
fn broadcast_stdin(stdins: Vec<ChildStdin>) {
    let senders: Vec<Sender<Arc<[u8]>>> = stdins
        .into_iter()
        .map(|mut stdin| {
            let (tx, rx) = crossbeam_channel::unbounded::<Arc<[u8]>>();
            std::thread::spawn(move || {
                for chunk in rx {
                    if stdin
                        .write_all(&chunk)
                        .and_then(|()| stdin.flush())
                        .is_err()
                    {
                        break;
                    }
                }
            });
            tx
        })
        .collect();
    std::thread::spawn(move || {
        let mut input = std::io::stdin().lock();
        let mut buf = vec![0u8; 8192];
        loop {
            match input.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    let chunk: Arc<[u8]> = Arc::from(&buf[..n]);
                    for tx in &senders {
                        let _ = tx.send(Arc::clone(&chunk));
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
    });
}

/// `head` as an error line, then the merged records' table and findings, on stderr.
fn print_diagnosis(head: &str, diagnosis: &records::Diagnosis) {
    log("31", "[ERROR]", head);
    let _ = std::io::stderr()
        .lock()
        .write_all(records::render(diagnosis).as_bytes());
}
