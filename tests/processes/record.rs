//! The flight recorder across processes: ranks in mismatched collectives each write their
//! record when their group fails, naming the operation each was in; ranks waiting for a busy
//! one answer a request for their record with the operation they wait in, for whom, and the
//! busy rank one operation behind.

use crate::common::ports;
use crate::common::procs;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nuvec_core::distributed::{self, Group};
use nuvec_core::{Array, ops};

const CHILD_TEST: &str = concat!(module_path!(), "::a_rank_runs_its_record_scenario");
const SCENARIO: &str = "NUVEC_TEST_SCENARIO";
const DIR: &str = "NUVEC_DISTRIBUTED_RECORD_DIR";

/// Two all_sums, then rank 1 calls all_gather where the others call all_sum.
fn mismatch(group: &Group) {
    let x = ops::full([1024usize], 1.0f32);
    for _ in 0..2 {
        distributed::all_sum(&x, Some(group))
            .eval()
            .expect("an all_sum");
    }
    let third = if group.rank() == 1 {
        distributed::all_gather(&x, Some(group))
    } else {
        distributed::all_sum(&x, Some(group))
    };
    match third.eval() {
        Ok(()) => println!("RETURNED DATA"),
        Err(e) => println!("ERROR {e}"),
    }
}

/// Two all_sums, then the last rank is busy for 3 s before the third.
fn busy(group: &Group) {
    let x: Array = ops::full([1024usize], 1.0f32);
    for n in 0..3 {
        if n == 2 && group.rank() + 1 == group.size() {
            // A rank at work elsewhere: a fixed pause, not a wait for anything.
            std::thread::sleep(Duration::from_secs(3));
        }
        distributed::all_sum(&x, Some(group))
            .eval()
            .expect("an all_sum");
    }
    println!("SUCCEEDED");
}

#[test]
fn a_rank_runs_its_record_scenario() {
    if !procs::is_child(CHILD_TEST) {
        return;
    }
    let group = nuvec_distributed::init(true).unwrap_or_else(|e| {
        println!("INIT FAILED {e}");
        std::process::exit(3)
    });
    match std::env::var(SCENARIO).as_deref() {
        Ok("mismatch") => mismatch(&group),
        Ok("busy") => busy(&group),
        other => panic!("unknown scenario {other:?}"),
    }
}

/// `ranks` processes of `scenario` in `dir`, recording into `dir/records`, each run to its end.
fn job(dir: &Path, scenario: &str, ranks: usize) -> Vec<procs::Finished> {
    let nodes = ports::free_nodes(ranks, 1);
    let hostfile = procs::write_hostfile(dir, &nodes);
    let records = dir.join("records");
    std::fs::create_dir_all(&records).expect("the record directory");
    let commands = (0..ranks)
        .map(|r| {
            let mut cmd = procs::this_test(CHILD_TEST);
            cmd.env(SCENARIO, scenario)
                .env("MLX_HOSTFILE", &hostfile)
                .env("MLX_RANK", r.to_string())
                .env(DIR, &records);
            cmd
        })
        .collect();
    procs::run_each(dir, commands, Duration::from_secs(60))
}

/// The lines of rank `rank`'s record in `records`: its header and its operations.
fn record(records: &Path, rank: usize) -> Option<(serde_json::Value, Vec<serde_json::Value>)> {
    let text = std::fs::read_to_string(records.join(format!("rank-{rank}.jsonl"))).ok()?;
    let mut lines = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("a JSON line"));
    let header = lines.next()?;
    Some((header, lines.collect()))
}

/// `(op, seq, state)` of an operation's line.
fn summary(op: &serde_json::Value) -> (String, u64, String) {
    (
        op["op"].as_str().unwrap_or("?").to_owned(),
        op["seq"].as_u64().unwrap_or(u64::MAX),
        op["state"].as_str().unwrap_or("?").to_owned(),
    )
}

#[test]
fn ranks_in_mismatched_collectives_each_record_the_operation_they_failed_in() {
    let _one_job_at_a_time = procs::exclusive();
    let dir = procs::scratch("record-mismatch");
    let finished = job(&dir, "mismatch", 4);
    let records: PathBuf = dir.join("records");
    for (rank, f) in finished.iter().enumerate() {
        assert!(
            !f.output.contains("RETURNED DATA") && f.output.contains("ERROR"),
            "rank {rank}: {}",
            f.output
        );
        let (header, ops) = record(&records, rank)
            .unwrap_or_else(|| panic!("rank {rank} wrote no record:\n{}", f.output));
        assert_eq!(header["reason"], "failure", "rank {rank}: {header}");
        assert_eq!(header["rank"], rank as u64);
        assert_eq!(header["size"], 4);
        let world: Vec<_> = ops.iter().filter(|o| o["group"] == "world").collect();
        let got: Vec<_> = world.iter().map(|o| summary(o)).collect();
        let third = if rank == 1 { "all_gather" } else { "all_sum" };
        assert_eq!(
            got,
            vec![
                ("all_sum".to_owned(), 0, "done".to_owned()),
                ("all_sum".to_owned(), 1, "done".to_owned()),
                (third.to_owned(), 2, "failed".to_owned()),
            ],
            "rank {rank}"
        );
        let last = world.last().expect("an operation");
        assert!(
            last["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{last}"
        );
        assert!(
            last["end_us"].as_u64() >= last["start_us"].as_u64(),
            "{last}"
        );
    }
}

#[test]
fn ranks_waiting_for_a_busy_one_answer_a_request_with_what_they_wait_for() {
    let _one_job_at_a_time = procs::exclusive();
    let dir = procs::scratch("record-busy");
    let records = dir.join("records");
    std::thread::scope(|s| {
        let running = s.spawn(|| job(&dir, "busy", 3));
        // Ask, every 300 ms, until ranks 0 and 1 say they wait in all_sum #2 and for whom,
        // within the busy rank's 3 s.
        let started = Instant::now();
        let mut id = 0u64;
        let seen = loop {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "no record showed ranks 0 and 1 waiting"
            );
            std::thread::sleep(Duration::from_millis(300));
            id += 1;
            let request = records.join("request");
            let tmp = records.join("request.tmp");
            if std::fs::write(&tmp, id.to_string()).is_err()
                || std::fs::rename(&tmp, &request).is_err()
            {
                continue;
            }
            let asked = Instant::now();
            let answers: Option<Vec<_>> = loop {
                let answers: Option<Vec<_>> = (0..3)
                    .map(|r| record(&records, r).filter(|(h, _)| h["request"] == id))
                    .collect();
                if answers.is_some() || asked.elapsed() > Duration::from_secs(2) {
                    break answers;
                }
                std::thread::sleep(Duration::from_millis(20));
            };
            let Some(answers) = answers else { continue };
            let last: Vec<serde_json::Value> = answers
                .iter()
                .map(|(_, ops)| ops.last().cloned().unwrap_or_default())
                .collect();
            let waiting = |o: &serde_json::Value| {
                summary(o) == ("all_sum".to_owned(), 2, "running".to_owned())
                    && o["waiting_on"].as_array().is_some_and(|w| !w.is_empty())
            };
            if waiting(&last[0]) && waiting(&last[1]) {
                break last;
            }
        };
        assert_eq!(
            summary(&seen[2]),
            ("all_sum".to_owned(), 1, "done".to_owned()),
            "the busy rank is one operation behind: {seen:?}"
        );
        let finished = running.join().expect("the job");
        procs::assert_all_ok("the busy job", &finished);
    });
}
