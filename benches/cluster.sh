#!/usr/bin/env bash
# The ring against the link: on a cluster of hosts on this machine (tests/cluster/mod.rs:
# network namespaces on a bridge, every NIC shaped to RATE in both directions, an sshd per
# host), the link's rate measured with one TCP stream between two hosts (iperf3), then busbw of
# float32 all_sum for 2 and 4 hosts, one rank per host, every job started by nuvec-launch
# --hosts over ssh from host 0 with MLX's launch environment, MLX 0.32.4's ring, nuvec-distributed
# 0.5.0 and this checkout side by side in the same run (benches/compare.sh's programs and
# timing: p50 over iterations after a barrier, the best p50 of REPS runs).
#
#   sudo bash benches/cluster.sh                              # 4K..64M, 2 and 4 hosts, 1gbit
#   RATE=4gbit RANKS=2 REPS=3 SIZES=1M,16M sudo bash benches/cluster.sh
#   RATE=none CROSSOVER=65536 SIZES=4K,8K,16K,32K,64K sudo -E bash benches/cluster.sh
#   IMPLS="arrays arraysmlx" RANKS=4 SIZES=4K sudo bash benches/cluster.sh   # two columns only
#   LAUNCHER=mlx sudo bash benches/cluster.sh    # every job started by mlx.launch --hosts
#
# RATE=none leaves the NICs unshaped (the CPU is the limit). CROSSOVER=BYTES builds this
# checkout with the nuvec wire's relay taking all-reduces and all-gathers up to BYTES per rank
# (src/ring/relay.rs), which is how the crossover curve is measured.
#
# Needs root, iproute2, openssh-server, iperf3 and the MLX venv (.ci/setup-venv; without it
# the mlx column is skipped). Not run in CI. Columns:
#   mlx      MLX 0.32.4 (.venv), benches/mlx_allsum.py
#   0.5.0    nuvec-distributed 0.5.0, benches/upstream --impl upstream
#   arrays   this checkout through the same nuvec_core API, benches/upstream --impl local
#            (on the nuvec wire, every rank being this checkout)
#   arraysmlx  the same on MLX's wire (nuvec-launch --wire mlx)
#   arrayspark the same with every wait parked at once (NUVEC_DISTRIBUTED_SPIN_US=0; only
#            when IMPLS names it): the waiting policy against the default's looks
#   arrayskeep, upstreamkeep  arrays and 0.5.0 with glibc told to keep freed memory
#            (KEEP_MEMORY below; only when IMPLS names them): without it every allocation
#            above 32 MiB is mapped anew, so the array call's copy faults in fresh pages
#   arrayscubic, arraysmlxcubic  arrays on each wire with this checkout's ring connections on
#            CUBIC (NUVEC_DISTRIBUTED_TCP_CONGESTION=cubic; only when IMPLS names them): Linux's
#            and macOS's default, where the hosts here may run another (the table's first line
#            says which; README, "TCP congestion control")
#   arraysreno  arrays with the ring connections on Reno (only when IMPLS names it): the one
#            every Linux process may choose
#   raw      this checkout's RingCommunicator::try_all_reduce (benches/allreduce/)
# busbw = bytes * 2 (n - 1) / n / p50, shown in Gbit/s and as a percentage of the link's
# measured TCP goodput, then each column's CPU µs per operation and rank (of its best run).
# A last table gives the array call's own copy of the input (benches/upstream's COPY lines,
# every rank at once) and the most of the link an array all_sum can reach after it.
# The programs' lines are read by field name; a line in another format stops the script. Output of every job in target/cluster-bench/; the table also goes to
# target/cluster-bench/table.md and a plot to target/cluster-bench/busbw.svg.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
SIZES="${SIZES:-4K,64K,1M,16M,64M}"
RANKS="${RANKS:-2 4}"
REPS="${REPS:-2}"
RATE="${RATE:-1gbit}"
LAUNCHER="${LAUNCHER:-nuvec}"
PYTHON="$ROOT/.venv/bin/python"
OUT="$ROOT/target/cluster-bench"
mkdir -p "$OUT"
rm -f "$OUT"/*.log "$OUT"/*.log.failed
command -v iperf3 >/dev/null || { echo "needs iperf3 (apt-get install iperf3)" >&2; exit 2; }

if [ -n "${CROSSOVER:-}" ]; then
  export NUVEC_DISTRIBUTED_RELAY_CROSSOVER="$CROSSOVER"
  echo "== the relay takes up to $CROSSOVER bytes per rank in this run" >&2
fi
echo "== building (release)" >&2
artifact() { # artifact NAME: the executable of cargo's JSON messages on stdin named NAME
  python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == sys.argv[1] and m.get("executable"):
        print(m["executable"])' "$1"
}
BENCH="$(cargo bench --ignore-rust-version --bench allreduce --no-run --message-format=json 2>"$OUT/build.log" | artifact allreduce)" || BENCH=""
HARNESS="$(cargo test --ignore-rust-version --test cluster --no-run --message-format=json 2>>"$OUT/build.log" | artifact cluster)" || HARNESS=""
[ -x "$BENCH" ] && [ -x "$HARNESS" ] || { tail -30 "$OUT/build.log" >&2; echo "could not build the bench or the cluster harness (cargo's messages: $OUT/build.log)" >&2; exit 1; }
(cd benches/upstream && cargo build --release --ignore-rust-version --features local \
  --target-dir "$ROOT/target/upstream-bench" >&2)
UPSTREAM="$ROOT/target/upstream-bench/release/nuvec-upstream-bench"
cargo build --release --ignore-rust-version -p nuvec-launch >&2
LAUNCH="$ROOT/target/release/nuvec-launch"
HAVE_MLX=1
[ -x "$PYTHON" ] || { echo "no MLX venv (.ci/setup-venv): the mlx column is skipped" >&2; HAVE_MLX=0; }
if [ "$LAUNCHER" = mlx ] && [ "$HAVE_MLX" = 0 ]; then
  echo "LAUNCHER=mlx needs the MLX venv (.ci/setup-venv)" >&2
  exit 2
fi

# The cluster: held by the harness while the hold file exists (removed on exit, however the
# script ends; the harness then removes namespaces, bridge and sshds).
MAXN=0
for n in $RANKS; do (( n > MAXN )) && MAXN=$n; done
(( MAXN >= 2 )) || MAXN=2
HOLD="$OUT/hold"
rm -f "$HOLD"
touch "$HOLD"
NUVEC_CLUSTER_HOLD="$HOLD" NUVEC_CLUSTER_HOSTS="$MAXN" NUVEC_CLUSTER_RATE="$RATE" \
  NUVEC_CLUSTER_HOLD_SECS=3600 "$HARNESS" a_cluster_is_held_while_the_hold_file_exists \
  --exact --ignored --nocapture >"$OUT/harness.log" 2>&1 &
HOLDER=$!
# A harness still making the cluster writes the hold file once the cluster is up, even after
# this script gave up on it: the file is removed again until the harness has gone (it looks
# every 100 ms, then tears the cluster down), for at most 10 minutes, after which it is
# stopped.
cleanup() {
  rm -f "$HOLD"
  for _ in $(seq 6000); do
    kill -0 "$HOLDER" 2>/dev/null || break
    rm -f "$HOLD"
    sleep 0.1
  done
  kill "$HOLDER" 2>/dev/null || true
  wait "$HOLDER" 2>/dev/null || true
}
trap cleanup EXIT
for _ in $(seq 300); do
  [ -s "$HOLD" ] && break
  kill -0 "$HOLDER" 2>/dev/null || { cat "$OUT/harness.log" >&2; exit 1; }
  sleep 0.1
done
[ -s "$HOLD" ] || { echo "the cluster did not come up within 30 s (see $OUT/harness.log)" >&2; exit 1; }
CDIR="$(cat "$HOLD")"
ON="$CDIR/bin/on"
export PATH="$CDIR/bin:$PATH"
addr() { echo "198.18.0.$(( $1 + 1 ))"; }
echo "== cluster of $MAXN hosts at $RATE in $CDIR" >&2
# TCP's congestion control in the hosts (the kernel's default: CUBIC unless the machine says
# otherwise): it changes how the wires compare (README, "The nuvec wire").
CC="$("$ON" 0 sysctl -n net.ipv4.tcp_congestion_control 2>/dev/null || true)"
CC="${CC:-unknown}"

echo "== the link: one TCP stream from host 0 to host 1 (iperf3, 5 s)" >&2
"$ON" 1 iperf3 -s -B "$(addr 1)" -1 >"$OUT/iperf3-server.log" 2>&1 &
SERVER=$!
LINK=""
for _ in $(seq 50); do
  "$ON" 0 iperf3 -c "$(addr 1)" -t 5 -J >"$OUT/iperf3.json" 2>/dev/null || true
  LINK="$(python3 -c 'import json,sys
r = json.load(open(sys.argv[1]))
print("" if "error" in r else r["end"]["sum_received"]["bits_per_second"])' "$OUT/iperf3.json" || true)"
  [ -n "$LINK" ] && break
  sleep 0.1 # the server is not listening yet
done
# The server (-1) ends after one client: where none got through, it is stopped instead.
[ -n "$LINK" ] || kill "$SERVER" 2>/dev/null || true
wait "$SERVER" 2>/dev/null || true
[ -n "$LINK" ] || { echo "iperf3 failed (see $OUT/iperf3.json and $OUT/iperf3-server.log)" >&2; exit 1; }
echo "   link: $(python3 -c "print(f'{$LINK / 1e9:.3f}')") Gbit/s" >&2

# launch NAME N REP CMD...: a job of N hosts under nuvec-launch --hosts (or mlx.launch --hosts
# with LAUNCHER=mlx), started on host 0 (on the wire WIRE when set).
launch() {
  local name="$1" n="$2" rep="$3"
  shift 3
  local hosts="" i
  for (( i = 0; i < n; i++ )); do hosts+="${hosts:+,}$(addr "$i")"; done
  local log="$OUT/$name-$n-$rep.log"
  local cmd
  if [ "$LAUNCHER" = mlx ]; then
    # mlx.launch has no --wire: the variable asks the ranks for it.
    cmd=("$ROOT/.venv/bin/mlx.launch" --hosts "$hosts" --backend ring)
    [ -n "${WIRE:-}" ] && cmd+=(--env "NUVEC_DISTRIBUTED_WIRE=$WIRE")
  else
    cmd=("$LAUNCH" --hosts "$hosts" --backend ring -p 5000)
    [ -n "${WIRE:-}" ] && cmd+=(--wire "$WIRE")
  fi
  local e
  for e in ${JOB_ENV:-}; do cmd+=(--env "$e"); done
  echo "== $name, $n hosts (run $rep, $LAUNCHER launcher)" >&2
  local ok=1
  timeout 900 "$ON" 0 "${cmd[@]}" -- "$@" >"$log" 2>&1 </dev/null || ok=0
  grep -E "ROW|COPY|^\[rank 0\] +[0-9]" "$log" >&2 || true
  if [ "$ok" = 0 ]; then
    # Left out of the tables (its rows may be of a job cut short), and listed under them.
    mv "$log" "$log.failed"
    echo "   failed (see $log.failed; left out of the table)" >&2
  fi
}

# wanted COLUMN: whether COLUMN is one of IMPLS (default: every column).
IMPLS="${IMPLS:-mlx 0.5.0 arrays arraysmlx raw}"
# glibc's malloc without mmap (every block from the heap) and without giving the heap's top
# back: freed arrays are reused rather than unmapped and faulted in again (README, "Large
# arrays on Linux").
KEEP_MEMORY="GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=4294967296"
wanted() { [[ " $IMPLS " == *" $1 "* ]]; }

for n in $RANKS; do
  for rep in $(seq 1 "$REPS"); do
    if [ "$HAVE_MLX" = 1 ] && wanted mlx; then
      launch mlx "$n" "$rep" "$PYTHON" "$ROOT/benches/mlx_allsum.py" --sizes "$SIZES"
    fi
    wanted 0.5.0 && launch upstream "$n" "$rep" "$UPSTREAM" --impl upstream --sizes "$SIZES"
    wanted arrays && launch arrays "$n" "$rep" "$UPSTREAM" --impl local --sizes "$SIZES"
    wanted arraysmlx && WIRE=mlx launch arraysmlx "$n" "$rep" "$UPSTREAM" --impl local --sizes "$SIZES"
    wanted arrayspark && JOB_ENV=NUVEC_DISTRIBUTED_SPIN_US=0 launch arrayspark "$n" "$rep" "$UPSTREAM" --impl local --sizes "$SIZES"
    wanted upstreamkeep && JOB_ENV="$KEEP_MEMORY" launch upstreamkeep "$n" "$rep" "$UPSTREAM" --impl upstream --sizes "$SIZES"
    wanted arrayskeep && JOB_ENV="$KEEP_MEMORY" launch arrayskeep "$n" "$rep" "$UPSTREAM" --impl local --sizes "$SIZES"
    wanted arrayscubic && JOB_ENV=NUVEC_DISTRIBUTED_TCP_CONGESTION=cubic launch arrayscubic "$n" "$rep" "$UPSTREAM" --impl local --sizes "$SIZES"
    wanted arraysreno && JOB_ENV=NUVEC_DISTRIBUTED_TCP_CONGESTION=reno launch arraysreno "$n" "$rep" "$UPSTREAM" --impl local --sizes "$SIZES"
    wanted arraysmlxcubic && WIRE=mlx JOB_ENV=NUVEC_DISTRIBUTED_TCP_CONGESTION=cubic launch arraysmlxcubic "$n" "$rep" "$UPSTREAM" --impl local --sizes "$SIZES"
    wanted raw && launch raw "$n" "$rep" "$BENCH" --sizes "$SIZES" --no-wire
  done
done

python3 - "$OUT" "$RANKS" "$SIZES" "$LINK" "$RATE" "$LAUNCHER" "$CC" <<'PY'
import glob, math, os, re, sys

out, ranks, sizes, link, rate = sys.argv[1], sys.argv[2].split(), sys.argv[3], float(sys.argv[4]), sys.argv[5]
launcher = {"mlx": "mlx.launch", "nuvec": "nuvec-launch"}.get(sys.argv[6], sys.argv[6])
congestion = sys.argv[7]

def parse_bytes(s):
    shift = {"K": 10, "M": 20, "G": 30}.get(s[-1:].upper(), 0)
    return int(s[:-1] if shift else s) << shift

best = {}  # (column, ranks, bytes) -> (p50 µs, check, cpu µs per rank)
copies = {}  # (column, ranks, bytes) -> the least p50 µs of the array call's copy (COPY lines)

def keep(col, n, b, p50, check, cpu):
    key = (col, n, b)
    if key not in best or p50 < best[key][0]:
        best[key] = (p50, check, cpu)

def number(s):
    try:
        return float(s)
    except ValueError:  # "-": not measured
        return math.nan

def fail(path, lineno, line, why):
    sys.exit(f"cluster.sh: {path}:{lineno}: {why}: {line.strip()!r}")

# The ROW lines of benches/mlx_allsum.py and benches/upstream, by name (their documented order),
# and benches/upstream's COPY lines.
ROW = ["ROW", "impl", "ranks", "bytes", "p50", "p99", "check", "cpu"]
COPY = ["COPY", "impl", "ranks", "bytes", "p50"]

# The columns of the jobs named apart from their program, by job name, in the tables' order;
# every other job's column is its program's (the ROW line's impl).
NAMED = {
    "arraysmlx": "arrays, MLX's wire",
    "arrayspark": "arrays, parked",
    "upstreamkeep": "0.5.0, memory kept",
    "arrayskeep": "arrays, memory kept",
    "arrayscubic": "arrays, CUBIC",
    "arraysmlxcubic": "arrays, MLX's wire, CUBIC",
    "arraysreno": "arrays, Reno",
}

def column(name, impl):
    return NAMED.get(name) or {"mlx": "mlx", "upstream": "0.5.0", "local": "arrays"}[impl]
# The words of benches/allreduce's table header that are units, not column names.
UNITS = {"µs", "µs/rank", "GB/s"}

for path in sorted(glob.glob(os.path.join(out, "*-*-*.log"))):
    name, n, _ = os.path.basename(path)[:-4].rsplit("-", 2)
    n = int(n)
    section, columns = None, None
    for lineno, line in enumerate(open(path, errors="replace"), 1):
        line = re.sub(r"^\[rank \d+\] ", "", line)
        f = line.split()
        if f[:1] == ["ROW"]:
            # A field count other than the documented one means the format moved on: stop
            # rather than show a table of "-".
            if len(f) != len(ROW):
                fail(path, lineno, line, f"a ROW line of {len(f)} fields, not {len(ROW)} ({' '.join(ROW)})")
            row = dict(zip(ROW, f))
            col = column(name, row["impl"])
            keep(col, n, int(row["bytes"]), float(row["p50"]), row["check"], number(row["cpu"]))
        elif f[:1] == ["COPY"]:
            if len(f) != len(COPY):
                fail(path, lineno, line, f"a COPY line of {len(f)} fields, not {len(COPY)} ({' '.join(COPY)})")
            row = dict(zip(COPY, f))
            key = (column(name, row["impl"]), n, int(row["bytes"]))
            copies[key] = min(copies.get(key, math.inf), float(row["p50"]))
        elif name == "raw":
            if "elements" in line and "p50" in line:
                # The header names the columns: rows are read by name.
                section = "raw"
                columns = [w for w in f if w not in UNITS]
                missing = {"bytes", "p50", "cpu", "check"} - set(columns)
                if missing:
                    fail(path, lineno, line, f"a table header without {sorted(missing)}")
            elif line.startswith("#"):
                section = None if line.startswith("# wire") else section
            elif section == "raw" and f[:1] and f[0].isdigit():
                if len(f) < len(columns) - 2:  # the last two (vs the wire) are optional
                    fail(path, lineno, line, f"a row of {len(f)} fields under a header of {len(columns)}")
                row = dict(zip(columns, f))
                keep("raw", n, int(row["bytes"]), float(row["p50"]), row["check"], number(row["cpu"]))

cols = ["mlx", "0.5.0", "arrays", "arrays, MLX's wire", "raw"]
# The optional columns, shown only when a job ran them, before raw.
for extra in [c for c in NAMED.values() if c not in cols]:
    if any(k[0] == extra for k in best):
        cols.insert(len(cols) - 1, extra)

def busbw(col, n, b):
    v = best.get((col, n, b))
    return b / (v[0] * 1e-6) * 8 * 2 * (n - 1) / n if v else None

def label(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"

lines = [
    f"Link: one TCP stream between two hosts (iperf3) {link / 1e9:.3f} Gbit/s (NICs shaped to {rate}, TCP congestion control {congestion}); jobs started by {launcher}.",
    "busbw of float32 all_sum in Gbit/s and as % of that link (best p50 of the runs), then the",
    "CPU µs per operation and rank of that run:",
    "",
    "| hosts | size | " + " | ".join(cols) + " | " + " | ".join(f"cpu {c}" for c in cols) + " |",
    "|---|---|" + "---|" * (2 * len(cols)),
]
series = {}
for n in map(int, ranks):
    for s in sizes.split(","):
        b = parse_bytes(s) // 4 * 4
        cells = []
        for c in cols:
            bw = busbw(c, n, b)
            check = best.get((c, n, b), (0, "-"))[1]
            if bw is None:
                cells.append("-")
            else:
                series.setdefault((c, n), []).append((b, bw))
                bad = "" if check in ("ok", "-") else f" {check}"
                cells.append(f"{bw / 1e9:.3f} ({100 * bw / link:.0f} %){bad}")
        cpus = []
        for c in cols:
            v = best.get((c, n, b))
            cpus.append("-" if v is None or math.isnan(v[2]) else f"{v[2]:.1f}")
        lines.append(f"| {n} | {label(b)} | " + " | ".join(cells + cpus) + " |")
# The same runs as p50 latency, with the nuvec wire's time as a fraction of MLX's wire's.
lines += [
    "",
    "p50 µs per all_sum (best of the runs); the last column is arrays ÷ arrays on MLX's wire"
    + (" (and the same on CUBIC):" if "arrays, CUBIC" in cols else ":"),
    "",
    "| hosts | size | " + " | ".join(cols) + " | nuvec wire ÷ MLX's wire |",
    "|---|---|" + "---|" * (len(cols) + 1),
]

def wire_ratio(n, b, suffix):
    native = best.get(("arrays" + suffix, n, b))
    mlxwire = best.get(("arrays, MLX's wire" + suffix, n, b))
    return f"{native[0] / mlxwire[0]:.2f}" if native and mlxwire else "-"

for n in map(int, ranks):
    for s in sizes.split(","):
        b = parse_bytes(s) // 4 * 4
        cells = [f"{best[(c, n, b)][0]:.1f}" if (c, n, b) in best else "-" for c in cols]
        ratio = wire_ratio(n, b, "")
        if "arrays, CUBIC" in cols:
            ratio += f" ({wire_ratio(n, b, ', CUBIC')})"
        lines.append(f"| {n} | {label(b)} | " + " | ".join(cells) + f" | {ratio} |")
# The array call's copy and the bound it sets: an array all_sum cannot start its bytes before
# nuvec-core has copied the input, so at most link time / (link time + copy) of the link. The
# bound is of glibc's defaults; the memory-kept columns (their allocator reuses the block) get
# their own.
copy_cols = [c for c in cols if any(k[0] == c for k in copies)]
KEPT = "memory kept"
kept_cols = [c for c in copy_cols if KEPT in c]
if copy_cols:
    lines += [
        "",
        "The array call's copy (the input into a new allocation, every rank at once; p50 µs, least",
        "of the runs) and the most of the link an array all_sum can reach after it, link time ÷",
        "(link time + copy), the link time being bytes × 2(n − 1)/n at the link above:",
        "",
        "| hosts | size | " + " | ".join(f"copy, {c}" for c in copy_cols) + " | link time | at most |"
        + (" at most, memory kept |" if kept_cols else ""),
        "|---|---|" + "---|" * (len(copy_cols) + 2 + (1 if kept_cols else 0)),
    ]
    for n in map(int, ranks):
        for s in sizes.split(","):
            b = parse_bytes(s) // 4 * 4
            got = [copies.get((c, n, b)) for c in copy_cols]
            have = [v for v in got if v is not None]
            if not have:
                continue
            wire = b * 8 * 2 * (n - 1) / n / link * 1e6
            cells = ["-" if v is None else f"{v:.1f}" for v in got]

            def bound(kept):
                vs = [v for c, v in zip(copy_cols, got) if v is not None and (KEPT in c) == kept]
                return f"{100 * wire / (wire + min(vs)):.0f} %" if vs else "-"

            row = f"| {n} | {label(b)} | " + " | ".join(cells) + f" | {wire:.1f} | {bound(False)} |"
            lines.append(row + (f" {bound(True)} |" if kept_cols else ""))
failed = sorted(os.path.basename(p)[:-len(".log.failed")] for p in glob.glob(os.path.join(out, "*.log.failed")))
if failed:
    lines += ["", "Jobs that failed, left out of the table: " + ", ".join(failed) + "."]
text = "\n".join(lines)
print()
print(text)
open(os.path.join(out, "table.md"), "w").write(text + "\n")

# The plot: busbw against size, one line per column and host count (solid 4 hosts, dashed 2),
# the link as a grey line.
import math
W, H, L, R, T, B = 720, 420, 70, 170, 40, 60
xs = [b for (_, _), pts in series.items() for b, _ in pts]
if xs:
    x0, x1 = math.log2(min(xs)), math.log2(max(xs))
    ymax = max(link, max(bw for pts in series.values() for _, bw in pts)) * 1.1
    px = lambda b: L + (math.log2(b) - x0) / max(x1 - x0, 1) * (W - L - R)
    py = lambda v: T + (1 - v / ymax) * (H - T - B)
    colour = {"mlx": "#d62728", "0.5.0": "#9467bd", "arrays": "#1f77b4", "arrays, MLX's wire": "#ff7f0e", "arrays, parked": "#17becf", "0.5.0, memory kept": "#c5b0d5", "arrays, memory kept": "#aec7e8", "arrays, CUBIC": "#8c564b", "arrays, MLX's wire, CUBIC": "#e377c2", "arrays, Reno": "#bcbd22", "raw": "#2ca02c"}
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{L}" y="20" font-size="14">all_sum float32 busbw on a cluster of namespaces, NICs at {rate}</text>']
    for i in range(6):
        v = ymax * i / 5
        svg.append(f'<line x1="{L}" y1="{py(v):.1f}" x2="{W - R}" y2="{py(v):.1f}" stroke="#eee"/>')
        svg.append(f'<text x="{L - 8}" y="{py(v) + 4:.1f}" text-anchor="end">{v / 1e9:.2f}</text>')
    for b in sorted(set(xs)):
        svg.append(f'<text x="{px(b):.1f}" y="{H - B + 18}" text-anchor="middle">{label(b)}</text>')
    svg.append(f'<text x="20" y="{T + (H - T - B) / 2}" transform="rotate(-90 20 {T + (H - T - B) / 2})" text-anchor="middle">busbw, Gbit/s</text>')
    svg.append(f'<line x1="{L}" y1="{py(link):.1f}" x2="{W - R}" y2="{py(link):.1f}" stroke="#888" stroke-dasharray="2,3"/>')
    svg.append(f'<text x="{W - R + 6}" y="{py(link) + 4:.1f}" fill="#888">link (iperf3)</text>')
    k = 0
    for (c, n), pts in sorted(series.items(), key=lambda kv: (-kv[0][1], cols.index(kv[0][0]))):
        pts.sort()
        d = " ".join(f"{px(b):.1f},{py(v):.1f}" for b, v in pts)
        dash = "" if n == max(map(int, ranks)) else ' stroke-dasharray="6,4"'
        svg.append(f'<polyline fill="none" stroke="{colour[c]}" stroke-width="2"{dash} points="{d}"/>')
        y = T + 10 + 16 * k
        svg.append(f'<line x1="{W - R + 6}" y1="{y}" x2="{W - R + 30}" y2="{y}" stroke="{colour[c]}" stroke-width="2"{dash}/>')
        svg.append(f'<text x="{W - R + 34}" y="{y + 4}">{c}, {n} hosts</text>')
        k += 1
    svg.append("</svg>")
    open(os.path.join(out, "busbw.svg"), "w").write("\n".join(svg) + "\n")
PY
