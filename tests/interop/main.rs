//! Interop with real MLX: mixed rings of Python MLX ranks and Rust ranks give, on every rank,
//! bitwise the results of an MLX-only ring, for every collective, dtype and size branch; and
//! `Group::split` in a ring with a Python MLX rank ([`split_mixed`]).
//!
//! Needs the venv made by `.ci/setup-venv` (`mlx[cpu]==0.32.4`); without it the tests print
//! why and pass, except under CI (`CI=true`), where a missing venv fails them.

#[path = "../common/mod.rs"]
mod common;
mod split_mixed;

use common::{pattern, ports, procs};

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use nuvec_core::DType;
use nuvec_distributed::reduce::Reduction;
use nuvec_distributed::{Options, Wire, WireChoice, connect_ring, hostfile};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const RANK_TEST: &str = concat!(module_path!(), "::a_rust_rank_runs_the_plan_it_is_given");
const PLAN_VAR: &str = "NUVEC_INTEROP_PLAN";
const OUT_VAR: &str = "NUVEC_INTEROP_OUT";
/// Set for the Rust ranks of a job with a Python MLX rank: the wire they must agree on.
const WIRE_VAR: &str = "NUVEC_INTEROP_WIRE";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn dtype(name: &str) -> DType {
    match name {
        "bool" => DType::Bool,
        "uint8" => DType::U8,
        "uint16" => DType::U16,
        "uint32" => DType::U32,
        "uint64" => DType::U64,
        "int8" => DType::I8,
        "int16" => DType::I16,
        "int32" => DType::I32,
        "int64" => DType::I64,
        "float16" => DType::F16,
        "bfloat16" => DType::BF16,
        "float32" => DType::F32,
        "float64" => DType::F64,
        "complex64" => DType::Complex64,
        other => panic!("unknown dtype {other}"),
    }
}

fn encode(data: &[u8]) -> String {
    if data.len() > 4096 {
        let digest = Sha256::digest(data);
        let mut s = String::from("sha256:");
        for b in digest {
            let _ = write!(s, "{b:02x}");
        }
        s
    } else {
        data.iter().fold(String::new(), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
    }
}

/// The Rust side of `tests/interop/mlx_rank.py`: runs a plan through this crate's ring with
/// raw bytes and writes the same lines.
#[test]
fn a_rust_rank_runs_the_plan_it_is_given() {
    if !procs::is_child(RANK_TEST) {
        return;
    }
    let plan: Value = serde_json::from_str(
        &std::fs::read_to_string(std::env::var(PLAN_VAR).expect("plan path")).expect("plan"),
    )
    .expect("plan json");
    let hostfile_path = std::env::var("MLX_HOSTFILE").expect("MLX_HOSTFILE");
    let rank: usize = std::env::var("MLX_RANK")
        .expect("MLX_RANK")
        .parse()
        .expect("rank");
    let nodes = hostfile::read(Path::new(&hostfile_path)).expect("hostfile");
    let mut options = Options::default().timeout(Duration::from_secs(60));
    if std::env::var("NUVEC_DISTRIBUTED_WIRE").as_deref() == Ok("mlx") {
        // As `init` would read it: a job of Rust ranks alone that must give MLX's bits.
        options = options.wire(WireChoice::Mlx);
    }
    let group = connect_ring(&nodes, rank, &options).expect("connect");
    let comm = group.communicator().expect("a ring of more than one rank");
    if std::env::var(WIRE_VAR).as_deref() == Ok("mlx") {
        // A job with a Python MLX rank: its probes were refused, so MLX's wire.
        assert_eq!(
            comm.wire(),
            Wire::Mlx,
            "rank {rank} of a job with an MLX rank"
        );
    }
    let size = group.size();
    let out_path = std::env::var(OUT_VAR)
        .expect("out path")
        .replace("{rank}", &rank.to_string());
    let mut out = String::new();
    for (index, op) in plan["ops"].as_array().expect("ops").iter().enumerate() {
        let kind = op["op"].as_str().expect("op");
        let name = op["dtype"].as_str().expect("dtype");
        let n = op["n"].as_u64().expect("n") as usize;
        let seed = op["seed"].as_u64().expect("seed");
        let input = pattern::pattern(name, seed, rank, n);
        let result = match kind {
            "all_sum" | "all_max" | "all_min" => {
                let reduction = match kind {
                    "all_sum" => Reduction::Sum,
                    "all_max" => Reduction::Max,
                    _ => Reduction::Min,
                };
                let mut data = input;
                comm.try_all_reduce(reduction, dtype(name), &mut data)
                    .unwrap_or_else(|e| panic!("op {index}: {e}"));
                data
            }
            "all_gather" => {
                let mut output = vec![0u8; input.len() * size];
                comm.try_all_gather(&input, &mut output)
                    .unwrap_or_else(|e| panic!("op {index}: {e}"));
                output
            }
            "send" | "recv" => {
                let ranks: Vec<usize> = op["ranks"]
                    .as_array()
                    .expect("ranks")
                    .iter()
                    .map(|r| r.as_u64().expect("rank") as usize)
                    .collect();
                if !ranks.contains(&rank) {
                    continue;
                }
                let peer = op["peer"].as_u64().expect("peer") as usize;
                if kind == "send" {
                    comm.try_send(peer, &input)
                        .unwrap_or_else(|e| panic!("op {index}: {e}"));
                    input
                } else {
                    let mut data = vec![0u8; input.len()];
                    comm.try_recv(peer, &mut data)
                        .unwrap_or_else(|e| panic!("op {index}: {e}"));
                    data
                }
            }
            other => panic!("unknown op {other}"),
        };
        let _ = writeln!(out, "{index} {kind} {name} {}", encode(&result));
    }
    std::fs::write(&out_path, out).expect("write results");
}

/// Which ranks of a job are Python MLX.
fn mixes(ranks: usize) -> Vec<Vec<bool>> {
    match ranks {
        2 => vec![vec![true, false], vec![false, true]],
        3 => vec![vec![false, true, false], vec![true, true, false]],
        _ => vec![
            vec![true, false, false, true],
            vec![false, true, false, true],
        ],
    }
}

/// Runs one job: `python[r]` says whether rank r is MLX. Returns each rank's result lines.
fn run_job(
    python: &Path,
    dir: &Path,
    plan: &Path,
    conns: usize,
    mlx: &[bool],
) -> Vec<BTreeMap<usize, String>> {
    let ranks = mlx.len();
    let nodes = ports::free_nodes(ranks, conns);
    let hostfile = procs::write_hostfile(dir, &nodes);
    let commands = (0..ranks)
        .map(|r| {
            let out = dir.join(format!("rank{r}.txt"));
            let mut cmd = if mlx[r] {
                let mut c = Command::new(python);
                c.arg(repo().join("tests/interop/mlx_rank.py"))
                    .arg(plan)
                    .arg(&out);
                c
            } else {
                let mut c = procs::this_test(RANK_TEST);
                c.env(PLAN_VAR, plan).env(OUT_VAR, &out);
                if mlx.contains(&true) {
                    c.env(WIRE_VAR, "mlx");
                }
                c
            };
            cmd.env("MLX_HOSTFILE", &hostfile)
                .env("MLX_RANK", r.to_string());
            cmd
        })
        .collect();
    let finished = procs::run_all(dir, commands, Duration::from_secs(240));
    procs::assert_all_ok(&format!("job {mlx:?} with {conns} connections"), &finished);
    (0..ranks)
        .map(|r| {
            std::fs::read_to_string(dir.join(format!("rank{r}.txt")))
                .expect("rank results")
                .lines()
                .map(|line| {
                    let (index, rest) = line.split_once(' ').expect("a result line");
                    (index.parse().expect("index"), rest.to_string())
                })
                .collect()
        })
        .collect()
}

/// Element counts covering every branch of MLX's ring for `ranks` ranks, `conns`
/// connections, and elements of `size` bytes: E < R, E = R, empty tail segments,
/// non-divisible, both sides of R·256 KiB and of 2C·R·256 KiB, and more than 8 MiB.
fn sizes(ranks: usize, conns: usize, size: usize, big: bool) -> Vec<usize> {
    let mut v = vec![0, 1, ranks, ranks * 5 + 1, 1000];
    if ranks > 2 {
        v.push((ranks - 1) * 3); // ⌈E/R⌉ = 3 leaves the last segment empty
    }
    if big {
        let t1 = ranks * 262_144 / size;
        let t2 = 2 * conns * t1;
        v.extend([t1 - 1, t1, 2 * t1, t2 - 1, t2 + 1, (9 << 20) / size + 3]);
    }
    v
}

fn plan_for(ranks: usize, conns: usize) -> Value {
    let mut ops = Vec::new();
    let mut seed = 1u64;
    for name in pattern::DTYPES {
        let size = pattern::dtype_size(name).expect("dtype");
        let big = matches!(name, "float32" | "bfloat16" | "uint8" | "complex64");
        for n in sizes(ranks, conns, size, big) {
            for op in ["all_sum", "all_max", "all_min", "all_gather"] {
                if op == "all_gather" && n > (3 << 20) / size {
                    continue;
                }
                seed += 1;
                // Floats get NaN, ±inf and −0.0 in every other plan entry.
                let special = if name.starts_with("float") || name == "complex64" {
                    (seed % 2) << 63
                } else {
                    0
                };
                ops.push(json!({"op": op, "dtype": name, "n": n, "seed": seed | special}));
            }
        }
    }
    // Neighbour send/recv of raw bytes, both ways, below and above 1024 bytes.
    for n in [3usize, 700, 5000, 300_001] {
        for r in 0..ranks {
            let right = (r + 1) % ranks;
            seed += 1;
            ops.push(json!({"op": "send", "dtype": "uint8", "n": n, "seed": seed, "peer": right, "ranks": [r]}));
            ops.push(json!({"op": "recv", "dtype": "uint8", "n": n, "seed": seed, "peer": r, "ranks": [right]}));
        }
        // And leftward, with the receive issued by the right neighbour first in program order.
        seed += 1;
        ops.push(json!({"op": "send", "dtype": "float32", "n": n, "seed": seed, "peer": 0, "ranks": [1]}));
        ops.push(json!({"op": "recv", "dtype": "float32", "n": n, "seed": seed, "peer": 1, "ranks": [0]}));
    }
    json!({ "ops": ops })
}

fn mixed_rings_match_mlx(ranks: usize) {
    let Some(python) = common::venv::python("the interop test") else {
        return;
    };
    let _one_job_at_a_time = procs::exclusive();
    for conns in [1, 2] {
        let dir = procs::scratch(&format!("interop-r{ranks}-c{conns}"));
        let plan = dir.join("plan.json");
        let value = plan_for(ranks, conns);
        let count = value["ops"].as_array().map_or(0, Vec::len);
        std::fs::write(&plan, value.to_string()).expect("write plan");
        let reference = run_job(&python, &dir, &plan, conns, &vec![true; ranks]);
        for mlx in mixes(ranks) {
            let got = run_job(&python, &dir, &plan, conns, &mlx);
            for r in 0..ranks {
                for (index, want) in &reference[r] {
                    assert_eq!(
                        got[r].get(index),
                        Some(want),
                        "R={ranks} C={conns} mix {mlx:?}: rank {r} op {index} differs from MLX alone ({})",
                        value["ops"][*index]
                    );
                }
                assert_eq!(got[r].len(), reference[r].len());
            }
        }
        eprintln!("R={ranks} C={conns}: {count} ops bitwise equal to MLX alone in every mix");
    }
}

#[test]
fn mixed_rings_of_two_match_mlx_bit_for_bit() {
    if procs::is_child(RANK_TEST) {
        return;
    }
    mixed_rings_match_mlx(2);
}

#[test]
fn mixed_rings_of_three_match_mlx_bit_for_bit() {
    if procs::is_child(RANK_TEST) {
        return;
    }
    mixed_rings_match_mlx(3);
}

#[test]
fn mixed_rings_of_four_match_mlx_bit_for_bit() {
    if procs::is_child(RANK_TEST) {
        return;
    }
    mixed_rings_match_mlx(4);
}

#[test]
fn a_rust_program_runs_under_mlx_launch_with_four_ranks() {
    if procs::is_child(RANK_TEST) {
        return;
    }
    let Some(python) = common::venv::python("the interop test") else {
        return;
    };
    let _one_job_at_a_time = procs::exclusive();
    let launcher = python.with_file_name("mlx.launch");
    let dir = procs::scratch("mlx-launch");
    let plan = dir.join("plan.json");
    let value = plan_for(4, 1);
    std::fs::write(&plan, value.to_string()).expect("write plan");
    let reference = run_job(&python, &dir, &plan, 1, &[true; 4]);
    let mut launch = Command::new(&launcher);
    // Every rank is Rust, so by default they would agree on the nuvec wire, whose small
    // all-reduces fold in rank order (the same bits on every rank, not MLX's order): MLX's
    // bits are MLX's wire's.
    launch
        .args(["-n", "4", "--backend", "ring", "--"])
        .args(procs::this_test_argv(RANK_TEST))
        .env("NUVEC_DISTRIBUTED_WIRE", "mlx")
        .env(procs::CHILD, RANK_TEST)
        .env(PLAN_VAR, &plan)
        .env(OUT_VAR, dir.join("launched{rank}.txt"));
    let finished = procs::run_all(&dir, vec![launch], Duration::from_secs(300));
    procs::assert_all_ok("mlx.launch", &finished);
    // mlx.launch exits 0 even when a rank fails; it says so with [WARN] lines.
    assert!(
        !finished[0].output.contains("[WARN]"),
        "a rank failed under mlx.launch:\n{}",
        finished[0].output
    );
    for (r, want) in reference.iter().enumerate() {
        let got = std::fs::read_to_string(dir.join(format!("launched{r}.txt"))).expect("results");
        let got: BTreeMap<usize, String> = got
            .lines()
            .map(|l| {
                let (i, rest) = l.split_once(' ').expect("a result line");
                (i.parse().expect("index"), rest.to_string())
            })
            .collect();
        assert_eq!(
            &got, want,
            "rank {r} under mlx.launch differs from MLX alone"
        );
    }
}
