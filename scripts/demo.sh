#!/usr/bin/env bash
# The README's first command: install what is missing, build the CPU preset, and run the main job
# (prefill + decode) on the embedded default model.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
cmake --preset cpu >/dev/null
cmake --build --preset cpu -j"$(nproc)" --target mlaserve default_model
./build/cpu/mlaserve generate --model build/cpu/models/default --prompt "The engine serves" \
  --max-tokens 32 --temperature 0.7 --top-p 0.9 --seed 1 --ignore-eos
