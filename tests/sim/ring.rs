//! MLX's ring over the simulator: results, wire bytes, faults and determinism, property-tested.
//!
//! Every case runs whole rings of `RingCommunicator`s over `nuvec-fabric-sim` and checks them
//! against `tests/common/mlx_model.rs`, an independent model of MLX's `ring.cpp` (its own
//! split arithmetic, element reductions and socket choice; nothing from `src/ring` or
//! `src/collective/reduce/`):
//!
//! - **results**: every rank's all-reduce equals the model's fold in MLX's association order,
//!   bit for bit (NaN bits included, with the NaN rules `src/collective/reduce/` documents), and all
//!   ranks are bitwise equal; all-gather is the rank-order concatenation; send/recv deliver
//!   exactly;
//! - **wire**: with `record_wire(true)`, every `(sender, sender's channel)` stream equals,
//!   byte for byte, what MLX's C++ would write on that socket direction (for sequences of ops,
//!   the concatenation);
//! - **faults** (a crash at a fabric call, a stall longer than the timeout, a cut link): every
//!   live rank either returns a correct result or an `Error::Transport` naming a neighbour
//!   ("rank N"), by its deadline (virtual time), and its next operation fails at once with
//!   `Error::Failed` carrying the first error; the bytes that did go out are a prefix of MLX's;
//! - **determinism**: the same case and seed give the same trace hash, end time, outcomes and
//!   wire; another seed gives another trace hash.
//!
//! The simulator's fragment size (1 B..=64 KiB), window (64 B..=1 MiB), latency and jitter
//! (0..=50 µs each) are drawn per case from its seed, so fragmentation and cross-channel
//! reordering vary. Floors keep each run to at most ~2048 fragments and ~64 windows per rank's
//! buffer (the simulator switches threads per fragment), and threshold-sized runs use
//! fragments ≥ 4 KiB and windows ≥ 256 KiB.
//!
//! **Replay.** Every case has a one-line text form; a failing property prints it with a
//! command that reruns exactly that case with full output:
//!
//! ```text
//! NUVEC_SIM_CASE='ranks=4 links=2 seed=123 frag=17 window=4096 latency=5000 jitter=3000 ops=all_sum:float32:1000 fault=none' \
//!   cargo test --ignore-rust-version --test sim ring::replays_a_case_from_the_environment -- --nocapture
//! ```
//!
//! The text is `ranks= links= seed= frag= window= latency= jitter= ops= fault=`: `seed` seeds
//! both the simulator and the inputs; `ops` is a comma-separated list of
//! `all_sum|all_max|all_min:<dtype>:<elements>`, `all_gather:<bytes>` and
//! `send_recv:right|left:<bytes>`; `fault` is `none`, `crash:<rank>:<fabric call>`,
//! `crash_at:<rank>:<‰>`, `stall:<rank>:<‰>:<seconds>` or
//! `cut:<rank>:left|right:<link>:<‰>`, where ‰ is thousandths of the fault-free run's virtual
//! duration. (`NUVEC_SIM_SEED`, the simulator's own override, replaces every case's seed: do
//! not set it while running this file. `NUVEC_SIM_TIMING=1` prints each case's wall time.)
//!
//! **Case counts** (chosen so the file runs in well under a minute in debug on 2 cores):
//! small all-reduces 256, threshold-sized all-reduces and all-gathers 6, all-gathers 48,
//! send/recv 48, sequences 32, faults 40, determinism 12 (each run three times), model
//! self-checks 96, case-text round trips 64; plus fixed tests. About 20 s of test time on this
//! machine. Two tests are ignored, each naming its reason: an all-reduce of zero elements (an
//! open interop question) and `Fault::CrashAt` (the simulator hangs).

use crate::common::mlx_model;
use crate::common::values;

use std::cell::Cell;
use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::rc::Rc;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use nuvec_core::DType;
use nuvec_distributed::fabric::{Channel, ChannelKind, Fabric, FabricError, Transfer};
use nuvec_distributed::reduce::Reduction;
use nuvec_distributed::{Error, RingCommunicator};
use nuvec_fabric_sim::{Fault, Outcome, Report, SEED_VAR, Sim, SimFabric};
use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, FileFailurePersistence, TestCaseError};
use rand::{Rng, RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use mlx_model::{Lane, Wire};
use values::{DTYPES, OPS, typed_values};

/// The timeout of every operation.
const TIMEOUT: Duration = Duration::from_secs(30);
/// How late after its deadline (virtual time) a rank may return.
const SLACK: Duration = Duration::from_millis(1);
/// Wall-clock limit of one simulated run: a hang becomes a failure with a replay line.
const WATCHDOG: Duration = Duration::from_secs(120);

// =============================================================================================
// Cases and their text form
// =============================================================================================

/// One operation every rank issues.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Op {
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
enum FaultSpec {
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
struct Case {
    ranks: usize,
    links: usize,
    /// The simulator's seed, and the seed of the inputs.
    seed: u64,
    frag: usize,
    window: usize,
    latency_ns: u64,
    jitter_ns: u64,
    ops: Vec<Op>,
    fault: Option<FaultSpec>,
}

fn reduction_name(op: Reduction) -> &'static str {
    match op {
        Reduction::Sum => "all_sum",
        Reduction::Max => "all_max",
        Reduction::Min => "all_min",
    }
}

fn dtype_named(name: &str) -> Result<DType, String> {
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

fn replay_line(case: &Case) -> String {
    format!(
        "replay: NUVEC_SIM_CASE='{case}' cargo test --ignore-rust-version --test sim ring::replays_a_case_from_the_environment -- --nocapture"
    )
}

/// The message of a failing property: what failed, the seed, and the replay command.
fn failure(case: &Case, what: &str) -> TestCaseError {
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
fn network(seed: u64, min_frag: usize, min_window: usize) -> (usize, usize, u64, u64) {
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
const ANY: (usize, usize) = (1, 64);
const BIG: (usize, usize) = (4096, 256 * 1024);

fn case_with(
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
fn small_count(class: u8, ranks: usize, rng: &mut ChaCha8Rng) -> usize {
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

fn small_reduce_case() -> impl Strategy<Value = Case> {
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
fn big_case() -> impl Strategy<Value = Case> {
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

fn gather_count(class: u8, rng: &mut ChaCha8Rng) -> usize {
    match class {
        0 => 0,
        1 => rng.random_range(1..=16),
        2 => rng.random_range(17..=2000),
        _ => rng.random_range(2001..=20_000),
    }
}

fn gather_case() -> impl Strategy<Value = Case> {
    (1usize..=9, 1usize..=3, 0u8..4, any::<u64>()).prop_map(|(ranks, links, class, seed)| {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let n = gather_count(class, &mut rng);
        case_with(ranks, links, seed, ANY, vec![Op::Gather { n }])
    })
}

/// Point-to-point sizes: 0, below 1024 (one socket), exactly 1024, C·1024 ± 1, larger.
fn p2p_count(class: u8, links: usize, rng: &mut ChaCha8Rng) -> usize {
    match class {
        0 => 0,
        1 => rng.random_range(1..1024),
        2 => 1024,
        3 => links * 1024 + rng.random_range(0..=2) - 1,
        _ => rng.random_range(1025..=40_000),
    }
}

fn send_recv_case() -> impl Strategy<Value = Case> {
    (2usize..=9, 1usize..=3, any::<bool>(), 0u8..5, any::<u64>()).prop_map(
        |(ranks, links, leftward, class, seed)| {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let n = p2p_count(class, links, &mut rng);
            case_with(ranks, links, seed, ANY, vec![Op::SendRecv { leftward, n }])
        },
    )
}

/// A random small operation for a ring of `ranks`.
fn random_op(ranks: usize, links: usize, rng: &mut ChaCha8Rng) -> Op {
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

fn sequence_case() -> impl Strategy<Value = Case> {
    (1usize..=9, 1usize..=3, 2usize..=4, any::<u64>()).prop_map(|(ranks, links, count, seed)| {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let ops = (0..count)
            .map(|_| random_op(ranks, links, &mut rng))
            .collect();
        case_with(ranks, links, seed, ANY, ops)
    })
}

/// One or two operations big enough to take a while, and a crash, stall or cut.
fn fault_case() -> impl Strategy<Value = Case> {
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

// =============================================================================================
// Inputs
// =============================================================================================

/// `inputs[op][rank]`.
fn inputs(case: &Case) -> Vec<Vec<Vec<u8>>> {
    // One seed in four is NaN/inf-heavy.
    let specials = if case.seed.is_multiple_of(4) {
        0.25
    } else {
        1.0 / 32.0
    };
    case.ops
        .iter()
        .enumerate()
        .map(|(i, op)| {
            (0..case.ranks)
                .map(|r| {
                    let mut rng = ChaCha8Rng::seed_from_u64(
                        case.seed
                            ^ (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
                            ^ (r as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03),
                    );
                    match *op {
                        Op::Reduce { dtype, n, .. } => typed_values(&mut rng, dtype, n, specials),
                        Op::Gather { n } | Op::SendRecv { n, .. } => {
                            let mut b = vec![0u8; n];
                            rng.fill_bytes(&mut b);
                            b
                        }
                    }
                })
                .collect()
        })
        .collect()
}

// =============================================================================================
// What MLX would do
// =============================================================================================

fn neighbours(rank: usize, ranks: usize) -> (usize, usize) {
    ((rank + ranks - 1) % ranks, (rank + 1) % ranks)
}

/// `(dst, src)` of a send/recv op for `rank`.
fn send_recv_peers(rank: usize, ranks: usize, leftward: bool) -> (usize, usize) {
    let (left, right) = neighbours(rank, ranks);
    if leftward {
        (left, right)
    } else {
        (right, left)
    }
}

struct Expected {
    /// `results[op][rank]`.
    results: Vec<Vec<Vec<u8>>>,
    wire: Wire,
}

fn expected(case: &Case, inputs: &[Vec<Vec<u8>>]) -> Result<Expected, String> {
    let mut wire = Wire::new();
    let mut results = Vec::new();
    for (i, op) in case.ops.iter().enumerate() {
        let label = format!("op {i} ({op})");
        let inp = &inputs[i];
        match *op {
            Op::Reduce { op: red, dtype, .. } => {
                let lockstep =
                    mlx_model::all_reduce_wire(&mut wire, &label, dtype, red, case.links, inp);
                let folded = mlx_model::fold(dtype, red, case.links, inp);
                for (r, got) in lockstep.iter().enumerate() {
                    if *got != folded {
                        return Err(format!(
                            "MODEL BUG: {label}: the lockstep run of rank {r} disagrees with the fold"
                        ));
                    }
                }
                results.push(vec![folded; case.ranks]);
            }
            Op::Gather { .. } => {
                let all = mlx_model::all_gather_wire(&mut wire, &label, case.links, inp);
                results.push(vec![all; case.ranks]);
            }
            Op::SendRecv { leftward, .. } => {
                let mut per_rank = Vec::new();
                for r in 0..case.ranks {
                    let (dst, src) = send_recv_peers(r, case.ranks, leftward);
                    mlx_model::send_wire(
                        &mut wire, &label, case.ranks, case.links, r, dst, &inp[r],
                    );
                    per_rank.push(inp[src].clone());
                }
                results.push(per_rank);
            }
        }
    }
    Ok(Expected { results, wire })
}

// =============================================================================================
// Running a case
// =============================================================================================

/// A fabric that remembers the virtual time at which its last step returned.
struct Clocked {
    inner: SimFabric,
    clock: Rc<Cell<Duration>>,
}

impl Fabric for Clocked {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn size(&self) -> usize {
        self.inner.size()
    }
    fn kind(&self) -> ChannelKind {
        self.inner.kind()
    }
    fn links(&self, peer: usize) -> usize {
        self.inner.links(peer)
    }
    fn now(&self) -> Duration {
        self.inner.now()
    }
    fn run(&mut self, step: &mut [Transfer<'_>], deadline: Duration) -> Result<(), FabricError> {
        let result = self.inner.run(step, deadline);
        // A rank keeps the turn from here until its next fabric call, so this is also the time
        // at which the operation returns.
        self.clock.set(self.inner.now());
        result
    }
}

/// One operation on one rank.
#[derive(Clone, Debug, PartialEq, Eq)]
struct OpRun {
    result: Result<Vec<u8>, Error>,
    /// Virtual time when the operation was called and when it returned.
    t0: Duration,
    t1: Duration,
    /// After a failure: the next operation's result, and the time it returned.
    after: Option<(Result<(), Error>, Duration)>,
}

fn rank_program(fabric: SimFabric, case: &Case, inputs: &[Vec<Vec<u8>>]) -> Vec<OpRun> {
    let (rank, ranks) = (fabric.rank(), fabric.size());
    let clock = Rc::new(Cell::new(fabric.now()));
    let comm = RingCommunicator::new(
        Clocked {
            inner: fabric,
            clock: Rc::clone(&clock),
        },
        case.links,
        TIMEOUT,
    );
    let mut runs = Vec::new();
    for (i, op) in case.ops.iter().enumerate() {
        let input = &inputs[i][rank];
        let t0 = clock.get();
        let result = match *op {
            Op::Reduce { op, dtype, .. } => {
                let mut data = input.clone();
                comm.try_all_reduce(op, dtype, &mut data).map(|()| data)
            }
            Op::Gather { n } => {
                let mut out = vec![0u8; n * ranks];
                comm.try_all_gather(input, &mut out).map(|()| out)
            }
            Op::SendRecv { leftward, n } => {
                let (dst, src) = send_recv_peers(rank, ranks, leftward);
                let mut got = vec![0u8; n];
                if rank % 2 == 0 {
                    comm.try_send(dst, input)
                        .and_then(|()| comm.try_recv(src, &mut got))
                } else {
                    comm.try_recv(src, &mut got)
                        .and_then(|()| comm.try_send(dst, input))
                }
                .map(|()| got)
            }
        };
        let t1 = clock.get();
        let after = match &result {
            Err(e) if !e.leaves_group_usable() => {
                let r = comm.try_all_reduce(Reduction::Sum, DType::U8, &mut [0u8; 4]);
                Some((r, clock.get()))
            }
            _ => None,
        };
        let failed = result.is_err();
        runs.push(OpRun {
            result,
            t0,
            t1,
            after,
        });
        if failed {
            break;
        }
    }
    runs
}

/// Runs `f` on its own thread; a hang past [`WATCHDOG`] (wall clock) is an error.
fn with_watchdog<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(WATCHDOG).map_err(|e| match e {
        std::sync::mpsc::RecvTimeoutError::Timeout => format!(
            "the simulated run did not finish within {WATCHDOG:?} of wall-clock time (a hang, or far too slow)"
        ),
        std::sync::mpsc::RecvTimeoutError::Disconnected => "the simulated run panicked".into(),
    })
}

fn sim_of(case: &Case, fault: Option<Fault>) -> Sim {
    let mut sim = Sim::ring(case.ranks, case.links)
        .seed(case.seed)
        .max_fragment(case.frag)
        .window(case.window)
        .latency(
            Duration::from_nanos(case.latency_ns),
            Duration::from_nanos(case.jitter_ns),
        )
        .record_wire(true);
    if let Some(f) = fault {
        sim = sim.fault(f);
    }
    sim
}

type Inputs = Arc<Vec<Vec<Vec<u8>>>>;

fn simulate(
    case: &Case,
    fault: Option<Fault>,
    inputs: &Inputs,
) -> Result<Report<Vec<OpRun>>, String> {
    let sim = sim_of(case, fault);
    let case = case.clone();
    let inputs = Arc::clone(inputs);
    with_watchdog(move || sim.run(|fabric| rank_program(fabric, &case, &inputs)))
}

/// The simulator's fault for a spec, timed from the fault-free run's `end`.
fn sim_fault(case: &Case, spec: &FaultSpec, end: Duration) -> Fault {
    let at = |permille: u64| end * permille as u32 / 1000;
    match *spec {
        FaultSpec::Crash { rank, call } => Fault::Crash { rank, call },
        FaultSpec::CrashAt { rank, permille } => Fault::CrashAt {
            rank,
            at: at(permille),
        },
        FaultSpec::Stall {
            rank,
            permille,
            secs,
        } => Fault::Stall {
            rank,
            at: at(permille),
            duration: Duration::from_secs(secs),
        },
        FaultSpec::Cut {
            rank,
            leftside,
            link,
            permille,
        } => Fault::Cut {
            rank,
            channel: if leftside {
                mlx_model::left(rank, case.ranks, case.links, link)
            } else {
                mlx_model::right(rank, case.ranks, link)
            },
            at: at(permille),
        },
    }
}

/// What a run produced, for determinism checks and verbose replays.
struct Ran {
    report: Report<Vec<OpRun>>,
    fault: Option<Fault>,
}

fn hexs(bytes: &[u8]) -> String {
    hex_upto(bytes, 24)
}

fn hex_upto(bytes: &[u8], max: usize) -> String {
    let mut s = String::new();
    for b in bytes.iter().take(max) {
        let _ = write!(s, "{b:02x}");
    }
    if bytes.len() > max {
        let _ = write!(s, "… ({} bytes)", bytes.len());
    }
    s
}

/// Runs `case` (with its fault, timed from a fault-free run) and checks everything.
fn run_case(case: &Case, verbose: bool) -> Result<Ran, String> {
    let inputs: Inputs = Arc::new(inputs(case));
    let want = expected(case, &inputs)?;
    let fault = match &case.fault {
        None => None,
        Some(spec) => {
            let clean = simulate(case, None, &inputs)?;
            Some(sim_fault(case, spec, clean.end))
        }
    };
    let report = simulate(case, fault.clone(), &inputs)?;
    if verbose {
        println!("case: {case}");
        println!("fault: {fault:?}");
        println!(
            "seed {} trace_hash {:016x} end {:?} streams {}",
            report.seed,
            report.trace_hash,
            report.end,
            report.wire.len()
        );
        for (i, op) in case.ops.iter().enumerate() {
            println!("op {i}: {op}");
            for (r, input) in inputs[i].iter().enumerate() {
                println!("  rank {r} input    {}", hex_upto(input, 2048));
                println!(
                    "  rank {r} expected {}",
                    hex_upto(&want.results[i][r], 2048)
                );
            }
        }
        for (r, o) in report.outcomes.iter().enumerate() {
            match o {
                Outcome::Returned(runs) => {
                    for (i, run) in runs.iter().enumerate() {
                        match &run.result {
                            Ok(v) => println!(
                                "rank {r} op {i}: ok {} [{:?} → {:?}]",
                                hexs(v),
                                run.t0,
                                run.t1
                            ),
                            Err(e) => println!(
                                "rank {r} op {i}: error [{:?} → {:?}]: {e}",
                                run.t0, run.t1
                            ),
                        }
                        if let Some((after, t)) = &run.after {
                            println!("rank {r} next op at {t:?}: {after:?}");
                        }
                    }
                }
                other => println!("rank {r}: {other:?}"),
            }
        }
        for ((r, ch), bytes) in &report.wire {
            let model = want.wire.get(&(*r, *ch)).map_or(0, |s| s.bytes.len());
            println!(
                "wire rank {r} on {ch}: {} bytes recorded, {model} in the model",
                bytes.len()
            );
        }
    }
    if report.seed != case.seed {
        return Err(format!(
            "{SEED_VAR} is set: the simulator used seed {} instead of the case's {}; unset it",
            report.seed, case.seed
        ));
    }
    check(case, &want, &report, fault.as_ref())?;
    Ok(Ran { report, fault })
}

fn check(
    case: &Case,
    want: &Expected,
    report: &Report<Vec<OpRun>>,
    fault: Option<&Fault>,
) -> Result<(), String> {
    let crash_rank = match fault {
        Some(Fault::Crash { rank, .. } | Fault::CrashAt { rank, .. }) => Some(*rank),
        _ => None,
    };
    let stall_end = match fault {
        Some(Fault::Stall { rank, at, duration }) => Some((*rank, *at + *duration)),
        _ => None,
    };
    // Every rank's runs.
    let mut runs_of: Vec<Option<&Vec<OpRun>>> = Vec::new();
    for (r, o) in report.outcomes.iter().enumerate() {
        match o {
            Outcome::Returned(runs) => runs_of.push(Some(runs)),
            Outcome::Crashed if crash_rank == Some(r) => runs_of.push(None),
            Outcome::Crashed => return Err(format!("rank {r} crashed, but no fault crashes it")),
            Outcome::Panicked(msg) => return Err(format!("rank {r} panicked: {msg}")),
        }
    }
    for (r, runs) in runs_of.iter().enumerate() {
        let Some(runs) = runs else { continue };
        let (left, right) = neighbours(r, case.ranks);
        let failed = runs.iter().any(|x| x.result.is_err());
        if fault.is_none() && failed {
            let e = runs
                .iter()
                .find_map(|x| x.result.as_ref().err())
                .expect("an error");
            return Err(format!("rank {r} failed without a fault: {e}"));
        }
        if !failed && runs.len() != case.ops.len() {
            return Err(format!(
                "rank {r} ran {} of {} ops",
                runs.len(),
                case.ops.len()
            ));
        }
        for (i, run) in runs.iter().enumerate() {
            match &run.result {
                Ok(got) => {
                    let expect = &want.results[i][r];
                    if got != expect {
                        let at = got
                            .iter()
                            .zip(expect)
                            .position(|(a, b)| a != b)
                            .unwrap_or(0);
                        return Err(format!(
                            "rank {r} op {i} ({}): wrong result ({} bytes, expected {}); first difference at byte {at}: got {} expected {}",
                            case.ops[i],
                            got.len(),
                            expect.len(),
                            hexs(got.get(at..).unwrap_or(&[])),
                            hexs(expect.get(at..).unwrap_or(&[]))
                        ));
                    }
                    if fault.is_none() && run.t1.saturating_sub(run.t0) > TIMEOUT {
                        return Err(format!(
                            "rank {r} op {i} took {:?} of virtual time",
                            run.t1 - run.t0
                        ));
                    }
                }
                Err(e) => {
                    let Error::Transport { source, .. } = e else {
                        return Err(format!("rank {r} op {i}: not a transport error: {e}"));
                    };
                    let peer = source.channel.peer;
                    let text = e.to_string();
                    if (peer != left && peer != right) || !text.contains(&format!("rank {peer} ")) {
                        return Err(format!(
                            "rank {r} op {i}: the error does not name a neighbour ({left} or {right}): {text}"
                        ));
                    }
                    // Every communicator operation has its own deadline: a send/recv op is
                    // two of them, the second starting when the first ends.
                    let operations = match case.ops[i] {
                        Op::SendRecv { .. } => 2,
                        _ => 1,
                    };
                    let mut deadline = run.t0 + TIMEOUT * operations;
                    if let Error::Transport { waited, .. } = e
                        && *waited > TIMEOUT + SLACK
                        && stall_end.is_none_or(|(stalled, _)| stalled != r)
                    {
                        return Err(format!(
                            "rank {r} op {i}: the failing operation ran {waited:?}, past its timeout: {text}"
                        ));
                    }
                    if let Some((stalled, end)) = stall_end
                        && stalled == r
                    {
                        // A stalled rank does not run until its stall ends.
                        deadline = deadline.max(end);
                    }
                    if run.t1 > deadline + SLACK {
                        return Err(format!(
                            "rank {r} op {i} returned its error at {:?}, after its deadline {deadline:?}: {text}",
                            run.t1
                        ));
                    }
                    match &run.after {
                        Some((Err(Error::Failed { first, .. }), t))
                            if **first == *e && *t == run.t1 => {}
                        other => {
                            return Err(format!(
                                "rank {r}: after the failure of op {i} ({text}) the next op gave {other:?}, not Error::Failed at once with the first error"
                            ));
                        }
                    }
                }
            }
        }
    }
    // Ranks that completed an all-reduce hold the same bits.
    for (i, op) in case.ops.iter().enumerate() {
        if let Op::Reduce { .. } = op {
            let oks: Vec<(usize, &Vec<u8>)> = runs_of
                .iter()
                .enumerate()
                .filter_map(|(r, runs)| Some((r, runs.as_ref()?.get(i)?.result.as_ref().ok()?)))
                .collect();
            if let Some((r0, first)) = oks.first() {
                for (r, v) in &oks {
                    if v != first {
                        return Err(format!("op {i}: ranks {r0} and {r} hold different bits"));
                    }
                }
            }
        }
    }
    if let Some(d) = mlx_model::wire_difference(&report.wire, &want.wire, fault.is_some()) {
        return Err(format!("wire differs from MLX's: {d}"));
    }
    Ok(())
}

/// Runs a case as a property: a failure carries the seed and the replay command.
fn property(case: &Case) -> Result<(), TestCaseError> {
    let t = std::time::Instant::now();
    let r = run_case(case, false);
    if std::env::var_os("NUVEC_SIM_TIMING").is_some() {
        eprintln!("timing: {:?} {case}", t.elapsed());
    }
    r.map(|_| ()).map_err(|e| failure(case, &e))
}

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        // Integration tests have no lib.rs for proptest's default location.
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/sim_ring.txt",
        ))),
        max_shrink_iters: 64,
        max_shrink_time: 60_000,
        ..ProptestConfig::default()
    }
}

// =============================================================================================
// Properties
// =============================================================================================

proptest! {
    #![proptest_config(config(256))]
    /// Requirement 1 and 2 for small sizes: 1..=9 ranks, 1..=3 links, every dtype and op,
    /// E ∈ {0, 1, < R, = R, not a multiple of R, up to 3000}.
    #[test]
    fn every_rank_all_reduces_to_mlx_fold_and_the_wire_carries_mlx_bytes(case in small_reduce_case()) {
        property(&case)?;
    }
}

proptest! {
    #![proptest_config(config(6))]
    /// Sizes at MLX's split thresholds (R·256 KiB, 2·R·256 KiB, 2C·R·256 KiB for all-reduces;
    /// 256 KiB multiples for all-gathers), one element below, at and above; f32, u8, f64.
    #[test]
    fn threshold_sized_collectives_split_like_mlx(case in big_case()) {
        property(&case)?;
    }
}

proptest! {
    #![proptest_config(config(48))]
    #[test]
    fn all_gather_concatenates_in_rank_order_with_mlx_bytes(case in gather_case()) {
        property(&case)?;
    }
}

proptest! {
    #![proptest_config(config(48))]
    /// R = 2 covers both directions over one pair (rank 0 → 1 and 1 → 0 at once).
    #[test]
    fn neighbours_send_and_receive_exactly_with_mlx_bytes(case in send_recv_case()) {
        property(&case)?;
    }
}

proptest! {
    #![proptest_config(config(32))]
    #[test]
    fn sequences_of_operations_put_the_concatenation_on_the_wire(case in sequence_case()) {
        property(&case)?;
    }
}

proptest! {
    #![proptest_config(config(40))]
    /// Requirement 3 with `Fault::Crash` (at a fabric call), `Fault::Stall` (31–90 s, past the
    /// 30 s timeout) and `Fault::Cut`, at a time drawn within the fault-free run.
    #[test]
    fn a_crash_stall_or_cut_fails_every_live_rank_by_its_deadline(case in fault_case()) {
        property(&case)?;
    }
}

proptest! {
    #![proptest_config(config(12))]
    /// Requirement 4: the case is run twice with its seed and compared on trace hash, end time,
    /// every outcome (result bytes, error text, times) and every wire stream; then once with
    /// the next seed, which must give another trace hash.
    #[test]
    fn the_same_seed_gives_the_same_trace_and_outputs(case in prop_oneof![sequence_case(), fault_case()]) {
        let first = run_case(&case, false).map_err(|e| failure(&case, &e))?;
        let second = run_case(&case, false).map_err(|e| failure(&case, &e))?;
        let (a, b) = (&first.report, &second.report);
        prop_assert_eq!(first.fault, second.fault);
        if a.trace_hash != b.trace_hash || a.end != b.end || a.outcomes != b.outcomes || a.wire != b.wire {
            return Err(failure(&case, &format!(
                "two runs with seed {} differ: trace {:016x} vs {:016x}, end {:?} vs {:?}, outcomes equal: {}, wire equal: {}",
                case.seed, a.trace_hash, b.trace_hash, a.end, b.end, a.outcomes == b.outcomes, a.wire == b.wire
            )));
        }
        let mut other = case.clone();
        other.seed = case.seed.wrapping_add(1);
        let third = run_case(&other, false).map_err(|e| failure(&other, &e))?;
        prop_assert_ne!(third.report.trace_hash, a.trace_hash, "seeds {} and {} gave the same trace hash", case.seed, other.seed);
    }
}

proptest! {
    #![proptest_config(config(96))]
    /// The model checks itself: the lockstep run of MLX's loops ends, on every rank, with the
    /// fold in MLX's association order (for R up to 9 and every dtype and op, no simulator).
    #[test]
    fn the_model_lockstep_run_ends_with_the_fold(case in small_reduce_case()) {
        let inputs = inputs(&case);
        expected(&case, &inputs).map_err(|e| failure(&case, &e))?;
    }
}

proptest! {
    #![proptest_config(config(64))]
    #[test]
    fn the_case_text_round_trips(case in prop_oneof![small_reduce_case(), big_case(), sequence_case(), fault_case()]) {
        let text = case.to_string();
        prop_assert_eq!(text.parse::<Case>(), Ok(case));
    }
}

// =============================================================================================
// Fixed tests
// =============================================================================================

/// Runs the case in `NUVEC_SIM_CASE` (as printed by a failing property) with full output.
#[test]
fn replays_a_case_from_the_environment() {
    let Ok(text) = std::env::var("NUVEC_SIM_CASE") else {
        println!(
            "NUVEC_SIM_CASE is not set: nothing to replay (a failing property prints the command)"
        );
        return;
    };
    let case: Case = text
        .parse()
        .unwrap_or_else(|e| panic!("NUVEC_SIM_CASE: {e}"));
    if let Err(e) = run_case(&case, true) {
        panic!("{e}\n  case: {case}\n  {}", replay_line(&case));
    }
    println!("the case passes");
}

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Reference §2.6.4, worked examples A, B and C, against the model.
#[test]
fn the_model_reproduces_mlx_worked_examples() {
    // A: float32, N = 8 MiB, R = 4, C = 2: four sub-reduces of 2 MiB, even ones leftward.
    let a = mlx_model::reduce_plan(2_097_152, 4, 4, 2);
    assert_eq!(a.padded, None);
    let layout: Vec<_> = a
        .subs
        .iter()
        .map(|s| (s.start, s.len, s.direction, s.pair))
        .collect();
    assert_eq!(
        layout,
        [
            (0, 524_288, 1, 0),
            (524_288, 524_288, -1, 0),
            (1_048_576, 524_288, 1, 1),
            (1_572_864, 524_288, -1, 1)
        ]
    );
    // B: float32, E = 10, R = 4, C = 1: rank 0 sends 12, 12, 12, 4, 12, 12 bytes on left[0].
    let inputs: Vec<Vec<u8>> = (0..4).map(|r| f32s(&[r as f32; 10])).collect();
    let mut wire = Wire::new();
    mlx_model::all_reduce_wire(&mut wire, "B", DType::F32, Reduction::Sum, 1, &inputs);
    let rank0 = &wire[&(0, Channel::new(3, 0))];
    let sizes: Vec<usize> = rank0.spans.iter().map(|s| s.len).collect();
    assert_eq!(sizes, [12, 12, 12, 4, 12, 12]);
    assert_eq!(wire.len(), 4, "only left[0] of every rank carries bytes");
    // C: float32, E = 3, R = 4: padded, rightward on right[0], six steps of 4 bytes.
    let inputs: Vec<Vec<u8>> = (0..4).map(|r| f32s(&[r as f32; 3])).collect();
    let mut wire = Wire::new();
    mlx_model::all_reduce_wire(&mut wire, "C", DType::F32, Reduction::Sum, 2, &inputs);
    let rank0 = &wire[&(0, Channel::new(1, 0))];
    assert_eq!(
        rank0.spans.iter().map(|s| s.len).collect::<Vec<_>>(),
        [4; 6]
    );
    // R = 2: left[c] is link C + c.
    assert_eq!(mlx_model::left(0, 2, 3, 1), Channel::new(1, 4));
    assert_eq!(mlx_model::left(0, 4, 3, 1), Channel::new(3, 1));
}

/// The reference reduction keeps MLX's operand rules (reference §2.6.5, src/collective/reduce docs).
#[test]
fn the_reference_reduction_keeps_mlx_operand_rules() {
    let c = |lane: Lane, op: Reduction, l: &[u8], r: &[u8]| {
        let mut out = [0u8; 8];
        mlx_model::combine_element(lane, op, l, r, &mut out);
        out[..lane.size()].to_vec()
    };
    let f = |x: f32| x.to_le_bytes();
    let nan = f32::from_bits(0x7FC0_0001);
    // std::max keeps local unless local < received: a NaN on either side keeps local.
    assert_eq!(c(Lane::F32, Reduction::Max, &f(nan), &f(1.0)), f(nan));
    assert_eq!(c(Lane::F32, Reduction::Max, &f(1.0), &f(nan)), f(1.0));
    assert_eq!(c(Lane::F32, Reduction::Min, &f(nan), &f(1.0)), f(nan));
    assert_eq!(c(Lane::F32, Reduction::Min, &f(1.0), &f(nan)), f(1.0));
    assert_eq!(c(Lane::F32, Reduction::Max, &f(-0.0), &f(0.0)), f(-0.0));
    assert_eq!(c(Lane::F32, Reduction::Min, &f(0.0), &f(-0.0)), f(0.0));
    // float32 sums: received's NaN (quieted) wins, then local's.
    let sn = f32::from_bits(0x7F80_0001);
    assert_eq!(
        c(Lane::F32, Reduction::Sum, &f(nan), &f(sn)),
        0x7FC0_0001u32.to_le_bytes()
    );
    assert_eq!(
        c(Lane::F32, Reduction::Sum, &f(sn), &f(2.0)),
        0x7FC0_0001u32.to_le_bytes()
    );
    // Half types: NaN sums get MLX's patterns.
    let h = |x: u16| x.to_le_bytes();
    assert_eq!(
        c(Lane::Bf16, Reduction::Sum, &h(0xFFC1), &h(0x3F80)),
        h(0x7FC0)
    );
    // float16 NaN sums: the sign of received's NaN, else local's, else the default NaN's.
    assert_eq!(
        c(Lane::F16, Reduction::Sum, &h(0xFE01), &h(0x7E00)),
        h(0x7D00)
    );
    assert_eq!(
        c(Lane::F16, Reduction::Sum, &h(0xFE01), &h(0x3C00)),
        h(0xFD00)
    );
    assert_eq!(
        c(Lane::F16, Reduction::Sum, &h(0x3C00), &h(0x7E00)),
        h(0x7D00)
    );
    assert_eq!(
        c(Lane::F16, Reduction::Max, &h(0x8000), &h(0x0000)),
        h(0x8000)
    );
    // 1 + 2^-11 in f16 is a tie, rounded to even (1.0); bf16 1 + 2^-8 likewise.
    assert_eq!(
        c(Lane::F16, Reduction::Sum, &h(0x3C00), &h(0x1000)),
        h(0x3C00)
    );
    assert_eq!(
        c(Lane::Bf16, Reduction::Sum, &h(0x3F80), &h(0x3B80)),
        h(0x3F80)
    );
    // bool: sum and max are or, min is and; the result is 0 or 1.
    assert_eq!(c(Lane::Bool, Reduction::Sum, &[2], &[0]), [1]);
    assert_eq!(c(Lane::Bool, Reduction::Min, &[2], &[7]), [1]);
    assert_eq!(c(Lane::Bool, Reduction::Min, &[2], &[0]), [0]);
    // Integers wrap.
    assert_eq!(c(Lane::I8, Reduction::Sum, &[127], &[1]), [0x80]);
    // complex64: lexicographic.
    let z = |re: f32, im: f32| [re.to_le_bytes(), im.to_le_bytes()].concat();
    assert_eq!(
        c(Lane::C64, Reduction::Max, &z(1.0, 5.0), &z(1.0, 6.0)),
        z(1.0, 6.0)
    );
    assert_eq!(
        c(Lane::C64, Reduction::Max, &z(2.0, 0.0), &z(1.0, 9.0)),
        z(2.0, 0.0)
    );
    assert_eq!(
        c(Lane::C64, Reduction::Min, &z(1.0, 5.0), &z(1.0, 5.0)),
        z(1.0, 5.0)
    );
    // The fold puts the new rank's own value on the left: with max over ±0.0, d = +1, R = 3,
    // segment 0 is x1 ⊕ (x2 ⊕ x0); x2 = -0.0 is local against x0 = +0.0 and is kept, then
    // x1 = +0.0 is local against -0.0 and is kept: +0.0. The other association would give -0.0.
    let xs: [&[u8]; 3] = [&f(0.0), &f(0.0), &f(-0.0)];
    let mut out = [0u8; 4];
    mlx_model::fold_element(Lane::F32, Reduction::Max, &xs, 0, 1, &mut out);
    assert_eq!(out, f(0.0));
    let xs: [&[u8]; 3] = [&f(0.0), &f(-0.0), &f(0.0)];
    mlx_model::fold_element(Lane::F32, Reduction::Max, &xs, 0, 1, &mut out);
    assert_eq!(out, f(-0.0));
}

/// MLX's ring.cpp sends 2(R−1) zero elements on `right[0]` for an all-reduce of zero elements
/// (`size < size_` takes the small path); so must we (a mixed job with stock MLX hangs
/// otherwise).
#[test]
fn an_empty_all_reduce_puts_what_a_literal_mlx_puts_on_the_wire() {
    let case = case_with(
        3,
        1,
        7,
        ANY,
        vec![Op::Reduce {
            op: Reduction::Sum,
            dtype: DType::F32,
            n: 0,
        }],
    );
    let inputs: Inputs = Arc::new(inputs(&case));
    let plan = mlx_model::reduce_plan_literal(0, 4, 3, 1);
    let mut want = Wire::new();
    mlx_model::all_reduce_wire_with(
        &mut want,
        "empty",
        DType::F32,
        Reduction::Sum,
        1,
        &inputs[0],
        &plan,
    );
    let report = simulate(&case, None, &inputs).expect("run");
    if let Some(d) = mlx_model::wire_difference(&report.wire, &want, false) {
        panic!("{d}\n  {}", replay_line(&case));
    }
}

/// `Fault::CrashAt`: a rank crashed at a virtual time while blocked in the fabric.
///
/// A crashed rank's thread gets a last turn to learn of the crash, so `Sim::run` returns (it
/// once hung here; the watchdog would turn such a hang into a failure).
#[test]
fn a_crash_at_a_virtual_time_fails_every_live_rank_by_its_deadline() {
    for (ranks, seed) in [(4, 1u64), (2, 2), (5, 3)] {
        let mut case = case_with(
            ranks,
            1,
            seed,
            BIG,
            vec![Op::Reduce {
                op: Reduction::Sum,
                dtype: DType::F32,
                n: 100_000,
            }],
        );
        case.fault = Some(FaultSpec::CrashAt {
            rank: 1,
            permille: 300,
        });
        if let Err(e) = run_case(&case, false) {
            panic!("{e}\n  case: {case}\n  {}", replay_line(&case));
        }
    }
}
