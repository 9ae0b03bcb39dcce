//! nuvec-launch: a real 4-rank all_sum over the ring, the JACCL environment, a failing rank stopping the others and named first (panic, SIGKILL, an ssh host that does not resolve), the flight records (merged after a failure and by `diagnose`, naming a rank that panicked, was SIGKILLed or called another collective; on Ctrl-C, on `--hang-report`, by `diagnose`), the launcher's own death, and the environment compared with mlx.launch's.
//!
//! The ranks are this test binary run again (`launched_rank`, with `NUVEC_LAUNCH_TEST_ROLE`
//! saying what to do) or small `sh` scripts. Every job runs with its own `TMPDIR`, so that the
//! launchers' temporary files can be checked (nuvec-launch must leave none) and removed
//! (mlx.launch leaves its own). Every wait is bounded; a job that outlives its bound is
//! killed, with its descendants, and the test fails.
//!
//! Longer than the suites' usual 700 lines on purpose: it is the one end-to-end suite of the
//! `nuvec-launch` binary (whose own crate is unit-tested only), and its tests share the rank
//! roles, the scratch directories and the mlx.launch scenarios defined here; the generic parts
//! (bounded runs, process trees, tagged lines) are in `tests/common/run.rs`.

#[cfg(feature = "jaccl")]
use crate::common::emu;
use crate::common::launcher;
use crate::common::procs;
use crate::common::run::{
    Ran, descendants, ended, kill, launched_all_sum, lines, run, run_with_input, tagged,
};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use launcher::nuvec_launch as nuvec_launch_binary;

/// What a launched copy of this binary does: `ring` or `dump`.
const ROLE: &str = "NUVEC_LAUNCH_TEST_ROLE";
/// The test a launched copy of this binary runs.
const RANK_TEST: &str = concat!(module_path!(), "::launched_rank");
/// Variables that are not `MLX_*` but that a dump shows.
const DUMPED: [&str; 6] = ["FOO", "QUOTE", "EMPTY", "FROM_HOSTFILE", "COLUMNS", "LINES"];

/// A rank of a launched job when `NUVEC_LAUNCH_TEST_ROLE` is set; nothing otherwise.
#[test]
fn launched_rank() {
    match std::env::var(ROLE).as_deref() {
        Ok("ring") => ring_rank(),
        // JACCL over TCP (`NUVEC_JACCL_FABRIC=tcp`) or RDMA, as the job says.
        Ok("jaccl") => println!("RESULT {}", launched_all_sum()),
        Ok("dump") => dump_rank(),
        Ok("fail-after-all-sum") => fail_after_all_sum(),
        Ok("mismatch-after-all-sum") => mismatch_after_all_sum(),
        _ => {}
    }
}

/// Runs one all_sum; then rank 1 fails as `NUVEC_LAUNCH_TEST_FAILURE` says (`panic`, or
/// `sigkill`: it sends itself SIGKILL) while the others run a second all_sum, print its error
/// and exit with code 3, as a program that handles the error would.
fn fail_after_all_sum() {
    use nuvec_core::{array, distributed};
    let first = launched_all_sum();
    println!("FIRST {first}");
    let rank = nuvec_distributed::init(true).expect("the group").rank();
    if rank == 1 {
        match std::env::var("NUVEC_LAUNCH_TEST_FAILURE").as_deref() {
            Ok("sigkill") => {
                let _ = Command::new("kill")
                    .args(["-s", "KILL", &std::process::id().to_string()])
                    .status();
                // SIGKILL is not deferred; this is only reached if `kill` could not run.
                std::process::exit(99);
            }
            Ok("sigstop") => {
                // Stopped until the launcher kills it; `kill` returns once the signal is
                // sent, so this rank waits for its own stop (bounded: the launcher kills it).
                let _ = Command::new("kill")
                    .args(["-s", "STOP", &std::process::id().to_string()])
                    .status();
                std::thread::sleep(std::time::Duration::from_secs(120));
                std::process::exit(99);
            }
            _ => panic!("rank 1 fails on purpose after its first all_sum"),
        }
    }
    match distributed::all_sum(&array![1.0f32], None).to_vec::<f32>() {
        Ok(v) => println!("SECOND {v:?}"),
        Err(e) => {
            eprintln!("rank {rank}: {e}");
            std::process::exit(3);
        }
    }
}

/// Runs one all_sum; then rank 1 calls all_gather where the others call all_sum. On the
/// nuvec wire, which every rank of this crate agrees on, each rank prints its error and exits
/// with code 3; on MLX's wire some ranks print wrong numbers and exit 0, and the others time
/// out and exit 3.
fn mismatch_after_all_sum() {
    use nuvec_core::{array, distributed};
    println!("FIRST {}", launched_all_sum());
    let rank = nuvec_distributed::init(true).expect("the group").rank();
    let x = array![1.0f32, 2.0, 3.0, 4.0];
    let second = if rank == 1 {
        distributed::all_gather(&x, None)
    } else {
        distributed::all_sum(&x, None)
    };
    match second.to_vec::<f32>() {
        Ok(v) => println!("SECOND {v:?}"),
        Err(e) => {
            eprintln!("rank {rank}: {e}");
            std::process::exit(3);
        }
    }
}

/// Joins the ring from the launch environment and prints the all_sum of `[rank, 1]` and the
/// hostfile.
fn ring_rank() {
    let result = launched_all_sum();
    let path = std::env::var("MLX_HOSTFILE").expect("MLX_HOSTFILE");
    let hostfile = std::fs::read_to_string(path).expect("the hostfile");
    println!("RESULT {result} hostfile={}", hostfile.trim_end());
}

/// Prints, in one line, every `MLX_*` variable and the [`DUMPED`] ones; the files that
/// `MLX_HOSTFILE` and `MLX_IBV_DEVICES` name are shown by content.
fn dump_rank() {
    use std::io::Write;
    let mut vars = BTreeMap::new();
    for (key, value) in std::env::vars() {
        if !key.starts_with("MLX_") && !DUMPED.contains(&key.as_str()) {
            continue;
        }
        let value = if key == "MLX_HOSTFILE" || key == "MLX_IBV_DEVICES" {
            match std::fs::read_to_string(&value) {
                Ok(content) => format!("file:{content}"),
                Err(e) => format!("unreadable {value}: {e}"),
            }
        } else {
            value
        };
        vars.insert(key, value);
    }
    let cwd = std::env::current_dir().expect("current directory");
    vars.insert("(cwd)".to_owned(), cwd.display().to_string());
    let rank = std::env::var("MLX_RANK").unwrap_or_default();
    let line = format!(
        "DUMP {rank} {}\n",
        serde_json::to_string(&vars).expect("json")
    );
    // One write, so that a launcher reading the pipe never splits the line.
    std::io::stdout()
        .lock()
        .write_all(line.as_bytes())
        .expect("write the dump");
}

/// The command that runs this binary as a launched rank.
fn rank_command() -> Vec<String> {
    procs::this_test_argv(RANK_TEST)
}

/// A fresh scratch directory, removed with its contents when dropped.
struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fresh scratch directory for `name`.
fn scratch(name: &str) -> Scratch {
    let dir =
        std::env::temp_dir().join(format!("nuvec-launch-tests-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create a scratch directory");
    Scratch(dir)
}

/// The names in `dir`.
fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read the directory")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// `nuvec-launch ARGS`, with `TMPDIR` set to `tmp` and no terminal size in the environment.
fn nuvec_launch(tmp: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(nuvec_launch_binary());
    cmd.args(args)
        .env("TMPDIR", tmp)
        .env_remove("COLUMNS")
        .env_remove("LINES");
    cmd
}

#[test]
fn four_local_ranks_run_a_real_all_sum_over_the_ring() {
    let _job = procs::exclusive();
    let tmp = scratch("ring");
    let port = crate::common::ports::consecutive(4);
    let port_arg = port.to_string();
    let mut args = vec![
        "-n",
        "4",
        "--starting-port",
        &port_arg,
        "--env",
        "NUVEC_LAUNCH_TEST_ROLE=ring",
        "--env",
        "NUVEC_DISTRIBUTED_TIMEOUT=30",
        "--",
    ];
    let command = rank_command();
    args.extend(command.iter().map(String::as_str));
    let done = run(&mut nuvec_launch(&tmp, &args), Duration::from_secs(120));
    assert_eq!(done.code, Some(0), "{}", done.describe());
    let results = tagged(&done.stdout, "RESULT");
    assert_eq!(
        results.keys().copied().collect::<Vec<_>>(),
        [0, 1, 2, 3],
        "{}",
        done.describe()
    );
    let hostfile = format!(
        "[[\"127.0.0.1:{}\"], [\"127.0.0.1:{}\"], [\"127.0.0.1:{}\"], [\"127.0.0.1:{}\"]]",
        port,
        port + 1,
        port + 2,
        port + 3
    );
    for (rank, result) in &results {
        assert_eq!(
            result,
            &format!("rank={rank} size=4 sum=[6.0, 4.0] hostfile={hostfile}"),
            "{}",
            done.describe()
        );
    }
    // Every line a rank printed carries its prefix; nothing is left in TMPDIR.
    for line in done.stdout.lines() {
        assert!(line.starts_with("[rank "), "unprefixed line {line:?}");
    }
    assert_eq!(entries(&tmp), Vec::<String>::new(), "temporary files left");
}

/// A JACCL host file of `hosts` local hosts with this `rdma` matrix.
fn jaccl_hostfile(backend: &str, rdma: &[&str]) -> String {
    let hosts: Vec<String> = rdma
        .iter()
        .map(|row| format!(r#"{{"ssh": "127.0.0.1", "ips": ["127.0.0.1"], "rdma": {row}}}"#))
        .collect();
    format!(
        r#"{{"backend": "{backend}", "envs": ["FROM_HOSTFILE=yes"], "hosts": [{}]}}"#,
        hosts.join(", ")
    )
}

const MESH: [&str; 3] = [
    r#"[null, "rdma_en1", "rdma_en2"]"#,
    r#"["rdma_en1", null, "rdma_en3"]"#,
    r#"["rdma_en2", "rdma_en3", null]"#,
];

/// A mesh of two cables per pair, in the list form `mlx.distributed_config` 0.32.4 writes
/// when every pair has two or more (MLX 0.32.4's multi-wire mesh).
const MESH_TWO_WIRES: [&str; 3] = [
    r#"[null, ["rdma_en1", "rdma_en2"], ["rdma_en3", "rdma_en4"]]"#,
    r#"[["rdma_en1", "rdma_en2"], null, ["rdma_en5", "rdma_en6"]]"#,
    r#"[["rdma_en3", "rdma_en4"], ["rdma_en5", "rdma_en6"], null]"#,
];

const RING: [&str; 4] = [
    r#"[null, ["rdma_en1", "rdma_en2"], null, "rdma_en4"]"#,
    r#"[["rdma_en1", "rdma_en2"], null, "rdma_en3", null]"#,
    r#"[null, "rdma_en3", null, "rdma_en5"]"#,
    r#"["rdma_en4", null, "rdma_en5", null]"#,
];

/// The dumps of a job, by rank.
fn dumps(done: &Ran) -> BTreeMap<usize, BTreeMap<String, String>> {
    tagged(&done.stdout, "DUMP")
        .into_iter()
        .map(|(r, json)| (r, serde_json::from_str(&json).expect("a dump")))
        .collect()
}

#[test]
fn jaccl_and_jaccl_ring_ranks_see_the_device_file_coordinator_and_ring_flag() {
    let _job = procs::exclusive();
    let dir = scratch("jaccl");
    let tmp = dir.join("tmp");
    std::fs::create_dir_all(&tmp).expect("create TMPDIR");
    let command = rank_command();
    for (backend, rdma) in [("jaccl", &MESH[..]), ("jaccl-ring", &RING[..])] {
        let hostfile = dir.join(format!("{backend}.json"));
        std::fs::write(&hostfile, jaccl_hostfile(backend, rdma)).expect("write the host file");
        let hostfile_arg = hostfile.display().to_string();
        let mut args = vec![
            "--hostfile",
            &hostfile_arg,
            "-p",
            "41234",
            "--env",
            "NUVEC_LAUNCH_TEST_ROLE=dump",
            "--",
        ];
        args.extend(command.iter().map(String::as_str));
        let done = run(&mut nuvec_launch(&tmp, &args), Duration::from_secs(60));
        assert_eq!(done.code, Some(0), "{backend}: {}", done.describe());
        let dumps = dumps(&done);
        assert_eq!(dumps.len(), rdma.len(), "{backend}: {}", done.describe());
        let matrix = format!("file:[{}]\n", rdma.join(", "));
        for (rank, vars) in &dumps {
            let mut want = BTreeMap::from([
                ("MLX_RANK".to_owned(), rank.to_string()),
                ("MLX_IBV_DEVICES".to_owned(), matrix.clone()),
                (
                    "MLX_JACCL_COORDINATOR".to_owned(),
                    "127.0.0.1:41234".to_owned(),
                ),
                ("FROM_HOSTFILE".to_owned(), "yes".to_owned()),
            ]);
            if backend == "jaccl-ring" {
                want.insert("MLX_JACCL_RING".to_owned(), "1".to_owned());
            }
            let mut got = vars.clone();
            got.remove("(cwd)");
            assert_eq!(got, want, "{backend}, rank {rank}");
        }
        assert_eq!(entries(&tmp), Vec::<String>::new(), "temporary files left");
    }
}

/// A ring of 4 with one cable between neighbours.
const RING_OF_FOUR: [&str; 4] = [
    r#"[null, "rdma_en1", null, "rdma_en4"]"#,
    r#"["rdma_en1", null, "rdma_en2", null]"#,
    r#"[null, "rdma_en2", null, "rdma_en3"]"#,
    r#"["rdma_en4", null, "rdma_en3", null]"#,
];

#[test]
fn jaccl_and_jaccl_ring_jobs_run_a_real_all_sum_over_tcp() {
    jaccl_jobs(nuvec_launch_binary(), &["--env", "NUVEC_JACCL_FABRIC=tcp"]);
}

/// Runs a 3-rank mesh, a 3-rank mesh of two wires and a 4-rank ring through `launcher` with
/// the extra launcher arguments `extra`, each rank joining by `nuvec_distributed::init` and
/// checking one all_sum.
fn jaccl_jobs(launcher: &Path, extra: &[&str]) {
    let _job = procs::exclusive();
    let dir = scratch("jaccl-job");
    let tmp = dir.join("tmp");
    std::fs::create_dir_all(&tmp).expect("create TMPDIR");
    let command = rank_command();
    for (backend, rdma) in [
        ("jaccl", &MESH[..]),
        ("jaccl", &MESH_TWO_WIRES[..]),
        ("jaccl-ring", &RING_OF_FOUR[..]),
    ] {
        let hostfile = dir.join(format!("{backend}-{}.json", rdma[0].len()));
        std::fs::write(&hostfile, jaccl_hostfile(backend, rdma)).expect("write the host file");
        let hostfile_arg = hostfile.display().to_string();
        let port = crate::common::ports::consecutive(1).to_string();
        let mut args = vec![
            "--hostfile",
            &hostfile_arg,
            "-p",
            &port,
            "--env",
            "NUVEC_LAUNCH_TEST_ROLE=jaccl",
            "--env",
            "NUVEC_DISTRIBUTED_TIMEOUT=30",
        ];
        args.extend(extra);
        args.push("--");
        args.extend(command.iter().map(String::as_str));
        let mut cmd = if launcher == nuvec_launch_binary() {
            nuvec_launch(&tmp, &args)
        } else {
            let mut cmd = Command::new(launcher);
            cmd.args(&args).env("TMPDIR", &tmp);
            cmd
        };
        cmd.current_dir(&*dir);
        let done = run(&mut cmd, Duration::from_secs(120));
        let what = format!("{backend} by {}", launcher.display());
        assert_eq!(done.code, Some(0), "{what}: {}", done.describe());
        let results = tagged(&done.stdout, "RESULT");
        let n = rdma.len();
        assert_eq!(results.len(), n, "{what}: {}", done.describe());
        let total = (0..n).sum::<usize>() as f32;
        for (rank, result) in &results {
            assert_eq!(
                result,
                &format!("rank={rank} size={n} sum=[{total:?}, {:?}]", n as f32),
                "{what}: {}",
                done.describe()
            );
        }
        if launcher == nuvec_launch_binary() {
            assert_eq!(entries(&tmp), Vec::<String>::new(), "temporary files left");
        }
    }
}

#[cfg(feature = "jaccl")]
#[test]
fn jaccl_and_jaccl_ring_jobs_run_over_the_rdma_fabric_launched_by_nuvec_launch_and_mlx_launch() {
    let library = format!("NUVEC_JACCL_VERBS={}", emu::library().display());
    let devices = format!(
        "NUVEC_VERBS_EMU_DEVICES={}",
        emu::device_names(&format!(
            "[{}, {}, {}]",
            MESH.join(", "),
            MESH_TWO_WIRES.join(", "),
            RING_OF_FOUR.join(", ")
        ))
    );
    let extra = [
        "--env",
        "NUVEC_JACCL_FABRIC=rdma",
        "--env",
        &library,
        "--env",
        &devices,
    ];
    jaccl_jobs(nuvec_launch_binary(), &extra);
    if let Some(mlx) = crate::common::venv::mlx_launch("the mlx.launch job") {
        jaccl_jobs(&mlx, &extra);
    }
}

#[test]
fn a_failing_rank_stops_the_others_and_its_status_is_the_jobs() {
    let _job = procs::exclusive();
    let tmp = scratch("failing");
    // Rank 1 fails at once; the others leave a sleeping child behind a waiting shell, so
    // stopping them takes their descendants too.
    let script = r#"if [ "$MLX_RANK" = 1 ]; then echo failing; exit 7; fi
sleep 30 & echo "sleeper $!"; wait"#;
    let done = run(
        &mut nuvec_launch(&tmp, &["-n", "4", "--", "sh", "-c", script]),
        Duration::from_secs(30),
    );
    assert_eq!(done.code, Some(7), "{}", done.describe());
    assert!(
        done.elapsed < Duration::from_secs(10),
        "took {:?}",
        done.elapsed
    );
    assert!(
        done.stdout.contains("[rank 1] failing"),
        "{}",
        done.describe()
    );
    assert!(
        done.stderr
            .contains("[WARN] Node with rank 1 exited with code 7"),
        "{}",
        done.describe()
    );
    for line in done.stdout.lines() {
        if let Some((_, pid)) = line.split_once("sleeper ") {
            let pid: u32 = pid.trim().parse().expect("a pid");
            assert!(ended(pid), "sleeper {pid} still runs\n{}", done.describe());
        }
    }
    assert_eq!(entries(&tmp), Vec::<String>::new(), "temporary files left");

    // A rank killed by a signal: 128 + the signal, as a shell reports it.
    let script = r#"if [ "$MLX_RANK" = 0 ]; then kill -s KILL $$; fi; exec sleep 30"#;
    let done = run(
        &mut nuvec_launch(&tmp, &["-n", "2", "--", "sh", "-c", script]),
        Duration::from_secs(30),
    );
    assert_eq!(done.code, Some(128 + 9), "{}", done.describe());
    assert!(
        done.elapsed < Duration::from_secs(10),
        "took {:?}",
        done.elapsed
    );

    // A command that does not exist: 127, as bash's `exec` in mlx.launch's script.
    let done = run(
        &mut nuvec_launch(&tmp, &["-n", "2", "nuvec-launch-test-no-such-command"]),
        Duration::from_secs(30),
    );
    assert_eq!(done.code, Some(127), "{}", done.describe());
    assert!(done.stderr.contains("cannot run"), "{}", done.describe());
    assert_eq!(entries(&tmp), Vec::<String>::new(), "temporary files left");
}

#[test]
fn killing_the_launcher_stops_the_ranks_and_removes_its_file() {
    let _job = procs::exclusive();
    let tmp = scratch("killed");
    let mut child = nuvec_launch(
        &tmp,
        &[
            "-n",
            "2",
            "--",
            "sh",
            "-c",
            "echo \"started $$\"; exec sleep 30",
        ],
    )
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::null())
    .spawn()
    .expect("spawn nuvec-launch");
    let launcher = child.id();
    let stdout = child.stdout.take().expect("stdout");
    let rx = lines(stdout);
    let mut ranks = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while ranks.len() < 2 {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(Some(line)) => {
                if let Some((_, pid)) = line.split_once("started ") {
                    ranks.push(pid.trim().parse::<u32>().expect("a pid"));
                }
            }
            other => {
                kill("KILL", &[launcher]);
                let _ = child.wait();
                panic!("the ranks did not start: {other:?}");
            }
        }
    }
    let made = entries(&tmp);
    assert_eq!(
        made.len(),
        2,
        "the shared hostfile and the flight records' directory: {made:?}"
    );
    assert!(made.iter().any(|n| n.ends_with("-records")), "{made:?}");
    kill("TERM", &[launcher]);
    let status = child.wait().expect("wait for nuvec-launch");
    assert_eq!(status.code(), None, "killed by SIGTERM");
    // The watchdog holds the launcher's stdout until it has stopped the ranks and removed
    // the file: the end of that stream is the signal that it is done.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(Some(_)) => {}
            Ok(None) => break,
            Err(e) => {
                kill("KILL", &ranks);
                panic!("the watchdog did not finish: {e}");
            }
        }
    }
    for pid in &ranks {
        assert!(ended(*pid), "rank process {pid} still runs");
    }
    assert_eq!(entries(&tmp), Vec::<String>::new(), "temporary files left");
}

#[test]
fn standard_input_reaches_every_rank() {
    let _job = procs::exclusive();
    let tmp = scratch("stdin");
    let mut cmd = nuvec_launch(
        &tmp,
        &[
            "-n",
            "3",
            "--",
            "sh",
            "-c",
            "while read -r l; do echo \"got $l\"; done; echo eof",
        ],
    );
    let done = run_with_input(&mut cmd, b"one\ntwo\n", Duration::from_secs(30));
    assert_eq!(done.code, Some(0), "{}", done.describe());
    for rank in 0..3 {
        let lines: Vec<&str> = done
            .stdout
            .lines()
            .filter_map(|l| l.strip_prefix(&format!("[rank {rank}] ")))
            .collect();
        assert_eq!(lines, ["got one", "got two", "eof"], "{}", done.describe());
    }
}

#[test]
fn usage_errors_exit_2_and_help_exits_0() {
    let tmp = scratch("usage");
    let help = run(
        &mut nuvec_launch(&tmp, &["--help"]),
        Duration::from_secs(30),
    );
    assert_eq!(help.code, Some(0));
    assert!(
        help.stdout.starts_with("Usage: nuvec-launch"),
        "{}",
        help.stdout
    );
    for (args, message) in [
        (&[][..], "No script is provided"),
        (&["-n", "0", "x"][..], "not a positive number"),
        (&["--backend", "nccl", "x"][..], "not supported"),
        (&["--hosts", "mac-a,mac-b", "x"][..], "requires IPs"),
        (
            &["--hostfile", "/nonexistent.json", "x"][..],
            "doesn't exist",
        ),
        (&["--backend", "jaccl", "x"][..], "number of RDMA devices"),
    ] {
        let done = run(&mut nuvec_launch(&tmp, args), Duration::from_secs(30));
        assert_eq!(done.code, Some(2), "{args:?}: {}", done.describe());
        assert!(
            done.stderr.contains("nuvec-launch: error: ") && done.stderr.contains(message),
            "{args:?}: {}",
            done.describe()
        );
    }
}

/// The scenarios run under both launchers: arguments, and a host file when given.
fn scenarios(dir: &Path) -> Vec<(&'static str, Vec<String>)> {
    let ring_hostfile = dir.join("ring.json");
    std::fs::write(
        &ring_hostfile,
        r#"{"backend": "ring", "envs": ["FROM_HOSTFILE=yes", "FOO=from-file"], "hosts": [
            {"ssh": "127.0.0.1", "ips": ["127.0.0.1"]},
            {"ssh": "127.0.0.1", "ips": ["127.0.0.1", "127.0.0.1"]}]}"#,
    )
    .expect("write the ring host file");
    let mesh = dir.join("mesh.json");
    let mut rows = MESH.to_vec();
    let unicode = r#"["rdma_en1", null, "rdma_é\"x"]"#;
    rows[1] = unicode;
    std::fs::write(&mesh, jaccl_hostfile("jaccl", &rows)).expect("write the mesh host file");
    let ring = dir.join("jring.json");
    std::fs::write(&ring, jaccl_hostfile("jaccl", &RING)).expect("write the ring host file");
    let work = dir.join("work dir");
    std::fs::create_dir_all(&work).expect("create the work directory");
    let s = |v: &[&str]| v.iter().map(|a| (*a).to_owned()).collect::<Vec<String>>();
    vec![
        (
            "ring, 3 local ranks, 2 connections, verbose, env edge cases",
            s(&[
                "-n",
                "3",
                "--verbose",
                "--connections-per-ip",
                "2",
                "-p",
                "40100",
                "--env",
                "FOO=bar",
                "--env",
                "QUOTE=it's a \"test\" $HOME",
                "--env",
                "EMPTY",
                "--env",
                "bad-key=1",
            ]),
        ),
        (
            "ring host file with envs, several IPs, --cwd",
            s(&[
                "--hostfile",
                &ring_hostfile.display().to_string(),
                "--cwd",
                &work.display().to_string(),
                "--env",
                "FOO=bar",
            ]),
        ),
        (
            "jaccl mesh host file, escaped device names, -p",
            s(&["--hostfile", &mesh.display().to_string(), "-p", "40200"]),
        ),
        (
            "jaccl-ring over a host file that says jaccl, COLUMNS given",
            s(&[
                "--hostfile",
                &ring.display().to_string(),
                "--backend",
                "jaccl-ring",
                "--env",
                "COLUMNS=91",
            ]),
        ),
    ]
}

#[test]
fn the_environment_matches_mlx_launchs() {
    let Some(mlx) = crate::common::venv::mlx_launch("the comparison with mlx.launch") else {
        return;
    };
    let _job = procs::exclusive();
    let dir = scratch("mlx");
    let command = rank_command();
    for (name, args) in scenarios(&dir) {
        let mut full = args.clone();
        full.extend(["--env".to_owned(), "NUVEC_LAUNCH_TEST_ROLE=dump".to_owned()]);
        full.push("--".to_owned());
        full.extend(command.iter().cloned());
        let mut results = Vec::new();
        for launcher in [mlx.as_path(), nuvec_launch_binary()] {
            let tmp = dir.join(if launcher == mlx {
                "tmp-mlx"
            } else {
                "tmp-nuvec"
            });
            std::fs::create_dir_all(&tmp).expect("create TMPDIR");
            let mut cmd = Command::new(launcher);
            // COLUMNS without LINES and no terminal: both export COLUMNS=77 and LINES=0
            // (unless --env sets COLUMNS).
            cmd.args(&full)
                .current_dir(&*dir)
                .env("TMPDIR", &tmp)
                .env("COLUMNS", "77")
                .env_remove("LINES");
            let done = run(&mut cmd, Duration::from_secs(120));
            assert_eq!(
                done.code,
                Some(0),
                "{name}: {}: {}",
                launcher.display(),
                done.describe()
            );
            let dumps = dumps(&done);
            assert!(!dumps.is_empty(), "{name}: {}", done.describe());
            if launcher == nuvec_launch_binary() {
                assert_eq!(entries(&tmp), Vec::<String>::new(), "{name}: files left");
            }
            std::fs::remove_dir_all(&tmp).expect("remove TMPDIR");
            results.push(dumps);
        }
        assert_eq!(
            results[1], results[0],
            "{name}: nuvec-launch (left) differs from mlx.launch (right)"
        );
    }
}

#[test]
fn a_login_banner_before_a_remote_ranks_pid_file_is_output_and_never_reaches_the_kill_script() {
    let _job = procs::exclusive();
    let tmp = scratch("banner");
    let bin = tmp.join("bin");
    std::fs::create_dir_all(&bin).expect("a bin directory");
    // A file named by the banner: a kill script that took the banner for the PID file's path
    // would `rm` it.
    let victim = tmp.join("victim");
    std::fs::write(&victim, "keep me").expect("the victim file");
    let log = tmp.join("kill-scripts.log");
    // A stand-in for ssh, first on PATH: a login banner (as conda's), then the command here.
    let ssh = bin.join("ssh");
    std::fs::write(
        &ssh,
        "#!/bin/sh\n\
         for script; do :; done\n\
         if [ \"$#\" -eq 2 ]; then printf '%s\\n' \"$script\" >> \"$FAKE_SSH_LOG\"; fi\n\
         echo \"conda: $FAKE_SSH_VICTIM activated\"\n\
         exec bash -c \"$script\"\n",
    )
    .expect("the fake ssh");
    let made = Command::new("chmod").arg("+x").arg(&ssh).status();
    assert!(made.is_ok_and(|s| s.success()), "chmod");
    // Rank 1 fails only once the test has seen rank 0 start (so rank 0's PID file line has
    // been read), and the launcher then stops rank 0 through its kill script.
    let go = tmp.join("go");
    let made = Command::new("mkfifo").arg(&go).status();
    assert!(made.is_ok_and(|s| s.success()), "mkfifo");
    let script = r#"if [ "$MLX_RANK" = 1 ]; then read go < "$FAKE_SSH_GO"; exit 7; fi
echo ready; sleep 30 & wait"#;
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut child = nuvec_launch(
        &tmp,
        &["--hosts", "127.0.0.2,127.0.0.3", "--", "sh", "-c", script],
    )
    .env("PATH", path)
    .env("FAKE_SSH_LOG", &log)
    .env("FAKE_SSH_VICTIM", &victim)
    .env("FAKE_SSH_GO", &go)
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::null())
    .spawn()
    .expect("spawn nuvec-launch");
    let launcher = child.id();
    let stdout = child.stdout.take().expect("stdout");
    let rx = lines(stdout);
    let mut lines = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut released = false;
    let ended_stream = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(Some(line)) => {
                if line == "[rank 0] ready" && !released {
                    released = true;
                    let go = go.clone();
                    // Blocks until rank 1 has opened the FIFO; detached, so a rank 1 that never
                    // started cannot hang the test (the deadline below fails it).
                    std::thread::spawn(move || std::fs::write(go, "go\n"));
                }
                lines.push(line);
            }
            Ok(None) => break true,
            Err(_) => break false,
        }
    };
    if !ended_stream {
        let mut pids = descendants(launcher);
        pids.push(launcher);
        kill("KILL", &pids);
        let _ = child.wait();
        panic!("the job did not end within 30 s:\n{}", lines.join("\n"));
    }
    let status = child.wait().expect("wait for nuvec-launch");
    let output = lines.join("\n");
    assert_eq!(status.code(), Some(7), "{output}");
    assert!(
        victim.exists(),
        "the banner's words reached the kill script's rm:\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let banner = format!("[rank 0] conda: {} activated", victim.display());
    assert!(
        lines.contains(&banner),
        "the banner is the rank's output: {output}"
    );
    let scripts = std::fs::read_to_string(&log).expect("a kill script ran");
    let pidfile = scripts
        .lines()
        .find_map(|s| s.strip_prefix("pid=$(cat ")?.split_once(')'))
        .map(|(path, _)| path.to_owned())
        .unwrap_or_else(|| panic!("no kill script: {scripts}"));
    assert!(
        pidfile.starts_with('/') && Path::new(&pidfile).starts_with(&*tmp),
        "{pidfile}"
    );
    assert!(!Path::new(&pidfile).exists(), "{pidfile} was not removed");
}

/// A failed job and `nuvec-launch diagnose` of the records it kept.
struct Failed {
    /// The job.
    job: Ran,
    /// `nuvec-launch diagnose DIR` on its `--dump-records DIR`.
    diagnosed: Ran,
}

/// `nuvec-launch -n 4 --dump-records DIR` of this binary in `role` with
/// `NUVEC_LAUNCH_TEST_FAILURE=how`, then `nuvec-launch diagnose DIR`; every temporary file is
/// checked removed.
fn failing_job(name: &str, role: &str, how: &str) -> Failed {
    let _job = procs::exclusive();
    let tmp = scratch(name);
    let dump = tmp.join("dump").display().to_string();
    let port = crate::common::ports::consecutive(4).to_string();
    let role = format!("{ROLE}={role}");
    let failure = format!("NUVEC_LAUNCH_TEST_FAILURE={how}");
    let mut args = vec![
        "-n",
        "4",
        "--starting-port",
        &port,
        "--dump-records",
        &dump,
        "--env",
        &role,
        "--env",
        &failure,
        "--env",
        // A stopped rank, or a mismatch on MLX's wire, is found by the others' deadline: a
        // short one.
        if how == "sigstop" || how == "mlx-wire" {
            "NUVEC_DISTRIBUTED_TIMEOUT=3"
        } else {
            "NUVEC_DISTRIBUTED_TIMEOUT=20"
        },
    ];
    if how == "mlx-wire" {
        args.extend(["--env", "NUVEC_DISTRIBUTED_WIRE=mlx"]);
    }
    args.push("--");
    let command = rank_command();
    args.extend(command.iter().map(String::as_str));
    let job = run(&mut nuvec_launch(&tmp, &args), Duration::from_secs(120));
    let diagnosed = run(
        &mut nuvec_launch(&tmp, &["diagnose", &dump]),
        Duration::from_secs(30),
    );
    let _ = std::fs::remove_dir_all(&dump);
    assert_eq!(entries(&tmp), Vec::<String>::new(), "temporary files left");
    Failed { job, diagnosed }
}

/// The launcher's own lines (`[ERROR] ...`, `[WARN] ...`) in `stderr`, in order.
fn launcher_lines(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.starts_with("[ERROR] ") || l.starts_with("[WARN] "))
        .collect()
}

/// What every summary of [`failing_job`] says of rank 1, the culprit: named first (the
/// first launcher line starts with `first`), MLX's line for it (`node`) before the others',
/// never called killed, what the others did in consequence, and the ranks' merged flight
/// records naming it as the first failure, with how it ended and what of its record: `left`
/// as the launcher says it (`ended with exit code 101, its record showing no error`: a rank
/// whose panic ends its program writes its record as it exits; `ended with signal ... and
/// left no record`: a killed one writes none), `alone` as `diagnose` says it from the files.
fn assert_rank_1_named_first(failed: &Failed, first: &str, node: &str, left: &str, alone: &str) {
    let done = &failed.job;
    let ours = launcher_lines(&done.stderr);
    assert!(
        ours.first().is_some_and(|l| l.starts_with(first)),
        "{}",
        done.describe()
    );
    let nodes: Vec<&&str> = ours
        .iter()
        .filter(|l| l.contains("Node with rank"))
        .collect();
    assert_eq!(
        nodes.first().map(|l| **l),
        Some(node),
        "{}",
        done.describe()
    );
    assert!(
        !ours
            .iter()
            .any(|l| l.contains("rank 1") && l.contains("killed")),
        "the culprit is never called killed: {}",
        done.describe()
    );
    assert!(
        ours.iter()
            .any(|l| l.starts_with("[ERROR] in consequence: ")),
        "{}",
        done.describe()
    );
    let named = format!("- the first failure: rank 1, which {left}; ");
    assert!(
        done.stderr.lines().any(|l| l.starts_with(&named)),
        "the merged records name rank 1 too: {}",
        done.describe()
    );
    let diagnosed = &failed.diagnosed;
    let named = format!("- the first failure: rank 1, which {alone}; ");
    assert!(
        diagnosed.stdout.lines().any(|l| l.starts_with(&named)),
        "diagnose names rank 1 from the files alone: {}",
        diagnosed.describe()
    );
}

#[test]
fn a_rank_that_panics_is_named_first_with_its_message_and_its_status_is_the_jobs() {
    for attempt in 0..3 {
        let failed = failing_job(&format!("panic-{attempt}"), "fail-after-all-sum", "panic");
        let done = &failed.job;
        assert_eq!(done.code, Some(101), "{}", done.describe());
        assert_rank_1_named_first(
            &failed,
            "[ERROR] rank 1 failed first: exit code 101, ",
            "[WARN] Node with rank 1 exited with code 101",
            "ended with exit code 101, its record showing no error",
            "recorded no error",
        );
        assert!(
            launcher_lines(&done.stderr)
                .iter()
                .any(|l| l.contains("rank 1 fails on purpose after its first all_sum")),
            "the panic's message is in the summary: {}",
            done.describe()
        );
    }
}

#[test]
fn a_rank_that_is_sigkilled_is_named_with_the_signal_and_the_job_exits_137() {
    let failed = failing_job("sigkill", "fail-after-all-sum", "sigkill");
    assert_eq!(failed.job.code, Some(137), "{}", failed.job.describe());
    assert_rank_1_named_first(
        &failed,
        "[ERROR] rank 1 failed first: signal SIGKILL (status 137), ",
        "[WARN] Node with rank 1 exited with code 137 (signal SIGKILL)",
        "ended with signal SIGKILL (status 137) and left no record",
        "left no record",
    );
}

#[test]
fn a_rank_that_is_sigstopped_is_named_by_the_merged_records_and_the_job_ends() {
    // Rank 1 stops itself after its first all_sum; its neighbours time out waiting for it
    // and exit 3; the launcher stops the job, the stopped rank included, and the ranks'
    // records name rank 1: stopped, it could write none.
    let failed = failing_job("sigstop", "fail-after-all-sum", "sigstop");
    let done = &failed.job;
    assert_eq!(done.code, Some(3), "{}", done.describe());
    assert!(
        done.stderr
            .lines()
            .any(|l| l.starts_with("- the first failure: rank 1, which ")
                && l.contains("left no record; ")),
        "the merged records name rank 1: {}",
        done.describe()
    );
    assert!(
        failed
            .diagnosed
            .stdout
            .lines()
            .any(|l| l.starts_with("- the first failure: rank 1, which left no record; ")),
        "diagnose names rank 1 from the files alone: {}",
        failed.diagnosed.describe()
    );
}

#[test]
fn a_rank_that_calls_another_collective_is_named_by_the_merged_records_and_diagnose() {
    let failed = failing_job("mismatch", "mismatch-after-all-sum", "");
    let done = &failed.job;
    assert_eq!(done.code, Some(3), "{}", done.describe());
    let finding = "- different operations at the same step: rank 1 is in all_gather #1, ranks \
                   0, 2, 3 in all_sum #1";
    assert!(
        done.stderr.lines().any(|l| l == finding),
        "{}",
        done.describe()
    );
    assert!(
        failed.diagnosed.stdout.lines().any(|l| l == finding),
        "{}",
        failed.diagnosed.describe()
    );
}

#[test]
fn a_rank_that_calls_another_collective_on_mlxs_wire_is_named_by_the_records_the_ranks_write_as_they_exit()
 {
    // MLX's wire carries no call: rank 1's all_gather and its neighbours' all_sums exchange
    // bytes that fit, some ranks return wrong numbers and exit 0, the others time out. The
    // ranks that exit 0 write their records as they exit, so the merged records still meet
    // every rank at the step where the programs parted.
    let failed = failing_job("mismatch-mlx", "mismatch-after-all-sum", "mlx-wire");
    let done = &failed.job;
    assert_eq!(done.code, Some(3), "{}", done.describe());
    let finding = "- different operations at the same step: rank 1 is in all_gather #1, ranks \
                   0, 2, 3 in all_sum #1";
    // Which ranks return (wrong numbers) and which time out depends on timing; some return.
    let wrong = " returned from step #1 without an error although the programs disagree there \
                 (MLX's wire carries no call to check): what ";
    let first = "- the first failure by time, a consequence of the disagreement at step #1: rank ";
    for (out, describe) in [
        (&done.stderr, done.describe()),
        (&failed.diagnosed.stdout, failed.diagnosed.describe()),
    ] {
        assert!(out.lines().any(|l| l == finding), "{describe}");
        assert!(
            out.lines()
                .any(|l| l.starts_with("- ") && l.contains(wrong)),
            "{describe}"
        );
        assert!(out.lines().any(|l| l.starts_with(first)), "{describe}");
    }
}

#[test]
fn a_job_whose_ranks_all_exit_0_after_a_disagreement_on_mlxs_wire_exits_1_with_their_records() {
    // Two ranks on MLX's wire: rank 1's all_gather and rank 0's all_sum both return (wrong
    // numbers) and both ranks exit 0; their records, written as they exit, disagree.
    let _job = procs::exclusive();
    let tmp = scratch("disagree-mlx");
    let port = crate::common::ports::consecutive(2).to_string();
    let role = format!("{ROLE}=mismatch-after-all-sum");
    let mut args = vec![
        "-n",
        "2",
        "--starting-port",
        &port,
        "--env",
        &role,
        "--env",
        "NUVEC_DISTRIBUTED_WIRE=mlx",
        "--",
    ];
    let command = rank_command();
    args.extend(command.iter().map(String::as_str));
    let done = run(&mut nuvec_launch(&tmp, &args), Duration::from_secs(120));
    assert_eq!(done.code, Some(1), "{}", done.describe());
    assert_eq!(
        done.stdout
            .lines()
            .filter(|l| l.contains("SECOND ["))
            .count(),
        2,
        "both ranks returned: {}",
        done.describe()
    );
    for line in [
        "[ERROR] every rank exited 0, but the ranks' programs disagree: what some returned is \
         wrong; the ranks' flight records:",
        "- different operations at the same step: rank 1 is in all_gather #1, rank 0 in \
         all_sum #1",
        "- ranks 0, 1 returned from step #1 without an error although the programs disagree \
         there (MLX's wire carries no call to check): what they returned is wrong",
    ] {
        assert!(
            done.stderr.lines().any(|l| l == line),
            "{line}: {}",
            done.describe()
        );
    }
    assert_eq!(entries(&tmp), Vec::<String>::new(), "temporary files left");
}

#[test]
fn a_host_that_ssh_cannot_resolve_shows_sshs_own_message() {
    let _job = procs::exclusive();
    let tmp = scratch("ssh-host");
    let hostfile = tmp.join("hosts.json");
    std::fs::write(
        &hostfile,
        r#"[{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]},
            {"ssh": "nuvec-launch-test.invalid", "ips": ["127.0.0.1"]}]"#,
    )
    .expect("write the host file");
    let hostfile = hostfile.display().to_string();
    let done = run(
        &mut nuvec_launch(&tmp, &["--hostfile", &hostfile, "--", "sleep", "30"]),
        Duration::from_secs(60),
    );
    assert_eq!(done.code, Some(255), "{}", done.describe());
    assert!(
        done.stderr
            .contains("[rank 1] ssh: Could not resolve hostname nuvec-launch-test.invalid"),
        "{}",
        done.describe()
    );
    let ours = launcher_lines(&done.stderr);
    assert!(
        ours.first()
            .is_some_and(|l| l.starts_with("[ERROR] rank 1 failed first: exit code 255")),
        "{}",
        done.describe()
    );
    assert!(
        ours.iter()
            .any(|l| l.contains("ssh: Could not resolve hostname")),
        "ssh's message is in the summary: {}",
        done.describe()
    );
    std::fs::remove_file(&hostfile).expect("remove the host file");
    assert_eq!(entries(&tmp), Vec::<String>::new(), "temporary files left");
}

/// A rank of the flight recorder's side, as a shell script (so that these tests do not
/// depend on the ranks' own recorder): it writes `rank-R.progress` once, prints `ready`,
/// then answers every new `request` by writing `rank-R.jsonl` (atomically) with rank 1 in
/// `all_gather #3` and the others in `all_sum #3`, all waiting; it ends after 30 s.
const RECORDING_RANK: &str = r#"d=$NUVEC_DISTRIBUTED_RECORD_DIR; r=$MLX_RANK
[ -d "$d" ] || { echo "no record directory: '$d'" >&2; exit 9; }
echo "{\"rank\":$r,\"completed\":3,\"last_end_us\":1764760000001200}" > "$d/rank-$r.progress"
op=all_sum; [ "$r" = 1 ] && op=all_gather
echo ready
i=0; last=
while [ $i -lt 300 ]; do
  if [ -f "$d/request" ]; then
    id=$(cat "$d/request")
    if [ "$id" != "$last" ]; then
      last=$id
      printf '{"record":1,"rank":%s,"size":4,"host":"here","pid":%s,"reason":"request","request":%s,"at_us":1764760009000000,"capacity":256,"dropped":0}\n{"group":"world","group_rank":%s,"group_size":4,"seq":3,"op":"%s","dtype":"float32","bytes":4096,"peers":[0,2],"start_us":1764760000002000,"end_us":null,"state":"running","waiting_on":[0],"moved":[[0,0]],"error":null}\n' "$r" $$ "$id" "$r" "$op" > "$d/rank-$r.jsonl.tmp"
      mv "$d/rank-$r.jsonl.tmp" "$d/rank-$r.jsonl"
      echo "answered $id"
    fi
  fi
  sleep 0.1; i=$((i+1))
done"#;

/// The mismatch the [`RECORDING_RANK`]s' records show.
const MISMATCH: &str = "different operations at the same step: rank 1 is in all_gather #3, ranks 0, 2, 3 in all_sum #3";

/// A running `nuvec-launch` whose output is read line by line.
struct Live {
    child: std::process::Child,
    /// Its standard input, when [`Live::start_fed`] started it.
    stdin: Option<std::process::ChildStdin>,
    stdout: std::sync::mpsc::Receiver<Option<String>>,
    stderr: std::sync::mpsc::Receiver<Option<String>>,
    seen: Vec<String>,
}

impl Live {
    fn start(cmd: &mut Command) -> Live {
        Live::spawn(cmd.stdin(Stdio::null()))
    }

    /// As [`Live::start`], with a pipe for its standard input.
    fn start_fed(cmd: &mut Command) -> Live {
        Live::spawn(cmd.stdin(Stdio::piped()))
    }

    fn spawn(cmd: &mut Command) -> Live {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn nuvec-launch");
        let stdout = lines(child.stdout.take().expect("stdout"));
        let stderr = lines(child.stderr.take().expect("stderr"));
        Live {
            stdin: child.stdin.take(),
            child,
            stdout,
            stderr,
            seen: Vec::new(),
        }
    }

    /// Waits (at most 30 s) until `count` lines of either stream satisfy `want`; kills the
    /// job and fails the test otherwise.
    fn wait_for(&mut self, count: usize, want: impl Fn(&str) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if self.seen.iter().filter(|l| want(l)).count() >= count {
                return;
            }
            let mut got = false;
            for rx in [&self.stdout, &self.stderr] {
                while let Ok(Some(line)) = rx.try_recv() {
                    self.seen.push(line);
                    got = true;
                }
            }
            if Instant::now() >= deadline {
                self.kill();
                panic!(
                    "not seen within 30 s; the output:\n{}",
                    self.seen.join("\n")
                );
            }
            if !got {
                // Both streams are polled, so neither blocks the other.
                let _ = self
                    .stdout
                    .recv_timeout(Duration::from_millis(20))
                    .map(|l| self.seen.extend(l));
            }
        }
    }

    fn kill(&mut self) {
        let pid = self.child.id();
        let mut pids = descendants(pid);
        pids.push(pid);
        kill("KILL", &pids);
        let _ = self.child.wait();
    }

    /// Waits (at most 30 s) for the launcher's end and the rest of its output.
    fn finish(&mut self) -> Option<i32> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut timed_out = false;
        for rx in [&self.stdout, &self.stderr] {
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                match rx.recv_timeout(left) {
                    Ok(Some(line)) => self.seen.push(line),
                    Ok(None) => break,
                    Err(_) => {
                        timed_out = true;
                        break;
                    }
                }
            }
        }
        if timed_out {
            self.kill();
            panic!("the job did not end within 30 s:\n{}", self.seen.join("\n"));
        }
        self.child.wait().expect("wait for nuvec-launch").code()
    }
}

#[test]
fn the_first_ctrl_c_prints_where_every_rank_is_and_the_second_stops_the_job() {
    let _job = procs::exclusive();
    let tmp = scratch("ctrl-c");
    let mut live = Live::start(&mut nuvec_launch(
        &tmp,
        &["-n", "4", "--", "sh", "-c", RECORDING_RANK],
    ));
    live.wait_for(4, |l| l.ends_with("] ready"));
    let launcher = live.child.id();
    let mut ranks = descendants(launcher);
    kill("INT", &[launcher]);
    live.wait_for(1, |l| l == format!("- {MISMATCH}"));
    assert!(
        live.seen.iter().any(|l| l.contains("4 of 4 answered")),
        "{}",
        live.seen.join("\n")
    );
    // The ranks were not interrupted: they are in their own process groups.
    live.wait_for(4, |l| l.contains("answered 1"));
    kill("INT", &[launcher]);
    let code = live.finish();
    let output = live.seen.join("\n");
    assert_eq!(code, Some(130), "{output}");
    assert!(
        output.contains("Ctrl-C again: stopping the job"),
        "{output}"
    );
    assert!(!output.contains("failed first"), "{output}");
    ranks.retain(|p| !ended(*p));
    assert_eq!(ranks, Vec::<u32>::new(), "ranks left running\n{output}");
    assert_eq!(entries(&tmp), Vec::<String>::new(), "temporary files left");
}

#[test]
fn a_job_that_completes_no_operation_for_the_hang_report_time_reports_itself() {
    let _job = procs::exclusive();
    let tmp = scratch("hang-report");
    let started = Instant::now();
    let mut live = Live::start(&mut nuvec_launch(
        &tmp,
        &[
            "-n",
            "4",
            "--hang-report",
            "1",
            "--",
            "sh",
            "-c",
            RECORDING_RANK,
        ],
    ));
    live.wait_for(1, |l| l == format!("- {MISMATCH}"));
    assert!(
        live.seen
            .iter()
            .any(|l| l.contains("no rank completed an operation for 1 s")),
        "{}",
        live.seen.join("\n")
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    let launcher = live.child.id();
    kill("INT", &[launcher]);
    // Two signals sent at once may reach the launcher as one (a pending signal is not
    // counted twice): the second follows the first's report.
    live.wait_for(1, |l| l.contains("Ctrl-C (press it again to stop the job)"));
    kill("INT", &[launcher]);
    assert_eq!(live.finish(), Some(130), "{}", live.seen.join("\n"));
    assert_eq!(entries(&tmp), Vec::<String>::new(), "temporary files left");
}

#[test]
fn after_a_failure_the_records_are_merged_under_the_summary_and_kept_for_diagnose() {
    let _job = procs::exclusive();
    let tmp = scratch("records");
    let dump = tmp.join("dump");
    // Rank 2 fails first (its all_sum #4 ended first, by time), writes its record and exits;
    // rank 0 writes one too and waits; the others record nothing.
    let script = r#"d=$NUVEC_DISTRIBUTED_RECORD_DIR; r=$MLX_RANK
rec() { printf '{"record":1,"rank":%s,"size":4,"host":"here","pid":%s,"reason":"failure","request":null,"at_us":1764760009000000,"capacity":256,"dropped":0}\n{"group":"world","group_rank":%s,"group_size":4,"seq":4,"op":"all_sum","dtype":"float32","bytes":4096,"peers":[1,3],"start_us":1764760000002000,"end_us":%s,"state":"failed","waiting_on":[],"moved":[[1,0]],"error":"%s"}\n' "$r" $$ "$r" "$1" "$2" > "$d/rank-$r.jsonl.tmp"; mv "$d/rank-$r.jsonl.tmp" "$d/rank-$r.jsonl"; }
if [ "$r" = 2 ]; then rec 1764760000003000 "rank 2: out of memory"; echo "rank 2 gives up" >&2; exit 5; fi
if [ "$r" = 0 ]; then rec 1764760000004000 "rank 0: the connection was closed by the peer"; fi
exec sleep 30"#;
    let dump_arg = dump.display().to_string();
    let done = run(
        &mut nuvec_launch(
            &tmp,
            &[
                "-n",
                "4",
                "--dump-records",
                &dump_arg,
                "--",
                "sh",
                "-c",
                script,
            ],
        ),
        Duration::from_secs(60),
    );
    assert_eq!(done.code, Some(5), "{}", done.describe());
    let ours = launcher_lines(&done.stderr);
    assert!(
        ours.first()
            .is_some_and(|l| l.starts_with("[ERROR] rank 2 failed first: exit code 5")),
        "{}",
        done.describe()
    );
    assert!(
        done.stderr.contains("[ERROR] the ranks' flight records:")
            && done
                .stderr
                .contains("- the first failure by time: rank 2, all_sum #4: rank 2: out of memory"),
        "{}",
        done.describe()
    );
    assert_eq!(
        entries(&dump),
        ["rank-0.jsonl", "rank-2.jsonl"],
        "the kept records"
    );

    // The kept records, read again as a user would.
    let dump_arg = dump.display().to_string();
    let table = run(
        &mut nuvec_launch(&tmp, &["diagnose", &dump_arg]),
        Duration::from_secs(30),
    );
    assert_eq!(table.code, Some(0), "{}", table.describe());
    assert!(
        table.stdout.contains("rank 1 left no record")
            && table.stdout.contains("the first failure by time: rank 2"),
        "{}",
        table.describe()
    );
    let json = run(
        &mut nuvec_launch(&tmp, &["diagnose", "--json", &dump_arg]),
        Duration::from_secs(30),
    );
    assert_eq!(json.code, Some(0), "{}", json.describe());
    let value: serde_json::Value = serde_json::from_str(&json.stdout).expect("JSON");
    assert_eq!(value["size"], 4);
    assert_eq!(value["missing"], serde_json::json!([1, 3]));
    assert_eq!(value["rows"][1]["op"]["error"], "rank 2: out of memory");
    std::fs::remove_dir_all(&dump).expect("remove the records");
    assert_eq!(entries(&tmp), Vec::<String>::new(), "temporary files left");

    // A directory without records is an error.
    let empty = run(
        &mut nuvec_launch(&tmp, &["diagnose", &tmp.display().to_string()]),
        Duration::from_secs(30),
    );
    assert_eq!(empty.code, Some(1), "{}", empty.describe());
}

/// A `PATH` whose first directory (in `tmp`) holds a stand-in for ssh that runs its last
/// argument (the script) here.
fn fake_ssh_path(tmp: &Path) -> String {
    let bin = tmp.join("bin");
    std::fs::create_dir_all(&bin).expect("a bin directory");
    let ssh = bin.join("ssh");
    std::fs::write(
        &ssh,
        "#!/bin/sh\nfor script; do :; done\nexec bash -c \"$script\"\n",
    )
    .expect("the fake ssh");
    let made = Command::new("chmod").arg("+x").arg(&ssh).status();
    assert!(made.is_ok_and(|s| s.success()), "chmod");
    format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// The remote record directory a rank's line `wrote DIR` names.
fn remote_dir(done: &Ran) -> String {
    let remote = done
        .stderr
        .lines()
        .find_map(|l| l.split_once("wrote ").map(|(_, d)| d.trim().to_owned()))
        .unwrap_or_else(|| panic!("{}", done.describe()));
    assert!(remote.starts_with("/tmp/nuvec-launch-records-"), "{remote}");
    remote
}

#[test]
fn a_remote_ranks_record_directory_is_removed_after_a_job_that_succeeds() {
    let _job = procs::exclusive();
    let tmp = scratch("remote-records-ok");
    let path = fake_ssh_path(&tmp);
    // Rank 1 (through "ssh") says where its directory is and leaves a file in it.
    let script = r#"d=$NUVEC_DISTRIBUTED_RECORD_DIR
if [ "$MLX_RANK" = 1 ]; then echo "wrote $d" >&2; touch "$d/rank-1.progress"; fi"#;
    let done = run(
        nuvec_launch(
            &tmp,
            &["--hosts", "127.0.0.1,127.0.0.2", "--", "sh", "-c", script],
        )
        .env("PATH", path),
        Duration::from_secs(60),
    );
    assert_eq!(done.code, Some(0), "{}", done.describe());
    let remote = remote_dir(&done);
    assert!(!Path::new(&remote).exists(), "{remote} was not removed");
}

#[test]
fn a_remote_ranks_record_is_fetched_over_ssh_after_a_failure() {
    let _job = procs::exclusive();
    let tmp = scratch("remote-records");
    let path = fake_ssh_path(&tmp);
    // Rank 1 (through "ssh") writes its record in the remote directory and fails.
    let script = r#"d=$NUVEC_DISTRIBUTED_RECORD_DIR; r=$MLX_RANK
if [ "$r" = 1 ]; then
  printf '{"record":1,"rank":1,"size":2,"host":"far","pid":%s,"reason":"failure","request":null,"at_us":1764760009000000,"capacity":256,"dropped":0}\n{"group":"world","group_rank":1,"group_size":2,"seq":0,"op":"all_max","dtype":"int32","bytes":64,"peers":[0],"start_us":1764760000002000,"end_us":1764760000003000,"state":"failed","waiting_on":[],"moved":[[0,0]],"error":"rank 1: far away"}\n' $$ > "$d/rank-1.jsonl"
  echo "wrote $d" >&2; exit 4
fi
exec sleep 30"#;
    let done = run(
        nuvec_launch(
            &tmp,
            &["--hosts", "127.0.0.1,127.0.0.2", "--", "sh", "-c", script],
        )
        .env("PATH", path),
        Duration::from_secs(60),
    );
    assert_eq!(done.code, Some(4), "{}", done.describe());
    assert!(
        done.stderr
            .contains("- the first failure by time: rank 1, all_max #0: rank 1: far away"),
        "{}",
        done.describe()
    );
    let remote = remote_dir(&done);
    assert!(!Path::new(&remote).exists(), "{remote} was not removed");
    // The "remote" script's own mktemp files (PID file, hostfile) stay, as mlx.launch's do
    // on a remote host; the launcher's local record directory does not.
    let left = entries(&tmp);
    assert!(!left.iter().any(|n| n.contains("records")), "{left:?}");
}

#[test]
fn in_a_terminal_ctrl_c_reaches_the_launcher_only_and_standard_input_still_reaches_the_ranks() {
    use std::io::Write;
    // util-linux's `script` gives the launcher a terminal, whose Ctrl-C byte the terminal
    // turns into SIGINT for its foreground process group.
    let has_script = Command::new("script")
        .arg("--version")
        .output()
        .is_ok_and(|o| {
            o.status.success() && String::from_utf8_lossy(&o.stdout).contains("util-linux")
        });
    if !has_script {
        eprintln!("skipped: no util-linux `script` to give the launcher a terminal");
        return;
    }
    let _job = procs::exclusive();
    let tmp = scratch("terminal");
    let launcher = format!(
        "{} -n 2 -- sh -c 'echo ready; while read -r l; do echo \"got $l\"; done; echo eof'",
        nuvec_launch_binary().display()
    );
    let mut cmd = Command::new("script");
    cmd.args(["-qec", &launcher, "/dev/null"])
        .env("TMPDIR", &*tmp)
        .env_remove("COLUMNS")
        .env_remove("LINES");
    let mut live = Live::start_fed(&mut cmd);
    live.wait_for(2, |l| l.contains("] ready"));
    let mut terminal = live.stdin.take().expect("script's input");
    terminal.write_all(b"hello\n").expect("type a line");
    live.wait_for(2, |l| l.contains("] got hello"));
    terminal.write_all(&[3]).expect("type Ctrl-C");
    live.wait_for(1, |l| l.contains("press it again to stop the job"));
    // The ranks were not interrupted: they still read the terminal's lines.
    terminal.write_all(b"again\n").expect("type a line");
    live.wait_for(2, |l| l.contains("] got again"));
    terminal.write_all(&[3]).expect("type Ctrl-C");
    let code = live.finish();
    let output = live.seen.join("\n");
    assert_eq!(code, Some(130), "{output}");
    assert!(
        output.contains("Ctrl-C again: stopping the job"),
        "{output}"
    );
    assert_eq!(entries(&tmp), Vec::<String>::new(), "temporary files left");
}
