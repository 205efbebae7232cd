#!/usr/bin/env bash
# Runs a command on an NVIDIA GPU held by MPS to a share of its SMs: an H200 stand-in on an H100.
# Why: a streaming kernel's short items depend on the copy bandwidth each SM gets. An H100 held to
# 92 of its 132 SMs (71%) gets the H200's (3.0 TB/s / 92 = 4.25 TB/s / 132 = 32 GB/s per SM) while
# its copy ceiling stays ~2.97 TB/s. In session 30 it ranked three MoE decode builds as the H200
# did, with gains of the same size and a level 3-7 points above the H200's (docs/performance.md):
# it ranks changes, it does not replace the H200's rows of record. Grids sized to the SM count see
# the share (cudaDevAttrMultiProcessorCount), so a fixed-shape launch can change its waves: MLA
# decode's batch-64 rows need `--decode-batch 46` there to keep the H200's one wave (there its ticket
# merge read 72-73%, near the H200's 76%; the cluster merge 84% on one H100 and 78% on another, so
# compare cluster rows within one process: how MPS's SMs fall on the GPCs is likely to differ).
# Usage: [PCT=71] tools/gpu_standin.sh COMMAND [ARGS...]
#   e.g. tools/gpu_standin.sh build/cuda/bench/mla_bench_gpu --only moe
# The MPS daemon runs for the command only (stopped on exit); the command's bench report names the
# SMs it saw ("Device: NAME, 92 SMs").
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: [PCT=71] $0 COMMAND [ARGS...]" >&2; exit 2; }
command -v nvidia-cuda-mps-control >/dev/null || { echo "gpu_standin: nvidia-cuda-mps-control not found" >&2; exit 1; }
CUDA_MPS_PIPE_DIRECTORY=$(mktemp -d)
CUDA_MPS_LOG_DIRECTORY=$(mktemp -d)
export CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
export CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=${PCT:-71}
nvidia-cuda-mps-control -d
stop() {
  echo quit | nvidia-cuda-mps-control || true
  rm -rf "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
}
trap stop EXIT
"$@"
