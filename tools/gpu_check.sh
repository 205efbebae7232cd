#!/usr/bin/env bash
# Everything GPU-side in one go, against a prebuilt `cuda` preset build folder (built on the
# development machine and carried to the GPU host). Usage: tools/gpu_check.sh BUILD_DIR LOG_DIR
# Order (docs: shared/GPU.md): 1. kernel parity, 2. golden model tests, 3. benchmarks.
# Until the GPU-backend issue lands kernels, step 1 is the launch self-test of the portability layer
# and steps 2-3 run the CPU reference (golden tests) on the host's CPUs.
set -uo pipefail
build=${1:?usage: gpu_check.sh BUILD_DIR LOG_DIR}
logs=${2:?usage: gpu_check.sh BUILD_DIR LOG_DIR}
mkdir -p "$logs"
status=0
export MLA_FIXTURE_DIR=${MLA_FIXTURE_DIR:-$PWD/tests/fixtures}
export LD_LIBRARY_PATH="$build/shipped-libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "== 1. GPU self-test"
"$build/src/backend/gpu/mla_gpu_info" 2>&1 | tee "$logs/gpu_info.log" || status=1
echo "== 2. golden model tests (CPU reference on this host)"
"$build/tests/mlaserve_tests" --gtest_filter='*GoldenHf*' 2>&1 | tee "$logs/golden.log" | tail -n 5 || status=1
echo "== summary"
grep -h -E "self-test|worst per-position|PASSED|FAILED" "$logs"/*.log
exit $status
