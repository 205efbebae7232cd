// Hopper (sm_90a) wgmma kernel for the absorbed MLA decode over a BF16 paged latent cache: 64 query
// heads per CTA as one wgmma M tile, Q and cache tiles in 128B-swizzled shared memory. It computes
// the attention part only; gpu_mla_decode_tc.cu owns the dispatch, split count, workspace format
// and the combine kernel, which this kernel's partials feed unchanged.
#pragma once

#include "backend/gpu/gpu_mla_decode_tc.h"

namespace mla::gpu {

constexpr int kMlaSm90aHeadTile = 64;  // query heads per CTA (= wgmma M)

// True on a device of compute capability exactly 9.0 (the sm_90a machine code runs nowhere else)
// when num_heads is a positive multiple of kMlaSm90aHeadTile and (kv_lora_rank, rope_dim) = (512,
// 64); always false on HIP builds.
bool mla_decode_sm90a_supported(int num_heads, int kv_lora_rank, int rope_dim);

// Launches the attention kernel on `stream` over num_splits KV splits (grid: num_heads / 64 x
// num_splits x num_tokens). A token whose context fills one split writes args.out; otherwise each
// used split writes its (O, m, l) partial into args.workspace in the layout of gpu_mla_decode_tc.cu
// ([splits, T, H, 512] then [splits, T, H, 2], m in log2 units) for that file's combine kernel.
// The caller (mla_decode_tc) has validated args; q_vec = q rows are 16-byte aligned (float4 loads).
void mla_decode_sm90a_attention(const MlaDecodeTcArgs& args, int num_splits, int q_vec, Stream stream);

}  // namespace mla::gpu
