//! One process run to its end with a bound, the process tree around it, and the tagged lines
//! of a job's output: what the tests of the launchers and of the cluster observe from outside.
//!
//! `nuvec-launch` (`launch/src/main.rs`) walks process trees and kills them too; these
//! functions are written again on purpose: they are how the tests check that the launcher left
//! no process behind, and a check that called the launcher's own code would share its
//! mistakes.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A finished command.
pub struct Ran {
    /// Its exit code (`None`: ended by a signal).
    pub code: Option<i32>,
    /// Its standard output.
    pub stdout: String,
    /// Its standard error.
    pub stderr: String,
    /// How long it ran.
    pub elapsed: Duration,
}

impl Ran {
    /// Standard output, then standard error.
    pub fn output(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }

    /// Exit, time and both outputs, for a failed assertion.
    pub fn describe(&self) -> String {
        format!(
            "exit {:?} after {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.code, self.elapsed, self.stdout, self.stderr
        )
    }
}

/// Runs `cmd` to its end with its output captured and no standard input; kills it and its
/// descendants and fails the test (with what it printed) if it takes longer than `limit`.
pub fn run(cmd: &mut Command, limit: Duration) -> Ran {
    run_fed(cmd, None, limit)
}

/// As [`run`], with `input` written to the command's standard input, which is then closed.
pub fn run_with_input(cmd: &mut Command, input: &[u8], limit: Duration) -> Ran {
    run_fed(cmd, Some(input), limit)
}

fn run_fed(cmd: &mut Command, input: Option<&[u8]>, limit: Duration) -> Ran {
    let start = Instant::now();
    let mut child = cmd
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    if let (Some(input), Some(mut stdin)) = (input, child.stdin.take()) {
        // Small inputs only: a pipe holds them whole, so this cannot wait on the child.
        stdin
            .write_all(input)
            .unwrap_or_else(|e| panic!("write {cmd:?}'s input: {e}"));
    }
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let output = match rx.recv_timeout(limit) {
        Ok(output) => output.unwrap_or_else(|e| panic!("wait for {cmd:?}: {e}")),
        Err(_) => {
            let mut pids = descendants(pid);
            pids.push(pid);
            kill("KILL", &pids);
            let partial = rx.recv_timeout(Duration::from_secs(10));
            let text = partial
                .ok()
                .and_then(Result::ok)
                .map(|o| {
                    format!(
                        "{}\n{}",
                        String::from_utf8_lossy(&o.stdout),
                        String::from_utf8_lossy(&o.stderr)
                    )
                })
                .unwrap_or_default();
            panic!("{cmd:?} did not end within {limit:?}; killed it\n{text}");
        }
    };
    Ran {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        elapsed: start.elapsed(),
    }
}

/// `pid`'s descendants, from one `ps` snapshot.
pub fn descendants(pid: u32) -> Vec<u32> {
    let out = Command::new("ps")
        .args(["-A", "-o", "pid=", "-o", "ppid="])
        .output()
        .expect("ps");
    let pairs: Vec<(u32, u32)> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            Some((w.next()?.parse().ok()?, w.next()?.parse().ok()?))
        })
        .collect();
    let mut found = vec![pid];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        for &(p, pp) in &pairs {
            if pp == parent && !found.contains(&p) {
                found.push(p);
            }
        }
        i += 1;
    }
    found.remove(0);
    found
}

/// Sends `signal` (`KILL`, `TERM`, …) to `pids`, those already gone ignored.
pub fn kill(signal: &str, pids: &[u32]) {
    if pids.is_empty() {
        return;
    }
    let _ = Command::new("kill")
        .args(["-s", signal])
        .args(pids.iter().map(u32::to_string))
        .stderr(Stdio::null())
        .status();
}

/// Whether `pid` has ended (gone, or a zombie nobody has reaped yet).
pub fn ended(pid: u32) -> bool {
    let out = Command::new("ps")
        .args(["-o", "stat=", "-p", &pid.to_string()])
        .output()
        .expect("ps");
    let stat = String::from_utf8_lossy(&out.stdout);
    stat.trim().is_empty() || stat.trim_start().starts_with('Z')
}

/// The lines of `stream` as they come, read on a thread of their own: `Some(line)` each,
/// then `None` at its end (or on a read error), so that a test can wait for a line with
/// `recv_timeout`.
pub fn lines(stream: impl Read + Send + 'static) -> mpsc::Receiver<Option<String>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { break };
            if tx.send(Some(line)).is_err() {
                return;
            }
        }
        let _ = tx.send(None);
    });
    rx
}

/// The payloads of a job's `TAG ...` lines by rank: the rank is the `[rank R] ` prefix
/// `nuvec-launch` puts on every line, or (mlx.launch puts none) the payload's `rank=R`; for
/// `DUMP` lines, which carry their rank first (`DUMP R json`), that rank. Fails the test on a
/// line without a rank or on two lines of one rank.
pub fn tagged(output: &str, tag: &str) -> BTreeMap<usize, String> {
    let mut found = BTreeMap::new();
    for line in output.lines() {
        let Some(at) = line.find(&format!("{tag} ")) else {
            continue;
        };
        let payload = line[at + tag.len() + 1..].trim_end();
        let (rank, rest) = if tag == "DUMP" {
            let (r, rest) = payload.split_once(' ').expect("DUMP rank json");
            (r.parse().expect("rank"), rest.to_owned())
        } else {
            let r = line
                .strip_prefix("[rank ")
                .and_then(|l| l.split_once(']'))
                .map(|(r, _)| r.parse().expect("rank"))
                .or_else(|| {
                    payload
                        .strip_prefix("rank=")
                        .and_then(|p| p.split(' ').next())
                        .and_then(|r| r.parse().ok())
                })
                .unwrap_or_else(|| panic!("no [rank R] prefix or rank=R in {line:?}"));
            (r, payload.to_owned())
        };
        assert!(
            found.insert(rank, rest).is_none(),
            "two {tag} lines for rank {rank}"
        );
    }
    found
}

/// As a rank of a launched job: joins the group the launch environment describes
/// (`nuvec_distributed::init`), all_sums `[rank, 1]` over it and returns
/// `rank=R size=N sum=[S, N]` for a `RESULT` line.
pub fn launched_all_sum() -> String {
    use nuvec_core::{array, distributed};
    let group = nuvec_distributed::init(true).expect("init from the launcher's environment");
    let (r, n) = (group.rank(), group.size());
    let total = distributed::all_sum(&array![r as f32, 1.0], None)
        .to_vec::<f32>()
        .expect("all_sum");
    format!("rank={r} size={n} sum={total:?}")
}
