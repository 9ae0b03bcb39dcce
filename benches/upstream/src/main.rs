//! nuvec-distributed 0.5.0 (crates.io) timed the way `benches/allreduce/` and
//! `benches/mlx_allsum.py` time this crate and MLX.
//!
//! ```text
//! mlx.launch -n 2 --backend ring -- target/release/nuvec-upstream-bench [--impl upstream|local] [--sizes 4K,1M,16M]
//! ```
//!
//! One rank of a ring job (`MLX_HOSTFILE`, `MLX_RANK`), joined with `nuvec_distributed::init`.
//! Per size: an f32 array of small integers (so the sum is exact and checked), warm-up, then
//! timed iterations of `nuvec_core::distributed::all_sum` (from the call to the end of `eval`
//! of its result), each preceded by a barrier (an all_sum of one `u8` per rank); the time of
//! an iteration is the mean over the ranks; p50 and p99 over iterations. Iterations per size:
//! clamp(256 MiB / bytes, 10, 500), warm-up clamp(iters / 10, 2, 50); before the first size,
//! up to 1000 all_sums of 4 KiB (or a quarter of a second's), each after a barrier, warm the
//! job up (`benches/common/warmup.rs`). Rank 0 prints one line
//! per size: `ROW <impl> <ranks> <bytes> <p50 µs> <p99 µs> <ok|FAIL> <cpu µs>`, the last the CPU
//! time one operation took on a rank, all its threads, those the operation started and ended
//! included (`CLOCK_PROCESS_CPUTIME_ID`, `benches/common/cpu_time.rs`, as `benches/allreduce/` reads it: 0.5.0 starts a
//! sender thread per step), the mean over ranks and iterations; `nan` where it cannot be read.
//! Then one line `COPY <impl> <ranks> <bytes> <p50 µs>`: the p50 over iterations (the mean over
//! ranks, every rank at once after a barrier, as in the timed all_sums) of copying the input
//! into a fresh allocation, which is what nuvec-core does before any backend runs (it makes
//! the output array of the input's bytes). No array all_sum can take less, whatever the
//! backend: `benches/cluster.sh` shows the bound it sets against the link.
//!
//! `--impl local` (with the cargo feature `local`) joins with this checkout's crate instead,
//! through the same array API: the like-for-like comparison with 0.5.0.

use std::time::Instant;

use nuvec_core::{Array, distributed};

#[path = "../../common/cpu_time.rs"]
mod cpu_time;
use cpu_time::cpu_time;
#[path = "../../common/warmup.rs"]
mod warmup;
use warmup::{JOB_WARMUP_BYTES, warm_up_job};

/// Errors of every kind.
type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// `4096`, `4K`, `1M`, `1G` (binary units).
fn parse_bytes(s: &str) -> Result<usize> {
    let s = s.trim();
    let (digits, shift) = match s.as_bytes().last() {
        Some(b'K' | b'k') => (&s[..s.len() - 1], 10),
        Some(b'M' | b'm') => (&s[..s.len() - 1], 20),
        Some(b'G' | b'g') => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    Ok(digits.parse::<usize>()? << shift)
}

/// Rank `rank`'s input of `elements` small integers.
fn values(elements: usize, rank: usize, ranks: usize) -> Vec<f32> {
    let bound = (1000 / ranks).max(1);
    (0..elements)
        .map(|i| ((i * 7 + rank * 3) % bound) as f32)
        .collect()
}

/// Joins the job's ring with `which` implementation and makes it the default group.
fn init(which: &str) -> Result<distributed::Group> {
    match which {
        "upstream" => Ok(nuvec_distributed::init(true)?),
        #[cfg(feature = "local")]
        "local" => Ok(nuvec_distributed_local::init(true)?),
        other => Err(format!(
            "no implementation {other:?} (upstream, or local with --features local)"
        )
        .into()),
    }
}

/// Times every size and prints rank 0's rows.
fn main() -> Result<()> {
    let mut which = "upstream".to_string();
    let mut sizes = "4K,1M,16M".to_string();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--impl" => which = args.next().ok_or("--impl needs a value")?,
            "--sizes" => sizes = args.next().ok_or("--sizes needs a value")?,
            other => return Err(format!("unknown argument {other:?}").into()),
        }
    }
    let group = init(&which)?;
    let (rank, ranks) = (group.rank(), group.size());
    // One element per rank: every rank sends and waits in every step of the barrier, under
    // every implementation (with one element 0.5.0 skips its empty segments, and its ranks
    // leave the barrier one hop apart).
    let token = Array::from(vec![0u8; ranks]);
    let barrier = || distributed::all_sum(&token, None).eval();
    // The job's first collectives run slower than the rest: warm the job up before its first
    // size (`benches/common/warmup.rs`).
    let small = Array::from(values(JOB_WARMUP_BYTES / 4, rank, ranks));
    warm_up_job(
        rank,
        || {
            barrier()?;
            distributed::all_sum(&small, None).eval()
        },
        |more| {
            let sum = distributed::all_sum(&Array::from(u32::from(more)), None).to_vec::<u32>()?;
            Ok(sum.first() == Some(&1))
        },
    )?;
    for size in sizes.split(',').map(parse_bytes) {
        let elements = size? / 4;
        let bytes = elements * 4;
        let iters = ((256usize << 20) / bytes.max(1)).clamp(10, 500);
        let warmup = (iters / 10).clamp(2, 50);
        let x = Array::from(values(elements, rank, ranks));
        x.eval()?;
        for _ in 0..warmup {
            barrier()?;
            distributed::all_sum(&x, None).eval()?;
        }
        let mut times = Vec::with_capacity(iters);
        let mut cpu = 0.0;
        for _ in 0..iters {
            barrier()?;
            let cpu_start = cpu_time();
            let start = Instant::now();
            let y = distributed::all_sum(&x, None);
            y.eval()?;
            times.push(start.elapsed().as_secs_f64());
            cpu += cpu_time() - cpu_start;
        }
        let cpu = distributed::all_sum(&Array::from(cpu / iters as f64), None).to_vec::<f64>()?;
        let got = distributed::all_sum(&x, None).to_vec::<f32>()?;
        let want: Vec<f32> = (0..ranks)
            .map(|r| values(elements, r, ranks))
            .fold(vec![0.0; elements], |acc, v| {
                acc.iter().zip(v).map(|(a, b)| a + b).collect()
            });
        let wrong =
            distributed::all_sum(&Array::from(u32::from(got != want)), None).to_vec::<u32>()?;
        let t = over_ranks(times, ranks)?;
        // The array call's own copy: the input's bytes into a fresh allocation, every rank at
        // once, as the timed iterations start.
        let input = values(elements, rank, ranks);
        let mut copies = Vec::with_capacity(iters);
        for _ in 0..iters {
            barrier()?;
            let start = Instant::now();
            let copy = std::hint::black_box(input.clone());
            copies.push(start.elapsed().as_secs_f64());
            drop(copy);
        }
        let copies = over_ranks(copies, ranks)?;
        if rank == 0 {
            println!(
                "ROW {which} {ranks} {bytes} {:.1} {:.1} {} {:.1}",
                quantile(&t, 0.5) * 1e6,
                quantile(&t, 0.99) * 1e6,
                if wrong[0] == 0 { "ok" } else { "FAIL" },
                cpu[0] / ranks as f64 * 1e6
            );
            println!(
                "COPY {which} {ranks} {bytes} {:.1}",
                quantile(&copies, 0.5) * 1e6
            );
        }
    }
    Ok(())
}

/// Each iteration's time, the mean over the ranks (every rank passes its own), sorted.
fn over_ranks(times: Vec<f64>, ranks: usize) -> Result<Vec<f64>> {
    let sum = distributed::all_sum(&Array::from(times), None).to_vec::<f64>()?;
    let mut t: Vec<f64> = sum.iter().map(|t| t / ranks as f64).collect();
    t.sort_by(f64::total_cmp);
    Ok(t)
}

/// The `q` quantile of the sorted, non-empty `t`.
fn quantile(t: &[f64], q: f64) -> f64 {
    t[((q * t.len() as f64).ceil() as usize)
        .saturating_sub(1)
        .min(t.len() - 1)]
}
