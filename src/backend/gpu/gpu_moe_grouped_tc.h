// Tensor-core grouped-GEMM experts for moe_experts' prefill path in GemmPrecision::Bf16 (internal to
// gpu_moe.cu): mma.sync m16n8k16 bf16 over the routing plan's expert segments. Trades exactness
// (x and h rounded once to bf16) for ~10x the fp32 grouped kernel's rate; weights stay exact.
//
// Declared constraint (gpu_moe.cu checks it and otherwise runs the exact fp32 grouped kernel):
//   - CUDA build, device sm_80+ (moe_tc_device_ok); HIP: never;
//   - format BF16, FP8 (128x128 block scales) or I4_BF16 (group 32): the formats whose weight values
//     are exact in bf16 (F16 / F32 dense and INT4 with F16 / F32 scales are not);
//   - hidden and inter multiples of 32 (one k step; no k tail), every held expert's rows 16-byte
//     readable (MoeExpertTable::all_vec);
//   - the plan's row tiles (moe::kBM) divide kMoeGroupedTcRows, and a chunk has at most
//     kMoeGroupedTcMaxTiles of them.
// Any number of pairs per expert; output columns past the end are predicated. On a compute capability
// 9.0 device the launch runs the wgmma kernel instead (gpu_moe_grouped_sm90a.h): same tiles, values
// and constraint.
#pragma once

#include <cstdint>

#include "backend/gpu/gpu.h"
#include "backend/gpu/gpu_moe_state.h"

namespace mla::gpu {

constexpr int kMoeGroupedTcRows = 64;        // sorted pairs per CTA (kBM)
constexpr int kMoeGroupedTcMaxTiles = 65535;  // plan row tiles per launch (grid y); the caller checks

struct MoeGroupedTcArgs {
  const DeviceExpert* table;  // device table; plan built by moe_plan_kernel on the same stream
  moe::Plan plan;
  int plan_tile;              // rows per plan tile (moe::kBM); must divide kMoeGroupedTcRows
  int max_tiles;              // grid y: an upper bound on plan.counters[1] (from shapes only)
  const float* x;             // [tokens, hidden] fp32 rows of this token chunk
  int64_t x_stride;
  int tokens, top_k;
  int64_t hidden, inter;
  uint16_t* x16;              // scratch: [tokens, hidden] bf16 (may alias y: dead before down writes y)
  uint16_t* h16;              // scratch: [pairs, inter] bf16 by sorted position
  float* y;                   // out: [pairs, hidden] fp32, row = pair index t * top_k + slot
};

// True when the constraint above holds for the format and shape (device and plan checked by the caller).
bool moe_grouped_tc_ok(MoeFormat format, int64_t hidden, int64_t inter, bool all_vec);
// Enqueues prep (x -> bf16), gate/up (-> bf16 h) and down (-> y). Precondition: moe_grouped_tc_ok.
void moe_grouped_tc_launch(MoeFormat format, const MoeGroupedTcArgs& args, Stream stream);

}  // namespace mla::gpu
