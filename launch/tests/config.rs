//! `nuvec-launch config` against `mlx.distributed_config` on recorded Macs: every run of the
//! table below (a fixture cluster under `tests/fixtures/config/`, the options) must give MLX's
//! exit status, standard output, log lines and hostfile, byte for byte. The expected text is
//! MLX 0.32.4's own (`expected/*.txt`, written by `NUVEC_CONFIG_BLESS=1` from MLX's run); when
//! the MLX venv is present (`.venv` at the workspace root or `NUVEC_MLX_VENV`) MLX's
//! `config.py` is also run live on the same fixtures (`tests/mlx_config.py`), so a change of
//! either side is seen. Log lines are compared without MLX's colour codes.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// The runs: name, fixture and options (`OUT` is replaced by a file the hostfile goes to).
const RUNS: &[(&str, &str, &str)] = &[
    ("auto", "two-macs-one-cable", "--hosts mac-a,mac-b"),
    (
        "ring",
        "two-macs-one-cable",
        "--hosts mac-a,mac-b --backend ring",
    ),
    (
        "jaccl-ring",
        "two-macs-one-cable",
        "--hosts mac-a,mac-b --backend jaccl-ring",
    ),
    ("dot", "two-macs-one-cable", "--hosts mac-a,mac-b --dot"),
    (
        "auto-setup",
        "two-macs-one-cable",
        "--hosts mac-a,mac-b --auto-setup --verbose",
    ),
    (
        "ethernet",
        "two-macs-one-cable",
        "--hosts mac-a,mac-b --over ethernet",
    ),
    (
        "output",
        "two-macs-one-cable",
        "--hosts mac-a,mac-b --env MLX_METAL_FAST_SYNCH=1 --env A=1 --output OUT",
    ),
    (
        "unreachable",
        "two-macs-one-cable",
        "--hosts mac-a,mac-z,mac-b",
    ),
    (
        "ignore-unreachable",
        "two-macs-one-cable",
        "--hosts mac-a,mac-z,mac-b --ignore-unreachable --backend ring",
    ),
    ("auto", "two-macs-two-cables", "--hosts mac-a,mac-b"),
    (
        "ring",
        "two-macs-two-cables",
        "--hosts mac-a,mac-b --backend ring",
    ),
    (
        "jaccl-ring",
        "two-macs-two-cables",
        "--hosts mac-a,mac-b --backend jaccl-ring",
    ),
    ("auto", "three-macs-mesh", "--hosts mac-a,mac-b,mac-c"),
    (
        "ring",
        "three-macs-mesh",
        "--hosts mac-a,mac-b,mac-c --backend ring",
    ),
    (
        "jaccl-ring",
        "three-macs-mesh",
        "--hosts mac-a,mac-b,mac-c --backend jaccl-ring",
    ),
    ("dot", "three-macs-mesh", "--hosts mac-a,mac-b,mac-c --dot"),
    ("auto", "four-macs-mesh", "--hosts mac-a,mac-b,mac-c,mac-d"),
    (
        "ring",
        "four-macs-mesh",
        "--hosts mac-a,mac-b,mac-c,mac-d --backend ring",
    ),
    (
        "jaccl-ring",
        "four-macs-mesh",
        "--hosts mac-a,mac-b,mac-c,mac-d --backend jaccl-ring",
    ),
    (
        "hostfile",
        "four-macs-mesh",
        "--hostfile four-macs-mesh/hosts.json",
    ),
    ("auto", "four-macs-ring", "--hosts mac-a,mac-b,mac-c,mac-d"),
    (
        "ring",
        "four-macs-ring",
        "--hosts mac-a,mac-b,mac-c,mac-d --backend ring",
    ),
    (
        "jaccl",
        "four-macs-ring",
        "--hosts mac-a,mac-b,mac-c,mac-d --backend jaccl",
    ),
    (
        "dot",
        "four-macs-ring",
        "--hosts mac-a,mac-b,mac-c,mac-d --dot",
    ),
    (
        "auto-setup",
        "four-macs-ring",
        "--hosts mac-a,mac-b,mac-c,mac-d --auto-setup",
    ),
    (
        "auto",
        "four-macs-ring-two-cables",
        "--hosts mac-a,mac-b,mac-c,mac-d",
    ),
    (
        "ring",
        "four-macs-ring-two-cables",
        "--hosts mac-a,mac-b,mac-c,mac-d --backend ring",
    ),
    (
        "jaccl",
        "four-macs-ring-two-cables",
        "--hosts mac-a,mac-b,mac-c,mac-d --backend jaccl",
    ),
    ("auto", "no-rdma", "--hosts mac-a,mac-b,mac-c"),
    (
        "jaccl",
        "no-rdma",
        "--hosts mac-a,mac-b,mac-c --backend jaccl",
    ),
    (
        "jaccl-ring",
        "no-rdma",
        "--hosts mac-a,mac-b,mac-c --backend jaccl-ring",
    ),
    (
        "ethernet",
        "no-rdma",
        "--hosts mac-a,mac-b,mac-c --over ethernet",
    ),
    ("auto", "hub", "--hosts mac-a,mac-b,mac-c"),
    ("ring", "hub", "--hosts mac-a,mac-b,mac-c --backend ring"),
    ("dot", "hub", "--hosts mac-a,mac-b,mac-c --dot"),
];

/// How long one run may take.
const RUN_TIMEOUT: Duration = Duration::from_secs(60);

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/config")
}

/// The MLX venv's Python, or `None` with the reason printed (CI=true requires it).
fn mlx_python() -> Option<PathBuf> {
    let venv = std::env::var_os("NUVEC_MLX_VENV").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv"),
        PathBuf::from,
    );
    let python = venv.join("bin/python");
    if python.exists() {
        return Some(python);
    }
    let reason = format!(
        "no MLX venv at {} (make it with .ci/setup-venv, or set NUVEC_MLX_VENV); skipping the \
         live comparison with MLX's config.py (the recorded MLX output is still compared)",
        venv.display()
    );
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{reason}, but CI=true requires it"
    );
    eprintln!("{reason}");
    None
}

/// What a run printed, in one text: the command, exit status, standard output, the log lines
/// (colour codes and trailing spaces removed) and the hostfile written to `OUT`.
fn transcript(mut command: Command, options: &str, out: &Path) -> String {
    let _ = std::fs::remove_file(out);
    let mut child = command
        .current_dir(fixtures())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the command starts");
    let mut stdin = child.stdin.take().expect("piped stdin");
    // Enter for every "Enter to continue".
    stdin
        .write_all(&[b'\n'; 64])
        .expect("stdin takes the newlines");
    drop(stdin);
    let mut stdout = child.stdout.take().expect("piped stdout");
    let mut stderr = child.stderr.take().expect("piped stderr");
    let (tx, rx) = crossbeam_channel::bounded(2);
    let tx2 = tx.clone();
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        let _ = tx.send((0, s));
    });
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        let _ = tx2.send((1, s));
    });
    let mut texts = [String::new(), String::new()];
    for _ in 0..2 {
        match rx.recv_timeout(RUN_TIMEOUT) {
            Ok((i, s)) => texts[i] = s,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{options}: no end within {RUN_TIMEOUT:?}");
            }
        }
    }
    let status = child.wait().expect("the command ends");
    let log: String = texts[1]
        .lines()
        .map(|l| {
            let mut clean = l.to_owned();
            for code in ["\x1b[31m", "\x1b[32m", "\x1b[33m", "\x1b[0m"] {
                clean = clean.replace(code, "");
            }
            clean.trim_end().to_owned() + "\n"
        })
        .collect();
    let hostfile = std::fs::read_to_string(out).unwrap_or_else(|_| "(none)".into());
    format!(
        "$ config {options}\nexit: {}\n--- stdout\n{}--- log\n{log}--- hostfile\n{hostfile}\n",
        status.code().map_or("signal".into(), |c| c.to_string()),
        texts[0],
    )
}

fn options(raw: &str, out: &Path) -> Vec<String> {
    raw.split(' ')
        .map(|w| {
            if w == "OUT" {
                out.display().to_string()
            } else {
                w.to_owned()
            }
        })
        .collect()
}

#[test]
fn every_fixture_run_prints_and_writes_what_mlx_distributed_config_does() {
    let python = mlx_python();
    let bless = std::env::var("NUVEC_CONFIG_BLESS").as_deref() == Ok("1");
    let dir = std::env::temp_dir().join(format!("nuvec-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let out = dir.join("hostfile.json");
    let mut failures = Vec::new();
    for &(name, fixture, raw) in RUNS {
        let shown = raw.replace("OUT", "hostfile.json");
        let mut ours = Command::new(env!("CARGO_BIN_EXE_nuvec-launch"));
        ours.arg("config")
            .arg("--replay")
            .arg(fixture)
            .args(options(raw, &out));
        let got = transcript(ours, &shown, &out);
        let expected_path = fixtures()
            .join(fixture)
            .join("expected")
            .join(format!("{name}.txt"));
        if let Some(python) = &python {
            let mut mlx = Command::new(python);
            mlx.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mlx_config.py"))
                .arg(fixture)
                .args(options(raw, &out));
            let theirs = transcript(mlx, &shown, &out);
            if bless {
                std::fs::create_dir_all(expected_path.parent().expect("a parent"))
                    .expect("the expected directory");
                std::fs::write(&expected_path, &theirs).expect("the expected file is written");
            }
            if got != theirs {
                failures.push(format!(
                    "{fixture} {name}: differs from MLX's live run\n--- MLX\n{theirs}\n--- nuvec-launch\n{got}"
                ));
                continue;
            }
        }
        match std::fs::read_to_string(&expected_path) {
            Ok(expected) if expected == got => {}
            Ok(expected) => failures.push(format!(
                "{fixture} {name}: differs from MLX's recorded run ({})\n--- MLX\n{expected}\n--- nuvec-launch\n{got}",
                expected_path.display()
            )),
            Err(e) => failures.push(format!("{}: {e}", expected_path.display())),
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// An `ssh` that answers from a fixture cluster (`FAKE_SSH_FIXTURE/HOST/`) and logs every
/// command line it is given (`FAKE_SSH_LOG`).
const FAKE_SSH: &str = r#"#!/bin/sh
echo "$*" >> "$FAKE_SSH_LOG"
while [ "$1" = "-o" ]; do shift 2; done
host=$1; shift
dir=$FAKE_SSH_FIXTURE/$host
[ -d "$dir" ] || exit 255
case "$*" in
  "echo success") echo success ;;
  "sudo ls") [ -e "$dir/no-sudo" ] && exit 1; exit 0 ;;
  "system_profiler SPThunderboltDataType -json") cat "$dir/thunderbolt.json" ;;
  "networksetup -listallhardwareports") cat "$dir/hardware-ports.txt" ;;
  "ibv_devices") cat "$dir/ibv_devices.txt" 2>/dev/null ;;
  "ipconfig getifaddr en0") cat "$dir/en0.txt" 2>/dev/null || exit 1 ;;
  "ipconfig getifaddr en1") cat "$dir/en1.txt" 2>/dev/null || exit 1 ;;
  *) exit 0 ;;
esac
"#;

#[test]
fn over_ssh_it_runs_mlxs_command_lines_and_prints_what_mlx_does() {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("nuvec-config-ssh-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let ssh = dir.join("ssh");
    std::fs::write(&ssh, FAKE_SSH).expect("the fake ssh is written");
    std::fs::set_permissions(&ssh, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let log = dir.join("ssh.log");
    let path = format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let run = |raw: &str| {
        let _ = std::fs::remove_file(&log);
        let mut c = Command::new(env!("CARGO_BIN_EXE_nuvec-launch"));
        c.arg("config")
            .args(raw.split(' '))
            .env("PATH", &path)
            .env("FAKE_SSH_FIXTURE", fixtures().join("two-macs-one-cable"))
            .env("FAKE_SSH_LOG", &log);
        let got = transcript(c, raw, &dir.join("none.json"));
        let lines = std::fs::read_to_string(&log).unwrap_or_default();
        (got, lines)
    };

    // Without --replay, over (this) ssh: the same transcript as MLX's recorded run.
    let (got, _) = run("--hosts mac-a,mac-b");
    let expected = std::fs::read_to_string(fixtures().join("two-macs-one-cable/expected/auto.txt"))
        .expect("the recorded MLX run");
    assert_eq!(got, expected);

    // With --auto-setup: MLX's command lines, the reachability checks (in parallel, so in any
    // order) first.
    let (got, lines) = run("--hosts mac-a,mac-b --auto-setup");
    assert!(
        got.contains(
            "--- stdout\nRunning auto setup for mac-a\n\nRunning auto setup for mac-b\n\nHostfile\n"
        ),
        "{got}"
    );
    let lines: Vec<&str> = lines.lines().collect();
    let mut checks = lines[..4].to_vec();
    checks.sort_unstable();
    assert_eq!(
        checks,
        [
            "-o BatchMode=yes -o ConnectTimeout=5 mac-a echo success",
            "-o BatchMode=yes -o ConnectTimeout=5 mac-a sudo ls",
            "-o BatchMode=yes -o ConnectTimeout=5 mac-b echo success",
            "-o BatchMode=yes -o ConnectTimeout=5 mac-b sudo ls",
        ]
    );
    assert_eq!(
        lines[4..],
        [
            "mac-a system_profiler SPThunderboltDataType -json",
            "mac-b system_profiler SPThunderboltDataType -json",
            "mac-a networksetup -listallhardwareports",
            "mac-b networksetup -listallhardwareports",
            "mac-a ibv_devices",
            "mac-b ibv_devices",
            "mac-a ipconfig getifaddr en0",
            "mac-b ipconfig getifaddr en0",
            "mac-a sudo ifconfig bridge0 down ; sudo ifconfig en2 inet 192.168.0.1 netmask 255.255.255.252 ; sudo route change 192.168.0.2 -interface en2",
            "mac-b sudo ifconfig bridge0 down ; sudo ifconfig en2 inet 192.168.0.2 netmask 255.255.255.252 ; sudo route change 192.168.0.1 -interface en2",
        ]
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn one_host_is_not_a_cluster_to_cable_and_says_so() {
    let mut c = Command::new(env!("CARGO_BIN_EXE_nuvec-launch"));
    c.args([
        "config",
        "--replay",
        "two-macs-one-cable",
        "--hosts",
        "mac-a",
    ]);
    let got = transcript(
        c,
        "--hosts mac-a",
        &std::env::temp_dir().join("nuvec-config-none.json"),
    );
    assert!(
        got.contains("exit: 1\n")
            && got.contains(
                "[ERROR] Thunderbolt links need two or more hosts; the hosts to configure are: mac-a"
            ),
        "{got}"
    );
}
