//! A cluster on one machine (network namespaces on a bridge, shaped links, an sshd per host;
//! see `tests/cluster/mod.rs`): ring jobs of 2–4 hosts launched over ssh by nuvec-launch and
//! mlx.launch, the tensor-parallel example (`examples/tensor_parallel.rs`) on 2 and 4 hosts on
//! both wires under nuvec-launch and once under mlx.launch (and, ignored, the README's figures
//! of it), a mixed Python MLX and Rust job, JACCL mesh and ring over TCP and (feature `jaccl`)
//! over the RDMA fabric on the software provider's TCP wire, a hostfile of host names,
//! and the faults of a network: a pulled cable (ring, also under nuvec-launch, whose merged
//! flight records name the cut host's rank; and JACCL over RDMA), Ctrl-C on a job stuck
//! across hosts (the records fetched over ssh), `--hang-report` across hosts (silent while
//! remote ranks complete operations, naming the stuck one once they stop), a glitch shorter
//! than the timeout, a slow host and a stranger during setup; and `nuvec-launch doctor` on a
//! clean cluster (against iperf3, its all_sum sweep against the slowest link), a host at a
//! tenth of the rate (the sweep names one of its links), a host file address on a second,
//! slower NIC, a firewall dropping the ring's port, and a JACCL mesh swept over TCP cables.
//!
//! Runs as root (CI); elsewhere every test prints why it skips, but under `CI=true` a cluster
//! that cannot be made fails. One cluster at a time: every test holds [`exclusive`]. The
//! measured times are printed as `MEASURED ...` lines (`--nocapture` shows them) and are the
//! README's fault table.
//!
//! About 1100 lines, one file: the tests share the rank roles and job helpers here, and the
//! cluster's harness is `tests/cluster/mod.rs`.

#[path = "cluster/mod.rs"]
mod cluster;
mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use cluster::Cluster;
#[cfg(feature = "jaccl")]
use common::emu;
use common::run::{Ran, run, tagged};
use common::{launcher, procs};
use nuvec_core::{distributed, ops};
use nuvec_distributed::{Options, connect_ring};

/// The test a rank of a cluster job runs (this binary again).
const RANK_TEST: &str = concat!(module_path!(), "::a_cluster_rank_runs_its_role");
/// What a rank does (see [`a_cluster_rank_runs_its_role`]).
const ROLE: &str = "NUVEC_CLUSTER_ROLE";
/// The ring's port on every host in the jobs this test starts itself.
const PORT: u16 = 5000;

/// One cluster at a time, one job at a time.
fn exclusive() -> std::sync::MutexGuard<'static, ()> {
    procs::exclusive()
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn unix_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}

fn env_or(key: &str, default: &str) -> String {
    std::env::var(key).unwrap_or_else(|_| default.to_owned())
}

/// A rank of a cluster job when `NUVEC_CLUSTER_ROLE` is set; nothing otherwise.
///
/// - `launched`: joins from the launcher's environment (`init`) and prints the all_sum of
///   `[rank, 1]`;
/// - `loop`: joins the ring `NUVEC_CLUSTER_NODES` (JSON) as `NUVEC_CLUSTER_RANK` with the
///   timeout `NUVEC_CLUSTER_TIMEOUT_MS` (and the key `NUVEC_CLUSTER_KEY` if set), prints
///   `READY`, then runs `NUVEC_CLUSTER_ITERS` all_sums of `NUVEC_CLUSTER_BYTES` bytes of
///   `rank + 1`, checking every value; on a failure prints `FAILED`, the wall clock and the
///   error, then the error of one more all_sum (`AGAIN`) and the group's failure;
/// - `stranger`: connects to `NUVEC_CLUSTER_TARGET` (retrying while nobody listens), sends
///   `NUVEC_CLUSTER_SEND` (`garbage` or `nothing`), prints `CONNECTED` and holds the
///   connection for 30 s or until the peer closes it.
#[test]
fn a_cluster_rank_runs_its_role() {
    if std::env::var(ROLE).is_ok() {
        // The harness printed `test ... ` without a newline: every tagged line starts a line.
        println!();
    }
    match std::env::var(ROLE).as_deref() {
        Ok("launched") => launched_rank(),
        Ok("launched-loop") => launched_loop_rank(),
        Ok("stuck") => stuck_rank(),
        Ok("busy-then-stuck") => busy_then_stuck_rank(),
        Ok("disagree") => disagreeing_rank(),
        Ok("loop") => loop_rank(),
        Ok("stranger") => stranger(),
        _ => {}
    }
}

fn launched_rank() {
    let result = common::run::launched_all_sum();
    if std::env::var("NUVEC_CLUSTER_LARGE").as_deref() == Ok("1") {
        // The group is initialised: this returns it.
        let group = nuvec_distributed::init(true).expect("the group");
        large_collectives(group.rank(), group.size());
    }
    println!("RESULT {result}");
}

/// A launched rank that runs all_sums of 4 MiB until one fails, printing `ITER` after each;
/// on a failure it prints the error and exits 1 (at most 10 000 all_sums).
fn launched_loop_rank() {
    let group = nuvec_distributed::init(true).expect("the group");
    let x = ops::full([1usize << 20], 1.0f32);
    for i in 0..10_000 {
        if let Err(e) = distributed::all_sum(&x, Some(&group)).eval() {
            eprintln!("rank {}: {e}", group.rank());
            std::process::exit(1);
        }
        println!("ITER {i}");
    }
}

/// A launched rank that does one all_sum and prints `JOINED`; then rank 2 is stuck in its
/// own code (a sleep of at most 60 s, as a deadlock would be) while the others wait for it in
/// their second all_sum.
fn stuck_rank() {
    let group = nuvec_distributed::init(true).expect("the group");
    let x = ops::full([1024usize], 1.0f32);
    distributed::all_sum(&x, Some(&group))
        .eval()
        .expect("the first all_sum");
    println!("JOINED");
    if group.rank() == 2 {
        std::thread::sleep(Duration::from_secs(60));
    }
    let _ = distributed::all_sum(&x, Some(&group)).eval();
}

/// A launched rank that twice completes 60 all_sums 50 ms apart (3 s and more) and prints
/// `LOOPED 0` and `LOOPED 1`; after the first, rank 1 pauses in its own code for 8 s (as a
/// checkpoint would) and the others wait for it; after the second it is stuck (a sleep of at
/// most 60 s) while the others wait for it in their next all_sum.
fn busy_then_stuck_rank() {
    let group = nuvec_distributed::init(true).expect("the group");
    let x = ops::full([4usize], 1.0f32);
    for (round, pause) in [(0, 8), (1, 60)] {
        for _ in 0..60 {
            distributed::all_sum(&x, Some(&group))
                .eval()
                .expect("an all_sum");
            std::thread::sleep(Duration::from_millis(50));
        }
        println!("LOOPED {round}");
        if group.rank() == 1 {
            std::thread::sleep(Duration::from_secs(pause));
        }
    }
    let _ = distributed::all_sum(&x, Some(&group)).eval();
}

/// One all_sum; then rank 1 calls all_gather where the others call all_sum. Prints `SECOND
/// returned` and exits 0 when its call returns (on MLX's wire, wrong numbers), else `SECOND
/// failed` and exits 3.
fn disagreeing_rank() {
    let group = nuvec_distributed::init(true).expect("the group");
    let x = ops::full([4usize], 1.0f32);
    distributed::all_sum(&x, Some(&group))
        .eval()
        .expect("the first all_sum");
    let second = if group.rank() == 1 {
        distributed::all_gather(&x, Some(&group))
    } else {
        distributed::all_sum(&x, Some(&group))
    };
    match second.eval() {
        Ok(()) => println!("SECOND returned"),
        Err(e) => {
            println!("SECOND failed: {e}");
            std::process::exit(3);
        }
    }
}

/// An all_sum and an all_max of 4 MiB of float32 (past every frame and algorithm threshold),
/// each element checked; prints `LARGE ok`.
fn large_collectives(r: usize, n: usize) {
    const ELEMENTS: usize = 1 << 20;
    let values: Vec<f32> = (0..ELEMENTS).map(|i| (i % 7 + r) as f32).collect();
    let x = nuvec_core::Array::from_slice(&values, [ELEMENTS as i32]);
    let sum = distributed::all_sum(&x, None)
        .to_vec::<f32>()
        .expect("the large all_sum");
    let max = distributed::all_max(&x, None)
        .to_vec::<f32>()
        .expect("the large all_max");
    let base = (n * (n - 1) / 2) as f32;
    for i in 0..ELEMENTS {
        let m = (i % 7) as f32;
        assert_eq!(sum[i], m * n as f32 + base, "all_sum element {i}");
        assert_eq!(max[i], m + (n - 1) as f32, "all_max element {i}");
    }
    println!("LARGE ok rank={r}");
}

fn loop_rank() {
    let nodes: Vec<Vec<String>> =
        serde_json::from_str(&env_or("NUVEC_CLUSTER_NODES", "[]")).expect("the nodes");
    let rank: usize = env_or("NUVEC_CLUSTER_RANK", "0").parse().expect("rank");
    // "default": the operation timeout left at its default.
    let timeout = env_or("NUVEC_CLUSTER_TIMEOUT_MS", "10000");
    let iters: usize = env_or("NUVEC_CLUSTER_ITERS", "1").parse().expect("iters");
    let bytes: usize = env_or("NUVEC_CLUSTER_BYTES", "4096")
        .parse()
        .expect("bytes");
    let mut options = match timeout.as_str() {
        "default" => Options::new(),
        ms => Options::new().timeout(Duration::from_millis(ms.parse().expect("timeout"))),
    };
    if let Ok(ms) = std::env::var("NUVEC_CLUSTER_LINK_TIMEOUT_MS") {
        options = options.link_timeout(Duration::from_millis(ms.parse().expect("link timeout")));
    }
    // A pause after each all_sum: the links idle between collectives.
    let pause: u64 = env_or("NUVEC_CLUSTER_PAUSE_MS", "0")
        .parse()
        .expect("pause");
    if let Ok(key) = std::env::var("NUVEC_CLUSTER_KEY") {
        options = options.key(key).expect("a key");
    }
    if let Ok(gate) = std::env::var("NUVEC_CLUSTER_GATE") {
        // Holds this rank back until the test says go (bounded).
        let deadline = Instant::now() + Duration::from_secs(30);
        while !Path::new(&gate).exists() {
            assert!(Instant::now() < deadline, "the gate never opened");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let started = Instant::now();
    // JACCL joins from MLX's JACCL variables (`NUVEC_CLUSTER_JACCL=1`), the ring from the nodes.
    let joined = if std::env::var("NUVEC_CLUSTER_JACCL").as_deref() == Ok("1") {
        nuvec_distributed::init_backend(true, nuvec_distributed::Backend::Jaccl)
            .map(|group| (group, None))
            .map_err(|e| e.to_string())
    } else {
        connect_ring(&nodes, rank, &options)
            .map(|handle| (handle.group(), Some(handle)))
            .map_err(|e| e.to_string())
    };
    let (group, handle) = match joined {
        Ok(joined) => joined,
        Err(e) => {
            println!(
                "SETUP_FAILED at={} after_ms={} {e}",
                unix_ms(),
                started.elapsed().as_millis()
            );
            std::process::exit(3);
        }
    };
    println!("SETUP_MS {}", started.elapsed().as_millis());
    let n = group.size();
    let want = (n * (n + 1) / 2) as f32;
    let x = ops::full([bytes / 4], (rank + 1) as f32);
    println!("READY at={}", unix_ms());
    let all = Instant::now();
    for i in 0..iters {
        let op = Instant::now();
        match distributed::all_sum(&x, Some(&group)).to_vec::<f32>() {
            Ok(v) => {
                let wrong = v.iter().position(|&y| y != want);
                assert!(
                    wrong.is_none(),
                    "iteration {i}: element {wrong:?} is not {want}"
                );
                println!("ITER {i} ms={}", op.elapsed().as_millis());
                if pause > 0 {
                    // Work elsewhere between collectives: a fixed pause, not a wait.
                    std::thread::sleep(Duration::from_millis(pause));
                }
            }
            Err(e) => {
                println!(
                    "FAILED at={} op_ms={} iter={i} {e}",
                    unix_ms(),
                    op.elapsed().as_millis()
                );
                let again = Instant::now();
                match distributed::all_sum(&x, Some(&group)).to_vec::<f32>() {
                    Ok(_) => println!("AGAIN succeeded"),
                    Err(e) => println!("AGAIN ms={} {e}", again.elapsed().as_millis()),
                }
                if let Some(handle) = &handle {
                    println!("FAILURE {:?}", handle.failure().map(|e| e.to_string()));
                }
                std::process::exit(1);
            }
        }
    }
    println!("DONE ms={}", all.elapsed().as_millis());
}

fn stranger() {
    let target = env_or("NUVEC_CLUSTER_TARGET", "");
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut stream = loop {
        match TcpStream::connect(&target) {
            Ok(s) => break s,
            Err(e) => {
                assert!(Instant::now() < deadline, "cannot connect to {target}: {e}");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    };
    if env_or("NUVEC_CLUSTER_SEND", "nothing") == "garbage" {
        let _ = stream.write_all(&[0x42; 64]);
    }
    println!("CONNECTED at={}", unix_ms());
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let mut buf = [0u8; 256];
    let _ = stream.read(&mut buf);
    println!("CLOSED at={}", unix_ms());
}

/// The command that runs this binary as a rank with `role`.
fn rank_command(role: &str) -> Command {
    let mut cmd = procs::this_test(RANK_TEST);
    cmd.env(ROLE, role);
    cmd
}

/// The argv of a launched rank (the launcher passes `ROLE` and the child gate with `--env`).
fn launched_argv() -> Vec<String> {
    procs::this_test_argv(RANK_TEST)
}

/// Checks that every one of `n` ranks printed the all_sum of `[rank, 1]`.
fn check_results(what: &str, done: &Ran, n: usize) {
    assert_eq!(
        done.code,
        Some(0),
        "{what}: exit {:?}\n{}",
        done.code,
        done.output()
    );
    let got = tagged(&done.output(), "RESULT");
    let total = (0..n).sum::<usize>() as f32;
    let want: BTreeMap<usize, String> = (0..n)
        .map(|r| {
            (
                r,
                format!("rank={r} size={n} sum=[{total:?}, {:?}]", n as f32),
            )
        })
        .collect();
    assert_eq!(got, want, "{what}:\n{}", done.output());
}

/// A launcher (nuvec-launch or mlx.launch) run on host 0 with the cluster's ssh.
fn launcher(c: &Cluster, program: &Path, args: &[String]) -> Command {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env("PATH", c.path())
        .env_remove("COLUMNS")
        .env_remove("LINES")
        .current_dir(repo());
    c.on(0, cmd)
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn the_cluster_is_made_reached_over_ssh_cut_and_removed() {
    let _one = exclusive();
    let Some(c) = cluster::make(3, "1gbit") else {
        return;
    };
    let pid = std::process::id();
    // Host 0 reaches host 2 by name and by address; the command runs in host 2's namespace.
    let done = run(
        &mut c.ssh(
            0,
            "host2",
            "ip -o -4 addr show scope global; getent hosts host1",
        ),
        Duration::from_secs(30),
    );
    assert_eq!(done.code, Some(0), "{}", done.output());
    assert!(
        done.output().contains("inet 198.18.0.3/24") && done.output().contains("198.18.0.2 "),
        "{}",
        done.output()
    );
    // The cable pulled: no login; plugged back: a login again.
    c.pull(2);
    let mut cut_cmd = c.on(0, {
        let mut ssh = Command::new("ssh");
        ssh.arg("-F").arg(c.dir.join("ssh_config")).args([
            "-o",
            "ConnectTimeout=2",
            "198.18.0.3",
            "true",
        ]);
        ssh
    });
    let done = run(&mut cut_cmd, Duration::from_secs(30));
    assert_ne!(done.code, Some(0), "a login through a pulled cable");
    c.plug(2);
    let done = run(&mut c.ssh(0, "198.18.0.3", "true"), Duration::from_secs(30));
    assert_eq!(done.code, Some(0), "{}", done.output());
    let dir = c.dir.clone();
    drop(c);
    let left = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    let left = String::from_utf8_lossy(&left.stdout);
    assert!(
        !left.contains(&format!("nuvec-cl-{pid}-")),
        "namespaces left: {left}"
    );
    let links = Command::new("ip")
        .args(["-o", "link"])
        .output()
        .expect("ip link");
    assert!(
        !String::from_utf8_lossy(&links.stdout).contains(&format!("ncl{pid}")),
        "links left"
    );
    assert!(!dir.exists(), "{} left", dir.display());
}

#[test]
fn rings_of_two_to_four_hosts_with_one_and_two_connections_run_under_both_launchers_over_ssh() {
    let _one = exclusive();
    let Some(c) = cluster::make(4, "1gbit") else {
        return;
    };
    let mut launchers = vec![launcher::nuvec_launch().to_path_buf()];
    if let Some(bin) = common::venv::bin_with("mlx.launch", "the MLX part") {
        launchers.push(bin.join("mlx.launch"));
    }
    for program in &launchers {
        for n in 2..=4 {
            for conns in 1..=2 {
                let hosts: Vec<usize> = (0..n).collect();
                let mut args = strings(&[
                    "--hosts",
                    &c.host_list(&hosts),
                    "--backend",
                    "ring",
                    "--connections-per-ip",
                    &conns.to_string(),
                    "--env",
                    &format!("{ROLE}=launched"),
                    "--env",
                    &format!("{}={RANK_TEST}", procs::CHILD),
                    "--env",
                    "NUVEC_DISTRIBUTED_TIMEOUT=20",
                    "--",
                ]);
                args.extend(launched_argv());
                let started = Instant::now();
                let done = run(&mut launcher(&c, program, &args), Duration::from_secs(90));
                let what = format!("{} hosts, {conns} connections, {}", n, program.display());
                check_results(&what, &done, n);
                eprintln!("MEASURED job {what}: {:?}", started.elapsed());
            }
        }
    }
}

#[test]
fn a_mixed_job_of_python_mlx_and_rust_ranks_across_hosts_agrees() {
    let _one = exclusive();
    let Some(bin) = common::venv::bin_with("mlx.launch", "the MLX part") else {
        return;
    };
    let Some(c) = cluster::make(4, "1gbit") else {
        return;
    };
    let python = bin.join("python").display().to_string();
    let rust = launched_argv()
        .iter()
        .map(|a| format!("'{a}'"))
        .collect::<Vec<_>>()
        .join(" ");
    // Ranks 0 and 2 are MLX, 1 and 3 this crate.
    let script = format!(
        "if [ $((MLX_RANK % 2)) = 0 ]; then exec '{python}' -c \"import mlx.core as mx
g = mx.distributed.init(strict=True, backend='ring')
s = mx.distributed.all_sum(mx.array([float(g.rank()), 1.0]))
print(f'RESULT rank={{g.rank()}} size={{g.size()}} sum={{[float(v) for v in s.tolist()]}}', flush=True)\"
else exec {rust}; fi"
    );
    for program in [
        bin.join("mlx.launch"),
        launcher::nuvec_launch().to_path_buf(),
    ] {
        let mut args = strings(&[
            "--hosts",
            &c.host_list(&[0, 1, 2, 3]),
            "--backend",
            "ring",
            "--env",
            &format!("{ROLE}=launched"),
            "--env",
            &format!("{}={RANK_TEST}", procs::CHILD),
            "--env",
            "NUVEC_DISTRIBUTED_TIMEOUT=20",
            "--",
            "sh",
            "-c",
        ]);
        args.push(script.clone());
        let done = run(&mut launcher(&c, &program, &args), Duration::from_secs(90));
        check_results(&format!("mixed, {}", program.display()), &done, 4);
    }
}

/// The tensor-parallel example (`examples/tensor_parallel.rs`), built in this test's profile.
fn tensor_parallel_example() -> PathBuf {
    common::built::example("tensor_parallel")
}

/// What rank 0 of a tensor-parallel job printed as its figures: the line `per token: p50 …`
/// and the line `one process: …` (its own run of the whole model, in the same job).
struct Decoded {
    /// `per token: p50 … ms, p99 … ms; … tokens/s; collectives …% of a token (…)`.
    figures: String,
    /// `one process: p50 … ms; … tokens/s`.
    single: String,
}

/// Checks a finished run of the tensor-parallel example on `ranks` ranks: its exit status,
/// the example's own check on rank 0 (tokens and logits against the same model in one
/// process) and the wire the job agreed on, then returns rank 0's figures.
fn decoded(what: &str, done: &Ran, ranks: usize, wire: &str) -> Decoded {
    assert_eq!(done.code, Some(0), "{what}: {}", done.describe());
    let out = done.output();
    let line = |start: &str| {
        out.lines()
            .find_map(|l| l.find(start).map(|at| l[at..].trim_end().to_owned()))
            .unwrap_or_else(|| panic!("{what}: no line {start:?}:\n{}", done.describe()))
    };
    line(&format!(
        "tokens identical to the single-process model's on all {ranks} ranks"
    ));
    assert!(
        line(&format!("{ranks} ranks, ")).ends_with(&format!("; wire: {wire}")),
        "{what}: not on the {wire} wire:\n{}",
        done.describe()
    );
    line("tokens: [");
    Decoded {
        figures: line("per token: p50 "),
        single: line("one process: p50 "),
    }
}

/// A run of the tensor-parallel example decoding `tokens` tokens, one rank on each of `hosts`
/// of `c`, started over ssh from host 0 by `program` (nuvec-launch or mlx.launch), with the
/// `VAR=value`s of `env` set on every rank.
fn tensor_parallel_on_hosts(
    c: &Cluster,
    program: &Path,
    hosts: &[usize],
    tokens: usize,
    env: &[&str],
) -> Ran {
    let mut args = strings(&[
        "--hosts",
        &c.host_list(hosts),
        "--backend",
        "ring",
        "--env",
        "NUVEC_DISTRIBUTED_TIMEOUT=20",
    ]);
    for var in env {
        args.extend(strings(&["--env", var]));
    }
    args.push("--".to_owned());
    args.push(tensor_parallel_example().display().to_string());
    args.extend(strings(&["--tokens", &tokens.to_string()]));
    run(&mut launcher(c, program, &args), Duration::from_secs(120))
}

/// The program's file name, for messages (`nuvec-launch`, `mlx.launch`).
fn program_name(program: &Path) -> String {
    program
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

#[test]
fn the_tensor_parallel_decoder_on_two_and_four_hosts_matches_the_one_process_model_on_both_wires_and_under_mlx_launch()
 {
    let _one = exclusive();
    let Some(c) = cluster::make(4, "1gbit") else {
        return;
    };
    let nuvec = launcher::nuvec_launch().to_path_buf();
    let mlx =
        common::venv::bin_with("mlx.launch", "the mlx.launch part").map(|b| b.join("mlx.launch"));
    for n in [2, 4] {
        let hosts: Vec<usize> = (0..n).collect();
        // (launcher, the wire asked for, the wire the job must agree on); mlx.launch once, on
        // 4 hosts (its ranks are all this crate, so they agree on the nuvec wire).
        let mut jobs = vec![(&nuvec, None, "nuvec"), (&nuvec, Some("mlx"), "mlx")];
        if let Some(mlx) = mlx.as_ref().filter(|_| n == 4) {
            jobs.push((mlx, None, "nuvec"));
        }
        for (program, asked, wire) in jobs {
            let env: Vec<String> = asked
                .map(|w| format!("NUVEC_DISTRIBUTED_WIRE={w}"))
                .into_iter()
                .collect();
            let env: Vec<&str> = env.iter().map(String::as_str).collect();
            let done = tensor_parallel_on_hosts(&c, program, &hosts, 4, &env);
            let what = format!(
                "tensor_parallel on {n} hosts under {}, wire {}",
                program_name(program),
                asked.unwrap_or("auto")
            );
            let got = decoded(&what, &done, n, wire);
            eprintln!(
                "MEASURED {what} ({wire}), 4 tokens: {}; {}; the job took {:?}",
                got.figures, got.single, done.elapsed
            );
        }
    }
}

/// The number after `key` in `line` (up to the next space, `%` or `;`).
fn number_after(line: &str, key: &str) -> f64 {
    line.split_once(key)
        .and_then(|(_, rest)| {
            rest.split([' ', '%', ';', ','])
                .next()
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or_else(|| panic!("no number after {key:?} in {line:?}"))
}

/// One variant of the README's tensor-parallel measurement.
struct Variant {
    /// `local` (loopback) or `hosts` (one rank per host of the cluster).
    place: &'static str,
    ranks: usize,
    /// The value of `NUVEC_DISTRIBUTED_WIRE` (`auto`: not set).
    asked: &'static str,
    /// The wire the job must agree on.
    wire: &'static str,
}

/// Prints the README's tensor-parallel table (`examples/tensor_parallel.rs`): the decoder on
/// 1 local rank, on 2 and 4 local ranks under `nuvec-launch`, and on 2 and 4 hosts of an
/// unshaped cluster (one rank per host, started over ssh by `nuvec-launch`), each on both
/// wires; the variants run interleaved, `NUVEC_TP_REPS` times each (default 5), decoding
/// `NUVEC_TP_TOKENS` tokens (default 24: every timed `all_sum` stays within the nuvec wire's
/// 16 KiB relay), and each row is the run of median tokens/s. Run it in release:
/// `cargo test --release --ignore-rust-version --test cluster -- --ignored tensor_parallel_figures
/// --nocapture` (as root).
#[test]
#[ignore = "a measurement for the README: a few minutes, in release"]
fn the_tensor_parallel_figures_are_measured_locally_and_across_unshaped_hosts_on_both_wires() {
    let _one = exclusive();
    let Some(c) = cluster::make(4, "none") else {
        return;
    };
    let reps: usize = env_or("NUVEC_TP_REPS", "5")
        .parse()
        .expect("a number of runs");
    assert!(reps > 0, "NUVEC_TP_REPS must be at least 1");
    let tokens: usize = env_or("NUVEC_TP_TOKENS", "24")
        .parse()
        .expect("a number of tokens");
    let nuvec = launcher::nuvec_launch().to_path_buf();
    let example = tensor_parallel_example();
    let mut variants = vec![Variant {
        place: "local",
        ranks: 1,
        asked: "auto",
        wire: "none",
    }];
    for place in ["local", "hosts"] {
        for ranks in [2, 4] {
            for (asked, wire) in [("auto", "nuvec"), ("mlx", "mlx")] {
                variants.push(Variant {
                    place,
                    ranks,
                    asked,
                    wire,
                });
            }
        }
    }
    let load = || std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    eprintln!("MEASURED load average before: {}", load().trim_end());
    let mut runs: Vec<Vec<Decoded>> = variants.iter().map(|_| Vec::new()).collect();
    for _ in 0..reps {
        for (v, got) in variants.iter().zip(&mut runs) {
            let env: Vec<String> = (v.asked != "auto")
                .then(|| format!("NUVEC_DISTRIBUTED_WIRE={}", v.asked))
                .into_iter()
                .collect();
            let env: Vec<&str> = env.iter().map(String::as_str).collect();
            let done = if v.place == "hosts" {
                let hosts: Vec<usize> = (0..v.ranks).collect();
                tensor_parallel_on_hosts(&c, &nuvec, &hosts, tokens, &env)
            } else if v.ranks == 1 {
                let mut cmd = Command::new(&example);
                cmd.args(["-n", "1", "--tokens", &tokens.to_string()])
                    .env_remove("MLX_RANK")
                    .env_remove("MLX_HOSTFILE")
                    .env_remove("NUVEC_DISTRIBUTED_WIRE");
                run(&mut cmd, Duration::from_secs(120))
            } else {
                let port = common::ports::consecutive(u16::try_from(v.ranks).expect("a few ranks"))
                    .to_string();
                let mut cmd = Command::new(&nuvec);
                cmd.args(["-n", &v.ranks.to_string(), "--starting-port", &port])
                    .env_remove("MLX_RANK")
                    .env_remove("MLX_HOSTFILE")
                    .env_remove("NUVEC_DISTRIBUTED_WIRE");
                for var in &env {
                    cmd.args(["--env", var]);
                }
                cmd.arg("--")
                    .arg(&example)
                    .args(["--tokens", &tokens.to_string()]);
                run(&mut cmd, Duration::from_secs(120))
            };
            let what = format!("{} {} ranks, wire {}", v.place, v.ranks, v.asked);
            got.push(decoded(&what, &done, v.ranks, v.wire));
        }
    }
    eprintln!("MEASURED load average after: {}", load().trim_end());
    eprintln!(
        "MEASURED tensor_parallel, {tokens} tokens, the run of median tokens/s of {reps}:\n\
         | where | ranks | wire | p50 / p99 per token | tokens/s | in the all_sums per token | one process in the same run | tokens/s of every run |\n\
         |---|---|---|---|---|---|---|---|"
    );
    for (v, mut got) in variants.iter().zip(runs) {
        let rate = |d: &Decoded| number_after(&d.figures, "; ");
        got.sort_by(|a, b| rate(a).total_cmp(&rate(b)));
        let all: Vec<String> = got.iter().map(|d| format!("{:.0}", rate(d))).collect();
        let m = &got[got.len() / 2];
        let wire = if v.asked == "auto" && v.ranks > 1 {
            format!("auto ({})", v.wire)
        } else {
            v.wire.to_owned()
        };
        eprintln!(
            "| {} | {} | {wire} | {:.2} / {:.2} ms | {:.0} | {:.2} ms ({:.0}%) | {:.2} ms, {:.0} tokens/s | {} |",
            v.place,
            v.ranks,
            number_after(&m.figures, "p50 "),
            number_after(&m.figures, "p99 "),
            rate(m),
            number_after(&m.figures, "measured: "),
            number_after(&m.figures, "collectives "),
            number_after(&m.single, "p50 "),
            number_after(&m.single, "; "),
            all.join(", ")
        );
    }
}

/// A JACCL host file over the cluster's hosts with this `rdma` matrix.
fn jaccl_hostfile(c: &Cluster, backend: &str, rdma: &[&str]) -> String {
    let hosts: Vec<String> = rdma
        .iter()
        .enumerate()
        .map(|(i, row)| {
            let a = c.hosts[i].addr;
            format!(r#"{{"ssh": "{a}", "ips": ["{a}"], "rdma": {row}}}"#)
        })
        .collect();
    format!(
        r#"{{"backend": "{backend}", "hosts": [{}]}}"#,
        hosts.join(", ")
    )
}

/// JACCL meshes of 3 and rings of 4 hosts, launched over ssh by nuvec-launch and mlx.launch,
/// with `fabric` (the launcher's `--env` assignments that choose the fabric); with `large`,
/// every rank also checks 4 MiB collectives.
fn jaccl_jobs_across_hosts(c: &Cluster, what: &str, fabric: &[String], large: bool) {
    let mesh = [
        r#"[null, "rdma_en1", "rdma_en2"]"#,
        r#"["rdma_en1", null, "rdma_en3"]"#,
        r#"["rdma_en2", "rdma_en3", null]"#,
    ];
    let ring = [
        r#"[null, "rdma_en1", null, "rdma_en4"]"#,
        r#"["rdma_en1", null, "rdma_en2", null]"#,
        r#"[null, "rdma_en2", null, "rdma_en3"]"#,
        r#"["rdma_en4", null, "rdma_en3", null]"#,
    ];
    let mut launchers = vec![launcher::nuvec_launch().to_path_buf()];
    if let Some(bin) = common::venv::bin_with("mlx.launch", "the MLX part") {
        launchers.push(bin.join("mlx.launch"));
    }
    for program in &launchers {
        for (backend, rdma) in [("jaccl", &mesh[..]), ("jaccl-ring", &ring[..])] {
            let file = c.dir.join(format!("{backend}.json"));
            std::fs::write(&file, jaccl_hostfile(c, backend, rdma)).expect("the host file");
            let mut args = strings(&["--hostfile", &file.display().to_string(), "-p", "6000"]);
            for assignment in fabric.iter().map(String::as_str).chain([
                &*format!("{ROLE}=launched"),
                &*format!("{}={RANK_TEST}", procs::CHILD),
                "NUVEC_DISTRIBUTED_TIMEOUT=20",
                if large {
                    "NUVEC_CLUSTER_LARGE=1"
                } else {
                    "NUVEC_CLUSTER_LARGE=0"
                },
            ]) {
                args.extend(strings(&["--env", assignment]));
            }
            args.push("--".to_owned());
            args.extend(launched_argv());
            let started = Instant::now();
            let done = run(&mut launcher(c, program, &args), Duration::from_secs(120));
            let what = format!("{backend} {what} by {}", program.display());
            check_results(&what, &done, rdma.len());
            if large {
                for r in 0..rdma.len() {
                    assert!(
                        done.output().contains(&format!("LARGE ok rank={r}")),
                        "{what}: rank {r}\n{}",
                        done.output()
                    );
                }
            }
            println!("MEASURED {what}: {} ms", started.elapsed().as_millis());
        }
    }
}

#[test]
fn jaccl_mesh_and_ring_over_tcp_run_across_hosts() {
    let _one = exclusive();
    let Some(c) = cluster::make(4, "1gbit") else {
        return;
    };
    jaccl_jobs_across_hosts(&c, "over TCP", &strings(&["NUVEC_JACCL_FABRIC=tcp"]), false);
}

/// The RDMA fabric across hosts: the software provider's TCP wire carries every message over
/// the hosts' shaped links (`NUVEC_VERBS_EMU_WIRE=tcp`: each host's GIDs are its own address).
#[cfg(feature = "jaccl")]
#[test]
fn jaccl_mesh_and_ring_over_the_rdma_fabric_run_across_hosts_on_the_software_provider() {
    let _one = exclusive();
    let Some(c) = cluster::make(4, "1gbit") else {
        return;
    };
    let fabric = [
        "NUVEC_JACCL_FABRIC=rdma".to_owned(),
        format!("NUVEC_JACCL_VERBS={}", emu::library().display()),
        "NUVEC_VERBS_EMU_WIRE=tcp".to_owned(),
    ];
    jaccl_jobs_across_hosts(&c, "over RDMA (software provider)", &fabric, true);
}

/// A job of `loop` ranks, one per host in `hosts`, on the ring `nodes`, each with `env`.
fn spawn_loop(
    c: &Cluster,
    dir: &Path,
    hosts: &[usize],
    nodes: &[Vec<String>],
    env: &[(&str, String)],
) -> Vec<(Child, PathBuf)> {
    let nodes = serde_json::to_string(nodes).expect("json");
    hosts
        .iter()
        .enumerate()
        .map(|(rank, &h)| {
            let mut cmd = rank_command("loop");
            // MLX_RANK for a JACCL rank, which joins from MLX's variables.
            cmd.env("NUVEC_CLUSTER_NODES", &nodes)
                .env("NUVEC_CLUSTER_RANK", rank.to_string())
                .env("MLX_RANK", rank.to_string());
            for (k, v) in env {
                cmd.env(k, v);
            }
            let log = dir.join(format!("rank{rank}.log"));
            let child = spawn_logged(&mut c.on(h, cmd), &log);
            (child, log)
        })
        .collect()
}

/// Waits for every child (bounded by `limit`; the rest are killed), returning each one's exit
/// code, output and when it ended.
fn wait_all(children: Vec<(Child, PathBuf)>, limit: Duration) -> Vec<(Option<i32>, String, u128)> {
    let deadline = Instant::now() + limit;
    let mut ended: Vec<Option<(Option<i32>, u128)>> = vec![None; children.len()];
    let mut children = children;
    while ended.iter().any(Option::is_none) && Instant::now() < deadline {
        for (i, (child, _)) in children.iter_mut().enumerate() {
            if ended[i].is_none()
                && let Ok(Some(status)) = child.try_wait()
            {
                ended[i] = Some((status.code(), unix_ms()));
            }
        }
        // Polling the children, bounded by the deadline.
        std::thread::sleep(Duration::from_millis(10));
    }
    children
        .into_iter()
        .zip(ended)
        .map(|((mut child, log), e)| {
            let (code, at) = e.unwrap_or_else(|| {
                let _ = child.kill();
                let _ = child.wait();
                (None, unix_ms())
            });
            (code, std::fs::read_to_string(log).unwrap_or_default(), at)
        })
        .collect()
}

/// Waits (bounded) until every log in `logs` has a line starting with `tag`.
fn wait_for_line(logs: &[PathBuf], tag: &str, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let all = logs.iter().all(|l| {
            std::fs::read_to_string(l)
                .unwrap_or_default()
                .lines()
                .any(|line| line.starts_with(tag))
        });
        if all {
            return;
        }
        if Instant::now() >= deadline {
            let text: Vec<String> = logs
                .iter()
                .map(|l| std::fs::read_to_string(l).unwrap_or_default())
                .collect();
            panic!("no {tag} within {limit:?}:\n{}", text.join("\n---\n"));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The value of `key=` on the first line starting with `tag`.
fn field(output: &str, tag: &str, key: &str) -> Option<u128> {
    let line = output.lines().find(|l| l.starts_with(tag))?;
    let rest = line.split_once(&format!("{key}="))?.1;
    rest.split_whitespace().next()?.parse().ok()
}

/// The ring nodes of `hosts` (one port each from [`PORT`], by address or by name).
fn nodes(c: &Cluster, hosts: &[usize], conns: usize, by_name: bool) -> Vec<Vec<String>> {
    hosts
        .iter()
        .map(|&h| {
            (0..conns)
                .map(|k| {
                    let host = if by_name {
                        c.hosts[h].name.clone()
                    } else {
                        c.hosts[h].addr.to_string()
                    };
                    format!("{host}:{}", PORT + k as u16)
                })
                .collect()
        })
        .collect()
}

fn dump(results: &[(Option<i32>, String, u128)]) -> String {
    results
        .iter()
        .enumerate()
        .map(|(r, (code, out, _))| format!("---- rank {r}: exit {code:?}\n{out}"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn a_hostfile_of_host_names_connects_across_hosts() {
    let _one = exclusive();
    let Some(c) = cluster::make(3, "1gbit") else {
        return;
    };
    let dir = procs::scratch("names");
    let nodes = nodes(&c, &[0, 1, 2], 2, true);
    assert!(nodes[1][0].starts_with("host1:"), "{nodes:?}");
    let env = [
        ("NUVEC_CLUSTER_ITERS", "3".to_owned()),
        ("NUVEC_CLUSTER_BYTES", (1 << 20).to_string()),
    ];
    let done = wait_all(
        spawn_loop(&c, &dir, &[0, 1, 2], &nodes, &env),
        Duration::from_secs(60),
    );
    for (code, out, _) in &done {
        assert!(*code == Some(0) && out.contains("DONE"), "{}", dump(&done));
    }
}

/// Runs the ring of `n` hosts, `work` = (iterations, bytes per all_sum), pulls host `cut`'s cable once every rank
/// is READY and plugs it back after `outage` (never, if `None`); returns the results and the
/// wall-clock time of the pull.
fn with_a_pulled_cable(
    c: &Cluster,
    name: &str,
    n: usize,
    timeout: Duration,
    work: (usize, usize),
    cut: usize,
    outage: Option<Duration>,
) -> (Vec<(Option<i32>, String, u128)>, u128) {
    let env = [("NUVEC_CLUSTER_TIMEOUT_MS", timeout.as_millis().to_string())];
    let limit = timeout * 3 + Duration::from_secs(10);
    pull_a_cable(c, name, n, &env, limit, work, cut, outage)
}

/// [`with_a_pulled_cable`] with the ranks' `env` (their timeouts, a pause between
/// collectives) and the bound `limit` of the wait for them after the pull.
#[allow(
    clippy::too_many_arguments,
    reason = "the job's shape, one argument each"
)]
fn pull_a_cable(
    c: &Cluster,
    name: &str,
    n: usize,
    env: &[(&str, String)],
    limit: Duration,
    (iters, bytes): (usize, usize),
    cut: usize,
    outage: Option<Duration>,
) -> (Vec<(Option<i32>, String, u128)>, u128) {
    let dir = procs::scratch(name);
    let hosts: Vec<usize> = (0..n).collect();
    let nodes = nodes(c, &hosts, 1, false);
    let mut env = env.to_vec();
    env.push(("NUVEC_CLUSTER_ITERS", iters.to_string()));
    env.push(("NUVEC_CLUSTER_BYTES", bytes.to_string()));
    let children = spawn_loop(c, &dir, &hosts, &nodes, &env);
    let logs: Vec<PathBuf> = children.iter().map(|(_, l)| l.clone()).collect();
    wait_for_line(&logs, "ITER 0", Duration::from_secs(30));
    let pulled = unix_ms();
    c.pull(cut);
    let results = match outage {
        Some(outage) => {
            let plug_at = Instant::now() + outage;
            // Waiting out the outage itself is what this test is about.
            std::thread::sleep(plug_at.saturating_duration_since(Instant::now()));
            c.plug(cut);
            wait_all(children, limit)
        }
        None => {
            let results = wait_all(children, limit);
            c.plug(cut);
            results
        }
    };
    (results, pulled)
}

#[test]
fn a_cable_pulled_during_a_collective_fails_every_rank_by_its_deadline_naming_a_peer() {
    let _one = exclusive();
    let Some(c) = cluster::make(4, "1gbit") else {
        return;
    };
    let timeout = Duration::from_secs(5);
    let (done, pulled) = with_a_pulled_cable(&c, "pulled", 4, timeout, (100_000, 4 << 20), 2, None);
    for (r, (code, out, ended)) in done.iter().enumerate() {
        assert_eq!(*code, Some(1), "rank {r}\n{}", dump(&done));
        let failed = field(out, "FAILED", "at").unwrap_or_else(|| panic!("{}", dump(&done)));
        let detect = failed.saturating_sub(pulled);
        let line = out.lines().find(|l| l.starts_with("FAILED")).unwrap_or("");
        assert!(
            line.contains("rank") || line.contains("198.18."),
            "rank {r}'s error names no peer: {line}"
        );
        // By its deadline: the operation's timeout, plus the time to notice (a poll interval).
        assert!(
            u128::from(detect as u64) <= timeout.as_millis() + 1500,
            "rank {r} failed {detect} ms after the pull\n{}",
            dump(&done)
        );
        let again = out.lines().find(|l| l.starts_with("AGAIN")).unwrap_or("");
        assert!(
            again.starts_with("AGAIN ms=") && field(out, "AGAIN", "ms").unwrap_or(u128::MAX) < 1000,
            "rank {r}: a later operation must fail at once: {again}"
        );
        assert!(
            out.contains("FAILURE Some("),
            "rank {r}: the group must say it failed\n{out}"
        );
        eprintln!(
            "MEASURED pulled cable (host 2 of 4, timeout {timeout:?}): rank {r} failed {detect} ms \
             after the pull, exited {} ms after: {line}",
            ended.saturating_sub(pulled)
        );
    }
}

/// A cable pulled under nuvec-launch: host 2's rank is cut off, leaves no record the launcher
/// can fetch, and the others time out waiting for it; the merged records under the failure
/// summary name rank 2.
#[test]
fn a_cable_pulled_under_nuvec_launch_is_named_by_the_merged_records() {
    let _one = exclusive();
    let Some(c) = cluster::make(3, "1gbit") else {
        return;
    };
    let dir = procs::scratch("pulled-launch");
    let log = dir.join("launcher.log");
    let child = launched_ring_job(&c, "launched-loop", "3", &log);
    let logs = [log.clone()];
    for r in 0..3 {
        wait_for_line(
            &logs,
            &format!("[rank {r}] ITER 1"),
            Duration::from_secs(30),
        );
    }
    c.pull(2);
    let done = wait_all(vec![(child, log)], Duration::from_secs(60));
    c.plug(2);
    let (code, out, _) = &done[0];
    assert_ne!(*code, Some(0), "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("- the first failure: rank 2, which ")),
        "{out}"
    );
    // The hosts share one file system (namespaces of one machine, as homes over NFS do), so
    // the ranks share the remote record directory: every record the ranks that failed wrote
    // is fetched before the directory goes.
    for r in 0..2 {
        assert!(
            !out.contains(&format!("rank {r} left no record")),
            "rank {r}'s record was lost\n{out}"
        );
    }
    let ours: Vec<&str> = out
        .lines()
        .filter(|l| !l.starts_with("[rank") || l.contains("error"))
        .collect();
    eprintln!(
        "MEASURED pulled cable under nuvec-launch:\n{}",
        ours.join("\n")
    );
}

#[test]
fn a_remote_rank_that_ignores_sigterm_and_sighup_is_killed_on_its_host_after_the_grace() {
    let _one = exclusive();
    let Some(c) = cluster::make(2, "1gbit") else {
        return;
    };
    // Both ranks over ssh (198.18.0.1 is not this machine's loopback, so host 0's rank is
    // remote too). Rank 0 ignores SIGTERM and SIGHUP (its children inherit that) and runs
    // until killed; rank 1 fails once rank 0 is running (the PID file line comes before it).
    let dir = procs::scratch("stubborn");
    let ready = dir.join("ready");
    let token = format!("nuvec-stubborn-{}", unix_ms());
    let script = format!(
        "trap '' TERM HUP; : {token}; if [ \"$MLX_RANK\" = 1 ]; then \
         while [ ! -e '{ready}' ]; do sleep 0.05; done; exit 7; fi; \
         touch '{ready}'; while :; do sleep 0.2; done",
        ready = ready.display()
    );
    let args = strings(&[
        "--hosts",
        "198.18.0.1,198.18.0.2",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    let started = Instant::now();
    let done = run(
        &mut launcher(&c, launcher::nuvec_launch(), &args),
        Duration::from_secs(60),
    );
    let ended = started.elapsed();
    assert_eq!(done.code, Some(7), "{}", done.describe());
    let alive = || {
        Command::new("pgrep")
            .args(["-f", &token])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    // Polled: the kill comes on the rank's host, 5 s after its SIGTERM.
    let deadline = Instant::now() + Duration::from_secs(20);
    while alive() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let survived = alive();
    if survived {
        let _ = Command::new("pkill").args(["-9", "-f", &token]).status();
    }
    eprintln!(
        "MEASURED the launcher exited {:.1} s after the start; the stubborn rank was gone {:.1} s after that",
        ended.as_secs_f64(),
        started.elapsed().as_secs_f64() - ended.as_secs_f64()
    );
    assert!(
        !survived,
        "rank 0 outlived its job by 20 s:\n{}",
        done.describe()
    );
}

/// Ctrl-C across hosts: rank 2 of three hosts is stuck in its own code while ranks 0 and 1
/// wait for it in all_sum #1. The first Ctrl-C has every rank's record written on its host and
/// fetched over ssh, and prints where each rank is, rank 2 named as the one that has not
/// joined; the second stops the job (exit 130) on every host.
#[test]
fn the_first_ctrl_c_across_hosts_prints_where_every_rank_is_and_the_second_stops_the_job() {
    let _one = exclusive();
    let Some(c) = cluster::make(3, "1gbit") else {
        return;
    };
    let dir = procs::scratch("ctrl-c-hosts");
    let log = dir.join("launcher.log");
    let child = launched_ring_job(&c, "stuck", "60", &log);
    let pid = child.id().to_string();
    let logs = [log.clone()];
    for r in 0..3 {
        wait_for_line(
            &logs,
            &format!("[rank {r}] JOINED"),
            Duration::from_secs(30),
        );
    }
    let interrupt = || {
        let status = Command::new("kill")
            .args(["-INT", &pid])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -INT {pid}");
    };
    interrupt();
    wait_for_line(
        &logs,
        "- rank 2 is at all_sum #0 (done), the others at #1: rank 2 has not joined all_sum #1",
        Duration::from_secs(30),
    );
    interrupt();
    let started = Instant::now();
    let done = wait_all(vec![(child, log)], Duration::from_secs(30));
    let (code, out, _) = &done[0];
    assert_eq!(*code, Some(130), "{out}");
    assert!(out.contains("3 of 3 answered"), "{out}");
    for r in 0..2 {
        assert!(
            out.lines()
                .any(|l| l.starts_with(&format!("{r} ")) && l.contains("all_sum #1")),
            "rank {r}'s row\n{out}"
        );
    }
    // Every rank on every host is gone (the hosts share this machine's processes).
    let deadline = Instant::now() + Duration::from_secs(10);
    let left = loop {
        let found = Command::new("pgrep")
            .args(["-f", "ROLE=stuck|a_cluster_rank_runs_its_role"])
            .output()
            .expect("run pgrep");
        let left = String::from_utf8_lossy(&found.stdout).trim().to_owned();
        if left.is_empty() || Instant::now() >= deadline {
            break left;
        }
        // Polling for the ranks' end, bounded by the deadline.
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(left, "", "ranks left running\n{out}");
    eprintln!(
        "MEASURED Ctrl-C across hosts, stopped {:.1} s after the second:\n{out}",
        started.elapsed().as_secs_f64()
    );
}

/// `--hang-report` across hosts, the launcher on a host of no rank (host 0 launching ranks on
/// hosts 1 and 2): the ranks' progress files are on their own hosts, so the launcher fetches
/// them before it calls a job stalled. While the ranks complete all_sums for 3 s (three
/// times the report's 1 s) nothing is reported; rank 1's 8 s pause is reported, and so, once
/// the ranks have moved on, is its hang after the second round.
#[test]
fn hang_reports_across_hosts_come_only_when_the_remote_ranks_stop_completing_operations() {
    let _one = exclusive();
    let Some(c) = cluster::make(3, "1gbit") else {
        return;
    };
    let dir = procs::scratch("hang-report-hosts");
    let log = dir.join("launcher.log");
    let child = launched_ring_job_on(
        &c,
        &[1, 2],
        &["--hang-report", "1"],
        "busy-then-stuck",
        "60",
        &[],
        &log,
    );
    let pid = child.id().to_string();
    let logs = [log.clone()];
    const REPORT: &str = "no rank completed an operation for 1 s";
    // Two reports, each followed by its table (its last line names rank 1).
    let deadline = Instant::now() + Duration::from_secs(60);
    let text = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let tables = text
            .lines()
            .filter(|l| l.starts_with("- rank 1 is at all_sum #"))
            .count();
        if tables >= 2 || Instant::now() >= deadline {
            break text;
        }
        // Polling the launcher's log, bounded by the deadline.
        std::thread::sleep(Duration::from_millis(50));
    };
    let lines: Vec<&str> = text.lines().collect();
    let reports: Vec<usize> = (0..lines.len())
        .filter(|&i| lines[i].contains(REPORT))
        .collect();
    assert_eq!(reports.len(), 2, "two reports\n{text}");
    for (round, &report) in reports.iter().enumerate() {
        for r in 0..2 {
            let looped = lines
                .iter()
                .position(|l| l.starts_with(&format!("[rank {r}] LOOPED {round}")))
                .unwrap_or_else(|| panic!("rank {r} did not loop {round}\n{text}"));
            assert!(
                looped < report,
                "reported while rank {r} completed round {round}'s all_sums\n{text}"
            );
        }
    }
    // Two signals sent at once may reach the launcher as one: the second follows the first's
    // report.
    for said in [
        "[WARN] Ctrl-C (press it again",
        "[WARN] Ctrl-C again: stopping the job",
    ] {
        let status = Command::new("kill")
            .args(["-INT", &pid])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -INT {pid}");
        wait_for_line(&logs, said, Duration::from_secs(30));
    }
    let done = wait_all(vec![(child, log)], Duration::from_secs(30));
    let (code, out, _) = &done[0];
    assert_eq!(*code, Some(130), "{out}");
    eprintln!("MEASURED --hang-report across hosts:\n{out}");
}

/// A mismatch on MLX's wire across three hosts: rank 1 calls all_gather where the others call
/// all_sum; whichever ranks return (wrong numbers, exit 0) write their records as they exit,
/// the launcher fetches every host's records over ssh, names the step where the programs
/// parted and does not exit 0.
#[test]
fn a_mismatch_on_mlxs_wire_across_hosts_is_named_by_the_records_fetched_from_every_host() {
    let _one = exclusive();
    let Some(c) = cluster::make(3, "1gbit") else {
        return;
    };
    let dir = procs::scratch("disagree-hosts");
    let log = dir.join("launcher.log");
    let child = launched_ring_job_with(&c, "disagree", "3", &["NUVEC_DISTRIBUTED_WIRE=mlx"], &log);
    let done = wait_all(vec![(child, log)], Duration::from_secs(60));
    let (code, out, _) = &done[0];
    assert_ne!(*code, Some(0), "{out}");
    assert!(
        out.lines().any(|l| l
            == "- different operations at the same step: rank 1 is in all_gather #1, ranks 0, 2 \
                in all_sum #1"),
        "{out}"
    );
    for r in 0..3 {
        assert!(
            !out.contains(&format!("rank {r} left no record")),
            "rank {r}'s record was lost\n{out}"
        );
    }
    let ours: Vec<&str> = out
        .lines()
        .filter(|l| !l.starts_with("[rank") || l.contains("SECOND"))
        .collect();
    eprintln!(
        "MEASURED a mismatch on MLX's wire across hosts (exit {code:?}):\n{}",
        ours.join("\n")
    );
}

/// `cmd` started with no input and both output streams in the file `log`.
fn spawn_logged(cmd: &mut Command, log: &Path) -> Child {
    let file = std::fs::File::create(log).expect("a log");
    let err = file.try_clone().expect("a log");
    cmd.stdin(Stdio::null())
        .stdout(Stdio::from(file))
        .stderr(Stdio::from(err))
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"))
}

/// nuvec-launch on host 0 running a ring of this binary's `role` on hosts 0, 1 and 2 with
/// the operation deadline `timeout` (seconds), its output in `log`.
fn launched_ring_job(c: &Cluster, role: &str, timeout: &str, log: &Path) -> Child {
    launched_ring_job_with(c, role, timeout, &[], log)
}

/// [`launched_ring_job`] with more `--env` settings (`NAME=value`).
fn launched_ring_job_with(
    c: &Cluster,
    role: &str,
    timeout: &str,
    env: &[&str],
    log: &Path,
) -> Child {
    launched_ring_job_on(c, &[0, 1, 2], &[], role, timeout, env, log)
}

/// [`launched_ring_job_with`] of the ranks on `hosts`, with the launcher's `flags` too.
fn launched_ring_job_on(
    c: &Cluster,
    hosts: &[usize],
    flags: &[&str],
    role: &str,
    timeout: &str,
    env: &[&str],
    log: &Path,
) -> Child {
    let mut args = strings(&["--hosts", &c.host_list(hosts), "--backend", "ring"]);
    args.extend(strings(flags));
    args.extend(strings(&[
        "--env",
        &format!("{ROLE}={role}"),
        "--env",
        &format!("{}={RANK_TEST}", procs::CHILD),
        "--env",
        &format!("NUVEC_DISTRIBUTED_TIMEOUT={timeout}"),
    ]));
    for e in env {
        args.extend(strings(&["--env", e]));
    }
    args.push("--".to_owned());
    args.extend(launched_argv());
    spawn_logged(&mut launcher(c, launcher::nuvec_launch(), &args), log)
}

/// Checks that every rank of `done` failed within `within` of the pull at `pulled`, naming a
/// peer, and prints the measurements as `what`.
fn every_rank_failed_naming_a_peer(
    done: &[(Option<i32>, String, u128)],
    pulled: u128,
    within: Duration,
    what: &str,
) {
    for (r, (code, out, ended)) in done.iter().enumerate() {
        assert_eq!(*code, Some(1), "rank {r}\n{}", dump(done));
        let failed = field(out, "FAILED", "at").unwrap_or_else(|| panic!("{}", dump(done)));
        let detect = failed.saturating_sub(pulled);
        let line = out.lines().find(|l| l.starts_with("FAILED")).unwrap_or("");
        assert!(
            line.contains("rank"),
            "rank {r}'s error names no peer: {line}"
        );
        assert!(
            detect <= within.as_millis(),
            "rank {r} failed {detect} ms after the pull, not within {within:?}\n{}",
            dump(done)
        );
        eprintln!(
            "MEASURED {what}: rank {r} failed {detect} ms after the pull, exited {} ms after: \
             {line}",
            ended.saturating_sub(pulled)
        );
    }
}

#[test]
fn with_the_default_timeout_a_cable_pulled_during_a_collective_fails_every_rank_within_the_link_timeout()
 {
    let _one = exclusive();
    let Some(c) = cluster::make(3, "1gbit") else {
        return;
    };
    // The operation timeout at its default (10 minutes): the link timeout alone decides.
    let link = nuvec_distributed::DEFAULT_LINK_TIMEOUT;
    let env = [("NUVEC_CLUSTER_TIMEOUT_MS", "default".to_owned())];
    let (done, pulled) = pull_a_cable(
        &c,
        "pulled-default",
        3,
        &env,
        link * 3,
        (100_000, 4 << 20),
        2,
        None,
    );
    every_rank_failed_naming_a_peer(
        &done,
        pulled,
        link + Duration::from_secs(2),
        "pulled cable during a collective, default timeouts (host 2 of 3)",
    );
}

#[test]
fn with_the_default_timeout_a_host_powered_off_during_a_collective_fails_every_other_rank_within_the_link_timeout()
 {
    let _one = exclusive();
    let Some(c) = cluster::make(3, "1gbit") else {
        return;
    };
    let link = nuvec_distributed::DEFAULT_LINK_TIMEOUT;
    let dir = procs::scratch("powered-off");
    let hosts: Vec<usize> = (0..3).collect();
    let nodes = nodes(&c, &hosts, 1, false);
    let env = [
        ("NUVEC_CLUSTER_TIMEOUT_MS", "default".to_owned()),
        ("NUVEC_CLUSTER_ITERS", "100000".to_owned()),
        ("NUVEC_CLUSTER_BYTES", (4usize << 20).to_string()),
    ];
    let mut children = spawn_loop(&c, &dir, &hosts, &nodes, &env);
    let logs: Vec<PathBuf> = children.iter().map(|(_, l)| l.clone()).collect();
    wait_for_line(&logs, "ITER 0", Duration::from_secs(30));
    // The host goes dark (its cable out), then its rank is killed: the FIN or reset its
    // kernel sends is lost, as a powered-off host sends none.
    let off = 2;
    let pulled = unix_ms();
    c.pull(off);
    let (mut dead, _) = children.remove(off);
    let _ = dead.kill();
    let _ = dead.wait();
    let done = wait_all(children, link * 3);
    c.plug(off);
    every_rank_failed_naming_a_peer(
        &done,
        pulled,
        link + Duration::from_secs(2),
        "host powered off during a collective, default timeouts (host 2 of 3, the others)",
    );
}

#[test]
fn with_the_default_timeout_a_cable_pulled_between_collectives_fails_every_rank_within_the_link_timeout()
 {
    let _one = exclusive();
    let Some(c) = cluster::make(3, "1gbit") else {
        return;
    };
    // Ranks that pause for longer than the link timeout after each all_sum: the cable is
    // pulled while every link is idle, and only keepalive can tell. Every rank's next
    // all_sum then fails at once (within a second of its start) as a silent link.
    let link = Duration::from_secs(5);
    let pause = Duration::from_secs(8);
    let env = [
        ("NUVEC_CLUSTER_TIMEOUT_MS", "default".to_owned()),
        (
            "NUVEC_CLUSTER_LINK_TIMEOUT_MS",
            link.as_millis().to_string(),
        ),
        ("NUVEC_CLUSTER_PAUSE_MS", pause.as_millis().to_string()),
    ];
    let (done, pulled) = pull_a_cable(
        &c,
        "pulled-idle",
        3,
        &env,
        link * 3 + pause,
        (100, 4096),
        2,
        None,
    );
    every_rank_failed_naming_a_peer(
        &done,
        pulled,
        pause + Duration::from_secs(2),
        "pulled cable between collectives, 5 s link timeout (host 2 of 3)",
    );
    // The job speaks the nuvec wire, on which a failed rank tells its peers and closes its
    // links at once: a rank whose neighbour noticed the silence first may see that close
    // instead, at once too, named by the notice where it came first ("rank 1 failed and left
    // the group"). The silence is what at least one rank names.
    let mut silent = 0;
    for (r, (_, out, _)) in done.iter().enumerate() {
        let line = out.lines().find(|l| l.starts_with("FAILED")).unwrap_or("");
        assert!(
            field(out, "FAILED", "op_ms").unwrap_or(u128::MAX) < 1000,
            "rank {r}'s next all_sum did not fail at once: {line}"
        );
        assert!(
            line.contains("went silent")
                || line.contains("closed by the peer")
                || line.contains("failed and left the group"),
            "rank {r}: {line}"
        );
        silent += usize::from(line.contains("went silent"));
    }
    assert!(silent > 0, "no rank named the silent link");
}

#[test]
fn a_glitch_shorter_than_seventy_percent_of_the_link_timeout_is_survived_with_the_default_timeouts()
{
    let _one = exclusive();
    let Some(c) = cluster::make(2, "1gbit") else {
        return;
    };
    let link = nuvec_distributed::DEFAULT_LINK_TIMEOUT;
    let outage = link.mul_f64(0.7) - Duration::from_millis(500);
    let env = [("NUVEC_CLUSTER_TIMEOUT_MS", "default".to_owned())];
    let started = Instant::now();
    let (done, _) = pull_a_cable(
        &c,
        "glitch-default",
        2,
        &env,
        link * 3,
        (200 + (outage.as_millis() as usize) / 10, 1 << 20),
        1,
        Some(outage),
    );
    let ok = done
        .iter()
        .all(|(code, out, _)| *code == Some(0) && out.contains("DONE"));
    assert!(
        ok,
        "a {outage:?} outage under a {link:?} link timeout:\n{}",
        dump(&done)
    );
    eprintln!(
        "MEASURED glitch of {outage:?} (link timeout {link:?}, default operation timeout) \
         survived; the job took {:?}",
        started.elapsed()
    );
}

/// A JACCL mesh of hosts 0, 1 and 2 over the RDMA fabric on the software provider's TCP wire,
/// each rank running a stream of 4 MiB all_sums (`loop_rank`) with `setting` in its
/// environment, logs in `dir`: returned once every rank has completed its first.
#[cfg(feature = "jaccl")]
fn jaccl_mesh_of_three_over_rdma_running(
    c: &Cluster,
    dir: &Path,
    setting: (&str, String),
) -> Vec<(Child, PathBuf)> {
    let devices = dir.join("devices.json");
    std::fs::write(
        &devices,
        r#"[[null, "rdma_en1", "rdma_en2"], ["rdma_en1", null, "rdma_en3"], ["rdma_en2", "rdma_en3", null]]"#,
    )
    .expect("the device file");
    let env = [
        ("NUVEC_CLUSTER_JACCL", "1".to_owned()),
        ("MLX_IBV_DEVICES", devices.display().to_string()),
        ("MLX_JACCL_COORDINATOR", format!("{}:6100", c.hosts[0].addr)),
        ("NUVEC_JACCL_FABRIC", "rdma".to_owned()),
        ("NUVEC_JACCL_VERBS", emu::library().display().to_string()),
        ("NUVEC_VERBS_EMU_WIRE", "tcp".to_owned()),
        setting,
        ("NUVEC_CLUSTER_ITERS", "100000".to_owned()),
        ("NUVEC_CLUSTER_BYTES", (4 << 20).to_string()),
    ];
    let children = spawn_loop(c, dir, &[0, 1, 2], &[], &env);
    let logs: Vec<PathBuf> = children.iter().map(|(_, l)| l.clone()).collect();
    wait_for_line(&logs, "ITER 0", Duration::from_secs(30));
    children
}

/// A JACCL mesh of 3 hosts over the RDMA fabric on the software provider's TCP wire: host 2's
/// cable is pulled during a stream of 4 MiB all_sums. Every rank (the cut one too) fails by
/// its deadline with an error naming a peer, and a later operation fails at once.
#[cfg(feature = "jaccl")]
#[test]
fn a_cable_pulled_during_a_jaccl_collective_over_rdma_fails_every_rank_by_its_deadline() {
    let _one = exclusive();
    let Some(c) = cluster::make(3, "1gbit") else {
        return;
    };
    let dir = procs::scratch("jaccl-pulled");
    let timeout = Duration::from_secs(5);
    let setting = ("NUVEC_DISTRIBUTED_TIMEOUT", timeout.as_secs().to_string());
    let children = jaccl_mesh_of_three_over_rdma_running(&c, &dir, setting);
    let pulled = unix_ms();
    c.pull(2);
    let done = wait_all(children, timeout * 3 + Duration::from_secs(10));
    c.plug(2);
    for (r, (code, out, ended)) in done.iter().enumerate() {
        assert_eq!(*code, Some(1), "rank {r}\n{}", dump(&done));
        let failed = field(out, "FAILED", "at").unwrap_or_else(|| panic!("{}", dump(&done)));
        let detect = failed.saturating_sub(pulled);
        let line = out.lines().find(|l| l.starts_with("FAILED")).unwrap_or("");
        assert!(
            line.contains("rank"),
            "rank {r}'s error names no peer: {line}"
        );
        assert!(
            detect <= timeout.as_millis() + 1500,
            "rank {r} failed {detect} ms after the pull\n{}",
            dump(&done)
        );
        let again = out.lines().find(|l| l.starts_with("AGAIN")).unwrap_or("");
        assert!(
            again.starts_with("AGAIN ms=") && field(out, "AGAIN", "ms").unwrap_or(u128::MAX) < 1000,
            "rank {r}: a later operation must fail at once: {again}"
        );
        eprintln!(
            "MEASURED pulled cable, JACCL mesh over RDMA (host 2 of 3, timeout {timeout:?}): rank \
             {r} failed {detect} ms after the pull, exited {} ms after: {line}",
            ended.saturating_sub(pulled)
        );
    }
}

/// A JACCL mesh of 3 hosts over the RDMA fabric on the software provider's TCP wire, with no
/// operation timeout set (the default, 10 minutes) and a 5 s link timeout: host 2's cable is
/// pulled during a stream of 4 MiB all_sums. The provider's wire has no liveness of this
/// crate's, so only JACCL's side channel can tell: its keepalive finds host 2 dead although
/// its process never closed a socket, and every rank fails within the link timeout plus 2 s,
/// naming a peer.
#[cfg(feature = "jaccl")]
#[test]
fn a_cable_pulled_during_a_jaccl_collective_is_found_by_the_side_channels_keepalive() {
    let _one = exclusive();
    let Some(c) = cluster::make(3, "1gbit") else {
        return;
    };
    let dir = procs::scratch("jaccl-pulled-keepalive");
    let link = Duration::from_secs(5);
    let setting = ("NUVEC_DISTRIBUTED_LINK_TIMEOUT", link.as_secs().to_string());
    let children = jaccl_mesh_of_three_over_rdma_running(&c, &dir, setting);
    let pulled = unix_ms();
    c.pull(2);
    let done = wait_all(children, link * 3 + Duration::from_secs(10));
    c.plug(2);
    every_rank_failed_naming_a_peer(
        &done,
        pulled,
        link + Duration::from_secs(2),
        "pulled cable, JACCL mesh over RDMA, no operation timeout, 5 s link timeout (host 2 of 3)",
    );
}

/// One ring of 2 hosts with `timeout`, a cable pulled for `outage` during a stream of
/// all_sums: whether every rank completed with the right result.
fn glitch(c: &Cluster, timeout: Duration, outage: Duration) -> (bool, String) {
    let (done, _) = with_a_pulled_cable(
        c,
        "glitch",
        2,
        timeout,
        // Enough all_sums of 1 MiB to outlast the outage at the link's rate.
        (200 + (outage.as_millis() as usize) / 10, 1 << 20),
        1,
        Some(outage),
    );
    let ok = done
        .iter()
        .all(|(code, out, _)| *code == Some(0) && out.contains("DONE"));
    (ok, dump(&done))
}

#[test]
fn a_glitch_shorter_than_the_timeout_is_survived() {
    let _one = exclusive();
    let Some(c) = cluster::make(2, "1gbit") else {
        return;
    };
    let timeout = Duration::from_secs(10);
    // With the retransmission backoff capped at 1 s (Linux 6.15's TCP_RTO_MAX_MS, which the
    // crate sets), a retry follows the link's return within a second: 7 s of 10 leaves room.
    // Without it, the retries at 3.0 s and 6.2 s after the cut bound what is survived.
    let capped = Path::new("/proc/sys/net/ipv4/tcp_rto_max_ms").exists();
    let outage = Duration::from_secs(if capped { 7 } else { 4 });
    let started = Instant::now();
    let (ok, out) = glitch(&c, timeout, outage);
    assert!(
        ok,
        "a {outage:?} outage under a {timeout:?} timeout:\n{out}"
    );
    eprintln!(
        "MEASURED glitch of {outage:?} (timeout {timeout:?}) survived; the job took {:?}",
        started.elapsed()
    );
}

/// Not a test of CI's (a minute or two per outage): the longest outage survived under a 10 s
/// timeout, in steps of a second (`cargo test --test cluster -- --ignored --nocapture`).
#[test]
#[ignore = "a measurement: several minutes"]
fn the_longest_glitch_survived_is_measured() {
    let _one = exclusive();
    let Some(c) = cluster::make(2, "1gbit") else {
        return;
    };
    if let Ok(setting) = std::env::var("NUVEC_CLUSTER_SYSCTL") {
        // For comparison, a per-namespace setting on every host, such as
        // `net.ipv4.tcp_rto_max_ms=1000` (the kernel caps the retransmission backoff).
        let (key, value) = setting.split_once('=').expect("KEY=VALUE");
        c.sysctl(key, value);
    }
    let timeout = Duration::from_secs(10);
    let mut longest = None;
    let steps = env_or("NUVEC_CLUSTER_OUTAGES", "5,6,7,8,9");
    for secs in steps.split(',').map(|s| s.parse::<u64>().expect("seconds")) {
        let (ok, _) = glitch(&c, timeout, Duration::from_secs(secs));
        eprintln!("MEASURED glitch of {secs} s under a 10 s timeout: survived {ok}");
        if ok {
            longest = Some(secs);
        }
    }
    eprintln!("MEASURED longest glitch survived: {longest:?} s of 10 s");
}

#[test]
fn a_host_at_a_tenth_of_the_rate_completes_with_no_false_failure() {
    let _one = exclusive();
    let Some(c) = cluster::make(4, "1gbit") else {
        return;
    };
    let timeout = Duration::from_secs(10);
    let hosts = [0, 1, 2, 3];
    let nodes = nodes(&c, &hosts, 1, false);
    let mut took = Vec::new();
    for slow in [false, true] {
        if slow {
            c.set_rate(3, "100mbit");
        }
        let dir = procs::scratch(if slow { "slow" } else { "fast" });
        let env = [
            ("NUVEC_CLUSTER_ITERS", "3".to_owned()),
            ("NUVEC_CLUSTER_BYTES", (16 << 20).to_string()),
            ("NUVEC_CLUSTER_TIMEOUT_MS", timeout.as_millis().to_string()),
        ];
        let done = wait_all(
            spawn_loop(&c, &dir, &hosts, &nodes, &env),
            Duration::from_secs(120),
        );
        for (code, out, _) in &done {
            assert!(
                *code == Some(0) && out.contains("DONE"),
                "slow={slow}\n{}",
                dump(&done)
            );
        }
        let ms = field(&done[0].1, "DONE", "ms").unwrap_or_default();
        took.push(ms);
        eprintln!(
            "MEASURED 3 all_sums of 16 MiB on 4 hosts, {}: {ms} ms",
            if slow {
                "host 3 at 100 Mbit/s"
            } else {
                "all at 1 Gbit/s"
            }
        );
    }
    assert!(
        took[1] > took[0],
        "the slow host made no difference: {took:?}"
    );
}

/// A 3-host ring whose rank 0 starts only once a stranger on host 3 has connected to rank
/// 1's port (and sent `send`); returns the ranks' results and the stranger's output.
fn stranger_during_setup(
    c: &Cluster,
    key: Option<&str>,
    send: &str,
) -> (Vec<(Option<i32>, String, u128)>, String) {
    let dir = procs::scratch(&format!("stranger-{send}-{}", key.is_some()));
    let hosts = [0, 1, 2];
    let nodes = nodes(c, &hosts, 1, false);
    let gate = dir.join("go");
    let mut env = vec![
        ("NUVEC_CLUSTER_ITERS", "2".to_owned()),
        ("NUVEC_CLUSTER_TIMEOUT_MS", "8000".to_owned()),
    ];
    if let Some(key) = key {
        env.push(("NUVEC_CLUSTER_KEY", key.to_owned()));
    }
    // Ranks 1 and 2 start at once, rank 0 at the gate.
    let mut ranks = Vec::new();
    for (rank, &h) in hosts.iter().enumerate() {
        let mut cmd = rank_command("loop");
        cmd.env(
            "NUVEC_CLUSTER_NODES",
            serde_json::to_string(&nodes).expect("json"),
        )
        .env("NUVEC_CLUSTER_RANK", rank.to_string());
        for (k, v) in &env {
            cmd.env(k, v);
        }
        if rank == 0 {
            cmd.env("NUVEC_CLUSTER_GATE", &gate);
        }
        let log = dir.join(format!("rank{rank}.log"));
        let child = spawn_logged(&mut c.on(h, cmd), &log);
        ranks.push((child, log));
    }
    let mut s = rank_command("stranger");
    s.env("NUVEC_CLUSTER_TARGET", &nodes[1][0])
        .env("NUVEC_CLUSTER_SEND", send);
    let slog = dir.join("stranger.log");
    let file = std::fs::File::create(&slog).expect("a log");
    let err = file.try_clone().expect("a log");
    let stranger = c
        .on(3, s)
        .stdin(Stdio::null())
        .stdout(Stdio::from(file))
        .stderr(Stdio::from(err))
        .spawn()
        .expect("spawn the stranger");
    wait_for_line(
        std::slice::from_ref(&slog),
        "CONNECTED",
        Duration::from_secs(30),
    );
    std::fs::write(&gate, "go").expect("open the gate");
    let done = wait_all(ranks, Duration::from_secs(60));
    let s = wait_all(vec![(stranger, slog)], Duration::from_secs(40));
    (done, s[0].1.clone())
}

#[test]
fn a_stranger_from_another_host_during_setup_is_turned_away_with_a_key() {
    let _one = exclusive();
    let Some(c) = cluster::make(4, "1gbit") else {
        return;
    };
    for send in ["garbage", "nothing"] {
        let (done, stranger) = stranger_during_setup(&c, Some("a cluster's shared secret"), send);
        for (code, out, _) in &done {
            assert!(
                *code == Some(0) && out.contains("DONE"),
                "stranger sent {send}\n{}\nstranger: {stranger}",
                dump(&done)
            );
        }
        let setup: Vec<u128> = done
            .iter()
            .filter_map(|(_, out, _)| {
                out.lines()
                    .find_map(|l| l.strip_prefix("SETUP_MS "))
                    .and_then(|v| v.trim().parse().ok())
            })
            .collect();
        eprintln!(
            "MEASURED stranger ({send}) with a key: setup took {setup:?} ms per rank; stranger: {}",
            stranger
                .lines()
                .rfind(|l| l.starts_with("CLOSED"))
                .unwrap_or("still connected")
        );
    }
}

#[test]
fn a_stranger_from_another_host_during_setup_without_a_key_fails_setup_by_the_deadline_or_is_harmless()
 {
    let _one = exclusive();
    let Some(c) = cluster::make(4, "1gbit") else {
        return;
    };
    for send in ["garbage", "nothing"] {
        let started = Instant::now();
        let (done, stranger) = stranger_during_setup(&c, None, send);
        let took = started.elapsed();
        // No key: a stranger is indistinguishable from the neighbour (MLX's wire has no
        // handshake). What must hold: no hang, no wrong result (every value is checked).
        assert!(took < Duration::from_secs(40), "took {took:?}");
        for (code, out, _) in &done {
            assert!(
                *code == Some(0) || out.contains("FAILED") || out.contains("SETUP_FAILED"),
                "stranger sent {send}\n{}",
                dump(&done)
            );
        }
        let summary: Vec<String> = done
            .iter()
            .map(|(code, out, _)| {
                let last = out
                    .lines()
                    .rfind(|l| !l.trim().is_empty() && !l.starts_with("ITER"))
                    .unwrap_or("");
                format!("exit {code:?}: {last}")
            })
            .collect();
        eprintln!(
            "MEASURED stranger ({send}) without a key: {took:?}; {summary:?}; stranger: {}",
            stranger
                .lines()
                .rfind(|l| l.starts_with("CLOSED"))
                .unwrap_or("still connected")
        );
    }
}

/// Not a test: holds a cluster for a benchmark or by hand while the file named by
/// `NUVEC_CLUSTER_HOLD` exists (at most `NUVEC_CLUSTER_HOLD_SECS`, default an hour). The
/// cluster has `NUVEC_CLUSTER_HOSTS` hosts (default 4) at `NUVEC_CLUSTER_RATE` (default
/// `1gbit`); once it is up, the file gets the cluster's directory (its `bin/` has the `ssh`
/// wrapper and `on HOST COMMAND...`), and removing the file removes the cluster.
/// `benches/cluster.sh` uses it.
#[test]
#[ignore = "holds a cluster for benches/cluster.sh"]
fn a_cluster_is_held_while_the_hold_file_exists() {
    let Ok(hold) = std::env::var("NUVEC_CLUSTER_HOLD") else {
        return;
    };
    let _one = exclusive();
    let n = env_or("NUVEC_CLUSTER_HOSTS", "4")
        .parse()
        .expect("a number of hosts");
    let rate = env_or("NUVEC_CLUSTER_RATE", "1gbit");
    let secs = env_or("NUVEC_CLUSTER_HOLD_SECS", "3600")
        .parse()
        .expect("seconds");
    let c = cluster::make(n, &rate).expect("a cluster");
    std::fs::write(&hold, format!("{}\n", c.dir.display())).expect("write the hold file");
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Path::new(&hold).exists() && Instant::now() < deadline {
        // Polling for the file's removal, bounded by the deadline.
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = std::fs::remove_file(&hold);
}

/// `nuvec-launch doctor ARGS...` run on host 0 with the cluster's ssh, its links measured
/// briefly (64 MiB or 0.5 s each way, 100 round trips, connects bounded by 1 s), its all_sum
/// sweep within 2 s.
fn doctor(c: &Cluster, args: &[&str]) -> Ran {
    let mut full = strings(&[
        "doctor",
        "--probe-mib",
        "64",
        "--probe-seconds",
        "0.5",
        "--pings",
        "100",
        "--connect-timeout",
        "1",
        "--sweep-seconds",
        "2",
    ]);
    full.extend(strings(args));
    run(
        &mut launcher(c, launcher::nuvec_launch(), &full),
        Duration::from_secs(120),
    )
}

/// The link's rate as `benches/cluster.sh` measures it: one TCP stream from host `from` to
/// host `to` for 2 s (iperf3), in bits per second received.
fn iperf3(c: &Cluster, from: usize, to: usize) -> f64 {
    let addr = c.hosts[to].addr.to_string();
    let mut server = {
        let mut s = Command::new("iperf3");
        s.args(["-s", "-B", &addr, "-1"]);
        c.on(to, s)
    }
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .expect("iperf3 -s runs");
    let mut rate = None;
    for _ in 0..50 {
        let mut client = Command::new("iperf3");
        client.args(["-c", &addr, "-t", "2", "-J"]);
        let done = run(&mut c.on(from, client), Duration::from_secs(30));
        let report: serde_json::Value = serde_json::from_str(&done.stdout).unwrap_or_default();
        rate = report["end"]["sum_received"]["bits_per_second"].as_f64();
        if rate.is_some() {
            break;
        }
        // The server is not listening yet: polled, bounded by the 50 tries.
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = server.kill();
    let _ = server.wait();
    rate.expect("iperf3 measured the link")
}

/// The row of `link` (`2→3`) in the doctor's table.
fn table_row<'a>(out: &'a str, link: &str) -> &'a str {
    out.lines()
        .find(|l| l.trim_start().starts_with(&format!("{link} ")))
        .unwrap_or_else(|| panic!("no row {link}:\n{out}"))
}

#[test]
fn the_doctor_measures_every_link_of_a_clean_cluster_within_ten_percent_of_iperf3() {
    let _one = exclusive();
    let Some(c) = cluster::make(4, "1gbit") else {
        return;
    };
    // Held to the test's end: the directory goes with it.
    let dir = procs::scratch("doctor-clean");
    let svg = dir.join("links.svg");
    let svg_arg = svg.display().to_string();
    // 128 MiB or 1 s each way, as iperf3's stream runs long enough to leave slow start; the
    // sweep gets the time for a few 64 MiB all_sums at 1 Gbit/s (about 1 s each).
    let done = doctor(
        &c,
        &[
            "--hosts",
            &c.host_list(&[0, 1, 2, 3]),
            "--json",
            "--svg",
            &svg_arg,
            "--probe-mib",
            "128",
            "--probe-seconds",
            "1",
            "--sweep-seconds",
            "5",
        ],
    );
    assert_eq!(done.code, Some(0), "{}", done.describe());
    let report: serde_json::Value = serde_json::from_str(&done.stdout).expect("the JSON report");
    // Every host says its TCP congestion control, as the host itself reads it.
    for (r, rank) in report["ranks"]
        .as_array()
        .expect("the ranks")
        .iter()
        .enumerate()
    {
        let mut read = Command::new("cat");
        read.arg("/proc/sys/net/ipv4/tcp_congestion_control");
        let own = run(&mut c.on(r, read), Duration::from_secs(30));
        assert_eq!(own.code, Some(0), "{}", own.describe());
        let said = format!(
            "TCP congestion control {} (net.ipv4.tcp_congestion_control)",
            own.stdout.trim()
        );
        let seen = rank["seen"].as_array().expect("what the rank's host has");
        assert!(
            seen.iter()
                .any(|s| s.as_str().is_some_and(|s| s.starts_with(&said))),
            "{said:?} missing in {rank}"
        );
    }
    let link = iperf3(&c, 0, 1);
    let links = report["links"].as_array().expect("the links");
    assert_eq!(links.len(), 4, "{}", done.stdout);
    let mut off = Vec::new();
    for l in links {
        let m = &l["measurement"];
        assert_eq!(m["job_port"]["outcome"], "refused", "{l}");
        assert!(m["rtt"]["p50_us"].as_f64().is_some_and(|v| v > 0.0), "{l}");
        assert_eq!(m["from"]["mtu"], 1500, "{l}");
        for dir in ["forward", "back"] {
            let bytes = m[dir]["bytes"].as_f64().unwrap_or_default();
            let secs = m[dir]["seconds"].as_f64().unwrap_or(1.0);
            let bps = bytes * 8.0 / secs;
            let what = format!(
                "link {}→{} {dir}: {:.0} Mbit/s, iperf3 {:.0} Mbit/s ({:+.1} %)",
                l["from"],
                l["to"],
                bps / 1e6,
                link / 1e6,
                (bps / link - 1.0) * 100.0
            );
            eprintln!("MEASURED doctor {what}");
            if (bps / link - 1.0).abs() > 0.10 {
                off.push(what);
            }
        }
    }
    assert!(off.is_empty(), "more than 10 % from iperf3: {off:#?}");
    // The sweep: every size within the budget, the largest at a sane fraction of the slowest
    // link direction (loosely: the machine is shared).
    let sweep = &report["sweep"];
    assert_eq!(sweep["problems"], serde_json::json!([]), "{sweep:#}");
    let rows = sweep["rows"].as_array().expect("the sweep's rows");
    for r in rows {
        let (bytes, bps) = (&r["bytes"], r["busbw_bps"].as_f64().unwrap_or_default());
        eprintln!(
            "MEASURED doctor sweep {bytes} bytes: {:.0} Mbit/s busbw, {} iterations, {:.2} ms",
            bps / 1e6,
            r["iterations"],
            r["seconds"].as_f64().unwrap_or_default() * 1e3
        );
        assert!(bps > 0.0, "{r}");
    }
    assert!(
        rows.iter().filter_map(|r| r["bytes"].as_u64()).max() >= Some(16 << 20),
        "{sweep:#}"
    );
    let fraction = sweep["of_slowest"].as_f64().unwrap_or_default();
    eprintln!(
        "MEASURED doctor sweep: the largest size's busbw is {:.0} % of the slowest link \
         direction ({} {}, {:.0} Mbit/s)",
        fraction * 100.0,
        sweep["slowest"]["link"],
        sweep["slowest"]["direction"],
        sweep["slowest"]["bps"].as_f64().unwrap_or_default() / 1e6
    );
    assert!(fraction > 0.3, "{sweep:#}");
    let drawn = std::fs::read_to_string(&svg).expect("the SVG");
    assert_eq!(drawn.matches("<line").count(), 4, "{drawn}");
    assert_eq!(drawn.matches("<circle").count(), 4, "{drawn}");
    assert!(drawn.contains("of the slowest link direction"), "{drawn}");
}

#[test]
fn the_doctor_names_the_host_whose_nic_runs_at_a_tenth() {
    let _one = exclusive();
    let Some(c) = cluster::make(4, "1gbit") else {
        return;
    };
    c.set_rate(3, "100mbit");
    let done = doctor(&c, &["--hosts", &c.host_list(&[0, 1, 2, 3])]);
    eprintln!("MEASURED doctor, host 3 at 100 Mbit/s:\n{}", done.stdout);
    assert_eq!(done.code, Some(1), "{}", done.describe());
    assert!(
        done.stdout
            .contains("PROBLEM: rank 3 (host 198.18.0.4) is on every slow link"),
        "{}",
        done.stdout
    );
    for slow in ["2→3", "3→0"] {
        assert!(
            table_row(&done.stdout, slow).contains("slow forward, slow back"),
            "{}",
            done.stdout
        );
    }
    for fast in ["0→1", "1→2"] {
        assert!(
            !table_row(&done.stdout, fast).contains("slow"),
            "{}",
            done.stdout
        );
    }
    // The sweep sets its busbw against one of host 3's directions, the slowest.
    assert!(
        ["(2→3 forward", "(2→3 back", "(3→0 forward", "(3→0 back"]
            .iter()
            .any(|l| done
                .stdout
                .contains(&format!("of the slowest link direction {l}"))),
        "{}",
        done.stdout
    );
}

#[test]
fn the_doctor_says_when_a_hosts_address_sits_on_its_second_slower_interface() {
    let _one = exclusive();
    let Some(mut c) = cluster::make(4, "1gbit") else {
        return;
    };
    let nics = c.second_network("100mbit");
    // Host 2's entry lists its address on the second network, as a host file listing a
    // Wi-Fi address beside Thunderbolt ones.
    let hosts: Vec<serde_json::Value> = (0..4)
        .map(|i| {
            let ip = if i == 2 {
                "198.19.0.3".to_owned()
            } else {
                c.hosts[i].addr.to_string()
            };
            serde_json::json!({ "ssh": c.hosts[i].addr.to_string(), "ips": [ip] })
        })
        .collect();
    // Held to the test's end: the directory goes with it.
    let dir = procs::scratch("doctor-second");
    let path = dir.join("hosts.json");
    std::fs::write(&path, serde_json::Value::Array(hosts).to_string()).expect("the host file");
    let done = doctor(&c, &["--hostfile", &path.display().to_string()]);
    eprintln!(
        "MEASURED doctor, host 2's address on its second NIC:\n{}",
        done.stdout
    );
    assert_eq!(done.code, Some(1), "{}", done.describe());
    let named = format!("{} (198.19.0.3) for 1→2", nics[2]);
    assert!(
        done.stdout
            .contains("PROBLEM: rank 2 (host 198.18.0.3) sends and receives on 2 interfaces")
            && done.stdout.contains(&named),
        "{}",
        done.stdout
    );
    let row = table_row(&done.stdout, "1→2");
    assert!(
        row.contains("198.19.0.2") && row.contains("slow forward") && row.contains(&nics[1]),
        "{}",
        done.stdout
    );
}

#[test]
fn the_doctor_finds_a_ring_address_that_is_a_secondary_address_of_its_nic() {
    let _one = exclusive();
    let Some(c) = cluster::make(2, "1gbit") else {
        return;
    };
    // Host 1's ring address is a second address on its NIC, which Linux's `ifconfig` leaves
    // out: the doctor must find it there (`ip -o addr show`), not call it on no interface.
    let secondary = Ipv4Addr::new(198, 18, 0, 102);
    c.add_address(1, secondary);
    let hosts = serde_json::json!([
        { "ssh": c.hosts[0].addr.to_string(), "ips": [c.hosts[0].addr.to_string()] },
        { "ssh": c.hosts[1].addr.to_string(), "ips": [secondary.to_string()] },
    ]);
    // Held to the test's end: the directory goes with it.
    let dir = procs::scratch("doctor-secondary");
    let path = dir.join("hosts.json");
    std::fs::write(&path, hosts.to_string()).expect("the host file");
    let done = doctor(
        &c,
        &["--hostfile", &path.display().to_string(), "--no-measure"],
    );
    eprintln!(
        "MEASURED doctor, a secondary ring address:\n{}",
        done.stdout
    );
    assert!(
        !done.stdout.contains("on none of this host's interfaces")
            && done.stdout.contains("198.18.0.102 is on ")
            && done.code == Some(0),
        "{}",
        done.describe()
    );
}

#[test]
fn the_doctor_names_the_link_and_port_a_firewall_drops() {
    let _one = exclusive();
    let Some(c) = cluster::make(3, "1gbit") else {
        return;
    };
    // The ring's ports from 32323: rank 2 listens on 32325.
    c.drop_port(2, 32325);
    let done = doctor(&c, &["--hosts", &c.host_list(&[0, 1, 2])]);
    eprintln!(
        "MEASURED doctor, port 32325 dropped on host 2:\n{}",
        done.stdout
    );
    assert_eq!(done.code, Some(1), "{}", done.describe());
    assert!(
        done.stdout.contains(
            "PROBLEM: port 32325 on host 198.18.0.3 does not answer: a firewall dropping it? \
             (link 1→2"
        ),
        "{}",
        done.stdout
    );
    assert!(
        table_row(&done.stdout, "1→2").contains("port 32325 dropped"),
        "{}",
        done.stdout
    );
}

#[test]
fn the_doctor_sweeps_a_jaccl_mesh_over_tcp_cables_across_hosts() {
    let _one = exclusive();
    let Some(c) = cluster::make(3, "1gbit") else {
        return;
    };
    let mesh = [
        r#"[null, "rdma_en1", "rdma_en2"]"#,
        r#"["rdma_en1", null, "rdma_en3"]"#,
        r#"["rdma_en2", "rdma_en3", null]"#,
    ];
    let file = c.dir.join("doctor-jaccl.json");
    std::fs::write(&file, jaccl_hostfile(&c, "jaccl", &mesh)).expect("the host file");
    let started = Instant::now();
    let done = doctor(
        &c,
        &[
            "--hostfile",
            &file.display().to_string(),
            "--env",
            "NUVEC_JACCL_FABRIC=tcp",
        ],
    );
    eprintln!(
        "MEASURED doctor, JACCL mesh of 3 over TCP cables ({} ms):\n{}",
        started.elapsed().as_millis(),
        done.stdout
    );
    // The hosts have no RDMA device (a problem of the host checks); the sweep runs over TCP.
    assert!(
        done.stdout.contains(
            "all_sum sweep (float32, 3 ranks, JACCL mesh of 1 cable(s) per pair, TCP cables;"
        ),
        "{}",
        done.describe()
    );
    assert!(
        !done.stdout.contains("PROBLEM: the all_sum sweep"),
        "{}",
        done.describe()
    );
    assert!(
        done.stdout
            .lines()
            .any(|l| l.starts_with("all_sum ") && l.contains("of the slowest link direction")),
        "{}",
        done.describe()
    );
    // Each cable of the mesh, measured through the sweep's group, both ways.
    assert!(
        done.stdout
            .contains("JACCL's cables, one at a time through the sweep's group"),
        "{}",
        done.describe()
    );
    for (cable, devices) in [
        ("0↔1", "rdma_en1"),
        ("0↔2", "rdma_en2"),
        ("1↔2", "rdma_en3"),
    ] {
        let row = table_row(&done.stdout, cable);
        assert!(
            row.contains(devices) && row.matches("bit/s").count() == 2,
            "{}",
            done.describe()
        );
    }
}

/// The doctor over JACCL's RDMA fabric (the software provider's TCP wire carries the
/// "cables" over the hosts' shaped links), a mesh of 4 with host 3's NIC at a tenth: the
/// cables to host 3 read slow both ways against the median of the cables, rank 3 is named on
/// every slow one, and the all_sum sweep runs over RDMA. The probes are `nuvec-launch` built
/// with its feature `jaccl`. (Of 3 hosts, 2 of the 3 cables would be slow and the median
/// theirs: a host is told slow against its siblings, and needs some.)
#[cfg(feature = "jaccl")]
#[test]
fn the_doctor_measures_each_jaccl_cable_over_rdma_and_names_the_host_on_every_slow_one() {
    let _one = exclusive();
    let Some(c) = cluster::make(4, "1gbit") else {
        return;
    };
    c.set_rate(3, "100mbit");
    let mesh = [
        r#"[null, "rdma_en1", "rdma_en2", "rdma_en3"]"#,
        r#"["rdma_en1", null, "rdma_en4", "rdma_en5"]"#,
        r#"["rdma_en2", "rdma_en4", null, "rdma_en6"]"#,
        r#"["rdma_en3", "rdma_en5", "rdma_en6", null]"#,
    ];
    let file = c.dir.join("doctor-jaccl-rdma.json");
    std::fs::write(&file, jaccl_hostfile(&c, "jaccl", &mesh)).expect("the host file");
    let probes = launcher::nuvec_launch_jaccl().display().to_string();
    let verbs = format!("NUVEC_JACCL_VERBS={}", emu::library().display());
    let started = Instant::now();
    let done = doctor(
        &c,
        &[
            "--hostfile",
            &file.display().to_string(),
            "--probe-program",
            &probes,
            "--env",
            "NUVEC_JACCL_FABRIC=rdma",
            "--env",
            &verbs,
            "--env",
            "NUVEC_VERBS_EMU_WIRE=tcp",
        ],
    );
    eprintln!(
        "MEASURED doctor, JACCL mesh of 4 over RDMA (software provider), host 3 at 100 Mbit/s \
         ({} ms):\n{}",
        started.elapsed().as_millis(),
        done.stdout
    );
    assert!(
        done.stdout
            .contains("all_sum sweep (float32, 4 ranks, JACCL mesh of 1 cable(s) per pair, RDMA;"),
        "{}",
        done.describe()
    );
    assert!(
        !done.stdout.contains("PROBLEM: the all_sum sweep"),
        "{}",
        done.describe()
    );
    for slow in ["0↔3", "1↔3", "2↔3"] {
        assert!(
            table_row(&done.stdout, slow).contains("slow forward, slow back"),
            "{}",
            done.describe()
        );
    }
    for fast in ["0↔1", "0↔2", "1↔2"] {
        assert!(
            !table_row(&done.stdout, fast).contains("slow"),
            "{}",
            done.describe()
        );
    }
    let host = c.hosts[3].addr;
    assert!(
        done.stdout.contains(&format!(
            "PROBLEM: rank 3 (host {host}) is on every slow link"
        )),
        "{}",
        done.describe()
    );
}
