#!/usr/bin/env python3
"""Print the interop input pattern for a fixed list of cases.

    python tests/interop/pattern_check.py            # print lines to stdout
    python tests/interop/pattern_check.py --write    # (re)write pattern_golden.txt
    python tests/interop/pattern_check.py --check    # compare with pattern_golden.txt

Each line is ``dtype seed rank n hex`` (seed in decimal, hex of the little-endian
bytes of ``mlx_rank.pattern(dtype, seed, rank, n)``; empty for n = 0 is written as
``-``). ``tests/sim/pattern_golden.rs`` checks the Rust ``tests/common/pattern.rs``
against the same file. Needs numpy only.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from mlx_rank import DTYPES, pattern  # noqa: E402

GOLDEN_PATH = os.path.join(HERE, "pattern_golden.txt")

FLOATS = ["float16", "bfloat16", "float32", "float64", "complex64"]
SPECIAL_SEEDS = [1 << 63, (1 << 63) | 0x0123456789ABCDEF, (1 << 64) - 1]


def cases():
    for dtype in DTYPES:
        for seed in [0, 1, 42, 0x0123456789ABCDEF, 0x7FFFFFFFFFFFFFFF]:
            for rank in [0, 1, 7]:
                yield dtype, seed, rank, 5
        yield dtype, 3, 0, 0
        yield dtype, 3, 2, 1
        yield dtype, 9, 1, 300
    for dtype in FLOATS:
        for seed in SPECIAL_SEEDS:
            for rank in [0, 1, 2]:
                yield dtype, seed, rank, 200
    # Non-float dtypes ignore bit 63 of the seed except through the hash.
    for dtype in ["bool", "int16", "uint64"]:
        yield dtype, 1 << 63, 1, 20


def lines():
    for dtype, seed, rank, n in cases():
        data = pattern(dtype, seed, rank, n)
        yield f"{dtype} {seed} {rank} {n} {data.hex() or '-'}"


def main(argv):
    out = list(lines())
    if argv[1:] == ["--write"]:
        with open(GOLDEN_PATH, "w") as f:
            f.write("\n".join(out) + "\n")
        print(f"wrote {len(out)} cases to {GOLDEN_PATH}")
        return 0
    if argv[1:] == ["--check"]:
        with open(GOLDEN_PATH) as f:
            golden = f.read().splitlines()
        if golden != out:
            print(f"MISMATCH with {GOLDEN_PATH}", file=sys.stderr)
            for a, b in zip(golden, out):
                if a != b:
                    print(f"  golden:  {a[:120]}\n  current: {b[:120]}", file=sys.stderr)
                    break
            return 1
        print(f"{len(out)} cases match {GOLDEN_PATH}")
        return 0
    if argv[1:]:
        print(__doc__, file=sys.stderr)
        return 2
    for line in out:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
