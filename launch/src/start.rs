//! How a rank is started, for a job (`main.rs`) and for `nuvec-launch doctor`'s probes alike:
//! the command of one rank ([`rank_command`]: directly with the rank's environment for a
//! local host, else `ssh -tt HOST SCRIPT` with `mlx.launch`'s script) and the generated file
//! local ranks share ([`TempFile`]). Nothing here starts a process: the caller spawns the
//! command with the pipes it wants.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::collect::{self, RecordDir};
use crate::plan::{Plan, RankPlan};
use crate::script;

/// A rank's command, ready to spawn.
#[derive(Debug)]
pub(crate) struct Start {
    /// The command: the rank's program (local) or `ssh` (remote).
    pub(crate) command: Command,
    /// A remote rank's ssh command line, for `--verbose`.
    pub(crate) shown: Option<String>,
    /// For a local rank whose `--cwd` is not a directory: the line `mlx.launch` prints for
    /// it (the rank still starts, in the launcher's directory).
    pub(crate) cwd_failure: Option<String>,
}

/// The command that starts `rank` of `plan`: a local rank gets the plan's environment for it
/// ([`Plan::rank_env`], the generated file being `file_path`) and `--cwd`; a remote rank is
/// `ssh -tt HOST SCRIPT` ([`script::launch_script`], which changes to `--cwd` or else to
/// `launcher_cwd`). With `records`, the rank also gets the job's record directory.
pub(crate) fn rank_command(
    plan: &Plan,
    rank: &RankPlan,
    file_path: &str,
    launcher_cwd: &str,
    records: Option<&RecordDir>,
) -> Start {
    if rank.local {
        let mut cmd = Command::new(&plan.command[0]);
        cmd.args(&plan.command[1..]);
        // First, so that a `--env` of the same name wins.
        if let Some(dir) = records {
            cmd.env(collect::RECORD_DIR_VAR, dir.path());
        }
        for (key, value) in plan.rank_env(rank.rank, file_path) {
            cmd.env(key, value);
        }
        let mut cwd_failure = None;
        if let Some(dir) = plan.cwd.as_deref().filter(|d| !d.is_empty()) {
            if Path::new(dir).is_dir() {
                cmd.current_dir(dir);
                if let Ok(abs) = std::fs::canonicalize(dir) {
                    cmd.env("PWD", abs);
                }
            } else {
                cwd_failure = Some(format!(
                    "Failed to change directory to {}",
                    script::shell_quote(dir)
                ));
            }
        }
        return Start {
            command: cmd,
            shown: None,
            cwd_failure,
        };
    }
    let mut script = script::launch_script(plan, rank.rank, launcher_cwd, false);
    if let Some(dir) = records {
        script = dir.remote_prelude() + &script;
    }
    let argv = script::ssh_command(&rank.host, &script);
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]);
    Start {
        command: cmd,
        shown: Some(script::shell_join(&argv)),
        cwd_failure: None,
    }
}

/// The temporary file local ranks share, removed when dropped.
pub(crate) struct TempFile(PathBuf);

impl TempFile {
    /// Writes `contents` to a new file of the temporary directory named after this process
    /// and `var`.
    pub(crate) fn create(var: &str, contents: &str) -> std::io::Result<TempFile> {
        let dir = std::env::temp_dir();
        let stem = format!(
            "nuvec-launch-{}-{}",
            std::process::id(),
            var.to_ascii_lowercase().replace('_', "-")
        );
        let mut attempt = 0;
        loop {
            let name = if attempt == 0 {
                format!("{stem}.json")
            } else {
                format!("{stem}-{attempt}.json")
            };
            let path = dir.join(name);
            match OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(mut file) => {
                    let file_guard = TempFile(path);
                    file.write_all(contents.as_bytes())?;
                    return Ok(file_guard);
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempt < 100 => {
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Where it is.
    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
