#!/usr/bin/env bash
# The ways a waiting step can wait, side by side in one run, for each fabric: MLX's ring and
# JACCL's mesh over TCP, and JACCL's mesh over the RDMA fabric driving the software RDMA
# provider (fabric-sim/verbs). Every job is `benches/allreduce/` (float32 all_sum, its own
# local ranks, p50 and CPU µs per operation and rank), run REPS times with the candidates
# interleaved; the best p50 of the runs is kept, with that run's CPU time.
#
#   bash benches/waits.sh                       # 2 ranks; 4K,64K,1M; 3 rounds
#   RANKS="2 4" SIZES=4K,1M REPS=5 bash benches/waits.sh
#
# Candidates (columns): `default` is what a fabric does unless told (over TCP the adaptive
# wait of src/transport/wait.rs: it looks for at most 100 µs, and not while the core is
# contended; over RDMA, which has no completion channel to park on, a yield between polls of
# the completion queues); `spin N` looks (polls at once) for N µs every time first (`--spin`,
# what NUVEC_DISTRIBUTED_SPIN_US sets), then parks in the poll (TCP; `spin 0` parks at once)
# or yields between polls (RDMA; `spin 1000000` never yields, as MLX's JACCL polls). Over the provider the ranks share the cores with the
# provider's own threads, which carry the messages: a stand-in for a busy machine, not a
# measurement of Thunderbolt.
#
# Full output of every job: target/waits/.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
SIZES="${SIZES:-4K,64K,1M}"
RANKS="${RANKS:-2}"
REPS="${REPS:-3}"
OUT="$ROOT/target/waits"
mkdir -p "$OUT"
rm -f "$OUT"/*.log

echo "== building (release, feature jaccl) and the software provider" >&2
BENCH="$(cargo bench --ignore-rust-version --features jaccl --bench allreduce --no-run --message-format=json 2>/dev/null \
  | python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "allreduce" and m.get("executable"):
        print(m["executable"])')"
[ -x "$BENCH" ] || { echo "could not build benches/allreduce/" >&2; exit 1; }
cargo build --release --ignore-rust-version -p nuvec-verbs-emu >&2
PROVIDER="$ROOT/target/release/libnuvec_verbs_emu.so"

# The device names of the bench's mesh of N local ranks (benches/allreduce/launch.rs).
devices() {
  local n="$1" a b names=()
  for ((a = 0; a < n; a++)); do
    for ((b = a + 1; b < n; b++)); do names+=("loop${a}to${b}.0"); done
  done
  local IFS=,
  echo "${names[*]}"
}

# job FABRIC N CANDIDATE REP: one bench job.
job() {
  local fabric="$1" n="$2" cand="$3" rep="$4" spin=() env=()
  [ "$cand" = default ] || spin=(--spin "${cand#spin}")
  case "$fabric" in
    ring) args=(--backend ring) ;;
    jaccl-tcp) args=(--backend jaccl --fabric tcp) ;;
    jaccl-rdma)
      args=(--backend jaccl --fabric rdma)
      env=(NUVEC_JACCL_VERBS="$PROVIDER" NUVEC_VERBS_EMU_DEVICES="$(devices "$n")")
      ;;
  esac
  local log="$OUT/$fabric-$n-$cand-$rep.log"
  echo "== $fabric, $n ranks, $cand (run $rep)" >&2
  env "${env[@]}" timeout 600 "$BENCH" "${args[@]}" --ranks "$n" --sizes "$SIZES" \
    --pingpong 0 --no-wire "${spin[@]}" >"$log" 2>&1 </dev/null || echo "   failed (see $log)" >&2
}

for rep in $(seq 1 "$REPS"); do
  for n in $RANKS; do
    for fabric in ring jaccl-tcp jaccl-rdma; do
      cands="default spin100 spin0"
      [ "$fabric" = jaccl-rdma ] && cands="default spin100 spin1000000"
      for cand in $cands; do job "$fabric" "$n" "$cand" "$rep"; done
    done
  done
done

python3 - "$OUT" <<'PY'
import glob, os, sys

best = {}  # (fabric, ranks, bytes, candidate) -> (p50, cpu)
for path in glob.glob(os.path.join(sys.argv[1], "*.log")):
    base = os.path.basename(path)[:-4]
    rest, _rep = base.rsplit("-", 1)
    rest, cand = rest.rsplit("-", 1)
    fabric, n = rest.rsplit("-", 1)
    for line in open(path, errors="replace"):
        f = line.split()
        if len(f) >= 10 and f[0].isdigit() and f[8] in ("ok", "FAIL"):
            key = (fabric, int(n), int(f[0]), cand)
            p50, cpu = float(f[3]), float(f[5])
            if f[8] != "ok":
                p50 = float("inf")
            if key not in best or p50 < best[key][0]:
                best[key] = (p50, cpu)

print()
print("all_sum float32, p50 µs / CPU µs per operation and rank (best of the runs)")
rows = sorted({k[:3] for k in best})
for fabric in ("ring", "jaccl-tcp", "jaccl-rdma"):
    cands = ["default", "spin100", "spin0"] if fabric != "jaccl-rdma" else ["default", "spin100", "spin1000000"]
    names = {"spin1000000": "spin ∞ (MLX)", "spin100": "spin 100", "spin0": "spin 0"}
    print(f"{fabric:>10} {'ranks':>5} {'bytes':>9} " + " ".join(f"{names.get(c, c):>20}" for c in cands))
    for (fab, n, b) in rows:
        if fab != fabric:
            continue
        cells = []
        for c in cands:
            v = best.get((fab, n, b, c))
            cells.append(f"{v[0]:.1f} / {v[1]:.1f}" if v else "-")
        print(f"{'':>10} {n:>5} {b:>9} " + " ".join(f"{x:>20}" for x in cells))
PY
