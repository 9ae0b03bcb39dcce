//! MLX's ring collectives, written once over [`Fabric`].
//!
//! Each function follows the protocol description of MLX's `ring.cpp` step by step: the
//! schedule (which segment, which socket, which direction) comes from [`super::schedule`],
//! and every step hands the fabric all the concurrent transfers of all sub-reduces at once.
//! Received bytes of the reduce-scatter phase are combined into this rank's copy as they
//! arrive; those of the all-gather phase land straight in place. The bytes on every
//! connection direction are exactly those MLX puts there, so Rust and MLX ranks can share a
//! ring.
//!
//! Over a fabric that [forwards](Fabric::forwards), an all-reduce is two steps (its
//! reduce-scatter and its all-gather) and an all-gather one, in which each received segment is
//! sent on as it lands ([`Transfer::Forward`]) instead of in the next step: the same bytes in
//! the same order, but no link waits for a segment's last byte before it sends the next, so a
//! link's latency is paid about once a phase rather than once a step.
//!
//! The functions take a deadline on the fabric's clock and return the fabric's error as is;
//! the caller (the communicator) adds the rank, the operation and its sequence number, and
//! fails the group.

use std::ops::Range;
use std::time::Duration;

use smallvec::SmallVec;

use super::RingTopology;
use super::checked::{self, Headers};
use super::schedule::{
    self, Flow, MLX_SMALL_PATH_LIMIT, Part, Phase, Side, all_gather_plan, all_gather_step,
    all_reduce_plan, all_reduce_step, all_reduce_steps, beyond_mlx_small_path, p2p_split, segment,
};
use crate::collective::reduce::Reducer;
use crate::fabric::{Channel, Direction, Fabric, FabricError, FailureKind, Landing, Transfer};

/// The transfers of one step: at most two per part, at most 2C parts, and on the nuvec wire
/// four headers in an operation's first step (room for C = 2 without allocating); over a
/// fabric that forwards, a [`push_chain`] per part.
type Step<'a> = SmallVec<[Transfer<'a>; 16]>;

/// Pushes one part's chain of a step over a fabric that forwards: `first` sent on `to`, then
/// each of `landings` received on `from` and, all but the last, forwarded on `to` as it lands
/// (as the send of MLX's next step).
fn push_chain<'a>(
    step: &mut Step<'a>,
    (to, from): (Channel, Channel),
    first: &'a [u8],
    landings: impl IntoIterator<Item = Landing<'a>>,
) {
    step.push(Transfer::Send {
        channel: to,
        data: first,
    });
    let mut landings = landings.into_iter().peekable();
    while let Some(landing) = landings.next() {
        let len = landing.len();
        step.push(Transfer::Recv {
            channel: from,
            landing,
        });
        if landings.peek().is_some() {
            let of = step.len() - 1;
            step.push(Transfer::Forward {
                channel: to,
                of,
                len,
            });
        }
    }
}

/// The channels a part sends on and receives from.
fn channels(ring: &RingTopology, part: &Part) -> (Channel, Channel) {
    match part.flow {
        Flow::Leftward => (
            ring.channel(Side::Left, part.pair),
            ring.channel(Side::Right, part.pair),
        ),
        Flow::Rightward => (
            ring.channel(Side::Right, part.pair),
            ring.channel(Side::Left, part.pair),
        ),
    }
}

/// Each of `channels` once, for [`Fabric::sends_later`].
pub(crate) fn distinct(channels: impl IntoIterator<Item = Channel>) -> SmallVec<[Channel; 4]> {
    let mut once: SmallVec<[Channel; 4]> = SmallVec::new();
    for channel in channels {
        if !once.contains(&channel) {
            once.push(channel);
        }
    }
    once
}

/// The channels `parts` send on: every step of MLX's ring sends on each part's channel, so
/// they are what [`Fabric::sends_later`] is told before every step but the last (where a
/// later segment is empty, so is the receive before it, and the step does not wait).
fn send_channels(ring: &RingTopology, parts: &[Part]) -> SmallVec<[Channel; 4]> {
    distinct(parts.iter().map(|part| channels(ring, part).0))
}

/// Splits `buf` into the disjoint `ranges` (in any order; empty ranges anywhere) and returns
/// the slices in the order of `ranges`.
///
/// # Panics
/// If two non-empty ranges overlap or a range is out of bounds: the schedules never do that.
pub(crate) fn carve<'a>(buf: &'a mut [u8], ranges: &[Range<usize>]) -> SmallVec<[&'a mut [u8]; 8]> {
    let mut order: SmallVec<[usize; 8]> = (0..ranges.len()).collect();
    order.sort_by_key(|&i| (ranges[i].start, ranges[i].end));
    let mut slots: SmallVec<[Option<&'a mut [u8]>; 8]> = (0..ranges.len()).map(|_| None).collect();
    let mut rest = buf;
    let mut base = 0;
    for i in order {
        let r = &ranges[i];
        if r.is_empty() {
            slots[i] = Some(&mut []);
            continue;
        }
        assert!(r.start >= base, "ring: overlapping ranges in one step");
        let (_, tail) = std::mem::take(&mut rest).split_at_mut(r.start - base);
        let (piece, tail) = tail.split_at_mut(r.len());
        slots[i] = Some(piece);
        rest = tail;
        base = r.end;
    }
    slots.into_iter().flatten().collect()
}

/// A sink that reduces each received piece into `local`.
fn reducing(reducer: Reducer, local: &mut [u8]) -> impl FnMut(usize, &[u8]) + '_ {
    move |offset, bytes| reducer.apply(&mut local[offset..offset + bytes.len()], bytes)
}

/// An error for a transfer the schedule does not allow.
fn invalid(channel: Channel, direction: Direction, total: usize, what: String) -> FabricError {
    FabricError {
        channel,
        direction,
        done: 0,
        total,
        kind: FailureKind::Invalid(what),
    }
}

/// All-reduce `data` (elements of `reducer`'s dtype) in place over the ring, as MLX's
/// `all_sum`/`all_max`/`all_min` (reference §2.6). `scratch` holds the zero-padded copy on the
/// small path (E < R); it is reused across calls. With `headers` (the nuvec wire), they go
/// ahead of the first step's bytes on their links and are checked as they land.
pub fn all_reduce<F: Fabric + ?Sized>(
    fabric: &mut F,
    ring: &RingTopology,
    reducer: Reducer,
    data: &mut [u8],
    scratch: &mut Vec<u8>,
    headers: Option<&mut Headers>,
    deadline: Duration,
) -> Result<(), FabricError> {
    let s = reducer.element_size();
    let mut plan = all_reduce_plan(data.len() / s, s, ring.size(), ring.conns());
    checked::plan_as_named(&mut plan.parts, headers.as_deref());
    let sub_reduces = if fabric.forwards() {
        forwarded_reduces
    } else {
        sub_reduces
    };
    match plan.padded {
        None => sub_reduces(fabric, ring, reducer, data, &plan.parts, headers, deadline),
        Some(padded) => {
            // MLX copies E < R elements into R zeroed ones and reduces those, one per segment.
            scratch.clear();
            scratch.resize(padded * s, 0);
            scratch[..data.len()].copy_from_slice(data);
            let elements = data.len() / s;
            sub_reduces(
                fabric,
                ring,
                reducer,
                scratch,
                &plan.parts,
                headers,
                deadline,
            )
            .map_err(|e| beyond_mlx(e, elements, s, ring.size()))?;
            data.copy_from_slice(&scratch[..data.len()]);
            Ok(())
        }
    }
}

/// A peer's close during an all-reduce where MLX throws (E < R, s·R > 1024: a Python MLX rank
/// raises and leaves) becomes [`FailureKind::ClosedBeyondMlx`], naming the rule, so the error
/// says why rather than only that the peer left.
fn beyond_mlx(mut e: FabricError, elements: usize, s: usize, ranks: usize) -> FabricError {
    if let FailureKind::ClosedBy { rank, link } = e.kind {
        // The rule explains the close, and the error names the link that closed, not the
        // transfer the step waited on elsewhere.
        if beyond_mlx_small_path(elements, s, ranks) {
            e.channel = Channel::new(rank, link);
            e.direction = Direction::Send;
            (e.done, e.total) = (0, 0);
            e.kind = FailureKind::Closed;
        }
    }
    if e.kind == FailureKind::Closed && beyond_mlx_small_path(elements, s, ranks) {
        e.kind = FailureKind::ClosedBeyondMlx(format!(
            "during an all-reduce of {elements} element(s) of {s} bytes on {ranks} ranks, which \
             MLX refuses (fewer elements than ranks and element size × ranks = {} > \
             {MLX_SMALL_PATH_LIMIT} bytes: it throws \"Can't perform the ring all reduce\"); a \
             ring with a Python MLX rank needs at least {ranks} elements here, or elements of \
             at most {} bytes",
            s * ranks,
            MLX_SMALL_PATH_LIMIT / ranks
        ));
    }
    e
}

/// Runs the sub-reduces of `parts` over `data` in lockstep: step t of every part at once.
fn sub_reduces<F: Fabric + ?Sized>(
    fabric: &mut F,
    ring: &RingTopology,
    reducer: Reducer,
    data: &mut [u8],
    parts: &[Part],
    mut headers: Option<&mut Headers>,
    deadline: Duration,
) -> Result<(), FabricError> {
    let (rank, ranks) = (ring.rank(), ring.size());
    let s = reducer.element_size();
    let steps = all_reduce_steps(ranks);
    let to = send_channels(ring, parts);
    for t in 0..steps {
        fabric.sends_later(if t + 1 < steps { &to } else { &[] });
        let first = headers.take();
        let mut ranges: SmallVec<[Range<usize>; 8]> = SmallVec::new();
        let mut phase = Phase::Copy;
        for part in parts {
            let step = all_reduce_step(rank, ranks, part.flow, t);
            phase = step.phase;
            let len = part.range.len();
            let bytes = |seg: Range<usize>| {
                (part.range.start + seg.start) * s..(part.range.start + seg.end) * s
            };
            ranges.push(bytes(segment(len, ranks, step.send)));
            ranges.push(bytes(segment(len, ranks, step.recv)));
        }
        let mut slices = carve(data, &ranges).into_iter();
        let mut sends: SmallVec<[&[u8]; 4]> = SmallVec::new();
        let mut recvs: SmallVec<[&mut [u8]; 4]> = SmallVec::new();
        while let (Some(send), Some(recv)) = (slices.next(), slices.next()) {
            sends.push(send);
            recvs.push(recv);
        }
        match phase {
            Phase::Reduce => {
                let mut sinks: SmallVec<[_; 4]> = recvs
                    .into_iter()
                    .map(|local| (local.len(), reducing(reducer, local)))
                    .collect();
                let mut step: Step<'_> = SmallVec::new();
                if let Some(h) = first {
                    h.push(&mut step);
                }
                for ((part, data), (len, sink)) in parts.iter().zip(sends).zip(sinks.iter_mut()) {
                    let (to, from) = channels(ring, part);
                    step.push(Transfer::Send { channel: to, data });
                    step.push(Transfer::Recv {
                        channel: from,
                        landing: Landing::Sink {
                            len: *len,
                            grain: s,
                            sink,
                        },
                    });
                }
                fabric.run(&mut step, deadline)?;
            }
            Phase::Copy => {
                let mut step: Step<'_> = SmallVec::new();
                if let Some(h) = first {
                    h.push(&mut step);
                }
                for ((part, data), into) in parts.iter().zip(sends).zip(recvs) {
                    let (to, from) = channels(ring, part);
                    step.push(Transfer::Send { channel: to, data });
                    step.push(Transfer::Recv {
                        channel: from,
                        landing: Landing::Into(into),
                    });
                }
                fabric.run(&mut step, deadline)?;
            }
        }
    }
    Ok(())
}

/// [`sub_reduces`] over a fabric that [forwards](Fabric::forwards), in two steps: the
/// reduce-scatter, then the all-gather. In each, every part sends its first segment and
/// receives the R − 1 after it, forwarding each (but the all-gather's last) as it lands,
/// reduced in the reduce-scatter, as the send of MLX's next step. The bytes on every channel
/// are those of [`sub_reduces`], in the same order; only no segment waits for the whole of
/// the one before it, so a step's one-way latency is paid once per phase, not once per step
/// (README, "Keeping the link busy across steps"). The phases stay apart because the
/// all-gather overwrites the segments the reduce-scatter reduced into.
fn forwarded_reduces<F: Fabric + ?Sized>(
    fabric: &mut F,
    ring: &RingTopology,
    reducer: Reducer,
    data: &mut [u8],
    parts: &[Part],
    mut headers: Option<&mut Headers>,
    deadline: Duration,
) -> Result<(), FabricError> {
    let (rank, ranks) = (ring.rank(), ring.size());
    let s = reducer.element_size();
    let half = all_reduce_steps(ranks) / 2;
    if half == 0 {
        // One rank: nothing to send, as a step per segment sends nothing.
        return Ok(());
    }
    let to = send_channels(ring, parts);
    for (first, phase) in [(0, Phase::Reduce), (half, Phase::Copy)] {
        // The reduce-scatter is followed by the all-gather, on the same channels.
        fabric.sends_later(if phase == Phase::Reduce { &to } else { &[] });
        // Per part: the segment of the phase's first send, then those of its receives.
        let mut ranges: SmallVec<[Range<usize>; 8]> = SmallVec::new();
        for part in parts {
            let len = part.range.len();
            let bytes = |seg: Range<usize>| {
                (part.range.start + seg.start) * s..(part.range.start + seg.end) * s
            };
            let step = |t| all_reduce_step(rank, ranks, part.flow, t);
            ranges.push(bytes(segment(len, ranks, step(first).send)));
            for t in first..first + half {
                ranges.push(bytes(segment(len, ranks, step(t).recv)));
            }
        }
        let mut slices = carve(data, &ranges).into_iter();
        let mut folds: SmallVec<[_; 8]> = (0..parts.len() * half)
            .map(|_| move |mine: &mut [u8], theirs: &[u8]| reducer.apply(mine, theirs))
            .collect();
        let mut folds = folds.iter_mut();
        let mut step: Step<'_> = SmallVec::new();
        if let Some(h) = headers.take() {
            h.push(&mut step);
        }
        for part in parts {
            let Some(first) = slices.next() else {
                break;
            };
            let landings = slices
                .by_ref()
                .take(half)
                .zip(folds.by_ref())
                .map(|(buf, fold)| match phase {
                    Phase::Reduce => Landing::Fold {
                        buf,
                        grain: s,
                        fold,
                    },
                    Phase::Copy => Landing::Into(buf),
                });
            push_chain(&mut step, channels(ring, part), first, landings);
        }
        fabric.run(&mut step, deadline)?;
    }
    Ok(())
}

/// Gathers every rank's `input` into `output` (`input.len() × R` bytes, rank order), as MLX's
/// ring `all_gather` (reference §2.7). With `headers` (the nuvec wire), they go ahead of the
/// first step's bytes on their links and are checked as they land.
///
/// # Panics
/// If `output.len() != input.len() * R` (the communicator checks it first).
pub fn all_gather<F: Fabric + ?Sized>(
    fabric: &mut F,
    ring: &RingTopology,
    input: &[u8],
    output: &mut [u8],
    mut headers: Option<&mut Headers>,
    deadline: Duration,
) -> Result<(), FabricError> {
    let (rank, ranks) = (ring.rank(), ring.size());
    let n = input.len();
    assert_eq!(output.len(), n * ranks, "all_gather: output size");
    output[rank * n..(rank + 1) * n].copy_from_slice(input);
    let mut parts = all_gather_plan(n, ring.conns());
    checked::plan_as_named(&mut parts, headers.as_deref());
    if fabric.forwards() {
        return forwarded_gather(fabric, ring, output, n, &parts, headers, deadline);
    }
    let steps = ranks.saturating_sub(1);
    let to = send_channels(ring, &parts);
    for t in 0..steps {
        fabric.sends_later(if t + 1 < steps { &to } else { &[] });
        let mut ranges: SmallVec<[Range<usize>; 8]> = SmallVec::new();
        for part in &parts {
            let (sent, received) = all_gather_step(rank, ranks, part.flow, t);
            ranges.push(sent * n + part.range.start..sent * n + part.range.end);
            ranges.push(received * n + part.range.start..received * n + part.range.end);
        }
        let mut slices = carve(output, &ranges).into_iter();
        let mut step: Step<'_> = SmallVec::new();
        if let Some(h) = headers.take() {
            h.push(&mut step);
        }
        for part in &parts {
            let (to, from) = channels(ring, part);
            let (Some(send), Some(recv)) = (slices.next(), slices.next()) else {
                break;
            };
            step.push(Transfer::Send {
                channel: to,
                data: send,
            });
            step.push(Transfer::Recv {
                channel: from,
                landing: Landing::Into(recv),
            });
        }
        fabric.run(&mut step, deadline)?;
    }
    Ok(())
}

/// [`all_gather`]'s steps over a fabric that [forwards](Fabric::forwards), as one: every part
/// sends this rank's block and receives the R − 1 others, forwarding each but the last as it
/// lands, as the send of MLX's next step. The same bytes in the same order, with a link's
/// latency paid once rather than once a step.
fn forwarded_gather<F: Fabric + ?Sized>(
    fabric: &mut F,
    ring: &RingTopology,
    output: &mut [u8],
    n: usize,
    parts: &[Part],
    mut headers: Option<&mut Headers>,
    deadline: Duration,
) -> Result<(), FabricError> {
    let (rank, ranks) = (ring.rank(), ring.size());
    let steps = ranks.saturating_sub(1);
    if steps == 0 {
        return Ok(());
    }
    // Per part: this rank's block, then the blocks it receives, in order.
    let mut ranges: SmallVec<[Range<usize>; 8]> = SmallVec::new();
    for part in parts {
        let block = |b: usize| b * n + part.range.start..b * n + part.range.end;
        ranges.push(block(all_gather_step(rank, ranks, part.flow, 0).0));
        for t in 0..steps {
            ranges.push(block(all_gather_step(rank, ranks, part.flow, t).1));
        }
    }
    let mut slices = carve(output, &ranges).into_iter();
    let mut step: Step<'_> = SmallVec::new();
    if let Some(h) = headers.take() {
        h.push(&mut step);
    }
    for part in parts {
        let Some(mine) = slices.next() else {
            break;
        };
        let landings = slices.by_ref().take(steps).map(Landing::Into);
        push_chain(&mut step, channels(ring, part), mine, landings);
    }
    fabric.run(&mut step, deadline)
}

/// Sends `data` to the neighbour `dst`, split over the connections as MLX's ring `send`
/// (reference §2.8): `max(1024, ⌈n/C⌉)` bytes per socket, on the right sockets if `dst` is the
/// right neighbour, else the left ones. With `headers` (the nuvec wire), the header goes first,
/// in the same step.
pub fn send<F: Fabric + ?Sized>(
    fabric: &mut F,
    ring: &RingTopology,
    dst: usize,
    data: &[u8],
    headers: Option<&mut Headers>,
    deadline: Duration,
) -> Result<(), FabricError> {
    let Some(side) = schedule::send_side(ring.rank(), ring.size(), dst) else {
        return Err(invalid(
            Channel::new(dst, 0),
            Direction::Send,
            data.len(),
            format!("rank {dst} is not a neighbour of rank {}", ring.rank()),
        ));
    };
    let mut step: Step<'_> = SmallVec::new();
    if let Some(headers) = headers {
        headers.push(&mut step);
    }
    step.extend(
        p2p_split(data.len(), ring.conns())
            .into_iter()
            .enumerate()
            .map(|(k, range)| Transfer::Send {
                channel: ring.channel(side, k),
                data: &data[range],
            }),
    );
    fabric.run(&mut step, deadline)
}

/// Receives exactly `data.len()` bytes from the neighbour `src`, as MLX's ring `recv`: the left
/// sockets if `src` is the left neighbour, else the right ones. With `headers` (the nuvec
/// wire), the send's header comes first and is checked as it lands: a peer that called
/// something else may never send the bytes this receive waits for.
pub fn recv<F: Fabric + ?Sized>(
    fabric: &mut F,
    ring: &RingTopology,
    src: usize,
    data: &mut [u8],
    headers: Option<&mut Headers>,
    deadline: Duration,
) -> Result<(), FabricError> {
    let Some(side) = schedule::recv_side(ring.rank(), ring.size(), src) else {
        return Err(invalid(
            Channel::new(src, 0),
            Direction::Recv,
            data.len(),
            format!("rank {src} is not a neighbour of rank {}", ring.rank()),
        ));
    };
    let ranges = p2p_split(data.len(), ring.conns());
    let mut step: Step<'_> = SmallVec::new();
    if let Some(headers) = headers {
        headers.push(&mut step);
    }
    step.extend(
        carve(data, &ranges)
            .into_iter()
            .enumerate()
            .map(|(k, into)| Transfer::Recv {
                channel: ring.channel(side, k),
                landing: Landing::Into(into),
            }),
    );
    fabric.run(&mut step, deadline)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_close_elsewhere_beyond_mlxs_small_path_names_the_link_that_closed_and_the_rule() {
        // 3 ranks, 2 elements of 1 KiB: MLX throws, and its rank closes rank 0's link 0 to
        // rank 1 while rank 0 waits on rank 2.
        let closed = FabricError {
            channel: Channel::new(2, 0),
            direction: Direction::Recv,
            done: 0,
            total: 1024,
            kind: FailureKind::ClosedBy { rank: 1, link: 0 },
        };
        let e = beyond_mlx(closed.clone(), 2, 1024, 3);
        assert!(matches!(e.kind, FailureKind::ClosedBeyondMlx(_)), "{e}");
        assert_eq!(
            (e.channel, e.direction),
            (Channel::new(1, 0), Direction::Send)
        );
        // Within MLX's rules the close elsewhere stays as it was.
        assert_eq!(beyond_mlx(closed.clone(), 3, 4, 3), closed);
    }

    #[test]
    fn carving_returns_slices_in_the_order_asked() {
        let mut buf: Vec<u8> = (0..10).collect();
        let parts = carve(&mut buf, &[6..8, 0..2, 4..4, 2..3]);
        let got: Vec<Vec<u8>> = parts.iter().map(|p| p.to_vec()).collect();
        assert_eq!(got, [vec![6, 7], vec![0, 1], vec![], vec![2]]);
    }

    #[test]
    #[should_panic(expected = "overlapping")]
    fn carving_refuses_overlaps() {
        let mut buf = [0u8; 10];
        let _ = carve(&mut buf, &[0..5, 4..6]);
    }
}
