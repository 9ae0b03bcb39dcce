//! Target `jaccl_frames`: JACCL's frame arithmetic against its rules.

use super::ring_schedule::partition;
use super::script::Script;

/// JACCL's frame arithmetic (`jaccl::frames`) for fuzzed R = `1 + b % 12`, C = `1 + b % 4`,
/// s ∈ {1, 2, 4, 8}, either frame rule, and E a `u32` (biased by one more byte toward the
/// 32 KiB, 2·R·C and 64 KiB thresholds and frame boundaries), at most 2^22.
///
/// Properties: a frame is `4096 · 2^k` (k ≤ 7), 4 KiB under the small rule and never above a
/// message of 4 KiB or more under the large one; the frames of a payload cover it once; the
/// mesh folds exactly when R ≤ 2 or N ≤ 32 KiB, and its shards and tail add up to E; the ring
/// uses one direction of one wire exactly below MLX's thresholds, its (direction, wire) slices
/// of all chunks cover the E elements once, each within its step's message count, and what a
/// rank sends at a step is what its neighbour receives; the ring all-gather's pieces cover a
/// block once in two halves; point-to-point pieces cover the bytes once.
pub(crate) fn jaccl_frames(data: &[u8]) {
    use nuvec_distributed::jaccl::frames::{
        FRAME, FrameRule, Frames, MAX_FRAME, MeshReduce, RingGather, RingReduce, ring_p2p,
    };
    let mut script = Script(data);
    let ranks = 1 + usize::from(script.byte() % 12);
    let conns = 1 + usize::from(script.byte() % 4);
    let size = 1usize << (script.byte() % 4);
    let rule = if script.byte() & 1 == 1 {
        FrameRule::Large
    } else {
        FrameRule::Small
    };
    let raw = script.u32() as usize;
    let elements = match script.byte() % 4 {
        0 => {
            let near = [
                32_768 / size,
                2 * ranks * conns,
                65_536 / size,
                ranks * FRAME / size,
            ];
            let base = near[raw % near.len()];
            (base + (raw >> 8) % 9).saturating_sub(4)
        }
        _ => raw % (1 << 22),
    };
    let bytes = elements * size;

    for m in [0, 1, bytes, bytes / ranks.max(1), raw] {
        let f = rule.frame(m);
        assert!(
            f.is_power_of_two() && (FRAME..=MAX_FRAME).contains(&f),
            "frame {f}"
        );
        match rule {
            FrameRule::Small => assert_eq!(f, FRAME),
            FrameRule::Large => {
                assert!(m < FRAME || f <= m, "frame {f} above message {m}");
                assert!(
                    m < 2 * f || f == MAX_FRAME,
                    "frame {f} not the largest for {m}"
                );
            }
        }
        let frames = Frames::new(rule, m, bytes);
        assert_eq!(frames.count(), bytes.div_ceil(f));
        partition(
            (0..frames.count()).map(|i| frames.payload(i)),
            bytes,
            "frames",
        );
    }

    match MeshReduce::choose(elements, size, ranks) {
        MeshReduce::Fold => assert!(ranks <= 2 || bytes <= 32_768),
        MeshReduce::ScatterGather { shard, tail } => {
            assert!(ranks > 2 && bytes > 32_768);
            assert_eq!(shard * ranks + tail, elements);
            assert!(tail < ranks);
        }
    }

    if ranks >= 2 {
        let plan = RingReduce::new(rule, elements, size, ranks, conns);
        let small = bytes <= 32_768 || elements < 2 * ranks * conns;
        assert_eq!((plan.dirs, plan.wires) == (1, 1), small);
        if !small {
            assert_eq!((plan.dirs, plan.wires), (2, conns));
        }
        let mut slices: Vec<std::ops::Range<usize>> = Vec::new();
        for j in 0..ranks {
            for lr in 0..plan.dirs {
                for w in 0..plan.wires {
                    let s = plan.slice(j, lr, w);
                    assert!(s.len() <= plan.messages_per_step() * plan.frame_elements());
                    if !s.is_empty() {
                        slices.push(s);
                    }
                }
            }
        }
        slices.sort_by_key(|r| r.start);
        partition(slices, elements, "ring slices");
        for k in 0..plan.steps() {
            for lr in 0..plan.dirs {
                for rank in 0..ranks {
                    let next = if lr == 0 {
                        (rank + 1) % ranks
                    } else {
                        (rank + ranks - 1) % ranks
                    };
                    assert_eq!(plan.step(rank, k, lr).0, plan.step(next, k, lr).1);
                }
            }
        }
        let gather = RingGather::new(rule, bytes % 100_000, ranks, conns);
        partition(
            (0..2)
                .flat_map(|lr| (0..conns).map(move |w| (lr, w)))
                .map(|(lr, w)| gather.piece(lr, w)),
            bytes % 100_000,
            "gather pieces",
        );
    }
    let (_, pieces) = ring_p2p(rule, bytes, conns);
    partition(pieces, bytes, "p2p pieces");
}
