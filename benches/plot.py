#!/usr/bin/env python3
"""Draws busbw against size from runs of benches/allreduce/, as an SVG (standard library only).

    cargo bench --ignore-rust-version --bench allreduce -- --ranks 2 --sizes 4K..64M > r2.txt
    cargo bench --ignore-rust-version --bench allreduce -- --ranks 4 --sizes 4K..64M > r4.txt
    python3 benches/plot.py r2.txt r4.txt > benches/busbw.svg

Every input is one run (its header names the ranks); each gives two lines, the ring's busbw
(solid) and its wire's (dashed, the same bytes over blocking sockets, no reduction).
"""
import math
import re
import sys

COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
WIDTH, HEIGHT = 720, 420
LEFT, RIGHT, TOP, BOTTOM = 70, 170, 40, 60


def parse(path):
    """(ranks, op, ring rows, wire rows) of one run; rows are (bytes, busbw GB/s)."""
    ranks, op, ring, wire, section = None, "all_sum", [], [], None
    for line in open(path, encoding="utf-8", errors="replace"):
        header = re.match(r"# nuvec-distributed \S+: (\S+) of \S+, (\d+) ranks", line)
        if header:
            op, ranks = header.group(1), int(header.group(2))
            continue
        if line.startswith("# wire"):
            section = "wire"
            continue
        if "elements" in line and "busbw" in line:
            section = "ring"
            continue
        if line.startswith("#"):
            section = None if line.startswith("# ping-pong") else section
            continue
        f = line.split()
        if not f or not f[0].isdigit():
            continue
        if section == "ring" and len(f) >= 8:
            ring.append((int(f[0]), float(f[7])))
        elif section == "wire" and len(f) >= 6:
            wire.append((int(f[0]), float(f[5])))
    if ranks is None:
        sys.exit(f"{path}: no header line naming the ranks")
    return ranks, op, ring, wire


def size_label(b):
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if b >= 1 << shift:
            return f"{b >> shift}{unit}"
    return str(b)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    runs = [parse(p) for p in sys.argv[1:]]
    points = [p for _, _, ring, wire in runs for p in ring + wire]
    if not points:
        sys.exit("no rows")
    xs = [math.log2(b) for b, _ in points]
    x0, x1 = min(xs), max(xs)
    y1 = max(v for _, v in points) * 1.1
    w, h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def X(b):
        return LEFT + (math.log2(b) - x0) / max(x1 - x0, 1) * w

    def Y(v):
        return TOP + h - v / y1 * h

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'font-family="sans-serif" font-size="12">',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        f'<text x="{LEFT}" y="22" font-size="14">{runs[0][1]} busbw (GB/s) by size: '
        "ring (solid) and the wire (dashed)</text>",
    ]
    step = 10 ** math.floor(math.log10(y1 / 5)) if y1 > 0 else 1
    for mult in (1, 2, 5, 10):
        if y1 / (step * mult) <= 8:
            step *= mult
            break
    v = 0.0
    while v <= y1:
        y = Y(v)
        out.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{LEFT + w}" y2="{y:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{LEFT - 8}" y="{y + 4:.1f}" text-anchor="end">{v:g}</text>')
        v += step
    for b in sorted({b for b, _ in points}):
        x = X(b)
        out.append(f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{TOP + h}" stroke="#eee"/>')
        out.append(
            f'<text x="{x:.1f}" y="{TOP + h + 18}" text-anchor="middle">{size_label(b)}</text>'
        )
    out.append(
        f'<text x="{LEFT + w / 2}" y="{HEIGHT - 15}" text-anchor="middle">bytes per rank</text>'
    )
    for i, (ranks, _, ring, wire) in enumerate(runs):
        colour = COLOURS[i % len(COLOURS)]
        for rows, dash, name in ((ring, "", "ring"), (wire, ' stroke-dasharray="6 4"', "wire")):
            if not rows:
                continue
            path = " ".join(f"{X(b):.1f},{Y(v):.1f}" for b, v in sorted(rows))
            out.append(
                f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>'
            )
            ly = TOP + 20 + (2 * i + (name == "wire")) * 20
            lx = LEFT + w + 15
            out.append(
                f'<line x1="{lx}" y1="{ly}" x2="{lx + 30}" y2="{ly}" stroke="{colour}" '
                f'stroke-width="2"{dash}/>'
            )
            out.append(f'<text x="{lx + 36}" y="{ly + 4}">{ranks} ranks, {name}</text>')
    out.append("</svg>")
    print("\n".join(out))


if __name__ == "__main__":
    main()
