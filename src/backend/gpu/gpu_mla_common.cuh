// Shared pieces of the GPU MLA kernels (gpu_mla*.cu): the host-side argument checks (the same rules
// as the CPU reference, src/backend/cpu/cpu_mla.cpp) and the device view of the paged latent cache,
// which is F32 or BF16; a cache row is always widened to fp32 before any arithmetic.
#pragma once

#include <cstdint>

#include "backend/gpu/gpu_backend_impl.h"

namespace mla::gpu {

// The device-side paged cache: row (block, offset) starts at element (block * block_size + offset) *
// kv_dim. Exactly one of f32 / bf16 is non-null.
struct CacheView {
  const float* f32 = nullptr;
  const uint16_t* bf16 = nullptr;
  int64_t kv_dim = 0;
  int block_size = 0;
};

__device__ __forceinline__ float cache_load(const CacheView& c, int64_t row, int64_t col) {
  const int64_t i = row * c.kv_dim + col;
  return c.f32 != nullptr ? c.f32[i] : bf16_bits_to_f32(c.bf16[i]);
}

// The device indptr arrays of an AttentionBatch (all contiguous I32).
struct BatchView {
  const int32_t* q_indptr = nullptr;      // [S+1]
  const int32_t* kv_lens = nullptr;       // [S]
  const int32_t* block_indptr = nullptr;  // [S+1]
  const int32_t* block_ids = nullptr;
  int num_seqs = 0;
  int block_size = 0;
};

// Cache slot of absolute position `pos` of sequence `s`.
__device__ __forceinline__ int64_t batch_slot(const BatchView& b, int s, int64_t pos) {
  const int32_t block = b.block_ids[b.block_indptr[s] + pos / b.block_size];
  return int64_t(block) * b.block_size + pos % b.block_size;
}

// The sequence owning query row t: the s with q_indptr[s] <= t < q_indptr[s+1] (binary search over the
// nondecreasing indptr; empty sequences are skipped because their range is empty). -1 if none.
__device__ __forceinline__ int batch_seq_of_row(const BatchView& b, int64_t t) {
  int lo = 0, hi = b.num_seqs;  // invariant: the answer, if any, is in [lo, hi)
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (b.q_indptr[mid] <= t) lo = mid; else hi = mid;
  }
  return (b.num_seqs > 0 && b.q_indptr[lo] <= t && t < b.q_indptr[lo + 1]) ? lo : -1;
}

// Host: checks the cache and the batch's shapes (not its contents: device data, read by kernels) and
// returns the two device views. Contents of the host mirrors are validated only by the prefill path.
CacheView mla_cache_view(const TensorView& cache, const ops::AttentionBatch& batch, const ops::MlaDims& dims,
                         const char* op);
BatchView mla_batch_view(const ops::AttentionBatch& batch, int64_t num_tokens, const char* op);
// Host: kv_b_proj against the head geometry (as the CPU's check_kv_b).
void mla_check_kv_b(const ops::Weight& kv_b_proj, const ops::MlaDims& dims, const char* op);
// Host: an F32 [T, H, d] view with contiguous last dim.
void mla_check_heads(const TensorView& v, int64_t tokens, int64_t heads, int64_t d, const char* what);

}  // namespace mla::gpu
