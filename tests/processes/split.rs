//! `Group::split` across processes: a 4-rank job split 2 × 2 by rows and by columns, with
//! training-style all_sums on both kinds of group and on the parent in the same program order,
//! over the ring on TCP (one and two connections per neighbour, with and without a key) and
//! JACCL's mesh over TCP and, with the feature `jaccl`, over the RDMA fabric driving the
//! software RDMA provider; and JACCL's ring over both, split along its cables (pairs of
//! neighbours, the ring reversed) and refusing a split across a missing cable; each rank initialised by `nuvec_distributed::init` from
//! the environment a launcher writes.

#[cfg(feature = "jaccl")]
use crate::common::emu;
use crate::common::group::sum;
use crate::common::ports;
use crate::common::procs;

use std::time::Duration;

use nuvec_core::distributed::Group;

const CHILD_TEST: &str = concat!(module_path!(), "::a_split_rank_runs_its_scenario");
/// `pairs`: the ring scenario ([`pairs`]); otherwise the grid ([`grid`]).
const SCENARIO: &str = "NUVEC_TEST_SPLIT";

/// What rank `r` contributes at `step`, element `i`.
fn value(r: usize, step: usize, i: usize) -> f32 {
    ((r * 13 + step * 5 + i) % 31) as f32
}

/// The rank's program: split into rows and columns, then steps that sum over the rows (as a
/// tensor-parallel forward), over the columns (as a data-parallel gradient average) and over
/// the parent, each result checked; `OK` at the end.
fn grid(parent: &Group) {
    let r = parent.rank();
    assert_eq!(parent.size(), 4);
    let rows = parent.split((r / 2) as i32, -1).expect("rows");
    let columns = parent.split((r % 2) as i32, -1).expect("columns");
    let row = [(r / 2) * 2, (r / 2) * 2 + 1];
    let column = [r % 2, r % 2 + 2];
    for step in 0..20 {
        let n = 1 + (step * 997) % 5000;
        let mine: Vec<f32> = (0..n).map(|i| value(r, step, i)).collect();
        let expect = |members: &[usize]| -> Vec<f32> {
            (0..n)
                .map(|i| members.iter().map(|&q| value(q, step, i)).sum())
                .collect()
        };
        assert_eq!(sum(&rows, &mine), expect(&row), "rank {r} step {step} rows");
        assert_eq!(
            sum(&columns, &mine),
            expect(&column),
            "rank {r} step {step} columns"
        );
        if step % 4 == 0 {
            assert_eq!(
                sum(parent, &mine),
                expect(&[0, 1, 2, 3]),
                "rank {r} step {step}"
            );
        }
    }
    println!("OK rank {r}");
}

/// A JACCL ring's program: pairs of neighbours sum interleaved with the parent; a split into
/// non-neighbours fails naming the missing cable, and the parent goes on; the ring reversed
/// by key sums.
fn pairs(parent: &Group) {
    let r = parent.rank();
    let pair = parent.split((r / 2) as i32, -1).expect("pairs");
    let members = [(r / 2) * 2, (r / 2) * 2 + 1];
    for step in 0..10 {
        let n = 1 + (step * 1231) % 7000;
        let mine: Vec<f32> = (0..n).map(|i| value(r, step, i)).collect();
        let expect = |members: &[usize]| -> Vec<f32> {
            (0..n)
                .map(|i| members.iter().map(|&q| value(q, step, i)).sum())
                .collect()
        };
        assert_eq!(sum(&pair, &mine), expect(&members), "rank {r} step {step}");
        assert_eq!(
            sum(parent, &mine),
            expect(&[0, 1, 2, 3]),
            "rank {r} step {step}"
        );
    }
    let err = parent
        .split((r % 2) as i32, -1)
        .expect_err("no cable between ranks two apart")
        .to_string();
    let cable = if r.is_multiple_of(2) {
        "job ranks 0 and 2"
    } else {
        "job ranks 1 and 3"
    };
    assert!(err.contains(cable), "rank {r}: {err}");
    assert_eq!(
        sum(parent, &[1.0]),
        vec![4.0],
        "rank {r}: the parent goes on"
    );
    // The whole ring the other way round is a ring of cables too.
    let reversed = parent.split(0, (3 - r) as i32).expect("reversed");
    assert_eq!(reversed.rank(), 3 - r);
    let many: Vec<f32> = (0..5000).map(|i| value(r, 99, i)).collect();
    let all: Vec<f32> = (0..5000)
        .map(|i| (0..4).map(|q| value(q, 99, i)).sum())
        .collect();
    assert_eq!(sum(&reversed, &many), all, "rank {r}: reversed");
    println!("OK rank {r}");
}

#[test]
fn a_split_rank_runs_its_scenario() {
    if !procs::is_child(CHILD_TEST) {
        return;
    }
    let group = nuvec_distributed::init(true).unwrap_or_else(|e| {
        println!("INIT FAILED {e}");
        std::process::exit(3)
    });
    match std::env::var(SCENARIO).as_deref() {
        Ok("pairs") => pairs(&group),
        _ => grid(&group),
    }
}

/// Runs a 4-rank job of this test binary, rank r with `env(r)` and `setup` applied to its
/// command, and checks every rank said OK.
fn job(name: &str, env: &dyn Fn(usize) -> Vec<(&'static str, String)>) {
    job_with(name, env, &|_| {});
}

fn job_with(
    name: &str,
    env: &dyn Fn(usize) -> Vec<(&'static str, String)>,
    setup: &dyn Fn(&mut std::process::Command),
) {
    let _one_job_at_a_time = procs::exclusive();
    let dir = procs::scratch(name);
    let commands = (0..4)
        .map(|rank| {
            let mut cmd = procs::this_test(CHILD_TEST);
            cmd.env("MLX_RANK", rank.to_string())
                .env("NUVEC_DISTRIBUTED_TIMEOUT", "20")
                .env_remove("MLX_HOSTFILE")
                .env_remove("NUVEC_DISTRIBUTED_KEY");
            for (key, value) in env(rank) {
                cmd.env(key, value);
            }
            setup(&mut cmd);
            cmd
        })
        .collect();
    let began = std::time::Instant::now();
    let finished = procs::run_all(&dir, commands, Duration::from_secs(120));
    eprintln!("{name}: 4 ranks in {:?}", began.elapsed());
    for (r, f) in finished.iter().enumerate() {
        assert!(
            f.code == Some(0) && f.output.contains(&format!("OK rank {r}")),
            "{name}: rank {r} ({:?}):\n{}",
            f.code,
            f.output
        );
    }
}

fn ring_job(name: &str, conns: usize, key: Option<&str>) {
    let dir = procs::scratch(&format!("{name}-hostfile"));
    let hostfile = procs::write_hostfile(&dir, &ports::free_nodes(4, conns));
    let hostfile = hostfile.display().to_string();
    let key = key.map(str::to_owned);
    job(name, &|_| {
        let mut env = vec![("MLX_HOSTFILE", hostfile.clone())];
        if let Some(key) = &key {
            env.push(("NUVEC_DISTRIBUTED_KEY", key.clone()));
        }
        env
    });
}

/// A JACCL device file of 4 ranks: one device per pair (a mesh, and a ring too).
fn devices() -> String {
    let rows: Vec<Vec<Option<String>>> = (0..4)
        .map(|i| {
            (0..4)
                .map(|j| (i != j).then(|| format!("rdma_en{}", i.min(j) * 10 + i.max(j))))
                .collect()
        })
        .collect();
    serde_json::to_string(&rows).expect("json")
}

fn jaccl_job(name: &str, ring: bool) {
    jaccl_job_with(name, ring, &|_, _| {});
}

/// A JACCL job of 4 ranks over TCP (`setup` may switch a rank's command to another fabric,
/// given the device file's text and the job's scratch directory).
fn jaccl_job_with(
    name: &str,
    ring: bool,
    setup: &dyn Fn(&mut std::process::Command, (&str, &std::path::Path)),
) {
    let dir = procs::scratch(&format!("{name}-devices"));
    let path = dir.join("devices.json");
    let text = devices();
    std::fs::write(&path, &text).expect("write the device file");
    let path = path.display().to_string();
    let coordinator = ports::free_nodes(1, 1)[0][0].clone();
    // The provider's ledger is written when a device closes; groups made by `init` stay
    // open until the process exits, so it is not looked at here.
    let ledger = dir.join("ledger");
    job_with(
        name,
        &|_| {
            let mut env = vec![
                ("MLX_IBV_DEVICES", path.clone()),
                ("MLX_JACCL_COORDINATOR", coordinator.clone()),
                ("NUVEC_JACCL_FABRIC", "tcp".to_owned()),
            ];
            if ring {
                env.push(("MLX_JACCL_RING", "1".to_owned()));
                env.push((SCENARIO, "pairs".to_owned()));
            }
            env
        },
        &|cmd| setup(cmd, (&text, &ledger)),
    );
}

#[test]
fn rows_and_columns_of_a_ring_over_tcp_sum_at_once_in_one_program_order() {
    ring_job("split-ring-1", 1, None);
    ring_job("split-ring-2", 2, None);
}

#[test]
fn rows_and_columns_of_an_authenticated_ring_sum_at_once() {
    ring_job("split-ring-key", 1, Some("sixteen bytes or more of secret"));
}

#[test]
fn rows_and_columns_of_a_jaccl_mesh_over_tcp_sum_at_once_in_one_program_order() {
    jaccl_job("split-jaccl-mesh", false);
}

#[cfg(feature = "jaccl")]
#[test]
fn rows_and_columns_of_a_jaccl_mesh_over_rdma_sum_at_once_in_one_program_order() {
    jaccl_job_with("split-jaccl-rdma", false, &|cmd, (devices, ledger)| {
        emu::configure(cmd, devices, ledger);
    });
}

#[test]
fn a_jaccl_ring_over_tcp_splits_along_its_cables_and_names_a_missing_one() {
    jaccl_job("split-jaccl-ring", true);
}

#[cfg(feature = "jaccl")]
#[test]
fn a_jaccl_ring_over_rdma_splits_along_its_cables_and_names_a_missing_one() {
    jaccl_job_with("split-jaccl-ring-rdma", true, &|cmd, (devices, ledger)| {
        emu::configure(cmd, devices, ledger);
    });
}
