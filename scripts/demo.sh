#!/usr/bin/env bash
# The README's first command: install what is missing, build the CPU preset's mlaserve, and run the
# main job (prefill + decode + sampling) on the trained embedded default model shipped in models/default.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
cmake --preset cpu >/dev/null
cmake --build --preset cpu -j"$(nproc)" --target mlaserve
# Temperature 0.6 with nucleus 0.9: greedy decoding of a model this small falls into loops quickly;
# this setting keeps it on readable English (models/README.md shows the greedy output too).
./build/cpu/mlaserve generate --model models/default --prompt "Jesus said to his disciples," \
  --max-tokens 48 --temperature 0.6 --top-p 0.9 --seed 3
