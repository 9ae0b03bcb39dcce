use super::*;
use crate::fabric::{Channel, Direction};

/// The lines of `dump_text` that belong to the group of size `size` (tests share the process's
/// registry, so each uses a size of its own).
fn lines_of(size: usize) -> Vec<serde_json::Value> {
    dump_text("test", None)
        .lines()
        .skip(1)
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("a JSON line"))
        .filter(|v| v["group_size"] == size)
        .collect()
}

fn stall(peer: usize, done: usize) -> Stall {
    Stall {
        channel: Channel::new(peer, 0),
        direction: Direction::Recv,
        done,
        total: 4096,
        heard_ago: None,
        alive: Some(true),
    }
}

#[test]
fn a_record_keeps_the_last_operations_oldest_first_and_counts_those_it_dropped() {
    let mut record = Record::new(1, 11, 3, None).expect("a record");
    for n in 0..5 {
        record.begin(
            &Call::new("all_sum", n),
            n as u64,
            [0, 2].into_iter(),
            Duration::ZERO,
        );
        record.end(None, Duration::ZERO);
    }
    let (entries, dropped) = record.ring.entries();
    assert_eq!(dropped, 2);
    let seqs: Vec<u64> = entries.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, vec![2, 3, 4]);
    assert!(
        entries
            .iter()
            .all(|e| e.state == State::Done && e.peers == [0, 2])
    );
    assert_eq!(Record::new(0, 2, 0, None).map(|_| ()), None);
}

#[test]
fn a_send_or_receive_names_its_peer_and_a_collective_the_groups_peers() {
    let mut record = Record::new(0, 12, 16, None).expect("a record");
    let send = |peer| Call {
        peer: Some(peer),
        ..Call::new("send", 8)
    };
    let recv = |peer| Call {
        peer: Some(peer),
        ..Call::new("recv", 8)
    };
    for (call, seq) in [
        (Call::new("all_sum", 4), 0),
        (send(1), 0),
        (recv(1), 0),
        (send(2), 0),
        (Call::new("all_gather", 4), 1),
    ] {
        record.begin(&call, seq, [1, 11].into_iter(), Duration::ZERO);
        record.end(None, Duration::ZERO);
    }
    let got: Vec<(&str, u64, Vec<u64>)> = record
        .ring
        .entries()
        .0
        .into_iter()
        .map(|e| (e.op, e.seq, e.peers))
        .collect();
    assert_eq!(
        got,
        vec![
            ("all_sum", 0, vec![1, 11]),
            ("send", 0, vec![1]),
            ("recv", 0, vec![1]),
            ("send", 0, vec![2]),
            ("all_gather", 1, vec![1, 11]),
        ]
    );
}

#[test]
fn a_waiting_operation_says_whom_it_waits_for_and_a_failed_one_its_error() {
    let mut record = Record::new(2, 13, 8, None).expect("a record");
    let mut noting = record.patience();
    assert_eq!(noting.due(), None);
    let call = Call {
        dtype: Some(DType::F32),
        ..Call::new("all_sum", 4096)
    };
    record.begin(&call, 0, [1, 3].into_iter(), Duration::from_secs(10));
    assert_eq!(noting.due(), Some(Duration::from_secs(10) + NOTE_EVERY));
    noting.report(Duration::from_secs(11), &stall(3, 1000));
    assert_eq!(noting.due(), Some(Duration::from_secs(11) + NOTE_EVERY));
    let lines = lines_of(13);
    let line = lines.last().expect("the running operation");
    assert_eq!(line["state"], "running");
    assert_eq!(line["end_us"], serde_json::Value::Null);
    assert_eq!(line["waiting_on"], serde_json::json!([3]));
    assert_eq!(line["moved"], serde_json::json!([[3, 1000]]));
    assert_eq!(line["dtype"], "float32");
    assert_eq!(line["bytes"], 4096);
    record.end(
        Some(&"rank 3 closed the connection"),
        Duration::from_secs(12),
    );
    assert_eq!(noting.due(), None);
    let lines = lines_of(13);
    let line = lines.last().expect("the failed operation");
    assert_eq!(line["state"], "failed");
    assert_eq!(line["error"], "rank 3 closed the connection");
    assert_eq!(line["waiting_on"], serde_json::json!([]));
    assert!(line["end_us"].as_u64() >= line["start_us"].as_u64());
    for key in [
        "group",
        "group_rank",
        "group_size",
        "seq",
        "op",
        "dtype",
        "bytes",
        "peers",
        "start_us",
        "end_us",
        "state",
        "waiting_on",
        "moved",
        "error",
    ] {
        assert!(line.get(key).is_some(), "{key} in {line}");
    }
}

#[test]
fn a_failed_groups_record_outlives_the_group_so_the_exit_dump_still_shows_the_failure() {
    let call = Call::new("all_sum", 64);
    // A group that fails and is dropped: its failure stays in every later dump.
    let mut failed = Record::new(0, 17, 4, None).expect("a record");
    failed.begin(&call, 0, [1].into_iter(), Duration::from_secs(1));
    failed.end(
        Some(&"rank 1 closed the connection"),
        Duration::from_secs(2),
    );
    failed.keep();
    failed.keep();
    drop(failed);
    let lines = lines_of(17);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["error"], "rank 1 closed the connection");
    // A group that ends without failing is gone from the dumps with it.
    let mut fine = Record::new(0, 18, 4, None).expect("a record");
    fine.begin(&call, 0, [1].into_iter(), Duration::from_secs(1));
    fine.end(None, Duration::from_secs(2));
    assert_eq!(lines_of(18).len(), 1);
    drop(fine);
    assert_eq!(lines_of(18).len(), 0);
}

#[test]
fn a_reader_never_sees_a_slot_half_written() {
    let mut record = Record::new(0, 14, 4, None).expect("a record");
    let ring = record.ring.clone();
    let stop = std::sync::atomic::AtomicBool::new(false);
    // Both threads start together, and the reader reads once more after the writer stops: on a
    // busy machine the writer could otherwise finish before the reader first ran.
    let start = std::sync::Barrier::new(2);
    std::thread::scope(|s| {
        let reader = s.spawn(|| {
            start.wait();
            let mut seen = 0u64;
            loop {
                let last = stop.load(Ordering::Acquire);
                for e in ring.entries().0 {
                    // Every operation below is written with seq == bytes.
                    assert_eq!(e.seq, e.bytes, "{e:?}");
                    seen += 1;
                }
                if last {
                    return seen;
                }
            }
        });
        start.wait();
        for n in 0..200_000usize {
            record.begin(
                &Call::new("all_max", n),
                n as u64,
                [1].into_iter(),
                Duration::ZERO,
            );
            record.end(None, Duration::ZERO);
        }
        stop.store(true, Ordering::Release);
        assert!(reader.join().expect("the reader") > 0);
    });
}

#[test]
fn a_request_in_the_directory_is_answered_once_with_its_id() {
    let dir = std::env::temp_dir().join(format!("nuvec-record-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a directory");
    let _record = Record::new(0, 15, 4, None).expect("a record");
    let file = dir.join(format!("{}.jsonl", file_stem()));
    let mut look = Look::default();
    look.at(&dir);
    assert!(!file.exists(), "no request, no dump");
    assert!(dir.join(format!("{}.progress", file_stem())).exists());
    std::fs::write(dir.join("request"), "7\n").expect("a request");
    look.at(&dir);
    let text = std::fs::read_to_string(&file).expect("the dump");
    let header: serde_json::Value =
        serde_json::from_str(text.lines().next().expect("a header")).expect("JSON");
    assert_eq!(header["reason"], "request");
    assert_eq!(header["request"], 7);
    assert_eq!(header["record"], 1);
    std::fs::remove_file(&file).expect("removed");
    look.at(&dir);
    assert!(!file.exists(), "a request is answered once");
    std::fs::write(dir.join("request"), "8").expect("a new request");
    look.at(&dir);
    assert!(file.exists(), "a new request is answered");
    std::fs::remove_dir_all(&dir).expect("cleaned up");
}

#[test]
fn on_a_fixed_epoch_a_groups_own_record_reads_the_fabric_clock_as_the_job_and_as_of_its_last_event()
{
    let epoch = 1_767_225_600_000_000;
    let mut record = Record::new(2, 16, 4, Some(epoch)).expect("a record");
    let reader = record.reader();
    record.begin(
        &Call::new("all_sum", 64),
        0,
        [1, 3].into_iter(),
        Duration::from_micros(10),
    );
    record.end(None, Duration::from_micros(25));
    record.begin(
        &Call::new("all_gather", 8),
        1,
        [1, 3].into_iter(),
        Duration::from_micros(40),
    );
    let text = reader.text();
    let mut lines = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("a JSON line"));
    let header = lines.next().expect("a header");
    assert_eq!(header["rank"], 2);
    assert_eq!(header["size"], 16);
    assert_eq!(header["at_us"], epoch + 40);
    let ops: Vec<serde_json::Value> = lines.collect();
    assert_eq!(ops.len(), 2);
    assert!(ops.iter().all(|o| o["group"] == "world"));
    assert_eq!(ops[0]["start_us"], epoch + 10);
    assert_eq!(ops[0]["end_us"], epoch + 25);
    assert_eq!(ops[1]["state"], "running");
}

/// The recorder's cost per operation (a begin and an end, with peers, as the communicator
/// core makes them), and with one more clock read for the end (what it cost before the end
/// took the fabric's latest reading), printed; run in release:
/// `cargo test --release --ignore-rust-version --lib -- --ignored what_an_operation_costs_the_recorder --nocapture`.
#[test]
#[ignore = "a measurement: run it in release, by hand"]
fn what_an_operation_costs_the_recorder() {
    let mut record = Record::new(0, 2, capacity().max(1), None).expect("a record");
    let call = Call {
        dtype: Some(DType::F32),
        ..Call::new("all_sum", 4096)
    };
    let batch = 1_000_000u64;
    let zero = std::time::Instant::now();
    for read_clock in [false, true] {
        let mut per_op = Vec::new();
        for round in 0..7u64 {
            let started = std::time::Instant::now();
            for n in 0..batch {
                let at = Duration::from_nanos(n * 7_000);
                record.begin(&call, round * batch + n, [1].into_iter(), at);
                let end = if read_clock {
                    zero.elapsed()
                } else {
                    at + Duration::from_nanos(5_000)
                };
                record.end(None, end);
            }
            per_op.push(started.elapsed().as_secs_f64() * 1e9 / batch as f64);
        }
        per_op.sort_by(f64::total_cmp);
        eprintln!(
            "MEASURED the recorder{}: {:.1} ns per operation (median of 7 rounds of {batch}; min {:.1}, max {:.1})",
            if read_clock {
                " with a clock read for the end"
            } else {
                ""
            },
            per_op[3],
            per_op[0],
            per_op[6]
        );
    }
}

#[test]
fn a_record_that_cannot_be_renamed_into_place_leaves_no_temporary_file() {
    let dir = std::env::temp_dir().join(format!("nuvec-record-tmp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // The record's path is a directory that is not empty: every rename onto it fails.
    let path = dir.join("rank-0.jsonl");
    std::fs::create_dir_all(path.join("in-the-way")).expect("a directory");
    for _ in 0..3 {
        assert!(write_atomically(&path, "{}\n").is_err());
    }
    let left: Vec<String> = std::fs::read_dir(&dir)
        .expect("the directory")
        .map(|e| {
            e.expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    assert_eq!(left, ["rank-0.jsonl"]);
    std::fs::remove_dir_all(&dir).expect("removed");
}

#[test]
fn a_records_rank_is_the_launchs_jaccl_rank_first_on_a_jaccl_launch_else_mlx_rank() {
    let rank = |vars: &[(&str, &str)]| {
        let vars: Vec<(String, std::ffi::OsString)> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).into()))
            .collect();
        let lookup = move |name: &str| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
        launch_rank(&Env::from_fn(&lookup))
    };
    let jaccl = [
        ("MLX_IBV_DEVICES", "d.json"),
        ("JACCL_RANK", "3"),
        ("MLX_RANK", "1"),
    ];
    assert_eq!(rank(&jaccl), Some(3));
    assert_eq!(
        rank(&[("JACCL_IBV_DEVICES", "d.json"), ("JACCL_RANK", "2")]),
        Some(2)
    );
    assert_eq!(rank(&[("JACCL_RANK", "3"), ("MLX_RANK", "1")]), Some(1));
    assert_eq!(rank(&[("MLX_RANK", "x")]), None);
}
