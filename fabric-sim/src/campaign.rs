//! Fault campaigns: thousands of seeded scenarios of MLX's ring and of JACCL in simulation,
//! each checked against the invariants a user relies on.
//!
//! A scenario is drawn from one seed ([`Scenario::from_seed`]): the backend (the ring over
//! stream channels, or JACCL's mesh or ring over UC message channels), the number of ranks and
//! of links, the network (fragment size, window, latency; for JACCL, whether unexpected
//! messages are dropped and how often messages are lost), a sequence of collectives (all_sum,
//! all_max, all_min over several dtypes and sizes, all_gather, neighbour send/recv) and at most
//! one fault (a crash at a fabric call or at a time, a stall shorter or longer than the
//! timeout, a cut link; for JACCL also a lost message or an error completion). [`check`] runs
//! it and checks:
//!
//! - **no hang**: every operation returns within its deadline (virtual time);
//! - **no wrong result**: an operation that succeeds returns exactly the expected bytes
//!   (inputs are chosen so that every reduction is exact in any order);
//! - **failures name a peer**, and stay failures: after an error every later operation of that
//!   rank fails too;
//! - **no fault, no failure**: an operation fails only on a lossy network or where the fault
//!   struck no later than the failure (the world reports when:
//!   [`Report::fault_struck`](crate::Report::fault_struck)) and could fail it (a stall more
//!   than a second inside the deadline fails nothing);
//! - **replay**: the same seed gives the same trace hash.
//!
//! `cargo run --release --ignore-rust-version --example campaign -- --count 100000` runs a long
//! one; a failing seed replays with `--seed S --count 1`.

use std::time::Duration;

use nuvec_core::DType;
use nuvec_distributed::fabric::{Channel, Fabric};
use nuvec_distributed::jaccl::{FrameRule, JacclCommunicator};
use nuvec_distributed::reduce::Reduction;
use nuvec_distributed::{RingCommunicator, Wire};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::{Fault, Outcome, Sim, Uc, Unexpected};

/// The deadline of every operation in a campaign.
pub const TIMEOUT: Duration = Duration::from_secs(30);

/// One collective of a scenario.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// An all-reduce of `elements` of `dtype`.
    Reduce {
        /// Sum, max or min.
        op: Reduction,
        /// One of the exact dtypes.
        dtype: DType,
        /// Elements per rank.
        elements: usize,
    },
    /// An all-gather of `bytes` per rank.
    Gather {
        /// Bytes per rank.
        bytes: usize,
    },
    /// Every rank sends `bytes` to its right neighbour and receives from its left one.
    Shift {
        /// Bytes per rank.
        bytes: usize,
    },
}

/// Which backend a scenario runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// MLX's TCP ring over stream channels.
    Ring,
    /// JACCL's mesh over UC message channels.
    JacclMesh,
    /// JACCL's ring over UC message channels.
    JacclRing,
}

/// A scenario, all of it drawn from its seed.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// The seed it was drawn from (and that drives the simulation).
    pub seed: u64,
    /// The backend.
    pub backend: Backend,
    /// Whether the network itself may lose messages (JACCL's UC channels with loss, or with
    /// unexpected messages dropped): failures are then allowed without a fault.
    pub lossy: bool,
    /// JACCL's frame rule.
    pub rule: FrameRule,
    /// Ranks.
    pub ranks: usize,
    /// Links per neighbour.
    pub links: usize,
    /// The ring's wire (the ring only: JACCL speaks MLX's).
    pub wire: Wire,
    /// The collectives, in order.
    pub ops: Vec<Op>,
    /// The fault, if any.
    pub fault: Option<Fault>,
    /// The simulated network.
    pub sim: Sim,
}

const DTYPES: [DType; 6] = [
    DType::Bool,
    DType::U8,
    DType::I32,
    DType::I64,
    DType::F32,
    DType::F64,
];

impl Scenario {
    /// The scenario of `seed`.
    pub fn from_seed(seed: u64) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5ca1_ab1e);
        let ranks = rng.random_range(1..=6usize);
        let links = rng.random_range(1..=3usize);
        let size = |rng: &mut ChaCha8Rng| match rng.random_range(0..10u32) {
            0 => 0,
            1..=3 => rng.random_range(1..=ranks.max(2) * 2),
            4..=8 => rng.random_range(1..=5000),
            _ => rng.random_range(100_000..=600_000),
        };
        let ops = (0..rng.random_range(1..=4usize))
            .map(|_| match rng.random_range(0..6u32) {
                0..=2 => Op::Reduce {
                    op: [Reduction::Sum, Reduction::Max, Reduction::Min][rng.random_range(0..3)],
                    dtype: DTYPES[rng.random_range(0..DTYPES.len())],
                    elements: size(&mut rng),
                },
                3 | 4 => Op::Gather {
                    bytes: size(&mut rng),
                },
                _ => Op::Shift {
                    bytes: size(&mut rng),
                },
            })
            .collect();
        let at = |rng: &mut ChaCha8Rng| Duration::from_micros(rng.random_range(0..400));
        let fault = if ranks < 2 {
            None
        } else {
            let rank = rng.random_range(0..ranks);
            match rng.random_range(0..7u32) {
                0 | 1 => None,
                2 => Some(Fault::Crash {
                    rank,
                    call: rng.random_range(0..12),
                }),
                3 => Some(Fault::CrashAt {
                    rank,
                    at: at(&mut rng),
                }),
                4 => Some(Fault::Stall {
                    rank,
                    at: at(&mut rng),
                    duration: Duration::from_secs(rng.random_range(1..=60)),
                }),
                5 => Some(Fault::Stall {
                    rank,
                    at: at(&mut rng),
                    duration: Duration::from_millis(rng.random_range(1..=50)),
                }),
                _ => {
                    let right = (rank + 1) % ranks;
                    Some(Fault::Cut {
                        rank,
                        channel: Channel::new(right, rng.random_range(0..links)),
                        at: at(&mut rng),
                    })
                }
            }
        };
        let mut sim = Sim::ring(ranks, links)
            .seed(seed)
            .max_fragment(rng.random_range(1..=65_536))
            .window(rng.random_range(1024..=512 * 1024))
            .latency(
                Duration::from_micros(rng.random_range(0..50)),
                Duration::from_micros(rng.random_range(0..50)),
            );
        // The backend comes from its own stream, so the ring's scenarios stay those of earlier
        // campaigns.
        let mut kind = ChaCha8Rng::seed_from_u64(seed ^ 0x0001_acc1);
        let backend = match (ranks, kind.random_range(0..10u32)) {
            (0 | 1, _) | (_, 0..=5) => Backend::Ring,
            (_, 6 | 7) => Backend::JacclMesh,
            _ => Backend::JacclRing,
        };
        let mut fault = fault;
        let mut lossy = false;
        let rule = if kind.random_bool(0.3) {
            FrameRule::Large
        } else {
            FrameRule::Small
        };
        if backend != Backend::Ring {
            let uc = match kind.random_range(0..4u32) {
                0 => Uc {
                    posted: 2,
                    unexpected: Unexpected::Drop,
                    loss: 0.0,
                },
                1 => Uc {
                    loss: kind.random_range(0.0005..0.05),
                    ..Uc::default()
                },
                _ => Uc::default(),
            };
            lossy = uc.loss > 0.0 || uc.unexpected == Unexpected::Drop;
            let rank = kind.random_range(0..ranks);
            let right = (rank + 1) % ranks;
            let link = if backend == Backend::JacclMesh {
                0
            } else {
                kind.random_range(0..links)
            };
            fault = match (fault, kind.random_range(0..4u32)) {
                (_, 0) => Some(Fault::Lose {
                    rank,
                    channel: Channel::new(right, link),
                    message: kind.random_range(0..40),
                }),
                (_, 1) => Some(Fault::ErrorStatus {
                    rank,
                    channel: Channel::new(right, link),
                    message: kind.random_range(0..40),
                }),
                (Some(Fault::Cut { rank, at, .. }), _) => Some(Fault::Cut {
                    rank,
                    channel: Channel::new((rank + 1) % ranks, link),
                    at,
                }),
                (other, _) => other,
            };
            sim = match backend {
                Backend::JacclMesh => Sim::mesh(ranks),
                _ => Sim::jaccl_ring(ranks, links),
            }
            .seed(seed)
            .uc(uc)
            .latency(
                Duration::from_micros(kind.random_range(0..50)),
                Duration::from_micros(kind.random_range(0..50)),
            );
        }
        if let Some(f) = &fault {
            sim = sim.fault(f.clone());
        }
        // The wire too has its own stream, so the rest of every scenario stays what it was.
        let wire = if ChaCha8Rng::seed_from_u64(seed ^ 0x0002_0a1e).random_bool(0.5) {
            Wire::Nuvec
        } else {
            Wire::Mlx
        };
        Self {
            seed,
            backend,
            lossy,
            rule,
            ranks,
            links,
            wire,
            ops,
            fault,
            sim,
        }
    }
}

/// The input of `rank` for operation `index`: small values, so every reduction is exact.
fn input(dtype: DType, elements: usize, rank: usize, index: usize) -> Vec<u8> {
    let value = |i: usize| ((i * 7 + rank * 13 + index * 5) % 17) as i64 - 8;
    let mut out = Vec::with_capacity(elements * dtype.size());
    for i in 0..elements {
        let v = value(i);
        match dtype {
            DType::Bool => out.push(u8::from(v > 0)),
            DType::U8 => out.push(v as u8),
            DType::I32 => out.extend_from_slice(&(v as i32).to_le_bytes()),
            DType::I64 => out.extend_from_slice(&v.to_le_bytes()),
            DType::F32 => out.extend_from_slice(&(v as f32 * 0.5).to_le_bytes()),
            DType::F64 => out.extend_from_slice(&(v as f64 * 0.25).to_le_bytes()),
            _ => unreachable!("campaign dtypes"),
        }
    }
    out
}

/// The exact result of reducing every rank's input.
fn expected(op: Reduction, dtype: DType, elements: usize, ranks: usize, index: usize) -> Vec<u8> {
    let inputs: Vec<Vec<u8>> = (0..ranks)
        .map(|r| input(dtype, elements, r, index))
        .collect();
    let s = dtype.size();
    let mut out = inputs[0].clone();
    for other in &inputs[1..] {
        for e in 0..elements {
            let (a, b) = (&out[e * s..(e + 1) * s], &other[e * s..(e + 1) * s]);
            let combined: Vec<u8> = match dtype {
                DType::Bool | DType::U8 => {
                    let (x, y) = (a[0], b[0]);
                    vec![match (dtype, op) {
                        (DType::Bool, Reduction::Min) => x & y,
                        (DType::Bool, _) => x | y,
                        (_, Reduction::Sum) => x.wrapping_add(y),
                        (_, Reduction::Max) => x.max(y),
                        (_, Reduction::Min) => x.min(y),
                    }]
                }
                DType::I32 | DType::I64 => {
                    let read = |v: &[u8]| {
                        if s == 4 {
                            i64::from(i32::from_le_bytes(v.try_into().expect("4")))
                        } else {
                            i64::from_le_bytes(v.try_into().expect("8"))
                        }
                    };
                    let (x, y) = (read(a), read(b));
                    let r = match op {
                        Reduction::Sum => x.wrapping_add(y),
                        Reduction::Max => x.max(y),
                        Reduction::Min => x.min(y),
                    };
                    r.to_le_bytes()[..s].to_vec()
                }
                _ => {
                    let read = |v: &[u8]| {
                        if s == 4 {
                            f64::from(f32::from_le_bytes(v.try_into().expect("4")))
                        } else {
                            f64::from_le_bytes(v.try_into().expect("8"))
                        }
                    };
                    let (x, y) = (read(a), read(b));
                    let r = match op {
                        Reduction::Sum => x + y,
                        Reduction::Max => x.max(y),
                        Reduction::Min => x.min(y),
                    };
                    if s == 4 {
                        (r as f32).to_le_bytes().to_vec()
                    } else {
                        r.to_le_bytes().to_vec()
                    }
                }
            };
            out[e * s..(e + 1) * s].copy_from_slice(&combined);
        }
    }
    out
}

/// The operations a campaign runs, over either backend's communicator.
trait Collectives {
    fn try_all_reduce(
        &self,
        op: Reduction,
        dtype: DType,
        data: &mut [u8],
    ) -> Result<(), nuvec_distributed::Error>;
    fn try_all_gather(
        &self,
        input: &[u8],
        output: &mut [u8],
    ) -> Result<(), nuvec_distributed::Error>;
    fn try_send(&self, dst: usize, data: &[u8]) -> Result<(), nuvec_distributed::Error>;
    fn try_recv(&self, src: usize, data: &mut [u8]) -> Result<(), nuvec_distributed::Error>;
    fn flight_record(&self) -> Option<String>;
}

macro_rules! collectives {
    ($t:ty) => {
        impl<F: Fabric> Collectives for $t {
            fn try_all_reduce(
                &self,
                op: Reduction,
                dtype: DType,
                data: &mut [u8],
            ) -> Result<(), nuvec_distributed::Error> {
                <$t>::try_all_reduce(self, op, dtype, data)
            }
            fn try_all_gather(
                &self,
                input: &[u8],
                output: &mut [u8],
            ) -> Result<(), nuvec_distributed::Error> {
                <$t>::try_all_gather(self, input, output)
            }
            fn try_send(&self, dst: usize, data: &[u8]) -> Result<(), nuvec_distributed::Error> {
                <$t>::try_send(self, dst, data)
            }
            fn try_recv(
                &self,
                src: usize,
                data: &mut [u8],
            ) -> Result<(), nuvec_distributed::Error> {
                <$t>::try_recv(self, src, data)
            }
            fn flight_record(&self) -> Option<String> {
                <$t>::flight_record(self)
            }
        }
    };
}

collectives!(RingCommunicator<F>);
collectives!(JacclCommunicator<F>);

/// What one rank saw: per operation, its result or error text, how long it took, and when
/// (virtual time from the start) it ended.
type RankLog = Vec<(Result<Vec<u8>, String>, Duration, Duration)>;

fn run_rank(scenario: &Scenario, fabric: crate::SimFabric) -> RankLog {
    run_rank_recorded(scenario, fabric).0
}

/// [`run_rank`], and the rank's flight record after its last operation.
fn run_rank_recorded(scenario: &Scenario, fabric: crate::SimFabric) -> (RankLog, Option<String>) {
    let clock = fabric.clock();
    let rank = fabric.rank();
    let ranks = scenario.ranks;
    let comm: Box<dyn Collectives> = match scenario.backend {
        Backend::Ring => Box::new(
            RingCommunicator::new(fabric, scenario.links, TIMEOUT).with_wire(scenario.wire),
        ),
        Backend::JacclMesh => Box::new(JacclCommunicator::mesh(fabric, scenario.rule, TIMEOUT)),
        Backend::JacclRing => Box::new(JacclCommunicator::ring(
            fabric,
            scenario.links,
            scenario.rule,
            TIMEOUT,
        )),
    };
    let mut log = Vec::new();
    for (index, op) in scenario.ops.iter().enumerate() {
        let start = clock.now();
        let result = match op {
            Op::Reduce {
                op,
                dtype,
                elements,
            } => {
                let mut data = input(*dtype, *elements, rank, index);
                comm.try_all_reduce(*op, *dtype, &mut data).map(|()| data)
            }
            Op::Gather { bytes } => {
                let mine = input(DType::U8, *bytes, rank, index);
                let mut out = vec![0u8; bytes * ranks];
                comm.try_all_gather(&mine, &mut out).map(|()| out)
            }
            Op::Shift { bytes } if ranks > 1 => {
                let mine = input(DType::U8, *bytes, rank, index);
                let mut got = vec![0u8; *bytes];
                let (right, left) = ((rank + 1) % ranks, (rank + ranks - 1) % ranks);
                // Even ranks send first, odd ones receive first, so a ring of any size works.
                let r = if rank.is_multiple_of(2) {
                    comm.try_send(right, &mine)
                        .and_then(|()| comm.try_recv(left, &mut got))
                } else {
                    comm.try_recv(left, &mut got)
                        .and_then(|()| comm.try_send(right, &mine))
                };
                r.map(|()| got)
            }
            Op::Shift { bytes } => Ok(input(DType::U8, *bytes, rank, index)),
        };
        let end = clock.now();
        log.push((result.map_err(|e| e.to_string()), end - start, end));
    }
    (log, comm.flight_record())
}

/// What a scenario's check found wrong, if anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The scenario's seed.
    pub seed: u64,
    /// What went wrong.
    pub what: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "seed {}: {} (replay: cargo run --release --ignore-rust-version --example campaign -- --seed {} --count 1)",
            self.seed, self.what, self.seed
        )
    }
}

/// Runs the scenario of `seed` (twice when `replay` is set, comparing trace hashes) and checks
/// every invariant.
pub fn check(seed: u64, replay: bool) -> Result<(), Violation> {
    let scenario = Scenario::from_seed(seed);
    let fail = |what: String| Violation { seed, what };
    let report = scenario.sim.run(|fabric| run_rank(&scenario, fabric));
    if replay {
        let again = scenario.sim.run(|fabric| run_rank(&scenario, fabric));
        if again.trace_hash != report.trace_hash {
            return Err(fail(format!(
                "the same seed gave trace hashes {:x} and {:x}",
                report.trace_hash, again.trace_hash
            )));
        }
    }
    let ranks = scenario.ranks;
    let struck = report.fault_struck;
    for (rank, outcome) in report.outcomes.into_iter().enumerate() {
        let log = match outcome {
            Outcome::Returned(log) => log,
            Outcome::Crashed => continue,
            Outcome::Panicked(p) => return Err(fail(format!("rank {rank} panicked: {p}"))),
        };
        let mut failed = false;
        // A stalled rank is not scheduled while it stalls: its own operations may end when the
        // stall does, past their deadline, and then fail at once.
        let stalled = match scenario.fault {
            Some(Fault::Stall {
                rank: r, duration, ..
            }) if r == rank => duration,
            _ => Duration::ZERO,
        };
        for (index, (result, took, ended)) in log.into_iter().enumerate() {
            let op = &scenario.ops[index];
            let sends = matches!(op, Op::Shift { .. }) && ranks > 1;
            // A shift is two operations, each with its own deadline.
            let bound =
                if sends { TIMEOUT * 2 } else { TIMEOUT } + stalled + Duration::from_millis(1);
            if took > bound {
                return Err(fail(format!(
                    "rank {rank} op {index} ({op:?}) took {took:?}, past its deadline"
                )));
            }
            match result {
                Ok(got) => {
                    if failed {
                        return Err(fail(format!(
                            "rank {rank} op {index} succeeded after an earlier failure"
                        )));
                    }
                    let want = match op {
                        Op::Reduce {
                            op,
                            dtype,
                            elements,
                        } => expected(*op, *dtype, *elements, ranks, index),
                        Op::Gather { bytes } => (0..ranks)
                            .flat_map(|r| input(DType::U8, *bytes, r, index))
                            .collect(),
                        Op::Shift { bytes } => {
                            let left = (rank + ranks - 1) % ranks;
                            input(DType::U8, *bytes, left, index)
                        }
                    };
                    if got != want {
                        return Err(fail(format!(
                            "rank {rank} op {index} ({op:?}) returned a wrong result"
                        )));
                    }
                }
                Err(text) => {
                    if let Some(why) =
                        unexplained(scenario.lossy, scenario.fault.as_ref(), struck, ended)
                    {
                        return Err(fail(format!(
                            "rank {rank} op {index} failed at {ended:?} without a fault that \
                             could fail it ({why}): {text}"
                        )));
                    }
                    // Every error starts with its own rank ("distributed: rank 2: ..."):
                    // another must be named.
                    if !names_another_rank(&text, rank) {
                        return Err(fail(format!("rank {rank}'s error names no peer: {text}")));
                    }
                    failed = true;
                }
            }
        }
    }
    Ok(())
}

/// Why an operation that failed at `ended` had no cause, or `None` where it had one. A
/// failure needs a lossy network, or a fault that struck (at `struck`) no later than the
/// failure and could fail an operation: a fault cannot fail what ended before it, and a
/// stall more than a second inside the deadline (slack for the operation's own time on the
/// campaign's slowest network) fails nothing, however it falls, since the simulator's fabric
/// fails a step only at its deadline.
fn unexplained(
    lossy: bool,
    fault: Option<&Fault>,
    struck: Option<Duration>,
    ended: Duration,
) -> Option<String> {
    if lossy {
        return None;
    }
    let Some(fault) = fault else {
        return Some("none".to_owned());
    };
    match struck {
        None => Some(format!("{fault:?}, which did not strike")),
        Some(at) if at > ended => Some(format!("{fault:?}, which struck later, at {at:?}")),
        Some(_) => match fault {
            Fault::Stall { duration, .. } if *duration + Duration::from_secs(1) < TIMEOUT => {
                Some(format!("{fault:?}, shorter than the deadline"))
            }
            _ => None,
        },
    }
}

/// Runs the scenario of `seed` and returns each rank's flight record as its `rank-R.jsonl`
/// would hold it: `None` for a rank that crashed (it leaves no record, as a killed process
/// does) or panicked, or when the recorder is off. Times are virtual, from
/// [`EPOCH_US`](crate::EPOCH_US), so one seed gives the same records.
pub fn records(seed: u64) -> (Scenario, Vec<Option<String>>) {
    let scenario = Scenario::from_seed(seed);
    let report = scenario
        .sim
        .run(|fabric| run_rank_recorded(&scenario, fabric));
    let records = report
        .outcomes
        .into_iter()
        .map(|outcome| match outcome {
            Outcome::Returned((_, record)) => record,
            Outcome::Crashed | Outcome::Panicked(_) => None,
        })
        .collect();
    (scenario, records)
}

/// Whether `text` names a rank other than `rank` ("rank 3", not "rank 30" for rank 30).
fn names_another_rank(text: &str, rank: usize) -> bool {
    text.match_indices("rank ").any(|(at, said)| {
        let digits: String = text[at + said.len()..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse::<usize>().is_ok_and(|named| named != rank)
    })
}

/// Runs `count` scenarios from seed `first` on, replaying every `replay_every`-th one (and the
/// one scenario of a run of one, as a replay of a failing seed is); returns the violations
/// found.
pub fn run(first: u64, count: u64, replay_every: u64) -> Vec<Violation> {
    (first..first + count)
        .filter_map(|seed| {
            let replay = count == 1 || (replay_every > 0 && seed.is_multiple_of(replay_every));
            check(seed, replay).err()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_names_a_peer_only_when_it_names_a_rank_other_than_its_own() {
        assert!(names_another_rank(
            "distributed: rank 2: all_sum #3: the connection to rank 1 was closed",
            2
        ));
        assert!(!names_another_rank(
            "distributed: rank 2: all_sum #3: timed out",
            2
        ));
        assert!(!names_another_rank("distributed: rank 3: ranks 0, 1", 3));
        assert!(names_another_rank("distributed: rank 3: from rank 30", 3));
        assert!(!names_another_rank("distributed: rank 30: rank 30", 30));
    }

    #[test]
    fn a_failure_needs_a_lossy_network_or_a_fault_that_struck_no_later_and_could_fail_it() {
        let ms = Duration::from_millis;
        let crash = Fault::CrashAt {
            rank: 1,
            at: ms(350),
        };
        // A crash that struck at 350 ms explains a failure at 350 ms or later.
        assert_eq!(
            unexplained(false, Some(&crash), Some(ms(350)), ms(350)),
            None
        );
        assert_eq!(
            unexplained(false, Some(&crash), Some(ms(350)), ms(900)),
            None
        );
        // Not one at 100 ms: that operation failed before its cause.
        let early = unexplained(false, Some(&crash), Some(ms(350)), ms(100)).expect("too early");
        assert!(early.contains("struck later, at 350ms"), "{early}");
        // Nor one that never struck, nor no fault at all.
        let missed = unexplained(false, Some(&crash), None, ms(900)).expect("never struck");
        assert!(missed.contains("did not strike"), "{missed}");
        assert_eq!(
            unexplained(false, None, None, ms(1)).as_deref(),
            Some("none")
        );
        // A stall well inside the deadline fails nothing; one near it may.
        let stall = |duration| Fault::Stall {
            rank: 0,
            at: ms(10),
            duration,
        };
        let short = stall(TIMEOUT - Duration::from_secs(2));
        assert!(unexplained(false, Some(&short), Some(ms(10)), TIMEOUT).is_some());
        let long = stall(TIMEOUT - ms(500));
        assert_eq!(unexplained(false, Some(&long), Some(ms(10)), TIMEOUT), None);
        // A lossy network explains any failure.
        assert_eq!(unexplained(true, None, None, ms(1)), None);
    }
}
