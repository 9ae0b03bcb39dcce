//! JACCL's mesh algorithms (MLX's `mesh_impl.h` and, for several wires, 0.32.4's
//! `MeshGroup` in `mesh.h`; reference §3.6), written once over [`Fabric`]: every rank has one
//! queue pair per wire (cable) to every other rank, the channel `(peer, link w)` for wire w.
//!
//! - **all-reduce**: with 2 ranks, or at most 32 KiB, every rank sends its whole input to every
//!   peer and folds the R inputs in rank order, `((x₀ ⊕ x₁) ⊕ x₂) …`, so every rank computes the
//!   same bits. Above that, with more than 2 ranks, a reduce-scatter of R shards, an all-gather
//!   of the shards, and a fold of the tail of fewer than R elements, each phase with its own
//!   frame size.
//! - **sum-scatter**: rank r gets shard r of the reduction. MLX seeds it with its own shard
//!   and reduces the peers' in the order they complete, so its float sums change from run to
//!   run; here the peers' shards follow in rank order, `((x_r ⊕ x_a) ⊕ x_b) …` with
//!   `a < b < …`, which is one of MLX's possible results (the one its polls, over the peers
//!   in rank order, give when every shard has arrived) and the same on every run. The
//!   scatter-gather all-reduce's shards are folded so too.
//! - **all-gather** and **send/recv** to any peer.
//!
//! # Wires
//!
//! With W wires, an operation of at least 512 KiB
//! ([`MESH_MULTI_WIRE_MIN_BYTES`](super::frames::MESH_MULTI_WIRE_MIN_BYTES)) is cut into W
//! contiguous ranges ([`mesh_wire_ranges`]), and wire w runs the one-wire algorithm on range w
//! over its own queue pairs, as MLX 0.32.4's `split_wires` does: the all-reduce chooses between
//! the fold and the scatter-gather per wire (from the range's size), the all-gather cuts every
//! rank's block at the same offsets (MLX's stride), the sum-scatter cuts every input shard at
//! the same offsets. Smaller operations use wire 0 only. MLX runs the wires at once on a thread
//! pool (`dispatch_wires`); here they are the transfers of distinct channels in the same step,
//! phase by phase (the folds and scatters of every wire, then the gathers, then the tails), so
//! each queue pair carries exactly MLX's messages in MLX's order, and a rank's results do not
//! depend on how the wires interleave.
//!
//! Scratch: a fold of blocks of n bytes (the whole buffer, or a shard) takes a slot per peer
//! and, on rank 0 only, an accumulator: at most R·n bytes, besides
//! a staging frame per peer; a 2-rank all-reduce of n bytes takes 2n on rank 0 and n on
//! rank 1. With several wires each wire folds its own range in a lane of its own, so the bound
//! is the same.
//!
//! The messages on every queue pair are MLX's: the same count, each one frame long with the
//! payload at the front. Each phase of an operation is one fabric step; how many frames are in
//! flight at once is the fabric's business (the RDMA fabric keeps MLX's two).

use std::ops::Range;
use std::time::Duration;

use super::frames::{FrameRule, MeshReduce, mesh_wire_ranges};
use super::wire::{
    Keep, Lane, Scratch, Sink, Step, push_recvs, push_sends, recv_sinks, stage_tail,
};
use crate::collective::reduce::Reducer;
use crate::fabric::{Channel, Fabric, FabricError};

/// This rank's place in a mesh, the number of wires (queue pairs per peer), and the frame
/// rule of the job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MeshTopology {
    rank: usize,
    size: usize,
    wires: usize,
    rule: FrameRule,
}

impl MeshTopology {
    /// Rank `rank` of a mesh of `size` ranks with one wire.
    ///
    /// # Panics
    /// If `rank >= size`.
    pub fn new(rank: usize, size: usize, rule: FrameRule) -> Self {
        assert!(rank < size, "mesh: rank {rank} of {size}");
        Self {
            rank,
            size,
            wires: 1,
            rule,
        }
    }

    /// The same mesh with `wires` queue pairs to every peer (MLX 0.32.4's `n_wires_`).
    ///
    /// # Panics
    /// If `wires` is 0.
    pub fn with_wires(self, wires: usize) -> Self {
        assert!(wires >= 1, "mesh: 0 wires");
        Self { wires, ..self }
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The number of wires: queue pairs to every peer.
    pub fn wires(&self) -> usize {
        self.wires
    }

    /// The frame rule.
    pub fn rule(&self) -> FrameRule {
        self.rule
    }

    /// The channel (queue pair) to `peer` on wire 0.
    pub fn channel(&self, peer: usize) -> Channel {
        self.wire_channel(peer, 0)
    }

    /// The channel (queue pair) to `peer` on wire `wire`: link `wire`.
    pub fn wire_channel(&self, peer: usize, wire: usize) -> Channel {
        Channel::new(peer, wire)
    }

    /// Every other rank, in rank order.
    pub fn peers(&self) -> impl Iterator<Item = usize> + use<> {
        let rank = self.rank;
        (0..self.size).filter(move |&p| p != rank)
    }
}

/// One wire's part of a fold exchange: to every peer p this rank sends block p of `input`
/// (`len` bytes at `p · stride`; `stride` 0 sends the same block to everyone), receives the
/// peers' blocks of the same size and folds them, its own in its place, in rank order.
struct Fold<'d> {
    wire: usize,
    input: &'d [u8],
    stride: usize,
    len: usize,
}

impl Fold<'_> {
    fn block(&self, p: usize) -> &[u8] {
        let at = p * self.stride;
        &self.input[at..at + self.len]
    }
}

/// One wire's part of a gather: this rank's block goes to every peer, each peer's block lands
/// in its place.
struct Gather<'d> {
    wire: usize,
    mine: &'d [u8],
    theirs: Vec<(usize, &'d mut [u8])>,
}

/// Runs the fold exchanges of `jobs` (at most one per wire) as one step, job i in lane i, and
/// returns each job's fold: `((x₀ ⊕ x₁) ⊕ x₂) …` for whole inputs, MLX's small all-reduce;
/// `((x_r ⊕ x_a) ⊕ x_b) …` with `a < b < …` the peers, for this rank's shard `r` of a
/// sum-scatter. MLX folds shards in the order they complete, its own first; this order is one
/// of its results (rank order is not: with 3 ranks or more, rank 2's
/// `(x₀ ⊕ x₁) ⊕ x₂` is none of MLX's).
///
/// A lane holds a slot per peer only, (R−1)·n bytes for blocks of n, and the fold runs in
/// rank 0's slot; rank 0, whose block is not in a slot, and every rank's shard fold, use the
/// lane's accumulator (n more bytes). So a fold takes at most R·n bytes of scratch (2 ranks:
/// 2n on rank 0, n on rank 1), besides the staging frames. A round of empty jobs moves
/// nothing.
fn fold_round<'s, F: Fabric + ?Sized>(
    fabric: &mut F,
    mesh: &MeshTopology,
    reducer: Reducer,
    lanes: &'s mut [Lane],
    jobs: &[Fold<'_>],
    deadline: Duration,
) -> Result<Vec<&'s [u8]>, FabricError> {
    let size = mesh.size;
    if jobs.iter().any(|j| j.len > 0) {
        let mut sinks: Vec<(usize, Vec<(Channel, Sink<'_>)>)> = Vec::with_capacity(jobs.len());
        let mut step: Step<'_> = Vec::new();
        for (lane, job) in lanes.iter_mut().zip(jobs) {
            let Lane {
                received, staging, ..
            } = lane;
            let n = job.len;
            received.clear();
            if n == 0 {
                continue;
            }
            let frame = mesh.rule.frame(n);
            let count = n.div_ceil(frame);
            // Slot i holds the block of the i-th peer in rank order.
            received.resize(n * (size - 1), 0);
            let (mut tails, zeros) = staging.prepare(frame, size);
            for (p, tail) in tails.iter_mut().enumerate() {
                stage_tail(tail, job.block(p), frame);
            }
            let tails: Vec<&[u8]> = tails.into_iter().map(|t| &*t).collect();
            let mut wire_sinks = Vec::with_capacity(count * (size - 1));
            for (p, into) in mesh.peers().zip(received.chunks_mut(n)) {
                let channel = mesh.wire_channel(p, job.wire);
                recv_sinks(&mut wire_sinks, channel, into, frame, count, Keep::Copy);
            }
            step.reserve(2 * count * (size - 1));
            for p in mesh.peers() {
                let tail = tails.get(p).copied().unwrap_or_default();
                let channel = mesh.wire_channel(p, job.wire);
                push_sends(&mut step, channel, job.block(p), frame, count, tail, zeros);
            }
            sinks.push((frame, wire_sinks));
        }
        for (frame, wire_sinks) in sinks.iter_mut() {
            push_recvs(&mut step, wire_sinks, *frame, reducer.element_size());
        }
        fabric.run(&mut step, deadline)?;
    }
    Ok(lanes
        .iter_mut()
        .zip(jobs)
        .map(|(lane, job)| fold_lane(mesh, reducer, lane, job))
        .collect())
}

/// The fold of one job whose exchange is done: a fold of whole inputs (`stride` 0) in rank
/// order, into rank 0's slot (or, on rank 0, the accumulator); a fold of this rank's shards
/// (a sum-scatter, `stride` > 0) as MLX's `sum_scatter` seeds it, with this rank's own shard,
/// then the peers' in rank order, in the accumulator.
fn fold_lane<'s>(
    mesh: &MeshTopology,
    reducer: Reducer,
    lane: &'s mut Lane,
    job: &Fold<'_>,
) -> &'s [u8] {
    let n = job.len;
    let Lane { received, acc, .. } = lane;
    acc.clear();
    if n == 0 {
        return &[];
    }
    if job.stride > 0 {
        // MLX reduces each peer's shard into its own as the messages complete; its polls go
        // over the peers in rank order, so this order is the one it takes when every shard
        // has arrived, and one of its results in any case.
        acc.extend_from_slice(job.block(mesh.rank));
        for x in received.chunks(n) {
            reducer.apply(acc, x);
        }
        return acc;
    }
    let (fold, rest): (&mut [u8], &[u8]) = if mesh.rank == 0 {
        acc.extend_from_slice(job.block(0));
        (acc, received)
    } else {
        let (first, rest) = received.split_at_mut(n);
        (first, rest)
    };
    // Peers after rank 0 in `rest`, in rank order.
    let mut peers = rest.chunks(n);
    for r in 1..mesh.size {
        let x = if r == mesh.rank {
            job.block(r)
        } else {
            peers.next().unwrap_or_default()
        };
        reducer.apply(fold, x);
    }
    fold
}

/// Runs the gathers of `jobs` (at most one per wire) as one step, job i staging in lane i. A
/// round of empty jobs moves nothing.
fn gather_round<F: Fabric + ?Sized>(
    fabric: &mut F,
    mesh: &MeshTopology,
    lanes: &mut [Lane],
    jobs: &mut [Gather<'_>],
    deadline: Duration,
) -> Result<(), FabricError> {
    if jobs.iter().all(|j| j.mine.is_empty()) {
        return Ok(());
    }
    let mut sinks: Vec<(usize, Vec<(Channel, Sink<'_>)>)> = Vec::with_capacity(jobs.len());
    let mut step: Step<'_> = Vec::new();
    for (lane, job) in lanes.iter_mut().zip(jobs.iter_mut()) {
        let n = job.mine.len();
        if n == 0 {
            continue;
        }
        let frame = mesh.rule.frame(n);
        let count = n.div_ceil(frame);
        let (mut tails, zeros) = lane.staging.prepare(frame, 1);
        if let Some(tail) = tails.first_mut() {
            stage_tail(tail, job.mine, frame);
        }
        let tail: &[u8] = tails.into_iter().next().map_or(&[], |t| &*t);
        let mut wire_sinks = Vec::with_capacity(count * (mesh.size - 1));
        for (p, block) in job.theirs.iter_mut() {
            let channel = mesh.wire_channel(*p, job.wire);
            recv_sinks(&mut wire_sinks, channel, block, frame, count, Keep::Copy);
        }
        step.reserve(2 * count * (mesh.size - 1));
        for p in mesh.peers() {
            let channel = mesh.wire_channel(p, job.wire);
            push_sends(&mut step, channel, job.mine, frame, count, tail, zeros);
        }
        sinks.push((frame, wire_sinks));
    }
    for (frame, wire_sinks) in sinks.iter_mut() {
        push_recvs(&mut step, wire_sinks, *frame, 1);
    }
    fabric.run(&mut step, deadline)
}

/// `data` cut at `ranges` (contiguous, from 0, in order) into disjoint pieces.
fn pieces<'d>(mut data: &'d mut [u8], ranges: &[Range<usize>]) -> Vec<&'d mut [u8]> {
    let mut out = Vec::with_capacity(ranges.len());
    let mut at = 0;
    for r in ranges {
        let (_, rest) = std::mem::take(&mut data).split_at_mut(r.start - at);
        let (piece, rest) = rest.split_at_mut(r.len());
        out.push(piece);
        data = rest;
        at = r.end;
    }
    out
}

/// `ranges` of elements of `s` bytes as ranges of bytes.
fn in_bytes(ranges: Vec<Range<usize>>, s: usize) -> Vec<Range<usize>> {
    ranges.into_iter().map(|r| r.start * s..r.end * s).collect()
}

/// All-reduces `data` in place over the mesh, as MLX's mesh `all_sum`/`all_max`/`all_min`.
pub fn all_reduce<F: Fabric + ?Sized>(
    fabric: &mut F,
    mesh: &MeshTopology,
    reducer: Reducer,
    data: &mut [u8],
    scratch: &mut Scratch,
    deadline: Duration,
) -> Result<(), FabricError> {
    if mesh.size < 2 {
        return Ok(());
    }
    let (s, size, rank) = (reducer.element_size(), mesh.size, mesh.rank);
    let ranges = in_bytes(mesh_wire_ranges(data.len(), data.len() / s, mesh.wires), s);
    let plans: Vec<MeshReduce> = ranges
        .iter()
        .map(|r| MeshReduce::choose(r.len() / s, s, size))
        .collect();
    let lanes = scratch.lanes(ranges.len());

    // The first phase of every wire: its fold, or the reduce-scatter of its shards.
    let first: Vec<Fold<'_>> = ranges
        .iter()
        .zip(&plans)
        .enumerate()
        .map(|(wire, (r, plan))| {
            let input = &data[r.clone()];
            match *plan {
                MeshReduce::Fold => Fold {
                    wire,
                    input,
                    stride: 0,
                    len: r.len(),
                },
                MeshReduce::ScatterGather { shard, .. } => Fold {
                    wire,
                    input,
                    stride: shard * s,
                    len: shard * s,
                },
            }
        })
        .collect();
    let folded = fold_round(fabric, mesh, reducer, lanes, &first, deadline)?;
    drop(first);
    for ((r, plan), result) in ranges.iter().zip(&plans).zip(folded) {
        let at = match *plan {
            MeshReduce::Fold => r.start,
            MeshReduce::ScatterGather { shard, .. } => r.start + rank * shard * s,
        };
        data[at..at + result.len()].copy_from_slice(result);
    }

    // The all-gather of the reduced shards, in place.
    if plans
        .iter()
        .any(|p| matches!(p, MeshReduce::ScatterGather { shard, .. } if *shard > 0))
    {
        let mut gathers = Vec::new();
        for (wire, (region, plan)) in pieces(data, &ranges).into_iter().zip(&plans).enumerate() {
            let MeshReduce::ScatterGather { shard, .. } = *plan else {
                continue;
            };
            let n = shard * s;
            if n == 0 {
                continue;
            }
            let mut mine: &[u8] = &[];
            let mut theirs = Vec::with_capacity(size - 1);
            for (p, block) in region[..n * size].chunks_mut(n).enumerate() {
                if p == rank {
                    mine = block;
                } else {
                    theirs.push((p, block));
                }
            }
            gathers.push(Gather { wire, mine, theirs });
        }
        gather_round(fabric, mesh, lanes, &mut gathers, deadline)?;
    }

    // The tails (fewer than R elements after the shards), folded.
    let tails: Vec<(Range<usize>, usize)> = ranges
        .iter()
        .zip(&plans)
        .enumerate()
        .filter_map(|(wire, (r, plan))| match *plan {
            MeshReduce::ScatterGather { shard, tail } if tail > 0 => {
                let start = r.start + shard * size * s;
                Some((start..start + tail * s, wire))
            }
            _ => None,
        })
        .collect();
    if !tails.is_empty() {
        let jobs: Vec<Fold<'_>> = tails
            .iter()
            .map(|(r, wire)| Fold {
                wire: *wire,
                input: &data[r.clone()],
                stride: 0,
                len: r.len(),
            })
            .collect();
        let folded = fold_round(fabric, mesh, reducer, lanes, &jobs, deadline)?;
        drop(jobs);
        for ((r, _), result) in tails.iter().zip(folded) {
            data[r.clone()].copy_from_slice(result);
        }
    }
    Ok(())
}

/// MLX's `sum_scatter` (with any reduction): `input` holds R shards of `output.len()` bytes;
/// rank r's `output` becomes the reduction of shard r over every rank: its own shard, then
/// the peers' in rank order (one of MLX's results).
/// With several wires, wire w carries the same range of every shard (MLX's stride).
///
/// # Panics
/// If `input.len() != output.len() * R` (the communicator checks it first).
pub fn sum_scatter<F: Fabric + ?Sized>(
    fabric: &mut F,
    mesh: &MeshTopology,
    reducer: Reducer,
    input: &[u8],
    output: &mut [u8],
    scratch: &mut Scratch,
    deadline: Duration,
) -> Result<(), FabricError> {
    let n = output.len();
    assert_eq!(input.len(), n * mesh.size, "sum_scatter: input size");
    if mesh.size < 2 {
        output.copy_from_slice(input);
        return Ok(());
    }
    let s = reducer.element_size();
    let ranges = in_bytes(mesh_wire_ranges(n, n / s, mesh.wires), s);
    let jobs: Vec<Fold<'_>> = ranges
        .iter()
        .enumerate()
        .map(|(wire, r)| Fold {
            wire,
            input: &input[r.start..],
            stride: n,
            len: r.len(),
        })
        .collect();
    let lanes = scratch.lanes(jobs.len());
    let folded = fold_round(fabric, mesh, reducer, lanes, &jobs, deadline)?;
    for (r, result) in ranges.iter().zip(folded) {
        output[r.clone()].copy_from_slice(result);
    }
    Ok(())
}

/// Gathers every rank's `input` into `output` (`input.len() × R` bytes, rank order), as MLX's
/// mesh `all_gather`. With several wires, wire w carries the same range of every rank's block
/// (MLX's stride).
///
/// # Panics
/// If `output.len() != input.len() * R` (the communicator checks it first).
pub fn all_gather<F: Fabric + ?Sized>(
    fabric: &mut F,
    mesh: &MeshTopology,
    input: &[u8],
    output: &mut [u8],
    scratch: &mut Scratch,
    deadline: Duration,
) -> Result<(), FabricError> {
    let n = input.len();
    assert_eq!(output.len(), n * mesh.size, "all_gather: output size");
    output[mesh.rank * n..(mesh.rank + 1) * n].copy_from_slice(input);
    if n == 0 {
        return Ok(());
    }
    let ranges = mesh_wire_ranges(n, n, mesh.wires);
    let mut theirs: Vec<Vec<(usize, &mut [u8])>> = ranges.iter().map(|_| Vec::new()).collect();
    for (p, block) in output.chunks_mut(n).enumerate() {
        if p == mesh.rank {
            continue;
        }
        for (into, piece) in theirs.iter_mut().zip(pieces(block, &ranges)) {
            into.push((p, piece));
        }
    }
    let mut jobs: Vec<Gather<'_>> = ranges
        .iter()
        .zip(theirs)
        .enumerate()
        .map(|(wire, (r, theirs))| Gather {
            wire,
            mine: &input[r.clone()],
            theirs,
        })
        .collect();
    let lanes = scratch.lanes(jobs.len());
    gather_round(fabric, mesh, lanes, &mut jobs, deadline)
}

/// Sends `data` to any peer `dst`: `⌈n/F⌉` frames on its queue pair (with several wires and
/// at least 512 KiB, a contiguous range on each wire).
pub fn send<F: Fabric + ?Sized>(
    fabric: &mut F,
    mesh: &MeshTopology,
    dst: usize,
    data: &[u8],
    scratch: &mut Scratch,
    deadline: Duration,
) -> Result<(), FabricError> {
    let ranges = mesh_wire_ranges(data.len(), data.len(), mesh.wires);
    let lanes = scratch.lanes(ranges.len());
    let mut step: Step<'_> = Vec::new();
    for (wire, (lane, r)) in lanes.iter_mut().zip(&ranges).enumerate() {
        let piece = &data[r.clone()];
        let frame = mesh.rule.frame(piece.len());
        let count = piece.len().div_ceil(frame);
        let (mut tails, zeros) = lane.staging.prepare(frame, 1);
        if let Some(tail) = tails.first_mut() {
            stage_tail(tail, piece, frame);
        }
        let tail: &[u8] = tails.into_iter().next().map_or(&[], |t| &*t);
        step.reserve(count);
        let channel = mesh.wire_channel(dst, wire);
        push_sends(&mut step, channel, piece, frame, count, tail, zeros);
    }
    fabric.run(&mut step, deadline)
}

/// Receives `data.len()` bytes from any peer `src` (with several wires and at least 512 KiB,
/// a contiguous range from each wire).
pub fn recv<F: Fabric + ?Sized>(
    fabric: &mut F,
    mesh: &MeshTopology,
    src: usize,
    data: &mut [u8],
    deadline: Duration,
) -> Result<(), FabricError> {
    let ranges = mesh_wire_ranges(data.len(), data.len(), mesh.wires);
    let mut sinks: Vec<(usize, Vec<(Channel, Sink<'_>)>)> = Vec::with_capacity(ranges.len());
    for (wire, piece) in pieces(data, &ranges).into_iter().enumerate() {
        let frame = mesh.rule.frame(piece.len());
        let count = piece.len().div_ceil(frame);
        let mut wire_sinks = Vec::with_capacity(count);
        let channel = mesh.wire_channel(src, wire);
        recv_sinks(&mut wire_sinks, channel, piece, frame, count, Keep::Copy);
        sinks.push((frame, wire_sinks));
    }
    let mut step: Step<'_> = Vec::new();
    for (frame, wire_sinks) in sinks.iter_mut() {
        push_recvs(&mut step, wire_sinks, *frame, 1);
    }
    fabric.run(&mut step, deadline)
}
