//! An independent model of MLX's JACCL collectives (reference `mlx-distributed.md` §3.5–3.8):
//! the value every element ends with, and the exact sequence of message lengths on every
//! queue pair, written again from the protocol description (nothing from
//! `nuvec_distributed::jaccl` or `nuvec_distributed::reduce`).
//!
//! Queue pairs are named as `nuvec_distributed::fabric::Wiring` names them: in a mesh, rank r's
//! queue pair to p on wire w is `Channel { peer: p, link: w }` (one wire: link 0; the multi-wire
//! mesh of MLX 0.32.4's `mesh.h`, its `split_wires` read from its `mesh.cpp`); in a ring, `right_[w]` is
//! `Channel { peer: r+1, link: w }` and `left_[w]` is `Channel { peer: r−1, link: w + (C if
//! R == 2 else 0) }`. Message lists are keyed by `(sender rank, sender's channel)`.

#![allow(unreachable_pub, dead_code)]

use std::collections::BTreeMap;

use nuvec_core::DType;
use nuvec_distributed::fabric::Channel;
use nuvec_distributed::reduce::Reduction;

use super::mlx_model::{Lane, combine_element, left, right};

/// Message lengths per `(sender, channel)`, in order.
pub type Messages = BTreeMap<(usize, Channel), Vec<usize>>;

/// MLX's `buffer_size_from_message`: 4 KiB, or with large frames (macOS ≥ 26.3) the largest
/// `4096 · 2^k`, k in 7..1, not above the message.
pub fn frame(large: bool, message: usize) -> usize {
    if large {
        for k in (1..8).rev() {
            if message >= 4096 << k {
                return 4096 << k;
            }
        }
    }
    4096
}

/// MLX's `ceildiv`, as written there.
#[allow(clippy::manual_div_ceil)]
fn ceildiv(a: usize, b: usize) -> usize {
    (a + b - 1) / b
}

/// JACCL's element op, `out = local ⊕ received`: the sum as MLX's `SumOp`; max is
/// `(local > received) ? local : received` and min `(local < received) ? local : received`,
/// which is `std::max`/`std::min` (the ring's, [`combine_element`]) with the operands in the
/// other order: `std::max(received, local)` keeps `local` exactly when `received < local`.
pub fn combine(lane: Lane, op: Reduction, local: &[u8], received: &[u8], out: &mut [u8]) {
    match op {
        Reduction::Sum => combine_element(lane, op, local, received, out),
        _ => combine_element(lane, op, received, local, out),
    }
}

fn apply(lane: Lane, op: Reduction, local: &mut [u8], received: &[u8]) {
    let s = lane.size();
    let mut tmp = [0u8; 8];
    for (l, r) in local.chunks_exact_mut(s).zip(received.chunks_exact(s)) {
        combine(lane, op, l, r, &mut tmp);
        l.copy_from_slice(&tmp[..s]);
    }
}

/// The mesh's fold of whole inputs (MLX's `MeshImpl::all_reduce`, and the tail of its
/// scatter-gather path): every element is `((x₀ ⊕ x₁) ⊕ x₂) …`.
pub fn mesh_fold(dtype: DType, op: Reduction, inputs: &[Vec<u8>]) -> Vec<u8> {
    let lane = Lane::of(dtype);
    let mut acc = inputs[0].clone();
    for x in &inputs[1..] {
        apply(lane, op, &mut acc, x);
    }
    acc
}

/// The bytes `range` of shard `owner`'s reduction as MLX's `MeshImpl::sum_scatter` folds it on
/// rank `owner`: the owner's own bytes first, then every peer's in rank order (MLX takes the
/// peers in the order their messages complete; this is the order its polls, over the peers
/// in rank order, find them when all have arrived).
pub fn mesh_owner_fold(
    dtype: DType,
    op: Reduction,
    inputs: &[Vec<u8>],
    owner: usize,
    range: std::ops::Range<usize>,
) -> Vec<u8> {
    let lane = Lane::of(dtype);
    let mut acc = inputs[owner][range.clone()].to_vec();
    for (p, x) in inputs.iter().enumerate() {
        if p != owner {
            apply(lane, op, &mut acc, &x[range.clone()]);
        }
    }
    acc
}

/// Rank `rank`'s result of a mesh sum-scatter of shards of `n` bytes: shard `rank` folded by
/// its owner ([`mesh_owner_fold`]).
pub fn mesh_scatter(dtype: DType, op: Reduction, inputs: &[Vec<u8>], rank: usize) -> Vec<u8> {
    let n = inputs[0].len() / inputs.len();
    mesh_owner_fold(dtype, op, inputs, rank, rank * n..(rank + 1) * n)
}

/// The mesh all-reduce over `wires` wires, as MLX 0.32.4's `MeshGroup` cuts it
/// ([`split_wires`]): a wire's range of more than 32 KiB over more than 2 ranks takes the
/// scatter-gather path, whose shard `k` (`⌊n/R⌋` elements of the range each) rank `k` folds
/// ([`mesh_owner_fold`]) and whose tail folds in rank order; any other range folds in rank
/// order ([`mesh_fold`]).
pub fn mesh_all_reduce(dtype: DType, op: Reduction, inputs: &[Vec<u8>], wires: usize) -> Vec<u8> {
    let (r, s) = (inputs.len(), dtype.size());
    let e = inputs[0].len() / s;
    let mut out = mesh_fold(dtype, op, inputs);
    if r > 2 {
        for (_, at, n) in split_wires(e * s, e, wires) {
            if n * s > 32 * 1024 {
                let shard = n / r;
                for owner in 0..r {
                    let start = (at + owner * shard) * s;
                    let range = start..start + shard * s;
                    out[range.clone()]
                        .copy_from_slice(&mesh_owner_fold(dtype, op, inputs, owner, range));
                }
            }
        }
    }
    out
}

/// The ring all-reduce plan: (directions, wires, chunk, spw, frame, messages per step).
pub fn ring_plan(
    large: bool,
    e: usize,
    s: usize,
    r: usize,
    c: usize,
) -> (usize, usize, usize, usize, usize, usize) {
    let small = e * s <= 32768 || e < 2 * r * c;
    let (dirs, wires) = if small { (1, 1) } else { (2, c) };
    let chunk = ceildiv(e, r);
    let spw = ceildiv(chunk, dirs * wires);
    let f = frame(large, spw * s);
    let n_steps = ceildiv(spw, f / s);
    (dirs, wires, chunk, spw, f, n_steps)
}

/// The ring all-reduce's value: an element of chunk j in direction 0's region starts at rank
/// j and is reduced by ranks j+1, j+2, … as `mine ⊕ partial`; in direction 1's region by
/// j−1, j−2, ….
pub fn ring_fold(
    large: bool,
    dtype: DType,
    op: Reduction,
    conns: usize,
    inputs: &[Vec<u8>],
) -> Vec<u8> {
    let lane = Lane::of(dtype);
    let s = lane.size();
    let r = inputs.len();
    let e = inputs[0].len() / s;
    let (_, wires, chunk, spw, _, _) = ring_plan(large, e, s, r, conns);
    let mut out = vec![0u8; e * s];
    let mut tmp = [0u8; 8];
    for i in 0..e {
        let j = i / chunk;
        let lr = (i % chunk) / (wires * spw);
        let el = |rank: usize| &inputs[rank][i * s..(i + 1) * s];
        let mut acc = el(j).to_vec();
        for t in 1..r {
            let rank = if lr == 0 {
                (j + t) % r
            } else {
                (j + r * t - t) % r
            };
            combine(lane, op, el(rank), &acc, &mut tmp);
            acc.copy_from_slice(&tmp[..s]);
        }
        out[i * s..(i + 1) * s].copy_from_slice(&acc);
    }
    out
}

fn push(m: &mut Messages, sender: usize, channel: Channel, count: usize, len: usize) {
    if count == 0 {
        return;
    }
    m.entry((sender, channel))
        .or_default()
        .extend(std::iter::repeat_n(len, count));
}

/// Appends the messages of a mesh all-reduce of `e` elements of `s` bytes.
pub fn mesh_reduce_messages(m: &mut Messages, large: bool, r: usize, e: usize, s: usize) {
    let mut phase = |bytes: usize, times: usize| {
        let f = frame(large, bytes);
        for a in 0..r {
            for b in (0..r).filter(|&b| b != a) {
                for _ in 0..times {
                    push(m, a, Channel::new(b, 0), ceildiv(bytes, f), f);
                }
            }
        }
    };
    if r == 2 || e * s <= 32768 {
        phase(e * s, 1);
    } else {
        let shard = e / r;
        if shard > 0 {
            // The sum-scatter and the all-gather of the shards.
            phase(shard * s, 2);
        }
        let tail = e - shard * r;
        if tail > 0 {
            phase(tail * s, 1);
        }
    }
}

/// Appends the messages of a mesh all-gather of `n` bytes per rank (and of a mesh
/// sum-scatter of `n`-byte shards).
pub fn mesh_gather_messages(m: &mut Messages, large: bool, r: usize, n: usize) {
    let f = frame(large, n);
    for a in 0..r {
        for b in (0..r).filter(|&b| b != a) {
            push(m, a, Channel::new(b, 0), ceildiv(n, f), f);
        }
    }
}

/// Appends the messages of a ring all-reduce: per step and per used (direction, wire), the
/// plan's message count, 2(R−1) steps.
pub fn ring_reduce_messages(m: &mut Messages, large: bool, r: usize, c: usize, e: usize, s: usize) {
    let (dirs, wires, _, _, f, n_steps) = ring_plan(large, e, s, r, c);
    for rank in 0..r {
        for lr in 0..dirs {
            for w in 0..wires {
                let ch = if lr == 0 {
                    right(rank, r, w)
                } else {
                    left(rank, r, c, w)
                };
                push(m, rank, ch, 2 * (r - 1) * n_steps, f);
            }
        }
    }
}

/// The ring sum-scatter's plan (MLX's `RingImpl::reduce_scatter`) for shards of `e` elements
/// of `s` bytes: (wires, spw, frame, messages per step and (direction, wire)). Always two
/// directions; one wire when `e·s ≤ 65536` or `R·e < 2RC`, else C; `spw = ⌈e/(2·wires)⌉`.
pub fn ring_scatter_plan(
    large: bool,
    e: usize,
    s: usize,
    r: usize,
    c: usize,
) -> (usize, usize, usize, usize) {
    let wires = if e * s <= 65536 || e * r < 2 * r * c {
        1
    } else {
        c
    };
    let spw = ceildiv(e, 2 * wires);
    let f = frame(large, spw * s);
    (wires, spw, f, ceildiv(spw, f / s))
}

/// Appends the messages of a ring sum-scatter of shards of `e` elements of `s` bytes: per step
/// (R−1 of them) and per (direction, wire), the plan's message count.
pub fn ring_scatter_messages(
    m: &mut Messages,
    large: bool,
    r: usize,
    c: usize,
    e: usize,
    s: usize,
) {
    if e == 0 {
        return;
    }
    let (wires, _, f, n_steps) = ring_scatter_plan(large, e, s, r, c);
    for rank in 0..r {
        for w in 0..wires {
            push(m, rank, right(rank, r, w), (r - 1) * n_steps, f);
            push(m, rank, left(rank, r, c, w), (r - 1) * n_steps, f);
        }
    }
}

/// Rank `rank`'s result of a ring sum-scatter (shards of `inputs[k].len() / R` bytes) over C
/// wires: an element of shard `rank` in direction 0's region (the first `wires·spw` elements)
/// is `((x_{r+1} ⊕ x_{r+2}) ⊕ …) ⊕ x_r`, one in direction 1's `((x_{r−1} ⊕ x_{r−2}) ⊕ …) ⊕ x_r`:
/// each rank combines what it receives as `received ⊕ mine`.
pub fn ring_scatter(
    large: bool,
    dtype: DType,
    op: Reduction,
    c: usize,
    inputs: &[Vec<u8>],
    rank: usize,
) -> Vec<u8> {
    let (lane, r, s) = (Lane::of(dtype), inputs.len(), dtype.size());
    let n = inputs[0].len() / r;
    let e = n / s;
    let (wires, spw, _, _) = ring_scatter_plan(large, e, s, r, c);
    let split = (wires * spw).min(e) * s;
    let shard = |k: usize| &inputs[k][rank * n..(rank + 1) * n];
    let mut out = Vec::with_capacity(n);
    for (range, step) in [(0..split, 1), (split..n, r - 1)] {
        let first = (rank + step) % r;
        let mut acc = shard(first)[range.clone()].to_vec();
        for i in 2..=r {
            let q = (rank + i * step) % r;
            apply(lane, op, &mut acc, &shard(q)[range.clone()]);
        }
        out.extend_from_slice(&acc);
    }
    out
}

/// Appends the messages of a ring all-gather of `n` bytes per rank (PR #4443's layout).
pub fn ring_gather_messages(m: &mut Messages, large: bool, r: usize, c: usize, n: usize) {
    if n == 0 {
        return;
    }
    let per_wire = ceildiv(n, 2 * c);
    let f = frame(large, per_wire);
    for rank in 0..r {
        for lr in 0..2 {
            for w in 0..c {
                let ch = if lr == 0 {
                    right(rank, r, w)
                } else {
                    left(rank, r, c, w)
                };
                push(m, rank, ch, (r - 1) * ceildiv(per_wire, f), f);
            }
        }
    }
}

/// The ring all-gather's pieces: the bytes of each block that direction `lr`, wire `w` carry.
pub fn ring_gather_piece(n: usize, c: usize, lr: usize, w: usize) -> (usize, usize) {
    let per_wire = ceildiv(n, 2 * c);
    let start = ((lr * c + w) * per_wire).min(n);
    (start, (start + per_wire).min(n))
}

/// Appends the messages of a send of `n` bytes from `src` on the ring to neighbour `dst`: C
/// contiguous pieces of `⌈n/C⌉` bytes, on `left_` if `dst` is the left neighbour, else on
/// `right_`.
pub fn ring_send_messages(
    m: &mut Messages,
    large: bool,
    r: usize,
    c: usize,
    src: usize,
    dst: usize,
    n: usize,
) {
    let per_wire = ceildiv(n, c);
    let f = frame(large, per_wire);
    for w in 0..c {
        let start = (w * per_wire).min(n);
        let len = (start + per_wire).min(n) - start;
        let ch = if dst == (src + r - 1) % r {
            left(src, r, c, w)
        } else {
            right(src, r, w)
        };
        if len > 0 {
            push(m, src, ch, ceildiv(len, f), f);
        }
    }
}

/// Appends the messages of a mesh send of `n` bytes from `src` to `dst`.
pub fn mesh_send_messages(m: &mut Messages, large: bool, src: usize, dst: usize, n: usize) {
    let f = frame(large, n);
    push(m, src, Channel::new(dst, 0), ceildiv(n, f), f);
}

/// MLX 0.32.4's `MESH_MULTI_WIRE_MIN_BYTES`: from this many bytes on a multi-wire mesh cuts an
/// operation across its wires.
pub const MULTI_WIRE_MIN_BYTES: usize = 512 * 1024;

/// MLX 0.32.4's `MeshGroup::split_wires(n_bytes, total, fn)`: `fn(w, offset, n)` for every
/// wire used, as `(w, offset, n)`; one wire below the threshold, else `wires` ranges of
/// `⌈total/wires⌉` with `offset = min(total, w·per)` and `n = min(per, total − offset)`.
pub fn split_wires(n_bytes: usize, total: usize, wires: usize) -> Vec<(usize, usize, usize)> {
    let n_wires = if n_bytes >= MULTI_WIRE_MIN_BYTES {
        wires
    } else {
        1
    };
    let per_wire = ceildiv(total, n_wires);
    (0..n_wires)
        .map(|w| {
            let offset = total.min(w * per_wire);
            (w, offset, per_wire.min(total - offset))
        })
        .collect()
}

/// The messages of one wire's mesh all-reduce of `e` elements (0.32.4's per-wire choice:
/// `size_ > 2 && n·s > 32 KiB` takes the scatter-gather path).
fn mesh_reduce_messages_of_wire(
    m: &mut Messages,
    large: bool,
    r: usize,
    wire: usize,
    e: usize,
    s: usize,
) {
    let mut phase = |bytes: usize, times: usize| {
        let f = frame(large, bytes);
        for a in 0..r {
            for b in (0..r).filter(|&b| b != a) {
                for _ in 0..times {
                    push(m, a, Channel::new(b, wire), ceildiv(bytes, f), f);
                }
            }
        }
    };
    if r > 2 && e * s > 32 * 1024 {
        let chunk = e / r;
        if chunk > 0 {
            // sum_scatter(chunk), then all_gather(chunk) on the same queue pairs.
            phase(chunk * s, 2);
        }
        if chunk * r < e {
            phase((e - chunk * r) * s, 1);
        }
    } else {
        phase(e * s, 1);
    }
}

/// The messages of a mesh all-reduce of `e` elements of `s` bytes over `wires` wires.
pub fn mesh_reduce_messages_wires(
    m: &mut Messages,
    large: bool,
    r: usize,
    wires: usize,
    e: usize,
    s: usize,
) {
    for (w, _, n) in split_wires(e * s, e, wires) {
        mesh_reduce_messages_of_wire(m, large, r, w, n, s);
    }
}

/// The messages of a mesh all-gather of `n` bytes per rank over `wires` wires: wire w carries
/// bytes `[offset, offset + len)` of every rank's block (MLX's stride `n`).
pub fn mesh_gather_messages_wires(m: &mut Messages, large: bool, r: usize, wires: usize, n: usize) {
    for (w, _, len) in split_wires(n, n, wires) {
        let f = frame(large, len);
        for a in 0..r {
            for b in (0..r).filter(|&b| b != a) {
                push(m, a, Channel::new(b, w), ceildiv(len, f), f);
            }
        }
    }
}

/// The messages of a mesh sum-scatter with shards of `e` elements of `s` bytes over `wires`
/// wires: the threshold is the output shard's bytes, the cut is in elements (stride `e`).
pub fn mesh_scatter_messages_wires(
    m: &mut Messages,
    large: bool,
    r: usize,
    wires: usize,
    e: usize,
    s: usize,
) {
    for (w, _, n) in split_wires(e * s, e, wires) {
        let f = frame(large, n * s);
        for a in 0..r {
            for b in (0..r).filter(|&b| b != a) {
                push(m, a, Channel::new(b, w), ceildiv(n * s, f), f);
            }
        }
    }
}

/// The messages of a mesh send of `n` bytes from `src` to `dst` over `wires` wires.
pub fn mesh_send_messages_wires(
    m: &mut Messages,
    large: bool,
    wires: usize,
    src: usize,
    dst: usize,
    n: usize,
) {
    for (w, _, len) in split_wires(n, n, wires) {
        let f = frame(large, len);
        push(m, src, Channel::new(dst, w), ceildiv(len, f), f);
    }
}
