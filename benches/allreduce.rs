//! The collectives of MLX's TCP ring and of MLX's JACCL (its mesh and its ring) timed
//! nccl-tests style, against the wire: the same ranks moving the same bytes in the same ring
//! pattern over plain blocking sockets, with no reduction.
//!
//! ```text
//! cargo bench --ignore-rust-version --bench allreduce -- [--backend ring|jaccl|jaccl-ring]
//!     [--ranks N] [--conns C] [--fabric tcp|sim]
//!     [--op all_sum|all_max|all_min|all_gather|sendrecv]
//!     [--dtype float32|float16|bfloat16|float64|int32|uint8|...]
//!     [--sizes 4K..64M | --sizes 4K,1M,16M] [--step 4] [--iters K] [--warmup W]
//!     [--agg mean|max|rank0] [--pingpong 4K|0] [--no-wire] [--timeout SECS] [--spin US]
//! ```
//!
//! `--spin` sets how long a TCP step that waits keeps looking before it parks
//! ([`Options::spin`], default 100 µs; 0 parks at once), to compare both in one run.
//!
//! `--backend` names the algorithms as MLX's launcher does: `ring` (the default) is MLX's TCP
//! ring, `RingCommunicator` over `TcpFabric` with `--conns` connections per neighbour; `jaccl`
//! is JACCL's mesh (2 to 8 ranks, one cable between every pair) and `jaccl-ring` JACCL's ring
//! (2 or more ranks, `--conns` cables per neighbour, MLX's C, 1 to 4), both
//! `nuvec_distributed::jaccl::JacclCommunicator` with MLX's default frames
//! (`FrameRule::Small`). Over `--fabric tcp` JACCL's cables are TCP connections, one per cable
//! (`nuvec_distributed::jaccl::tcp`, what `NUVEC_JACCL_FABRIC=tcp` selects): JACCL's
//! algorithms between real processes, but not RDMA.
//!
//! Without `MLX_RANK` in the environment the program starts `--ranks` local ranks itself
//! (copies of this binary over loopback, with `MLX_RANK` set, and `MLX_HOSTFILE` for the ring;
//! for JACCL a device file of a mesh or a ring of local ranks in `MLX_IBV_DEVICES`, rank 0's
//! side channel in `MLX_JACCL_COORDINATOR`, and `MLX_JACCL_RING` for `jaccl-ring`) and waits
//! for them; with it, the program is one rank of a job, so it also runs under MLX's launcher:
//! `mlx.launch -n 4 --backend ring -- target/release/deps/allreduce-<hash> --sizes 4K..16M`,
//! or `mlx.launch --backend jaccl-ring ... -- <the same> --backend jaccl-ring` (the topology
//! the device file gives must be the one `--backend` names; the cables are TCP connections on
//! the side channel's interface). `--fabric sim` runs every rank in this process over
//! `nuvec-fabric-sim` instead (the ring over its stream channels, JACCL over its UC message
//! channels), in virtual time (a sanity check of the schedule, not a measurement of this
//! machine).
//!
//! Rank 0 prints one row per size: bytes, elements, dtype, the p50 and p99 time of one
//! operation (µs), algbw = bytes / p50 and busbw = algbw × 2(n−1)/n for an all-reduce,
//! × (n−1)/n for an all-gather (whose size is the gathered total), × 1 for send/recv; a check
//! column (every rank's result compared element by element with the exact answer: inputs are
//! small integers, so even float sums are exact); and the busbw as a percentage of the wire
//! row of the same size. Every timed iteration is preceded by a barrier (a 1-byte all_sum);
//! the time of an iteration is the mean over the ranks of what each measured (`--agg`; a
//! round trip is always rank 0's time; in simulation, rank 0's virtual time). The
//! `cpu µs/rank` column is the CPU time one operation took on a rank, all its threads (Linux:
//! `/proc/self/task/*/schedstat`), the mean over ranks and iterations: unlike the wall-clock
//! columns it does not depend on how many threads the job has when the machine is shared, so
//! `cpu÷wire` compares the work done, and `%wire` the bandwidth reached.
//!
//! The **wire** rows (over TCP) time the machine's limit for the same traffic: a ring of plain
//! blocking `std::net` sockets (one to the right neighbour, one from the left; each rank
//! listens on its hostfile address, or for JACCL on its side channel's interface, and the
//! addresses are all-gathered over the communicator), over which each rank runs the
//! collective's steps — 2(n−1) for an all-reduce, n−1 for an all-gather — each step sending
//! ⌈S/n⌉ bytes to the right while receiving as many from the left (a writer thread and the
//! calling thread; both on the calling thread when a step fits in the socket buffers), with no
//! reduction. The pattern is the ring's for every backend: JACCL's mesh exchanges with every
//! peer at once instead (above 32 KiB on more than 2 ranks as many bytes per rank as a ring,
//! else its whole buffer to every peer), so for it the wire is the machine's limit for a
//! ring's traffic, a reference rather than the same messages. The **ping-pong** row is a
//! round trip of `--pingpong` bytes between ranks 0 and 1 over one of those sockets; the same
//! round trip over the communicator (`try_send`/`try_recv`) is printed beside it.

use std::error::Error as StdError;
use std::ffi::OsString;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use half::{bf16, f16};
use nuvec_core::DType;
use nuvec_distributed::fabric::Fabric;
use nuvec_distributed::jaccl::{
    self, FrameRule, JacclCommunicator, MESH_MAX_PEERS, RING_MAX_CONNS, SideChannel, Topology,
};
use nuvec_distributed::reduce::{DTYPES, Reduction};
use nuvec_distributed::{Options, RingCommunicator, connect_ring, hostfile};
use nuvec_fabric_sim::{Sim, SimClock, SimFabric};

/// Errors of every kind, sendable between threads (the simulator's ranks are threads).
type Result<T> = std::result::Result<T, Box<dyn StdError + Send + Sync>>;

/// A ring step of at most this many bytes is written and then read on the calling thread:
/// the kernel's socket buffers hold it, so neither rank can block the other.
const INLINE_STEP: usize = 32 * 1024;

/// The command line's synopsis, printed with argument errors.
const USAGE: &str = "usage: allreduce [--backend ring|jaccl|jaccl-ring] [--ranks N] \
[--conns C] [--fabric tcp|sim] \
[--op all_sum|all_max|all_min|all_gather|sendrecv] [--dtype float32|...] \
[--sizes 4K..64M|4K,1M,...] [--step F] [--iters K] [--warmup W] [--agg mean|max|rank0] \
[--pingpong BYTES|0] [--no-wire] [--timeout SECS] [--spin US]";

// ---------------------------------------------------------------------------------------------
// Arguments
// ---------------------------------------------------------------------------------------------

/// Whose algorithms are timed (`--backend`, by the names of MLX's launcher).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Backend {
    /// MLX's TCP ring: `RingCommunicator`, `--conns` connections per neighbour.
    Ring,
    /// JACCL's mesh: `JacclCommunicator::mesh`, one cable between every pair of ranks.
    JacclMesh,
    /// JACCL's ring: `JacclCommunicator::ring`, `--conns` cables (MLX's C) per neighbour.
    JacclRing,
}

/// The names of the backends.
impl Backend {
    /// The backend named `s` on the command line.
    fn parse(s: &str) -> Result<Self> {
        Ok(match s {
            "ring" => Backend::Ring,
            "jaccl" => Backend::JacclMesh,
            "jaccl-ring" => Backend::JacclRing,
            other => {
                return Err(format!("no backend {other:?} (ring, jaccl or jaccl-ring)").into());
            }
        })
    }

    /// The backend's command-line name.
    fn name(self) -> &'static str {
        match self {
            Backend::Ring => "ring",
            Backend::JacclMesh => "jaccl",
            Backend::JacclRing => "jaccl-ring",
        }
    }

    /// What the tables call its algorithms.
    fn label(self) -> &'static str {
        match self {
            Backend::Ring => "ring",
            Backend::JacclMesh => "jaccl mesh",
            Backend::JacclRing => "jaccl ring",
        }
    }
}

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
    /// `--backend`: whose algorithms.
    backend: Backend,
    /// `--ranks`: local ranks to start (or simulate).
    ranks: usize,
    /// `--conns`: connections (ring) or cables (JACCL's ring) per neighbour; 1 for the mesh.
    conns: usize,
    /// `--fabric sim`.
    sim: bool,
    /// `--op`.
    op: Op,
    /// `--dtype`.
    dtype: DType,
    /// `--sizes` (and `--step`), in bytes.
    sizes: Vec<usize>,
    /// `--iters`, else per size.
    iters: Option<usize>,
    /// `--warmup`, else per size.
    warmup: Option<usize>,
    /// `--agg`.
    agg: Agg,
    /// `--pingpong`: bytes of the round trip, 0 for none.
    pingpong: usize,
    /// Whether to time the wire (not `--no-wire`).
    wire: bool,
    /// `--timeout`: the deadline of every operation.
    timeout: Duration,
    /// `--spin`: how long a waiting TCP step keeps looking before it parks.
    spin: Duration,
}

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
            backend: Backend::Ring,
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
            spin: nuvec_distributed::DEFAULT_SPIN,
        };
        let mut sizes: Option<String> = None;
        let mut step = 4usize;
        let mut it = args.into_iter();
        while let Some(arg) = it.next() {
            let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value\n{USAGE}"));
            match arg.as_str() {
                // `cargo bench` passes `--bench` to every harness-less bench.
                "--bench" => {}
                "--backend" => a.backend = Backend::parse(&value("--backend")?)?,
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
                "--spin" => a.spin = Duration::from_micros(value("--spin")?.parse()?),
                "-h" | "--help" => return Err(USAGE.into()),
                other => return Err(format!("unknown argument {other:?}\n{USAGE}").into()),
            }
        }
        a.ranks = a.ranks.max(1);
        a.conns = a.conns.max(1);
        match a.backend {
            Backend::Ring => {}
            Backend::JacclMesh if !(2..=MESH_MAX_PEERS).contains(&a.ranks) => {
                return Err(format!(
                    "a JACCL mesh has 2 to {MESH_MAX_PEERS} ranks (MLX's limit), not {}",
                    a.ranks
                )
                .into());
            }
            Backend::JacclMesh => a.conns = 1,
            Backend::JacclRing if a.ranks < 2 => {
                return Err("a JACCL ring needs at least 2 ranks".into());
            }
            Backend::JacclRing if a.conns > RING_MAX_CONNS => {
                return Err(format!(
                    "a JACCL ring has 1 to {RING_MAX_CONNS} cables per neighbour (MLX's limit), not {}",
                    a.conns
                )
                .into());
            }
            Backend::JacclRing => {}
        }
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

    /// Untimed iterations before them (at most 2 in simulation).
    fn warmup(&self, iters: usize) -> usize {
        let warmup = self.warmup.unwrap_or((iters / 10).clamp(2, 50));
        if self.sim { warmup.min(2) } else { warmup }
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
        _ => unreachable!("no such dtype in reduce::DTYPES"),
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
    /// The median.
    p50: f64,
    /// The 99th percentile (nearest rank).
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
    /// Bytes moved (an all-gather's gathered total).
    bytes: usize,
    /// The iterations' times.
    stats: Stats,
    /// Whether every rank's result was exact; `None` for the wire, which checks nothing.
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
    let cabling = match args.backend {
        Backend::Ring => format!("{} connection(s) per neighbour", args.conns),
        Backend::JacclMesh => "one cable per pair of ranks, small frames".into(),
        Backend::JacclRing => format!("{} cable(s) per neighbour, small frames", args.conns),
    };
    println!(
        "# nuvec-distributed {}: {} of {}, {n} ranks, {cabling}, fabric {fabric}",
        args.backend.label(),
        args.op.name(),
        args.dtype.name(),
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

/// Prints the table of the communicator's rows, with each row's busbw as a percentage of the wire
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
    // JACCL also reads its rank from `JACCL_RANK`.
    let is_rank = std::env::var_os("MLX_RANK").is_some()
        || (args.backend != Backend::Ring && std::env::var_os("JACCL_RANK").is_some());
    let result = if args.sim {
        run_sim(&args)
    } else if is_rank {
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

/// The launch variables of both backends, removed from the local ranks' environment before
/// their own are set (JACCL's `JACCL_*` names would win over the `MLX_*` ones).
const LAUNCH_VARS: [&str; 8] = [
    "MLX_HOSTFILE",
    "MLX_IBV_DEVICES",
    "MLX_JACCL_COORDINATOR",
    "MLX_JACCL_RING",
    "JACCL_RANK",
    "JACCL_IBV_DEVICES",
    "JACCL_COORDINATOR",
    "JACCL_RING",
];

/// Starts `args.ranks` copies of this program as the ranks of a loopback job of
/// `args.backend` (a hostfile for the ring; a device file and a coordinator for JACCL),
/// forwards the command line, and waits; kills the others when one fails.
fn launch(args: &Args) -> Result<()> {
    let path =
        std::env::temp_dir().join(format!("nuvec-bench-allreduce-{}.json", std::process::id()));
    let env: Vec<(&str, OsString)> = match args.backend {
        Backend::Ring => {
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
            std::fs::write(&path, hostfile::write(&nodes))?;
            vec![("MLX_HOSTFILE", path.clone().into())]
        }
        Backend::JacclMesh | Backend::JacclRing => {
            let ring = args.backend == Backend::JacclRing;
            std::fs::write(&path, device_file(args.ranks, ring.then_some(args.conns)))?;
            // Rank 0 listens there for the side channel (with SO_REUSEADDR).
            let coordinator = TcpListener::bind("127.0.0.1:0")?.local_addr()?.to_string();
            let mut env = vec![
                ("MLX_IBV_DEVICES", path.clone().into()),
                ("MLX_JACCL_COORDINATOR", coordinator.into()),
            ];
            if ring {
                env.push(("MLX_JACCL_RING", "1".into()));
            }
            env
        }
    };
    let exe = std::env::current_exe()?;
    let mut children: Vec<Child> = (0..args.ranks)
        .map(|r| {
            let mut command = Command::new(&exe);
            command.args(std::env::args().skip(1));
            for var in LAUNCH_VARS {
                command.env_remove(var);
            }
            command
                .envs(env.iter().map(|(k, v)| (k, v)))
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

/// A JACCL device file (`MLX_IBV_DEVICES`) for `ranks` local ranks: a mesh, one device
/// between every pair, or with `Some(cables)` a ring of that many devices between neighbours.
/// Over TCP no device is opened, so the names only have to agree between the two ends.
fn device_file(ranks: usize, ring: Option<usize>) -> String {
    let cable = |a: usize, b: usize, c: usize| {
        serde_json::Value::from(format!("loop{}to{}.{c}", a.min(b), a.max(b)))
    };
    let entry = |a: usize, b: usize| {
        let next = |x: usize| (x + 1) % ranks;
        match ring {
            _ if a == b => serde_json::Value::Null,
            None => cable(a, b, 0),
            Some(cables) if next(a) == b || next(b) == a => {
                (0..cables).map(|c| cable(a, b, c)).collect()
            }
            Some(_) => serde_json::Value::Null,
        }
    };
    let matrix: serde_json::Value = (0..ranks)
        .map(|a| {
            (0..ranks)
                .map(|b| entry(a, b))
                .collect::<serde_json::Value>()
        })
        .collect();
    matrix.to_string()
}

// ---------------------------------------------------------------------------------------------
// The communicators and the clock
// ---------------------------------------------------------------------------------------------

/// What the bench times, as MLX's ring and JACCL both provide it (their `try_*` methods).
trait Collectives {
    /// This rank.
    fn rank(&self) -> usize;
    /// The number of ranks.
    fn size(&self) -> usize;
    /// All-reduces `data` in place.
    fn all_reduce(&self, op: Reduction, dtype: DType, data: &mut [u8]) -> Result<()>;
    /// Gathers every rank's `input` into `output`, in rank order.
    fn all_gather(&self, input: &[u8], output: &mut [u8]) -> Result<()>;
    /// Sends `data` to rank `dst`.
    fn send(&self, dst: usize, data: &[u8]) -> Result<()>;
    /// Receives `data` from rank `src`.
    fn recv(&self, src: usize, data: &mut [u8]) -> Result<()>;
}

/// MLX's ring over any fabric.
impl<F: Fabric> Collectives for RingCommunicator<F> {
    fn rank(&self) -> usize {
        self.topology().rank()
    }

    fn size(&self) -> usize {
        self.topology().size()
    }

    fn all_reduce(&self, op: Reduction, dtype: DType, data: &mut [u8]) -> Result<()> {
        Ok(self.try_all_reduce(op, dtype, data)?)
    }

    fn all_gather(&self, input: &[u8], output: &mut [u8]) -> Result<()> {
        Ok(self.try_all_gather(input, output)?)
    }

    fn send(&self, dst: usize, data: &[u8]) -> Result<()> {
        Ok(self.try_send(dst, data)?)
    }

    fn recv(&self, src: usize, data: &mut [u8]) -> Result<()> {
        Ok(self.try_recv(src, data)?)
    }
}

/// JACCL's mesh or ring over any fabric.
impl<F: Fabric> Collectives for JacclCommunicator<F> {
    fn rank(&self) -> usize {
        self.layout().rank()
    }

    fn size(&self) -> usize {
        self.layout().size()
    }

    fn all_reduce(&self, op: Reduction, dtype: DType, data: &mut [u8]) -> Result<()> {
        Ok(self.try_all_reduce(op, dtype, data)?)
    }

    fn all_gather(&self, input: &[u8], output: &mut [u8]) -> Result<()> {
        Ok(self.try_all_gather(input, output)?)
    }

    fn send(&self, dst: usize, data: &[u8]) -> Result<()> {
        Ok(self.try_send(dst, data)?)
    }

    fn recv(&self, src: usize, data: &mut [u8]) -> Result<()> {
        Ok(self.try_recv(src, data)?)
    }
}

/// Where the times of the iterations are read.
#[derive(Clone, Debug)]
enum Clock {
    /// This machine's monotonic clock (seconds since this instant), and this process's CPU
    /// time.
    Wall(Instant),
    /// The simulator's virtual clock; no CPU time (every simulated rank is a thread of this
    /// process).
    Virtual(SimClock),
}

/// Reading the clock.
impl Clock {
    /// Seconds since the clock's start.
    fn now(&self) -> f64 {
        match self {
            Clock::Wall(start) => start.elapsed().as_secs_f64(),
            Clock::Virtual(clock) => clock.now().as_secs_f64(),
        }
    }

    /// CPU seconds this rank has run (all its threads), NaN where unknown.
    fn cpu(&self) -> f64 {
        match self {
            Clock::Wall(_) => cpu_time(),
            Clock::Virtual(_) => f64::NAN,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Measuring, on any communicator
// ---------------------------------------------------------------------------------------------

/// The barrier before every timed iteration: a 1-byte all_sum.
fn barrier(comm: &impl Collectives) -> Result<()> {
    let mut b = [0u8; 1];
    comm.all_reduce(Reduction::Sum, DType::U8, &mut b)
}

/// Runs `op` `warmup` times, then `iters` times each after a barrier and timed on `clock`,
/// and combines every rank's times per iteration as `agg` says.
fn measure(
    comm: &impl Collectives,
    clock: &Clock,
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
        let cpu_start = clock.cpu();
        let start = clock.now();
        op()?;
        times.push(clock.now() - start);
        cpu += clock.cpu() - cpu_start;
    }
    let n = comm.size() as f64;
    let mut cpu_bytes = (cpu / iters as f64).to_le_bytes();
    comm.all_reduce(Reduction::Sum, DType::F64, &mut cpu_bytes)?;
    let mut bytes: Vec<u8> = times.iter().flat_map(|t| t.to_le_bytes()).collect();
    let reduction = match agg {
        Agg::Max => Reduction::Max,
        Agg::Mean | Agg::Rank0 => Reduction::Sum,
    };
    comm.all_reduce(reduction, DType::F64, &mut bytes)?;
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
fn everyone(comm: &impl Collectives, ok: bool) -> Result<bool> {
    let mut b = [u8::from(ok)];
    comm.all_reduce(Reduction::Min, DType::U8, &mut b)?;
    Ok(b[0] == 1)
}

/// What one rank measured.
struct Measured {
    /// The communicator's row of every size.
    rows: Vec<Row>,
    /// The wire's row of every size, when there is a wire.
    wire_rows: Vec<Option<Row>>,
    /// The round trips over the wire and over the communicator, when there is a wire and
    /// `--pingpong` is not 0.
    pingpong: Option<(Stats, Stats)>,
}

/// Times every size of `args.sizes` on `comm` (and on `wire`), then the round trips.
fn measure_all(
    args: &Args,
    comm: &impl Collectives,
    clock: &Clock,
    mut wire: Option<&mut Wire>,
) -> Result<Measured> {
    let mut rows = Vec::new();
    let mut wire_rows = Vec::new();
    for &size in &args.sizes {
        let (row, wire_row) = measure_size(args, comm, clock, wire.as_deref_mut(), size)?;
        rows.push(row);
        wire_rows.push(wire_row);
    }
    let pingpong = match (wire, args.pingpong) {
        (Some(w), bytes) if bytes > 0 => Some(measure_pingpong(args, comm, clock, w, bytes)?),
        _ => None,
    };
    Ok(Measured {
        rows,
        wire_rows,
        pingpong,
    })
}

/// Times `args.op` on `size` bytes over the communicator, checks it, and times the wire's
/// equivalent.
fn measure_size(
    args: &Args,
    comm: &impl Collectives,
    clock: &Clock,
    wire: Option<&mut Wire>,
    size: usize,
) -> Result<(Row, Option<Row>)> {
    let (rank, n) = (comm.rank(), comm.size());
    let iters = args.iters(size);
    let warmup = args.warmup(iters);
    let es = args.dtype.size();
    let (bytes, stats, ok) = match args.op {
        Op::AllReduce(reduction) => {
            let bytes = size / es * es;
            let mut data = vec![0u8; bytes];
            fill(args.dtype, rank, n, &mut data);
            let stats = measure(comm, clock, warmup, iters, args.agg, || {
                comm.all_reduce(reduction, args.dtype, &mut data)
            })?;
            fill(args.dtype, rank, n, &mut data);
            comm.all_reduce(reduction, args.dtype, &mut data)?;
            let ok = check_reduced(reduction, args.dtype, n, &data);
            (bytes, stats, ok)
        }
        Op::AllGather => {
            let per = size / n / es * es;
            let input = gather_input(rank, per);
            let mut output = vec![0u8; per * n];
            let stats = measure(comm, clock, warmup, iters, args.agg, || {
                comm.all_gather(&input, &mut output)
            })?;
            output.fill(0);
            comm.all_gather(&input, &mut output)?;
            (per * n, stats, check_gathered(n, &output))
        }
        Op::SendRecv => {
            let mut data = vec![0u8; size];
            // Rank 0 times the whole round trip; the others only part of it.
            let stats = measure(comm, clock, warmup, iters, Agg::Rank0, || {
                pingpong(comm, &mut data)
            })?;
            let ok = match rank {
                0 => {
                    let sent = gather_input(0, size);
                    comm.send(1, &sent)?;
                    comm.recv(1, &mut data)?;
                    data == sent
                }
                1 => {
                    comm.recv(0, &mut data)?;
                    comm.send(0, &data)?;
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
                    measure(comm, clock, warmup, iters, args.agg, || {
                        w.ring(2 * (n - 1), seg)
                    })?
                }
                Op::AllGather => {
                    let seg = bytes / n;
                    measure(comm, clock, warmup, iters, args.agg, || w.ring(n - 1, seg))?
                }
                Op::SendRecv => measure(comm, clock, warmup, iters, Agg::Rank0, || {
                    w.pingpong(rank, bytes)
                })?,
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

/// A round trip of `data` between ranks 0 and 1 over the communicator's
/// `try_send`/`try_recv`.
fn pingpong(comm: &impl Collectives, data: &mut [u8]) -> Result<()> {
    match comm.rank() {
        0 => {
            comm.send(1, data)?;
            comm.recv(1, data)?;
        }
        1 => {
            comm.recv(0, data)?;
            comm.send(0, data)?;
        }
        _ => {}
    }
    Ok(())
}

/// Round trips of `bytes` between ranks 0 and 1: over the wire, and over the communicator.
fn measure_pingpong(
    args: &Args,
    comm: &impl Collectives,
    clock: &Clock,
    wire: &mut Wire,
    bytes: usize,
) -> Result<(Stats, Stats)> {
    let rank = comm.rank();
    let iters = args.iters(bytes);
    let warmup = args.warmup(iters);
    let wire_rtt = measure(comm, clock, warmup, iters, Agg::Rank0, || {
        wire.pingpong(rank, bytes)
    })?;
    let mut data = vec![0u8; bytes];
    let comm_rtt = measure(comm, clock, warmup, iters, Agg::Rank0, || {
        pingpong(comm, &mut data)
    })?;
    Ok((wire_rtt, comm_rtt))
}

// ---------------------------------------------------------------------------------------------
// One rank over TCP
// ---------------------------------------------------------------------------------------------

/// One rank of a TCP job of `args.backend`.
fn run_rank(args: &Args) -> Result<()> {
    match args.backend {
        Backend::Ring => run_ring_rank(args),
        Backend::JacclMesh | Backend::JacclRing => run_jaccl_rank(args),
    }
}

/// One rank of MLX's ring: joins it from `MLX_HOSTFILE`/`MLX_RANK`, then [`tcp_rank`] with
/// the wire on this rank's first hostfile address.
fn run_ring_rank(args: &Args) -> Result<()> {
    let path = std::env::var("MLX_HOSTFILE").map_err(|_| {
        if std::env::var_os("MLX_IBV_DEVICES").is_some() {
            "MLX_RANK is set but MLX_HOSTFILE is not (MLX_IBV_DEVICES is: a JACCL job? pass --backend jaccl or jaccl-ring)"
        } else {
            "MLX_RANK is set but MLX_HOSTFILE is not"
        }
    })?;
    let rank: usize = std::env::var("MLX_RANK")?
        .parse()
        .map_err(|_| "MLX_RANK is not a number")?;
    let nodes = hostfile::read(Path::new(&path))?;
    let options = Options::default().timeout(args.timeout).spin(args.spin);
    let group = connect_ring(&nodes, rank, &options)?;
    let comm = group
        .communicator()
        .ok_or("the bench needs a ring of at least 2 ranks")?;
    let mut args = args.clone();
    args.conns = comm.topology().conns();
    let (host, _) = hostfile::split_address(&nodes[rank][0])?;
    tcp_rank(&args, comm, &host, "tcp")?;
    group.close();
    Ok(())
}

/// One rank of a JACCL job over TCP: reads the job as JACCL does (`MLX_RANK`,
/// `MLX_IBV_DEVICES`, `MLX_JACCL_COORDINATOR`, `MLX_JACCL_RING`), connects every cable as a
/// TCP connection through the side channel, builds the mesh or ring the device file gives
/// (which must be the one `--backend` names), then [`tcp_rank`] with the wire on the side
/// channel's interface.
fn run_jaccl_rank(args: &Args) -> Result<()> {
    let config = jaccl::Config::from_env()?.ok_or(
        "JACCL needs MLX_IBV_DEVICES (the device file), MLX_RANK and MLX_JACCL_COORDINATOR",
    )?;
    config.validate()?;
    let wires = match (args.backend, config.topology()?) {
        (Backend::JacclMesh, Topology::Mesh) => None,
        (Backend::JacclRing, Topology::Ring { wires }) => Some(wires),
        (backend, topology) => {
            let found = match topology {
                Topology::Mesh => "a mesh".to_string(),
                Topology::Ring { wires } => format!("a ring of {wires} cable(s) per neighbour"),
            };
            return Err(format!(
                "--backend {} but the device file and MLX_JACCL_RING give {found} (--backend jaccl times the mesh, jaccl-ring the ring)",
                backend.name()
            )
            .into());
        }
    };
    let coordinator = config
        .coordinator_address()
        .ok_or("no MLX_JACCL_COORDINATOR")?;
    let mut side = SideChannel::connect(coordinator, config.rank(), config.size(), args.timeout)?;
    let (fabric, _) = jaccl::tcp::connect(&config, &mut side, args.timeout)?;
    let fabric = fabric.with_spin(args.spin);
    let host = side
        .local_ip()
        .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
        .to_string();
    drop(side);
    let (rule, timeout) = (FrameRule::Small, args.timeout);
    let mut args = args.clone();
    let comm = match wires {
        None => JacclCommunicator::mesh(fabric, rule, timeout),
        Some(wires) => {
            args.conns = wires;
            JacclCommunicator::ring(fabric, wires, rule, timeout)
        }
    };
    tcp_rank(&args, &comm, &host, "tcp (one TCP connection per cable)")?;
    drop(comm.close());
    Ok(())
}

/// One rank of a TCP job over `comm`: connects the wire (listening on `host`), measures every
/// size, and prints the tables on rank 0 (`fabric` in the header).
fn tcp_rank(args: &Args, comm: &impl Collectives, host: &str, fabric: &str) -> Result<()> {
    let (rank, n) = (comm.rank(), comm.size());
    let mut wire = if args.wire {
        Some(Wire::connect(comm, host)?)
    } else {
        None
    };
    if rank == 0 {
        print_header(args, n, fabric);
    }
    let clock = Clock::Wall(Instant::now());
    let measured = measure_all(args, comm, &clock, wire.as_mut())?;
    if rank == 0 {
        print_rows(args, n, &measured.rows, &measured.wire_rows);
        if let Some(w) = wire.as_ref() {
            print_wire(args, n, w, &measured.wire_rows);
        }
        if let Some((wire_rtt, comm_rtt)) = measured.pingpong {
            print_pingpong(args, &measured.rows, args.pingpong, wire_rtt, comm_rtt);
        }
    }
    if let Some(w) = wire {
        w.close();
    }
    Ok(())
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

/// Prints the round trips (over the wire and over the communicator), and the op of the same
/// size as a multiple of the wire's.
fn print_pingpong(args: &Args, rows: &[Row], bytes: usize, wire: Stats, comm: Stats) {
    println!(
        "# ping-pong: {bytes} bytes rank 0 → 1 → 0, round trip timed by rank 0, p50 / p99 (µs): wire {:.1} / {:.1}, {} try_send+try_recv {:.1} / {:.1}",
        wire.p50 * 1e6,
        wire.p99 * 1e6,
        args.backend.label(),
        comm.p50 * 1e6,
        comm.p99 * 1e6
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
    /// Write this many bytes.
    Write(usize),
    /// Stop the thread.
    Stop,
}

/// A thread that writes to the right neighbour while the calling thread reads from the left.
struct Writer {
    /// Where the jobs go.
    jobs: mpsc::Sender<Job>,
    /// How each write ended.
    done: mpsc::Receiver<std::io::Result<()>>,
    /// The thread.
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
    /// To the right neighbour (opened by this rank).
    right: TcpStream,
    /// From the left neighbour (accepted by this rank).
    left: TcpStream,
    /// Writes large steps to `right`.
    writer: Writer,
    /// What small steps write.
    send: Vec<u8>,
    /// Where steps and round trips read (through [`placed`]).
    recv: Vec<u8>,
}

/// `len` bytes of `buf` (grown as needed) starting one cache line past a page boundary: the
/// wire is the machine's limit, so it reads where the kernel's receive copy is fastest (on
/// some x86 cores that copy runs at half speed into a destination in a page's first cache
/// line, which is where a large heap buffer starts; see the TCP fabric's scratch).
fn placed(buf: &mut Vec<u8>, len: usize) -> &mut [u8] {
    const PAGE: usize = 4096;
    const LINE: usize = 64;
    if buf.len() < len + PAGE + LINE {
        buf.resize(len + PAGE + LINE, 0);
    }
    let start = buf.as_ptr().align_offset(PAGE).min(PAGE - 1) + LINE;
    &mut buf[start..start + len]
}

/// Connecting and running the wire.
impl Wire {
    /// Connects the wire ring: every rank listens on a fresh port of `host` (its own
    /// address), the listeners' addresses are all-gathered over `comm`, and every rank
    /// connects to its right neighbour's and accepts its left neighbour's.
    fn connect(comm: &impl Collectives, host: &str) -> Result<Self> {
        let (rank, n) = (comm.rank(), comm.size());
        let listener = TcpListener::bind((host, 0))?;
        let mut addresses = vec![0u8; jaccl::tcp::ADDRESS * n];
        comm.all_gather(
            &jaccl::tcp::encode_address(listener.local_addr()?),
            &mut addresses,
        )?;
        let right_rank = (rank + 1) % n;
        let right_address = jaccl::tcp::decode_address(
            &addresses[jaccl::tcp::ADDRESS * right_rank..jaccl::tcp::ADDRESS * (right_rank + 1)],
        );
        // The listener's backlog takes the connection before anyone accepts.
        let right = TcpStream::connect(right_address)?;
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
        if seg <= INLINE_STEP && self.send.len() < seg {
            self.send.resize(seg, 0xa5);
        }
        for _ in 0..steps {
            if seg <= INLINE_STEP {
                self.right.write_all(&self.send[..seg])?;
                self.left.read_exact(placed(&mut self.recv, seg))?;
            } else {
                self.writer.jobs.send(Job::Write(seg))?;
                self.left.read_exact(placed(&mut self.recv, seg))?;
                self.writer.done.recv()??;
            }
        }
        Ok(())
    }

    /// A round trip of `bytes` between ranks 0 and 1 over the socket rank 0 opened to rank 1.
    fn pingpong(&mut self, rank: usize, bytes: usize) -> Result<()> {
        let buf = placed(&mut self.recv, bytes);
        match rank {
            0 => {
                self.right.write_all(buf)?;
                self.right.read_exact(buf)?;
            }
            1 => {
                self.left.read_exact(buf)?;
                self.left.write_all(buf)?;
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

/// Runs every rank in this process over the simulator (the ring over its stream channels,
/// JACCL over its UC message channels) and prints rank 0's virtual times.
fn run_sim(args: &Args) -> Result<()> {
    let n = args.ranks.max(2);
    let mut args = args.clone();
    args.ranks = n;
    args.agg = Agg::Rank0;
    let (sim, fabric) = match args.backend {
        Backend::Ring => (
            Sim::ring(n, args.conns),
            "sim (virtual time: 5 ± 5 µs latency, 10 GB/s per link)",
        ),
        Backend::JacclMesh => (
            Sim::mesh(n),
            "sim (UC message channels, virtual time: 5 ± 5 µs latency, 10 GB/s per link)",
        ),
        Backend::JacclRing => (
            Sim::jaccl_ring(n, args.conns),
            "sim (UC message channels, virtual time: 5 ± 5 µs latency, 10 GB/s per link)",
        ),
    };
    let started = Instant::now();
    let report = sim.run(|fabric| sim_rank(&args, fabric));
    let wall = started.elapsed();
    let mut rows = Vec::new();
    for (r, outcome) in report.outcomes.into_iter().enumerate() {
        match outcome.returned() {
            Some(Ok(rank_rows)) if r == 0 => rows = rank_rows,
            Some(Ok(_)) => {}
            Some(Err(e)) => return Err(format!("simulated rank {r}: {e}").into()),
            None => return Err(format!("simulated rank {r} panicked or crashed").into()),
        }
    }
    print_header(&args, n, fabric);
    print_rows(&args, n, &rows, &[]);
    println!(
        "# simulated end time {:?}, seed {}",
        report.end, report.seed
    );
    // The simulator's own speed: every byte any rank put on a simulated wire (warm-up,
    // barriers and timed iterations) over the wall-clock time of the whole run.
    println!(
        "# simulator speed: {:.1} MB of payload in {:.3} s of wall-clock time = {:.0} MB/s",
        report.payload as f64 / 1e6,
        wall.as_secs_f64(),
        report.payload as f64 / 1e6 / wall.as_secs_f64()
    );
    Ok(())
}

/// One simulated rank: the communicator of `args.backend` over its fabric, timed on the
/// virtual clock, with no wire; its rows (every rank's check included in each).
fn sim_rank(args: &Args, fabric: SimFabric) -> Result<Vec<Row>> {
    let clock = Clock::Virtual(fabric.clock());
    let (rule, timeout) = (FrameRule::Small, args.timeout);
    let measured = match args.backend {
        Backend::Ring => {
            let comm = RingCommunicator::new(fabric, args.conns, timeout);
            measure_all(args, &comm, &clock, None)?
        }
        Backend::JacclMesh => {
            let comm = JacclCommunicator::mesh(fabric, rule, timeout);
            measure_all(args, &comm, &clock, None)?
        }
        Backend::JacclRing => {
            let comm = JacclCommunicator::ring(fabric, args.conns, rule, timeout);
            measure_all(args, &comm, &clock, None)?
        }
    };
    Ok(measured.rows)
}
