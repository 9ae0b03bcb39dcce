//! `Group::split` in the simulator: random colors and keys over 2–8 ranks, collectives on the
//! sub-groups and the parent interleaved, each result checked against a model, over MLX's
//! ring and JACCL's mesh; determinism; a crash inside one sub-group; a JACCL ring's cables.

use std::time::Duration;

use nuvec_core::Array;
use nuvec_core::distributed::{self, Group};
use nuvec_distributed::jaccl::FrameRule;
use nuvec_fabric_sim::{Fault, Outcome, Sim};
use proptest::prelude::*;

const TIMEOUT: Duration = Duration::from_secs(30);

/// One step of the program every rank runs.
#[derive(Clone, Copy, Debug)]
enum Op {
    /// all_sum of `len` floats on the parent.
    ParentSum(usize),
    /// all_sum of `len` floats on the sub-group.
    SubSum(usize),
    /// all_gather of the parent rank on the sub-group.
    SubGather,
}

/// The sub-group of each rank (parent ranks in group order) when rank r passed `choices[r]`:
/// the model, written without the crate's code.
fn model_groups(choices: &[(i32, i32)]) -> Vec<Vec<usize>> {
    (0..choices.len())
        .map(|me| {
            let mut members: Vec<usize> = (0..choices.len())
                .filter(|&r| choices[r].0 == choices[me].0)
                .collect();
            members.sort_by_key(|&r| {
                let key = choices[r].1;
                (if key < 0 { r as i64 } else { i64::from(key) }, r)
            });
            members
        })
        .collect()
}

/// What rank `r` contributes to the `step`-th operation, element `i`.
fn value(r: usize, step: usize, i: usize) -> f32 {
    ((r * 31 + step * 7 + i) % 97) as f32
}

fn floats(r: usize, step: usize, len: usize) -> Array {
    let v: Vec<f32> = (0..len).map(|i| value(r, step, i)).collect();
    Array::from_slice(&v, [len])
}

/// Runs the program on one rank: split, then every op; the results as floats.
fn program(group: &Group, choices: &[(i32, i32)], ops: &[Op]) -> Result<Vec<Vec<f32>>, String> {
    let r = group.rank();
    let (color, key) = choices[r];
    let sub = group.split(color, key).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for (step, op) in ops.iter().enumerate() {
        let result = match *op {
            Op::ParentSum(len) => distributed::all_sum(&floats(r, step, len), Some(group)),
            Op::SubSum(len) => distributed::all_sum(&floats(r, step, len), Some(&sub)),
            Op::SubGather => {
                let x = Array::from_slice(&[r as f32], [1]);
                distributed::all_gather(&x, Some(&sub))
            }
        };
        out.push(result.to_vec::<f32>().map_err(|e| e.to_string())?);
    }
    Ok(out)
}

/// What `program` must return on rank `r`.
fn model(r: usize, size: usize, groups: &[Vec<usize>], ops: &[Op]) -> Vec<Vec<f32>> {
    ops.iter()
        .enumerate()
        .map(|(step, op)| match *op {
            Op::ParentSum(len) => (0..len)
                .map(|i| (0..size).map(|q| value(q, step, i)).sum())
                .collect(),
            Op::SubSum(len) => (0..len)
                .map(|i| groups[r].iter().map(|&q| value(q, step, i)).sum())
                .collect(),
            Op::SubGather => groups[r].iter().map(|&q| q as f32).collect(),
        })
        .collect()
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        prop_oneof![
            (0usize..40).prop_map(Op::ParentSum),
            (0usize..40).prop_map(Op::SubSum),
            Just(Op::SubGather),
        ],
        1..6,
    )
}

fn check(
    report: nuvec_fabric_sim::Report<Result<Vec<Vec<f32>>, String>>,
    choices: &[(i32, i32)],
    ops: &[Op],
) -> Result<(), TestCaseError> {
    let groups = model_groups(choices);
    let size = choices.len();
    let replay = report.replay();
    for (r, outcome) in report.outcomes.into_iter().enumerate() {
        match outcome {
            Outcome::Returned(Ok(got)) => {
                prop_assert_eq!(
                    got,
                    model(r, size, &groups, ops),
                    "rank {} ({})",
                    r,
                    &replay
                );
            }
            other => prop_assert!(false, "rank {}: {:?} ({})", r, other, &replay),
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn random_splits_of_a_ring_agree_with_the_model(
        choices in prop::collection::vec((0i32..3, -4i32..4), 2..9),
        ops in ops(),
        links in 1usize..3,
        seed in any::<u64>(),
    ) {
        let report = Sim::ring(choices.len(), links)
            .seed(seed)
            .max_fragment(13)
            .latency(Duration::from_micros(5), Duration::from_micros(3))
            .run_ring(TIMEOUT, |group| program(&group, &choices, &ops));
        check(report, &choices, &ops)?;
    }

    #[test]
    fn random_splits_of_a_jaccl_mesh_agree_with_the_model(
        choices in prop::collection::vec((0i32..3, -4i32..4), 2..9),
        ops in ops(),
        seed in any::<u64>(),
    ) {
        let report = Sim::mesh(choices.len())
            .seed(seed)
            .run_jaccl(TIMEOUT, FrameRule::Small, |group| program(&group, &choices, &ops));
        check(report, &choices, &ops)?;
    }
}

#[test]
fn a_split_job_gives_the_same_trace_for_the_same_seed() {
    let choices = [(0, -1), (1, 3), (0, 0), (1, -1), (0, 2)];
    let ops = [
        Op::SubSum(9),
        Op::ParentSum(3),
        Op::SubGather,
        Op::SubSum(1),
    ];
    let run = || {
        Sim::ring(5, 2)
            .seed(11)
            .max_fragment(5)
            .run_ring(TIMEOUT, |group| program(&group, &choices, &ops))
    };
    let (a, b) = (run(), run());
    assert_eq!(a.trace_hash, b.trace_hash);
    check(a, &choices, &ops).expect("model");
}

#[test]
fn a_crash_inside_one_sub_group_fails_its_ranks_by_the_deadline_and_the_parents_next_operation() {
    // Rows {0, 1} and {2, 3}; rank 3 crashes at the first fabric call after the split has
    // completed on every other rank (found by trying each call in turn: deterministic).
    let timeout = Duration::from_secs(5);
    type Seen = (
        Result<Vec<f32>, String>,
        Vec<Result<Vec<f32>, String>>,
        Result<Vec<f32>, String>,
    );
    let run = |call: u64| {
        Sim::ring(4, 1)
            .seed(3)
            .fault(Fault::Crash { rank: 3, call })
            .run_ring(timeout, |group| {
                let r = group.rank();
                let rows = group.split((r / 2) as i32, -1).map_err(|e| e.to_string())?;
                let x = Array::from_slice(&[1.0f32], [1]);
                let sum = |g: &Group| {
                    distributed::all_sum(&x, Some(g))
                        .to_vec::<f32>()
                        .map_err(|e| e.to_string())
                };
                let row = sum(&rows);
                let row_after: Vec<_> = (0..3).map(|_| sum(&rows)).collect();
                let parent = sum(&group);
                Ok::<Seen, String>((row, row_after, parent))
            })
    };
    let report = (0..200)
        .map(run)
        .find(|report| {
            report.outcomes[..3]
                .iter()
                .all(|o| matches!(o, Outcome::Returned(Ok(_))))
        })
        .expect("a call after the split");
    let end = report.end;
    let outcomes = report.outcomes;
    assert!(matches!(outcomes[3], Outcome::Crashed), "{:?}", outcomes[3]);
    for (r, outcome) in outcomes.into_iter().enumerate().take(3) {
        let Outcome::Returned(Ok((row, row_after, parent))) = outcome else {
            panic!("rank {r}: {outcome:?}");
        };
        if r < 2 {
            // The row without the crashed rank works throughout.
            assert_eq!(row, Ok(vec![2.0]), "rank {r}");
            assert!(
                row_after.iter().all(|s| s == &Ok(vec![2.0])),
                "rank {r}: {row_after:?}"
            );
        } else {
            // Rank 2 shares its row with the crashed rank: its row fails.
            assert!(row.is_err(), "rank {r}: {row:?}");
            assert!(
                row_after.iter().all(|s| s.is_err()),
                "rank {r}: {row_after:?}"
            );
        }
        let err = parent.expect_err("the parent's next operation fails");
        assert!(err.contains("rank"), "rank {r}: {err}");
    }
    assert!(end <= timeout * 3, "ended at {end:?}");
}

#[test]
fn a_simulated_jaccl_ring_splits_along_its_cables_and_names_a_missing_one() {
    let report = Sim::jaccl_ring(4, 2)
        .seed(5)
        .run_jaccl(TIMEOUT, FrameRule::Small, |group| {
            let r = group.rank();
            let pair = group.split((r / 2) as i32, -1).map_err(|e| e.to_string())?;
            let x = Array::from_slice(&[r as f32], [1]);
            let pair_sum = distributed::all_sum(&x, Some(&pair)).to_vec::<f32>();
            let across = group.split((r % 2) as i32, -1).err().map(|e| e.to_string());
            let parent = distributed::all_sum(&x, Some(&group)).to_vec::<f32>();
            Ok::<_, String>((
                pair_sum.map_err(|e| e.to_string())?,
                across,
                parent.map_err(|e| e.to_string())?,
            ))
        });
    for (r, outcome) in report.outcomes.into_iter().enumerate() {
        let Outcome::Returned(Ok((pair, across, parent))) = outcome else {
            panic!("rank {r}: {outcome:?}");
        };
        assert_eq!(pair, vec![if r < 2 { 1.0 } else { 5.0 }], "rank {r}");
        let across = across.expect("no cable between ranks two apart");
        let cable = if r.is_multiple_of(2) {
            "job ranks 0 and 2"
        } else {
            "job ranks 1 and 3"
        };
        assert!(across.contains(cable), "rank {r}: {across}");
        assert_eq!(parent, vec![6.0], "rank {r}");
    }
}
