// Tensor-core decode matvec (internal to gpu_moe.cu and gpu_linear.cu): for GemmPrecision::Bf16,
// FP8 and INT4 (BF16 scale) weights are streamed once with 16-byte loads and multiplied on mma.sync
// with the tokens as the n = 8 columns. Used for the routed experts of moe_experts and for linear at
// decode sizes (T <= 16). Trades exactness (activations rounded once to f16 / bf16) for ~5x fewer
// instructions per weight byte than the fp32 decode kernels.
//
// Declared constraint (the dispatchers check it and otherwise run their exact kernels):
//   - CUDA build, device sm_80+ (moe_tc_device_ok); HIP: never;
//   - format FP8 (128x128 block scales) or I4_BF16 (group 32);
//   - MoE: hidden and inter multiples of 64 (FP8) / 128 (INT4) (moe_tc_shape_ok); every held
//     expert's rows 16-byte readable (MoeExpertTable::all_vec);
//   - dense: in a multiple of 64 (FP8) / 128 (INT4), out a multiple of 64 (dense_tc_shape_ok); the
//     weight's data and row starts 16-byte aligned (the caller checks).
// Any number of tokens works (8 token columns per pass; more re-stream the weights).
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

// Dense layers: out[T, out] = x[T, in] W^T. Split K over `splits` CTA columns of
// `chunks_per_split` 64-k (FP8) / 128-k (INT4) chunks each (dense_tc_split: from the shape only).
struct DenseTcSplit {
  int64_t splits = 1, chunks_per_split = 0;
};
bool dense_tc_shape_ok(MoeFormat format, int64_t in, int64_t out);
DenseTcSplit dense_tc_split(MoeFormat format, int64_t in, int64_t out);
// Scratch for the 16-bit activation rows (and FP8 scales) of `rows` rows (tokens x heads) of width `in`.
size_t dense_tc_act_bytes(int64_t rows, int64_t in);

struct DenseTcArgs {
  DeviceWeight w;            // heads > 1: head h's matrix is rows [h * w_head_rows, + out) of w
  const float* x;            // [tokens * heads, in] fp32 rows, row t * heads + h
  int64_t x_stride;          // elements between those rows
  int tokens;
  int heads = 1;             // per-head matvecs (one split only; FP8: w_head_rows % 128 == 0)
  int64_t w_head_rows = 0;
  int64_t y_head_stride = 0; // elements between heads in y
  DenseTcSplit split;
  void* scratch;             // dense_tc_act_bytes(tokens, in), 256-aligned
  float* y;                  // splits == 1: out [tokens, out]; else partial planes [splits][tokens][out]
  int64_t y_stride;          // elements per row of y
  int64_t y_split_stride;    // elements between partial planes (splits > 1)
};
// Enqueues prep (x -> 16-bit) and the matvec. With splits > 1 the caller sums the planes in order.
void dense_tc_launch(MoeFormat format, const DenseTcArgs& args, Stream stream);

}  // namespace mla::gpu
