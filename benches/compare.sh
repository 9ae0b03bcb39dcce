#!/usr/bin/env bash
# MLX's ring, nuvec-distributed 0.5.0 and this checkout, all_sum of float32 on 2 and 4 local
# ranks, every job started by the same launcher with MLX's launch environment (`--backend
# ring`: MLX_RANK, MLX_HOSTFILE), all timed the same way: warm-up, then iterations each after
# a barrier (a 1-byte all_sum), the time of an iteration being the mean over the ranks, p50
# over iterations.
#
#   bash benches/compare.sh                 # sizes 4K,1M,16M; ranks 2 and 4
#   SIZES=4K,64K,1M RANKS="2 3" REPS=3 bash benches/compare.sh
#   LAUNCHER=mlx bash benches/compare.sh    # every job under mlx.launch instead
#
# Launchers (LAUNCHER): `nuvec` (the default) is this workspace's `nuvec-launch` (launch/),
# which sets the same variables as `mlx.launch` and sleeps while the ranks run; `mlx` is MLX's
# `mlx.launch` from the venv. mlx.launch 0.32.4 keeps about 1.3 cores busy for as long as a
# job runs (each rank's output thread selects on the rank's standard input pipe, which is
# always writable, so its loop never waits), so on a 2-core machine every column under it
# measures how a library copes with a competing busy process more than the library itself.
#
# Columns:
#   mlx        MLX 0.32.4 (.venv), benches/mlx_allsum.py: mx.distributed.all_sum on arrays
#   0.5.0      nuvec-distributed 0.5.0 from crates.io, benches/upstream: nuvec_core's all_sum
#   arrays     this checkout through the same nuvec_core array API (benches/upstream --impl local)
#   raw        this checkout's RingCommunicator::try_all_reduce in place (benches/allreduce/)
#   wire       the same ring pattern over blocking std sockets, no reduction (benches/allreduce/)
# The array columns (mlx, 0.5.0, arrays) include making the output array; raw and wire do not.
# Ratios are times: "0.5.0/arrays" = how many times faster this checkout is than 0.5.0 through
# the same API (> 1: faster). With REPS > 1 every job runs REPS times and the best p50 is kept
# (the machine is shared: the best run is the least disturbed one).
#
# Needs the MLX venv (.ci/setup-venv makes .venv); without it the mlx column is skipped. The
# full output of every job goes to target/compare/.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
SIZES="${SIZES:-4K,1M,16M}"
RANKS="${RANKS:-2 4}"
REPS="${REPS:-1}"
LAUNCHER="${LAUNCHER:-nuvec}"
MLX_LAUNCH="$ROOT/.venv/bin/mlx.launch"
PYTHON="$ROOT/.venv/bin/python"
OUT="$ROOT/target/compare"
mkdir -p "$OUT"
rm -f "$OUT"/*.log

echo "== building (release)" >&2
BENCH="$(cargo bench --ignore-rust-version --bench allreduce --no-run --message-format=json 2>/dev/null \
  | python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "allreduce" and m.get("executable"):
        print(m["executable"])')"
[ -x "$BENCH" ] || { echo "could not build benches/allreduce/" >&2; exit 1; }
(cd benches/upstream && cargo build --release --ignore-rust-version --features local \
  --target-dir "$ROOT/target/upstream-bench" >&2)
UPSTREAM="$ROOT/target/upstream-bench/release/nuvec-upstream-bench"
cargo build --release --ignore-rust-version -p nuvec-launch >&2
case "$LAUNCHER" in
  nuvec) LAUNCH="$ROOT/target/release/nuvec-launch" ;;
  mlx) LAUNCH="$MLX_LAUNCH" ;;
  *) echo "LAUNCHER must be nuvec or mlx, not $LAUNCHER" >&2; exit 2 ;;
esac
HAVE_MLX=1
if [ ! -x "$MLX_LAUNCH" ]; then
  echo "no MLX venv at .venv (run .ci/setup-venv): the mlx column is skipped, and ranks are" >&2
  echo "started by the allreduce bench itself (nuvec-local) for the raw/wire columns only" >&2
  HAVE_MLX=0
fi
echo "== launcher: $LAUNCH" >&2

# launch NAME N CMD...: one job of N ranks under the launcher on fresh ports; rank 0's output
# goes to $OUT/NAME-N-REP.log and to stderr.
launch() {
  local name="$1" n="$2" rep="$3"
  shift 3
  local log="$OUT/$name-$n-$rep.log"
  local port=$((20000 + RANDOM % 30000))
  echo "== $name, $n ranks (run $rep): $*" >&2
  if ! timeout 900 "$LAUNCH" -n "$n" --backend ring -p "$port" -- "$@" >"$log" 2>&1 </dev/null; then
    echo "   failed (see $log)" >&2
  fi
  cat "$log" >&2
}

for n in $RANKS; do
  for rep in $(seq 1 "$REPS"); do
    if [ "$HAVE_MLX" = 1 ]; then
      launch mlx "$n" "$rep" "$PYTHON" "$ROOT/benches/mlx_allsum.py" --sizes "$SIZES"
      launch upstream "$n" "$rep" "$UPSTREAM" --impl upstream --sizes "$SIZES"
      launch arrays "$n" "$rep" "$UPSTREAM" --impl local --sizes "$SIZES"
      launch raw "$n" "$rep" "$BENCH" --sizes "$SIZES" --pingpong 4K
    else
      echo "== raw, $n ranks (run $rep)" >&2
      "$BENCH" --ranks "$n" --sizes "$SIZES" --pingpong 4K >"$OUT/raw-$n-$rep.log" 2>&1 || true
      cat "$OUT/raw-$n-$rep.log" >&2
    fi
  done
done

python3 - "$OUT" "$RANKS" "$SIZES" <<'PY'
import glob, os, re, sys

out, ranks, sizes = sys.argv[1], sys.argv[2].split(), sys.argv[3]

def parse_bytes(s):
    shift = {"K": 10, "M": 20, "G": 30}.get(s[-1:].upper(), 0)
    return int(s[:-1] if shift else s) << shift

best = {}  # (column, ranks, bytes) -> (p50 µs, check)

def keep(col, n, b, p50, check):
    key = (col, n, b)
    if key not in best or p50 < best[key][0]:
        best[key] = (p50, check)

pingpong = {}
for path in sorted(glob.glob(os.path.join(out, "*.log"))):
    name, n, _ = os.path.basename(path)[:-4].rsplit("-", 2)
    n = int(n)
    section = None
    for line in open(path, errors="replace"):
        line = re.sub(r"^\[rank \d+\] ", "", line)  # nuvec-launch's prefix
        f = line.split()
        if f[:1] == ["ROW"] and len(f) == 7:
            col = {"mlx": "mlx", "upstream": "0.5.0", "local": "arrays"}[f[1]]
            keep(col, n, int(f[3]), float(f[4]), f[6])
        elif name == "raw":
            if line.startswith("# wire"):
                section = "wire"
            elif "elements" in line and "p50" in line:
                section = "raw"
            elif line.startswith("# ping-pong"):
                m = re.search(r"wire ([\d.]+) / [\d.]+, ring try_send\+try_recv ([\d.]+)", line)
                if m:
                    w, r = float(m.group(1)), float(m.group(2))
                    old = pingpong.get(n)
                    pingpong[n] = (min(w, old[0]), min(r, old[1])) if old else (w, r)
            elif section == "raw" and len(f) >= 10 and f[0].isdigit():
                keep("raw", n, int(f[0]), float(f[3]), f[8])
            elif section == "wire" and len(f) >= 5 and f[0].isdigit():
                keep("wire", n, int(f[0]), float(f[1]), "-")

cols = ["mlx", "0.5.0", "arrays", "raw", "wire"]

def cell(col, n, b):
    v = best.get((col, n, b))
    if v is None:
        return "-"
    return f"{v[0]:.1f}" + ("" if v[1] in ("ok", "-") else " " + v[1])

def ratio(a, b, n, size):
    x, y = best.get((a, n, size)), best.get((b, n, size))
    return f"{x[0] / y[0]:.2f}" if x and y and y[0] > 0 else "-"

def busbw(col, n, b):
    v = best.get((col, n, b))
    return b / (v[0] * 1e-6) / 1e9 * 2 * (n - 1) / n if v else None

print()
print("all_sum float32, p50 µs per operation (mean over ranks per iteration; best of the runs)")
head = f"{'ranks':>5} {'bytes':>10} " + " ".join(f"{c:>10}" for c in cols)
head += f" {'0.5.0/arrays':>13} {'0.5.0/raw':>10} {'mlx/arrays':>11} {'mlx/raw':>8} {'raw %wire':>10}"
print(head)
for n in map(int, ranks):
    for s in sizes.split(","):
        b = parse_bytes(s)
        b = b // 4 * 4
        row = f"{n:>5} {b:>10} " + " ".join(f"{cell(c, n, b):>10}" for c in cols)
        rb, wb = busbw("raw", n, b), busbw("wire", n, b)
        pct = f"{100 * rb / wb:.0f}%" if rb and wb else "-"
        row += f" {ratio('0.5.0', 'arrays', n, b):>13} {ratio('0.5.0', 'raw', n, b):>10}"
        row += f" {ratio('mlx', 'arrays', n, b):>11} {ratio('mlx', 'raw', n, b):>8} {pct:>10}"
        print(row)
for n, (w, r) in sorted(pingpong.items()):
    raw4k = best.get(("raw", n, 4096))
    extra = f"; raw all_sum 4 KiB = {raw4k[0] / w:.2f} × the wire round trip" if raw4k else ""
    print(f"{n} ranks: 4 KiB ping-pong round trip p50: wire {w:.1f} µs, ring send/recv {r:.1f} µs{extra}")
PY
