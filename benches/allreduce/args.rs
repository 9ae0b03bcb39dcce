//! The command line: which backend, op, dtype, sizes and iterations (`--help` prints the
//! synopsis), and the per-size defaults of the iteration counts.

use std::time::Duration;

use nuvec_core::DType;
use nuvec_distributed::WireChoice;
use nuvec_distributed::jaccl::{MESH_MAX_PEERS, RING_MAX_CONNS};
use nuvec_distributed::reduce::{DTYPES, Reduction};

use crate::Result;

/// The command line's synopsis, printed with argument errors.
pub(crate) const USAGE: &str = "usage: allreduce [--backend ring|jaccl|jaccl-ring] [--ranks N] \
[--conns C] [--fabric tcp|rdma|sim] \
[--op all_sum|all_max|all_min|all_gather|sendrecv] [--dtype float32|...] \
[--sizes 4K..64M|4K,1M,...] [--step F] [--iters K] [--warmup W] [--agg mean|max|rank0] \
[--pingpong BYTES|0] [--no-wire] [--timeout SECS] [--spin US] [--tcp-only] \
[--ring-wire auto|mlx|nuvec] [--sim-link LATENCY_US,GBIT_PER_S,WINDOW]";

/// Whose algorithms are timed (`--backend`, by the names of MLX's launcher).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Backend {
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
    pub(crate) fn parse(s: &str) -> Result<Self> {
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
    pub(crate) fn name(self) -> &'static str {
        match self {
            Backend::Ring => "ring",
            Backend::JacclMesh => "jaccl",
            Backend::JacclRing => "jaccl-ring",
        }
    }

    /// What the tables call its algorithms.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Backend::Ring => "ring",
            Backend::JacclMesh => "jaccl mesh",
            Backend::JacclRing => "jaccl ring",
        }
    }
}

/// The collective being timed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
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
    pub(crate) fn parse(s: &str) -> Result<Self> {
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
    pub(crate) fn name(self) -> &'static str {
        match self {
            Op::AllReduce(Reduction::Sum) => "all_sum",
            Op::AllReduce(Reduction::Max) => "all_max",
            Op::AllReduce(Reduction::Min) => "all_min",
            Op::AllGather => "all_gather",
            Op::SendRecv => "sendrecv",
        }
    }

    /// nccl-tests' bus bandwidth factor for `n` ranks.
    pub(crate) fn bus_factor(self, n: usize) -> f64 {
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
pub(crate) enum Agg {
    /// The mean over the ranks (nccl-tests' default).
    Mean,
    /// The slowest rank.
    Max,
    /// Rank 0's own time.
    Rank0,
}

/// The command line.
#[derive(Clone, Debug)]
pub(crate) struct Args {
    /// `--backend`: whose algorithms.
    pub(crate) backend: Backend,
    /// `--ranks`: local ranks to start (or simulate).
    pub(crate) ranks: usize,
    /// `--conns`: connections (ring) or cables (JACCL's ring) per neighbour; 1 for the mesh.
    pub(crate) conns: usize,
    /// `--fabric sim`.
    pub(crate) sim: bool,
    /// `--op`.
    pub(crate) op: Op,
    /// `--dtype`.
    pub(crate) dtype: DType,
    /// `--sizes` (and `--step`), in bytes.
    pub(crate) sizes: Vec<usize>,
    /// `--iters`, else per size.
    pub(crate) iters: Option<usize>,
    /// `--warmup`, else per size.
    pub(crate) warmup: Option<usize>,
    /// `--agg`.
    pub(crate) agg: Agg,
    /// `--pingpong`: bytes of the round trip, 0 for none.
    pub(crate) pingpong: usize,
    /// Whether to time the wire (not `--no-wire`).
    pub(crate) wire: bool,
    /// `--timeout`: the deadline of every operation.
    pub(crate) timeout: Duration,
    /// `--spin`: how long a waiting step keeps looking before it parks, every time; `None`
    /// (the default): the wait adapts.
    pub(crate) spin: Option<Duration>,
    /// `--fabric rdma`: JACCL's cables are queue pairs of the RDMA fabric.
    pub(crate) rdma: bool,
    /// `--tcp-only`: the ring's links stay TCP between ranks on one machine too
    /// ([`Options::local_links`](nuvec_distributed::Options::local_links) off).
    pub(crate) tcp_only: bool,
    /// `--ring-wire`: which wire the ring may speak (`auto`, the default: the nuvec wire, every
    /// rank being this bench).
    pub(crate) ring_wire: WireChoice,
    /// `--sim-link`: the simulated link, instead of the simulator's default (5 ± 5 µs, 10 GB/s,
    /// 256 KiB windows).
    pub(crate) sim_link: Option<SimLink>,
}

/// A simulated link of `--sim-link LATENCY_US,GBIT_PER_S,WINDOW` (`250,50,4M`): a one-way
/// latency without jitter, the bandwidth of each direction, and the bytes in flight or unread
/// it allows (the socket buffers), so that a schedule's time can be set against a link's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct SimLink {
    /// One-way latency of every fragment.
    pub(crate) latency: Duration,
    /// Bytes per second of each direction.
    pub(crate) bytes_per_sec: u64,
    /// Bytes in flight or unread per direction.
    pub(crate) window: usize,
}

impl SimLink {
    /// Parses `LATENCY_US,GBIT_PER_S,WINDOW`.
    pub(crate) fn parse(s: &str) -> Result<Self> {
        let bad = || format!("--sim-link {s:?}: want LATENCY_US,GBIT_PER_S,WINDOW (250,50,4M)");
        let [latency, gbit, window] = s.split(',').collect::<Vec<_>>()[..] else {
            return Err(bad().into());
        };
        let latency: f64 = latency.trim().parse().map_err(|_| bad())?;
        let gbit: f64 = gbit.trim().parse().map_err(|_| bad())?;
        if !(latency >= 0.0 && gbit > 0.0) {
            return Err(bad().into());
        }
        Ok(SimLink {
            latency: Duration::from_secs_f64(latency / 1e6),
            bytes_per_sec: (gbit * 1e9 / 8.0) as u64,
            window: parse_bytes(window)?,
        })
    }
}

/// `4096`, `4K`, `1M`, `1G` (binary units).
pub(crate) fn parse_bytes(s: &str) -> Result<usize> {
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
pub(crate) fn parse_sizes(s: &str, step: usize) -> Result<Vec<usize>> {
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
    pub(crate) fn parse(args: impl IntoIterator<Item = String>) -> Result<Self> {
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
            spin: None,
            rdma: false,
            tcp_only: false,
            ring_wire: WireChoice::Auto,
            sim_link: None,
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
                    (a.sim, a.rdma) = match value("--fabric")?.as_str() {
                        "tcp" => (false, false),
                        "rdma" => (false, true),
                        "sim" => (true, false),
                        other => {
                            return Err(format!("no fabric {other:?} (tcp, rdma or sim)").into());
                        }
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
                "--tcp-only" => a.tcp_only = true,
                "--ring-wire" => {
                    a.ring_wire = match value("--ring-wire")?.as_str() {
                        "auto" => WireChoice::Auto,
                        "mlx" => WireChoice::Mlx,
                        "nuvec" => WireChoice::Nuvec,
                        other => {
                            return Err(format!("no wire {other:?} (auto, mlx or nuvec)").into());
                        }
                    }
                }
                "--sim-link" => a.sim_link = Some(SimLink::parse(&value("--sim-link")?)?),
                "--timeout" => a.timeout = Duration::from_secs_f64(value("--timeout")?.parse()?),
                "--spin" => a.spin = Some(Duration::from_micros(value("--spin")?.parse()?)),
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
        if a.rdma && a.backend == Backend::Ring {
            return Err("--fabric rdma is JACCL's: with --backend jaccl or jaccl-ring".into());
        }
        if a.sim_link.is_some() && !a.sim {
            return Err("--sim-link is the simulator's: with --fabric sim".into());
        }
        let default = if a.sim { "4K..4M" } else { "4K..64M" };
        a.sizes = parse_sizes(sizes.as_deref().unwrap_or(default), step)?;
        Ok(a)
    }

    /// Timed iterations for `bytes`: about 256 MiB of traffic, 10 to 500 (5 in simulation).
    pub(crate) fn iters(&self, bytes: usize) -> usize {
        self.iters.unwrap_or(if self.sim {
            5
        } else {
            ((256 << 20) / bytes.max(1)).clamp(10, 500)
        })
    }

    /// Untimed iterations before them (at most 2 in simulation).
    pub(crate) fn warmup(&self, iters: usize) -> usize {
        let warmup = self.warmup.unwrap_or((iters / 10).clamp(2, 50));
        if self.sim { warmup.min(2) } else { warmup }
    }
}
