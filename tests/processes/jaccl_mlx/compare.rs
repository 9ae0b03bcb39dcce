//! The comparison of a mixed job with the all-MLX-code reference: every rank's bits, with the
//! documented differences allowed exactly, and the messages of every queue pair.

use super::plan::{Op, Plan, Shape};
use crate::common::{jaccl_model, mlx_model::Lane};

use std::collections::BTreeMap;
use std::time::Duration;

use nuvec_core::DType;
use nuvec_distributed::reduce::Reduction;

/// What a job left: every rank's result of every operation, and the message log as the
/// sizes of the messages of every (event, queue pair), in order.
pub(super) struct Ran {
    pub(super) results: Vec<Vec<Vec<u8>>>,
    pub(super) log: BTreeMap<String, Vec<usize>>,
    pub(super) elapsed: Duration,
}

/// The folds MLX's mesh sum-scatter can give for one element of owner `owner`'s shard: the
/// owner's element first, then every peer's in some order (the order their messages
/// complete).
pub(super) fn owner_first_folds(
    lane: Lane,
    op: Reduction,
    owner: usize,
    xs: &[&[u8]],
) -> Vec<Vec<u8>> {
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
pub(super) fn completion_ordered(
    shape: &Shape,
    op: &Op,
    rank: usize,
) -> Option<Vec<(usize, usize, usize)>> {
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
pub(super) fn non_finite(lane: Lane, bits: &[u8], or_inf: bool) -> bool {
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
pub(super) fn both_nan_sum(
    lane: Lane,
    op: Reduction,
    a: &[u8],
    b: &[u8],
    inputs: &[&[u8]],
) -> bool {
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
pub(super) fn compare(shape: &Shape, plan: &Plan, want: &Ran, got: &Ran, what: &str) {
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
