//! The warm-up of a job before its first size is timed, one implementation for the crate's
//! bench (`benches/allreduce/`) and the 0.5.0 bench (`benches/upstream/`, its own workspace),
//! which include this file by path; `benches/mlx_allsum.py` does the same in Python.
//!
//! A job's first collectives run slower than the rest, whichever implementation: on the
//! emulated cluster (4 hosts, 4 KiB on the nuvec wire, 2026-12-06) the first size's p50 was
//! 43–47 µs and every size after it, the same 4 KiB, 34–37, with 50 warm-up iterations per
//! size; over loopback every block was alike.

use std::time::{Duration, Instant};

/// The most all_sums, each after a barrier, that warm a job up, in rounds of
/// [`JOB_WARMUP_ROUND`] until rank 0 has spent [`JOB_WARMUP_TIME`] on them.
const JOB_WARMUP: usize = 1000;

/// The all_sums of a round of the warm-up, after which rank 0 says whether to go on.
const JOB_WARMUP_ROUND: usize = 100;

/// How long the warm-up may take on rank 0, at least a round: a job whose small all_sums take
/// milliseconds (MLX's ring on 4 hosts) stops after its first round.
const JOB_WARMUP_TIME: Duration = Duration::from_millis(250);

/// The bytes of each all_sum of the warm-up (float32).
pub(crate) const JOB_WARMUP_BYTES: usize = 4096;

/// Warms the job up: `all_sum` (a barrier, then an all_sum of [`JOB_WARMUP_BYTES`]) in rounds,
/// and after each round `verdict` (an all_sum of rank 0's wish to go on, `true` only on rank 0,
/// answering whether the sum is 1), so that every rank runs the same collectives.
pub(crate) fn warm_up_job<E>(
    rank: usize,
    mut all_sum: impl FnMut() -> Result<(), E>,
    mut verdict: impl FnMut(bool) -> Result<bool, E>,
) -> Result<(), E> {
    let started = Instant::now();
    for round in 1..=JOB_WARMUP / JOB_WARMUP_ROUND {
        for _ in 0..JOB_WARMUP_ROUND {
            all_sum()?;
        }
        let more = verdict(rank == 0 && started.elapsed() < JOB_WARMUP_TIME)?;
        if !more || round * JOB_WARMUP_ROUND >= JOB_WARMUP {
            break;
        }
    }
    Ok(())
}
