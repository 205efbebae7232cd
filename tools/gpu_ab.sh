#!/usr/bin/env bash
# A/B of two builds' GPU benchmarks on the GPU host: processes alternate A, B, A, B, ... (so drift in
# clocks or temperature falls on both), each measuring its own ceilings, and one table compares every
# row the runs share. Why a script: every kernel change is judged this way (docs/performance.md), and
# one-off copies of this loop kept getting lost between sessions.
# Usage: tools/gpu_ab.sh OUT_DIR BUILD_A BUILD_B [PAIRS] -- MLA_BENCH_GPU_ARGS...
#   e.g. tools/gpu_ab.sh /tmp/ab build/cuda build/new 2 -- --only moe
#   BUILD_X/bench/mla_bench_gpu is run; its libraries come from BUILD_X/shipped-libs, else from
#   BUILD_A/shipped-libs (a build packed with only the bench binary reuses A's; tools/pack_build.sh).
#   STANDIN=1 runs each process on the H200 stand-in (tools/gpu_standin.sh; PCT as there).
#   TIMEOUT_S bounds each process (default 300).
# Output: OUT_DIR/{A,B}_<i>/bench_gpu.json and .log per process, and OUT_DIR/ab.md: per row key, each
# process's figure (% of its own ceiling where the row has one, else the value) in run order, and the
# difference of the medians, B - A. Exit status: 0 when every process succeeded.
set -uo pipefail
usage="usage: gpu_ab.sh OUT_DIR BUILD_A BUILD_B [PAIRS] -- MLA_BENCH_GPU_ARGS..."
[ $# -ge 4 ] || { echo "$usage" >&2; exit 2; }
out=$1
build_a=$(realpath "$2")
build_b=$(realpath "$3")
shift 3
pairs=2
if [ "$1" != -- ]; then
  pairs=$1
  shift
fi
[ "${1:-}" = -- ] || { echo "$usage" >&2; exit 2; }
shift
[[ $pairs =~ ^[1-9][0-9]*$ ]] || { echo "gpu_ab: PAIRS must be a positive integer, got '$pairs'" >&2; exit 2; }
for b in "$build_a" "$build_b"; do
  [ -x "$b/bench/mla_bench_gpu" ] || { echo "gpu_ab: no $b/bench/mla_bench_gpu" >&2; exit 2; }
done
mkdir -p "$out"
out=$(realpath "$out")
cd "$(dirname "$0")/.."
status=0
for ((i = 1; i <= pairs; ++i)); do
  for side in A B; do
    build=$build_a
    [ $side = B ] && build=$build_b
    libs=$build/shipped-libs
    [ -d "$libs" ] || libs=$build_a/shipped-libs
    prefix=()
    [ "${STANDIN:-0}" = 1 ] && prefix=(bash tools/gpu_standin.sh)
    run=$out/${side}_$i
    LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" timeout -k 10 "${TIMEOUT_S:-300}" \
      "${prefix[@]}" "$build/bench/mla_bench_gpu" "$@" --out "$run" >"$run.log" 2>&1
    rc=$?
    echo "$side $i: rc $rc ($build)"
    [ $rc -eq 0 ] || { status=1; tail -n 5 "$run.log"; }
  done
done
python3 - "$out" "$pairs" "$build_a" "$build_b" "$*" <<'PY' | tee "$out/ab.md"
import json, os, statistics, sys
out, pairs, build_a, build_b, args = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
runs = [(side, i) for i in range(1, pairs + 1) for side in "AB"]
loaded = {}  # (side, i) -> report, for the processes that wrote one
for side, i in runs:
    path = os.path.join(out, f"{side}_{i}", "bench_gpu.json")
    if os.path.exists(path):
        loaded[(side, i)] = json.load(open(path))
print(f"A = {build_a}\nB = {build_b}\nargs: {args}; processes in order: {', '.join(f'{s}{i}' for s, i in runs)}")
devices = sorted({r.get("device", "?") for r in loaded.values()})
print(f"device: {'; '.join(devices) or 'no report'}\n")
if not loaded:
    sys.exit(0)

def figure(row):  # (number, printed): % of the row's own ceiling where it has one
    if row["ceiling"] > 0:
        return 100 * row["fraction"], f"{100 * row['fraction']:.1f}%"
    return row["value"], f"{row['value']:.4g} {row['unit']}"

keys = []  # row keys in first-seen order; ceiling rows first
table = {}  # key -> side -> [(number, printed)] in run order
for (side, i), rep in loaded.items():
    for row in rep["rows"]:
        key = row.get("key") or row["case"]
        if key not in table:
            table[key] = {"A": [], "B": []}
            keys.append((row["bench"] != "ceiling", key))
        table[key][side].append(figure(row))
print("| row | A | B | B - A (medians) |\n|---|---|---|---|")
for _, key in sorted(keys, key=lambda k: k[0]):
    a, b = table[key]["A"], table[key]["B"]
    delta = ""
    if a and b:
        d = statistics.median(x for x, _ in b) - statistics.median(x for x, _ in a)
        pct = a[0][1].endswith("%")
        delta = f"{d:+.1f} points" if pct else f"{d:+.4g}"
    print(f"| {key} | {' / '.join(p for _, p in a) or '-'} | {' / '.join(p for _, p in b) or '-'} | {delta} |")
PY
exit $status
