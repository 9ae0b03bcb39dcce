//! `nuvec-launch doctor` on a recorded pair of Macs (`tests/fixtures/doctor/`): a ring whose
//! hostfile lists a Wi-Fi address and an address on the Thunderbolt Bridge, a JACCL mesh whose
//! RDMA interface has no IPv4 address and sits in a bridge that is up, and a clean ring; each
//! run must print its expected report (`expected/*.txt`) and exit 1 on a problem, 0 without.
//! Then the doctor measuring a ring of two ranks on this machine's loopback, its all_sum sweep
//! included, and the same when the sweep's ring cannot form; then a JACCL mesh of three ranks
//! swept over TCP cables.

use std::io::Read;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

#[test]
fn the_doctor_names_each_mistake_of_a_recorded_cluster_and_passes_a_clean_one() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/doctor/wifi-bridge-rdma");
    for (hostfile, code) in [("ring", 1), ("jaccl", 1), ("ring-ok", 0)] {
        // The replay reads files only: the run cannot wait on anything.
        let out = Command::new(env!("CARGO_BIN_EXE_nuvec-launch"))
            .args(["doctor", "--replay", ".", "--hostfile"])
            .arg(format!("{hostfile}.json"))
            .current_dir(&dir)
            .stdin(Stdio::null())
            .output()
            .expect("nuvec-launch runs");
        let expected = std::fs::read_to_string(dir.join(format!("expected/{hostfile}.txt")))
            .expect("the expected report");
        assert_eq!(String::from_utf8_lossy(&out.stdout), expected, "{hostfile}");
        assert_eq!(out.status.code(), Some(code), "{hostfile}");
    }
}

/// `n` consecutive free loopback ports: the first is the system's choice, the next ones are
/// checked free (all released before returning; another process could take one meanwhile).
/// One doctor at a time: a test's ports are free when picked, and another test's connections,
/// whose ports the system picks, must not take them before its doctor listens.
fn exclusive() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn free_ports(n: u16) -> u16 {
    free_ports_held(n).0
}

/// `n` consecutive free loopback ports: the first, and a listener on each (dropped, they are
/// free again).
fn free_ports_held(n: u16) -> (u16, Vec<TcpListener>) {
    for _ in 0..100 {
        let first = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let base = first.local_addr().expect("its address").port();
        if u32::from(base) + u32::from(n) > 65535 {
            continue;
        }
        let rest: Result<Vec<TcpListener>, _> = (1..n)
            .map(|i| TcpListener::bind(("127.0.0.1", base + i)))
            .collect();
        if let Ok(rest) = rest {
            return (base, std::iter::once(first).chain(rest).collect());
        }
    }
    panic!("no {n} consecutive free loopback ports");
}

/// Runs `nuvec-launch doctor ARGS` and returns its standard output and exit code, bounded by
/// a minute (the doctor bounds its own waits; this bounds the test should it not).
fn doctor(args: &[&str]) -> (String, Option<i32>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_nuvec-launch"))
        .arg("doctor")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("nuvec-launch runs");
    let mut stdout = child.stdout.take().expect("its standard output");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        let _ = tx.send(text);
    });
    let out = rx.recv_timeout(Duration::from_secs(60));
    if out.is_err() {
        let _ = child.kill();
    }
    let status = child.wait().expect("the doctor's exit");
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut stderr);
    }
    let out = out.unwrap_or_else(|_| panic!("the doctor ran over 60 s ({status}): {stderr}"));
    (out, status.code())
}

#[test]
fn a_sweep_whose_ring_cannot_form_is_a_problem_in_the_librarys_words_and_ends_soon() {
    let _one = exclusive();
    let (port, mut held) = free_ports_held(4);
    // Rank 1's probe port, where its sweep's ring would listen, held by another program
    // that takes every connection and closes it at once (kept from when the ports were
    // found free, so that nothing else takes it in between).
    let taken = port + 3;
    let holder = held.pop().expect("the fourth port's listener");
    drop(held);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stopping = stop.clone();
    let closer = std::thread::spawn(move || {
        for stream in holder.incoming() {
            drop(stream);
            if stopping.load(std::sync::atomic::Ordering::SeqCst) {
                break;
            }
        }
    });
    let started = std::time::Instant::now();
    let (out, code) = doctor(&[
        "--hosts",
        "127.0.0.1,127.0.0.1",
        "-p",
        &port.to_string(),
        "--probe-seconds",
        "0.2",
        "--pings",
        "20",
        "--sweep-seconds",
        "2",
    ]);
    let took = started.elapsed();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    // The one connection that wakes the closer's accept.
    let _ = std::net::TcpStream::connect(("127.0.0.1", taken));
    let _ = closer.join();
    assert_eq!(code, Some(1), "{out}");
    let said = format!(
        "PROBLEM: the all_sum sweep on rank 1: distributed: rank 1: cannot listen on \
         127.0.0.1:{taken}"
    );
    assert!(out.contains(&said), "{out}");
    assert!(
        out.contains("PROBLEM: the all_sum sweep on rank 0: "),
        "{out}"
    );
    // Rank 0 is not waited for to the end of its ring's setup (30 s and the budget).
    assert!(took < Duration::from_secs(25), "{took:?}\n{out}");
}

#[test]
fn the_doctor_sweeps_all_sum_over_a_ring_of_two_local_ranks_and_names_the_slowest_link() {
    let _one = exclusive();
    // The job's two ports, then the probes' two, where the sweep's ring connects.
    let port = free_ports(4);
    let svg = std::env::temp_dir().join(format!("nuvec-doctor-sweep-{}.svg", std::process::id()));
    let svg_arg = svg.display().to_string();
    let (out, _) = doctor(&[
        "--hosts",
        "127.0.0.1,127.0.0.1",
        "-p",
        &port.to_string(),
        "--probe-mib",
        "16",
        "--probe-seconds",
        "0.2",
        "--pings",
        "20",
        "--sweep-seconds",
        "3",
        "--json",
        "--svg",
        &svg_arg,
    ]);
    let report: serde_json::Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let sweep = &report["sweep"];
    assert_eq!(sweep["problems"], serde_json::json!([]), "{sweep:#}");
    assert_eq!(sweep["ranks"], 2, "{sweep:#}");
    let rows = sweep["rows"].as_array().expect("the sweep's rows");
    let sizes: Vec<u64> = rows.iter().filter_map(|r| r["bytes"].as_u64()).collect();
    let skipped: Vec<u64> = sweep["skipped"]
        .as_array()
        .expect("the sizes skipped")
        .iter()
        .filter_map(serde_json::Value::as_u64)
        .collect();
    // The budget may leave out the largest sizes on a loaded machine, never the smallest.
    assert!(sizes.first() == Some(&4096), "{sweep:#}");
    let all: Vec<u64> = sizes.iter().chain(&skipped).copied().collect();
    assert_eq!(
        all,
        [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20],
        "{sweep:#}"
    );
    for r in rows {
        assert!(
            r["busbw_bps"].as_f64().is_some_and(|v| v > 0.0)
                && r["iterations"].as_u64().is_some_and(|i| i >= 1),
            "{r}"
        );
    }
    assert!(
        sweep["of_slowest"].as_f64().is_some_and(|v| v > 0.0),
        "{sweep:#}"
    );
    assert!(
        ["forward", "back"].contains(&sweep["slowest"]["direction"].as_str().unwrap_or("")),
        "{sweep:#}"
    );
    let drawn = std::fs::read_to_string(&svg).expect("the SVG");
    let _ = std::fs::remove_file(&svg);
    assert!(
        drawn.contains("busbw") && drawn.contains("of the slowest link direction"),
        "{drawn}"
    );
}

#[test]
fn the_doctor_sweeps_all_sum_over_a_jaccl_mesh_of_three_local_ranks_over_tcp_cables() {
    let _one = exclusive();
    // The job's coordinator port, then the probe port beside it, where the sweep's coordinator
    // listens (JACCL's TCP cables take ports the system picks).
    let port = free_ports(2);
    let row = |devices: &str| {
        format!(r#"{{"ssh": "127.0.0.1", "ips": ["127.0.0.1"], "rdma": {devices}}}"#)
    };
    let hostfile = format!(
        r#"{{"backend": "jaccl", "hosts": [{}, {}, {}]}}"#,
        row(r#"[null, "rdma_en1", "rdma_en2"]"#),
        row(r#"["rdma_en1", null, "rdma_en3"]"#),
        row(r#"["rdma_en2", "rdma_en3", null]"#),
    );
    let path = std::env::temp_dir().join(format!("nuvec-doctor-jaccl-{}.json", std::process::id()));
    std::fs::write(&path, hostfile).expect("write the host file");
    let path_arg = path.display().to_string();
    let started = std::time::Instant::now();
    let (out, _) = doctor(&[
        "--hostfile",
        &path_arg,
        "-p",
        &port.to_string(),
        "--env",
        "NUVEC_JACCL_FABRIC=tcp",
        "--probe-mib",
        "16",
        "--probe-seconds",
        "0.2",
        "--pings",
        "20",
        "--sweep-seconds",
        "2",
        "--json",
    ]);
    let took = started.elapsed();
    let _ = std::fs::remove_file(&path);
    let report: serde_json::Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(report["backend"], "jaccl", "{report:#}");
    let sweep = &report["sweep"];
    assert_eq!(sweep["not_run"], serde_json::Value::Null, "{sweep:#}");
    // The sweep itself went right. The cables' findings (a direction slow or asymmetric) are
    // left out here: three ranks on one machine share its cores, and the rank waiting in the
    // barrier while two measure takes CPU from either side by turns, so that on a busy
    // machine a loopback "cable" can read 0.7x one way; the cluster test reads real ones.
    let problems: Vec<&serde_json::Value> = sweep["problems"]
        .as_array()
        .expect("the sweep's problems")
        .iter()
        .filter(|p| !p.as_str().is_some_and(|p| p.starts_with("link ")))
        .collect();
    assert!(problems.is_empty(), "{sweep:#}");
    assert_eq!(sweep["ranks"], 3, "{sweep:#}");
    assert_eq!(sweep["backend"], "jaccl", "{sweep:#}");
    assert_eq!(
        sweep["wire"], "JACCL mesh of 1 cable(s) per pair, TCP cables",
        "{sweep:#}"
    );
    let rows = sweep["rows"].as_array().expect("the sweep's rows");
    assert_eq!(
        rows.first().and_then(|r| r["bytes"].as_u64()),
        Some(4096),
        "{sweep:#}"
    );
    for r in rows {
        assert!(
            r["busbw_bps"].as_f64().is_some_and(|v| v > 0.0)
                && r["iterations"].as_u64().is_some_and(|i| i >= 1),
            "{r}"
        );
    }
    // The links measured are the ranks' connections to the coordinator: the verdict names one.
    assert!(
        sweep["of_slowest"].as_f64().is_some_and(|v| v > 0.0),
        "{sweep:#}"
    );
    // Every cable of the mesh, one at a time through the sweep's group: its devices, round
    // trips and both directions.
    let cables = sweep["cables"].as_array().expect("the cables");
    let pairs: Vec<(u64, u64, &str)> = cables
        .iter()
        .map(|c| {
            (
                c["from"].as_u64().unwrap_or(99),
                c["to"].as_u64().unwrap_or(99),
                c["address"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        pairs,
        [
            (0, 1, "RDMA rdma_en1"),
            (0, 2, "RDMA rdma_en2"),
            (1, 2, "RDMA rdma_en3")
        ],
        "{sweep:#}"
    );
    for c in cables {
        let m = &c["measurement"];
        assert!(
            m["rtt"]["p50_us"].as_f64().is_some_and(|v| v > 0.0)
                && m["rtt"]["count"] == 50
                && m["forward"]["bytes"] == 8 << 20
                && m["back"]["seconds"].as_f64().is_some_and(|v| v > 0.0)
                && m["error"].is_null(),
            "{c:#}"
        );
    }
    assert!(took < Duration::from_secs(20), "{took:?}\n{out}");
}
