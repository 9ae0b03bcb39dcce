//! Ring cases: what a case is (ranks, links, the simulator's network, operations, a fault),
//! its one-line text form for replay, and the proptest strategies that draw cases.

use super::*;

// =============================================================================================
// Cases and their text form
// =============================================================================================

/// One operation every rank issues.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Op {
    /// `all_sum` / `all_max` / `all_min` of `n` elements.
    Reduce {
        op: Reduction,
        dtype: DType,
        n: usize,
    },
    /// `all_gather` of `n` bytes per rank.
    Gather { n: usize },
    /// Every rank sends `n` bytes to its right (or left) neighbour and receives `n` from the
    /// other one; even ranks send first, odd ranks receive first (MLX's `test_send_recv`).
    SendRecv { leftward: bool, n: usize },
}

/// A fault, with times as thousandths of the fault-free run's duration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum FaultSpec {
    /// `Fault::Crash`: `rank` crashes at its fabric call number `call`.
    Crash { rank: usize, call: u64 },
    /// `Fault::CrashAt`.
    CrashAt { rank: usize, permille: u64 },
    /// `Fault::Stall` for `secs` seconds (longer than the timeout).
    Stall {
        rank: usize,
        permille: u64,
        secs: u64,
    },
    /// `Fault::Cut` of `rank`'s `left[link]` or `right[link]`.
    Cut {
        rank: usize,
        leftside: bool,
        link: usize,
        permille: u64,
    },
}

/// One simulated job and what it runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Case {
    pub(super) ranks: usize,
    pub(super) links: usize,
    /// The simulator's seed, and the seed of the inputs.
    pub(super) seed: u64,
    pub(super) frag: usize,
    pub(super) window: usize,
    pub(super) latency_ns: u64,
    pub(super) jitter_ns: u64,
    pub(super) ops: Vec<Op>,
    pub(super) fault: Option<FaultSpec>,
}

pub(super) fn reduction_name(op: Reduction) -> &'static str {
    match op {
        Reduction::Sum => "all_sum",
        Reduction::Max => "all_max",
        Reduction::Min => "all_min",
    }
}

pub(super) fn dtype_named(name: &str) -> Result<DType, String> {
    DTYPES
        .iter()
        .copied()
        .find(|d| d.name() == name)
        .ok_or_else(|| format!("unknown dtype {name:?}"))
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Reduce { op, dtype, n } => {
                write!(f, "{}:{}:{n}", reduction_name(*op), dtype.name())
            }
            Op::Gather { n } => write!(f, "all_gather:{n}"),
            Op::SendRecv { leftward, n } => {
                write!(
                    f,
                    "send_recv:{}:{n}",
                    if *leftward { "left" } else { "right" }
                )
            }
        }
    }
}

impl FromStr for Op {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let parts: Vec<&str> = s.split(':').collect();
        let num = |x: &str| x.parse::<usize>().map_err(|e| format!("{x:?}: {e}"));
        match parts.as_slice() {
            [name @ ("all_sum" | "all_max" | "all_min"), dtype, n] => Ok(Op::Reduce {
                op: match *name {
                    "all_sum" => Reduction::Sum,
                    "all_max" => Reduction::Max,
                    _ => Reduction::Min,
                },
                dtype: dtype_named(dtype)?,
                n: num(n)?,
            }),
            ["all_gather", n] => Ok(Op::Gather { n: num(n)? }),
            ["send_recv", side @ ("left" | "right"), n] => Ok(Op::SendRecv {
                leftward: *side == "left",
                n: num(n)?,
            }),
            _ => Err(format!("bad op {s:?}")),
        }
    }
}

impl fmt::Display for FaultSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FaultSpec::Crash { rank, call } => write!(f, "crash:{rank}:{call}"),
            FaultSpec::CrashAt { rank, permille } => write!(f, "crash_at:{rank}:{permille}"),
            FaultSpec::Stall {
                rank,
                permille,
                secs,
            } => write!(f, "stall:{rank}:{permille}:{secs}"),
            FaultSpec::Cut {
                rank,
                leftside,
                link,
                permille,
            } => write!(
                f,
                "cut:{rank}:{}:{link}:{permille}",
                if *leftside { "left" } else { "right" }
            ),
        }
    }
}

impl FromStr for FaultSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let parts: Vec<&str> = s.split(':').collect();
        let num = |x: &str| x.parse::<u64>().map_err(|e| format!("{x:?}: {e}"));
        Ok(match parts.as_slice() {
            ["crash", r, c] => FaultSpec::Crash {
                rank: num(r)? as usize,
                call: num(c)?,
            },
            ["crash_at", r, p] => FaultSpec::CrashAt {
                rank: num(r)? as usize,
                permille: num(p)?,
            },
            ["stall", r, p, secs] => FaultSpec::Stall {
                rank: num(r)? as usize,
                permille: num(p)?,
                secs: num(secs)?,
            },
            ["cut", r, side @ ("left" | "right"), l, p] => FaultSpec::Cut {
                rank: num(r)? as usize,
                leftside: *side == "left",
                link: num(l)? as usize,
                permille: num(p)?,
            },
            _ => return Err(format!("bad fault {s:?}")),
        })
    }
}

impl fmt::Display for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ops: Vec<String> = self.ops.iter().map(ToString::to_string).collect();
        write!(
            f,
            "ranks={} links={} seed={} frag={} window={} latency={} jitter={} ops={} fault={}",
            self.ranks,
            self.links,
            self.seed,
            self.frag,
            self.window,
            self.latency_ns,
            self.jitter_ns,
            ops.join(","),
            self.fault
                .as_ref()
                .map_or("none".to_string(), ToString::to_string)
        )
    }
}

impl FromStr for Case {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let mut fields: BTreeMap<&str, &str> = BTreeMap::new();
        for word in s.split_whitespace() {
            let (k, v) = word
                .split_once('=')
                .ok_or_else(|| format!("expected key=value, got {word:?}"))?;
            fields.insert(k, v);
        }
        let get = |k: &str| {
            fields
                .get(k)
                .copied()
                .ok_or_else(|| format!("missing {k}="))
        };
        let num = |k: &str| -> Result<u64, String> {
            get(k)?.parse::<u64>().map_err(|e| format!("{k}: {e}"))
        };
        let ops = get("ops")?;
        let case = Case {
            ranks: num("ranks")? as usize,
            links: num("links")? as usize,
            seed: num("seed")?,
            frag: num("frag")? as usize,
            window: num("window")? as usize,
            latency_ns: num("latency")?,
            jitter_ns: num("jitter")?,
            ops: if ops.is_empty() {
                vec![]
            } else {
                ops.split(',').map(str::parse).collect::<Result<_, _>>()?
            },
            fault: match fields.get("fault").copied().unwrap_or("none") {
                "none" => None,
                f => Some(f.parse()?),
            },
        };
        if case.ranks == 0 || case.links == 0 {
            return Err("ranks and links must be at least 1".into());
        }
        Ok(case)
    }
}

pub(super) fn replay_line(case: &Case) -> String {
    format!(
        "replay: NUVEC_SIM_CASE='{case}' cargo test --ignore-rust-version --test sim ring::replays_a_case_from_the_environment -- --nocapture"
    )
}

/// The message of a failing property: what failed, the seed, and the replay command.
pub(super) fn failure(case: &Case, what: &str) -> TestCaseError {
    TestCaseError::fail(format!(
        "{what}\n  case: {case}\n  seed: {} (simulator and inputs)\n  {}\n",
        case.seed,
        replay_line(case)
    ))
}

// =============================================================================================
// Generating cases
// =============================================================================================

/// The simulator's network for a case, drawn from its seed: fragments 1 B..=64 KiB (log-
/// uniform, at least `min_frag`), windows 64 B..=1 MiB, latency and jitter 0..=50 µs.
pub(super) fn network(seed: u64, min_frag: usize, min_window: usize) -> (usize, usize, u64, u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5EED_F0AB_1C00);
    let k = rng.random_range(0..=16u32);
    let frag = rng
        .random_range((1usize << k)..=(1usize << (k + 1)).min(65_536))
        .max(min_frag);
    let w = rng.random_range(6..=19u32);
    let window = rng
        .random_range((1usize << w)..=(1usize << (w + 1)))
        .max(min_window);
    let latency = rng.random_range(0..=50_000u64);
    let jitter = rng.random_range(0..=50_000u64);
    (frag, window, latency, jitter)
}

/// A fault-free case; `min_frag` and `min_window` keep threshold-sized runs fast (the
/// simulator switches threads per fragment).
/// Network floors: any fragment and window, or those of threshold-sized runs.
pub(super) const ANY: (usize, usize) = (1, 64);
pub(super) const BIG: (usize, usize) = (4096, 256 * 1024);

pub(super) fn case_with(
    ranks: usize,
    links: usize,
    seed: u64,
    (min_frag, min_window): (usize, usize),
    ops: Vec<Op>,
) -> Case {
    // At most about 2048 fragments and 64 windows per rank's buffer: tiny fragments and
    // windows for small operations, and no run of hundreds of thousands of thread switches
    // for large ones.
    let largest = ops
        .iter()
        .map(|op| match *op {
            Op::Reduce { dtype, n, .. } => n * dtype.size(),
            Op::Gather { n } | Op::SendRecv { n, .. } => n,
        })
        .max()
        .unwrap_or(0);
    let min_frag = min_frag.max(largest / 2048);
    let (frag, window, latency_ns, jitter_ns) =
        network(seed, min_frag, min_window.max(min_frag).max(largest / 64));
    Case {
        ranks,
        links,
        seed,
        frag,
        window,
        latency_ns,
        jitter_ns,
        ops,
        fault: None,
    }
}

/// An element count of one of the classes of requirement 1: 0, 1, < R, = R, not a multiple
/// of R (with empty tail segments sometimes), or anything up to 3000.
pub(super) fn small_count(class: u8, ranks: usize, rng: &mut ChaCha8Rng) -> usize {
    match class {
        0 => 0,
        1 => 1,
        2 => rng
            .random_range(1..ranks.max(2))
            .min(ranks.saturating_sub(1))
            .max(usize::from(ranks == 1)),
        3 => ranks,
        4 => {
            let m = rng.random_range(1..=300usize);
            if ranks == 1 {
                m
            } else {
                m * ranks + rng.random_range(1..ranks)
            }
        }
        _ => rng.random_range(1..=3000usize),
    }
}

pub(super) fn small_reduce_case() -> impl Strategy<Value = Case> {
    (
        1usize..=9,
        1usize..=3,
        0usize..14,
        0usize..3,
        0u8..6,
        any::<u64>(),
    )
        .prop_map(|(ranks, links, d, o, class, seed)| {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let n = small_count(class, ranks, &mut rng);
            case_with(
                ranks,
                links,
                seed,
                ANY,
                vec![Op::Reduce {
                    op: OPS[o],
                    dtype: DTYPES[d],
                    n,
                }],
            )
        })
}

/// Sizes just below, at and just above MLX's split thresholds: N = m·R·256 KiB for an
/// all-reduce (m = 1, 2, 2C) and N = m·256 KiB for an all-gather, ± one element.
pub(super) fn big_case() -> impl Strategy<Value = Case> {
    (
        2usize..=4,
        1usize..=3,
        0usize..4,
        0usize..3,
        0usize..3,
        0usize..3,
        any::<u64>(),
    )
        .prop_map(|(ranks, links, kind, o, threshold, delta, seed)| {
            let m = [1, 2, 2 * links][threshold];
            let op = if kind == 3 {
                let n = (m * mlx_model::MIN_SEND_SIZE + delta).saturating_sub(1);
                Op::Gather { n }
            } else {
                let dtype = [DType::F32, DType::U8, DType::F64][kind];
                let s = dtype.size();
                let n = (m * ranks * mlx_model::MIN_SEND_SIZE / s + delta).saturating_sub(1);
                Op::Reduce {
                    op: OPS[o],
                    dtype,
                    n,
                }
            };
            case_with(ranks, links, seed, BIG, vec![op])
        })
}

pub(super) fn gather_count(class: u8, rng: &mut ChaCha8Rng) -> usize {
    match class {
        0 => 0,
        1 => rng.random_range(1..=16),
        2 => rng.random_range(17..=2000),
        _ => rng.random_range(2001..=20_000),
    }
}

pub(super) fn gather_case() -> impl Strategy<Value = Case> {
    (1usize..=9, 1usize..=3, 0u8..4, any::<u64>()).prop_map(|(ranks, links, class, seed)| {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let n = gather_count(class, &mut rng);
        case_with(ranks, links, seed, ANY, vec![Op::Gather { n }])
    })
}

/// Point-to-point sizes: 0, below 1024 (one socket), exactly 1024, C·1024 ± 1, larger.
pub(super) fn p2p_count(class: u8, links: usize, rng: &mut ChaCha8Rng) -> usize {
    match class {
        0 => 0,
        1 => rng.random_range(1..1024),
        2 => 1024,
        3 => links * 1024 + rng.random_range(0..=2) - 1,
        _ => rng.random_range(1025..=40_000),
    }
}

pub(super) fn send_recv_case() -> impl Strategy<Value = Case> {
    (2usize..=9, 1usize..=3, any::<bool>(), 0u8..5, any::<u64>()).prop_map(
        |(ranks, links, leftward, class, seed)| {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let n = p2p_count(class, links, &mut rng);
            case_with(ranks, links, seed, ANY, vec![Op::SendRecv { leftward, n }])
        },
    )
}

/// A random small operation for a ring of `ranks`.
pub(super) fn random_op(ranks: usize, links: usize, rng: &mut ChaCha8Rng) -> Op {
    let kinds = if ranks >= 2 { 3 } else { 2 };
    match rng.random_range(0..kinds) {
        0 => {
            let class = rng.random_range(0..6u8);
            Op::Reduce {
                op: OPS[rng.random_range(0..3)],
                dtype: DTYPES[rng.random_range(0..14)],
                n: small_count(class, ranks, rng),
            }
        }
        1 => {
            let class = rng.random_range(0..4u8);
            Op::Gather {
                n: gather_count(class, rng),
            }
        }
        _ => {
            let class = rng.random_range(0..5u8);
            Op::SendRecv {
                leftward: rng.random_bool(0.5),
                n: p2p_count(class, links, rng),
            }
        }
    }
}

pub(super) fn sequence_case() -> impl Strategy<Value = Case> {
    (1usize..=9, 1usize..=3, 2usize..=4, any::<u64>()).prop_map(|(ranks, links, count, seed)| {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let ops = (0..count)
            .map(|_| random_op(ranks, links, &mut rng))
            .collect();
        case_with(ranks, links, seed, ANY, ops)
    })
}

/// One or two operations big enough to take a while, and a crash, stall or cut.
pub(super) fn fault_case() -> impl Strategy<Value = Case> {
    (2usize..=9, 1usize..=3, 0u8..3, any::<u64>()).prop_map(|(ranks, links, kind, seed)| {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let count = rng.random_range(1..=2);
        let ops: Vec<Op> = (0..count)
            .map(|_| match rng.random_range(0..4) {
                0 | 1 => Op::Reduce {
                    op: OPS[rng.random_range(0..3)],
                    dtype: DTYPES[rng.random_range(0..14)],
                    n: rng.random_range(ranks..=6_000),
                },
                2 => Op::Gather {
                    n: rng.random_range(1..=6_000),
                },
                _ => Op::SendRecv {
                    leftward: rng.random_bool(0.5),
                    n: rng.random_range(1..=12_000),
                },
            })
            .collect();
        let rank = rng.random_range(0..ranks);
        let permille = rng.random_range(0..1000u64);
        let fault = match kind {
            0 => FaultSpec::Crash {
                rank,
                call: rng.random_range(0..2 * ranks as u64 + 2),
            },
            1 => FaultSpec::Stall {
                rank,
                permille,
                secs: rng.random_range(31..=90),
            },
            _ => FaultSpec::Cut {
                rank,
                leftside: rng.random_bool(0.5),
                link: rng.random_range(0..links),
                permille,
            },
        };
        let mut case = case_with(ranks, links, seed, (16, 64), ops);
        case.fault = Some(fault);
        case
    })
}
