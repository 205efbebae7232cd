// Host-visible hooks of the GPU MLA ops that the op interface does not carry: which absorbed-attention
// kernel runs. Auto is what GpuBackend::mla_attention_absorbed does; tests force each path so that
// both stay covered whatever the dispatcher would pick (a fallback nobody tests is where crashes live).
#pragma once

#include "ops/backend.h"

namespace mla::gpu {

enum class MlaAttnPath {
  Auto,        // tensor cores when the cache is BF16 and the geometry is supported, else Generic
  Generic,     // fp32 split-KV kernel: any heads, F32 or BF16 cache, any q_len
  TensorCore,  // the BF16 tensor-core decode kernel (gpu_mla_decode_tc.h); fails when unsupported
};

// mla_attention_absorbed on `backend` (which must be a GPU backend) through `path`.
void mla_attention_absorbed_with_path(ops::Backend& backend, const TensorView& q, const TensorView& cache,
                                      const ops::AttentionBatch& batch, const ops::MlaDims& dims,
                                      const TensorView& out, MlaAttnPath path);

// True when Auto would take the tensor-core path for this cache dtype and geometry.
bool mla_attention_uses_tensor_cores(DType cache_dtype, const ops::MlaDims& dims);

}  // namespace mla::gpu
