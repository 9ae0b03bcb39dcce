//! Target `ring_schedule`: the ring's schedule arithmetic and a symbolic run of its steps;
//! also [`partition`], shared with `jaccl_frames`.

use std::sync::atomic::{AtomicU32, Ordering};

use nuvec_distributed::fabric::Wiring;
use nuvec_distributed::ring::RingTopology;
use nuvec_distributed::ring::schedule::{self, Flow, Phase};

use super::script::Script;

/// Checks that `ranges` are contiguous from 0 and end at `end`, so they cover `0..end` once.
pub(super) fn partition(
    ranges: impl IntoIterator<Item = std::ops::Range<usize>>,
    end: usize,
    what: &str,
) {
    let mut next = 0;
    for r in ranges {
        assert_eq!(r.start, next, "{what}: a gap or overlap at {next}");
        assert!(r.start <= r.end, "{what}: a reversed range {r:?}");
        next = r.end;
    }
    assert_eq!(next, end, "{what}: covers 0..{next}, not 0..{end}");
}

/// [`schedule`]'s arithmetic for fuzzed E elements of s bytes over R ranks and C connections:
/// R = `1 + b % 24`, C = `1 + b % 8`, s = `1 + b % 16` (the widest real element is 8 bytes),
/// E a `u32` (biased by one more byte toward the sub-reduce thresholds).
///
/// Properties: a single rank has no parts; with E < R (0 included) the buffer is padded to R
/// elements; the all-reduce parts cover the (padded) buffer exactly once, in order, non-empty,
/// at most 2C of them, with MLX's pair and flow; the R segments of each part partition it; a
/// symbolic run of every rank's steps in each flow is an all-reduce (each received partial sum
/// is disjoint from the receiver's, every rank ends with every segment summed over all ranks,
/// and the gather phase copies only finished segments); the gather parts cover each block
/// once and a symbolic all-gather gives every rank every block; `p2p_split` covers the bytes
/// exactly with at most C sockets of at least 1024 bytes (all but the last exactly
/// `max(1024, ⌈n/C⌉)`); the send and receive sides agree between every pair of ranks; and each
/// side's channel is the far end of the matching channel in `Wiring::ring` (R ≤ 8).
pub(crate) fn ring_schedule(data: &[u8]) {
    let mut script = Script(data);
    let ranks = 1 + usize::from(script.byte() % 24);
    let conns = 1 + usize::from(script.byte() % 8);
    let size = 1 + usize::from(script.byte() % 16);
    let raw = script.u32() as usize;
    // Half the inputs land near a multiple of the 256 KiB-per-rank threshold.
    let elements = match script.byte() {
        b if b & 1 == 1 => {
            let k = usize::from(b >> 1) % (2 * conns + 2);
            let threshold = k * ranks * schedule::MIN_SEND_SIZE / size;
            threshold + (raw % 64) - 32.min(threshold)
        }
        _ => raw % (1 << 26),
    };

    // The all-reduce plan.
    let plan = schedule::all_reduce_plan(elements, size, ranks, conns);
    if ranks < 2 {
        assert!(plan.parts.is_empty() && plan.padded.is_none(), "{plan:?}");
    } else {
        // MLX takes the small (padded) path for E < R, E = 0 included.
        if elements < ranks {
            assert_eq!(plan.padded, Some(ranks), "E = {elements} < R = {ranks}");
            assert_eq!(plan.parts.len(), 1);
            assert_eq!(plan.parts[0].flow, Flow::Rightward);
        } else {
            assert_eq!(plan.padded, None);
        }
        let len = plan.padded.unwrap_or(elements);
        assert!(
            (1..=2 * conns).contains(&plan.parts.len()),
            "{} parts with C = {conns}",
            plan.parts.len()
        );
        partition(plan.parts.iter().map(|p| p.range.clone()), len, "parts");
        for (i, part) in plan.parts.iter().enumerate() {
            assert_eq!(part.index, i);
            assert_eq!(part.pair, i / 2);
            assert!(part.pair < conns, "pair {} with C = {conns}", part.pair);
            if plan.padded.is_none() {
                assert_eq!(part.flow, Flow::of(i));
            }
            assert!(!part.range.is_empty(), "part {i} is empty: {plan:?}");
            let plen = part.range.len();
            partition(
                (0..ranks).map(|j| schedule::segment(plen, ranks, j)),
                plen,
                "segments",
            );
        }
        // The symbolic runs depend on R alone: once per R and process (they cost more than
        // everything else here together).
        static SYMBOLIC_DONE: AtomicU32 = AtomicU32::new(0);
        if SYMBOLIC_DONE.load(Ordering::Relaxed) & (1 << ranks) == 0 {
            for flow in [Flow::Leftward, Flow::Rightward] {
                symbolic_all_reduce(ranks, flow);
                symbolic_all_gather(ranks, flow);
            }
            SYMBOLIC_DONE.fetch_or(1 << ranks, Ordering::Relaxed);
        }
    }

    // The all-gather plan over one rank's block of `elements × size` bytes.
    let bytes = elements.saturating_mul(size);
    let parts = schedule::all_gather_plan(bytes, conns);
    assert!(parts.len() <= 2 * conns);
    assert_eq!(parts.is_empty(), bytes == 0);
    partition(parts.iter().map(|p| p.range.clone()), bytes, "gather parts");
    for (i, part) in parts.iter().enumerate() {
        assert_eq!((part.index, part.pair, part.flow), (i, i / 2, Flow::of(i)));
        assert!(
            !part.range.is_empty(),
            "gather part {i} is empty: {parts:?}"
        );
    }

    // Point to point.
    let split = schedule::p2p_split(bytes, conns);
    assert!(split.len() <= conns, "{} sockets of {conns}", split.len());
    partition(split.iter().cloned(), bytes, "p2p_split");
    let seg = bytes.div_ceil(conns).max(schedule::MIN_P2P_SEGMENT);
    for (k, r) in split.iter().enumerate() {
        assert!(!r.is_empty(), "socket {k} gets nothing: {split:?}");
        if k + 1 < split.len() {
            assert_eq!(r.len(), seg, "socket {k} of {split:?}");
        } else {
            assert!(r.len() <= seg);
        }
    }

    // Sides and channels: every pair of ranks, in rings of up to 8 (larger rings are the same
    // rotated, and building their wiring is quadratic).
    if (2..=8).contains(&ranks) {
        let wiring = Wiring::ring(ranks, conns);
        for a in 0..ranks {
            for b in 0..ranks {
                let send = schedule::send_side(a, ranks, b);
                let recv = schedule::recv_side(b, ranks, a);
                let neighbours = a != b && (b == (a + 1) % ranks || a == (b + 1) % ranks);
                assert_eq!(send.is_some(), neighbours, "send_side({a}, {ranks}, {b})");
                assert_eq!(recv.is_some(), neighbours, "recv_side({b}, {ranks}, {a})");
                let (Some(send), Some(recv)) = (send, recv) else {
                    continue;
                };
                assert_ne!(send, recv, "{a} → {b}: both on the {send:?} side");
                let (ta, tb) = (
                    RingTopology::new(a, ranks, conns),
                    RingTopology::new(b, ranks, conns),
                );
                for c in 0..conns {
                    let (ca, cb) = (ta.channel(send, c), tb.channel(recv, c));
                    assert_eq!(ca.peer, b);
                    assert_eq!(cb.peer, a);
                    assert_eq!(
                        wiring.far_end(a, ca),
                        Some((b, cb.link)),
                        "rank {a} sends to {b} on {ca}, which receives on {cb}"
                    );
                }
            }
        }
    }
}

/// One symbolic sub-reduce in `flow` over `ranks` ranks: every rank holds, per segment, the
/// set of ranks whose input it has summed (a bit mask).
fn symbolic_all_reduce(ranks: usize, flow: Flow) {
    // R ≤ 24, so a rank set fits in a u32.
    let full: u32 = (1u32 << ranks) - 1;
    let mut held: Vec<Vec<u32>> = (0..ranks).map(|r| vec![1u32 << r; ranks]).collect();
    for t in 0..schedule::all_reduce_steps(ranks) {
        let steps: Vec<_> = (0..ranks)
            .map(|r| schedule::all_reduce_step(r, ranks, flow, t))
            .collect();
        let sent: Vec<u32> = (0..ranks).map(|r| held[r][steps[r].send]).collect();
        for (r, step) in steps.iter().enumerate() {
            assert!(step.send < ranks && step.recv < ranks);
            // Leftward data moves to r − 1, so r receives from r + 1; rightward the reverse.
            let from = match flow {
                Flow::Leftward => (r + 1) % ranks,
                Flow::Rightward => (r + ranks - 1) % ranks,
            };
            assert_eq!(
                steps[from].send, step.recv,
                "step {t}: rank {r} expects segment {} but rank {from} sends {}",
                step.recv, steps[from].send
            );
            let theirs = sent[from];
            let mine = &mut held[r][step.recv];
            match step.phase {
                Phase::Reduce => {
                    assert_eq!(
                        *mine & theirs,
                        0,
                        "step {t}: rank {r} counts a rank twice in segment {}",
                        step.recv
                    );
                    *mine |= theirs;
                }
                Phase::Copy => {
                    assert_eq!(
                        theirs, full,
                        "step {t}: rank {r} copies an unfinished segment {}",
                        step.recv
                    );
                    *mine = theirs;
                }
            }
        }
    }
    for (r, segments) in held.iter().enumerate() {
        assert!(
            segments.iter().all(|&s| s == full),
            "{flow:?}, R = {ranks}: rank {r} ends with {segments:x?}"
        );
    }
}

/// One symbolic all-gather in `flow`: every rank must end with every block, sending only
/// blocks it has and never receiving one twice.
fn symbolic_all_gather(ranks: usize, flow: Flow) {
    let mut has: Vec<Vec<bool>> = (0..ranks)
        .map(|r| (0..ranks).map(|b| b == r).collect())
        .collect();
    for t in 0..ranks - 1 {
        let steps: Vec<(usize, usize)> = (0..ranks)
            .map(|r| schedule::all_gather_step(r, ranks, flow, t))
            .collect();
        for (r, &(send, _)) in steps.iter().enumerate() {
            assert!(
                has[r][send],
                "step {t}: rank {r} sends block {send} it lacks"
            );
        }
        for (r, &(_, recv)) in steps.iter().enumerate() {
            let from = match flow {
                Flow::Leftward => (r + 1) % ranks,
                Flow::Rightward => (r + ranks - 1) % ranks,
            };
            assert_eq!(
                steps[from].0, recv,
                "step {t}: rank {r} gathers block {recv}"
            );
            assert!(
                !has[r][recv],
                "step {t}: rank {r} receives block {recv} twice"
            );
            has[r][recv] = true;
        }
    }
    assert!(has.iter().flatten().all(|&h| h), "{flow:?}, R = {ranks}");
}
