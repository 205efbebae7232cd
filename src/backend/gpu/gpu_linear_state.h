// Grow-once scratch and cached cuBLASLt plans of the linear op group (owned by GpuBackend, one per
// backend). Vendor types stay behind an opaque pointer so this header needs no BLAS header.
#pragma once

#include <cstdint>
#include <memory>

#include "backend/gpu/gpu_scratch.h"

namespace mla::gpu {

class GpuBackend;
struct BlasPlans;  // gpu_linear_blas.cu: the cuBLASLt handle and the algorithm cache keyed by shape

struct LinearState {
  explicit LinearState(GpuBackend& backend);  // creates the cuBLASLt handle (CUDA builds)
  ~LinearState();
  LinearState(const LinearState&) = delete;
  LinearState& operator=(const LinearState&) = delete;

  Scratch scratch;                  // Blas path: split activations, partial products, workspace
  Scratch gemv_scratch;             // GEMV split-K partial sums [splits, T, out]
  Scratch dequant_scratch;          // DequantBlas: one chunk of weight rows as bf16 (<= 256 MiB)
  Scratch tc_scratch;               // GemvTc: split-K partial planes [splits, T, out]
  Scratch tc_tickets;               // GemvTc: a split-K ticket per 64-row block, zero between calls
  int tc_device = -1;               // GemvTc's device probe (sm_80+), -1 until first asked
  int64_t dequant_chunk_rows = 0;   // test override of the rows per chunk (0: by the budget)
  int64_t tc_splits = 0;            // bench override of GemvTc's split count (0: dense_tc_split)
  bool group_one_launch = true;     // bench A/B: false runs every linear_group as separate calls
  std::unique_ptr<BlasPlans> blas;  // null on HIP
};

}  // namespace mla::gpu
