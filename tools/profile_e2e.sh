#!/usr/bin/env bash
# Per-kernel time of one end-to-end decode step on the GPU host: runs the e2e benchmark on a
# make-model checkpoint under Nsight Compute with collection off until the benchmark's profiler
# range (`mla_bench_gpu --only e2e --profile-steps N`: N decode steps after the timed run, launched
# eagerly, the same kernels the captured graph replays), then sums gpu__time_duration per kernel
# name over those N steps and prints the table per step, largest first. ncu serializes kernels and
# times each alone, so the sum exceeds the graph's step time by the overlap that PDL and
# back-to-back launches give; it says where the time goes, not the step time itself (the
# benchmark's own row, printed first, is that).
# Usage: tools/profile_e2e.sh BUILD_DIR OUT_DIR MODEL_DIR [STEPS=3]
set -euo pipefail
usage="usage: profile_e2e.sh BUILD_DIR OUT_DIR MODEL_DIR [STEPS]"
build=$(realpath "${1:?$usage}")
out=${2:?$usage}
model=${3:?$usage}
steps=${4:-3}
mkdir -p "$out"
out=$(realpath "$out")
export LD_LIBRARY_PATH="$build/shipped-libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1 || true)
[ -n "$ncu" ] || { echo "ncu not found"; exit 1; }
"$ncu" --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv --page raw \
  "$build/bench/mla_bench_gpu" --only e2e --model "$model" --decode-tokens 32 --quick --profile-steps "$steps" \
  >"$out/profile_e2e.csv" 2>"$out/profile_e2e.err" || {
  echo "ncu or the benchmark failed; the ends of its stdout and stderr:"
  tail -n 20 "$out/profile_e2e.csv" "$out/profile_e2e.err"
  exit 1
}
python3 - "$out/profile_e2e.csv" "$steps" <<'PY' | tee "$out/profile_e2e.md"
import csv, sys, collections
path, steps = sys.argv[1], int(sys.argv[2])
lines = open(path).read().splitlines()
start = next(i for i, l in enumerate(lines) if l.startswith('"ID"'))
rows = list(csv.reader(lines[start:]))
head = rows[0]
name_i, dur_i, grid_i, block_i = (head.index(k) for k in ("Kernel Name", "gpu__time_duration.sum", "Grid Size", "Block Size"))
unit = rows[1][dur_i]  # the units row: "nsecond", "usecond", "msecond" (or ns / us / ms)
to_us = {"n": 1e-3, "u": 1.0, "m": 1e3}.get(unit[:1], 1.0)
tot = collections.defaultdict(float)
cnt = collections.Counter()
for r in rows[2:]:
    if len(r) <= dur_i:
        continue
    try:
        t = float(r[dur_i].replace(",", "")) * to_us
    except ValueError:
        continue
    key = (r[name_i].split("(")[0].replace("void ", ""), f"{r[grid_i]} x {r[block_i]}")
    tot[key] += t
    cnt[key] += 1
total = sum(tot.values())
print(f"per decode step, averaged over {steps} eager steps; gpu__time_duration in {unit}, shown in us")
print("| kernel | grid x block | launches / step | us / step | us / launch | share |")
print("|---|---|---|---|---|---|")
for (n, g), t in sorted(tot.items(), key=lambda kv: -kv[1]):
    c = cnt[(n, g)]
    print(f"| {n} | {g} | {c / steps:.1f} | {t / steps:.1f} | {t / c:.2f} | {100 * t / total:.1f}% |")
print(f"| **sum** | | {sum(cnt.values()) / steps:.0f} | **{total / steps:.1f}** | | |")
PY
