#!/usr/bin/env bash
# MLX's ring, nuvec-distributed 0.5.0 and this checkout, all_sum of float32 on 2 and 4 local
# ranks, every job started with MLX's launch environment (`--backend ring`: MLX_RANK,
# MLX_HOSTFILE) under each launcher in turn, all timed the same way: warm-up, then iterations
# each after a barrier (an all_sum of one byte per rank, so that every rank sends and waits in
# every step under every implementation), the time of an iteration being the mean over the
# ranks, p50 over iterations; and the CPU time an operation took on a rank (all its threads),
# the mean over ranks and iterations.
#
#   bash benches/compare.sh                 # sizes 4K,1M,16M; ranks 2 and 4; both launchers; 3 rounds
#   SIZES=4K,64K,1M RANKS="2 3" REPS=1 bash benches/compare.sh
#   LAUNCHERS=mlx bash benches/compare.sh   # only under mlx.launch
#   WAITS= bash benches/compare.sh          # without the fixed-spin columns
#   HOGS=2 bash benches/compare.sh          # with 2 busy loops running all along
#
# Launchers (LAUNCHERS, both by default, one table each): `nuvec` is this workspace's
# `nuvec-launch` (launch/), which sets the same variables as `mlx.launch` and sleeps while the
# ranks run; `mlx` is MLX's `mlx.launch` from the venv. mlx.launch 0.32.4 keeps about 1.3
# cores busy for as long as a job runs (each rank's output thread selects on the rank's
# standard input pipe, which is always writable, so its loop never waits), so on a 2-core
# machine its table measures how a library copes with a competing busy process: what a
# machine running a training job looks like (data loading, the GPU driver, other ranks).
#
# Columns (times, then CPU per operation and rank, µs):
#   mlx        MLX 0.32.4 (.venv), benches/mlx_allsum.py: mx.distributed.all_sum on arrays
#   0.5.0      nuvec-distributed 0.5.0 from crates.io, benches/upstream: nuvec_core's all_sum
#   arrays     this checkout through the same nuvec_core array API (benches/upstream --impl local);
#              its ranks, all on this machine, talk over local links (shared memory)
#   tcp links  arrays with NUVEC_DISTRIBUTED_LOCAL_LINKS=0: every link loopback TCP, as a link to
#              a Python MLX rank or to another machine is
#   raw        this checkout's RingCommunicator::try_all_reduce in place (benches/allreduce/), over
#              local links
#   wire       the same ring pattern over blocking std sockets, no reduction (benches/allreduce/):
#              the limit of loopback TCP, which local links are not bound by
#   spin N     arrays, but with NUVEC_DISTRIBUTED_SPIN_US=N: a step that cannot progress looks
#              for exactly N µs every time before it parks (0: parks at once), where `arrays`
#              adapts (src/transport/wait.rs); one column per N of WAITS (default "100 0": the
#              former default and parking at once), the candidates side by side
# The array columns (mlx, 0.5.0, arrays) include making the output array; raw and wire do not.
# Ratios are times: "0.5.0/arrays" = how many times faster this checkout is than 0.5.0 through
# the same API (> 1: faster). Every job runs REPS times (rounds interleaved, so a disturbance
# hits every column alike) and the best p50 is kept, with the CPU time of that run.
#
# HOGS (default 0) starts that many busy loops (`python3 -c 'while True: pass'`) for the whole
# run: a machine busy with other work, as a training job's machine is (data loading, the GPU
# driver), for every column alike.
#
# Needs the MLX venv (.ci/setup-venv makes .venv); without it the mlx column and the mlx.launch
# table are skipped. The full output of every job goes to target/compare/.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
SIZES="${SIZES:-4K,1M,16M}"
RANKS="${RANKS:-2 4}"
REPS="${REPS:-3}"
WAITS="${WAITS-100 0}"
HOGS="${HOGS:-0}"
LAUNCHERS="${LAUNCHERS:-${LAUNCHER:-nuvec mlx}}"
MLX_LAUNCH="$ROOT/.venv/bin/mlx.launch"
PYTHON="$ROOT/.venv/bin/python"
OUT="$ROOT/target/compare"
mkdir -p "$OUT"
rm -f "$OUT"/*.log

echo "== building (release)" >&2
BENCH="$(cargo bench --ignore-rust-version --bench allreduce --no-run --message-format=json 2>"$OUT/build.log" \
  | python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "allreduce" and m.get("executable"):
        print(m["executable"])')" || BENCH=""
[ -x "$BENCH" ] || { tail -30 "$OUT/build.log" >&2; echo "could not build benches/allreduce/ (cargo's messages: $OUT/build.log)" >&2; exit 1; }
(cd benches/upstream && cargo build --release --ignore-rust-version --features local \
  --target-dir "$ROOT/target/upstream-bench" >&2)
UPSTREAM="$ROOT/target/upstream-bench/release/nuvec-upstream-bench"
cargo build --release --ignore-rust-version -p nuvec-launch >&2
for l in $LAUNCHERS; do
  case "$l" in
    nuvec | mlx) ;;
    *) echo "LAUNCHERS takes nuvec and mlx, not $l" >&2; exit 2 ;;
  esac
done
HAVE_MLX=1
if [ ! -x "$MLX_LAUNCH" ]; then
  echo "no MLX venv at .venv (run .ci/setup-venv): the mlx column and mlx.launch are skipped," >&2
  echo "and ranks are started by the allreduce bench itself (nuvec-local) for raw/wire only" >&2
  HAVE_MLX=0
fi

# launch LAUNCHER NAME N REP CMD...: one job of N ranks under the launcher on fresh ports; rank
# 0's output goes to $OUT/LAUNCHER-NAME-N-REP.log and to stderr.
launch() {
  local launcher="$1" name="$2" n="$3" rep="$4"
  shift 4
  local log="$OUT/$launcher-$name-$n-$rep.log" exe
  case "$launcher" in
    nuvec) exe="$ROOT/target/release/nuvec-launch" ;;
    mlx) exe="$MLX_LAUNCH" ;;
  esac
  local port=$((20000 + RANDOM % 30000))
  echo "== $launcher: $name, $n ranks (run $rep): $*" >&2
  if ! timeout 900 "$exe" -n "$n" --backend ring -p "$port" -- "$@" >"$log" 2>&1 </dev/null; then
    echo "   failed (see $log)" >&2
  fi
  cat "$log" >&2
}

hogs=()
stop_hogs() { ((${#hogs[@]})) && kill "${hogs[@]}" 2>/dev/null; true; }
trap stop_hogs EXIT
for ((h = 0; h < HOGS; h++)); do
  python3 -c 'while True: pass' &
  hogs+=($!)
done
((HOGS)) && echo "== $HOGS busy loop(s) running: ${hogs[*]}" >&2

for rep in $(seq 1 "$REPS"); do
  for launcher in $LAUNCHERS; do
    for n in $RANKS; do
      if [ "$HAVE_MLX" = 1 ]; then
        launch "$launcher" mlx "$n" "$rep" "$PYTHON" "$ROOT/benches/mlx_allsum.py" --sizes "$SIZES"
        launch "$launcher" upstream "$n" "$rep" "$UPSTREAM" --impl upstream --sizes "$SIZES"
        launch "$launcher" arrays "$n" "$rep" "$UPSTREAM" --impl local --sizes "$SIZES"
        NUVEC_DISTRIBUTED_LOCAL_LINKS=0 \
          launch "$launcher" tcplinks "$n" "$rep" "$UPSTREAM" --impl local --sizes "$SIZES"
        for w in $WAITS; do
          NUVEC_DISTRIBUTED_SPIN_US="$w" \
            launch "$launcher" "spin$w" "$n" "$rep" "$UPSTREAM" --impl local --sizes "$SIZES"
        done
        launch "$launcher" raw "$n" "$rep" "$BENCH" --sizes "$SIZES" --pingpong 4K
      elif [ "$launcher" = nuvec ]; then
        echo "== raw, $n ranks (run $rep)" >&2
        "$BENCH" --ranks "$n" --sizes "$SIZES" --pingpong 4K >"$OUT/nuvec-raw-$n-$rep.log" 2>&1 || true
        cat "$OUT/nuvec-raw-$n-$rep.log" >&2
      fi
    done
  done
done

python3 - "$OUT" "$RANKS" "$SIZES" "$LAUNCHERS" "$WAITS" <<'PY'
import glob, math, os, re, sys

out, ranks, sizes, launchers = sys.argv[1], sys.argv[2].split(), sys.argv[3], sys.argv[4].split()
waits = sys.argv[5].split()

def parse_bytes(s):
    shift = {"K": 10, "M": 20, "G": 30}.get(s[-1:].upper(), 0)
    return int(s[:-1] if shift else s) << shift

best = {}  # (launcher, column, ranks, bytes) -> (p50 µs, check, cpu µs)

def number(s):
    try:
        return float(s)
    except ValueError:
        return math.nan

def keep(launcher, col, n, b, p50, check, cpu):
    key = (launcher, col, n, b)
    if key not in best or p50 < best[key][0]:
        best[key] = (p50, check, cpu)

pingpong = {}
for path in sorted(glob.glob(os.path.join(out, "*.log"))):
    launcher, rest = os.path.basename(path)[:-4].split("-", 1)
    name, n, _ = rest.rsplit("-", 2)
    n = int(n)
    section = None
    for line in open(path, errors="replace"):
        line = re.sub(r"^\[rank \d+\] ", "", line)  # nuvec-launch's prefix
        f = line.split()
        if f[:1] == ["ROW"] and len(f) in (7, 8):
            col = {"mlx": "mlx", "upstream": "0.5.0", "local": "arrays"}[f[1]]
            if name.startswith("spin"):
                col = "spin " + name[4:]
            elif name == "tcplinks":
                col = "tcp links"
            keep(launcher, col, n, int(f[3]), float(f[4]), f[6], number(f[7]) if len(f) > 7 else math.nan)
        elif name == "raw":
            if line.startswith("# wire"):
                section = "wire"
            elif "elements" in line and "p50" in line:
                section = "raw"
            elif line.startswith("# ping-pong"):
                m = re.search(r"wire ([\d.]+) / [\d.]+, ring try_send\+try_recv ([\d.]+)", line)
                if m:
                    w, r = float(m.group(1)), float(m.group(2))
                    old = pingpong.get((launcher, n))
                    pingpong[(launcher, n)] = (min(w, old[0]), min(r, old[1])) if old else (w, r)
            elif section == "raw" and len(f) >= 10 and f[0].isdigit():
                keep(launcher, "raw", n, int(f[0]), float(f[3]), f[8], number(f[5]))
            elif section == "wire" and len(f) >= 5 and f[0].isdigit():
                keep(launcher, "wire", n, int(f[0]), float(f[1]), "-", number(f[3]))

cols = ["mlx", "0.5.0", "arrays", "tcp links"] + ["spin " + w for w in waits] + ["raw", "wire"]
names = {"nuvec": "nuvec-launch", "mlx": "mlx.launch"}

def cell(launcher, col, n, b):
    v = best.get((launcher, col, n, b))
    if v is None:
        return "-"
    return f"{v[0]:.1f}" + ("" if v[1] in ("ok", "-") else " " + v[1])

def cpu(launcher, col, n, b):
    v = best.get((launcher, col, n, b))
    return "-" if v is None or math.isnan(v[2]) else f"{v[2]:.1f}"

def ratio(launcher, a, b, n, size, at=0):
    x, y = best.get((launcher, a, n, size)), best.get((launcher, b, n, size))
    return f"{x[at] / y[at]:.2f}" if x and y and y[at] > 0 and not math.isnan(x[at] / y[at]) else "-"

def busbw(launcher, col, n, b):
    v = best.get((launcher, col, n, b))
    return b / (v[0] * 1e-6) / 1e9 * 2 * (n - 1) / n if v else None

def pct(launcher, n, b):
    rb, wb = busbw(launcher, "raw", n, b), busbw(launcher, "wire", n, b)
    return f"{100 * rb / wb:.0f}%" if rb and wb else "-"

def table(launcher, title, value, extras):
    """One table: a row per ranks and size, `value` in every column, then the `extras`
    (header, width, cell of (ranks, bytes))."""
    print(f"under {names[launcher]}: {title}")
    head = f"{'ranks':>5} {'bytes':>10} " + " ".join(f"{c:>10}" for c in cols)
    print(head + "".join(f" {h:>{w}}" for h, w, _ in extras))
    for n in map(int, ranks):
        for s in sizes.split(","):
            b = parse_bytes(s) // 4 * 4
            row = f"{n:>5} {b:>10} " + " ".join(f"{value(launcher, c, n, b):>10}" for c in cols)
            print(row + "".join(f" {f(n, b):>{w}}" for _, w, f in extras))

for launcher in launchers:
    if not any(k[0] == launcher for k in best):
        continue
    print()
    times = lambda a, b: lambda n, size: ratio(launcher, a, b, n, size)
    table(launcher, "all_sum float32, p50 µs per operation (mean over ranks per iteration; best of the runs)", cell, [
        ("0.5.0/arrays", 13, times("0.5.0", "arrays")),
        ("0.5.0/tcp", 10, times("0.5.0", "tcp links")),
        ("0.5.0/raw", 10, times("0.5.0", "raw")),
        ("mlx/arrays", 11, times("mlx", "arrays")),
        ("mlx/raw", 8, times("mlx", "raw")),
        ("raw %wire", 10, lambda n, b: pct(launcher, n, b)),
    ])
    table(launcher, "CPU µs per operation and rank (all threads; of the best run)", cpu, [
        ("arrays/0.5.0", 13, lambda n, b: ratio(launcher, "arrays", "0.5.0", n, b, at=2)),
        ("tcp/0.5.0", 10, lambda n, b: ratio(launcher, "tcp links", "0.5.0", n, b, at=2)),
    ])
    for (l, n), (w, r) in sorted(pingpong.items()):
        if l != launcher:
            continue
        raw4k = best.get((launcher, "raw", n, 4096))
        extra = f"; raw all_sum 4 KiB = {raw4k[0] / w:.2f} × the wire round trip" if raw4k else ""
        print(f"{n} ranks: 4 KiB ping-pong round trip p50: wire {w:.1f} µs, ring send/recv {r:.1f} µs{extra}")
PY
stop_hogs
((HOGS)) && echo "(with $HOGS busy loop(s) running all along)"
true
