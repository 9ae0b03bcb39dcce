//! JACCL checked against MLX 0.32.4's own algorithm code (feature `jaccl`): mixed jobs of
//! ranks built from MLX's JACCL headers (`jaccl_mlx/*.cpp`, compiled here with g++ against
//! rdma-core's `verbs.h` and the wheel's headers, unchanged) and Rust ranks of this crate,
//! over the software RDMA provider, started by `nuvec-launch --backend jaccl`.
//!
//! For every shape (meshes of 2–4 ranks over 1 and 2 wires, rings of 2–4 ranks over 1 and 2
//! wires; both frame rules across the matrix), a job whose ranks all run MLX's code is the
//! reference, and a job of the same shape with some ranks running this crate's code must give
//! every rank the reference's bits and put the same messages (sizes, order, count) on every
//! queue pair, as the provider's message log (`NUVEC_VERBS_EMU_TRACE`) records them. The one
//! difference allowed is the documented one: MLX reduces the peers' shards of a mesh
//! sum-scatter (and of the large mesh all-reduce) in the order they complete, so for float
//! dtypes each element of a shard must be one of the folds MLX can produce (the owner's shard
//! first, then the peers' in some order), whoever computed it.
//!
//! Without g++ or the MLX venv's headers the tests say why and pass, except under `CI=true`,
//! where they fail.
#![cfg(feature = "jaccl")]

use crate::common::{emu, launcher, run, values, venv};
use crate::common::{jaccl_model, mlx_model::Lane};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use nuvec_core::DType;
use nuvec_distributed::fabric::Fabric;
use nuvec_distributed::jaccl::{self, Config, FrameRule, JacclCommunicator, SideChannel};
use nuvec_distributed::reduce::Reduction;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const CHILD_TEST: &str = concat!(module_path!(), "::a_rust_rank_runs_the_plan_it_is_given");
/// The plan file both kinds of rank read (inputs beside it).
const PLAN_VAR: &str = "NUVEC_JACCL_MLX_PLAN";
/// The directory both kinds of rank write their results to.
const OUT_VAR: &str = "NUVEC_JACCL_MLX_OUT";
/// The C++ sources, each supplying what the wheel declares but does not ship.
const SOURCES: [&str; 4] = ["side_channel.cpp", "rdma.cpp", "groups.cpp", "main.cpp"];

/// One operation of a plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    /// All-reduce of `n` elements.
    Reduce {
        op: Reduction,
        dtype: DType,
        n: usize,
    },
    /// All-gather of `n` bytes per rank.
    Gather { n: usize },
    /// Sum-scatter into shards of `n` elements.
    Scatter { dtype: DType, n: usize },
    /// Rank r sends `n` bytes to r + shift and receives from r − shift.
    SendRecv { shift: usize, n: usize },
}

/// MLX's `jaccl::Dtype` code of `dtype`.
fn code(dtype: DType) -> usize {
    match Lane::of(dtype) {
        Lane::Bool => 0,
        Lane::I8 => 1,
        Lane::I16 => 2,
        Lane::I32 => 3,
        Lane::I64 => 4,
        Lane::U8 => 5,
        Lane::U16 => 6,
        Lane::U32 => 7,
        Lane::U64 => 8,
        Lane::F16 => 9,
        Lane::Bf16 => 10,
        Lane::F32 => 11,
        Lane::F64 => 12,
        Lane::C64 => 13,
    }
}

fn from_code(code: usize) -> DType {
    *values::DTYPES
        .iter()
        .find(|&&d| self::code(d) == code)
        .expect("a dtype code")
}

impl Op {
    /// The plan line: `sum|max|min <dtype>`, `gather`, `scatter <dtype>`, `sendrecv <shift>`.
    fn line(&self) -> String {
        match *self {
            Op::Reduce { op, dtype, .. } => {
                let name = match op {
                    Reduction::Sum => "sum",
                    Reduction::Max => "max",
                    Reduction::Min => "min",
                };
                format!("{name} {}", code(dtype))
            }
            Op::Gather { .. } => "gather".into(),
            Op::Scatter { dtype, .. } => format!("scatter {}", code(dtype)),
            Op::SendRecv { shift, .. } => format!("sendrecv {shift}"),
        }
    }

    fn parse(line: &str, input_bytes: usize, ranks: usize) -> Op {
        let words: Vec<&str> = line.split_whitespace().collect();
        let num = |i: usize| -> usize { words[i].parse().expect("a number in the plan") };
        match words[0] {
            "sum" | "max" | "min" => {
                let dtype = from_code(num(1));
                let op = match words[0] {
                    "sum" => Reduction::Sum,
                    "max" => Reduction::Max,
                    _ => Reduction::Min,
                };
                Op::Reduce {
                    op,
                    dtype,
                    n: input_bytes / dtype.size(),
                }
            }
            "gather" => Op::Gather { n: input_bytes },
            "scatter" => {
                let dtype = from_code(num(1));
                Op::Scatter {
                    dtype,
                    n: input_bytes / ranks / dtype.size(),
                }
            }
            "sendrecv" => Op::SendRecv {
                shift: num(1),
                n: input_bytes,
            },
            other => panic!("unknown plan operation {other}"),
        }
    }
}

/// A job's shape.
#[derive(Clone, Copy, Debug)]
struct Shape {
    ring: bool,
    ranks: usize,
    wires: usize,
    large: bool,
}

impl Shape {
    fn name(&self) -> String {
        format!(
            "{}{}x{}-{}",
            if self.ring { "ring" } else { "mesh" },
            self.ranks,
            self.wires,
            if self.large { "large" } else { "small" }
        )
    }

    /// The device file: a mesh's entry `[i][j]` lists `rdma_en{w·(R−1) + k}` (k the index of
    /// j among i's peers); a ring's entry towards the right neighbour `rdma_en{w}`, towards
    /// the left one `rdma_en{C + w}` (with 2 ranks both neighbours are one entry); a string
    /// when there is one wire.
    fn device_file(&self) -> String {
        let (r, c) = (self.ranks, self.wires);
        let entry = |names: Vec<String>| -> serde_json::Value {
            if c == 1 {
                names[0].clone().into()
            } else {
                names.into()
            }
        };
        let rows: Vec<serde_json::Value> = (0..r)
            .map(|i| {
                (0..r)
                    .map(|j| {
                        if i == j {
                            return serde_json::Value::Null;
                        }
                        if self.ring {
                            let (left, right) = ((i + r - 1) % r, (i + 1) % r);
                            if j == right {
                                entry((0..c).map(|w| format!("rdma_en{w}")).collect())
                            } else if j == left {
                                entry((0..c).map(|w| format!("rdma_en{}", c + w)).collect())
                            } else {
                                serde_json::Value::Null
                            }
                        } else {
                            let k = if j < i { j } else { j - 1 };
                            entry(
                                (0..c)
                                    .map(|w| format!("rdma_en{}", w * (r - 1) + k))
                                    .collect(),
                            )
                        }
                    })
                    .collect::<Vec<_>>()
                    .into()
            })
            .collect();
        serde_json::Value::Array(rows).to_string()
    }

    /// The operations of the shape: every dtype's all-reduce on a size class that rotates
    /// with the dtype and the shape (below a frame, below 32 KiB, below 512 KiB, above), with
    /// the reduction rotating too; f32 all-reduces either side of 32 KiB and 512 KiB; uint8
    /// all-reduces either side of a frame (4 KiB, and 8 KiB for large frames); for the ring,
    /// E either side of 2·R·C; all-gathers and send/recv either side of a frame and of
    /// 512 KiB, and in every class; sum-scatters of shards of one element, below, at and above 64 KiB and above
    /// 512 KiB.
    fn ops(&self) -> Vec<Op> {
        let (r, c) = (self.ranks, self.wires);
        let turn = r + c + usize::from(self.ring) + 2 * usize::from(self.large);
        let mut ops = Vec::new();
        for (i, &dtype) in values::DTYPES.iter().enumerate() {
            let s = dtype.size();
            let bytes = match (i + turn) % 4 {
                0 => 3000,
                1 => 20_000,
                2 => 200_000,
                _ => 512 * 1024 + 24,
            };
            ops.push(Op::Reduce {
                op: values::OPS[(i + turn) % 3],
                dtype,
                n: bytes / s + i % 3,
            });
        }
        for n in [8192, 8193, 131_071, 131_072] {
            ops.push(Op::Reduce {
                op: values::OPS[n % 3],
                dtype: DType::F32,
                n,
            });
        }
        for n in [4096, 4097, 8191, 8192] {
            ops.push(Op::Reduce {
                op: Reduction::Sum,
                dtype: DType::U8,
                n,
            });
        }
        if self.ring {
            for n in [2 * r * c - 1, 2 * r * c] {
                ops.push(Op::Reduce {
                    op: Reduction::Sum,
                    dtype: DType::F64,
                    n,
                });
            }
        }
        for n in [4096, 4097, 40_000, 512 * 1024 - 1, 512 * 1024 + 5] {
            ops.push(Op::Gather { n });
        }
        // Shards exactly at and just above 64 KiB (the ring's switch to every wire), above
        // 512 KiB (the mesh's), of one element, and small.
        let d = |k: usize| values::DTYPES[(turn + k) % 14];
        for (dtype, elements) in [
            (d(0), 65_536 / d(0).size()),
            (d(5), 65_536 / d(5).size() + 1),
            (d(9), (512 * 1024 + 8) / d(9).size() + 1),
            (DType::F64, 1),
            (d(3), 20_000 / d(3).size()),
        ] {
            ops.push(Op::Scatter { dtype, n: elements });
        }
        let shift = if self.ring { 1 } else { 1 + turn % (r - 1) };
        for n in [4096, 4097, 100_000, 512 * 1024 - 1, 512 * 1024 + 1] {
            ops.push(Op::SendRecv { shift, n });
        }
        ops
    }
}

/// Rank `rank`'s input of operation `i` of `op` in a job of `ranks` ranks.
fn input(i: usize, rank: usize, ranks: usize, op: &Op) -> Vec<u8> {
    let mut rng = ChaCha8Rng::seed_from_u64(
        21 ^ (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
            ^ (rank as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03),
    );
    match *op {
        Op::Reduce { dtype, n, .. } => {
            canonical(dtype, values::typed_values(&mut rng, dtype, n, 1.0 / 32.0))
        }
        Op::Scatter { dtype, n } => canonical(
            dtype,
            values::typed_values(&mut rng, dtype, n * ranks, 1.0 / 32.0),
        ),
        Op::Gather { n } | Op::SendRecv { n, .. } => {
            let mut b = vec![0u8; n];
            rng.fill_bytes(&mut b);
            b
        }
    }
}

/// `values` with every boolean made 0 or 1: a C++ `bool` holding another byte is undefined
/// behaviour, and MLX's arrays hold none (this crate's reading of any nonzero byte as true is
/// checked in simulation, `tests/sim/jaccl.rs`).
fn canonical(dtype: DType, mut values: Vec<u8>) -> Vec<u8> {
    if dtype == DType::Bool {
        values.iter_mut().for_each(|b| *b = u8::from(*b != 0));
    }
    values
}

/// FNV-1a (64 bits) of a result, as the C++ ranks print it.
fn fnv1a(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Whether `rank` sends before it receives when every rank sends to `rank + shift` (the even
/// positions of its cycle from its smallest rank), as the C++ ranks decide.
fn sends_first(rank: usize, size: usize, shift: usize) -> bool {
    let next = |x: usize| (x + shift) % size;
    let mut start = rank;
    let mut x = next(rank);
    while x != rank {
        start = start.min(x);
        x = next(x);
    }
    let (mut at, mut position) = (start, 0);
    while at != rank {
        at = next(at);
        position += 1;
    }
    position % 2 == 0
}

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

/// The MLX venv's JACCL headers (the directory holding `jaccl/`), or why not.
fn headers() -> Result<PathBuf, String> {
    let bin = venv::bin_with("python", "the JACCL jobs of MLX's own code")
        .ok_or("no MLX venv (.ci/setup-venv makes it)")?;
    let lib = bin.join("../lib");
    let entries = std::fs::read_dir(&lib).map_err(|e| format!("{}: {e}", lib.display()))?;
    for entry in entries.flatten() {
        let dir = entry
            .path()
            .join("site-packages/mlx/include/mlx/distributed/jaccl/lib");
        if dir.join("jaccl/mesh_impl.h").exists() && dir.join("jaccl/ring_impl.h").exists() {
            return Ok(dir);
        }
    }
    Err(format!(
        "no jaccl/mesh_impl.h in the MLX venv under {}",
        lib.display()
    ))
}

/// The C++ ranks, one per frame rule (`[small, large]`), built once per test run into the
/// cargo target's tmp directory (kept while newer than every source and header), or why they
/// cannot be. Under `CI=true` they must build.
fn harness() -> Option<&'static [PathBuf; 2]> {
    static BUILT: OnceLock<Result<[PathBuf; 2], String>> = OnceLock::new();
    match BUILT.get_or_init(build_harness) {
        Ok(paths) => Some(paths),
        Err(why) => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "the C++ ranks of MLX's JACCL code: {why}, but CI=true requires them"
            );
            eprintln!("skipped: the C++ ranks of MLX's JACCL code: {why}");
            None
        }
    }
}

fn build_harness() -> Result<[PathBuf; 2], String> {
    let include = headers()?;
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/processes/jaccl_mlx");
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("jaccl-mlx");
    std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let mut inputs: Vec<PathBuf> = SOURCES.iter().map(|s| src.join(s)).collect();
    if let Ok(entries) = std::fs::read_dir(include.join("jaccl")) {
        inputs.extend(entries.flatten().map(|e| e.path()));
    }
    let newest = inputs.iter().filter_map(|p| modified(p)).max();
    let targets = [out.join("jaccl-rank-small"), out.join("jaccl-rank-large")];
    if targets
        .iter()
        .all(|t| modified(t).is_some_and(|m| Some(m) >= newest))
    {
        return Ok(targets);
    }
    let compiler = std::env::var("CXX").unwrap_or_else(|_| "g++".to_owned());
    let compile = |source: &str, rule: &str, object: &Path| {
        let mut cmd = Command::new(&compiler);
        cmd.args(["-std=c++20", "-O1", "-c", "-include", "cstring"])
            // The frame rule's macOS-version test: 0 is macOS 26.2's 4 KiB frames, 1 the
            // large frames of 26.3 and later.
            .arg(format!("-D__builtin_available(...)={rule}"))
            .arg("-I")
            .arg(&include)
            .arg(src.join(source))
            .arg("-o")
            .arg(object);
        cmd
    };
    // Only groups.cpp instantiates the algorithms, so only it is compiled per rule.
    let mut jobs = Vec::new();
    for source in ["side_channel.cpp", "rdma.cpp", "main.cpp"] {
        jobs.push(compile(source, "0", &out.join(format!("{source}.o"))));
    }
    for (rule, name) in [("0", "small"), ("1", "large")] {
        jobs.push(compile(
            "groups.cpp",
            rule,
            &out.join(format!("groups-{name}.o")),
        ));
    }
    let running: Vec<_> = jobs
        .iter_mut()
        .map(|cmd| {
            let shown = format!("{cmd:?}");
            (shown, cmd.output())
        })
        .collect();
    for (shown, result) in running {
        let output = result.map_err(|e| format!("cannot run {compiler} ({e})"))?;
        if !output.status.success() {
            return Err(format!(
                "{shown} failed:\n{}",
                String::from_utf8_lossy(&output.stderr)
            ));
        }
    }
    for (target, name) in targets.iter().zip(["small", "large"]) {
        let mut link = Command::new(&compiler);
        for source in ["side_channel.cpp", "rdma.cpp", "main.cpp"] {
            link.arg(out.join(format!("{source}.o")));
        }
        link.arg(out.join(format!("groups-{name}.o")))
            .args(["-ldl", "-pthread", "-o"])
            .arg(target);
        let output = link
            .output()
            .map_err(|e| format!("cannot run {compiler} ({e})"))?;
        if !output.status.success() {
            return Err(format!(
                "linking {} failed:\n{}",
                target.display(),
                String::from_utf8_lossy(&output.stderr)
            ));
        }
    }
    Ok(targets)
}

/// A plan written to a directory: the operations and every rank's inputs.
struct Plan {
    dir: PathBuf,
    ops: Vec<Op>,
    inputs: Vec<Vec<Vec<u8>>>,
}

impl Plan {
    fn write(dir: &Path, shape: &Shape, ops: Vec<Op>) -> Plan {
        std::fs::create_dir_all(dir).expect("create the plan's directory");
        let mut text = String::new();
        let mut inputs = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            text += &op.line();
            text.push('\n');
            let ins: Vec<Vec<u8>> = (0..shape.ranks)
                .map(|r| input(i, r, shape.ranks, op))
                .collect();
            for (r, bytes) in ins.iter().enumerate() {
                std::fs::write(dir.join(format!("in-{i}-{r}.bin")), bytes).expect("an input");
            }
            inputs.push(ins);
        }
        std::fs::write(dir.join("plan.txt"), text).expect("write the plan");
        Plan {
            dir: dir.to_owned(),
            ops,
            inputs,
        }
    }
}

/// What a job left: every rank's result of every operation, and the message log as the
/// sizes of the messages of every (event, queue pair), in order.
struct Ran {
    results: Vec<Vec<Vec<u8>>>,
    log: BTreeMap<String, Vec<usize>>,
    elapsed: Duration,
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
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
        .to_string();
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

/// The folds MLX's mesh sum-scatter can give for one element of owner `owner`'s shard: the
/// owner's element first, then every peer's in some order (the order their messages
/// complete).
fn owner_first_folds(lane: Lane, op: Reduction, owner: usize, xs: &[&[u8]]) -> Vec<Vec<u8>> {
    let peers: Vec<usize> = (0..xs.len()).filter(|&p| p != owner).collect();
    let mut orders: Vec<Vec<usize>> = vec![vec![]];
    for _ in 0..peers.len() {
        let mut longer = Vec::new();
        for o in &orders {
            for &p in peers.iter().filter(|p| !o.contains(p)) {
                let mut next = o.clone();
                next.push(p);
                longer.push(next);
            }
        }
        orders = longer;
    }
    orders
        .into_iter()
        .map(|order| {
            let mut acc = xs[owner].to_vec();
            let mut tmp = [0u8; 8];
            for p in order {
                jaccl_model::combine(lane, op, &acc, xs[p], &mut tmp);
                acc.copy_from_slice(&tmp[..lane.size()]);
            }
            acc
        })
        .collect()
}

/// For an operation whose float results depend on the order messages complete (a mesh
/// sum-scatter, and the shards of a mesh all-reduce that takes the scatter-gather path, with
/// more than 2 ranks), the element ranges `(owner, bytes)` of rank `rank`'s result that some
/// rank reduced in that order, or `None` when the result is one fold in rank order.
fn completion_ordered(shape: &Shape, op: &Op, rank: usize) -> Option<Vec<(usize, usize, usize)>> {
    let r = shape.ranks;
    if shape.ring || r <= 2 {
        return None;
    }
    let floats = |d: DType| {
        matches!(
            Lane::of(d),
            Lane::F16 | Lane::Bf16 | Lane::F32 | Lane::F64 | Lane::C64
        )
    };
    match *op {
        Op::Scatter { dtype, n } if floats(dtype) => Some(vec![(rank, 0, n * dtype.size())]),
        Op::Reduce { dtype, n, .. } if floats(dtype) => {
            let s = dtype.size();
            let mut ranges = Vec::new();
            for (_, at, len) in jaccl_model::split_wires(n * s, n, shape.wires) {
                if len * s > 32 * 1024 {
                    let shard = len / r;
                    for owner in 0..r {
                        let start = (at + owner * shard) * s;
                        ranges.push((owner, start, start + shard * s));
                    }
                }
            }
            Some(ranges)
        }
        _ => None,
    }
}

/// Whether the float lane value `bits` (little-endian, `lane`'s element or one `float32`
/// half of a complex64) is NaN, or (`or_inf`) NaN or infinite.
fn non_finite(lane: Lane, bits: &[u8], or_inf: bool) -> bool {
    let (magnitude, inf) = match lane {
        Lane::F16 => (
            u64::from(u16::from_le_bytes([bits[0], bits[1]]) & 0x7FFF),
            0x7C00,
        ),
        Lane::Bf16 => (
            u64::from(u16::from_le_bytes([bits[0], bits[1]]) & 0x7FFF),
            0x7F80,
        ),
        Lane::F32 | Lane::C64 => (
            u64::from(u32::from_le_bytes(bits[..4].try_into().expect("4 bytes")) & 0x7FFF_FFFF),
            0x7F80_0000,
        ),
        Lane::F64 => (
            u64::from_le_bytes(bits[..8].try_into().expect("8 bytes")) & 0x7FFF_FFFF_FFFF_FFFF,
            0x7FF0_0000_0000_0000,
        ),
        _ => return false,
    };
    magnitude > inf || (or_inf && magnitude == inf)
}

/// The documented difference of float sums (`src/collective/reduce/mod.rs`): when both
/// operands of an addition are NaN, which NaN comes out depends on how the compiler laid out
/// MLX's loop; this crate returns the received one. So a sum's element may differ from MLX's
/// in its NaN bits where both are NaN and at least two of the element's inputs are NaN or
/// infinite (so that some step added two NaNs), lane by lane for complex64.
fn both_nan_sum(lane: Lane, op: Reduction, a: &[u8], b: &[u8], inputs: &[&[u8]]) -> bool {
    if op != Reduction::Sum {
        return false;
    }
    let width = match lane {
        Lane::F16 | Lane::Bf16 => 2,
        Lane::F32 | Lane::C64 => 4,
        Lane::F64 => 8,
        _ => return false,
    };
    (0..a.len()).step_by(width).all(|at| {
        let part = |x: &[u8]| x[at..at + width].to_vec();
        part(a) == part(b)
            || (non_finite(lane, &part(a), false)
                && non_finite(lane, &part(b), false)
                && inputs
                    .iter()
                    .filter(|x| non_finite(lane, &part(x), true))
                    .count()
                    >= 2)
    })
}

/// Checks job `got` of `plan` against the reference `want`, element by element: equal bits,
/// but for the completion-ordered elements (one of MLX's folds) and sums that met two NaNs
/// ([`both_nan_sum`]); then its message log, queue pair by queue pair.
fn compare(shape: &Shape, plan: &Plan, want: &Ran, got: &Ran, what: &str) {
    for (i, op) in plan.ops.iter().enumerate() {
        let (lane, red) = match *op {
            Op::Reduce { dtype, op, .. } => (Lane::of(dtype), op),
            Op::Scatter { dtype, .. } => (Lane::of(dtype), Reduction::Sum),
            _ => (Lane::U8, Reduction::Sum),
        };
        let s = lane.size();
        for rank in 0..shape.ranks {
            let (w, g) = (&want.results[i][rank], &got.results[i][rank]);
            assert_eq!(w.len(), g.len(), "{what}: op {i} {op:?} rank {rank}: size");
            let ordered = completion_ordered(shape, op, rank).unwrap_or_default();
            if w == g && ordered.is_empty() {
                continue;
            }
            let owner = |at: usize| {
                ordered
                    .iter()
                    .find(|&&(_, start, end)| (start..end).contains(&at))
                    .map(|&(owner, ..)| owner)
            };
            for at in (0..g.len()).step_by(s) {
                let owner = owner(at);
                if owner.is_none() && w[at..at + s] == g[at..at + s] {
                    continue;
                }
                // Every rank's input for this element.
                let xs: Vec<&[u8]> = plan.inputs[i]
                    .iter()
                    .map(|x| {
                        let base = if matches!(op, Op::Scatter { .. }) {
                            rank * g.len()
                        } else {
                            0
                        };
                        &x[base + at..base + at + s]
                    })
                    .collect();
                let (mine, theirs) = (&w[at..at + s], &g[at..at + s]);
                let fine = match owner {
                    Some(owner) => {
                        let folds = owner_first_folds(lane, red, owner, &xs);
                        [mine, theirs].iter().all(|b| {
                            folds
                                .iter()
                                .any(|f| f[..] == **b || both_nan_sum(lane, red, f, b, &xs))
                        })
                    }
                    None => both_nan_sum(lane, red, mine, theirs, &xs),
                };
                assert!(
                    fine,
                    "{what}: op {i} {op:?} rank {rank}: byte {at}: MLX's job {mine:02x?}, \
                     this one {theirs:02x?}, inputs {xs:02x?}{}",
                    match owner {
                        Some(o) => format!(
                            " (rank {o}'s shard: MLX's folds {:02x?})",
                            owner_first_folds(lane, red, o, &xs)
                        ),
                        None => String::new(),
                    }
                );
            }
        }
    }
    assert!(!want.log.is_empty(), "{what}: no message logged");
    assert_eq!(
        want.log.keys().collect::<Vec<_>>(),
        got.log.keys().collect::<Vec<_>>(),
        "{what}: the queue pairs that carried messages"
    );
    for (key, sizes) in &want.log {
        let theirs = &got.log[key];
        assert!(
            sizes == theirs,
            "{what}: {key}: {} messages in MLX's job, {} here; first difference at message {}",
            sizes.len(),
            theirs.len(),
            sizes
                .iter()
                .zip(theirs)
                .position(|(a, b)| a != b)
                .unwrap_or(sizes.len().min(theirs.len()))
        );
    }
}

/// Runs the all-MLX reference of `shape` and each mix of `mixes` (the ranks running MLX's
/// code), comparing every mix with the reference.
fn matrix_job(shape: Shape, mixes: &[&[usize]]) {
    let Some(harness) = harness() else {
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
        compare(
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
