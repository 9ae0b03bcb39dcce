//! The thin driver: the commands `config` runs on each host, over `ssh` or replayed from
//! files.
//!
//! [`Ssh`] runs exactly MLX's command lines (`ssh HOST COMMAND...`; the reachability checks
//! with `-o BatchMode=yes -o ConnectTimeout=5`), with standard input closed and each command
//! bounded by [`COMMAND_TIMEOUT`] (MLX waits for ever: an ssh asking for a password would
//! hang it).
//!
//! [`Replay`] (`--replay DIR`) runs nothing: it answers each command from what was saved on the
//! host, so that a cluster can be planned from outputs collected by hand, and so that the
//! tests feed recorded outputs. `DIR/HOST/` (HOST = the ssh name) holds:
//!
//! | command on HOST                               | file               | when absent        |
//! |-----------------------------------------------|--------------------|--------------------|
//! | `echo success` (ssh reachability)             | the directory      | unreachable        |
//! | `sudo ls` (passwordless sudo)                 | `no-sudo` marks none | sudo works       |
//! | `system_profiler SPThunderboltDataType -json` | `thunderbolt.json` | fails, no output   |
//! | `networksetup -listallhardwareports`          | `hardware-ports.txt` | fails, no output |
//! | `ibv_devices`                                 | `ibv_devices.txt`  | no output          |
//! | `ipconfig getifaddr en0` (and `en1`)          | `en0.txt`, `en1.txt` | no output        |
//! | `ifconfig` (`nuvec-launch doctor`)            | `ifconfig.txt`     | fails, no output   |
//! | `grep -s . /proc/sys/net/ipv4/tcp_congestion_control` (doctor, ring) | `tcp_congestion_control.txt` | no output |
//! | `ip -o addr show up 2>/dev/null` (doctor)     | `ip-addr.txt`      | no output          |
//!
//! With `--auto-setup` a replay prints the ssh command it would run instead of running it.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use crossbeam_channel::RecvTimeoutError;

use super::discover::{CONGESTION, HARDWARE_PORTS, IBV_DEVICES, IP_ADDRESSES_REMOTE, THUNDERBOLT};

/// The longest a command on a host may take (`system_profiler` takes a few seconds).
pub(crate) const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// What a command printed and whether it succeeded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Output {
    /// Whether it exited with status 0.
    pub(crate) success: bool,
    /// Its standard output (lossily UTF-8).
    pub(crate) stdout: String,
    /// Why it did not run or did not finish, when so.
    pub(crate) failure: Option<String>,
}

/// Runs commands on hosts.
pub(crate) trait Runner: Sync {
    /// Runs `ssh [options] host command...` and returns its output.
    fn run(&self, host: &str, options: &[&str], command: &[&str]) -> Output;
    /// Applies the setup commands `script` (`a ; b ; c`) on `host`, as `ssh host script`;
    /// `shown` is that command line, for the log.
    fn apply(&self, host: &str, script: &str, shown: &str) -> Output;
}

/// The real driver: `ssh`.
pub(crate) struct Ssh;

impl Runner for Ssh {
    fn run(&self, host: &str, options: &[&str], command: &[&str]) -> Output {
        let mut c = Command::new("ssh");
        c.args(options).arg(host).args(command);
        bounded(c, COMMAND_TIMEOUT)
    }

    fn apply(&self, host: &str, script: &str, _shown: &str) -> Output {
        let mut c = Command::new("ssh");
        c.arg(host).arg(script);
        bounded(c, COMMAND_TIMEOUT)
    }
}

/// Runs `command` with standard input closed and standard error inherited, killing it after
/// `timeout`.
pub(crate) fn bounded(mut command: Command, timeout: Duration) -> Output {
    let shown = format!("{command:?}");
    let mut child = match command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            return Output {
                failure: Some(format!("{shown} could not start: {e}")),
                ..Output::default()
            };
        }
    };
    let Some(mut stdout) = child.stdout.take() else {
        let _ = child.kill();
        let _ = child.wait();
        return Output {
            failure: Some(format!("{shown}: no standard output pipe")),
            ..Output::default()
        };
    };
    let (tx, rx) = crossbeam_channel::bounded(1);
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let read = stdout.read_to_end(&mut bytes);
        let _ = tx.send(read.map(|_| bytes));
    });
    let read = match rx.recv_timeout(timeout) {
        Ok(read) => read,
        Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {
            let _ = child.kill();
            let _ = child.wait();
            return Output {
                failure: Some(format!(
                    "{shown} did not finish within {timeout:?} and was killed"
                )),
                ..Output::default()
            };
        }
    };
    // The output ended, so the process is exiting; its status follows.
    let status = child.wait();
    match (read, status) {
        (Ok(bytes), Ok(status)) => Output {
            success: status.success(),
            stdout: String::from_utf8_lossy(&bytes).into_owned(),
            failure: None,
        },
        (Err(e), _) | (_, Err(e)) => Output {
            failure: Some(format!("{shown}: {e}")),
            ..Output::default()
        },
    }
}

/// The replay driver: answers from `DIR/HOST/` (see the module docs).
pub(crate) struct Replay(pub(crate) PathBuf);

impl Replay {
    fn file(&self, host: &str, name: &str) -> Output {
        let path = self.0.join(host).join(name);
        match std::fs::read(&path) {
            Ok(bytes) => Output {
                success: true,
                stdout: String::from_utf8_lossy(&bytes).into_owned(),
                failure: None,
            },
            Err(e) => Output {
                success: false,
                stdout: String::new(),
                failure: Some(format!("replay: {}: {e}", path.display())),
            },
        }
    }
}

impl Runner for Replay {
    fn run(&self, host: &str, _options: &[&str], command: &[&str]) -> Output {
        let reachable = self.0.join(host).is_dir();
        if !reachable {
            return Output {
                failure: Some(format!(
                    "replay: no directory {}",
                    self.0.join(host).display()
                )),
                ..Output::default()
            };
        }
        let joined = command.join(" ");
        let quiet = |out: Output| Output {
            failure: None,
            ..out
        };
        match joined.as_str() {
            "echo success" => Output {
                success: true,
                stdout: "success\n".into(),
                failure: None,
            },
            "sudo ls" => Output {
                success: !self.0.join(host).join("no-sudo").exists(),
                ..Output::default()
            },
            THUNDERBOLT => self.file(host, "thunderbolt.json"),
            HARDWARE_PORTS => self.file(host, "hardware-ports.txt"),
            IBV_DEVICES => quiet(self.file(host, "ibv_devices.txt")),
            CONGESTION => quiet(self.file(host, "tcp_congestion_control.txt")),
            IP_ADDRESSES_REMOTE => quiet(self.file(host, "ip-addr.txt")),
            "ifconfig" => self.file(host, "ifconfig.txt"),
            "ipconfig getifaddr en0" => quiet(self.file(host, "en0.txt")),
            "ipconfig getifaddr en1" => quiet(self.file(host, "en1.txt")),
            other => Output {
                failure: Some(format!("replay: no saved output for {other:?}")),
                ..Output::default()
            },
        }
    }

    fn apply(&self, _host: &str, _script: &str, shown: &str) -> Output {
        out!("[replay] not run: {shown}");
        Output {
            success: true,
            ..Output::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_that_does_not_end_is_killed_at_its_deadline_and_said_so() {
        let started = std::time::Instant::now();
        let mut c = Command::new("sleep");
        c.arg("30");
        let out = bounded(c, Duration::from_millis(200));
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
        assert!(!out.success);
        let why = out.failure.expect("a failure");
        assert!(
            why.contains("did not finish within 200ms and was killed"),
            "{why}"
        );
    }

    #[test]
    fn a_command_that_ends_gives_its_output_and_status() {
        let mut c = Command::new("sh");
        c.args(["-c", "echo rdma_en2; exit 3"]);
        let out = bounded(c, COMMAND_TIMEOUT);
        assert_eq!((out.success, out.stdout.as_str()), (false, "rdma_en2\n"));
        assert_eq!(out.failure, None);
        let out = bounded(Command::new("/nonexistent/ssh"), COMMAND_TIMEOUT);
        assert!(out.failure.expect("a failure").contains("could not start"));
    }
}
