//! JACCL's frames and schedules as pure arithmetic (reference §3.5–3.7): how big every message
//! is, how many go on each queue pair, and which elements each carries.
//!
//! JACCL sends nothing but whole frames. A frame is `4096 · 2^k` bytes, chosen per phase of
//! an operation from that phase's message size ([`FrameRule::frame`]); every message is one
//! frame long whatever its valid payload, which sits at the front. A receiver therefore
//! learns nothing from a message but its order on the queue pair: both ends must agree on the
//! number of messages of every phase, which is what this module computes. Nothing here does
//! I/O, so every rule is tested exhaustively.

use std::ops::Range;

/// The smallest frame, and the only one on macOS 26.2 (MLX's `FRAME_SIZE`).
pub const FRAME: usize = 4096;

/// The number of frame size classes, `4096 · 2^k` for k in `0..8` (MLX's `BUFFER_SIZES`).
pub const SIZE_CLASSES: usize = 8;

/// The largest frame, 512 KiB.
pub const MAX_FRAME: usize = FRAME << (SIZE_CLASSES - 1);

/// Frames in flight per queue pair and direction (MLX's `NUM_BUFFERS`): the mesh moves at most
/// this many frames to each peer per step.
pub const IN_FLIGHT: usize = 2;

/// At most this many bytes, the mesh all-reduce folds everything on every rank; above it (and
/// with more than 2 ranks) it reduce-scatters, all-gathers and folds the tail.
pub const MESH_SMALL_BYTES: usize = 32_768;

/// At most this many bytes, the ring all-reduce uses one direction of one wire.
pub const RING_SMALL_BYTES: usize = 32_768;

/// At most this many bytes of output shard, the ring sum-scatter uses one wire (in both
/// directions).
pub const RING_SCATTER_SMALL_BYTES: usize = 65_536;

/// From this many bytes on, a mesh with several wires (cables per pair of ranks) cuts an
/// operation across all of them; below it, wire 0 carries the whole operation (MLX 0.32.4's
/// `MESH_MULTI_WIRE_MIN_BYTES`, `mesh_impl.h` line 13).
pub const MESH_MULTI_WIRE_MIN_BYTES: usize = 512 * 1024;

/// How frames are sized: MLX picks large frames only when the running OS is macOS 26.3 or later
/// (a runtime check), so peers on 26.2 and on 26.3 cannot share a job. Every rank of a job must
/// use the same rule.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum FrameRule {
    /// Always 4 KiB frames: macOS 26.2, and the default.
    #[default]
    Small,
    /// The largest `4096 · 2^k` (k ≤ 7) not above the message: macOS 26.3 and later.
    Large,
}

impl FrameRule {
    /// The frame for a message of `message_bytes` bytes (MLX's `buffer_size_from_message`).
    pub fn frame(self, message_bytes: usize) -> usize {
        match self {
            FrameRule::Small => FRAME,
            FrameRule::Large => (1..SIZE_CLASSES)
                .rev()
                .map(|k| FRAME << k)
                .find(|&f| message_bytes >= f)
                .unwrap_or(FRAME),
        }
    }
}

/// `⌈a / b⌉` for `b > 0`.
const fn ceil_div(a: usize, b: usize) -> usize {
    a.div_ceil(b)
}

/// A message stream of one phase on one queue pair: `len` bytes cut into frames of `frame`
/// bytes, the last one padded. Zero bytes is zero messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Frames {
    /// The payload bytes.
    pub len: usize,
    /// The frame (message) size.
    pub frame: usize,
}

impl Frames {
    /// `len` bytes in frames chosen by `rule` from the message size `message_bytes`.
    pub fn new(rule: FrameRule, message_bytes: usize, len: usize) -> Self {
        Self {
            len,
            frame: rule.frame(message_bytes),
        }
    }

    /// The number of messages, `⌈len / frame⌉`.
    pub fn count(&self) -> usize {
        ceil_div(self.len, self.frame)
    }

    /// The payload bytes of message `i` (the rest of its frame is padding).
    pub fn payload(&self, i: usize) -> Range<usize> {
        let start = (i * self.frame).min(self.len);
        start..((i + 1) * self.frame).min(self.len)
    }
}

/// The mesh all-reduce's path for `bytes` over `ranks` ranks (reference §3.6).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MeshReduce {
    /// Every rank sends its whole input to every peer and folds all of them in rank order.
    Fold,
    /// Reduce-scatter R shards of `shard` elements, all-gather them, and fold the `tail`
    /// elements after them (`E − R·shard < R`) as [`MeshReduce::Fold`] does.
    ScatterGather {
        /// Elements per rank's shard, `⌊E/R⌋` (may be 0, then only the tail is folded).
        shard: usize,
        /// Elements after the `R · shard` of the shards.
        tail: usize,
    },
}

impl MeshReduce {
    /// MLX's choice: fold when R = 2 or N ≤ 32 KiB, else scatter-gather.
    pub fn choose(elements: usize, element_size: usize, ranks: usize) -> Self {
        if ranks <= 2 || elements * element_size <= MESH_SMALL_BYTES {
            MeshReduce::Fold
        } else {
            let shard = elements / ranks;
            MeshReduce::ScatterGather {
                shard,
                tail: elements - shard * ranks,
            }
        }
    }
}

/// MLX 0.32.4's `MeshGroup::split_wires`: which part of an operation each wire of a mesh
/// carries. `bytes` is the size MLX compares with [`MESH_MULTI_WIRE_MIN_BYTES`] (the buffer of
/// an all-reduce, one rank's block of an all-gather, the output shard of a sum-scatter, the
/// message of a send), `total` what is cut (elements for the reductions, bytes otherwise).
///
/// Below the threshold, or with one wire, the one range `0..total` for wire 0. From it on,
/// `wires` contiguous ranges of `⌈total / wires⌉`, the last ones clipped to `total` (so the
/// last wire may carry less, or nothing): range `w` is wire `w`'s.
pub fn mesh_wire_ranges(bytes: usize, total: usize, wires: usize) -> Vec<Range<usize>> {
    let used = if bytes >= MESH_MULTI_WIRE_MIN_BYTES {
        wires.max(1)
    } else {
        1
    };
    let per_wire = ceil_div(total, used);
    (0..used)
        .map(|w| {
            let start = (w * per_wire).min(total);
            start..(start + per_wire).min(total)
        })
        .collect()
}

/// The geometry of the ring all-reduce (reference §3.7): directions, wires, and the slice of
/// every chunk each (direction, wire) carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RingReduce {
    /// Elements in all.
    pub elements: usize,
    /// Bytes per element.
    pub element_size: usize,
    /// Ranks (chunks).
    pub ranks: usize,
    /// Directions used: 1 (send right only) or 2.
    pub dirs: usize,
    /// Wires used: 1, or all C.
    pub wires: usize,
    /// Elements per chunk, `⌈E/R⌉` (the last chunk is clipped to E).
    pub chunk: usize,
    /// Elements per (direction, wire) slice of a chunk, `⌈chunk/(dirs·wires)⌉`.
    pub spw: usize,
    /// The frame size.
    pub frame: usize,
}

impl RingReduce {
    /// MLX's plan for `elements` elements of `element_size` bytes over `ranks` ranks with
    /// `conns` wires per direction: one direction of one wire when N ≤ 32 KiB or E < 2·R·C,
    /// else two directions of C wires.
    pub fn new(
        rule: FrameRule,
        elements: usize,
        element_size: usize,
        ranks: usize,
        conns: usize,
    ) -> Self {
        let small =
            elements * element_size <= RING_SMALL_BYTES || elements < 2 * ranks * conns.max(1);
        let (dirs, wires) = if small { (1, 1) } else { (2, conns.max(1)) };
        let chunk = ceil_div(elements, ranks.max(1));
        let spw = ceil_div(chunk, dirs * wires);
        Self {
            elements,
            element_size,
            ranks,
            dirs,
            wires,
            chunk,
            spw,
            frame: rule.frame(spw * element_size),
        }
    }

    /// MLX's plan for the ring sum-scatter (`RingImpl::reduce_scatter`) of shards of `shard`
    /// elements of `element_size` bytes over `ranks` ranks with `conns` wires per direction:
    /// always two directions, of one wire when the shard is at most
    /// [`RING_SCATTER_SMALL_BYTES`] or the `R·shard` elements are fewer than 2·R·C, else of
    /// C wires; the chunks are the R shards, each cut into a slice per (direction, wire) of
    /// `⌈shard/(2·wires)⌉` elements.
    pub fn scatter(
        rule: FrameRule,
        shard: usize,
        element_size: usize,
        ranks: usize,
        conns: usize,
    ) -> Self {
        let total = shard * ranks;
        let small =
            shard * element_size <= RING_SCATTER_SMALL_BYTES || total < 2 * ranks * conns.max(1);
        let wires = if small { 1 } else { conns.max(1) };
        let spw = ceil_div(shard, 2 * wires);
        Self {
            elements: total,
            element_size,
            ranks,
            dirs: 2,
            wires,
            chunk: shard,
            spw,
            frame: rule.frame(spw * element_size),
        }
    }

    /// Elements per frame.
    pub fn frame_elements(&self) -> usize {
        self.frame / self.element_size
    }

    /// Messages per step on each (direction, wire): `⌈spw/Ne⌉`, sent even when the clipped
    /// slice is shorter or empty.
    pub fn messages_per_step(&self) -> usize {
        ceil_div(self.spw, self.frame_elements())
    }

    /// The elements of chunk `j` that direction `lr` on wire `w` carries, clipped to the chunk
    /// and to E (possibly empty).
    pub fn slice(&self, j: usize, lr: usize, w: usize) -> Range<usize> {
        let region = lr * self.wires * self.spw;
        let lo = region + w * self.spw;
        let hi = (region + (w + 1) * self.spw)
            .min(self.chunk)
            .min(region + self.wires * self.spw);
        let base = j * self.chunk;
        let start = (base + lo.min(hi)).min(self.elements);
        start..(base + hi).min(self.elements).max(start)
    }

    /// The steps of the operation: R−1 of reduce-scatter, then R−1 of all-gather.
    pub fn steps(&self) -> usize {
        2 * self.ranks.saturating_sub(1)
    }

    /// At step `k` of rank `rank`, direction `lr`: (the chunk sent, the chunk received, whether
    /// the received one is reduced (reduce-scatter) or copied (all-gather)).
    pub fn step(&self, rank: usize, k: usize, lr: usize) -> (usize, usize, bool) {
        let r = self.ranks;
        let (reduce, k) = if k < r - 1 {
            (true, k)
        } else {
            (false, k - (r - 1))
        };
        // Chunks as offsets from `rank`, kept non-negative modulo R.
        let at = |delta: isize| (rank as isize + delta).rem_euclid(r as isize) as usize;
        let k = k as isize;
        let (send, recv) = match (reduce, lr) {
            (true, 0) => (at(-k), at(-1 - k)),
            (true, _) => (at(k), at(1 + k)),
            (false, 0) => (at(1 - k), at(-k)),
            (false, _) => (at(-1 + k), at(k)),
        };
        (send, recv, reduce)
    }
}

/// The layout of the ring all-gather (as fixed by MLX PR #4443): every rank's block of `bytes`
/// is cut in two halves, direction 0 carrying the first and direction 1 the second, each half
/// cut into C contiguous per-wire pieces of `⌈bytes/(2C)⌉` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RingGather {
    /// Bytes per rank.
    pub bytes: usize,
    /// Ranks.
    pub ranks: usize,
    /// Wires.
    pub wires: usize,
    /// Bytes per (direction, wire) piece.
    pub per_wire: usize,
    /// The frame size.
    pub frame: usize,
}

impl RingGather {
    /// The layout for `bytes` per rank over `ranks` ranks and `conns` wires.
    pub fn new(rule: FrameRule, bytes: usize, ranks: usize, conns: usize) -> Self {
        let wires = conns.max(1);
        let per_wire = ceil_div(bytes, 2 * wires);
        Self {
            bytes,
            ranks,
            wires,
            per_wire,
            frame: rule.frame(per_wire),
        }
    }

    /// The bytes of a rank's block that direction `lr` on wire `w` carries.
    pub fn piece(&self, lr: usize, w: usize) -> Range<usize> {
        let start = ((lr * self.wires + w) * self.per_wire).min(self.bytes);
        start..(start + self.per_wire).min(self.bytes)
    }

    /// Messages per step on each (direction, wire), `⌈per_wire/F⌉`.
    pub fn messages_per_step(&self) -> usize {
        ceil_div(self.per_wire, self.frame)
    }

    /// At step `k` (0..R−1) of rank `rank`, direction `lr`: (the block sent, the block
    /// received). Direction 0 passes blocks to the right, direction 1 to the left.
    pub fn step(&self, rank: usize, k: usize, lr: usize) -> (usize, usize) {
        let r = self.ranks as isize;
        let at = |delta: isize| (rank as isize + delta).rem_euclid(r) as usize;
        let k = k as isize;
        if lr == 0 {
            (at(-k), at(-1 - k))
        } else {
            (at(k), at(1 + k))
        }
    }
}

/// Point-to-point on the ring: `bytes` split into C contiguous per-wire ranges of `⌈n/C⌉`
/// bytes, with frames from the per-wire size.
pub fn ring_p2p(rule: FrameRule, bytes: usize, conns: usize) -> (usize, Vec<Range<usize>>) {
    let wires = conns.max(1);
    let per_wire = ceil_div(bytes, wires);
    let pieces = (0..wires)
        .map(|w| {
            let start = (w * per_wire).min(bytes);
            start..(start + per_wire).min(bytes)
        })
        .collect();
    (rule.frame(per_wire), pieces)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_frames_are_always_four_kib() {
        for m in [0, 1, 4096, 1 << 20, usize::MAX / 2] {
            assert_eq!(FrameRule::Small.frame(m), FRAME);
        }
    }

    #[test]
    fn large_frames_are_the_largest_class_not_above_the_message() {
        assert_eq!(FrameRule::Large.frame(0), 4096);
        assert_eq!(FrameRule::Large.frame(8191), 4096);
        assert_eq!(FrameRule::Large.frame(8192), 8192);
        assert_eq!(FrameRule::Large.frame(300_000), 262_144);
        assert_eq!(FrameRule::Large.frame(1 << 30), MAX_FRAME);
    }

    #[test]
    fn frames_cover_the_payload_once() {
        for len in 0..3 * FRAME + 2 {
            let f = Frames { len, frame: FRAME };
            let mut next = 0;
            for i in 0..f.count() {
                let p = f.payload(i);
                assert_eq!(p.start, next);
                assert!(!p.is_empty());
                next = p.end;
            }
            assert_eq!(next, len);
        }
    }

    #[test]
    fn the_mesh_folds_small_inputs_and_pairs() {
        assert_eq!(MeshReduce::choose(1 << 20, 4, 2), MeshReduce::Fold);
        assert_eq!(MeshReduce::choose(8192, 4, 3), MeshReduce::Fold);
        assert_eq!(
            MeshReduce::choose(8193, 4, 3),
            MeshReduce::ScatterGather {
                shard: 2731,
                tail: 0
            }
        );
        assert_eq!(
            MeshReduce::choose(8194, 4, 4),
            MeshReduce::ScatterGather {
                shard: 2048,
                tail: 2
            }
        );
    }

    #[test]
    fn mesh_wires_split_only_from_half_a_mebibyte_and_tile_the_operation() {
        let below = MESH_MULTI_WIRE_MIN_BYTES - 1;
        assert_eq!(mesh_wire_ranges(below, 1000, 3), vec![0..1000]);
        assert_eq!(
            mesh_wire_ranges(MESH_MULTI_WIRE_MIN_BYTES, 1000, 3),
            vec![0..334, 334..668, 668..1000]
        );
        // The last wire takes what is left, possibly nothing (MLX clips the offset to total).
        assert_eq!(
            mesh_wire_ranges(MESH_MULTI_WIRE_MIN_BYTES, 4, 3),
            vec![0..2, 2..4, 4..4]
        );
        for wires in 1..=4 {
            for total in [0, 1, 5, 131_072, 131_073] {
                let ranges = mesh_wire_ranges(1 << 20, total, wires);
                assert_eq!(ranges.len(), wires);
                let mut next = 0;
                for r in ranges {
                    assert_eq!(r.start, next);
                    next = r.end;
                }
                assert_eq!(next, total);
            }
        }
    }

    #[test]
    fn ring_slices_tile_every_chunk_exactly_once() {
        for ranks in 2..=5 {
            for conns in 1..=4 {
                for elements in (0..300).chain([8191, 8192, 8193, 20_000]) {
                    for size in [1, 2, 4, 8] {
                        let p = RingReduce::new(FrameRule::Small, elements, size, ranks, conns);
                        let mut seen = vec![0u8; elements];
                        for j in 0..ranks {
                            for lr in 0..p.dirs {
                                for w in 0..p.wires {
                                    let s = p.slice(j, lr, w);
                                    assert!(s.len() <= p.spw);
                                    assert!(s.len() <= p.messages_per_step() * p.frame_elements());
                                    for e in s {
                                        seen[e] += 1;
                                    }
                                }
                            }
                        }
                        assert!(
                            seen.iter().all(|&c| c == 1),
                            "R {ranks} C {conns} E {elements} s {size}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn the_ring_uses_one_wire_below_its_thresholds() {
        let p = RingReduce::new(FrameRule::Small, 8192, 4, 4, 2);
        assert_eq!((p.dirs, p.wires), (1, 1));
        let p = RingReduce::new(FrameRule::Small, 8193, 4, 4, 2);
        assert_eq!((p.dirs, p.wires), (2, 2));
        // E < 2·R·C with more than 32 KiB: 8-byte elements, R 4, C 4 → 32 elements needed.
        let p = RingReduce::new(FrameRule::Small, 31, 8, 4, 4);
        assert_eq!((p.dirs, p.wires), (1, 1));
    }

    #[test]
    fn every_ring_step_hands_each_chunk_on_and_ends_fully_gathered() {
        for ranks in 2..=7 {
            let p = RingReduce::new(FrameRule::Small, 1 << 16, 4, ranks, 1);
            for lr in 0..2 {
                for k in 0..p.steps() {
                    for rank in 0..ranks {
                        let (send, _, _) = p.step(rank, k, lr);
                        let next = if lr == 0 {
                            (rank + 1) % ranks
                        } else {
                            (rank + ranks - 1) % ranks
                        };
                        // What I send at step k is what my neighbour receives at step k.
                        assert_eq!(p.step(next, k, lr).1, send);
                    }
                }
                // Every rank ends the reduce-scatter owning the chunk it sends first in the
                // gather, and receives every other chunk once in the gather.
                for rank in 0..ranks {
                    let mut got: Vec<usize> = (ranks - 1..p.steps())
                        .map(|k| p.step(rank, k, lr).1)
                        .collect();
                    got.push(p.step(rank, ranks - 1, lr).0);
                    got.sort_unstable();
                    assert_eq!(got, (0..ranks).collect::<Vec<_>>());
                }
            }
        }
    }

    #[test]
    fn the_ring_scatter_uses_both_directions_and_every_wire_only_above_64_kib() {
        let p = RingReduce::scatter(FrameRule::Small, 65_536 / 4, 4, 3, 2);
        assert_eq!(
            (p.dirs, p.wires, p.chunk, p.elements),
            (2, 1, 16_384, 49_152)
        );
        assert_eq!(p.spw, 8_192);
        let p = RingReduce::scatter(FrameRule::Large, 65_536 / 4 + 1, 4, 3, 2);
        assert_eq!((p.dirs, p.wires), (2, 2));
        assert_eq!(p.spw, 4_097);
        assert_eq!(p.frame, 16_384);
        // Every (direction, wire) slice tiles the shard once.
        let mut covered = vec![0; p.chunk];
        for lr in 0..2 {
            for w in 0..2 {
                for e in p.slice(1, lr, w) {
                    covered[e - p.chunk] += 1;
                }
            }
        }
        assert!(covered.iter().all(|&c| c == 1));
    }

    #[test]
    fn gather_pieces_cover_a_block_in_two_halves() {
        for bytes in 0..100 {
            for conns in 1..=4 {
                let g = RingGather::new(FrameRule::Small, bytes, 3, conns);
                let mut next = 0;
                for lr in 0..2 {
                    for w in 0..conns {
                        let p = g.piece(lr, w);
                        assert_eq!(p.start, next.min(bytes));
                        next = p.end;
                    }
                }
                assert_eq!(next, bytes);
            }
        }
    }

    #[test]
    fn point_to_point_splits_into_contiguous_wire_ranges() {
        let (frame, pieces) = ring_p2p(FrameRule::Small, 10, 4);
        assert_eq!(frame, FRAME);
        assert_eq!(pieces, vec![0..3, 3..6, 6..9, 9..10]);
    }
}
