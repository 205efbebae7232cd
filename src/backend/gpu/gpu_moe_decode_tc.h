// Tensor-core decode path of moe_experts (internal to gpu_moe.cu): for GemmPrecision::Bf16, FP8 and
// INT4 (BF16 scale) experts, each routed expert's weights are streamed once with 16-byte loads and
// multiplied on mma.sync with the expert's tokens as the n = 8 columns. Trades exactness (activations
// rounded once to f16 / bf16) for ~5x fewer instructions per weight byte than the fp32 decode kernel.
//
// Declared constraint (the dispatcher checks it and otherwise runs the exact decode kernel):
//   - CUDA build, device sm_80+ (moe_tc_device_ok); HIP: never;
//   - format FP8 (128x128 block scales) or I4_BF16 (group 32);
//   - hidden and inter multiples of 64 (FP8) / 128 (INT4) (moe_tc_shape_ok);
//   - every held expert's rows 16-byte readable (MoeExpertTable::all_vec).
// Any number of pairs per expert works (8 token columns per pass; more re-stream the weights).
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/gpu/gpu.h"
#include "backend/gpu/gpu_moe_state.h"

namespace mla::gpu {

struct MoeTcArgs {
  const DeviceExpert* table;  // device table; plan built by moe_plan_kernel on the same stream
  moe::Plan plan;
  const float* x;             // [tokens, hidden] fp32 rows of this token chunk
  int64_t x_stride;
  int tokens, top_k, pairs, slots;  // pairs = tokens * top_k; slots = min(E, pairs) (grid x)
  int64_t hidden, inter;
  void* scratch;              // moe_tc_scratch_bytes(tokens, pairs, hidden, inter) bytes, 256-aligned
  float* y;                   // out: [pairs, hidden] fp32, row = pair index t * top_k + slot
};

bool moe_tc_shape_ok(MoeFormat format, int64_t hidden, int64_t inter);
// Compute capability major of the current device >= 8 (false on HIP builds).
bool moe_tc_device_ok();
size_t moe_tc_scratch_bytes(int64_t tokens, int64_t pairs, int64_t hidden, int64_t inter);
// Enqueues prep (x -> 16-bit), gate/up (-> 16-bit h) and down (-> y). Precondition: the constraint
// above holds and `format` is the table's.
void moe_tc_launch(MoeFormat format, const MoeTcArgs& args, Stream stream);

}  // namespace mla::gpu
