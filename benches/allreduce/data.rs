//! The inputs and the checks: small integers, so that every result is exact (even a float
//! sum), and every rank's result can be compared element by element with the answer.

use half::{bf16, f16};
use nuvec_core::DType;
use nuvec_distributed::reduce::Reduction;

/// The exclusive bound of each rank's values for `dtype` on `n` ranks, so that a sum of n of
/// them is exact (and does not wrap).
pub(crate) fn value_bound(dtype: DType, n: usize) -> u64 {
    let limit: u64 = match dtype {
        DType::Bool => return 2,
        DType::U8 | DType::I8 => 127,
        DType::F16 => 2048,
        DType::BF16 => 256,
        DType::U16 | DType::I16 => 32767,
        _ => 1000,
    };
    (limit / n as u64).max(1)
}

/// Rank `rank`'s value of element `i`.
pub(crate) fn value(i: usize, rank: usize, bound: u64) -> u64 {
    ((i as u64).wrapping_mul(7) + rank as u64 * 3) % bound
}

/// Writes `v` as one element of `dtype` (little-endian) into `out`.
pub(crate) fn encode(dtype: DType, v: u64, out: &mut [u8]) {
    match dtype {
        DType::Bool => out[0] = u8::from(v != 0),
        DType::U8 | DType::I8 => out[0] = v as u8,
        DType::U16 | DType::I16 => out.copy_from_slice(&(v as u16).to_le_bytes()),
        DType::U32 | DType::I32 => out.copy_from_slice(&(v as u32).to_le_bytes()),
        DType::U64 | DType::I64 => out.copy_from_slice(&v.to_le_bytes()),
        DType::F16 => out.copy_from_slice(&f16::from_f32(v as f32).to_le_bytes()),
        DType::BF16 => out.copy_from_slice(&bf16::from_f32(v as f32).to_le_bytes()),
        DType::F32 => out.copy_from_slice(&(v as f32).to_le_bytes()),
        DType::F64 => out.copy_from_slice(&(v as f64).to_le_bytes()),
        DType::Complex64 => {
            out[..4].copy_from_slice(&(v as f32).to_le_bytes());
            out[4..].copy_from_slice(&(v as f32).to_le_bytes());
        }
        _ => unreachable!("no such dtype in reduce::DTYPES"),
    }
}

/// Fills `buf` with rank `rank`'s input.
pub(crate) fn fill(dtype: DType, rank: usize, n: usize, buf: &mut [u8]) {
    let bound = value_bound(dtype, n);
    for (i, e) in buf.chunks_exact_mut(dtype.size()).enumerate() {
        encode(dtype, value(i, rank, bound), e);
    }
}

/// Whether `buf` holds the exact reduction over `n` ranks of their inputs.
pub(crate) fn check_reduced(op: Reduction, dtype: DType, n: usize, buf: &[u8]) -> bool {
    let bound = value_bound(dtype, n);
    let mut want = [0u8; 16];
    buf.chunks_exact(dtype.size()).enumerate().all(|(i, got)| {
        let values = (0..n).map(|r| value(i, r, bound));
        let v = match op {
            Reduction::Sum => values.sum(),
            Reduction::Max => values.max().unwrap_or(0),
            Reduction::Min => values.min().unwrap_or(0),
        };
        encode(dtype, v, &mut want[..got.len()]);
        got == &want[..got.len()]
    })
}

/// Rank `rank`'s all-gather input.
pub(crate) fn gather_input(rank: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|j| (j.wrapping_mul(7) + rank * 13) as u8)
        .collect()
}

/// Whether `out` holds every rank's all-gather input in rank order.
pub(crate) fn check_gathered(n: usize, out: &[u8]) -> bool {
    let len = out.len() / n;
    (0..n).all(|r| out[r * len..(r + 1) * len] == gather_input(r, len)[..])
}
