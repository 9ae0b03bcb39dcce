//! MLX's ring schedules as pure arithmetic: which bytes go on which socket, in which
//! direction, at which step (`mlx/distributed/ring/ring.cpp`; reference §2.6–2.8).
//!
//! Nothing here does I/O, so every rule can be tested exhaustively. The names follow MLX:
//! R ranks, C connections per neighbour, E elements of s bytes, K sub-reduces.

use std::ops::Range;

use smallvec::SmallVec;

/// The parts of one collective: up to 2C, kept on the stack for C ≤ 4 (the steady state
/// allocates nothing).
pub type Parts = SmallVec<[Part; 8]>;

/// The byte ranges of a point-to-point transfer, one per socket used.
pub type Pieces = SmallVec<[Range<usize>; 4]>;

/// MLX's `min_send_size`: a new sub-reduce (or gather) per 256 KiB of each rank's share.
pub const MIN_SEND_SIZE: usize = 262_144;

/// MLX's minimum bytes per socket for point-to-point transfers.
pub const MIN_P2P_SEGMENT: usize = 1024;

/// Which way data flows around the ring in one sub-reduce or gather.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Flow {
    /// MLX's direction +1 (even sub-reduces): send on the left sockets, receive on the right
    /// ones, so data moves toward lower ranks.
    Leftward,
    /// MLX's direction −1 (odd sub-reduces, and the small path): send on the right sockets,
    /// receive on the left ones, so data moves toward higher ranks.
    Rightward,
}

impl Flow {
    /// MLX's `d`: +1 for leftward, −1 for rightward.
    pub fn d(self) -> isize {
        match self {
            Flow::Leftward => 1,
            Flow::Rightward => -1,
        }
    }

    /// The flow of sub-reduce or gather `i`: even leftward, odd rightward.
    pub fn of(i: usize) -> Self {
        if i.is_multiple_of(2) {
            Flow::Leftward
        } else {
            Flow::Rightward
        }
    }
}

/// One of the parallel sub-reduces (or gathers) of a collective.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part {
    /// Its index `i` among the parts.
    pub index: usize,
    /// The range it covers: elements of the (padded) buffer for a reduce, bytes of every
    /// rank's block for a gather.
    pub range: Range<usize>,
    /// The connection pair it uses, `⌊i/2⌋`.
    pub pair: usize,
    /// Its direction.
    pub flow: Flow,
}

/// How an all-reduce of E elements is carried out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllReducePlan {
    /// `Some(R)` on MLX's small path (E < R): the input is copied into R zeroed elements and
    /// reduced there with one rightward sub-reduce on pair 0.
    pub padded: Option<usize>,
    /// The sub-reduces, over element ranges of the (padded) buffer.
    pub parts: Parts,
}

/// `⌈a / b⌉` for `b > 0`.
pub const fn ceil_div(a: usize, b: usize) -> usize {
    a.div_ceil(b)
}

/// MLX's limit on its all-reduce's small path (E < R, reference §2.6.1): it throws ("Can't
/// perform the ring all reduce") when the element size times the ranks, s·R, exceeds this
/// many bytes (its stack buffer). This crate runs such an all-reduce in a ring of its own
/// ranks; a ring with a Python MLX rank fails it (see [`beyond_mlx_small_path`]).
pub const MLX_SMALL_PATH_LIMIT: usize = 1024;

/// Whether an all-reduce of `elements` elements of `element_size` bytes over `ranks` ranks
/// takes the small path where MLX throws: E < R and s·R > [`MLX_SMALL_PATH_LIMIT`].
pub fn beyond_mlx_small_path(elements: usize, element_size: usize, ranks: usize) -> bool {
    ranks >= 2 && elements < ranks && element_size.saturating_mul(ranks) > MLX_SMALL_PATH_LIMIT
}

/// The plan of an all-reduce of `elements` elements of `element_size` bytes over `ranks` ranks
/// with `conns` connections per neighbour (MLX §2.6.1–2.6.2). An empty all-reduce is MLX's small
/// path like any E < R: MLX exchanges R zero elements even then.
pub fn all_reduce_plan(
    elements: usize,
    element_size: usize,
    ranks: usize,
    conns: usize,
) -> AllReducePlan {
    if ranks < 2 {
        return AllReducePlan {
            padded: None,
            parts: Parts::new(),
        };
    }
    // MLX takes the small path for E = 0 too: it exchanges R zero elements.
    if elements < ranks {
        return AllReducePlan {
            padded: Some(ranks),
            parts: smallvec::smallvec![Part {
                index: 0,
                range: 0..ranks,
                pair: 0,
                flow: Flow::Rightward,
            }],
        };
    }
    let bytes = elements * element_size;
    let k = (bytes / (ranks * MIN_SEND_SIZE)).clamp(1, (2 * conns).max(1));
    let step = ceil_div(elements, k);
    let parts = (0..k)
        .map(|i| Part {
            index: i,
            range: (i * step).min(elements)..((i + 1) * step).min(elements),
            pair: i / 2,
            flow: Flow::of(i),
        })
        .collect();
    AllReducePlan {
        padded: None,
        parts,
    }
}

/// Segment `j` of a sub-reduce of `len` elements split into `ranks` segments of `⌈len/R⌉`
/// elements; trailing segments may be short or empty (MLX §2.6.3).
pub fn segment(len: usize, ranks: usize, j: usize) -> Range<usize> {
    let size = ceil_div(len, ranks);
    (j * size).min(len)..((j + 1) * size).min(len)
}

/// What happens to the bytes received in one step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Reduce-scatter: combine into my copy (`mine ⊕ theirs`).
    Reduce,
    /// All-gather: overwrite my copy.
    Copy,
}

/// One step of a sub-reduce: which segment I send, which I receive, and what I do with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RingStep {
    /// The segment index I send.
    pub send: usize,
    /// The segment index I receive.
    pub recv: usize,
    /// Reduce or copy.
    pub phase: Phase,
}

/// The number of steps of a ring all-reduce: `2(R−1)`.
pub const fn all_reduce_steps(ranks: usize) -> usize {
    2 * ranks.saturating_sub(1)
}

/// Step `t` (`0..2(R−1)`) of rank `rank`'s sub-reduce in direction `flow`:
/// send segment `(r + t·d) mod R`, receive segment `(r + d + t·d) mod R`.
pub fn all_reduce_step(rank: usize, ranks: usize, flow: Flow, t: usize) -> RingStep {
    let d = flow.d();
    let at = |offset: isize| (rank as isize + offset).rem_euclid(ranks as isize) as usize;
    RingStep {
        send: at(t as isize * d),
        recv: at(d + t as isize * d),
        phase: if t + 1 < ranks {
            Phase::Reduce
        } else {
            Phase::Copy
        },
    }
}

/// The plan of an all-gather of `bytes` bytes per rank: G gathers over byte ranges of every
/// rank's block (MLX §2.7).
pub fn all_gather_plan(bytes: usize, conns: usize) -> Parts {
    if bytes == 0 {
        return Parts::new();
    }
    let g = (bytes / MIN_SEND_SIZE).clamp(1, (2 * conns).max(1));
    let b = ceil_div(bytes, g);
    (0..g)
        .map(|i| Part {
            index: i,
            range: (i * b).min(bytes)..((i + 1) * b).min(bytes),
            pair: i / 2,
            flow: Flow::of(i),
        })
        .collect()
}

/// Step `t` (`0..R−1`) of an all-gather: `(block sent, block received)`, i.e.
/// `((r + t·d) mod R, (r + d + t·d) mod R)`.
pub fn all_gather_step(rank: usize, ranks: usize, flow: Flow, t: usize) -> (usize, usize) {
    let s = all_reduce_step(rank, ranks, flow, t);
    (s.send, s.recv)
}

/// The byte ranges a point-to-point transfer of `bytes` puts on each of `conns` sockets:
/// `max(1024, ⌈n/C⌉)` bytes each, socket k taking `[k·seg, min(n, (k+1)·seg))` while
/// `k·seg < n` (MLX §2.8).
pub fn p2p_split(bytes: usize, conns: usize) -> Pieces {
    let seg = ceil_div(bytes, conns.max(1)).max(MIN_P2P_SEGMENT);
    (0..conns.max(1))
        .map(|k| k * seg..((k + 1) * seg).min(bytes))
        .take_while(|r| r.start < bytes)
        .collect()
}

/// Which neighbour's sockets a point-to-point transfer uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Side {
    /// The connections this rank opened to rank r+1.
    Right,
    /// The connections rank r−1 opened to this rank.
    Left,
}

/// MLX's socket choice for `send(dst)`: the right sockets if `dst` is the right neighbour,
/// else the left ones if it is the left neighbour, else `None` (not a neighbour).
pub fn send_side(rank: usize, ranks: usize, dst: usize) -> Option<Side> {
    if ranks < 2 || dst == rank || dst >= ranks {
        None
    } else if dst == (rank + 1) % ranks {
        Some(Side::Right)
    } else if dst == (rank + ranks - 1) % ranks {
        Some(Side::Left)
    } else {
        None
    }
}

/// MLX's socket choice for `recv(src)`: the left sockets if `src` is the left neighbour (checked
/// first), else the right ones if it is the right neighbour, else `None`.
pub fn recv_side(rank: usize, ranks: usize, src: usize) -> Option<Side> {
    if ranks < 2 || src == rank || src >= ranks {
        None
    } else if src == (rank + ranks - 1) % ranks {
        Some(Side::Left)
    } else if src == (rank + 1) % ranks {
        Some(Side::Right)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worked_example_a_splits_eight_mib_into_four_sub_reduces() {
        // float32, N = 8 MiB, R = 4, C = 2.
        let plan = all_reduce_plan(2_097_152, 4, 4, 2);
        assert_eq!(plan.padded, None);
        assert_eq!(plan.parts.len(), 4);
        let flows: Vec<_> = plan.parts.iter().map(|p| (p.pair, p.flow)).collect();
        assert_eq!(
            flows,
            [
                (0, Flow::Leftward),
                (0, Flow::Rightward),
                (1, Flow::Leftward),
                (1, Flow::Rightward)
            ]
        );
        assert!(plan.parts.iter().all(|p| p.range.len() == 524_288));
        assert_eq!(segment(524_288, 4, 3), 393_216..524_288);
    }

    #[test]
    fn worked_example_b_has_an_empty_tail_segment_and_sends_in_order() {
        // float32, E = 10, R = 4, C = 1: one leftward sub-reduce, S = 3.
        let plan = all_reduce_plan(10, 4, 4, 1);
        assert_eq!(plan.parts.len(), 1);
        assert_eq!(plan.parts[0].flow, Flow::Leftward);
        let segs: Vec<_> = (0..4).map(|j| segment(10, 4, j)).collect();
        assert_eq!(segs, [0..3, 3..6, 6..9, 9..10]);
        let sent: Vec<_> = (0..6)
            .map(|t| segment(10, 4, all_reduce_step(0, 4, Flow::Leftward, t).send).len() * 4)
            .collect();
        assert_eq!(sent, [12, 12, 12, 4, 12, 12]);
        // With E = 9 over 4 ranks the last segment is empty.
        assert_eq!(segment(9, 4, 3), 9..9);
    }

    #[test]
    fn worked_example_c_pads_to_one_element_per_rank() {
        let plan = all_reduce_plan(3, 4, 4, 2);
        assert_eq!(plan.padded, Some(4));
        assert_eq!(plan.parts[0].flow, Flow::Rightward);
        assert_eq!(plan.parts[0].pair, 0);
        assert_eq!(all_reduce_steps(4), 6);
    }

    #[test]
    fn sub_reduce_count_follows_the_256_kib_threshold() {
        for ranks in 2..=8 {
            for conns in 1..=3 {
                let at = |bytes: usize| all_reduce_plan(bytes / 4, 4, ranks, conns).parts.len();
                let t = ranks * MIN_SEND_SIZE;
                assert_eq!(at(t - 4), 1);
                assert_eq!(at(t), 1);
                assert_eq!(at(2 * t - 4), 1);
                assert_eq!(at(2 * t), 2.min(2 * conns));
                assert_eq!(at(2 * conns * t + 4 * t), 2 * conns);
            }
        }
    }

    #[test]
    fn parts_cover_the_buffer_exactly_once() {
        for elements in [0usize, 1, 7, 100, 1 << 20, (1 << 22) + 3] {
            for ranks in 2..=5 {
                for conns in 1..=3 {
                    let plan = all_reduce_plan(elements, 2, ranks, conns);
                    let len = plan.padded.unwrap_or(elements);
                    let mut next = 0;
                    for p in &plan.parts {
                        assert_eq!(p.range.start, next);
                        next = p.range.end;
                    }
                    assert_eq!(next, len);
                }
            }
        }
    }

    #[test]
    fn the_segment_received_is_the_one_sent_next() {
        for ranks in 2..=9 {
            for rank in 0..ranks {
                for flow in [Flow::Leftward, Flow::Rightward] {
                    for t in 0..all_reduce_steps(ranks) - 1 {
                        let now = all_reduce_step(rank, ranks, flow, t);
                        let next = all_reduce_step(rank, ranks, flow, t + 1);
                        assert_eq!(now.recv, next.send);
                        assert_ne!(now.send, now.recv);
                    }
                }
            }
        }
    }

    #[test]
    fn what_a_rank_sends_its_receiver_expects() {
        // Leftward: rank r sends to r−1, which receives segment ((r−1) + 1 + t) = r + t.
        for ranks in 2..=9 {
            for rank in 0..ranks {
                for t in 0..all_reduce_steps(ranks) {
                    let left = (rank + ranks - 1) % ranks;
                    let right = (rank + 1) % ranks;
                    assert_eq!(
                        all_reduce_step(rank, ranks, Flow::Leftward, t).send,
                        all_reduce_step(left, ranks, Flow::Leftward, t).recv
                    );
                    assert_eq!(
                        all_reduce_step(rank, ranks, Flow::Rightward, t).send,
                        all_reduce_step(right, ranks, Flow::Rightward, t).recv
                    );
                }
            }
        }
    }

    #[test]
    fn gathers_split_by_256_kib_up_to_two_per_connection() {
        assert_eq!(all_gather_plan(100, 2).len(), 1);
        assert_eq!(all_gather_plan(MIN_SEND_SIZE * 2, 2).len(), 2);
        assert_eq!(all_gather_plan(MIN_SEND_SIZE * 9, 2).len(), 4);
        let parts = all_gather_plan(MIN_SEND_SIZE * 3 + 1, 2);
        assert_eq!(parts.len(), 3);
        assert_eq!(parts[2].range.end, MIN_SEND_SIZE * 3 + 1);
        assert_eq!(parts[1].flow, Flow::Rightward);
    }

    #[test]
    #[allow(clippy::single_range_in_vec_init)]
    fn point_to_point_uses_at_least_1024_bytes_per_socket() {
        assert_eq!(p2p_split(100, 2).as_slice(), [0..100]);
        assert_eq!(p2p_split(1500, 2).as_slice(), [0..1024, 1024..1500]);
        assert_eq!(p2p_split(4000, 2).as_slice(), [0..2000, 2000..4000]);
        assert_eq!(
            p2p_split(3001, 3).as_slice(),
            [0..1024, 1024..2048, 2048..3001]
        );
        assert!(p2p_split(0, 2).is_empty());
    }

    #[test]
    fn with_two_ranks_send_goes_right_and_recv_comes_left() {
        assert_eq!(send_side(0, 2, 1), Some(Side::Right));
        assert_eq!(recv_side(1, 2, 0), Some(Side::Left));
        assert_eq!(send_side(1, 4, 0), Some(Side::Left));
        assert_eq!(recv_side(1, 4, 2), Some(Side::Right));
        assert_eq!(send_side(0, 4, 2), None);
        assert_eq!(send_side(0, 4, 0), None);
    }
}
