#!/usr/bin/env bash
# tools/gpu_ab.sh without a GPU: two fake builds whose "bench" writes a report (rows with and without
# a ceiling) from its build's figures; the A/B table must alternate the processes, list each
# process's figure in run order and take B - A of the medians, and a failing process must fail the run.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] || rm -rf "$tmp"' EXIT
fake_build() {  # dir fraction_list latency_us: the i-th process of this build reads the i-th fraction
  mkdir -p "$1/bench" "$1/shipped-libs"
  cat >"$1/bench/mla_bench_gpu" <<FAKE
#!/usr/bin/env bash
set -eu
while [ \$# -gt 0 ]; do [ "\$1" = --out ] && out=\$2; shift; done
n=\$(cat "$1/count" 2>/dev/null || echo 0); echo \$((n + 1)) >"$1/count"
fracs=($2)
mkdir -p "\$out"
echo "\$(date +%s%N) $1" >>"$tmp/order"
cat >"\$out/bench_gpu.json" <<JSON
{"device": "Fake GPU, 7 SMs", "rows": [
 {"bench": "ceiling", "case": "d2d copy", "key": "d2d copy", "ceiling": 0, "fraction": 0, "value": 3000, "unit": "GB/s"},
 {"bench": "moe_decode", "case": "int4 batch 1", "key": "int4 b1", "ceiling": 3000, "fraction": \${fracs[\$n]}, "value": 1, "unit": "GB/s"},
 {"bench": "mla_decode", "case": "batch 1 latency", "key": "b1 lat", "ceiling": 0, "fraction": 0, "value": $3, "unit": "us"}]}
JSON
[ "\${FAIL:-}" != "$1" ]
FAKE
  chmod +x "$1/bench/mla_bench_gpu"
}
fake_build "$tmp/a" "0.70 0.72" 20
fake_build "$tmp/b" "0.75 0.79" 18
bash "$root/tools/gpu_ab.sh" "$tmp/out" "$tmp/a" "$tmp/b" 2 -- --only moe >"$tmp/stdout"
grep -qxF '| int4 b1 | 70.0% / 72.0% | 75.0% / 79.0% | +6.0 points |' "$tmp/out/ab.md"
grep -qxF '| b1 lat | 20 us / 20 us | 18 us / 18 us | -2 |' "$tmp/out/ab.md"
grep -qxF '| d2d copy | 3000 GB/s / 3000 GB/s | 3000 GB/s / 3000 GB/s | +0 |' "$tmp/out/ab.md"
grep -q 'processes in order: A1, B1, A2, B2' "$tmp/out/ab.md"
# The processes really alternated: a, b, a, b.
[ "$(awk '{print $2}' "$tmp/order" | xargs -n1 basename | tr '\n' ' ')" = "a b a b " ]
# A failing process fails the run (and its rows are simply missing from that side).
rm -f "$tmp/a/count" "$tmp/b/count"
if FAIL="$tmp/b" bash "$root/tools/gpu_ab.sh" "$tmp/out2" "$tmp/a" "$tmp/b" 1 -- --only moe >"$tmp/stdout2"; then
  echo "gpu_ab.sh succeeded although B failed"; exit 1
fi
# Bad arguments are refused.
if bash "$root/tools/gpu_ab.sh" "$tmp/out3" "$tmp/a" "$tmp/b" x -- --only moe 2>/dev/null; then
  echo "gpu_ab.sh took PAIRS 'x'"; exit 1
fi
echo "gpu_ab.sh: table, alternation, failure and argument checks passed"
