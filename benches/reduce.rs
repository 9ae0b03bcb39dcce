//! Throughput of the ring's element-wise reductions over cache-cold 64 MiB buffers.
//!
//! Run with `cargo bench --bench reduce`. Prints GB/s: bytes of `local` reduced per second,
//! the median (and the best) of several runs, each preceded by a sweep over an unrelated
//! buffer that evicts the operands from the caches. `unaligned` cases offset the buffers by
//! one byte from their element alignment: both (`local` and `received`) or `received` only.

use std::hint::black_box;
use std::time::{Duration, Instant};

use half::{bf16, f16};
use nuvec_core::DType;
use nuvec_distributed::reduce::{Reducer, Reduction};

/// Bytes per operand.
const BYTES: usize = 64 << 20;
/// Timed runs per case.
const RUNS: usize = 11;

/// Fills `buf` with small, finite, varied elements of `dtype`.
fn fill(dtype: DType, buf: &mut [u8], seed: u32) {
    let size = dtype.size();
    for (i, e) in buf.chunks_exact_mut(size).enumerate() {
        let k = (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) % 1000;
        let x = k as f32 / 1000.0;
        match dtype {
            DType::F32 => e.copy_from_slice(&x.to_le_bytes()),
            DType::F64 => e.copy_from_slice(&f64::from(x).to_le_bytes()),
            DType::F16 => e.copy_from_slice(&f16::from_f32(x).to_bits().to_le_bytes()),
            DType::BF16 => e.copy_from_slice(&bf16::from_f32(x).to_bits().to_le_bytes()),
            DType::I32 => e.copy_from_slice(&(k as i32 - 500).to_le_bytes()),
            DType::Complex64 => {
                e[..4].copy_from_slice(&x.to_le_bytes());
                e[4..].copy_from_slice(&(1.0 - x).to_le_bytes());
            }
            _ => unreachable!("no benchmark data for {dtype}"),
        }
    }
}

/// Sweeps `flush` so that neither operand is left in the caches.
fn evict(flush: &mut [u8]) {
    for b in flush.iter_mut().step_by(64) {
        *b = b.wrapping_add(1);
    }
    black_box(&mut *flush);
}

/// Median and best seconds of `RUNS` applications of `reducer` to `local[lo..]` and
/// `received[ro..]`.
fn time(
    reducer: Reducer,
    local: &mut [u8],
    received: &[u8],
    (lo, ro): (usize, usize),
    flush: &mut [u8],
) -> (f64, f64) {
    let n = if lo == 0 && ro == 0 {
        BYTES
    } else {
        BYTES - reducer.element_size()
    };
    let (local, received) = (&mut local[lo..lo + n], &received[ro..ro + n]);
    let mut times: Vec<Duration> = (0..RUNS)
        .map(|_| {
            evict(flush);
            let start = Instant::now();
            reducer.apply(black_box(&mut *local), black_box(received));
            black_box(&mut *local);
            start.elapsed()
        })
        .collect();
    times.sort();
    (times[RUNS / 2].as_secs_f64(), times[0].as_secs_f64())
}

fn main() {
    let mut local = vec![0u8; BYTES + 8];
    let mut received = vec![0u8; BYTES + 8];
    let mut flush = vec![0u8; 2 * BYTES];
    // The allocator maps buffers this large page-aligned (plus a small header).
    assert!(
        (local.as_ptr() as usize).is_multiple_of(8)
            && (received.as_ptr() as usize).is_multiple_of(8)
    );
    let cases = [
        (Reduction::Sum, DType::F32, (0, 0)),
        (Reduction::Sum, DType::F16, (0, 0)),
        (Reduction::Sum, DType::BF16, (0, 0)),
        (Reduction::Sum, DType::F64, (0, 0)),
        (Reduction::Sum, DType::I32, (0, 0)),
        (Reduction::Max, DType::F32, (0, 0)),
        (Reduction::Max, DType::F16, (0, 0)),
        (Reduction::Sum, DType::Complex64, (0, 0)),
        (Reduction::Sum, DType::F32, (0, 1)),
        (Reduction::Sum, DType::F32, (1, 1)),
        (Reduction::Sum, DType::F16, (0, 1)),
        (Reduction::Sum, DType::F16, (1, 1)),
        (Reduction::Sum, DType::BF16, (0, 1)),
    ];
    println!("reduce: 64 MiB cache-cold buffers, GB/s: median (best) of {RUNS} runs");
    for (op, dtype, offsets) in cases {
        let reducer = Reducer::new(op, dtype).expect("supported");
        // Filled from the offsets the case reads at, so that unaligned cases reduce the same
        // finite values as aligned ones (not the bytes of values shifted by one byte).
        let (lo, ro) = offsets;
        fill(dtype, &mut local[lo..], 1);
        fill(dtype, &mut received[ro..], 7);
        let (median, best) = time(reducer, &mut local, &received, offsets, &mut flush);
        let path = match offsets {
            (0, 0) => "aligned",
            (0, _) => "unaligned received",
            _ => "unaligned both",
        };
        println!(
            "{:>4} {:<9} {:<18} {:>6.2} ({:.2}) GB/s",
            op.name(),
            dtype.name(),
            path,
            BYTES as f64 / median / 1e9,
            BYTES as f64 / best / 1e9
        );
    }
}
