#!/usr/bin/env bash
# Serving measurements on the GPU host (issues #5, #6, #8), against a `cuda` preset build folder:
#   1. server overhead per token: `mlaserve serve --device cuda` on MODEL, `mlaserve bench` at
#      concurrency 1 and 64; bench reads the server's /metrics around each point and reports the
#      engine's forward time per step next to the client-seen TPOT (its "server" block);
#   2. speculative decoding, single stream: the same server with --speculative draft (K = 2, 4) and
#      without, concurrency 1, greedy, plus acceptance from /metrics;
#   3. the bench HTML report of run 1 (render it to PNG where Chromium exists: --report-png).
# Usage: tools/serving_bench.sh BUILD_DIR OUT_DIR [MODEL_DIR [DRAFT_DIR]]
# Env: MLA_BENCH_IN / MLA_BENCH_OUT (prompt / output tokens, default 128 / 256).
set -uo pipefail
build=$(realpath "${1:?usage: serving_bench.sh BUILD_DIR OUT_DIR [MODEL_DIR [DRAFT_DIR]]}")
out=$(mkdir -p "${2:?}" && realpath "$2")
cd "$(dirname "$0")/.."
model=${3:-models/default}
draft=${4:-models/draft}
in_len=${MLA_BENCH_IN:-128}
out_len=${MLA_BENCH_OUT:-256}
export LD_LIBRARY_PATH="$build/shipped-libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
bin="$build/mlaserve"
port=18431

serve() {  # name extra-args...: starts a server, waits for /health
  local name=$1
  shift
  "$bin" serve --model "$model" --served-model-name default --device cuda --gemm-precision bf16 --port $port --max-num-seqs 64 \
    --max-tokens-per-step 1024 --num-kv-blocks 4096 "$@" >"$out/serve_$name.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 1 120); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  echo "server $name did not come up" >&2
  return 1
}
stop() { kill -TERM "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null; }
bench() {  # name concurrency extra-args...
  local name=$1 conc=$2
  shift 2
  timeout -k 5 240 "$bin" bench --url "http://127.0.0.1:$port" --model default --input-len "$in_len" \
    --output-len "$out_len" --concurrency "$conc" --warmup 4 --seed 1 --token-ids 300:3800 --gpu h200 --gpus 1 \
    --result-json "$out/bench_$name.json" "$@" >"$out/bench_$name.log" 2>&1
  grep -E "Output token throughput|Per-user decode|TPOT|Server |Speculative" "$out/bench_$name.log" | sed "s/^/[$name] /"
}

echo "== 1. server overhead and the report: plain decoding, bf16 GEMMs, decode graphs on"
if serve plain; then
  bench sweep 1,8,32,64 --report "$out/bench_report.html"
  stop
fi

echo "== 2. speculative decoding, single stream (greedy, $in_len in / $out_len out)"
for k in 2 4; do
  if serve "spec_k$k" --speculative draft --draft-model "$draft" --num-draft-tokens $k; then
    bench "spec_k$k" 1 --num-prompts 8
    stop
  fi
done
echo "== 3. generate (one request, in-process): decode tok/s without and with speculation"
prompt="And it came to pass, when the king"
gen() {  # name extra-args...
  local name=$1
  shift
  timeout -k 5 120 "$bin" generate --model "$model" --device cuda --gemm-precision bf16 --prompt "$prompt" \
    --max-tokens "$out_len" --ignore-eos --json "$@" >"$out/generate_$name.json" 2>"$out/generate_$name.err"
  python3 -c "import json,sys; j=json.load(open(sys.argv[1])); t=j['timing']; s=j.get('speculative',{});
print(sys.argv[2], 'decode tok/s', round(t['decode_tokens_per_second'],1), 'mean accepted', s.get('mean_accepted_length'), 'per pos', s.get('acceptance_rate_per_position'))" \
    "$out/generate_$name.json" "$name" 2>&1 | tail -1
}
gen plain
for k in 1 2 3 4 6; do gen "spec_k$k" --speculative draft --draft-model "$draft" --num-draft-tokens $k; done
echo "== done"
