"""A Python MLX rank of a ring that sums once, tries MLX's own split (which MLX's ring refuses),
then stays idle until the job stops it: what a Python rank does while the Rust ranks split."""

import time

import mlx.core as mx

group = mx.distributed.init(strict=True, backend="ring")
total = mx.distributed.all_sum(mx.array([float(group.rank())]))
mx.eval(total)
print("MLX SUM", total.item(), flush=True)
try:
    group.split(0)
    print("MLX SPLIT OK", flush=True)
except Exception as error:  # MLX's ring throws on split
    print("MLX SPLIT REFUSED", error, flush=True)
# Idle, as a rank whose program has no split: the job stops it once the Rust ranks are done.
time.sleep(120)
