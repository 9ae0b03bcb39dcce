//! The ring's collectives timed nccl-tests style, against the wire: the same ranks moving the
//! same bytes in the same ring pattern over plain blocking sockets, with no reduction.
//!
//! ```text
//! cargo bench --ignore-rust-version --bench allreduce -- [--ranks N] [--conns C]
//!     [--fabric tcp|sim] [--op all_sum|all_max|all_min|all_gather|sendrecv]
//!     [--dtype float32|float16|bfloat16|float64|int32|uint8|...]
//!     [--sizes 4K..64M | --sizes 4K,1M,16M] [--step 4] [--iters K] [--warmup W]
//!     [--agg mean|max|rank0] [--pingpong 4K|0] [--no-wire] [--timeout SECS]
//! ```
//!
//! Without `MLX_RANK` in the environment the program starts `--ranks` local ranks itself
//! (copies of this binary over loopback, with `MLX_HOSTFILE` and `MLX_RANK` set) and waits for
//! them; with it, the program is one rank of a job, so it also runs under MLX's launcher:
//! `mlx.launch -n 4 --backend ring -- target/release/deps/allreduce-<hash> --sizes 4K..16M`.
//! `--fabric sim` runs every rank in this process over `nuvec-fabric-sim` instead, in virtual
//! time (a sanity check of the schedule, not a measurement of this machine).
//!
//! Rank 0 prints one row per size: bytes, elements, dtype, the p50 and p99 time of one
//! operation (µs), algbw = bytes / p50 and busbw = algbw × 2(n−1)/n for an all-reduce,
//! × (n−1)/n for an all-gather (whose size is the gathered total), × 1 for send/recv; a check
//! column (every rank's result compared element by element with the exact answer: inputs are
//! small integers, so even float sums are exact); and the busbw as a percentage of the wire
//! row of the same size. Every timed iteration is preceded by a barrier (a 1-byte all_sum);
//! the time of an iteration is the mean over the ranks of what each measured (`--agg`; a
//! round trip is always rank 0's time). The `cpu µs/rank` column is the CPU time one operation
//! took on a rank, all its threads (Linux: `/proc/self/task/*/schedstat`), the mean over ranks
//! and iterations: unlike the wall-clock columns it does not depend on how many threads the
//! job has when the machine is shared, so `cpu÷wire` compares the work done, and `%wire` the
//! bandwidth reached.
//!
//! The **wire** rows time the machine's limit for the same traffic: a ring of plain blocking
//! `std::net` sockets (one to the right neighbour, one from the left), over which each rank
//! runs the collective's steps — 2(n−1) for an all-reduce, n−1 for an all-gather — each step
//! sending ⌈S/n⌉ bytes to the right while receiving as many from the left (a writer thread and
//! the calling thread; both on the calling thread when a step fits in the socket buffers), with
//! no reduction. The **ping-pong** row is a round trip of `--pingpong` bytes between ranks 0
//! and 1 over one of those sockets; the same round trip over the ring (`try_send`/`try_recv`)
//! is printed beside it.

use std::error::Error as StdError;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use half::{bf16, f16};
use nuvec_core::DType;
use nuvec_distributed::fabric::Fabric;
use nuvec_distributed::reduce::{Reducer, Reduction};
use nuvec_distributed::ring::{RingTopology, algorithm};
use nuvec_distributed::tcp::TcpFabric;
use nuvec_distributed::{Options, RingCommunicator, connect_ring, hostfile};
use nuvec_fabric_sim::{Sim, SimFabric};

/// Errors of every kind, sendable between threads (the simulator's ranks are threads).
type Result<T> = std::result::Result<T, Box<dyn StdError + Send + Sync>>;

/// A ring step of at most this many bytes is written and then read on the calling thread:
/// the kernel's socket buffers hold it, so neither rank can block the other.
const INLINE_STEP: usize = 32 * 1024;

/// The command line's synopsis, printed with argument errors.
const USAGE: &str = "usage: allreduce [--ranks N] [--conns C] [--fabric tcp|sim] \
[--op all_sum|all_max|all_min|all_gather|sendrecv] [--dtype float32|...] \
[--sizes 4K..64M|4K,1M,...] [--step F] [--iters K] [--warmup W] [--agg mean|max|rank0] \
[--pingpong BYTES|0] [--no-wire] [--timeout SECS]";

// ---------------------------------------------------------------------------------------------
// Arguments
// ---------------------------------------------------------------------------------------------

/// The collective being timed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    /// An all-reduce with this reduction.
    AllReduce(Reduction),
    /// An all-gather; the size is the gathered total.
    AllGather,
    /// A ping-pong between ranks 0 and 1 (`try_send` then `try_recv`).
    SendRecv,
}

/// The names and bandwidth factors of the collectives.
impl Op {
    /// The op named `s` on the command line.
    fn parse(s: &str) -> Result<Self> {
        Ok(match s {
            "all_sum" => Op::AllReduce(Reduction::Sum),
            "all_max" => Op::AllReduce(Reduction::Max),
            "all_min" => Op::AllReduce(Reduction::Min),
            "all_gather" => Op::AllGather,
            "sendrecv" => Op::SendRecv,
            other => return Err(format!("no op {other:?}\n{USAGE}").into()),
        })
    }

    /// The op's command-line name.
    fn name(self) -> &'static str {
        match self {
            Op::AllReduce(Reduction::Sum) => "all_sum",
            Op::AllReduce(Reduction::Max) => "all_max",
            Op::AllReduce(Reduction::Min) => "all_min",
            Op::AllGather => "all_gather",
            Op::SendRecv => "sendrecv",
        }
    }

    /// nccl-tests' bus bandwidth factor for `n` ranks.
    fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            Op::AllReduce(_) => 2.0 * (n - 1.0) / n,
            Op::AllGather => (n - 1.0) / n,
            Op::SendRecv => 1.0,
        }
    }
}

/// How the per-rank times of one iteration become the iteration's time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Agg {
    /// The mean over the ranks (nccl-tests' default).
    Mean,
    /// The slowest rank.
    Max,
    /// Rank 0's own time.
    Rank0,
}

/// The command line.
#[derive(Clone, Debug)]
struct Args {
    ranks: usize,
    conns: usize,
    sim: bool,
    op: Op,
    dtype: DType,
    sizes: Vec<usize>,
    iters: Option<usize>,
    warmup: Option<usize>,
    agg: Agg,
    pingpong: usize,
    wire: bool,
    timeout: Duration,
}

/// Every dtype `--dtype` accepts, by its MLX name.
const DTYPES: [DType; 14] = [
    DType::Bool,
    DType::U8,
    DType::U16,
    DType::U32,
    DType::U64,
    DType::I8,
    DType::I16,
    DType::I32,
    DType::I64,
    DType::F16,
    DType::BF16,
    DType::F32,
    DType::F64,
    DType::Complex64,
];

/// `4096`, `4K`, `1M`, `1G` (binary units).
fn parse_bytes(s: &str) -> Result<usize> {
    let s = s.trim();
    let (digits, shift) = match s.as_bytes().last() {
        Some(b'K' | b'k') => (&s[..s.len() - 1], 10),
        Some(b'M' | b'm') => (&s[..s.len() - 1], 20),
        Some(b'G' | b'g') => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    let n: usize = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a size (e.g. 4096, 4K, 16M)"))?;
    Ok(n << shift)
}

/// `A..B` (×`step` from A up to B) or `A,B,C`.
fn parse_sizes(s: &str, step: usize) -> Result<Vec<usize>> {
    if let Some((lo, hi)) = s.split_once("..") {
        let (mut size, hi) = (parse_bytes(lo)?, parse_bytes(hi)?);
        if size == 0 || step < 2 {
            return Err("a size range needs a start above 0 and a step of at least 2".into());
        }
        let mut sizes = Vec::new();
        while size <= hi {
            sizes.push(size);
            size *= step;
        }
        Ok(sizes)
    } else {
        s.split(',').map(parse_bytes).collect()
    }
}

/// Parsing and per-size defaults.
impl Args {
    /// Parses the arguments after the program name.
    fn parse(args: impl IntoIterator<Item = String>) -> Result<Self> {
        let mut a = Args {
            ranks: 2,
            conns: 1,
            sim: false,
            op: Op::AllReduce(Reduction::Sum),
            dtype: DType::F32,
            sizes: Vec::new(),
            iters: None,
            warmup: None,
            agg: Agg::Mean,
            pingpong: 4096,
            wire: true,
            timeout: Duration::from_secs(120),
        };
        let mut sizes: Option<String> = None;
        let mut step = 4usize;
        let mut it = args.into_iter();
        while let Some(arg) = it.next() {
            let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value\n{USAGE}"));
            match arg.as_str() {
                // `cargo bench` passes `--bench` to every harness-less bench.
                "--bench" => {}
                "--ranks" | "-n" => a.ranks = value("--ranks")?.parse()?,
                "--conns" | "-c" => a.conns = value("--conns")?.parse()?,
                "--fabric" => {
                    a.sim = match value("--fabric")?.as_str() {
                        "tcp" => false,
                        "sim" => true,
                        other => return Err(format!("no fabric {other:?} (tcp or sim)").into()),
                    }
                }
                "--op" => a.op = Op::parse(&value("--op")?)?,
                "--dtype" => {
                    let name = value("--dtype")?;
                    a.dtype = DTYPES
                        .into_iter()
                        .find(|d| d.name() == name)
                        .ok_or(format!("no dtype {name:?} (float32, float16, int32, ...)"))?;
                }
                "--sizes" => sizes = Some(value("--sizes")?),
                "--step" => step = value("--step")?.parse()?,
                "--iters" => a.iters = Some(value("--iters")?.parse::<usize>()?.max(1)),
                "--warmup" => a.warmup = Some(value("--warmup")?.parse()?),
                "--agg" => {
                    a.agg = match value("--agg")?.as_str() {
                        "mean" => Agg::Mean,
                        "max" => Agg::Max,
                        "rank0" => Agg::Rank0,
                        other => return Err(format!("no aggregation {other:?}").into()),
                    }
                }
                "--pingpong" => a.pingpong = parse_bytes(&value("--pingpong")?)?,
                "--no-wire" => a.wire = false,
                "--timeout" => a.timeout = Duration::from_secs_f64(value("--timeout")?.parse()?),
                "-h" | "--help" => return Err(USAGE.into()),
                other => return Err(format!("unknown argument {other:?}\n{USAGE}").into()),
            }
        }
        a.ranks = a.ranks.max(1);
        a.conns = a.conns.max(1);
        let default = if a.sim { "4K..4M" } else { "4K..64M" };
        a.sizes = parse_sizes(sizes.as_deref().unwrap_or(default), step)?;
        Ok(a)
    }

    /// Timed iterations for `bytes`: about 256 MiB of traffic, 10 to 500 (5 in simulation).
    fn iters(&self, bytes: usize) -> usize {
        self.iters.unwrap_or(if self.sim {
            5
        } else {
            ((256 << 20) / bytes.max(1)).clamp(10, 500)
        })
    }

    /// Untimed iterations before them.
    fn warmup(&self, iters: usize) -> usize {
        self.warmup.unwrap_or((iters / 10).clamp(2, 50))
    }
}

// ---------------------------------------------------------------------------------------------
// Data: small integers, so that every result is exact
// ---------------------------------------------------------------------------------------------

/// The exclusive bound of each rank's values for `dtype` on `n` ranks, so that a sum of n of
/// them is exact (and does not wrap).
fn value_bound(dtype: DType, n: usize) -> u64 {
    let limit: u64 = match dtype {
        DType::Bool => return 2,
        DType::U8 | DType::I8 => 127,
        DType::F16 => 2048,
        DType::BF16 => 256,
        DType::U16 | DType::I16 => 32767,
        _ => 1000,
    };
    (limit / n as u64).max(1)
}

/// Rank `rank`'s value of element `i`.
fn value(i: usize, rank: usize, bound: u64) -> u64 {
    ((i as u64).wrapping_mul(7) + rank as u64 * 3) % bound
}

/// Writes `v` as one element of `dtype` (little-endian) into `out`.
fn encode(dtype: DType, v: u64, out: &mut [u8]) {
    match dtype {
        DType::Bool => out[0] = u8::from(v != 0),
        DType::U8 | DType::I8 => out[0] = v as u8,
        DType::U16 | DType::I16 => out.copy_from_slice(&(v as u16).to_le_bytes()),
        DType::U32 | DType::I32 => out.copy_from_slice(&(v as u32).to_le_bytes()),
        DType::U64 | DType::I64 => out.copy_from_slice(&v.to_le_bytes()),
        DType::F16 => out.copy_from_slice(&f16::from_f32(v as f32).to_le_bytes()),
        DType::BF16 => out.copy_from_slice(&bf16::from_f32(v as f32).to_le_bytes()),
        DType::F32 => out.copy_from_slice(&(v as f32).to_le_bytes()),
        DType::F64 => out.copy_from_slice(&(v as f64).to_le_bytes()),
        DType::Complex64 => {
            out[..4].copy_from_slice(&(v as f32).to_le_bytes());
            out[4..].copy_from_slice(&(v as f32).to_le_bytes());
        }
        _ => unreachable!("no such dtype in DTYPES"),
    }
}

/// Fills `buf` with rank `rank`'s input.
fn fill(dtype: DType, rank: usize, n: usize, buf: &mut [u8]) {
    let bound = value_bound(dtype, n);
    for (i, e) in buf.chunks_exact_mut(dtype.size()).enumerate() {
        encode(dtype, value(i, rank, bound), e);
    }
}

/// Whether `buf` holds the exact reduction over `n` ranks of their inputs.
fn check_reduced(op: Reduction, dtype: DType, n: usize, buf: &[u8]) -> bool {
    let bound = value_bound(dtype, n);
    let mut want = [0u8; 16];
    buf.chunks_exact(dtype.size()).enumerate().all(|(i, got)| {
        let values = (0..n).map(|r| value(i, r, bound));
        let v = match op {
            Reduction::Sum => values.sum(),
            Reduction::Max => values.max().unwrap_or(0),
            Reduction::Min => values.min().unwrap_or(0),
        };
        encode(dtype, v, &mut want[..got.len()]);
        got == &want[..got.len()]
    })
}

/// Rank `rank`'s all-gather input.
fn gather_input(rank: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|j| (j.wrapping_mul(7) + rank * 13) as u8)
        .collect()
}

/// Whether `out` holds every rank's all-gather input in rank order.
fn check_gathered(n: usize, out: &[u8]) -> bool {
    let len = out.len() / n;
    (0..n).all(|r| out[r * len..(r + 1) * len] == gather_input(r, len)[..])
}

// ---------------------------------------------------------------------------------------------
// Statistics and printing
// ---------------------------------------------------------------------------------------------

/// Percentiles of one row's iteration times, in seconds.
#[derive(Clone, Copy, Debug)]
struct Stats {
    p50: f64,
    p99: f64,
    /// CPU seconds one operation took on a rank (all its threads), the mean over ranks and
    /// iterations; NaN where unknown.
    cpu: f64,
}

/// Percentiles from iteration times.
impl Stats {
    /// The p50 and p99 of `times` (nearest rank); the CPU time unknown.
    fn of(mut times: Vec<f64>) -> Self {
        times.sort_by(f64::total_cmp);
        let at = |q: f64| {
            let i = ((q * times.len() as f64).ceil() as usize).saturating_sub(1);
            times[i.min(times.len() - 1)]
        };
        Stats {
            p50: at(0.5),
            p99: at(0.99),
            cpu: f64::NAN,
        }
    }
}

/// One measured row: what was moved and how long it took.
#[derive(Clone, Copy, Debug)]
struct Row {
    bytes: usize,
    stats: Stats,
    ok: Option<bool>,
}

/// `bytes / seconds` in GB/s.
fn gbps(bytes: usize, secs: f64) -> f64 {
    bytes as f64 / secs / 1e9
}

/// Prints what is measured and how, as `#` lines.
fn print_header(args: &Args, n: usize, fabric: &str) {
    let time = match (args.sim, args.agg) {
        (true, _) => "virtual time of rank 0",
        (false, Agg::Mean) => "the mean over the ranks",
        (false, Agg::Max) => "the slowest rank's",
        (false, Agg::Rank0) => "rank 0's",
    };
    println!(
        "# nuvec-distributed ring: {} of {}, {n} ranks, {} connection(s) per neighbour, fabric {fabric}",
        args.op.name(),
        args.dtype.name(),
        args.conns,
    );
    println!(
        "# per size: warm-up, then timed iterations each after a barrier (1-byte all_sum); time of an iteration = {time}; p50/p99 over iterations"
    );
    let what = match args.op {
        Op::AllReduce(_) => "busbw = algbw × 2(n−1)/n",
        Op::AllGather => "bytes = gathered total, busbw = algbw × (n−1)/n",
        Op::SendRecv => "time = rank 0's round trip 0→1→0, algbw = busbw = bytes / (time/2)",
    };
    println!("# algbw = bytes / p50; {what}");
}

/// `secs` in µs, or `-` when unknown.
fn micros(secs: f64) -> String {
    if secs.is_finite() {
        format!("{:.1}", secs * 1e6)
    } else {
        "-".into()
    }
}

/// Prints the table of the ring's rows, with each row's busbw as a percentage of the wire
/// row of the same size and its CPU time as a multiple of the wire's.
fn print_rows(args: &Args, n: usize, rows: &[Row], wire: &[Option<Row>]) {
    let vs_wire = if wire.iter().any(Option::is_some) {
        format!(" {:>6} {:>9}", "%wire", "cpu÷wire")
    } else {
        String::new()
    };
    println!(
        "{:>12} {:>11} {:>9} {:>10} {:>10} {:>11} {:>10} {:>10} {:>5} {:>5}{vs_wire}",
        "bytes",
        "elements",
        "dtype",
        "p50 µs",
        "p99 µs",
        "cpu µs/rank",
        "algbw GB/s",
        "busbw GB/s",
        "check",
        "iters"
    );
    for (i, row) in rows.iter().enumerate() {
        let (algbw, busbw) = bandwidth(args.op, n, row);
        let check = match row.ok {
            Some(true) => "ok",
            Some(false) => "FAIL",
            None => "-",
        };
        let mut line = format!(
            "{:>12} {:>11} {:>9} {:>10} {:>10} {:>11} {:>10.3} {:>10.3} {:>5} {:>5}",
            row.bytes,
            row.bytes / args.dtype.size(),
            args.dtype.name(),
            micros(row.stats.p50),
            micros(row.stats.p99),
            micros(row.stats.cpu),
            algbw,
            busbw,
            check,
            args.iters(row.bytes),
        );
        if let Some(Some(w)) = wire.get(i) {
            let (_, wire_busbw) = bandwidth(args.op, n, w);
            let cpu = row.stats.cpu / w.stats.cpu;
            line += &format!(" {:>5.0}% {:>9.2}", 100.0 * busbw / wire_busbw, cpu);
        }
        println!("{line}");
    }
}

/// (algbw, busbw) of a row in GB/s.
fn bandwidth(op: Op, n: usize, row: &Row) -> (f64, f64) {
    let secs = match op {
        Op::SendRecv => row.stats.p50 / 2.0,
        _ => row.stats.p50,
    };
    let algbw = gbps(row.bytes, secs);
    (algbw, algbw * op.bus_factor(n))
}

// ---------------------------------------------------------------------------------------------
// Launching local ranks
// ---------------------------------------------------------------------------------------------

/// Runs the simulation, one rank, or the launcher of local ranks; exits 2 on a bad command
/// line and 1 on a failure.
fn main() {
    let args = match Args::parse(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let result = if args.sim {
        run_sim(&args)
    } else if std::env::var_os("MLX_RANK").is_some() {
        run_rank(&args)
    } else {
        launch(&args)
    };
    if let Err(e) = result {
        let rank = std::env::var("MLX_RANK").unwrap_or_else(|_| "launcher".into());
        eprintln!("allreduce bench (rank {rank}): {e}");
        std::process::exit(1);
    }
}

/// Starts `args.ranks` copies of this program as the ranks of a loopback ring, forwards the
/// command line, and waits; kills the others when one fails.
fn launch(args: &Args) -> Result<()> {
    let listeners: Vec<Vec<TcpListener>> = (0..args.ranks)
        .map(|_| {
            (0..args.conns)
                .map(|_| TcpListener::bind("127.0.0.1:0"))
                .collect()
        })
        .collect::<std::io::Result<_>>()?;
    let nodes: Vec<Vec<String>> = listeners
        .iter()
        .map(|row| {
            row.iter()
                .map(|l| l.local_addr().map(|a| a.to_string()))
                .collect()
        })
        .collect::<std::io::Result<_>>()?;
    drop(listeners);
    let path =
        std::env::temp_dir().join(format!("nuvec-bench-allreduce-{}.json", std::process::id()));
    std::fs::write(&path, hostfile::write(&nodes))?;
    let exe = std::env::current_exe()?;
    let mut children: Vec<Child> = (0..args.ranks)
        .map(|r| {
            Command::new(&exe)
                .args(std::env::args().skip(1))
                .env("MLX_HOSTFILE", &path)
                .env("MLX_RANK", r.to_string())
                .stdin(Stdio::null())
                .stdout(if r == 0 {
                    Stdio::inherit()
                } else {
                    Stdio::null()
                })
                .spawn()
        })
        .collect::<std::io::Result<_>>()?;
    let mut status: Vec<Option<std::process::ExitStatus>> = vec![None; children.len()];
    let failed = loop {
        for (s, child) in status.iter_mut().zip(children.iter_mut()) {
            if s.is_none() {
                *s = child.try_wait()?;
            }
        }
        if let Some(r) = status.iter().position(|s| s.is_some_and(|s| !s.success())) {
            break Some(r);
        }
        if status.iter().all(Option::is_some) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    if failed.is_some() {
        for (s, child) in status.iter().zip(children.iter_mut()) {
            if s.is_none() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
    let _ = std::fs::remove_file(&path);
    match failed {
        Some(r) => Err(format!("rank {r} failed ({:?})", status[r]).into()),
        None => Ok(()),
    }
}

// ---------------------------------------------------------------------------------------------
// One rank over TCP
// ---------------------------------------------------------------------------------------------

/// The ring over TCP, as `connect_ring` makes it.
type Comm = RingCommunicator<TcpFabric>;

/// The barrier before every timed iteration: a 1-byte all_sum.
fn barrier(comm: &Comm) -> Result<()> {
    let mut b = [0u8; 1];
    comm.try_all_reduce(Reduction::Sum, DType::U8, &mut b)?;
    Ok(())
}

/// Runs `op` `warmup` times, then `iters` times each after a barrier and timed, and combines
/// every rank's times per iteration as `agg` says.
fn measure(
    comm: &Comm,
    warmup: usize,
    iters: usize,
    agg: Agg,
    mut op: impl FnMut() -> Result<()>,
) -> Result<Stats> {
    for _ in 0..warmup {
        barrier(comm)?;
        op()?;
    }
    let mut times = Vec::with_capacity(iters);
    let mut cpu = 0.0;
    for _ in 0..iters {
        barrier(comm)?;
        let cpu_start = cpu_time();
        let start = Instant::now();
        op()?;
        times.push(start.elapsed().as_secs_f64());
        cpu += cpu_time() - cpu_start;
    }
    let n = comm.topology().size() as f64;
    let mut cpu_bytes = (cpu / iters as f64).to_le_bytes();
    comm.try_all_reduce(Reduction::Sum, DType::F64, &mut cpu_bytes)?;
    let mut bytes: Vec<u8> = times.iter().flat_map(|t| t.to_le_bytes()).collect();
    let reduction = match agg {
        Agg::Max => Reduction::Max,
        Agg::Mean | Agg::Rank0 => Reduction::Sum,
    };
    comm.try_all_reduce(reduction, DType::F64, &mut bytes)?;
    if agg != Agg::Rank0 {
        times = bytes
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes")))
            .map(|t| if agg == Agg::Mean { t / n } else { t })
            .collect();
    }
    Ok(Stats {
        cpu: f64::from_le_bytes(cpu_bytes) / n,
        ..Stats::of(times)
    })
}

/// The CPU time this process's threads have run, in seconds (Linux: the sum of every
/// thread's `/proc/self/task/*/schedstat`, nanosecond resolution); NaN elsewhere.
fn cpu_time() -> f64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return f64::NAN;
    };
    let ns: u64 = tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    ns as f64 * 1e-9
}

/// Whether `ok` holds on every rank.
fn everyone(comm: &Comm, ok: bool) -> Result<bool> {
    let mut b = [u8::from(ok)];
    comm.try_all_reduce(Reduction::Min, DType::U8, &mut b)?;
    Ok(b[0] == 1)
}

/// One rank of a TCP job: joins the ring from `MLX_HOSTFILE`/`MLX_RANK`, connects the
/// wire, measures every size, and prints the tables on rank 0.
fn run_rank(args: &Args) -> Result<()> {
    let path =
        std::env::var("MLX_HOSTFILE").map_err(|_| "MLX_RANK is set but MLX_HOSTFILE is not")?;
    let rank: usize = std::env::var("MLX_RANK")?
        .parse()
        .map_err(|_| "MLX_RANK is not a number")?;
    let nodes = hostfile::read(Path::new(&path))?;
    let options = Options::default().timeout(args.timeout);
    let group = connect_ring(&nodes, rank, &options)?;
    let comm = group
        .communicator()
        .ok_or("the bench needs a ring of at least 2 ranks")?;
    let n = comm.topology().size();
    let mut args = args.clone();
    args.conns = comm.topology().conns();
    let mut wire = if args.wire {
        Some(Wire::connect(comm, &nodes, rank)?)
    } else {
        None
    };
    if rank == 0 {
        print_header(&args, n, "tcp");
    }
    let mut rows = Vec::new();
    let mut wire_rows = Vec::new();
    for &size in &args.sizes {
        let (row, wire_row) = measure_size(&args, comm, wire.as_mut(), size)?;
        rows.push(row);
        wire_rows.push(wire_row);
    }
    let pingpong = match (&mut wire, args.pingpong) {
        (Some(w), bytes) if bytes > 0 => Some(measure_pingpong(&args, comm, w, bytes)?),
        _ => None,
    };
    if rank == 0 {
        print_rows(&args, n, &rows, &wire_rows);
        if let Some(w) = wire.as_ref() {
            print_wire(&args, n, w, &wire_rows);
        }
        if let Some((wire_rtt, ring_rtt)) = pingpong {
            print_pingpong(&args, &rows, args.pingpong, wire_rtt, ring_rtt);
        }
    }
    if let Some(w) = wire {
        w.close();
    }
    group.close();
    Ok(())
}

/// Times `args.op` on `size` bytes over the ring, checks it, and times the wire's equivalent.
fn measure_size(
    args: &Args,
    comm: &Comm,
    wire: Option<&mut Wire>,
    size: usize,
) -> Result<(Row, Option<Row>)> {
    let (rank, n) = (comm.topology().rank(), comm.topology().size());
    let iters = args.iters(size);
    let warmup = args.warmup(iters);
    let es = args.dtype.size();
    let (bytes, stats, ok) = match args.op {
        Op::AllReduce(reduction) => {
            let bytes = size / es * es;
            let mut data = vec![0u8; bytes];
            fill(args.dtype, rank, n, &mut data);
            let stats = measure(comm, warmup, iters, args.agg, || {
                Ok(comm.try_all_reduce(reduction, args.dtype, &mut data)?)
            })?;
            fill(args.dtype, rank, n, &mut data);
            comm.try_all_reduce(reduction, args.dtype, &mut data)?;
            let ok = check_reduced(reduction, args.dtype, n, &data);
            (bytes, stats, ok)
        }
        Op::AllGather => {
            let per = size / n / es * es;
            let input = gather_input(rank, per);
            let mut output = vec![0u8; per * n];
            let stats = measure(comm, warmup, iters, args.agg, || {
                Ok(comm.try_all_gather(&input, &mut output)?)
            })?;
            output.fill(0);
            comm.try_all_gather(&input, &mut output)?;
            (per * n, stats, check_gathered(n, &output))
        }
        Op::SendRecv => {
            let mut data = vec![0u8; size];
            // Rank 0 times the whole round trip; the others only part of it.
            let stats = measure(comm, warmup, iters, Agg::Rank0, || {
                ring_pingpong(comm, &mut data)
            })?;
            let ok = match rank {
                0 => {
                    let sent = gather_input(0, size);
                    comm.try_send(1, &sent)?;
                    comm.try_recv(1, &mut data)?;
                    data == sent
                }
                1 => {
                    comm.try_recv(0, &mut data)?;
                    comm.try_send(0, &data)?;
                    true
                }
                _ => true,
            };
            (size, stats, ok)
        }
    };
    let ok = everyone(comm, ok)?;
    let row = Row {
        bytes,
        stats,
        ok: Some(ok),
    };
    let wire_row = match wire {
        None => None,
        Some(w) => {
            let stats = match args.op {
                Op::AllReduce(_) => {
                    let seg = bytes.div_ceil(n);
                    measure(comm, warmup, iters, args.agg, || w.ring(2 * (n - 1), seg))?
                }
                Op::AllGather => {
                    let seg = bytes / n;
                    measure(comm, warmup, iters, args.agg, || w.ring(n - 1, seg))?
                }
                Op::SendRecv => {
                    measure(comm, warmup, iters, Agg::Rank0, || w.pingpong(rank, bytes))?
                }
            };
            Some(Row {
                bytes,
                stats,
                ok: None,
            })
        }
    };
    Ok((row, wire_row))
}

/// A round trip of `data` between ranks 0 and 1 over the ring's `try_send`/`try_recv`.
fn ring_pingpong(comm: &Comm, data: &mut [u8]) -> Result<()> {
    match comm.topology().rank() {
        0 => {
            comm.try_send(1, data)?;
            comm.try_recv(1, data)?;
        }
        1 => {
            comm.try_recv(0, data)?;
            comm.try_send(0, data)?;
        }
        _ => {}
    }
    Ok(())
}

/// Round trips of `bytes` between ranks 0 and 1: over the wire, and over the ring.
fn measure_pingpong(
    args: &Args,
    comm: &Comm,
    wire: &mut Wire,
    bytes: usize,
) -> Result<(Stats, Stats)> {
    let rank = comm.topology().rank();
    let iters = args.iters(bytes);
    let warmup = args.warmup(iters);
    let wire_rtt = measure(comm, warmup, iters, Agg::Rank0, || {
        wire.pingpong(rank, bytes)
    })?;
    let mut data = vec![0u8; bytes];
    let ring_rtt = measure(comm, warmup, iters, Agg::Rank0, || {
        ring_pingpong(comm, &mut data)
    })?;
    Ok((wire_rtt, ring_rtt))
}

/// Prints the wire's rows.
fn print_wire(args: &Args, n: usize, wire: &Wire, rows: &[Option<Row>]) {
    let steps = "each step sending right while receiving left";
    let pattern = match args.op {
        Op::AllReduce(_) => format!("{} steps of ⌈S/n⌉ bytes, {steps}", 2 * (n - 1)),
        Op::AllGather => format!("{} steps of S/n bytes, {steps}", n - 1),
        Op::SendRecv => "a round trip 0→1→0 on one socket".into(),
    };
    println!(
        "# wire: the same ranks and bytes over blocking std sockets ({}), no reduction: {pattern} (steps ≤ {} KiB written then read on one thread, larger ones with a writer thread)",
        wire.describe(),
        INLINE_STEP / 1024
    );
    println!(
        "{:>12} {:>10} {:>10} {:>11} {:>10} {:>10}",
        "bytes", "p50 µs", "p99 µs", "cpu µs/rank", "algbw GB/s", "busbw GB/s"
    );
    for row in rows.iter().flatten() {
        let (algbw, busbw) = bandwidth(args.op, n, row);
        println!(
            "{:>12} {:>10} {:>10} {:>11} {:>10.3} {:>10.3}",
            row.bytes,
            micros(row.stats.p50),
            micros(row.stats.p99),
            micros(row.stats.cpu),
            algbw,
            busbw
        );
    }
}

/// Prints the round trips, and the op of the same size as a multiple of the wire's.
fn print_pingpong(args: &Args, rows: &[Row], bytes: usize, wire: Stats, ring: Stats) {
    println!(
        "# ping-pong: {bytes} bytes rank 0 → 1 → 0, round trip timed by rank 0, p50 / p99 (µs): wire {:.1} / {:.1}, ring try_send+try_recv {:.1} / {:.1}",
        wire.p50 * 1e6,
        wire.p99 * 1e6,
        ring.p50 * 1e6,
        ring.p99 * 1e6
    );
    if let Some(row) = rows.iter().find(|r| r.bytes == bytes) {
        println!(
            "# {} of {bytes} bytes: p50 {:.1} µs = {:.2} × the wire's round trip",
            args.op.name(),
            row.stats.p50 * 1e6,
            row.stats.p50 / wire.p50
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The wire: a ring of blocking std sockets
// ---------------------------------------------------------------------------------------------

/// A command to the writer thread: write this many bytes, or stop.
enum Job {
    Write(usize),
    Stop,
}

/// A thread that writes to the right neighbour while the calling thread reads from the left.
struct Writer {
    jobs: mpsc::Sender<Job>,
    done: mpsc::Receiver<std::io::Result<()>>,
    thread: JoinHandle<()>,
}

/// Starting the writer.
impl Writer {
    /// A writer thread on `stream`, writing from a buffer of its own.
    fn spawn(mut stream: TcpStream) -> Self {
        let (jobs, job_rx) = mpsc::channel::<Job>();
        let (done_tx, done) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            let mut buf: Vec<u8> = Vec::new();
            while let Ok(Job::Write(len)) = job_rx.recv() {
                if buf.len() < len {
                    buf.resize(len, 0x5a);
                }
                if done_tx.send(stream.write_all(&buf[..len])).is_err() {
                    break;
                }
            }
        });
        Writer { jobs, done, thread }
    }
}

/// This rank's wire sockets: to its right neighbour and from its left one.
struct Wire {
    right: TcpStream,
    left: TcpStream,
    writer: Writer,
    send: Vec<u8>,
    recv: Vec<u8>,
}

/// Connecting and running the wire.
impl Wire {
    /// Connects the wire ring: every rank listens on a fresh port of its first hostfile
    /// address, the ports are exchanged over the ring, and every rank connects to its right
    /// neighbour's and accepts its left neighbour's.
    fn connect(comm: &Comm, nodes: &[Vec<String>], rank: usize) -> Result<Self> {
        let ring = comm.topology();
        let (host, _) = hostfile::split_address(&nodes[rank][0])?;
        let listener = TcpListener::bind((host.as_str(), 0))?;
        let port = listener.local_addr()?.port();
        let mut ports = vec![0u8; 2 * ring.size()];
        comm.try_all_gather(&port.to_le_bytes(), &mut ports)?;
        let right_port = u16::from_le_bytes([ports[2 * ring.right()], ports[2 * ring.right() + 1]]);
        let (right_host, _) = hostfile::split_address(&nodes[ring.right()][0])?;
        // The listener's backlog takes the connection before anyone accepts.
        let right = TcpStream::connect((right_host.as_str(), right_port))?;
        let (left, _) = listener.accept()?;
        right.set_nodelay(true)?;
        left.set_nodelay(true)?;
        let writer = Writer::spawn(right.try_clone()?);
        Ok(Wire {
            right,
            left,
            writer,
            send: Vec::new(),
            recv: Vec::new(),
        })
    }

    /// The socket addresses and options, for the table's header.
    fn describe(&self) -> String {
        match (self.right.local_addr(), self.right.peer_addr()) {
            (Ok(a), Ok(b)) => format!("e.g. {a} → {b}, TCP_NODELAY"),
            _ => "TCP_NODELAY".into(),
        }
    }

    /// `steps` ring steps of `seg` bytes: each sends `seg` bytes right while receiving `seg`
    /// bytes from the left, and the next starts when both are done.
    fn ring(&mut self, steps: usize, seg: usize) -> Result<()> {
        if self.recv.len() < seg {
            self.recv.resize(seg, 0);
        }
        if seg <= INLINE_STEP && self.send.len() < seg {
            self.send.resize(seg, 0xa5);
        }
        for _ in 0..steps {
            if seg <= INLINE_STEP {
                self.right.write_all(&self.send[..seg])?;
                self.left.read_exact(&mut self.recv[..seg])?;
            } else {
                self.writer.jobs.send(Job::Write(seg))?;
                self.left.read_exact(&mut self.recv[..seg])?;
                self.writer.done.recv()??;
            }
        }
        Ok(())
    }

    /// A round trip of `bytes` between ranks 0 and 1 over the socket rank 0 opened to rank 1.
    fn pingpong(&mut self, rank: usize, bytes: usize) -> Result<()> {
        if self.recv.len() < bytes {
            self.recv.resize(bytes, 0);
        }
        match rank {
            0 => {
                self.right.write_all(&self.recv[..bytes])?;
                self.right.read_exact(&mut self.recv[..bytes])?;
            }
            1 => {
                self.left.read_exact(&mut self.recv[..bytes])?;
                self.left.write_all(&self.recv[..bytes])?;
            }
            _ => {}
        }
        Ok(())
    }

    /// Stops the writer thread.
    fn close(self) {
        let _ = self.writer.jobs.send(Job::Stop);
        let _ = self.writer.thread.join();
    }
}

// ---------------------------------------------------------------------------------------------
// The simulator: virtual time
// ---------------------------------------------------------------------------------------------

/// Runs every rank in this process over the simulator and prints rank 0's virtual times.
fn run_sim(args: &Args) -> Result<()> {
    let n = args.ranks.max(2);
    let report =
        Sim::ring(n, args.conns).run(|fabric| sim_rank(args, fabric).map_err(|e| e.to_string()));
    let mut per_rank = Vec::new();
    for (r, outcome) in report.outcomes.into_iter().enumerate() {
        match outcome.returned() {
            Some(Ok(v)) => per_rank.push(v),
            Some(Err(e)) => return Err(format!("simulated rank {r}: {e}").into()),
            None => return Err(format!("simulated rank {r} panicked or crashed").into()),
        }
    }
    let mut args = args.clone();
    args.ranks = n;
    print_header(
        &args,
        n,
        "sim (virtual time: 5 ± 5 µs latency, 10 GB/s per link)",
    );
    let rows: Vec<Row> = per_rank[0]
        .iter()
        .enumerate()
        .map(|(i, (bytes, times, _))| Row {
            bytes: *bytes,
            stats: Stats::of(times.clone()),
            ok: Some(per_rank.iter().all(|r| r[i].2)),
        })
        .collect();
    print_rows(&args, n, &rows, &[]);
    println!(
        "# simulated end time {:?}, seed {}",
        report.end, report.seed
    );
    Ok(())
}

/// One simulated rank: the algorithms straight over the fabric, timed on its clock.
fn sim_rank(args: &Args, mut fabric: SimFabric) -> Result<Vec<(usize, Vec<f64>, bool)>> {
    let (rank, n) = (fabric.rank(), fabric.size());
    let ring = RingTopology::new(rank, n, args.conns);
    let mut scratch = Vec::new();
    let mut out = Vec::new();
    let timeout = args.timeout;
    let barrier = |fabric: &mut SimFabric, scratch: &mut Vec<u8>| -> Result<()> {
        let reducer = Reducer::new(Reduction::Sum, DType::U8)?;
        let deadline = fabric.now() + timeout;
        algorithm::all_reduce(fabric, &ring, reducer, &mut [0u8], scratch, deadline)?;
        Ok(())
    };
    for &size in &args.sizes {
        let iters = args.iters(size);
        let warmup = args.warmup(iters).min(2);
        let es = args.dtype.size();
        let mut times = Vec::with_capacity(iters);
        let (bytes, ok) = match args.op {
            Op::AllReduce(op) => {
                let reducer = Reducer::new(op, args.dtype)?;
                let bytes = size / es * es;
                let mut data = vec![0u8; bytes];
                for i in 0..warmup + iters + 1 {
                    barrier(&mut fabric, &mut scratch)?;
                    fill(args.dtype, rank, n, &mut data);
                    let start = fabric.now();
                    let deadline = start + timeout;
                    algorithm::all_reduce(
                        &mut fabric,
                        &ring,
                        reducer,
                        &mut data,
                        &mut scratch,
                        deadline,
                    )?;
                    if i >= warmup && i < warmup + iters {
                        times.push((fabric.now() - start).as_secs_f64());
                    }
                }
                (bytes, check_reduced(op, args.dtype, n, &data))
            }
            Op::AllGather => {
                let per = size / n / es * es;
                let input = gather_input(rank, per);
                let mut output = vec![0u8; per * n];
                for i in 0..warmup + iters {
                    barrier(&mut fabric, &mut scratch)?;
                    let start = fabric.now();
                    let deadline = start + timeout;
                    algorithm::all_gather(&mut fabric, &ring, &input, &mut output, deadline)?;
                    if i >= warmup {
                        times.push((fabric.now() - start).as_secs_f64());
                    }
                }
                (per * n, check_gathered(n, &output))
            }
            Op::SendRecv => {
                let sent = gather_input(0, size);
                let mut data = vec![0u8; size];
                let mut ok = true;
                for i in 0..warmup + iters {
                    barrier(&mut fabric, &mut scratch)?;
                    let start = fabric.now();
                    let deadline = start + timeout;
                    match rank {
                        0 => {
                            algorithm::send(&mut fabric, &ring, 1, &sent, deadline)?;
                            algorithm::recv(&mut fabric, &ring, 1, &mut data, deadline)?;
                            ok &= data == sent;
                        }
                        1 => {
                            algorithm::recv(&mut fabric, &ring, 0, &mut data, deadline)?;
                            algorithm::send(&mut fabric, &ring, 0, &data, deadline)?;
                        }
                        _ => {}
                    }
                    if i >= warmup {
                        times.push((fabric.now() - start).as_secs_f64());
                    }
                }
                (size, ok)
            }
        };
        out.push((bytes, times, ok));
    }
    Ok(out)
}
