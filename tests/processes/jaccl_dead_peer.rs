//! A JACCL rank that dies while the others wait in a collective, across processes over TCP
//! (`NUVEC_JACCL_FABRIC=tcp`) and, with the feature `jaccl`, over the RDMA fabric driving the
//! software RDMA provider (which, as UC on Thunderbolt, never reports a dead peer): the side
//! channel notices it, every survivor fails within a second with an error naming the dead rank
//! and the operation, and the group stays failed; a stopped (SIGSTOP) rank is only failed at
//! the deadline, and `JACCL_PROGRESS_TIMEOUT_S` bounds the wait before it. Each job prints a
//! `MEASURED` line per survivor (how long after the death it failed).

#[cfg(feature = "jaccl")]
use crate::common::emu;
use crate::common::ports;
use crate::common::procs;

use std::io::Write;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nuvec_core::Array;
use nuvec_core::distributed::{self, Group};

const CHILD_TEST: &str = concat!(module_path!(), "::a_rank_of_a_dead_peer_job_runs_its_part");
/// Which rank dies (or stops).
const VICTIM: &str = "NUVEC_TEST_VICTIM";
/// `kill` (SIGKILL) or `stop` (SIGSTOP).
const HOW: &str = "NUVEC_TEST_HOW";

/// Floats per all_sum: several frames per queue pair and step.
const FLOATS: usize = 50_000;

/// How long the victim lets the others wait in the collective before it dies.
const BEFORE_DEATH: Duration = Duration::from_millis(300);

/// How long a survivor keeps its process (and its connections) after failing, so that its own
/// exit tells the others nothing within the measured second.
const LINGER: Duration = Duration::from_millis(1500);

/// Wall-clock nanoseconds (every rank runs on this machine).
fn wall_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// One all_sum; its error text when it fails.
fn all_sum(group: &Group) -> Result<(), String> {
    let rank = group.rank();
    let x = Array::from_slice(&vec![rank as f32; FLOATS], [FLOATS]);
    // AssertUnwindSafe: after a panic only its message is used; the array (not unwind-safe
    // on macOS, where its storage may be a Metal buffer) is dropped unread.
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        distributed::all_sum(&x, Some(group))
            .to_vec::<f32>()
            .map(|_| ())
    }));
    match outcome {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(panic) => Err(panic
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_else(|| "a panic".into())),
    }
}

/// Sends `signal` to this process, without a child process: a `kill` command's exit would
/// make the kernel send a stopped process of an orphaned process group `SIGCONT`.
fn signal_self(signal: libc::c_int) {
    // SAFETY: `raise` has no memory-safety preconditions.
    let status = unsafe { libc::raise(signal) };
    println!("raise {signal}: {status}");
}

#[test]
fn a_rank_of_a_dead_peer_job_runs_its_part() {
    if !procs::is_child(CHILD_TEST) {
        return;
    }
    let victim: usize = std::env::var(VICTIM)
        .expect("victim")
        .parse()
        .expect("a rank");
    let how = std::env::var(HOW).expect("how");
    let group = nuvec_distributed::init_backend(true, nuvec_distributed::Backend::Jaccl)
        .unwrap_or_else(|e| {
            println!("INIT FAILED {e}");
            std::process::exit(3)
        });
    let rank = group.rank();
    all_sum(&group).unwrap_or_else(|e| panic!("the first all_sum failed: {e}"));
    println!("WARMED UP");
    if rank == victim {
        std::thread::sleep(BEFORE_DEATH);
        println!("DYING AT {}", wall_ns());
        std::io::stdout().flush().expect("flush");
        match how.as_str() {
            "kill" => signal_self(libc::SIGKILL),
            _ => signal_self(libc::SIGSTOP),
        }
        println!("STILL HERE");
        std::process::exit(4);
    }
    let began = Instant::now();
    let Err(e) = all_sum(&group) else {
        panic!("the all_sum succeeded without rank {victim}");
    };
    let at = wall_ns();
    let waited = began.elapsed();
    println!(
        "FAILED AT {at} AFTER {} ms: {}",
        waited.as_millis(),
        e.replace('\n', " ")
    );
    match all_sum(&group) {
        Ok(()) => println!("LATER: succeeded"),
        Err(e) => println!("LATER: {}", e.replace('\n', " ")),
    }
    std::io::stdout().flush().expect("flush");
    std::thread::sleep(LINGER);
}

/// The device file of a mesh (one device per pair) or a ring of one cable per neighbour pair.
fn device_file(ranks: usize, ring: bool) -> String {
    let rows: Vec<serde_json::Value> = (0..ranks)
        .map(|i| {
            (0..ranks)
                .map(|j| {
                    let neighbours = (i + 1) % ranks == j || (j + 1) % ranks == i;
                    let name = format!("rdma_en{}", i.min(j) * 10 + i.max(j));
                    match () {
                        _ if i == j => serde_json::Value::Null,
                        _ if !ring => name.into(),
                        _ if neighbours => vec![name].into(),
                        _ => serde_json::Value::Null,
                    }
                })
                .collect::<Vec<_>>()
                .into()
        })
        .collect();
    serde_json::Value::Array(rows).to_string()
}

/// What carries a job's frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Over {
    Tcp,
    #[cfg(feature = "jaccl")]
    Rdma,
}

/// One survivor's end: how long after the victim's death it failed, and its lines.
#[derive(Debug)]
struct Survivor {
    rank: usize,
    after_death: Duration,
    waited: Duration,
    error: String,
    later: String,
}

/// Runs a job of `ranks` in which `victim` is killed or stopped (`how`) while the others wait
/// in their second all_sum, with `env` for every rank; returns every survivor's end.
fn job(
    name: &str,
    ranks: usize,
    ring: bool,
    victim: usize,
    how: &str,
    over: Over,
    env: &[(&str, &str)],
) -> Vec<Survivor> {
    let _one_job_at_a_time = procs::exclusive();
    let dir = procs::scratch(name);
    let devices = dir.join("devices.json");
    let device_file = device_file(ranks, ring);
    std::fs::write(&devices, &device_file).expect("write the device file");
    let coordinator = ports::free_nodes(1, 1)[0][0].clone();
    let commands = (0..ranks)
        .map(|rank| {
            let mut cmd = procs::this_test(CHILD_TEST);
            cmd.env(VICTIM, victim.to_string())
                .env(HOW, how)
                .env("MLX_RANK", rank.to_string())
                .env("MLX_IBV_DEVICES", &devices)
                .env("MLX_JACCL_COORDINATOR", &coordinator)
                .env("NUVEC_JACCL_FABRIC", "tcp")
                .env("NUVEC_DISTRIBUTED_TIMEOUT", "20")
                .env_remove("MLX_HOSTFILE")
                .env_remove("JACCL_PROGRESS_TIMEOUT_S")
                .env_remove("MLX_JACCL_PROGRESS_TIMEOUT_S");
            if ring {
                cmd.env("MLX_JACCL_RING", "1");
            }
            match over {
                Over::Tcp => {}
                #[cfg(feature = "jaccl")]
                Over::Rdma => emu::configure(&mut cmd, &device_file, &dir.join("ledger")),
            }
            for (key, value) in env {
                cmd.env(key, value);
            }
            cmd
        })
        .collect();
    let survivors: Vec<usize> = (0..ranks).filter(|&r| r != victim).collect();
    // A stopped victim never exits: the job ends when the survivors have.
    let finished = procs::run_until(&dir, commands, Duration::from_secs(90), &survivors);
    let field = |out: &str, key: &str| -> Option<String> {
        out.lines()
            .find_map(|l| l.find(key).map(|at| l[at + key.len()..].to_owned()))
    };
    let died: u128 = field(&finished[victim].output, "DYING AT ")
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name}: rank {victim} did not say when it died: {finished:?}"));
    survivors
        .iter()
        .map(|&rank| {
            let out = &finished[rank].output;
            let line = field(out, "FAILED AT ")
                .unwrap_or_else(|| panic!("{name}: rank {rank} did not fail: {out}"));
            let (at, rest) = line.split_once(" AFTER ").expect("AFTER");
            let (ms, error) = rest.split_once(" ms: ").expect("ms");
            let at: u128 = at.parse().expect("a time");
            let survivor = Survivor {
                rank,
                after_death: Duration::from_nanos(at.saturating_sub(died) as u64),
                waited: Duration::from_millis(ms.parse().expect("ms")),
                error: error.to_owned(),
                later: field(out, "LATER: ").unwrap_or_default(),
            };
            eprintln!(
                "MEASURED {name}: rank {rank} failed {:.0} ms after rank {victim} {how}: {}",
                survivor.after_death.as_secs_f64() * 1e3,
                survivor.error
            );
            survivor
        })
        .collect()
}

/// Whether `error` names `rank`, alone (`rank 2`) or in a list (`ranks 1, 2, 3`).
fn names(error: &str, rank: usize) -> bool {
    error.contains(&format!("rank {rank}"))
        || error.split("ranks ").skip(1).any(|list| {
            list.split(" are ")
                .next()
                .is_some_and(|l| l.split(", ").any(|r| r == rank.to_string()))
        })
}

/// Checks that every survivor of a killed `victim` failed within a second of its death, in
/// its second all_sum (#1), naming the victim, and that the group then stayed failed.
fn check_killed(name: &str, victim: usize, survivors: &[Survivor]) {
    for s in survivors {
        assert!(
            s.after_death < Duration::from_secs(1),
            "{name}: rank {} failed {:?} after rank {victim} died: {}",
            s.rank,
            s.after_death,
            s.error
        );
        assert!(
            s.error.contains("all_sum #1"),
            "{name}: rank {} does not name the operation: {}",
            s.rank,
            s.error
        );
        assert!(
            names(&s.error, victim),
            "{name}: rank {} does not name rank {victim}: {}",
            s.rank,
            s.error
        );
        assert!(
            s.later.contains("failed earlier"),
            "{name}: rank {}'s next all_sum: {}",
            s.rank,
            s.later
        );
    }
}

#[test]
fn a_killed_rank_makes_every_survivor_fail_within_a_second_over_tcp() {
    for (name, ranks, ring, victim) in [
        ("tcp-mesh-3-kill-2", 3, false, 2),
        ("tcp-mesh-4-kill-0", 4, false, 0),
        ("tcp-ring-4-kill-2", 4, true, 2),
    ] {
        let survivors = job(name, ranks, ring, victim, "kill", Over::Tcp, &[]);
        check_killed(name, victim, &survivors);
    }
}

/// Checks that every survivor of a stopped victim failed only at (about) its deadline `by`.
fn check_stopped(name: &str, by: Duration, survivors: &[Survivor]) {
    for s in survivors {
        assert!(
            s.waited >= by.mul_f64(0.9) && s.waited < by + Duration::from_secs(3),
            "{name}: rank {} failed after {:?}, not at its deadline of {by:?}: {}",
            s.rank,
            s.waited,
            s.error
        );
    }
}

#[test]
fn a_stopped_rank_is_failed_at_the_deadline_not_as_a_dead_one() {
    let survivors = job(
        "tcp-mesh-3-stop-1",
        3,
        false,
        1,
        "stop",
        Over::Tcp,
        &[("NUVEC_DISTRIBUTED_TIMEOUT", "3")],
    );
    check_stopped("tcp-mesh-3-stop-1", Duration::from_secs(3), &survivors);
}

#[test]
fn the_progress_timeout_fails_a_silent_wait_before_the_deadline() {
    let survivors = job(
        "tcp-ring-3-stop-2-progress",
        3,
        true,
        2,
        "stop",
        Over::Tcp,
        &[("MLX_JACCL_PROGRESS_TIMEOUT_S", "1")],
    );
    for s in &survivors {
        assert!(
            s.waited >= Duration::from_millis(900) && s.waited < Duration::from_secs(5),
            "rank {} failed after {:?}: {}",
            s.rank,
            s.waited,
            s.error
        );
    }
    // The first to give up says why; the others may learn it from the side channel.
    assert!(
        survivors.iter().any(|s| s.error.contains("no progress")),
        "{survivors:?}"
    );
}

#[cfg(feature = "jaccl")]
mod over_rdma {
    use super::*;

    #[test]
    fn a_killed_rank_makes_every_survivor_fail_within_a_second_over_the_provider() {
        for (name, ranks, ring, victim) in [
            ("rdma-mesh-3-kill-2", 3, false, 2),
            ("rdma-mesh-3-kill-0", 3, false, 0),
            ("rdma-ring-4-kill-2", 4, true, 2),
        ] {
            let survivors = job(name, ranks, ring, victim, "kill", Over::Rdma, &[]);
            check_killed(name, victim, &survivors);
        }
    }

    #[test]
    fn a_stopped_rank_over_the_provider_is_failed_at_the_deadline() {
        let survivors = job(
            "rdma-mesh-3-stop-2",
            3,
            false,
            2,
            "stop",
            Over::Rdma,
            &[("NUVEC_DISTRIBUTED_TIMEOUT", "3")],
        );
        check_stopped("rdma-mesh-3-stop-2", Duration::from_secs(3), &survivors);
    }
}
