//! Throughput of the ring's element-wise reductions over cache-cold 64 MiB buffers.
//!
//! Run with `cargo bench --bench reduce`. Prints GB/s: bytes of `local` reduced per second,
//! the median of several runs, each preceded by a sweep over an unrelated buffer that evicts
//! the operands from the caches.

use std::hint::black_box;
use std::time::{Duration, Instant};

use half::{bf16, f16};
use nuvec_core::DType;
use nuvec_distributed::reduce::{Reducer, Reduction};

/// Bytes per operand.
const BYTES: usize = 64 << 20;
/// Timed runs per case.
const RUNS: usize = 9;

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

/// Median seconds of `RUNS` applications of `reducer` to `local[offset..]`.
fn time(
    reducer: Reducer,
    local: &mut [u8],
    received: &[u8],
    offset: usize,
    flush: &mut [u8],
) -> f64 {
    let n = BYTES - reducer.element_size();
    let (local, received) = if offset == 0 {
        (&mut local[..BYTES], &received[..BYTES])
    } else {
        (
            &mut local[offset..offset + n],
            &received[offset..offset + n],
        )
    };
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
    times[RUNS / 2].as_secs_f64()
}

fn main() {
    let mut local = vec![0u8; BYTES + 8];
    let mut received = vec![0u8; BYTES + 8];
    let mut flush = vec![0u8; 2 * BYTES];
    let cases = [
        (Reduction::Sum, DType::F32, 0),
        (Reduction::Sum, DType::F16, 0),
        (Reduction::Sum, DType::BF16, 0),
        (Reduction::Sum, DType::F64, 0),
        (Reduction::Sum, DType::I32, 0),
        (Reduction::Max, DType::F32, 0),
        (Reduction::Max, DType::F16, 0),
        (Reduction::Sum, DType::F32, 1),
        (Reduction::Sum, DType::F16, 1),
    ];
    println!("reduce: 64 MiB cache-cold buffers, median of {RUNS} runs");
    for (op, dtype, offset) in cases {
        let reducer = Reducer::new(op, dtype).expect("supported");
        fill(dtype, &mut local, 1);
        fill(dtype, &mut received, 7);
        let secs = time(reducer, &mut local, &received, offset, &mut flush);
        let path = if offset == 0 { "aligned" } else { "unaligned" };
        println!(
            "{:>4} {:<9} {:<9} {:>7.2} GB/s",
            op.name(),
            dtype.name(),
            path,
            BYTES as f64 / secs / 1e9
        );
    }
}
