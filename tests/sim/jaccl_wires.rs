//! JACCL's multi-wire mesh (MLX 0.32.4's `MeshGroup` with `n_wires_`) in the simulator, over
//! UC message channels (`Sim::mesh_wires`): meshes of 2 to 8 ranks with 1, 2 and 3 wires run
//! the matrix of `tests/common/jaccl_wires.rs` (every collective and dtype on both sides of
//! 32 KiB and 512 KiB), and every rank's every result must be the model's, bit for bit, and
//! the messages on every queue pair (wire w's to peer p: link w) MLX's; with one wire the model
//! is the one-wire model's. A lost message or a dead peer on a multi-wire mesh fails every rank
//! naming a peer, never with wrong data, and one seed gives one trace.

use crate::common::jaccl_model;
use crate::common::jaccl_wires;

use std::time::Duration;

use nuvec_distributed::fabric::Channel;
use nuvec_distributed::jaccl::{FrameRule, JacclCommunicator};
use nuvec_fabric_sim::{Fault, Outcome, Report, Sim, SimFabric};

use jaccl_wires::{SendOrder, WireOp};

/// The timeout of every operation (virtual time).
const TIMEOUT: Duration = Duration::from_secs(30);

/// What one rank saw of one operation.
type Run = Result<Vec<u8>, String>;

/// Runs `ops` on every rank of the simulated mesh `sim` with the frame rule `rule`.
fn run_ops(sim: &Sim, rule: FrameRule, ops: &[WireOp], ins: &[Vec<Vec<u8>>]) -> Report<Vec<Run>> {
    sim.run(|fabric: SimFabric| {
        let rank = nuvec_distributed::fabric::Fabric::rank(&fabric);
        let r = nuvec_distributed::fabric::Fabric::size(&fabric);
        let comm = JacclCommunicator::mesh(fabric, rule, TIMEOUT);
        ops.iter()
            .zip(ins)
            .map(|(op, ins)| {
                jaccl_wires::run(&comm, op, rank, r, &ins[rank], SendOrder::SendFirst)
                    .map_err(|e| e.to_string())
            })
            .collect()
    })
}

/// Runs the matrix on a mesh of `ranks` ranks and `wires` wires and checks every result and
/// every queue pair's messages against the model.
fn check_mesh(ranks: usize, wires: usize) {
    let large = (ranks + wires) % 2 == 1;
    let rule = if large {
        FrameRule::Large
    } else {
        FrameRule::Small
    };
    let seed = (ranks * 10 + wires) as u64;
    let ops = jaccl_wires::ops(ranks, wires);
    let ins = jaccl_wires::inputs(seed, ranks, &ops);
    let sim = Sim::mesh_wires(ranks, wires).seed(seed).record_wire(true);
    let began = std::time::Instant::now();
    let report = run_ops(&sim, rule, &ops, &ins);
    let name = format!("mesh of {ranks} × {wires} wires ({rule:?} frames)");
    for (rank, outcome) in report.outcomes.iter().enumerate() {
        let Outcome::Returned(runs) = outcome else {
            panic!("{name}: rank {rank}: {outcome:?}");
        };
        for (i, (run, op)) in runs.iter().zip(&ops).enumerate() {
            let want = jaccl_wires::result(op, rank, wires, &ins[i]);
            match run {
                Ok(got) => assert!(
                    *got == want,
                    "{name}: rank {rank} op {i} ({op:?}): not the model's bits (first \
                     difference at byte {:?})",
                    got.iter().zip(&want).position(|(a, b)| a != b)
                ),
                Err(e) => panic!("{name}: rank {rank} op {i} ({op:?}): {e}"),
            }
        }
    }
    let want = jaccl_wires::messages(ranks, wires, large, &ops);
    for key in report.messages.keys().chain(want.keys()) {
        let (got, expected) = (report.messages.get(key), want.get(key));
        assert!(
            got == expected,
            "{name}: rank {} on {}: {} messages, MLX sends {}",
            key.0,
            key.1,
            got.map_or(0, Vec::len),
            expected.map_or(0, Vec::len)
        );
    }
    // Every wire carries something: an operation of 512 KiB or more is cut across all.
    for w in 0..wires {
        assert!(
            report.messages.keys().any(|(_, c)| c.link == w),
            "{name}: wire {w} carried nothing"
        );
    }
    eprintln!(
        "{name}: {} operations, {} bytes of payload, in {:?}",
        ops.len(),
        report.payload,
        began.elapsed()
    );
}

#[test]
fn one_wire_meshes_of_two_to_eight_ranks_give_the_models_bits_and_messages() {
    for ranks in 2..=8 {
        check_mesh(ranks, 1);
    }
}

#[test]
fn two_wire_meshes_of_two_to_eight_ranks_give_the_models_bits_and_messages() {
    for ranks in 2..=8 {
        check_mesh(ranks, 2);
    }
}

#[test]
fn three_wire_meshes_of_two_to_eight_ranks_give_the_models_bits_and_messages() {
    for ranks in 2..=8 {
        check_mesh(ranks, 3);
    }
}

#[test]
fn with_one_wire_the_multi_wire_model_is_the_one_wire_model() {
    for ranks in 2..=8 {
        for large in [false, true] {
            for &(e, s) in &[(0, 4), (5, 1), (8193, 4), (131_072, 4), (131_077, 8)] {
                let (mut a, mut b) = (jaccl_model::Messages::new(), jaccl_model::Messages::new());
                jaccl_model::mesh_reduce_messages(&mut a, large, ranks, e, s);
                jaccl_model::mesh_reduce_messages_wires(&mut b, large, ranks, 1, e, s);
                assert_eq!(a, b, "all-reduce of {e} × {s} bytes on {ranks}");
                let (mut a, mut b) = (jaccl_model::Messages::new(), jaccl_model::Messages::new());
                jaccl_model::mesh_gather_messages(&mut a, large, ranks, e * s);
                jaccl_model::mesh_gather_messages_wires(&mut b, large, ranks, 1, e * s);
                assert_eq!(a, b, "all-gather of {e} × {s} bytes on {ranks}");
                let mut c = jaccl_model::Messages::new();
                jaccl_model::mesh_scatter_messages_wires(&mut c, large, ranks, 1, e, s);
                assert_eq!(a, c, "sum-scatter of {e} × {s} bytes on {ranks}");
            }
        }
    }
}

/// A 3-rank mesh of 2 wires running one all-reduce of 1 MiB (both wires, scatter-gather on
/// each) under `fault`: every surviving rank fails naming a peer by its deadline, none returns
/// a result.
fn faulty_large_all_reduce(fault: Fault) -> Vec<(usize, String)> {
    let op = WireOp::Reduce {
        op: nuvec_distributed::reduce::Reduction::Sum,
        dtype: nuvec_core::DType::F32,
        n: 1 << 18,
    };
    let ops = [op];
    let ins = jaccl_wires::inputs(5, 3, &ops);
    let sim = Sim::mesh_wires(3, 2).seed(5).fault(fault);
    let report = run_ops(&sim, FrameRule::Small, &ops, &ins);
    let mut failures = Vec::new();
    for (rank, outcome) in report.outcomes.iter().enumerate() {
        match outcome {
            Outcome::Crashed => {}
            Outcome::Returned(runs) => match &runs[0] {
                Ok(got) => {
                    assert!(
                        *got == jaccl_wires::result(&op, rank, 2, &ins[0]),
                        "rank {rank} returned wrong data"
                    );
                }
                Err(e) => {
                    assert!(e.contains("rank "), "rank {rank}: no peer named: {e}");
                    failures.push((rank, e.clone()));
                }
            },
            Outcome::Panicked(p) => panic!("rank {rank} panicked: {p}"),
        }
    }
    assert!(report.end <= TIMEOUT * 2, "ended at {:?}", report.end);
    failures
}

#[test]
fn a_lost_message_on_the_second_wire_fails_its_receiver_naming_the_sender() {
    let failures = faulty_large_all_reduce(Fault::Lose {
        rank: 0,
        channel: Channel::new(1, 1),
        message: 3,
    });
    assert!(
        failures
            .iter()
            .any(|(rank, e)| *rank == 1 && e.contains("rank 0") && e.contains("lost")),
        "{failures:?}"
    );
}

#[test]
fn a_dead_peer_of_a_multi_wire_mesh_fails_every_other_rank_naming_a_peer() {
    let failures = faulty_large_all_reduce(Fault::Crash { rank: 2, call: 0 });
    let ranks: Vec<usize> = failures.iter().map(|(r, _)| *r).collect();
    assert_eq!(ranks, vec![0, 1], "{failures:?}");
}

#[test]
fn the_same_multi_wire_case_gives_the_same_trace() {
    let ops = [
        WireOp::Gather { n: 600_000 },
        WireOp::SendRecv {
            shift: 1,
            n: 700_001,
        },
    ];
    let ins = jaccl_wires::inputs(9, 4, &ops);
    let sim = Sim::mesh_wires(4, 3).seed(9).record_wire(true);
    let a = run_ops(&sim, FrameRule::Large, &ops, &ins);
    let b = run_ops(&sim, FrameRule::Large, &ops, &ins);
    assert_eq!(a.trace_hash, b.trace_hash);
    assert_eq!(a.end, b.end);
    assert_eq!(a.outcomes, b.outcomes);
    assert_eq!(a.messages, b.messages);
}
