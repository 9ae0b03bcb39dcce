//! A job's record directory: where its ranks write their flight records, how the launcher
//! asks for them and brings back those of remote hosts.
//!
//! Every rank gets `NUVEC_DISTRIBUTED_RECORD_DIR` (a `--env` of the same name wins): for
//! local ranks a directory this launcher makes per job (`nuvec-launch-PID-records` in the
//! temporary directory, removed at the end, by the watchdog too if the launcher dies), or
//! `--dump-records DIR`, which is kept; for a remote rank a path on its host
//! (`/tmp/nuvec-launch-records-PID-TIME`, made by the script's [`RecordDir::remote_prelude`], removed at the end: after
//! the records are fetched, or at once when there is nothing to keep). What a rank writes there is the contract described in
//! [`crate::records`].
//!
//! Asking ([`RecordDir::request`]): the file `request` is written with a new id, atomically
//! (a temporary file renamed over it), here and on every remote host through `ssh`; each
//! rank answers by rewriting `rank-R.jsonl` with that id in its header. Remote files come
//! back with `ssh HOST cat` ([`RecordDir::fetch`]), best effort and bounded in time, with
//! the options the ranks were started with.
//!
//! This file has side effects (files, ssh) and is tested end to end
//! (`tests/processes/launch.rs`); what is read is parsed by the pure [`crate::records`].

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::records::{self, Progress, Record};
use crate::script::shell_quote;

/// The variable naming the directory.
pub(crate) const RECORD_DIR_VAR: &str = "NUVEC_DISTRIBUTED_RECORD_DIR";

/// How long the launcher waits for the ranks to answer a request.
pub(crate) const ANSWER_WAIT: Duration = Duration::from_secs(2);

/// How long fetching the remote records may take, for all hosts together.
const FETCH_WAIT: Duration = Duration::from_secs(5);

/// A job's record directory.
pub(crate) struct RecordDir {
    /// The local directory.
    path: PathBuf,
    /// Whether it is kept at the end (`--dump-records`).
    keep: bool,
    /// The directory on remote hosts.
    remote: String,
    /// The last request id.
    request: u64,
    /// The ssh commands that wrote a request on a remote host, reaped at the end.
    requests: Vec<Child>,
}

impl RecordDir {
    /// Makes the job's directory: `dump` (created if need be, kept) or a fresh one in the
    /// temporary directory (removed when dropped).
    ///
    /// # Errors
    ///
    /// The directory and the system's message.
    pub(crate) fn create(dump: Option<&Path>) -> Result<RecordDir, String> {
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros());
        let pid = std::process::id();
        let remote = format!("/tmp/nuvec-launch-records-{pid}-{stamp}");
        if let Some(dir) = dump {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            clear_previous_job(dir)?;
            return Ok(RecordDir {
                path: dir.to_path_buf(),
                keep: true,
                remote,
                request: 0,
                requests: Vec::new(),
            });
        }
        let base = std::env::temp_dir();
        for attempt in 0..100 {
            let name = if attempt == 0 {
                format!("nuvec-launch-{pid}-records")
            } else {
                format!("nuvec-launch-{pid}-records-{attempt}")
            };
            let path = base.join(name);
            match std::fs::create_dir(&path) {
                Ok(()) => {
                    return Ok(RecordDir {
                        path,
                        keep: false,
                        remote,
                        request: 0,
                        requests: Vec::new(),
                    });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(format!("{}: {e}", path.display())),
            }
        }
        Err(format!("{}: no free name for the records", base.display()))
    }

    /// The local directory.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the directory is removed at the end (the watchdog must remove it too).
    pub(crate) fn temporary(&self) -> bool {
        !self.keep
    }

    /// The shell words a remote rank's script starts with: make the directory, export it.
    pub(crate) fn remote_prelude(&self) -> String {
        let dir = shell_quote(&self.remote);
        format!("mkdir -p {dir} 2>/dev/null; export {RECORD_DIR_VAR}={dir}; ")
    }

    /// Asks every rank for its record: writes `request` with a new id here and, through ssh,
    /// on each of `hosts`. Returns the id.
    pub(crate) fn request(&mut self, hosts: &[String]) -> u64 {
        self.request += 1;
        let id = self.request;
        let tmp = self.path.join("request.tmp");
        let written = std::fs::File::create(&tmp)
            .and_then(|mut f| writeln!(f, "{id}"))
            .and_then(|()| std::fs::rename(&tmp, self.path.join("request")));
        if let Err(e) = written {
            crate::warn(&format!(
                "cannot write the records' request in {}: {e}",
                self.path.display()
            ));
        }
        let dir = shell_quote(&self.remote);
        for host in hosts {
            let script =
                format!("echo {id} > {dir}/request.tmp && mv -f {dir}/request.tmp {dir}/request");
            if let Ok(child) = ssh(host, &script).stdout(Stdio::null()).spawn() {
                self.requests.push(child);
            }
        }
        id
    }

    /// The records in the directory and the problems met reading them.
    pub(crate) fn read(&self) -> (Vec<Record>, Vec<String>) {
        records::read_dir(&self.path).unwrap_or_else(|e| (Vec::new(), vec![e]))
    }

    /// Every rank's `rank-R.progress` that can be read.
    pub(crate) fn progress(&self) -> Vec<Progress> {
        let Ok(entries) = std::fs::read_dir(&self.path) else {
            return Vec::new();
        };
        entries
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().ends_with(".progress"))
            .filter_map(|e| std::fs::read_to_string(e.path()).ok())
            .filter_map(|t| records::parse_progress(&t))
            .collect()
    }

    /// Copies the records of remote ranks (`(rank, host)`) here with `ssh HOST cat`, at most
    /// [`FETCH_WAIT`] in all; with `remove`, the remote directory is removed after, once every
    /// copy has ended: hosts that share a file system (a home directory over NFS, or namespaces
    /// on one machine), or ranks that share a host, share the directory, so removing it with one
    /// rank's copy would lose the others' records. A host where a copy ran out of time keeps
    /// its directory (its records are still there to fetch by hand).
    pub(crate) fn fetch(&self, ranks: &[(usize, String)], remove: bool) {
        let unfinished = self.copy_remote(ranks, "jsonl");
        if remove {
            self.remove_remote(ranks, &unfinished);
        }
    }

    /// Copies the progress files of remote ranks (`(rank, host)`) here, at most
    /// [`FETCH_WAIT`] in all: they are written on the ranks' own hosts, where `--hang-report`
    /// cannot see them change.
    pub(crate) fn fetch_progress(&self, ranks: &[(usize, String)]) {
        self.copy_remote(ranks, "progress");
    }

    /// Copies each remote rank's `rank-R.EXT` (`ext`) here with `ssh HOST cat`, through a
    /// `.part` file renamed once whole and not empty, at most [`FETCH_WAIT`] in all. Returns
    /// the hosts where a copy ran out of time.
    fn copy_remote<'a>(&self, ranks: &'a [(usize, String)], ext: &str) -> Vec<&'a str> {
        let dir = shell_quote(&self.remote);
        let mut running: Vec<(usize, &str, Child)> = Vec::new();
        let mut unfinished: Vec<&str> = Vec::new();
        for (rank, host) in ranks {
            let script = format!("cat {dir}/rank-{rank}.{ext}");
            let part = self.path.join(format!("rank-{rank}.{ext}.part"));
            let Ok(file) = std::fs::File::create(&part) else {
                continue;
            };
            if let Ok(child) = ssh(host, &script).stdout(Stdio::from(file)).spawn() {
                running.push((*rank, host.as_str(), child));
            }
        }
        let deadline = Instant::now() + FETCH_WAIT;
        for (rank, host, mut child) in running {
            let part = self.path.join(format!("rank-{rank}.{ext}.part"));
            let ok = wait_until(&mut child, deadline).unwrap_or_else(|| {
                unfinished.push(host);
                false
            });
            let size = std::fs::metadata(&part).map_or(0, |m| m.len());
            if ok && size > 0 {
                let _ = std::fs::rename(&part, self.path.join(format!("rank-{rank}.{ext}")));
            } else {
                let _ = std::fs::remove_file(&part);
            }
        }
        unfinished
    }

    /// Removes the remote directory on the hosts of `ranks` (`(rank, host)`), but on those in
    /// `except`, with `ssh HOST rm -rf`, at most [`FETCH_WAIT`] in all.
    pub(crate) fn remove_remote(&self, ranks: &[(usize, String)], except: &[&str]) {
        let dir = shell_quote(&self.remote);
        let mut hosts: Vec<&str> = ranks.iter().map(|(_, host)| host.as_str()).collect();
        hosts.sort_unstable();
        hosts.dedup();
        hosts.retain(|host| !except.contains(host));
        let removing: Vec<Child> = hosts
            .into_iter()
            .filter_map(|host| ssh(host, &format!("rm -rf {dir}")).spawn().ok())
            .collect();
        // As long again as the copies could take: a short ssh command each.
        let deadline = Instant::now() + FETCH_WAIT;
        for mut child in removing {
            let _ = wait_until(&mut child, deadline);
        }
    }

    /// Ends the ssh commands that wrote requests.
    fn reap_requests(&mut self) {
        for mut child in self.requests.drain(..) {
            if !matches!(child.try_wait(), Ok(Some(_))) {
                let _ = child.kill();
            }
            let _ = child.wait();
        }
    }
}

impl Drop for RecordDir {
    fn drop(&mut self) {
        self.reap_requests();
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// `ssh HOST SCRIPT` with the ranks' log level, no standard input, its errors discarded.
fn ssh(host: &str, script: &str) -> Command {
    let mut cmd = Command::new("ssh");
    cmd.args(["-o", "LogLevel=ERROR", "-o", "BatchMode=yes", host, script])
        .stdin(Stdio::null())
        .stderr(Stdio::null());
    cmd
}

/// Waits for `child` until `deadline`, then kills it: whether it succeeded, `None` when it
/// was cut off. Nothing to wake on but the child's end (a short ssh command): it is polled.
fn wait_until(child: &mut Child, deadline: Instant) -> Option<bool> {
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status.success()),
            Ok(None) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
}

/// Removes what an earlier job left in a kept records directory (`--dump-records DIR` used
/// again): its `request` (whose id this job's first request would repeat, so that the ranks
/// took it as answered already), its records and its progress files (which a rank of this job
/// that leaves none would be diagnosed by). Other files are left alone.
///
/// # Errors
///
/// A file that cannot be removed, with the system's message.
fn clear_previous_job(dir: &Path) -> Result<(), String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name().to_string_lossy().into_owned();
        // `rank-R.*`, and `rank-pid-N.*` of ranks started without a rank variable.
        let ours = name == "request"
            || name == "request.tmp"
            || ((records::rank_of(&name).is_some() || name.starts_with("rank-pid-"))
                && [".jsonl", ".jsonl.part", ".progress", ".progress.part"]
                    .iter()
                    .any(|end| name.ends_with(end)));
        if ours {
            let path = entry.path();
            std::fs::remove_file(&path).map_err(|e| {
                format!(
                    "{}: cannot remove an earlier job's file: {e}",
                    path.display()
                )
            })?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_records_directory_used_again_loses_the_earlier_jobs_files_and_keeps_others() {
        let dir = std::env::temp_dir().join(format!("nuvec-launch-clear-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a directory");
        let earlier = [
            "request",
            "rank-0.jsonl",
            "rank-12.progress",
            "rank-3.jsonl.part",
            "rank-pid-4242.jsonl",
        ];
        let others = ["notes.txt", "rank-summary.jsonl"];
        for name in earlier.iter().chain(&others) {
            std::fs::write(dir.join(name), "1\n").expect("a file");
        }
        let records = RecordDir::create(Some(&dir)).expect("the directory");
        let mut left: Vec<String> = std::fs::read_dir(records.path())
            .expect("the directory")
            .map(|e| {
                e.expect("an entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        left.sort();
        assert_eq!(left, others);
        std::fs::remove_dir_all(&dir).expect("removed");
    }
}
