#!/usr/bin/env python3
"""MLX's ring all_sum of float32, timed as benches/allreduce/ times this crate's.

    mlx.launch -n 2 --backend ring -- .venv/bin/python benches/mlx_allsum.py --sizes 4K,1M,16M

One rank of an MLX ring job (``mx.distributed.init(strict=True, backend="ring")``, the CPU
stream). Per size: warm-up, then timed iterations, each preceded by a barrier (an all_sum of
one uint8 element per rank) and timed from the call to the end of ``mx.eval`` of its result;
the time of an iteration is the mean over the ranks of what each measured; p50 and p99 over
iterations. Iterations per size: clamp(256 MiB / bytes, 10, 500), warm-up clamp(iters / 10,
2, 50), as the Rust bench; before the first size, up to 1000 all_sums of 4 KiB (or a quarter
of a second's), each after a barrier, warm the job up (its first collectives run slower than
the rest). Inputs are small integers, so the sum is exact and checked on every
rank.

Rank 0 prints one line per size::

    ROW mlx <ranks> <bytes> <p50 µs> <p99 µs> <ok|FAIL> <cpu µs>

the last the CPU time one operation took on a rank, all its threads (``time.process_time``),
the mean over ranks and iterations.

MLX's all_sum returns a new array: its time includes making the output (as nuvec's
``distributed::all_sum`` on arrays does), unlike the in-place raw-byte API that
benches/allreduce/ times.
"""

import argparse
import sys
import time

import numpy as np


def parse_bytes(s):
    s = s.strip()
    shift = {"K": 10, "k": 10, "M": 20, "m": 20, "G": 30, "g": 30}.get(s[-1:], 0)
    return int(s[:-1] if shift else s) << shift


def values(n_elems, rank, ranks):
    bound = max(1, 1000 // ranks)
    i = np.arange(n_elems, dtype=np.uint64)
    return ((i * np.uint64(7) + np.uint64(rank * 3)) % np.uint64(bound)).astype(np.float32)


# At most JOB_WARMUP all_sums of JOB_WARMUP_BYTES, each after a barrier, before the first size
# is timed, in rounds of JOB_WARMUP_ROUND until rank 0 has spent JOB_WARMUP_TIME seconds on them:
# the values of benches/common/warmup.rs.
JOB_WARMUP = 1000
JOB_WARMUP_ROUND = 100
JOB_WARMUP_TIME = 0.25
JOB_WARMUP_BYTES = 4096


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="4K,1M,16M")
    parser.add_argument("--iters", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=None)
    args = parser.parse_args()

    import mlx.core as mx

    group = mx.distributed.init(strict=True, backend="ring")
    rank, ranks = group.rank(), group.size()
    # One element per rank, as benches/upstream: every rank sends in every step.
    token = mx.array([0] * ranks, dtype=mx.uint8)

    def barrier():
        mx.eval(mx.distributed.all_sum(token, group=group, stream=mx.cpu))

    # The job's first collectives run slower than the rest: warm the job up before its first
    # size, as benches/common/warmup.rs does for the Rust benches.
    small = mx.array(values(JOB_WARMUP_BYTES // 4, rank, ranks))
    started = time.perf_counter()
    for warm_round in range(1, JOB_WARMUP // JOB_WARMUP_ROUND + 1):
        for _ in range(JOB_WARMUP_ROUND):
            barrier()
            mx.eval(mx.distributed.all_sum(small, group=group, stream=mx.cpu))
        # Rank 0's verdict, the same on every rank.
        more = rank == 0 and time.perf_counter() - started < JOB_WARMUP_TIME
        flag = mx.array([int(more)], dtype=mx.uint32)
        verdict = mx.distributed.all_sum(flag, group=group, stream=mx.cpu)
        if verdict.item() != 1 or warm_round * JOB_WARMUP_ROUND >= JOB_WARMUP:
            break

    for size in (parse_bytes(s) for s in args.sizes.split(",")):
        n_elems = size // 4
        iters = args.iters or min(max((256 << 20) // size, 10), 500)
        warmup = args.warmup if args.warmup is not None else min(max(iters // 10, 2), 50)
        x = mx.array(values(n_elems, rank, ranks))
        mx.eval(x)
        for _ in range(warmup):
            barrier()
            mx.eval(mx.distributed.all_sum(x, group=group, stream=mx.cpu))
        times = []
        cpu = 0.0
        for _ in range(iters):
            barrier()
            cpu_start = time.process_time()
            start = time.perf_counter()
            y = mx.distributed.all_sum(x, group=group, stream=mx.cpu)
            mx.eval(y)
            times.append(time.perf_counter() - start)
            cpu += time.process_time() - cpu_start
            del y
        cpus = mx.distributed.all_sum(mx.array([cpu / iters], dtype=mx.float32), group=group, stream=mx.cpu)
        cpu_us = float(np.array(cpus)[0]) / ranks * 1e6
        y = mx.distributed.all_sum(x, group=group, stream=mx.cpu)
        mx.eval(y)
        expect = sum(values(n_elems, r, ranks) for r in range(ranks))
        ok = bool(np.array_equal(np.array(y), expect))
        flags = mx.distributed.all_sum(mx.array([0 if ok else 1], dtype=mx.int32), group=group, stream=mx.cpu)
        all_ok = int(np.array(flags)[0]) == 0
        mean = mx.distributed.all_sum(mx.array(np.array(times, dtype=np.float32)), group=group, stream=mx.cpu)
        t = np.sort(np.array(mean, dtype=np.float64) / ranks)
        p50 = t[max(0, -(-len(t) // 2) - 1)]
        p99 = t[max(0, -(-len(t) * 99 // 100) - 1)]
        if rank == 0:
            print(f"ROW mlx {ranks} {n_elems * 4} {p50 * 1e6:.1f} {p99 * 1e6:.1f} {'ok' if all_ok else 'FAIL'} {cpu_us:.1f}")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
