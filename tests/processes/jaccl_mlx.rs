//! JACCL checked against MLX 0.32.4's own algorithm code (feature `jaccl`): mixed jobs of
//! ranks built from MLX's JACCL headers (`jaccl_mlx/*.cpp`, compiled here with g++ against
//! rdma-core's `verbs.h` and the wheel's headers, unchanged) and Rust ranks of this crate,
//! over the software RDMA provider, started by `nuvec-launch --backend jaccl`.
//!
//! For every shape (meshes of 2–4 ranks over 1 and 2 wires, rings of 2–4 ranks over 1 and 2
//! wires; both frame rules across the matrix), a job whose ranks all run MLX's code is the
//! reference, and a job of the same shape with some ranks running this crate's code must give
//! every rank the reference's bits and put the same messages (sizes, order, count) on every
//! queue pair, as the provider's message log (`NUVEC_VERBS_EMU_TRACE`) records them. The
//! differences allowed are the documented ones ([`compare`]): MLX reduces the peers' shards
//! of a mesh sum-scatter (and of the large mesh all-reduce) in the order they complete, so for
//! float dtypes each element of a shard must be one of the folds MLX can produce (the owner's
//! shard first, then the peers' in some order), whoever computed it; and a float sum that
//! added two NaNs may return either. MLX's code is given 0/1 booleans only ([`plan`]).
//!
//! `jaccl_mlx/*.cpp` supplies what the wheel declares but does not ship (see each file's
//! header); [`build`] compiles it once per test run.
//!
//! Without g++ or the MLX venv's headers the tests say why and pass, except under `CI=true`,
//! where they fail.
#![cfg(feature = "jaccl")]

mod build;
mod compare;
mod plan;

use crate::common::jaccl_wires::sends_first;
use crate::common::{emu, launcher, run};
use compare::Ran;
use plan::{Op, Plan, Shape, fnv1a};

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use nuvec_distributed::fabric::Fabric;
use nuvec_distributed::jaccl::{self, Config, FrameRule, JacclCommunicator, SideChannel};
use nuvec_distributed::reduce::Reduction;

const CHILD_TEST: &str = concat!(module_path!(), "::a_rust_rank_runs_the_plan_it_is_given");
/// The plan file both kinds of rank read (inputs beside it).
const PLAN_VAR: &str = "NUVEC_JACCL_MLX_PLAN";
/// The directory both kinds of rank write their results to.
const OUT_VAR: &str = "NUVEC_JACCL_MLX_OUT";

/// The Rust side of `jaccl_mlx/main.cpp`: joins the job from the launch environment over
/// the RDMA fabric, runs the plan with this crate's JACCL and writes the same files and lines.
#[test]
fn a_rust_rank_runs_the_plan_it_is_given() {
    if !crate::common::procs::is_child(CHILD_TEST) {
        return;
    }
    let timeout = Duration::from_secs(60);
    let config = Config::from_env()
        .expect("the JACCL environment")
        .expect("a JACCL job");
    let (rank, size) = (config.rank(), config.size());
    let rule = match std::env::var("NUVEC_JACCL_FRAMES").as_deref() {
        Ok("large") => FrameRule::Large,
        _ => FrameRule::Small,
    };
    let coordinator = config
        .coordinator_address()
        .expect("a coordinator")
        .to_owned();
    let mut side = SideChannel::connect(&coordinator, rank, size, timeout).expect("side channel");
    let fabric: Box<dyn Fabric + Send> =
        Box::new(jaccl::rdma::connect(&config, &mut side, timeout).expect("the RDMA fabric"));
    let comm = match config.topology().expect("a topology") {
        jaccl::Topology::Mesh { .. } => {
            println!("TOPOLOGY mesh");
            JacclCommunicator::mesh(fabric, rule, timeout)
        }
        jaccl::Topology::Ring { wires } => {
            println!("TOPOLOGY ring");
            JacclCommunicator::ring(fabric, wires, rule, timeout)
        }
    };
    let plan_path = PathBuf::from(std::env::var(PLAN_VAR).expect("the plan"));
    let dir = plan_path.parent().expect("the plan's directory").to_owned();
    let out = PathBuf::from(std::env::var(OUT_VAR).expect("the output directory"));
    let plan = std::fs::read_to_string(&plan_path).expect("read the plan");
    for (i, line) in plan.lines().enumerate() {
        let mine = std::fs::read(dir.join(format!("in-{i}-{rank}.bin"))).expect("an input");
        let got = match Op::parse(line, mine.len(), size) {
            Op::Reduce { op, dtype, .. } => {
                let mut data = mine.clone();
                comm.try_all_reduce(op, dtype, &mut data).map(|()| data)
            }
            Op::Scatter { dtype, n } => {
                let mut result = vec![0u8; n * dtype.size()];
                comm.try_sum_scatter(Reduction::Sum, dtype, &mine, &mut result)
                    .map(|()| result)
            }
            Op::Gather { n } => {
                let mut result = vec![0u8; n * size];
                comm.try_all_gather(&mine, &mut result).map(|()| result)
            }
            Op::SendRecv { shift, n } => {
                let mut result = vec![0u8; n];
                let (dst, src) = ((rank + shift) % size, (rank + size - shift) % size);
                if sends_first(rank, size, shift) {
                    comm.try_send(dst, &mine)
                        .and_then(|()| comm.try_recv(src, &mut result))
                } else {
                    comm.try_recv(src, &mut result)
                        .and_then(|()| comm.try_send(dst, &mine))
                }
                .map(|()| result)
            }
        }
        .unwrap_or_else(|e| panic!("rank {rank} op {i} ({line}): {e}"));
        std::fs::write(out.join(format!("out-{i}-{rank}.bin")), &got).expect("write a result");
        println!("DIGEST {i} {:016x}", fnv1a(&got));
    }
    println!("PLAN DONE");
}

/// Runs `plan` as a job of `shape` started by `nuvec-launch`, the ranks in `mlx` running
/// MLX's code and the others this crate's.
fn run_job(shape: &Shape, plan: &Plan, harness: &[PathBuf; 2], mlx: &[usize], name: &str) -> Ran {
    let _one_job_at_a_time = crate::common::procs::exclusive();
    let out = plan.dir.join(name);
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).expect("create the job's directory");
    let devices = shape.device_file();
    let rows: Vec<serde_json::Value> = serde_json::from_str::<Vec<serde_json::Value>>(&devices)
        .expect("the device file")
        .into_iter()
        .map(|row| serde_json::json!({"ssh": "127.0.0.1", "ips": ["127.0.0.1"], "rdma": row}))
        .collect();
    let backend = if shape.ring { "jaccl-ring" } else { "jaccl" };
    let hostfile = out.join("hosts.json");
    std::fs::write(
        &hostfile,
        serde_json::json!({"backend": backend, "hosts": rows}).to_string(),
    )
    .expect("write the host file");
    let trace = out.join("trace.txt");
    let ledger = out.join("ledger.txt");
    let rust = crate::common::procs::this_test_argv(CHILD_TEST);
    let quoted = |s: &str| format!("'{}'", s.replace('\'', r"'\''"));
    let mlx_ranks: Vec<String> = mlx.iter().map(usize::to_string).collect();
    let harness = &harness[usize::from(shape.large)];
    let script = format!(
        "#!/bin/sh\n\
         # Rank MLX_RANK runs MLX's code when listed, else this crate's.\n\
         case ',{},' in *,\"$MLX_RANK\",*) exec {} ;; esac\n\
         exec {}\n",
        mlx_ranks.join(","),
        quoted(&harness.display().to_string()),
        rust.iter().map(|a| quoted(a)).collect::<Vec<_>>().join(" ")
    );
    let script_path = out.join("rank.sh");
    std::fs::write(&script_path, script).expect("write the rank script");
    let port = crate::common::ports::consecutive(1).to_string();
    let envs = [
        format!("{PLAN_VAR}={}", plan.dir.join("plan.txt").display()),
        format!("{OUT_VAR}={}", out.display()),
        format!("{}={CHILD_TEST}", crate::common::procs::CHILD),
        "NUVEC_JACCL_FABRIC=rdma".to_owned(),
        format!(
            "NUVEC_JACCL_FRAMES={}",
            if shape.large { "large" } else { "small" }
        ),
        format!("NUVEC_JACCL_VERBS={}", emu::library().display()),
        format!("NUVEC_VERBS_EMU_DEVICES={}", emu::device_names(&devices)),
        format!("NUVEC_VERBS_EMU_TRACE={}", trace.display()),
        format!("NUVEC_VERBS_EMU_LEDGER={}", ledger.display()),
    ];
    let mut cmd = Command::new(launcher::nuvec_launch());
    cmd.arg("--hostfile").arg(&hostfile).args(["-p", &port]);
    for e in &envs {
        cmd.args(["--env", e]);
    }
    cmd.arg("--")
        .arg("sh")
        .arg(&script_path)
        .env("TMPDIR", &out)
        .current_dir(&out);
    let began = Instant::now();
    let done = run::run(&mut cmd, Duration::from_secs(120));
    let elapsed = began.elapsed();
    let what = format!("{} ({name}, MLX's code on ranks {mlx:?})", shape.name());
    assert_eq!(done.code, Some(0), "{what}: {}", done.describe());
    let finished = run::tagged(&done.stdout, "PLAN");
    assert_eq!(finished.len(), shape.ranks, "{what}: {}", done.describe());
    let topology = if shape.ring { "ring" } else { "mesh" };
    for (rank, t) in run::tagged(&done.stdout, "TOPOLOGY") {
        assert_eq!(t, topology, "{what}: rank {rank}'s topology");
    }
    let digests: Vec<&str> = done
        .stdout
        .lines()
        .filter(|l| l.contains("] DIGEST "))
        .collect();
    let mut results = Vec::new();
    for i in 0..plan.ops.len() {
        let mut per_rank = Vec::new();
        for r in 0..shape.ranks {
            let bytes = std::fs::read(out.join(format!("out-{i}-{r}.bin")))
                .unwrap_or_else(|e| panic!("{what}: rank {r} op {i}: {e}"));
            let line = format!("[rank {r}] DIGEST {i} {:016x}", fnv1a(&bytes));
            assert!(
                digests.iter().any(|l| l.trim_end() == line),
                "{what}: no {line:?}"
            );
            per_rank.push(bytes);
        }
        results.push(per_rank);
    }
    assert_eq!(
        emu::leaks(&ledger),
        Vec::<String>::new(),
        "{what}: left registered"
    );
    let mut log: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for line in std::fs::read_to_string(&trace)
        .expect("the message log")
        .lines()
    {
        let (key, bytes) = line.rsplit_once(" bytes=").expect("a log line");
        log.entry(key.to_owned())
            .or_default()
            .push(bytes.parse().expect("a size"));
    }
    let _ = std::fs::remove_dir_all(&out);
    Ran {
        results,
        log,
        elapsed,
    }
}

/// Runs the all-MLX reference of `shape` and each mix of `mixes` (the ranks running MLX's
/// code), comparing every mix with the reference.
fn matrix_job(shape: Shape, mixes: &[&[usize]]) {
    let Some(harness) = build::harness() else {
        return;
    };
    let name = shape.name();
    let dir = crate::common::procs::scratch(&format!("jaccl-mlx-{name}"));
    let plan = Plan::write(&dir, &shape, shape.ops());
    let everyone: Vec<usize> = (0..shape.ranks).collect();
    let reference = run_job(&shape, &plan, harness, &everyone, "mlx");
    eprintln!(
        "{name}: {} operations, MLX's code on every rank: {:?}",
        plan.ops.len(),
        reference.elapsed
    );
    for mlx in mixes {
        let job = format!(
            "mixed-{}",
            mlx.iter().map(usize::to_string).collect::<String>()
        );
        let got = run_job(&shape, &plan, harness, mlx, &job);
        compare::compare(
            &shape,
            &plan,
            &reference,
            &got,
            &format!("{name} with MLX's code on ranks {mlx:?}"),
        );
        eprintln!("{name}: MLX's code on ranks {mlx:?}: {:?}", got.elapsed);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn mesh(ranks: usize, wires: usize, large: bool) -> Shape {
    Shape {
        ring: false,
        ranks,
        wires,
        large,
    }
}

fn ring(ranks: usize, wires: usize, large: bool) -> Shape {
    Shape {
        ring: true,
        ranks,
        wires,
        large,
    }
}

#[test]
fn mixed_meshes_of_two_ranks_give_mlx_codes_bits_and_messages() {
    matrix_job(mesh(2, 1, false), &[&[0], &[1]]);
    matrix_job(mesh(2, 2, true), &[&[1]]);
}

#[test]
fn mixed_meshes_of_three_and_four_ranks_give_mlx_codes_bits_and_messages() {
    matrix_job(mesh(3, 1, true), &[&[1]]);
    matrix_job(mesh(3, 2, false), &[&[0, 2]]);
    matrix_job(mesh(4, 1, false), &[&[0, 3]]);
    matrix_job(mesh(4, 2, true), &[&[1, 2]]);
}

#[test]
fn mixed_rings_of_two_to_four_ranks_give_mlx_codes_bits_and_messages() {
    matrix_job(ring(2, 1, true), &[&[0]]);
    matrix_job(ring(2, 2, false), &[&[1]]);
    matrix_job(ring(3, 1, false), &[&[2]]);
    matrix_job(ring(3, 2, true), &[&[0, 1]]);
    matrix_job(ring(4, 1, true), &[&[1, 3]]);
    matrix_job(ring(4, 2, false), &[&[0, 1]]);
}
