//! JACCL's ring algorithms (MLX's `ring_impl.h` after #3900/#3901/#4193, with the all-gather as
//! fixed by #4443; reference §3.7), written once over [`Fabric`].
//!
//! Every rank has C queue pairs ("wires") to each neighbour, named as the TCP ring names its
//! connections ([`RingTopology::channel`]): MLX's `right_[w]` is the channel of wire w on the
//! right side, `left_[w]` on the left side. Direction 0 sends right and receives from the
//! left; direction 1 sends left and receives from the right.
//!
//! - **all-reduce**: one direction of one wire when N ≤ 32 KiB or E < 2·R·C, else two
//!   directions of C wires ([`RingReduce`]). Each chunk of `⌈E/R⌉` elements is cut into a
//!   slice per (direction, wire); R−1 reduce-scatter steps then R−1 all-gather steps move one
//!   chunk's slice per (direction, wire) per step, each as exactly `⌈spw/Ne⌉` frames, padding
//!   included. Received slices are reduced into place as `mine ⊕ received`.
//! - **all-gather**: direction 0 carries the first half of every block and direction 1 the
//!   second, each cut across the wires ([`RingGather`]), over R−1 steps.
//! - **sum-scatter** (MLX's `reduce_scatter`): the R shards are the chunks, each cut into a
//!   slice per (direction, wire) ([`RingReduce::scatter`]: one wire up to 64 KiB of shard);
//!   over R−1 steps direction 0 passes to the right the partial of shard `r − 1 − k` and
//!   direction 1 to the left that of shard `r + 1 + k`, both converging on shard r. A
//!   received partial is combined as `received ⊕ mine` (MLX's operand order here, the reverse
//!   of the all-reduce's), so shard c's elements of direction 0 fold as
//!   `((x_{c+1} ⊕ x_{c+2}) ⊕ …) ⊕ x_c` and those of direction 1 as
//!   `((x_{c−1} ⊕ x_{c−2}) ⊕ …) ⊕ x_c`.
//! - **send/recv** to a neighbour: C contiguous per-wire pieces.
//!
//! Each step is one fabric step; the steps are barriers, as MLX's per-wire steps are.

use std::ops::Range;
use std::time::Duration;

use super::frames::{FrameRule, RingGather, RingReduce, ring_p2p};
use super::wire::{
    Keep, Scratch, Sink, Staging, Step, push_recvs, push_sends, recv_sinks, stage_tail,
};
use crate::collective::reduce::Reducer;
use crate::fabric::{Channel, Direction, Fabric, FabricError, FailureKind};
use crate::ring::RingTopology;
use crate::ring::algorithm::carve;
use crate::ring::schedule::Side;

/// The channels of direction `lr` on wire `w`: (send, receive).
fn channels(ring: &RingTopology, lr: usize, w: usize) -> (Channel, Channel) {
    if lr == 0 {
        (ring.channel(Side::Right, w), ring.channel(Side::Left, w))
    } else {
        (ring.channel(Side::Left, w), ring.channel(Side::Right, w))
    }
}

/// One (direction, wire) of a step: the bytes it sends and the bytes it receives.
struct Lane {
    lr: usize,
    wire: usize,
    send: Range<usize>,
    recv: Range<usize>,
}

/// Runs one step of lanes over `buf`: each lane sends `count` frames from its `send` range and
/// receives `count` frames into its `recv` range (copied or reduced). The ranges of all lanes
/// must be disjoint.
#[allow(clippy::too_many_arguments)]
fn run_lanes<F: Fabric + ?Sized>(
    fabric: &mut F,
    ring: &RingTopology,
    buf: &mut [u8],
    lanes: &[Lane],
    frame: usize,
    count: usize,
    keep: Keep,
    grain: usize,
    staging: &mut Staging,
    deadline: Duration,
) -> Result<(), FabricError> {
    let ranges: Vec<Range<usize>> = lanes
        .iter()
        .flat_map(|l| [l.send.clone(), l.recv.clone()])
        .collect();
    let mut slices = carve(buf, &ranges).into_iter();
    let (mut tails, zeros) = staging.prepare(frame, lanes.len());
    let mut sends: Vec<(Channel, &[u8], &[u8])> = Vec::with_capacity(lanes.len());
    let mut sinks: Vec<(Channel, Sink<'_>)> = Vec::with_capacity(lanes.len() * count);
    for (lane, tail) in lanes.iter().zip(tails.iter_mut()) {
        let (Some(send), Some(recv)) = (slices.next(), slices.next()) else {
            break;
        };
        let (to, from) = channels(ring, lane.lr, lane.wire);
        stage_tail(tail, send, frame);
        sends.push((to, send, &[]));
        recv_sinks(&mut sinks, from, recv, frame, count, keep);
    }
    let tails: Vec<&[u8]> = tails.into_iter().map(|t| &*t).collect();
    let mut step: Step<'_> = Vec::with_capacity(2 * lanes.len() * count);
    for ((to, send, _), tail) in sends.iter().zip(tails) {
        push_sends(&mut step, *to, send, frame, count, tail, zeros);
    }
    push_recvs(&mut step, &mut sinks, frame, grain);
    fabric.run(&mut step, deadline)
}

/// All-reduces `data` (elements of `reducer`'s dtype, with JACCL's semantics) in place over the
/// ring, as MLX's JACCL ring `all_sum`/`all_max`/`all_min`.
pub fn all_reduce<F: Fabric + ?Sized>(
    fabric: &mut F,
    ring: &RingTopology,
    rule: FrameRule,
    reducer: Reducer,
    data: &mut [u8],
    scratch: &mut Scratch,
    deadline: Duration,
) -> Result<(), FabricError> {
    let staging = scratch.staging();
    let (rank, ranks) = (ring.rank(), ring.size());
    if ranks < 2 {
        return Ok(());
    }
    let s = reducer.element_size();
    let plan = RingReduce::new(rule, data.len() / s, s, ranks, ring.conns());
    let count = plan.messages_per_step();
    let bytes = |r: Range<usize>| r.start * s..r.end * s;
    for k in 0..plan.steps() {
        let mut lanes = Vec::with_capacity(plan.dirs * plan.wires);
        let mut keep = Keep::Copy;
        for lr in 0..plan.dirs {
            for wire in 0..plan.wires {
                let (send, recv, reduce) = plan.step(rank, k, lr);
                if reduce {
                    keep = Keep::Reduce(reducer);
                }
                lanes.push(Lane {
                    lr,
                    wire,
                    send: bytes(plan.slice(send, lr, wire)),
                    recv: bytes(plan.slice(recv, lr, wire)),
                });
            }
        }
        run_lanes(
            fabric, ring, data, &lanes, plan.frame, count, keep, s, staging, deadline,
        )?;
    }
    Ok(())
}

/// MLX's JACCL ring `sum_scatter` (with any reduction): `input` holds R shards of
/// `output.len()` bytes; rank r's `output` becomes shard r reduced over every rank, in the
/// order the [module docs](self) give.
///
/// # Panics
/// If `input.len() != output.len() * R` (the communicator checks it first).
#[allow(clippy::too_many_arguments)]
pub fn sum_scatter<F: Fabric + ?Sized>(
    fabric: &mut F,
    ring: &RingTopology,
    rule: FrameRule,
    reducer: Reducer,
    input: &[u8],
    output: &mut [u8],
    scratch: &mut Scratch,
    deadline: Duration,
) -> Result<(), FabricError> {
    let staging = scratch.staging();
    let (rank, ranks) = (ring.rank(), ring.size());
    let n = output.len();
    assert_eq!(input.len(), n * ranks, "sum_scatter: input size");
    if ranks < 2 || n == 0 {
        output.copy_from_slice(&input[rank * n..(rank + 1) * n]);
        return Ok(());
    }
    let s = reducer.element_size();
    let plan = RingReduce::scatter(rule, n / s, s, ranks, ring.conns());
    let count = plan.messages_per_step();
    // Each (direction, wire)'s piece of a shard, in bytes.
    let pieces: Vec<(usize, usize, Range<usize>)> = (0..2)
        .flat_map(|lr| (0..plan.wires).map(move |w| (lr, w)))
        .map(|(lr, w)| {
            let e = plan.slice(0, lr, w);
            (lr, w, e.start * s..e.end * s)
        })
        .collect();
    // Each piece's partial, then each piece's landing, `width` bytes apart.
    let width = plan.spw * s;
    let lanes_at = pieces.len() * width;
    let mut work = vec![0u8; 2 * lanes_at];
    let shard = |delta: isize| (rank as isize + delta).rem_euclid(ranks as isize) as usize * n;
    for (i, (lr, _, piece)) in pieces.iter().enumerate() {
        let from = shard(if *lr == 0 { -1 } else { 1 });
        work[i * width..i * width + piece.len()]
            .copy_from_slice(&input[from + piece.start..from + piece.end]);
    }
    for k in 0..ranks - 1 {
        let lanes: Vec<Lane> = pieces
            .iter()
            .enumerate()
            .map(|(i, (lr, wire, piece))| Lane {
                lr: *lr,
                wire: *wire,
                send: i * width..i * width + piece.len(),
                recv: lanes_at + i * width..lanes_at + i * width + piece.len(),
            })
            .collect();
        run_lanes(
            fabric,
            ring,
            &mut work,
            &lanes,
            plan.frame,
            count,
            Keep::Copy,
            1,
            staging,
            deadline,
        )?;
        // The new partial: what arrived, combined with this rank's own part of its shard.
        let (partials, landed) = work.split_at_mut(lanes_at);
        for (i, (lr, _, piece)) in pieces.iter().enumerate() {
            let k = k as isize;
            let mine = shard(if *lr == 0 { -2 - k } else { 2 + k });
            let partial = &mut partials[i * width..i * width + piece.len()];
            partial.copy_from_slice(&landed[i * width..i * width + piece.len()]);
            reducer.apply(partial, &input[mine + piece.start..mine + piece.end]);
        }
    }
    for (i, (_, _, piece)) in pieces.iter().enumerate() {
        output[piece.clone()].copy_from_slice(&work[i * width..i * width + piece.len()]);
    }
    Ok(())
}

/// Gathers every rank's `input` into `output` (`input.len() × R` bytes, rank order), as MLX's
/// JACCL ring `all_gather` with PR #4443's layout.
///
/// # Panics
/// If `output.len() != input.len() * R` (the communicator checks it first).
pub fn all_gather<F: Fabric + ?Sized>(
    fabric: &mut F,
    ring: &RingTopology,
    rule: FrameRule,
    input: &[u8],
    output: &mut [u8],
    scratch: &mut Scratch,
    deadline: Duration,
) -> Result<(), FabricError> {
    let staging = scratch.staging();
    let (rank, ranks) = (ring.rank(), ring.size());
    let n = input.len();
    assert_eq!(output.len(), n * ranks, "all_gather: output size");
    output[rank * n..(rank + 1) * n].copy_from_slice(input);
    if ranks < 2 || n == 0 {
        return Ok(());
    }
    let plan = RingGather::new(rule, n, ranks, ring.conns());
    let count = plan.messages_per_step();
    for k in 0..ranks - 1 {
        let mut lanes = Vec::with_capacity(2 * plan.wires);
        for lr in 0..2 {
            for wire in 0..plan.wires {
                let (send, recv) = plan.step(rank, k, lr);
                let piece = plan.piece(lr, wire);
                lanes.push(Lane {
                    lr,
                    wire,
                    send: send * n + piece.start..send * n + piece.end,
                    recv: recv * n + piece.start..recv * n + piece.end,
                });
            }
        }
        run_lanes(
            fabric,
            ring,
            output,
            &lanes,
            plan.frame,
            count,
            Keep::Copy,
            1,
            staging,
            deadline,
        )?;
    }
    Ok(())
}

/// The side of the ring a send to `dst` (or, `receive`, a receive from it) uses, as MLX: a send
/// to the left neighbour goes on `left_`, any other on `right_`; a receive from the right
/// neighbour reads `right_`, any other `left_`. `None` if `peer` is not a neighbour.
pub fn side(ring: &RingTopology, peer: usize, receive: bool) -> Option<Side> {
    if ring.size() < 2 || peer == ring.rank() || (peer != ring.left() && peer != ring.right()) {
        return None;
    }
    Some(match (receive, peer == ring.left(), peer == ring.right()) {
        (false, true, _) => Side::Left,
        (false, false, _) => Side::Right,
        (true, _, true) => Side::Right,
        (true, _, false) => Side::Left,
    })
}

fn not_a_neighbour(
    ring: &RingTopology,
    peer: usize,
    direction: Direction,
    n: usize,
) -> FabricError {
    FabricError {
        channel: Channel::new(peer, 0),
        direction,
        done: 0,
        total: n,
        kind: FailureKind::Invalid(format!(
            "rank {peer} is not a neighbour of rank {}",
            ring.rank()
        )),
    }
}

/// Sends `data` to the neighbour `dst`: C contiguous pieces, one per wire.
pub fn send<F: Fabric + ?Sized>(
    fabric: &mut F,
    ring: &RingTopology,
    rule: FrameRule,
    dst: usize,
    data: &[u8],
    scratch: &mut Scratch,
    deadline: Duration,
) -> Result<(), FabricError> {
    let staging = scratch.staging();
    let Some(side) = side(ring, dst, false) else {
        return Err(not_a_neighbour(ring, dst, Direction::Send, data.len()));
    };
    let (frame, pieces) = ring_p2p(rule, data.len(), ring.conns());
    let (mut tails, zeros) = staging.prepare(frame, pieces.len());
    for (tail, piece) in tails.iter_mut().zip(&pieces) {
        stage_tail(tail, &data[piece.clone()], frame);
    }
    let mut step: Step<'_> = Vec::new();
    for (w, (tail, piece)) in tails.into_iter().zip(&pieces).enumerate() {
        let count = piece.len().div_ceil(frame);
        let payload = &data[piece.clone()];
        push_sends(
            &mut step,
            ring.channel(side, w),
            payload,
            frame,
            count,
            tail,
            zeros,
        );
    }
    fabric.run(&mut step, deadline)
}

/// Receives `data.len()` bytes from the neighbour `src`.
pub fn recv<F: Fabric + ?Sized>(
    fabric: &mut F,
    ring: &RingTopology,
    rule: FrameRule,
    src: usize,
    data: &mut [u8],
    deadline: Duration,
) -> Result<(), FabricError> {
    let Some(side) = side(ring, src, true) else {
        return Err(not_a_neighbour(ring, src, Direction::Recv, data.len()));
    };
    let (frame, pieces) = ring_p2p(rule, data.len(), ring.conns());
    let mut sinks: Vec<(Channel, Sink<'_>)> = Vec::new();
    for (w, dest) in carve(data, &pieces).into_iter().enumerate() {
        let count = dest.len().div_ceil(frame);
        recv_sinks(
            &mut sinks,
            ring.channel(side, w),
            dest,
            frame,
            count,
            Keep::Copy,
        );
    }
    let mut step: Step<'_> = Vec::new();
    push_recvs(&mut step, &mut sinks, frame, 1);
    fabric.run(&mut step, deadline)
}
