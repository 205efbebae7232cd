#!/usr/bin/env bash
# Single-stream speculative decoding on the GPU host (issue #8), against a `cuda` preset build folder:
# `mlaserve generate --device cuda` (one request, greedy, in-process) without speculation and with
# --speculative draft at several K, on two pairs:
#   1. the embedded model and its trained draft (launch-bound: a 4-layer target step is ~0.35 ms);
#   2. a large synthetic target whose step is bandwidth-bound: DeepSeek-V3 widths, FP8, all layers
#      dense (MLA_SPEC_LAYERS, default 30: ~21 GB, ~19 GB read per token; no MTP block), and a draft built to agree
#      with it: the SAME seed with one layer (its tensors are the target's first layer, embedding and
#      lm_head byte for byte). Both are written with --branch-gain MLA_SPEC_GAIN, which scales the
#      weights writing into the residual stream so the deeper layers perturb the shared
#      embedding -> lm_head path only slightly; the gain sets how often the two agree.
# Usage: tools/spec_bench.sh BUILD_DIR OUT_DIR [--large-only|--embedded-only]
# Env: MLA_SPEC_DIR (default /tmp/mla_spec: the large pair is written there unless present),
#      MLA_SPEC_LAYERS, MLA_SPEC_GAIN (default 0.015), MLA_SPEC_TOKENS (tokens generated, default 256).
set -uo pipefail
usage="usage: spec_bench.sh BUILD_DIR OUT_DIR [--large-only|--embedded-only]"
build=$(realpath "${1:?$usage}")
out=$(mkdir -p "${2:?$usage}" && realpath "$2")
mode=${3:-}
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH="$build/shipped-libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
bin="$build/mlaserve"
dir=${MLA_SPEC_DIR:-/tmp/mla_spec}
layers=${MLA_SPEC_LAYERS:-30}
gain=${MLA_SPEC_GAIN:-0.015}
tokens=${MLA_SPEC_TOKENS:-256}
rows=()  # "pair|K|decode tok/s|speed-up|mean accepted length|per position"

gen() {  # pair name model prompt-args... [-- spec-args...]: one generate run, appends a row
  local pair=$1 name=$2 model=$3
  shift 3
  timeout -k 5 300 "$bin" generate --model "$model" --device cuda --gemm-precision bf16 --max-tokens "$tokens" \
    --ignore-eos --json "$@" >"$out/gen_${pair}_$name.json" 2>"$out/gen_${pair}_$name.err"
  local rc=$?
  local row
  row=$(python3 - "$out/gen_${pair}_$name.json" "$pair" "$name" "$rc" <<'PY'
import json, sys
path, pair, name, rc = sys.argv[1:5]
try:
    j = json.load(open(path))
except Exception:
    print(f"{pair}|{name}|FAILED (rc {rc})|||")
    sys.exit()
t = j["timing"]["decode_tokens_per_second"]
s = j.get("speculative", {})
per = " ".join(f"{x:.2f}" for x in s.get("acceptance_rate_per_position", []))
mal = s.get("mean_accepted_length")
print(f"{pair}|{name}|{t:.1f}||{'' if mal is None else f'{mal:.2f}'}|{per}")
PY
)
  rows+=("$row")
  echo "$row"
}

if [ "$mode" != "--large-only" ]; then
  echo "== 1. embedded model + trained draft"
  prompt="And it came to pass, when the king"
  gen embedded plain models/default --prompt "$prompt"
  for k in 1 2 3 4; do
    gen embedded "K=$k" models/default --prompt "$prompt" --speculative draft --draft-model models/draft --num-draft-tokens $k
  done
fi

if [ "$mode" != "--embedded-only" ]; then
  echo "== 2. large synthetic target ($layers dense DeepSeek-V3 layers, FP8) + its one-layer draft, gain $gain"
  mk() {  # dir layers
    [ -f "$1/config.json" ] && return 0
    local t0=$(date +%s)
    "$bin" make-model --preset deepseek-v3 --dtype fp8 --layers "$2" --dense-layers "$2" --mtp-layers 0 \
      --branch-gain "$gain" --seed 1 --out "$1" >"$out/make_$(basename "$1").log" 2>&1 || { echo "make-model $1 failed"; return 1; }
    echo "wrote $1 ($(du -sh "$1" | cut -f1)) in $(( $(date +%s) - t0 )) s"
  }
  if mk "$dir/target" "$layers" && mk "$dir/draft" 1; then
    ids=$(python3 -c "import random; r=random.Random(5); print(','.join(str(r.randrange(1000, 100000)) for _ in range(64)))")
    gen large plain "$dir/target" --prompt-ids "$ids"
    for k in 2 3 4; do
      gen large "K=$k" "$dir/target" --prompt-ids "$ids" --speculative draft --draft-model "$dir/draft" --num-draft-tokens $k
    done
  fi
fi

echo
echo "| pair | K | decode tok/s | vs no speculation | mean accepted length | acceptance by position |"
echo "|---|---:|---:|---:|---:|---|"
python3 - "${rows[@]}" <<'PY'
import sys
base = {}
for r in sys.argv[1:]:
    pair, name, tps = r.split("|")[:3]
    if name == "plain":
        try: base[pair] = float(tps)
        except ValueError: pass
for r in sys.argv[1:]:
    pair, name, tps, _, mal, per = r.split("|")
    try: sp = f"{float(tps) / base[pair]:.2f}x"
    except (ValueError, KeyError): sp = ""
    print(f"| {pair} | {'—' if name == 'plain' else name[2:]} | {tps} | {sp} | {mal or '—'} | {per or '—'} |")
PY
