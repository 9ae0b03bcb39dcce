//! The doctor's side of the probes: starts one on every rank's host exactly as a job's rank
//! is started ([`crate::start::rank_command`]: directly for a local host, `ssh -tt HOST
//! SCRIPT` with `mlx.launch`'s script otherwise, `--cwd` and `--env` included), reads their
//! JSON lines, sends them their commands one at a time (so that no two links are measured at
//! once and each link has the hosts' NICs to itself), and stops them; the same for the ranks
//! of the all_sum sweep, which answer once. Every wait has a deadline.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, Stdio};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use serde_json::{Value, json};

use super::measure::Measurement;
use super::probe::Ready;
use super::sweep::Swept;
use crate::plan::Plan;
use crate::start::{TempFile, rank_command};

/// How long the probes' last lines are waited for once they are told to quit.
const QUIT_WAIT: Duration = Duration::from_secs(2);

/// How long the other ranks of the sweep are waited for once one has failed.
const AFTER_FAILURE: Duration = Duration::from_secs(3);

/// What a reader thread sends: a line of a rank's probe, or the end of one of its streams.
type Line = (usize, Option<String>);

/// The probes of one doctor run.
pub(crate) struct Probes {
    children: Vec<Option<Child>>,
    stdins: Vec<Option<ChildStdin>>,
    lines: Receiver<Line>,
    /// JSON lines received and not consumed yet, per rank.
    pending: Vec<VecDeque<Value>>,
    /// Other lines (ssh's errors, a shell's), per rank: the explanation of a failure.
    notes: Vec<Vec<String>>,
    /// Streams still open, per rank.
    open: Vec<usize>,
    _file: Option<TempFile>,
}

fn reader(rank: usize, stream: impl Read + Send + 'static, tx: Sender<Line>) {
    std::thread::spawn(move || {
        let mut r = BufReader::new(stream);
        loop {
            let mut line = Vec::new();
            match r.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            let text = String::from_utf8_lossy(&line).trim().to_owned();
            if tx.send((rank, Some(text))).is_err() {
                return;
            }
        }
        let _ = tx.send((rank, None));
    });
}

impl Probes {
    /// Starts a probe per rank of `plan` (whose command is the probe's).
    ///
    /// # Errors
    ///
    /// The shared file of local ranks cannot be written.
    pub(crate) fn start(plan: &Plan) -> Result<Probes, String> {
        let n = plan.ranks.len();
        let file = if plan.ranks.iter().any(|r| r.local) {
            Some(
                TempFile::create(plan.file_var, &plan.file_bytes())
                    .map_err(|e| format!("cannot write the {} file: {e}", plan.file_var))?,
            )
        } else {
            None
        };
        let file_path = file
            .as_ref()
            .map(|f| f.path().to_string_lossy().into_owned())
            .unwrap_or_default();
        let launcher_cwd = std::env::current_dir()
            .map(|d| d.to_string_lossy().into_owned())
            .unwrap_or_else(|_| ".".to_owned());
        let (tx, rx) = crossbeam_channel::unbounded();
        let mut probes = Probes {
            children: Vec::with_capacity(n),
            stdins: Vec::with_capacity(n),
            lines: rx,
            pending: vec![VecDeque::new(); n],
            notes: vec![Vec::new(); n],
            open: vec![0; n],
            _file: file,
        };
        for rank in &plan.ranks {
            let start = rank_command(plan, rank, &file_path, &launcher_cwd, None);
            if let Some(line) = start.cwd_failure {
                probes.notes[rank.rank].push(line);
            }
            let mut cmd = start.command;
            cmd.stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .process_group(0);
            match cmd.spawn() {
                Ok(mut child) => {
                    if let Some(out) = child.stdout.take() {
                        probes.open[rank.rank] += 1;
                        reader(rank.rank, out, tx.clone());
                    }
                    if let Some(err) = child.stderr.take() {
                        probes.open[rank.rank] += 1;
                        reader(rank.rank, err, tx.clone());
                    }
                    probes.stdins.push(child.stdin.take());
                    probes.children.push(Some(child));
                }
                Err(e) => {
                    let program = if rank.local {
                        plan.command[0].as_str()
                    } else {
                        "ssh"
                    };
                    probes.notes[rank.rank].push(format!("cannot run {program}: {e}"));
                    probes.stdins.push(None);
                    probes.children.push(None);
                }
            }
        }
        Ok(probes)
    }

    /// Files the lines received until `deadline`, or until rank `rank` has a JSON line
    /// with `key` whose value `wanted` accepts (returned) or has ended. Lines with `key` that
    /// `wanted` refuses (a late answer to an earlier question) are dropped.
    fn wait_for(
        &mut self,
        rank: usize,
        key: &str,
        deadline: Instant,
        wanted: impl Fn(&Value) -> bool,
    ) -> Result<Value, String> {
        loop {
            let pending = &mut self.pending[rank];
            pending.retain(|v| v.get(key).is_none_or(&wanted));
            if let Some(v) = pending
                .iter()
                .position(|v| v.get(key).is_some())
                .and_then(|i| pending.remove(i))
            {
                return Ok(v[key].clone());
            }
            if let Some(e) = pending.iter().find_map(|v| v.get("error")) {
                return Err(format!(
                    "the probe says: {}",
                    e.as_str().unwrap_or_default()
                ));
            }
            if self.open[rank] == 0 {
                return Err(format!("the probe ended{}", self.explain(rank)));
            }
            if !self.receive(deadline) {
                return Err(format!(
                    "no answer from the probe in time{}",
                    self.explain(rank)
                ));
            }
        }
    }

    /// Files the next line received before `deadline`; false when none came.
    fn receive(&mut self, deadline: Instant) -> bool {
        let left = deadline.saturating_duration_since(Instant::now());
        match self.lines.recv_timeout(left) {
            Ok((r, Some(line))) => {
                match serde_json::from_str::<Value>(&line)
                    .ok()
                    .filter(Value::is_object)
                {
                    Some(v) => self.pending[r].push_back(v),
                    None if !line.is_empty() => self.notes[r].push(line),
                    None => {}
                }
                true
            }
            Ok((r, None)) => {
                self.open[r] = self.open[r].saturating_sub(1);
                true
            }
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => false,
        }
    }

    /// Rank `rank`'s outcome of the sweep, if it has one yet: its `swept` line, its error, or
    /// its end.
    fn swept_of(&mut self, rank: usize) -> Option<Result<Swept, String>> {
        let pending = &mut self.pending[rank];
        if let Some(v) = pending
            .iter()
            .position(|v| v.get("swept").is_some())
            .and_then(|i| pending.remove(i))
        {
            return Some(
                serde_json::from_value(v["swept"].clone())
                    .map_err(|e| format!("the probe's sweep line: {e}")),
            );
        }
        if let Some(e) = pending.iter().find_map(|v| v.get("error")) {
            return Some(Err(format!(
                "the probe says: {}",
                e.as_str().unwrap_or_default()
            )));
        }
        (self.open[rank] == 0).then(|| Err(format!("the probe ended{}", self.explain(rank))))
    }

    /// `: ` and the last lines rank `rank`'s probe printed that were not its JSON.
    fn explain(&self, rank: usize) -> String {
        let notes = &self.notes[rank];
        if notes.is_empty() {
            return String::new();
        }
        let from = notes.len().saturating_sub(3);
        format!(": {}", notes[from..].join(" | "))
    }

    /// Waits (until `deadline`) for every probe to say it is ready.
    pub(crate) fn ready(&mut self, deadline: Instant) -> Vec<Result<Ready, String>> {
        (0..self.children.len())
            .map(|rank| {
                if self.children[rank].is_none() {
                    return Err(format!("the probe did not start{}", self.explain(rank)));
                }
                let v = self.wait_for(rank, "ready", deadline, |_| true)?;
                serde_json::from_value(v).map_err(|e| format!("the probe's ready line: {e}"))
            })
            .collect()
    }

    /// Has rank `rank`'s probe measure its link `index`, waiting until `deadline`.
    pub(crate) fn measure(
        &mut self,
        rank: usize,
        index: usize,
        deadline: Instant,
    ) -> Result<Measurement, String> {
        let Some(stdin) = self.stdins[rank].as_mut() else {
            return Err(
                "the probe is not running (it did not start, or was stopped when a link overran)"
                    .to_owned(),
            );
        };
        writeln!(stdin, "{}", json!({ "measure": index }))
            .and_then(|()| stdin.flush())
            .map_err(|e| format!("telling the probe: {e}"))?;
        let this_link = |v: &Value| v["index"].as_u64() == Some(index as u64);
        match self.wait_for(rank, "measured", deadline, this_link) {
            Ok(v) => serde_json::from_value(v["measurement"].clone())
                .map_err(|e| format!("the probe's measurement: {e}")),
            Err(e) => {
                // A probe that overran is still moving bytes: stopped, so that no two links
                // are ever measured at once and no late answer is taken for another link's.
                self.stdins[rank] = None;
                if let Some(child) = self.children[rank].as_mut() {
                    let _ = child.kill();
                    let _ = child.wait();
                }
                Err(format!("{e}; the probe was stopped"))
            }
        }
    }

    /// Waits (until `deadline`) for every rank of the all_sum sweep (probes started with
    /// `--sweep`) to say how it went. Once one has failed, the others get [`AFTER_FAILURE`]
    /// to say why they stopped too (a peer's failure reaches them at once), not the whole
    /// setup timeout of a ring that can no longer form.
    pub(crate) fn swept(&mut self, deadline: Instant) -> Vec<Result<Swept, String>> {
        let n = self.children.len();
        let mut out: Vec<Option<Result<Swept, String>>> = vec![None; n];
        for (rank, o) in out.iter_mut().enumerate() {
            if self.children[rank].is_none() {
                *o = Some(Err(format!(
                    "the probe did not start{}",
                    self.explain(rank)
                )));
            }
        }
        let failed = |o: &Option<Result<Swept, String>>| {
            o.as_ref()
                .is_some_and(|r| r.as_ref().map_or(true, |s| s.error.is_some()))
        };
        let mut cut: Option<(usize, Instant)> = out
            .iter()
            .position(failed)
            .map(|r| (r, Instant::now() + AFTER_FAILURE));
        loop {
            for (rank, o) in out.iter_mut().enumerate() {
                if o.is_none() {
                    *o = self.swept_of(rank);
                    if cut.is_none() && failed(o) {
                        cut = Some((rank, Instant::now() + AFTER_FAILURE));
                    }
                }
            }
            if out.iter().all(Option::is_some) {
                break;
            }
            let until = cut.map_or(deadline, |(_, at)| at.min(deadline));
            if !self.receive(until) {
                break;
            }
        }
        out.into_iter()
            .enumerate()
            .map(|(rank, o)| {
                o.unwrap_or_else(|| {
                    Err(match cut {
                        Some((first, _)) => format!(
                            "no answer {} s after rank {first}'s sweep failed{}",
                            AFTER_FAILURE.as_secs(),
                            self.explain(rank)
                        ),
                        None => format!("no answer from the probe in time{}", self.explain(rank)),
                    })
                })
            })
            .collect()
    }

    /// Tells every probe to quit, gives them [`QUIT_WAIT`], then kills those still running.
    pub(crate) fn stop(mut self) {
        for stdin in self.stdins.iter_mut().flatten() {
            let _ = writeln!(stdin, "{}", json!({ "quit": true }));
            let _ = stdin.flush();
        }
        self.stdins.clear();
        let deadline = Instant::now() + QUIT_WAIT;
        for child in self.children.iter_mut().flatten() {
            loop {
                match child.try_wait() {
                    Ok(Some(_)) | Err(_) => break,
                    Ok(None) if Instant::now() >= deadline => {
                        let _ = child.kill();
                        let _ = child.wait();
                        break;
                    }
                    // Nothing to wake on but the exit: a probe told to quit ends at once.
                    Ok(None) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        }
    }
}
