#!/usr/bin/env bash
# The README's second command (and CI's): install what is missing, build every preset that can be
# built here, run every test. Warnings are errors. GPU code is compiled (CUDA) but runs only on the
# GPU host (tools/gpu_check.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
FUZZ_SECONDS=${FUZZ_SECONDS:-30}

bash scripts/install_deps.sh

echo "== cpu preset: build (warnings as errors) and run all tests"
cmake --preset cpu -DMLA_WERROR=ON >/dev/null
cmake --build --preset cpu -j"$jobs"
ctest --preset cpu -j"$jobs"

echo "== asan preset: every test under AddressSanitizer + UBSan, then the parser fuzzers"
cmake --preset asan -DMLA_WERROR=ON >/dev/null
cmake --build --preset asan -j"$jobs"
ASAN_OPTIONS=detect_leaks=1 ./build/asan/tests/mlaserve_tests --gtest_brief=1
# Each fuzzer starts from its committed seeds in a scratch copy (libFuzzer adds to its corpus dir).
for target in safetensors_header:safetensors model_config:model_config tiktoken_file:tiktoken_file \
              tokenizer_encode:tokenizer_encode tokenizer_json:tokenizer_json chat_template:chat_template \
              output_parsers:; do
  name=${target%%:*}
  corpus=$(mktemp -d)
  seeds=${target##*:}
  if [ -n "$seeds" ]; then cp tests/fuzz/corpus/"$seeds"/* "$corpus"/; fi
  echo "-- fuzz_$name for ${FUZZ_SECONDS}s"
  if ! ./build/asan/tests/fuzz_"$name" -max_total_time="$FUZZ_SECONDS" -print_final_stats=1 "$corpus" \
      >"$corpus.log" 2>&1; then
    tail -n 60 "$corpus.log"
    echo "fuzz_$name FAILED"
    exit 1
  fi
  tail -n 4 "$corpus.log"
  rm -rf "$corpus" "$corpus.log"
done

if [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "== cuda preset: build the GPU backend, its tests and benchmarks (no GPU here; they run on the GPU host)"
  cmake --preset cuda -DMLA_WERROR=ON >/dev/null
  # The GPU-side targets only: the CPU tests were built and run above.
  cmake --build --preset cuda -j"$jobs" --target mlaserve mlaserve_gpu_tests mla_bench_gpu mla_gpu_info
else
  echo "== cuda preset: skipped, no CUDA toolkit at /usr/local/cuda"
fi
echo "== hip preset: compile every GPU kernel file with hipcc for gfx90a"
cmake --preset hip -DMLA_WERROR=ON >/dev/null
cmake --build --preset hip -j"$jobs" --target mla_hip_kernels
echo "all test stages passed"
