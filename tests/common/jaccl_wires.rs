//! The multi-wire mesh matrix (MLX 0.32.4's `MeshGroup` with `n_wires_`) shared by the
//! simulator's and the process tests: for a mesh of R ranks and W wires, a compact list of
//! operations that covers every collective and every dtype on both sides of 32 KiB (the mesh
//! all-reduce's choice, made per wire) and of 512 KiB (`MESH_MULTI_WIRE_MIN_BYTES`), with
//! element counts that the wires do not divide; each rank's inputs; and the results and the
//! messages on every queue pair that `jaccl_model.rs` gives for them; the device file of such
//! a mesh ([`mesh_device_file`], also the mixed jobs' mesh); one rank's run of an
//! operation on a [`JacclCommunicator`] ([`run`]); and who sends first in a send/recv where
//! every rank sends to `rank + shift` ([`sends_first`], also the rule of the mixed jobs' Rust
//! ranks, as of their C++ ranks in `tests/processes/jaccl_mlx/main.cpp`).

use nuvec_core::DType;
use nuvec_distributed::Error;
use nuvec_distributed::fabric::Fabric;
use nuvec_distributed::jaccl::JacclCommunicator;
use nuvec_distributed::reduce::Reduction;
use rand::{Rng, RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::jaccl_model::{self, MULTI_WIRE_MIN_BYTES, Messages};
use super::values::{DTYPES, OPS, typed_values};

/// One operation every rank of the mesh issues.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WireOp {
    /// All-reduce of `n` elements.
    Reduce {
        op: Reduction,
        dtype: DType,
        n: usize,
    },
    /// All-gather of `n` bytes per rank.
    Gather { n: usize },
    /// Sum-scatter (with any reduction) into shards of `n` elements.
    Scatter {
        op: Reduction,
        dtype: DType,
        n: usize,
    },
    /// Rank r sends `n` bytes to r + shift and receives from r − shift.
    SendRecv { shift: usize, n: usize },
}

/// Sizes in bytes of the three classes: below 32 KiB, between 32 KiB and 512 KiB (one wire,
/// the scatter-gather path with more than 2 ranks), and from 512 KiB on (every wire, each
/// wire's range above 32 KiB).
const SMALL: usize = 20_000;
const MIDDLE: usize = 200_000;

/// The operations of the matrix for a mesh of `ranks` ranks and `wires` wires: every dtype's
/// all-reduce (the size class and the reduction rotating with the dtype, the mesh and the
/// wires, so that every class meets every dtype across the matrix), all-reduces just below and
/// exactly at 512 KiB, all-gathers, sum-scatters and send/recv in every class.
pub fn ops(ranks: usize, wires: usize) -> Vec<WireOp> {
    let turn = ranks + wires;
    let mut ops = Vec::new();
    for (i, &dtype) in DTYPES.iter().enumerate() {
        let s = dtype.size();
        let op = OPS[(i + turn) % OPS.len()];
        let n = match (i + turn) % 3 {
            0 => SMALL / s + 3,
            1 => MIDDLE / s + 1,
            // From 512 KiB on, a count the wires do not divide.
            _ => MULTI_WIRE_MIN_BYTES / s + 1 + i % 5,
        };
        ops.push(WireOp::Reduce { op, dtype, n });
    }
    // Either side of the threshold, to the element.
    for n in [MULTI_WIRE_MIN_BYTES / 4 - 1, MULTI_WIRE_MIN_BYTES / 4] {
        ops.push(WireOp::Reduce {
            op: Reduction::Sum,
            dtype: DType::F32,
            n,
        });
    }
    for n in [SMALL + 1, MIDDLE + 3, MULTI_WIRE_MIN_BYTES + 5] {
        ops.push(WireOp::Gather { n });
    }
    // Sum-scatter compares its output shard with the threshold.
    let d1 = DTYPES[turn % DTYPES.len()];
    let d2 = DTYPES[(turn + 7) % DTYPES.len()];
    for (dtype, bytes) in [(d1, SMALL), (d2, MULTI_WIRE_MIN_BYTES)] {
        ops.push(WireOp::Scatter {
            op: OPS[turn % OPS.len()],
            dtype,
            n: bytes / dtype.size() + 2,
        });
    }
    for n in [SMALL + 7, MULTI_WIRE_MIN_BYTES + 1] {
        ops.push(WireOp::SendRecv {
            shift: 1 + turn % (ranks - 1).max(1),
            n,
        });
    }
    ops
}

/// Rank `rank`'s input of operation `i` of `op` in a job of `ranks` ranks with `seed`.
pub fn input(seed: u64, i: usize, rank: usize, ranks: usize, op: &WireOp) -> Vec<u8> {
    let mut rng = ChaCha8Rng::seed_from_u64(
        seed ^ (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
            ^ (rank as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03),
    );
    match *op {
        WireOp::Reduce { dtype, n, .. } => typed_values(&mut rng, dtype, n, 1.0 / 32.0),
        WireOp::Scatter { dtype, n, .. } => typed_values(&mut rng, dtype, n * ranks, 1.0 / 32.0),
        WireOp::Gather { n } | WireOp::SendRecv { n, .. } => {
            let mut b = vec![0u8; n];
            rng.fill_bytes(&mut b);
            b
        }
    }
}

/// `inputs[op][rank]` of the whole list.
pub fn inputs(seed: u64, ranks: usize, ops: &[WireOp]) -> Vec<Vec<Vec<u8>>> {
    ops.iter()
        .enumerate()
        .map(|(i, op)| (0..ranks).map(|r| input(seed, i, r, ranks, op)).collect())
        .collect()
}

/// The model's result of operation `op` on rank `rank` of a mesh of `wires` wires given every
/// rank's input.
pub fn result(op: &WireOp, rank: usize, wires: usize, ins: &[Vec<u8>]) -> Vec<u8> {
    let r = ins.len();
    match *op {
        WireOp::Reduce { op, dtype, .. } => jaccl_model::mesh_all_reduce(dtype, op, ins, wires),
        WireOp::Scatter { op, dtype, .. } => jaccl_model::mesh_scatter(dtype, op, ins, rank),
        WireOp::Gather { .. } => ins.concat(),
        WireOp::SendRecv { shift, .. } => ins[(rank + r - shift) % r].clone(),
    }
}

/// The device file of a mesh of `ranks` ranks with `wires` cables per pair, in the list form
/// (a string when one cable): rank i's w-th cable to rank j is a port of its own,
/// `rdma_en{w·(R−1) + k}` with k the index of j among i's peers, so that every wire of a rank
/// is on devices of its own.
pub fn mesh_device_file(ranks: usize, wires: usize) -> String {
    let rows: Vec<serde_json::Value> = (0..ranks)
        .map(|i| {
            (0..ranks)
                .map(|j| {
                    if i == j {
                        return serde_json::Value::Null;
                    }
                    let k = if j < i { j } else { j - 1 };
                    let names: Vec<String> = (0..wires)
                        .map(|w| format!("rdma_en{}", w * (ranks - 1) + k))
                        .collect();
                    if wires == 1 {
                        names[0].clone().into()
                    } else {
                        names.into()
                    }
                })
                .collect::<Vec<_>>()
                .into()
        })
        .collect();
    serde_json::Value::Array(rows).to_string()
}

/// Which half of a send/recv a rank does first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendOrder {
    /// Every rank sends, then receives: on the simulator's message channels a send completes
    /// once its message has left, whoever receives it.
    SendFirst,
    /// The ranks at even positions of their cycle send first, the others receive first
    /// ([`sends_first`]): over sockets and queue pairs, whose sends may wait for a receiver.
    Alternating,
}

/// Rank `rank`'s run of `op` on `comm`, a mesh of `size` ranks, with `mine` its input: the
/// result the rank holds afterwards.
pub fn run<F: Fabric>(
    comm: &JacclCommunicator<F>,
    op: &WireOp,
    rank: usize,
    size: usize,
    mine: &[u8],
    order: SendOrder,
) -> Result<Vec<u8>, Error> {
    match *op {
        WireOp::Reduce { op, dtype, .. } => {
            let mut data = mine.to_vec();
            comm.try_all_reduce(op, dtype, &mut data).map(|()| data)
        }
        WireOp::Scatter { op, dtype, n } => {
            let mut out = vec![0u8; n * dtype.size()];
            comm.try_sum_scatter(op, dtype, mine, &mut out)
                .map(|()| out)
        }
        WireOp::Gather { n } => {
            let mut out = vec![0u8; n * size];
            comm.try_all_gather(mine, &mut out).map(|()| out)
        }
        WireOp::SendRecv { shift, n } => {
            let mut out = vec![0u8; n];
            let (dst, src) = ((rank + shift) % size, (rank + size - shift) % size);
            let send_first = match order {
                SendOrder::SendFirst => true,
                SendOrder::Alternating => sends_first(rank, size, shift),
            };
            if send_first {
                comm.try_send(dst, mine)
                    .and_then(|()| comm.try_recv(src, &mut out))
            } else {
                comm.try_recv(src, &mut out)
                    .and_then(|()| comm.try_send(dst, mine))
            }
            .map(|()| out)
        }
    }
}

/// The messages of the whole list on every queue pair.
pub fn messages(ranks: usize, wires: usize, large: bool, ops: &[WireOp]) -> Messages {
    let mut m = Messages::new();
    for op in ops {
        match *op {
            WireOp::Reduce { dtype, n, .. } => jaccl_model::mesh_reduce_messages_wires(
                &mut m,
                large,
                ranks,
                wires,
                n,
                dtype.size(),
            ),
            WireOp::Gather { n } => {
                jaccl_model::mesh_gather_messages_wires(&mut m, large, ranks, wires, n)
            }
            WireOp::Scatter { dtype, n, .. } => jaccl_model::mesh_scatter_messages_wires(
                &mut m,
                large,
                ranks,
                wires,
                n,
                dtype.size(),
            ),
            WireOp::SendRecv { shift, n } => {
                for src in 0..ranks {
                    let dst = (src + shift) % ranks;
                    jaccl_model::mesh_send_messages_wires(&mut m, large, wires, src, dst, n);
                }
            }
        }
    }
    m
}

/// A random pick of `count` operations of the matrix (for the slower process jobs): always
/// one of each collective, then others drawn with `seed`.
pub fn sample(ops: &[WireOp], count: usize, seed: u64) -> Vec<WireOp> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut picked: Vec<WireOp> = Vec::new();
    for kind in 0..4 {
        if let Some(op) = ops.iter().find(|op| kind_of(op) == kind) {
            picked.push(*op);
        }
    }
    while picked.len() < count.min(ops.len()) {
        let op = ops[rng.random_range(0..ops.len())];
        if !picked.contains(&op) {
            picked.push(op);
        }
    }
    picked
}

fn kind_of(op: &WireOp) -> u8 {
    match op {
        WireOp::Reduce { .. } => 0,
        WireOp::Gather { .. } => 1,
        WireOp::Scatter { .. } => 2,
        WireOp::SendRecv { .. } => 3,
    }
}

/// Whether `rank` sends before it receives when every rank sends to `rank + shift`: the ranks
/// at even positions of its cycle, counted from the cycle's smallest rank (in a cycle of odd
/// length the last one sends first too, and its receiver, at position 0, is done sending by
/// then), so that no cycle of blocked sends forms whatever the fabric's buffering.
pub fn sends_first(rank: usize, size: usize, shift: usize) -> bool {
    let next = |x: usize| (x + shift) % size;
    let mut start = rank;
    let mut x = next(rank);
    while x != rank {
        start = start.min(x);
        x = next(x);
    }
    let (mut at, mut position) = (start, 0);
    while at != rank {
        at = next(at);
        position += 1;
    }
    position % 2 == 0
}
