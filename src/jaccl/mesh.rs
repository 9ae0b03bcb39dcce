//! JACCL's mesh algorithms (MLX's `mesh_impl.h`, reference §3.6), written once over
//! [`Fabric`]: every rank has one queue pair (one channel, link 0) to every other rank.
//!
//! - **all-reduce**: with 2 ranks, or at most 32 KiB, every rank sends its whole input to every
//!   peer and folds the R inputs in rank order, `((x₀ ⊕ x₁) ⊕ x₂) …`, so every rank computes the
//!   same bits. Above that, with more than 2 ranks, a reduce-scatter of R shards, an all-gather
//!   of the shards, and a fold of the tail of fewer than R elements, each phase with its own
//!   frame size.
//! - **sum-scatter**: rank r gets shard r of the reduction. MLX reduces the shards in the order
//!   they complete, so its float sums change from run to run; here every shard is folded in
//!   rank order, which is one of MLX's possible results and the same on every run.
//! - **all-gather** and **send/recv** to any peer.
//!
//! Scratch: a fold of blocks of n bytes (the whole buffer, or a shard) takes a slot per peer
//! and, on rank 0 only, an accumulator: at most R·n bytes, besides
//! a staging frame per peer; a 2-rank all-reduce of n bytes takes 2n on rank 0 and n on
//! rank 1.
//!
//! The messages on every queue pair are MLX's: the same count, each one frame long with the
//! payload at the front. A whole operation is one fabric step; how many frames are in flight at
//! once is the fabric's business (the RDMA fabric keeps MLX's two).

use std::time::Duration;

use super::frames::{FrameRule, MeshReduce};
use super::wire::{Keep, Scratch, Sink, Step, push_recvs, push_sends, recv_sinks, stage_tail};
use crate::collective::reduce::Reducer;
use crate::fabric::{Channel, Fabric, FabricError};

/// This rank's place in a mesh, and the frame rule of the job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MeshTopology {
    rank: usize,
    size: usize,
    rule: FrameRule,
}

impl MeshTopology {
    /// Rank `rank` of a mesh of `size` ranks.
    ///
    /// # Panics
    /// If `rank >= size`.
    pub fn new(rank: usize, size: usize, rule: FrameRule) -> Self {
        assert!(rank < size, "mesh: rank {rank} of {size}");
        Self { rank, size, rule }
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The frame rule.
    pub fn rule(&self) -> FrameRule {
        self.rule
    }

    /// The channel (queue pair) to `peer`.
    pub fn channel(&self, peer: usize) -> Channel {
        Channel::new(peer, 0)
    }

    /// Every other rank, in rank order.
    pub fn peers(&self) -> impl Iterator<Item = usize> + use<> {
        let rank = self.rank;
        (0..self.size).filter(move |&p| p != rank)
    }
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
    let s = reducer.element_size();
    match MeshReduce::choose(data.len() / s, s, mesh.size) {
        MeshReduce::Fold => fold(fabric, mesh, reducer, data, scratch, deadline),
        MeshReduce::ScatterGather { shard, .. } => {
            let n = shard * s;
            let (shards, tail) = data.split_at_mut(n * mesh.size);
            if n > 0 {
                let folded = scatter_fold(fabric, mesh, reducer, shards, scratch, deadline)?;
                shards[mesh.rank * n..(mesh.rank + 1) * n].copy_from_slice(folded);
                gather_in_place(fabric, mesh, shards, n, scratch, deadline)?;
            }
            if !tail.is_empty() {
                fold(fabric, mesh, reducer, tail, scratch, deadline)?;
            }
            Ok(())
        }
    }
}

/// Every rank sends `data` to every peer; every rank folds the R inputs in rank order.
fn fold<F: Fabric + ?Sized>(
    fabric: &mut F,
    mesh: &MeshTopology,
    reducer: Reducer,
    data: &mut [u8],
    scratch: &mut Scratch,
    deadline: Duration,
) -> Result<(), FabricError> {
    let folded = exchange_fold(fabric, mesh, reducer, data, false, scratch, deadline)?;
    data.copy_from_slice(folded);
    Ok(())
}

/// Sends shard p of `shards` (R shards of `n` bytes) to every peer p and returns the fold of
/// shard `rank` of every rank, in rank order.
fn scatter_fold<'s, F: Fabric + ?Sized>(
    fabric: &mut F,
    mesh: &MeshTopology,
    reducer: Reducer,
    shards: &[u8],
    scratch: &'s mut Scratch,
    deadline: Duration,
) -> Result<&'s [u8], FabricError> {
    exchange_fold(fabric, mesh, reducer, shards, true, scratch, deadline)
}

/// The one exchange of the mesh's folds: to every peer p this rank sends `input` whole, or,
/// when `sharded`, shard p of its R equal shards; it receives the peers' blocks of the same
/// size and returns `((x₀ ⊕ x₁) ⊕ x₂) …`, with its own block (or shard) in its place. MLX
/// folds shards in the order they complete; rank order is one of its results.
///
/// The scratch holds a slot per peer only, (R−1)·n bytes for blocks of n, and the fold runs
/// in rank 0's slot; rank 0, whose block is not in a slot, folds into `scratch.acc` (n more
/// bytes). So the fold takes at most R·n bytes of scratch (2 ranks: 2n on rank 0, n on
/// rank 1), besides the staging frames.
fn exchange_fold<'s, F: Fabric + ?Sized>(
    fabric: &mut F,
    mesh: &MeshTopology,
    reducer: Reducer,
    input: &[u8],
    sharded: bool,
    scratch: &'s mut Scratch,
    deadline: Duration,
) -> Result<&'s [u8], FabricError> {
    let n = if sharded {
        input.len() / mesh.size
    } else {
        input.len()
    };
    let block = |p: usize| {
        if sharded {
            &input[p * n..(p + 1) * n]
        } else {
            input
        }
    };
    let Scratch {
        received,
        acc,
        staging,
    } = scratch;
    acc.clear();
    if n == 0 {
        return Ok(&[]);
    }
    let frame = mesh.rule.frame(n);
    let count = n.div_ceil(frame);
    received.clear();
    // Slot i holds the block of the i-th peer in rank order.
    received.resize(n * (mesh.size - 1), 0);
    {
        let (mut tails, zeros) = staging.prepare(frame, mesh.size);
        for (p, tail) in tails.iter_mut().enumerate() {
            stage_tail(tail, block(p), frame);
        }
        let tails: Vec<&[u8]> = tails.into_iter().map(|t| &*t).collect();
        let mut sinks: Vec<(Channel, Sink<'_>)> = Vec::new();
        for (p, into) in mesh.peers().zip(received.chunks_mut(n)) {
            recv_sinks(&mut sinks, mesh.channel(p), into, frame, count, Keep::Copy);
        }
        let mut step: Step<'_> = Vec::with_capacity(2 * count * (mesh.size - 1));
        for p in mesh.peers() {
            let tail = tails.get(p).copied().unwrap_or_default();
            push_sends(
                &mut step,
                mesh.channel(p),
                block(p),
                frame,
                count,
                tail,
                zeros,
            );
        }
        push_recvs(&mut step, &mut sinks, frame, reducer.element_size());
        fabric.run(&mut step, deadline)?;
    }
    // Fold in rank order into rank 0's block: its slot, or on rank 0 a copy of its own.
    let (fold, rest): (&mut [u8], &[u8]) = if mesh.rank == 0 {
        acc.extend_from_slice(block(0));
        (acc, received)
    } else {
        let (first, rest) = received.split_at_mut(n);
        (first, rest)
    };
    // Peers after rank 0 in `rest`, in rank order.
    let mut peers = rest.chunks(n);
    for r in 1..mesh.size {
        let x = if r == mesh.rank {
            block(r)
        } else {
            peers.next().unwrap_or_default()
        };
        reducer.apply(fold, x);
    }
    Ok(fold)
}

/// MLX's `sum_scatter` (with any reduction): `input` holds R shards of `output.len()` bytes;
/// rank r's `output` becomes the reduction of shard r over every rank, folded in rank order.
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
    let folded = scatter_fold(fabric, mesh, reducer, input, scratch, deadline)?;
    output.copy_from_slice(folded);
    Ok(())
}

/// Gathers block `rank` of `blocks` (R blocks of `n` bytes) into every rank's `blocks`.
fn gather_in_place<F: Fabric + ?Sized>(
    fabric: &mut F,
    mesh: &MeshTopology,
    blocks: &mut [u8],
    n: usize,
    scratch: &mut Scratch,
    deadline: Duration,
) -> Result<(), FabricError> {
    if n == 0 {
        return Ok(());
    }
    let frame = mesh.rule.frame(n);
    let count = n.div_ceil(frame);
    let (mut tails, zeros) = scratch.staging.prepare(frame, 1);
    let mut mine: &[u8] = &[];
    let mut sinks: Vec<(Channel, Sink<'_>)> = Vec::new();
    for (p, block) in blocks.chunks_mut(n).enumerate() {
        if p == mesh.rank {
            if let Some(tail) = tails.first_mut() {
                stage_tail(tail, block, frame);
            }
            mine = block;
        } else {
            recv_sinks(&mut sinks, mesh.channel(p), block, frame, count, Keep::Copy);
        }
    }
    let tail: &[u8] = tails.into_iter().next().map_or(&[], |t| &*t);
    let mut step: Step<'_> = Vec::with_capacity(2 * count * (mesh.size - 1));
    for p in mesh.peers() {
        push_sends(&mut step, mesh.channel(p), mine, frame, count, tail, zeros);
    }
    push_recvs(&mut step, &mut sinks, frame, 1);
    fabric.run(&mut step, deadline)
}

/// Gathers every rank's `input` into `output` (`input.len() × R` bytes, rank order), as MLX's
/// mesh `all_gather`.
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
    gather_in_place(fabric, mesh, output, n, scratch, deadline)
}

/// Sends `data` to any peer `dst`: `⌈n/F⌉` frames on its queue pair.
pub fn send<F: Fabric + ?Sized>(
    fabric: &mut F,
    mesh: &MeshTopology,
    dst: usize,
    data: &[u8],
    scratch: &mut Scratch,
    deadline: Duration,
) -> Result<(), FabricError> {
    let n = data.len();
    let frame = mesh.rule.frame(n);
    let count = n.div_ceil(frame);
    let (mut tails, zeros) = scratch.staging.prepare(frame, 1);
    if let Some(tail) = tails.first_mut() {
        stage_tail(tail, data, frame);
    }
    let tail: &[u8] = tails.into_iter().next().map_or(&[], |t| &*t);
    let mut step: Step<'_> = Vec::with_capacity(count);
    push_sends(
        &mut step,
        mesh.channel(dst),
        data,
        frame,
        count,
        tail,
        zeros,
    );
    fabric.run(&mut step, deadline)
}

/// Receives `data.len()` bytes from any peer `src`.
pub fn recv<F: Fabric + ?Sized>(
    fabric: &mut F,
    mesh: &MeshTopology,
    src: usize,
    data: &mut [u8],
    deadline: Duration,
) -> Result<(), FabricError> {
    let n = data.len();
    let frame = mesh.rule.frame(n);
    let count = n.div_ceil(frame);
    let mut sinks: Vec<(Channel, Sink<'_>)> = Vec::with_capacity(count);
    recv_sinks(
        &mut sinks,
        mesh.channel(src),
        data,
        frame,
        count,
        Keep::Copy,
    );
    let mut step: Step<'_> = Vec::with_capacity(count);
    push_recvs(&mut step, &mut sinks, frame, 1);
    fabric.run(&mut step, deadline)
}
