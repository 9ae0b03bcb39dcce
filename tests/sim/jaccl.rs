//! JACCL's mesh and ring algorithms over the simulator's UC message channels: results, message
//! counts, loss, dead peers and determinism, property-tested.
//!
//! Every case runs whole JACCL groups (`JacclCommunicator` over `nuvec-fabric-sim` with
//! `Sim::uc`) and checks them against `tests/common/jaccl_model.rs`, an independent model of
//! MLX's JACCL (its own frame rule, plans and element reductions):
//!
//! - **results**: every rank's all-reduce equals the model's fold (the mesh's rank-order fold,
//!   the ring's association order), bit for bit with NaNs and signed zeros, and all ranks are
//!   bitwise equal; all-gather is the rank-order concatenation; sum-scatter gives each rank its
//!   shard of the fold; send/recv deliver exactly;
//! - **messages**: with `record_wire(true)`, the list of message lengths on every queue pair
//!   equals MLX's (count and frame size), for sequences of operations too;
//! - **faults** (a lost message, a send completing with an error status, a crashed peer that
//!   never answers, a stall beyond the timeout, receives not posted in time under UC's drop
//!   rule): every rank either returns the right result or fails with an error naming a peer
//!   ("rank N") by its deadline in virtual time, never with wrong data, and its next
//!   operation fails at once;
//! - **determinism**: the same case gives the same trace hash and outcomes.
//!
//! Case counts: all-reduce 160, all-gather 48, send/recv 48, sum-scatter 32, sequences 32,
//! faults 64, determinism 8. Ranks 2..=8, wires 1..=4, all 14 dtypes × 3 ops, both frame rules,
//! sizes around 32 KiB, 2·R·C elements, 64 KiB and frame boundaries. A failing case prints
//! itself; its `seed` field reproduces it.
//!
//! Near 800 lines because the property tests share one case type, its generators and its
//! runner against the model; the multi-wire mesh has its own file (`jaccl_wires.rs`).

use crate::common::jaccl_model;
use crate::common::values;

use std::sync::Arc;
use std::time::Duration;

use nuvec_core::DType;
use nuvec_distributed::Error;
use nuvec_distributed::fabric::Channel;
use nuvec_distributed::jaccl::{FrameRule, JacclCommunicator};
use nuvec_distributed::reduce::Reduction;
use nuvec_fabric_sim::{Fault, Outcome, Report, Sim, Uc, Unexpected};
use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, FileFailurePersistence, TestCaseError};
use rand::{Rng, RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use jaccl_model::Messages;
use values::{DTYPES, OPS, typed_values};

/// The timeout of every operation (virtual time).
const TIMEOUT: Duration = Duration::from_secs(30);
/// How late after its deadline a rank may return.
const SLACK: Duration = Duration::from_millis(1);
/// Wall-clock limit of one simulated run.
const WATCHDOG: Duration = Duration::from_secs(120);

/// How the ranks are cabled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Topo {
    Mesh,
    Ring { wires: usize },
}

/// One operation every rank issues.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Op {
    Reduce {
        op: Reduction,
        dtype: DType,
        n: usize,
    },
    Gather {
        n: usize,
    },
    /// Sum-scatter of shards of `n` elements.
    Scatter {
        op: Reduction,
        dtype: DType,
        n: usize,
    },
    /// Rank r sends `n` bytes to r + shift and receives from r − shift.
    SendRecv {
        shift: usize,
        n: usize,
    },
}

/// A fault, placed relative to the fault-free run.
#[derive(Clone, Debug, PartialEq)]
enum FaultSpec {
    /// The `nth` message (modulo what was sent) of `rank` on its first channel is lost.
    Lose { rank: usize, nth: u64 },
    /// The send of that message completes with an error status.
    ErrorStatus { rank: usize, nth: u64 },
    /// `rank` crashes at its `call`-th fabric call.
    Crash { rank: usize, call: u64 },
    /// `rank` stalls past the timeout at ‰ of the clean run.
    Stall { rank: usize, permille: u64 },
    /// UC's rule with MLX's two posted receives: unexpected messages are dropped.
    Drop,
    /// Random loss of this probability.
    Loss(f64),
}

#[derive(Clone, Debug)]
struct Case {
    topo: Topo,
    ranks: usize,
    large: bool,
    seed: u64,
    ops: Vec<Op>,
    fault: Option<FaultSpec>,
}

impl Case {
    fn rule(&self) -> FrameRule {
        if self.large {
            FrameRule::Large
        } else {
            FrameRule::Small
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Strategies
// ---------------------------------------------------------------------------------------------

/// An element count near one of JACCL's thresholds for R ranks, C wires, s-byte elements.
fn threshold_count(rng: &mut ChaCha8Rng, ranks: usize, wires: usize, s: usize) -> usize {
    let near =
        |x: usize, rng: &mut ChaCha8Rng| (x as i64 + rng.random_range(-2i64..=2)).max(0) as usize;
    match rng.random_range(0..8) {
        0 => rng.random_range(0..=2 * ranks * wires + 2),
        1 => near(2 * ranks * wires, rng),
        2 => near(32768 / s, rng),
        3 => near(65536 / s, rng),
        // Frame boundaries of a rank's chunk or a whole buffer.
        4 => near(ranks * 4096 * rng.random_range(1..=3) / s, rng),
        5 => near(4096 * rng.random_range(1..=12) / s, rng),
        // Large frames: a slice per wire of 8 KiB or more.
        6 => near(2 * ranks * wires * 8192 * rng.random_range(1..=2) / s, rng),
        _ => rng.random_range(0..=24_000 / s.max(1)),
    }
}

fn random_op(rng: &mut ChaCha8Rng, topo: Topo, ranks: usize) -> Op {
    let wires = match topo {
        Topo::Mesh => 1,
        Topo::Ring { wires } => wires,
    };
    let dtype = DTYPES[rng.random_range(0..DTYPES.len())];
    let op = OPS[rng.random_range(0..OPS.len())];
    match rng.random_range(0..10) {
        0..=5 => Op::Reduce {
            op,
            dtype,
            n: threshold_count(rng, ranks, wires, dtype.size()),
        },
        6 | 7 => Op::Gather {
            n: threshold_count(rng, ranks, wires, 1).min(40_000),
        },
        8 => Op::Scatter {
            op,
            dtype,
            n: threshold_count(rng, 1, 1, dtype.size()).min(12_000),
        },
        _ => Op::SendRecv {
            shift: match topo {
                Topo::Mesh => rng.random_range(1..ranks),
                Topo::Ring { .. } if rng.random_bool(0.5) => 1,
                Topo::Ring { .. } => ranks - 1,
            },
            n: threshold_count(rng, 1, wires, 1).min(40_000),
        },
    }
}

/// A case of `ops` operations drawn from `kinds` (0 reduce, 1 gather, 2 scatter, 3 send/recv,
/// anything else any).
fn case(ops: usize, kind: u8, faulty: bool) -> impl Strategy<Value = Case> {
    (
        any::<u64>(),
        2usize..=8,
        1usize..=4,
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(move |(seed, ranks, wires, mesh, large)| {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let topo = if mesh {
                Topo::Mesh
            } else {
                Topo::Ring { wires }
            };
            let ops = (0..ops)
                .map(|_| {
                    loop {
                        let op = random_op(&mut rng, topo, ranks);
                        let fits = match (&op, kind) {
                            (Op::Reduce { .. }, 0)
                            | (Op::Gather { .. }, 1)
                            | (Op::Scatter { .. }, 2)
                            | (Op::SendRecv { .. }, 3) => true,
                            (_, 0..=3) => false,
                            _ => true,
                        };
                        if fits {
                            break op;
                        }
                    }
                })
                .collect();
            let fault = faulty.then(|| {
                let rank = rng.random_range(0..ranks);
                match rng.random_range(0..6) {
                    0 => FaultSpec::Lose {
                        rank,
                        nth: rng.random_range(0..64),
                    },
                    1 => FaultSpec::ErrorStatus {
                        rank,
                        nth: rng.random_range(0..64),
                    },
                    2 => FaultSpec::Crash {
                        rank,
                        call: rng.random_range(0..4),
                    },
                    3 => FaultSpec::Stall {
                        rank,
                        permille: rng.random_range(0..900),
                    },
                    4 => FaultSpec::Drop,
                    _ => FaultSpec::Loss(0.02),
                }
            });
            Case {
                topo,
                ranks,
                large,
                seed,
                ops,
                fault,
            }
        })
}

// ---------------------------------------------------------------------------------------------
// Inputs and expectations
// ---------------------------------------------------------------------------------------------

/// `inputs[op][rank]`.
fn inputs(case: &Case) -> Vec<Vec<Vec<u8>>> {
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
                        Op::Scatter { dtype, n, .. } => {
                            typed_values(&mut rng, dtype, n * case.ranks, specials)
                        }
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

/// `results[op][rank]` and the messages of the whole sequence.
fn expected(case: &Case, inputs: &[Vec<Vec<u8>>]) -> (Vec<Vec<Vec<u8>>>, Messages) {
    let (r, large) = (case.ranks, case.large);
    let mut messages = Messages::new();
    let mut results = Vec::new();
    for (op, ins) in case.ops.iter().zip(inputs) {
        let per_rank: Vec<Vec<u8>> = match *op {
            Op::Reduce { op, dtype, n } => {
                let s = dtype.size();
                let value = match case.topo {
                    Topo::Mesh => {
                        jaccl_model::mesh_reduce_messages(&mut messages, large, r, n, s);
                        jaccl_model::mesh_all_reduce(dtype, op, ins, 1)
                    }
                    Topo::Ring { wires } => {
                        jaccl_model::ring_reduce_messages(&mut messages, large, r, wires, n, s);
                        jaccl_model::ring_fold(large, dtype, op, wires, ins)
                    }
                };
                vec![value; r]
            }
            Op::Scatter { op, dtype, n } => {
                let s = dtype.size();
                match case.topo {
                    Topo::Mesh => {
                        jaccl_model::mesh_gather_messages(&mut messages, large, r, n * s);
                        (0..r)
                            .map(|k| jaccl_model::mesh_scatter(dtype, op, ins, k))
                            .collect()
                    }
                    Topo::Ring { wires } => {
                        jaccl_model::ring_scatter_messages(&mut messages, large, r, wires, n, s);
                        (0..r)
                            .map(|k| jaccl_model::ring_scatter(large, dtype, op, wires, ins, k))
                            .collect()
                    }
                }
            }
            Op::Gather { n } => {
                match case.topo {
                    Topo::Mesh => jaccl_model::mesh_gather_messages(&mut messages, large, r, n),
                    Topo::Ring { wires } => {
                        jaccl_model::ring_gather_messages(&mut messages, large, r, wires, n)
                    }
                }
                vec![ins.concat(); r]
            }
            Op::SendRecv { shift, n } => {
                for src in 0..r {
                    let dst = (src + shift) % r;
                    match case.topo {
                        Topo::Mesh => {
                            jaccl_model::mesh_send_messages(&mut messages, large, src, dst, n)
                        }
                        Topo::Ring { wires } => jaccl_model::ring_send_messages(
                            &mut messages,
                            large,
                            r,
                            wires,
                            src,
                            dst,
                            n,
                        ),
                    }
                }
                (0..r).map(|k| ins[(k + r - shift) % r].clone()).collect()
            }
        };
        results.push(per_rank);
    }
    (results, messages)
}

// ---------------------------------------------------------------------------------------------
// Running
// ---------------------------------------------------------------------------------------------

/// What one rank saw of one operation: its result and the virtual times around it.
#[derive(Debug, Clone, PartialEq)]
struct OpRun {
    result: Result<Vec<u8>, String>,
    error: Option<Error>,
    start: Duration,
    end: Duration,
}

fn sim_of(case: &Case) -> Sim {
    let sim = match case.topo {
        Topo::Mesh => Sim::mesh(case.ranks),
        Topo::Ring { wires } => Sim::jaccl_ring(case.ranks, wires),
    };
    sim.seed(case.seed).record_wire(true)
}

fn run(
    case: &Case,
    inputs: &Arc<Vec<Vec<Vec<u8>>>>,
    sim: Sim,
) -> Result<Report<Vec<OpRun>>, String> {
    let case = case.clone();
    let inputs = Arc::clone(inputs);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let report = sim.run(|fabric| rank_program(fabric, &case, &inputs));
        let _ = tx.send(report);
    });
    rx.recv_timeout(WATCHDOG)
        .map_err(|_| format!("the simulation did not finish within {WATCHDOG:?} (a hang)"))
}

fn rank_program(
    fabric: nuvec_fabric_sim::SimFabric,
    case: &Case,
    inputs: &[Vec<Vec<u8>>],
) -> Vec<OpRun> {
    let clock = fabric.clock();
    let rank = nuvec_distributed::fabric::Fabric::rank(&fabric);
    let r = case.ranks;
    let comm = match case.topo {
        Topo::Mesh => JacclCommunicator::mesh(fabric, case.rule(), TIMEOUT),
        Topo::Ring { wires } => JacclCommunicator::ring(fabric, wires, case.rule(), TIMEOUT),
    };
    let mut runs = Vec::new();
    for (op, ins) in case.ops.iter().zip(inputs) {
        let start = clock.now();
        let result: Result<Vec<u8>, Error> = match *op {
            Op::Reduce { op, dtype, .. } => {
                let mut data = ins[rank].clone();
                comm.try_all_reduce(op, dtype, &mut data).map(|()| data)
            }
            Op::Scatter { op, dtype, n } => {
                let mut out = vec![0u8; n * dtype.size()];
                comm.try_sum_scatter(op, dtype, &ins[rank], &mut out)
                    .map(|()| out)
            }
            Op::Gather { n } => {
                let mut out = vec![0u8; n * r];
                comm.try_all_gather(&ins[rank], &mut out).map(|()| out)
            }
            Op::SendRecv { shift, n } => {
                let mut out = vec![0u8; n];
                let (dst, src) = ((rank + shift) % r, (rank + r - shift) % r);
                comm.try_send(dst, &ins[rank])
                    .and_then(|()| comm.try_recv(src, &mut out))
                    .map(|()| out)
            }
        };
        let end = clock.now();
        runs.push(OpRun {
            result: result.clone().map_err(|e| e.to_string()),
            error: result.err(),
            start,
            end,
        });
    }
    runs
}

fn check_clean(case: &Case, report: &Report<Vec<OpRun>>) -> Result<(), String> {
    let ins = inputs(case);
    let (want, messages) = expected(case, &ins);
    for (rank, outcome) in report.outcomes.iter().enumerate() {
        let Outcome::Returned(runs) = outcome else {
            return Err(format!("rank {rank}: {outcome:?}"));
        };
        for (i, run) in runs.iter().enumerate() {
            match &run.result {
                Ok(v) if *v == want[i][rank] => {}
                Ok(v) => {
                    let at = v.iter().zip(&want[i][rank]).position(|(a, b)| a != b);
                    return Err(format!(
                        "rank {rank} op {i} ({:?}): wrong result ({} bytes, want {}; first difference at byte {at:?})",
                        case.ops[i],
                        v.len(),
                        want[i][rank].len()
                    ));
                }
                Err(e) => return Err(format!("rank {rank} op {i}: {e}")),
            }
        }
    }
    if report.messages != messages {
        let keys: std::collections::BTreeSet<&(usize, Channel)> =
            report.messages.keys().chain(messages.keys()).collect();
        for k in keys {
            let (got, want) = (report.messages.get(k), messages.get(k));
            if got != want {
                let summary = |m: Option<&Vec<usize>>| {
                    m.map_or("none".to_string(), |v| {
                        format!(
                            "{} messages, sizes {:?}",
                            v.len(),
                            v.iter().collect::<std::collections::BTreeSet<_>>()
                        )
                    })
                };
                return Err(format!(
                    "messages of rank {} on {}: got {}, MLX sends {}",
                    k.0,
                    k.1,
                    summary(got),
                    summary(want)
                ));
            }
        }
    }
    Ok(())
}

fn check_case(case: &Case) -> Result<(), String> {
    let ins = Arc::new(inputs(case));
    let clean = run(case, &ins, sim_of(case))?;
    let Some(spec) = &case.fault else {
        return check_clean(case, &clean);
    };
    check_clean(case, &clean).map_err(|e| format!("(the fault-free run) {e}"))?;
    let first_channel = |rank: usize| match case.topo {
        Topo::Mesh => Channel::new((rank + 1) % case.ranks, 0),
        Topo::Ring { .. } => Channel::new((rank + 1) % case.ranks, 0),
    };
    let sent = |rank: usize| {
        clean
            .messages
            .get(&(rank, first_channel(rank)))
            .map_or(0, |m| m.len() as u64)
    };
    let mut sim = sim_of(case);
    match *spec {
        FaultSpec::Lose { rank, nth } => {
            if sent(rank) == 0 {
                return Ok(());
            }
            sim = sim.fault(Fault::Lose {
                rank,
                channel: first_channel(rank),
                message: nth % sent(rank),
            });
        }
        FaultSpec::ErrorStatus { rank, nth } => {
            if sent(rank) == 0 {
                return Ok(());
            }
            sim = sim.fault(Fault::ErrorStatus {
                rank,
                channel: first_channel(rank),
                message: nth % sent(rank),
            });
        }
        FaultSpec::Crash { rank, call } => sim = sim.fault(Fault::Crash { rank, call }),
        FaultSpec::Stall { rank, permille } => {
            sim = sim.fault(Fault::Stall {
                rank,
                at: clean.end * permille as u32 / 1000,
                duration: TIMEOUT * 3,
            })
        }
        FaultSpec::Drop => {
            sim = sim.uc(Uc {
                posted: 2,
                unexpected: Unexpected::Drop,
                loss: 0.0,
            })
        }
        FaultSpec::Loss(p) => {
            sim = sim.uc(Uc {
                loss: p,
                ..Uc::default()
            })
        }
    }
    let report = run(case, &ins, sim)?;
    let (want, _) = expected(case, &ins);
    for (rank, outcome) in report.outcomes.iter().enumerate() {
        let runs = match outcome {
            Outcome::Returned(runs) => runs,
            Outcome::Crashed => continue,
            Outcome::Panicked(p) => return Err(format!("rank {rank} panicked: {p}")),
        };
        let mut failed: Option<usize> = None;
        for (i, run) in runs.iter().enumerate() {
            if let Some(first) = failed {
                // Every operation after the first failure fails at once with that failure.
                match &run.error {
                    Some(Error::Failed { .. }) if run.end == run.start => {}
                    other => {
                        return Err(format!(
                            "rank {rank} op {i} after its failure at op {first}: {other:?}"
                        ));
                    }
                }
                continue;
            }
            match (&run.result, &run.error) {
                (Ok(v), _) if *v == want[i][rank] => {}
                (Ok(_), _) => {
                    return Err(format!(
                        "rank {rank} op {i} ({:?}) returned wrong data under {spec:?}",
                        case.ops[i]
                    ));
                }
                (Err(text), Some(Error::Transport { .. })) => {
                    if !text.contains("rank ") {
                        return Err(format!("rank {rank} op {i}: no peer named: {text}"));
                    }
                    // A stalled rank is frozen past its deadline, and fails as it wakes.
                    let stalled = matches!(*spec, FaultSpec::Stall { rank: s, .. } if s == rank);
                    if !stalled && run.end > run.start + TIMEOUT + SLACK {
                        return Err(format!(
                            "rank {rank} op {i} failed {:?} after it started, past its deadline: {text}",
                            run.end - run.start
                        ));
                    }
                    failed = Some(i);
                }
                (Err(text), _) => {
                    return Err(format!("rank {rank} op {i}: unexpected error {text}"));
                }
            }
        }
    }
    // A rank crashed before it sent anything: every live rank must have failed.
    if let FaultSpec::Crash {
        rank: dead,
        call: 0,
    } = *spec
    {
        for (rank, outcome) in report.outcomes.iter().enumerate() {
            if rank == dead {
                continue;
            }
            if let Outcome::Returned(runs) = outcome
                && runs.iter().all(|r| r.result.is_ok())
                && case.ops.iter().any(|op| needs_all(op, case))
            {
                return Err(format!(
                    "rank {rank} succeeded although rank {dead} crashed before sending"
                ));
            }
        }
    }
    Ok(())
}

/// Whether every rank must hear from every other in `op` (so a dead rank fails everyone).
fn needs_all(op: &Op, case: &Case) -> bool {
    match *op {
        Op::Reduce { n, dtype, .. } => n * dtype.size() > 0 && case.topo == Topo::Mesh,
        _ => false,
    }
}

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/sim_jaccl.txt",
        ))),
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config(160))]
    #[test]
    fn every_all_reduce_equals_the_reference_fold_on_every_rank_with_mlx_message_counts(case in case(1, 0, false)) {
        check_case(&case).map_err(|e| TestCaseError::fail(format!("{e}\ncase: {case:?}")))?;
    }
}

proptest! {
    #![proptest_config(config(48))]
    #[test]
    fn every_all_gather_concatenates_in_rank_order_with_mlx_message_counts(case in case(1, 1, false)) {
        check_case(&case).map_err(|e| TestCaseError::fail(format!("{e}\ncase: {case:?}")))?;
    }

    #[test]
    fn send_and_recv_deliver_exactly_with_mlx_message_counts(case in case(1, 3, false)) {
        check_case(&case).map_err(|e| TestCaseError::fail(format!("{e}\ncase: {case:?}")))?;
    }
}

proptest! {
    #![proptest_config(config(32))]
    #[test]
    fn sum_scatter_gives_every_rank_its_shard_of_the_fold(case in case(1, 2, false)) {
        check_case(&case).map_err(|e| TestCaseError::fail(format!("{e}\ncase: {case:?}")))?;
    }

    #[test]
    fn sequences_of_operations_stay_aligned(case in case(4, 9, false)) {
        check_case(&case).map_err(|e| TestCaseError::fail(format!("{e}\ncase: {case:?}")))?;
    }
}

proptest! {
    #![proptest_config(config(64))]
    #[test]
    fn under_loss_or_a_dead_peer_every_rank_fails_naming_a_peer_by_its_deadline_and_none_returns_wrong_data(
        case in case(3, 9, true)
    ) {
        check_case(&case).map_err(|e| TestCaseError::fail(format!("{e}\ncase: {case:?}")))?;
    }
}

proptest! {
    #![proptest_config(config(8))]
    #[test]
    fn the_same_case_gives_the_same_trace(case in case(2, 9, false)) {
        let ins = Arc::new(inputs(&case));
        let a = run(&case, &ins, sim_of(&case)).map_err(TestCaseError::fail)?;
        let b = run(&case, &ins, sim_of(&case)).map_err(TestCaseError::fail)?;
        prop_assert_eq!(a.trace_hash, b.trace_hash);
        prop_assert_eq!(a.end, b.end);
        prop_assert_eq!(&a.outcomes, &b.outcomes);
        prop_assert_eq!(&a.messages, &b.messages);
    }
}

#[test]
fn a_dead_peer_fails_every_mesh_rank_naming_it_where_mlx_would_spin_forever() {
    let case = Case {
        topo: Topo::Mesh,
        ranks: 4,
        large: false,
        seed: 7,
        ops: vec![Op::Reduce {
            op: Reduction::Sum,
            dtype: DType::F32,
            n: 1000,
        }],
        fault: None,
    };
    let ins = Arc::new(inputs(&case));
    let sim = sim_of(&case).fault(Fault::Crash { rank: 2, call: 0 });
    let report = run(&case, &ins, sim).expect("no hang");
    for (rank, outcome) in report.outcomes.iter().enumerate() {
        if rank == 2 {
            assert_eq!(*outcome, Outcome::Crashed);
            continue;
        }
        let Outcome::Returned(runs) = outcome else {
            panic!("rank {rank}: {outcome:?}")
        };
        let text = runs[0].result.as_ref().expect_err("must fail");
        assert!(text.contains("rank 2"), "rank {rank}: {text}");
        assert!(text.contains("timed out"), "rank {rank}: {text}");
        assert!(
            runs[0].end <= TIMEOUT + SLACK,
            "rank {rank}: {:?}",
            runs[0].end
        );
    }
}

#[test]
fn a_lost_message_is_named_by_the_rank_that_missed_it() {
    let case = Case {
        topo: Topo::Ring { wires: 1 },
        ranks: 3,
        large: false,
        seed: 11,
        ops: vec![
            Op::Reduce {
                op: Reduction::Sum,
                dtype: DType::F32,
                n: 30_000,
            },
            Op::Reduce {
                op: Reduction::Max,
                dtype: DType::I32,
                n: 30_000,
            },
        ],
        fault: None,
    };
    let ins = Arc::new(inputs(&case));
    let sim = sim_of(&case).fault(Fault::Lose {
        rank: 0,
        channel: Channel::new(1, 0),
        message: 3,
    });
    let report = run(&case, &ins, sim).expect("no hang");
    let Outcome::Returned(runs) = &report.outcomes[1] else {
        panic!("{:?}", report.outcomes[1])
    };
    let text = runs[0]
        .result
        .as_ref()
        .expect_err("rank 1 misses a message");
    assert!(text.contains("rank 0") && text.contains("lost"), "{text}");
}

#[test]
fn a_message_of_the_wrong_size_fails_the_receive() {
    // Frame rules that differ between ranks (macOS 26.2 and 26.3 peers) cannot share a job:
    // the receiver sees messages of the wrong size and says so.
    let report = Sim::mesh(2).seed(3).run(|fabric| {
        let rank = nuvec_distributed::fabric::Fabric::rank(&fabric);
        let rule = if rank == 0 {
            FrameRule::Small
        } else {
            FrameRule::Large
        };
        let comm = JacclCommunicator::mesh(fabric, rule, TIMEOUT);
        let mut data = vec![1u8; 64 * 1024];
        comm.try_all_reduce(Reduction::Sum, DType::U8, &mut data)
            .map_err(|e| e.to_string())
    });
    let errors: Vec<String> = report
        .outcomes
        .into_iter()
        .filter_map(|o| o.returned().and_then(Result::err))
        .collect();
    assert!(
        errors
            .iter()
            .any(|e| e.contains("bytes arrived for a receive of")),
        "{errors:?}"
    );
}
