#!/usr/bin/env python3
"""One rank of an MLX `ring` interop job.

    MLX_HOSTFILE=... MLX_RANK=r python mlx_rank.py PLAN_JSON_PATH OUT_PATH

Plan (JSON object)::

    {"ops": [{"op": "all_sum"|"all_max"|"all_min"|"all_gather"|"send"|"recv",
              "dtype": "float32", "n": 10, "seed": 1,
              "peer": 1,          # send/recv only: destination / source rank
              "ranks": [0]}]}     # send/recv only: ranks that perform the op

Every rank builds its input for op k as ``pattern(dtype, seed, rank, n)`` (shape
[n]), runs the op on the CPU stream, evaluates it and appends one line to
OUT_PATH::

    <index> <op> <dtype> <hex of the result's little-endian bytes>

or ``sha256:<hex digest>`` instead of the hex when the result is over 4096 bytes.
A sender writes its own input; a receiver writes what it received (which is
``pattern(dtype, seed, peer, n)``). ``{rank}`` in OUT_PATH is replaced by the
rank (for mlx.launch, which gives every rank the same arguments). Ranks not
listed in an op's ``ranks`` skip it and write no line for it. On any error the traceback goes to stderr and the
exit status is 1 (the lines of the ops that completed stay in OUT_PATH).

The ``pattern`` function is also the reference for ``tests/common/pattern.rs``;
it needs numpy only (mlx is imported in ``main``).
"""

import hashlib
import json
import os
import sys
import traceback

import numpy as np

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
ELEM_MUL = 0xD1B54A32D192ED03
HASH_THRESHOLD = 4096

DTYPE_SIZES = {
    "bool": 1, "uint8": 1, "int8": 1,
    "uint16": 2, "int16": 2, "float16": 2, "bfloat16": 2,
    "uint32": 4, "int32": 4, "float32": 4,
    "uint64": 8, "int64": 8, "float64": 8, "complex64": 8,
}
DTYPES = list(DTYPE_SIZES)

# numpy dtype holding the raw values (bfloat16 is carried as its uint16 bits).
NP_DTYPES = {
    "bool": np.bool_, "uint8": np.uint8, "uint16": np.uint16, "uint32": np.uint32,
    "uint64": np.uint64, "int8": np.int8, "int16": np.int16, "int32": np.int32,
    "int64": np.int64, "float16": np.float16, "bfloat16": np.uint16,
    "float32": np.float32, "float64": np.float64, "complex64": np.complex64,
}

F32_SPECIALS = np.array([0x7FC00000, 0x7F800000, 0xFF800000, 0x80000000], dtype=np.uint32)
F64_SPECIALS = np.array(
    [0x7FF8000000000000, 0x7FF0000000000000, 0xFFF0000000000000, 0x8000000000000000],
    dtype=np.uint64,
)


def splitmix64(v):
    """splitmix64 finaliser on a uint64 array (wrapping arithmetic)."""
    z = v + np.uint64(GOLDEN)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def raw(seed, rank, n):
    """uint64 array of the raw values x_i, i < n."""
    base = np.uint64((seed ^ (rank * GOLDEN)) & MASK64)
    i = np.arange(n, dtype=np.uint64)
    return splitmix64(base ^ (i * np.uint64(ELEM_MUL)))


def _specials_mask(x, specials):
    if not specials:
        return None
    mask = (x >> np.uint64(60)) == np.uint64(15)
    sel = ((x >> np.uint64(58)) & np.uint64(3)).astype(np.int64)
    return mask, sel


def f32_bits(x, specials):
    k = (x % np.uint64(2001)).astype(np.int64) - 1000
    bits = (k.astype(np.float32) / np.float32(8.0)).view(np.uint32).copy()
    sm = _specials_mask(x, specials)
    if sm is not None:
        mask, sel = sm
        bits[mask] = F32_SPECIALS[sel[mask]]
    return bits


def f64_bits(x, specials):
    k = (x % np.uint64(2001)).astype(np.int64) - 1000
    bits = (k.astype(np.float64) / np.float64(8.0)).view(np.uint64).copy()
    sm = _specials_mask(x, specials)
    if sm is not None:
        mask, sel = sm
        bits[mask] = F64_SPECIALS[sel[mask]]
    return bits


def f32_bits_to_bf16_bits(bits):
    """MLX's round-to-nearest-even trick (computed in uint64, no overflow)."""
    b = bits.astype(np.uint64)
    return ((b + np.uint64(0x7FFF) + ((b >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)).astype(np.uint16)


def pattern_array(dtype, seed, rank, n):
    """numpy array (dtype NP_DTYPES[dtype]) of rank's input; bfloat16 as uint16 bits."""
    if dtype not in DTYPE_SIZES:
        raise ValueError(f"unknown dtype {dtype!r}")
    seed &= MASK64
    specials = (seed >> 63) == 1
    x = raw(seed, rank, n)
    if dtype == "bool":
        return (x & np.uint64(1)).astype(np.bool_)
    if dtype in ("uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64"):
        # Truncation: keep the low bits, reinterpret as the (possibly signed) type.
        size = DTYPE_SIZES[dtype]
        unsigned = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[size]
        return x.astype(unsigned).view(NP_DTYPES[dtype])
    if dtype == "float32":
        return f32_bits(x, specials).view(np.float32)
    if dtype == "float64":
        return f64_bits(x, specials).view(np.float64)
    if dtype == "float16":
        return f32_bits(x, specials).view(np.float32).astype(np.float16)
    if dtype == "bfloat16":
        return f32_bits_to_bf16_bits(f32_bits(x, specials))
    if dtype == "complex64":
        out = np.empty(2 * n, dtype=np.uint32)
        out[0::2] = f32_bits(x, specials)
        out[1::2] = f32_bits(splitmix64(x), specials)
        return out.view(np.complex64)
    raise AssertionError(dtype)


def pattern(dtype, seed, rank, n):
    """Little-endian raw bytes of n elements of dtype: rank's input under seed."""
    b = pattern_array(dtype, seed, rank, n).tobytes()
    assert len(b) == n * DTYPE_SIZES[dtype]
    return b


def encode(data):
    if len(data) > HASH_THRESHOLD:
        return "sha256:" + hashlib.sha256(data).hexdigest()
    return data.hex()


# ---------------------------------------------------------------------------- MLX side


def to_mx(mx, dtype, arr):
    if dtype == "bfloat16":
        a = mx.array(arr, dtype=mx.uint16).view(mx.bfloat16)
    else:
        # The explicit dtype matters: mx.array(float64 ndarray) gives float32.
        a = mx.array(arr, dtype=mx_dtype(mx, dtype))
    if a.dtype != mx_dtype(mx, dtype) or a.size != arr.size:
        raise AssertionError(f"built {a.dtype} {a.shape}, want {dtype} [{arr.size}]")
    return a


def mx_bytes(mx, a, dtype):
    if dtype == "bfloat16":
        a = a.view(mx.uint16)
    b = np.array(a, copy=True).tobytes()
    return b


def mx_dtype(mx, name):
    return mx.bool_ if name == "bool" else getattr(mx, name)


def run_op(mx, g, op):
    kind = op["op"]
    dtype = op["dtype"]
    n = int(op["n"])
    seed = int(op["seed"])
    rank = g.rank()
    if kind in ("send", "recv"):
        peer = int(op["peer"])
        if kind == "send":
            x = to_mx(mx, dtype, pattern_array(dtype, seed, rank, n))
            y = mx.distributed.send(x, peer, group=g, stream=mx.cpu)
            mx.eval(y)
            return mx_bytes(mx, x, dtype)
        y = mx.distributed.recv((n,), mx_dtype(mx, dtype), peer, group=g, stream=mx.cpu)
        mx.eval(y)
        return mx_bytes(mx, y, dtype)
    x = to_mx(mx, dtype, pattern_array(dtype, seed, rank, n))
    fn = {
        "all_sum": mx.distributed.all_sum,
        "all_max": mx.distributed.all_max,
        "all_min": mx.distributed.all_min,
        "all_gather": mx.distributed.all_gather,
    }[kind]
    y = fn(x, group=g, stream=mx.cpu)
    mx.eval(y)
    return mx_bytes(mx, y, dtype)


def main(argv):
    if len(argv) != 3:
        print(f"usage: {argv[0]} PLAN_JSON_PATH OUT_PATH", file=sys.stderr)
        return 2
    plan_path, out_path = argv[1], argv[2]
    with open(plan_path) as f:
        plan = json.load(f)

    import mlx.core as mx

    g = mx.distributed.init(strict=True, backend="ring")
    rank = g.rank()
    out_path = out_path.replace("{rank}", str(rank))
    tag = f"[mlx_rank {rank}/{g.size()}]"
    with open(out_path, "w") as out:
        for index, op in enumerate(plan["ops"]):
            kind = op["op"]
            if kind in ("send", "recv"):
                if "ranks" not in op or "peer" not in op:
                    raise ValueError(f"op {index}: {kind} needs 'peer' and 'ranks'")
                if rank not in op["ranks"]:
                    continue
            try:
                data = run_op(mx, g, op)
            except Exception:
                print(f"{tag} op {index} {json.dumps(op)} failed:", file=sys.stderr)
                raise
            out.write(f"{index} {kind} {op['dtype']} {encode(data)}\n")
            out.flush()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except SystemExit:
        raise
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        # Skip interpreter teardown: MLX's ring threads may be blocked on sockets.
        os._exit(1)
