// Absorbed MLA attention on the GPU (MQA over the latent cache): the dispatcher between the BF16
// tensor-core decode kernel (gpu_mla_decode_tc.h: a partial last head tile taken natively, or
// zero-padded for the wgmma kernel) and the generic fp32 split-KV kernel here, which takes any head
// count, F32 or BF16 cache and any q_len. The generic kernel trades speed for exactness: fp32 dots
// and an fp32 online softmax, ~1e-6 from the CPU.
#include "backend/gpu/gpu_mla.h"
#include "backend/gpu/gpu_mla_common.cuh"
#include "backend/gpu/gpu_mla_decode_sm90a.h"
#include "backend/gpu/gpu_mla_decode_tc.h"
#include "backend/gpu/gpu_mla_state.h"

namespace mla::gpu {

namespace {

constexpr int kAttnThreads = 128;  // a multiple of kWarpSize on both vendors
constexpr int kHeadGroup = 8;      // query heads sharing each key row read by a block
constexpr int kKeyTile = 32;       // key positions per online-softmax step
constexpr int kMaxSplits = 16;
// Split-KV aims for this many blocks in flight (about two per SM on an H200 or MI250). The split count
// depends only on T and H, never on kv_lens, so a captured graph stays valid while contexts grow.
constexpr int kTargetBlocks = 256;
constexpr float kNegInf = -__builtin_huge_valf();

int absorbed_num_splits(int64_t num_tokens, int64_t heads) {
  const int64_t base = num_tokens * ((heads + kHeadGroup - 1) / kHeadGroup);
  const int64_t splits = (kTargetBlocks + base - 1) / base;
  return int(splits < 1 ? 1 : (splits > kMaxSplits ? kMaxSplits : splits));
}

// Block (split, t, head group): query row t, heads [h0, h0 + 8), keys of split `split` of the row's
// visible range [0, pos]. Per key tile: warps score keys (lanes stride the row, one accumulator per
// head), threads 0..7 fold the tile into their head's running max / sum, then every thread updates
// its CPT columns of the 8 heads' accumulators. Values are the first r entries of the same rows
// (re-read from L1/L2, not from HBM).
// Napkin (H=128, T=1, ctx 4096, kv_dim 576, BF16): 16 head groups each read the 4.7 MB of rows, mostly
// from L2; 2 x 128 x 4096 x 1088 = 1.1 GFLOP of fp32 FMA, ~20 us of CUDA cores. The tensor-core path
// is the fast one; this is the exact one.
template <int CPT>
__global__ void __launch_bounds__(kAttnThreads)
absorbed_generic_kernel(const float* __restrict__ q, int64_t q_s0, int64_t q_s1, CacheView cache, BatchView batch,
                        int num_heads, int rank, float scale, int num_splits, int num_tokens, float* __restrict__ out,
                        int64_t o_s0, int64_t o_s1, float* __restrict__ part_acc, float* __restrict__ part_ml) {
  extern __shared__ int64_t smem_i64[];
  int64_t* slot_s = smem_i64;                                  // [kKeyTile] cache row of each key
  float* q_s = reinterpret_cast<float*>(slot_s + kKeyTile);    // [kHeadGroup][kv_dim]
  const int kv_dim = int(cache.kv_dim);
  float* p_s = q_s + kHeadGroup * kv_dim;                      // [kHeadGroup][kKeyTile] scores, then p
  float* corr_s = p_s + kHeadGroup * kKeyTile;                 // [kHeadGroup]
  float* stat_s = corr_s + kHeadGroup;                         // [kHeadGroup][2] final (m, l)

  const int split = blockIdx.x, tid = threadIdx.x;
  const int64_t t = blockIdx.y;
  const int h0 = int(blockIdx.z) * kHeadGroup, nh = min(kHeadGroup, num_heads - h0);
  const int s = batch_seq_of_row(batch, t);
  int64_t n_vis = 0;  // keys [0, pos] of this row; 0 only for a row outside every sequence (bad batch)
  if (s >= 0) {
    const int64_t q_len = batch.q_indptr[s + 1] - batch.q_indptr[s], i = t - batch.q_indptr[s];
    n_vis = max(int64_t(0), int64_t(batch.kv_lens[s]) - q_len + i + 1);
  }
  int64_t chunk = (n_vis + num_splits - 1) / num_splits;
  chunk = (chunk + kKeyTile - 1) / kKeyTile * kKeyTile;
  const int64_t begin = min(n_vis, int64_t(split) * chunk), end = min(n_vis, begin + chunk);

  for (int idx = tid; idx < kHeadGroup * kv_dim; idx += blockDim.x) {
    const int g = idx / kv_dim, c = idx % kv_dim;
    q_s[idx] = g < nh ? q[t * q_s0 + int64_t(h0 + g) * q_s1 + c] : 0.0f;
  }
  float acc[kHeadGroup][CPT];
#pragma unroll
  for (int g = 0; g < kHeadGroup; ++g)
#pragma unroll
    for (int k = 0; k < CPT; ++k) acc[g][k] = 0.0f;
  float m = kNegInf, l = 0.0f;  // running max / sum of head `tid` (threads tid < kHeadGroup only)
  const int lane = tid % kWarpSize, warp = tid / kWarpSize, warps = int(blockDim.x) / kWarpSize;

  for (int64_t j0 = begin; j0 < end; j0 += kKeyTile) {
    const int jn = int(min(int64_t(kKeyTile), end - j0));
    __syncthreads();  // the previous tile's slot_s / p_s readers are done (and q_s is written)
    for (int j = tid; j < jn; j += blockDim.x) slot_s[j] = batch_slot(batch, s, j0 + j);
    __syncthreads();
    for (int j = warp; j < jn; j += warps) {
      const int64_t row = slot_s[j];
      float dots[kHeadGroup];
#pragma unroll
      for (int g = 0; g < kHeadGroup; ++g) dots[g] = 0.0f;
      for (int c = lane; c < kv_dim; c += kWarpSize) {
        const float x = cache_load(cache, row, c);
#pragma unroll
        for (int g = 0; g < kHeadGroup; ++g) dots[g] += q_s[g * kv_dim + c] * x;
      }
#pragma unroll
      for (int g = 0; g < kHeadGroup; ++g) {
        const float d = warp_sum(dots[g]);
        if (lane == 0) p_s[g * kKeyTile + j] = scale * d;
      }
    }
    __syncthreads();
    if (tid < kHeadGroup) {
      float* ps = p_s + tid * kKeyTile;
      float mx = kNegInf;
      for (int j = 0; j < jn; ++j) mx = fmaxf(mx, ps[j]);
      const float m_new = fmaxf(m, mx);
      const float corr = expf(m - m_new);  // 0 on the first tile (m = -inf), where l and acc are 0
      float sum = 0.0f;
      for (int j = 0; j < jn; ++j) {
        const float p = expf(ps[j] - m_new);
        ps[j] = p;
        sum += p;
      }
      l = l * corr + sum;
      m = m_new;
      corr_s[tid] = corr;
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < CPT; ++k) {
      const int c = tid + k * kAttnThreads;
      if (c < rank) {
#pragma unroll
        for (int g = 0; g < kHeadGroup; ++g) acc[g][k] *= corr_s[g];
        for (int j = 0; j < jn; ++j) {
          const float x = cache_load(cache, slot_s[j], c);
#pragma unroll
          for (int g = 0; g < kHeadGroup; ++g) acc[g][k] += p_s[g * kKeyTile + j] * x;
        }
      }
    }
  }
  if (tid < kHeadGroup) {
    stat_s[2 * tid] = m;
    stat_s[2 * tid + 1] = l;
  }
  __syncthreads();
  // g runs to the compile-time group size so that acc stays in registers (a runtime index would
  // move it to local memory).
#pragma unroll
  for (int g = 0; g < kHeadGroup; ++g) {
    if (g >= nh) continue;
    const int64_t th = t * num_heads + h0 + g;
    if (num_splits == 1) {
      const float lg = stat_s[2 * g + 1];
      const float inv = lg > 0.0f ? 1.0f / lg : 0.0f;
      float* o = out + t * o_s0 + int64_t(h0 + g) * o_s1;
#pragma unroll
      for (int k = 0; k < CPT; ++k) {
        const int c = tid + k * kAttnThreads;
        if (c < rank) o[c] = acc[g][k] * inv;
      }
    } else {
      const int64_t part = int64_t(split) * num_tokens * num_heads + th;
#pragma unroll
      for (int k = 0; k < CPT; ++k) {
        const int c = tid + k * kAttnThreads;
        if (c < rank) part_acc[part * rank + c] = acc[g][k];
      }
      if (tid == 0) {
        part_ml[2 * part] = stat_s[2 * g];
        part_ml[2 * part + 1] = stat_s[2 * g + 1];
      }
    }
  }
}

// out[t, h] = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s with M = max_s m_s (empty splits have
// m_s = -inf, weight 0). One block per (t, h).
__global__ void absorbed_combine_kernel(const float* __restrict__ part_acc, const float* __restrict__ part_ml,
                                        int num_splits, int64_t rows, int num_heads, int rank,
                                        float* __restrict__ out, int64_t o_s0, int64_t o_s1) {
  const int64_t th = blockIdx.x;
  float w[kMaxSplits];
  float big = kNegInf;
  for (int sp = 0; sp < num_splits; ++sp) big = fmaxf(big, part_ml[2 * (sp * rows + th)]);
  float denom = 0.0f;
#pragma unroll
  for (int sp = 0; sp < kMaxSplits; ++sp) {  // unrolled to the constant bound: w stays in registers
    const float ms = sp < num_splits ? part_ml[2 * (sp * rows + th)] : kNegInf;
    w[sp] = ms == kNegInf ? 0.0f : expf(ms - big);
    if (sp < num_splits) denom += w[sp] * part_ml[2 * (sp * rows + th) + 1];
  }
  const float inv = denom > 0.0f ? 1.0f / denom : 0.0f;
  float* o = out + (th / num_heads) * o_s0 + (th % num_heads) * o_s1;
  for (int c = threadIdx.x; c < rank; c += blockDim.x) {
    float num = 0.0f;
#pragma unroll
    for (int sp = 0; sp < kMaxSplits; ++sp)
      if (sp < num_splits) num += w[sp] * part_acc[(sp * rows + th) * rank + c];
    o[c] = num * inv;
  }
}

// Heads [0, H) of q into a zeroed [T, Hp, kv_dim] copy (padded heads score 0 and are discarded).
__global__ void pad_heads_kernel(const float* __restrict__ q, int64_t q_s0, int64_t q_s1, int heads, int heads_padded,
                                 int kv_dim, float* __restrict__ q_pad) {
  const int64_t t = blockIdx.x / heads_padded;
  const int h = int(blockIdx.x % heads_padded);
  float* dst = q_pad + int64_t(blockIdx.x) * kv_dim;
  for (int c = threadIdx.x; c < kv_dim; c += blockDim.x) dst[c] = h < heads ? q[t * q_s0 + int64_t(h) * q_s1 + c] : 0.0f;
}

// out[t, h, :] = out_pad[t, h, :] for h < H (out strided).
__global__ void unpad_heads_kernel(const float* __restrict__ out_pad, int heads, int heads_padded, int rank,
                                   float* __restrict__ out, int64_t o_s0, int64_t o_s1) {
  const int64_t t = blockIdx.x / heads;
  const int h = int(blockIdx.x % heads);
  const float* src = out_pad + (t * heads_padded + h) * rank;
  float* dst = out + t * o_s0 + int64_t(h) * o_s1;
  for (int c = threadIdx.x; c < rank; c += blockDim.x) dst[c] = src[c];
}

constexpr size_t kAlign = 256;
size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

int64_t round_up_heads(int64_t heads, int64_t tile = kMlaTcHeadTile) { return (heads + tile - 1) / tile * tile; }

void run_generic(GpuBackend& be, const TensorView& q, const CacheView& cache, const BatchView& batch,
                 const ops::MlaDims& dims, const TensorView& out) {
  const int64_t num_tokens = q.dim(0), heads = dims.num_heads, rank = dims.kv_lora_rank;
  MLA_CHECK(num_tokens <= 65535, "mla_attention_absorbed: {} tokens (grid y holds at most 65535)", num_tokens);
  MLA_CHECK(rank <= 8 * kAttnThreads, "mla_attention_absorbed: kv_lora_rank {} above {}", rank, 8 * kAttnThreads);
  const size_t smem = kKeyTile * sizeof(int64_t) +
                      size_t(kHeadGroup * cache.kv_dim + kHeadGroup * kKeyTile + 3 * kHeadGroup) * sizeof(float);
  MLA_CHECK(smem <= 48 * 1024, "mla_attention_absorbed: kv_dim {} too large for the generic kernel", cache.kv_dim);
  const int splits = absorbed_num_splits(num_tokens, heads);
  float* part_acc = nullptr;
  float* part_ml = nullptr;
  if (splits > 1) {
    const size_t acc_bytes = align_up(size_t(splits * num_tokens * heads * rank) * sizeof(float));
    const size_t ml_bytes = size_t(splits * num_tokens * heads * 2) * sizeof(float);
    char* base = static_cast<char*>(be.mla_state().scratch.get(be, acc_bytes + ml_bytes));
    part_acc = reinterpret_cast<float*>(base);
    part_ml = reinterpret_cast<float*>(base + acc_bytes);
  }
  const dim3 grid(unsigned(splits), unsigned(num_tokens), unsigned((heads + kHeadGroup - 1) / kHeadGroup));
  const int cpt = int((rank + kAttnThreads - 1) / kAttnThreads);
#define MLA_GENERIC_LAUNCH(CPT)                                                                                    \
  absorbed_generic_kernel<CPT><<<grid, kAttnThreads, smem, be.stream()>>>(                                       \
      q.as<const float>(), q.stride[0], q.stride[1], cache, batch, int(heads), int(rank), dims.softmax_scale,      \
      splits, int(num_tokens), out.as<float>(), out.stride[0], out.stride[1], part_acc, part_ml)
  if (cpt <= 1) MLA_GENERIC_LAUNCH(1);
  else if (cpt <= 2) MLA_GENERIC_LAUNCH(2);
  else if (cpt <= 4) MLA_GENERIC_LAUNCH(4);
  else MLA_GENERIC_LAUNCH(8);
#undef MLA_GENERIC_LAUNCH
  MLA_GPU_LAUNCH_CHECK();
  if (splits > 1) {
    absorbed_combine_kernel<<<unsigned(num_tokens * heads), kAttnThreads, 0, be.stream()>>>(
        part_acc, part_ml, splits, num_tokens * heads, int(heads), int(rank), out.as<float>(), out.stride[0],
        out.stride[1]);
    MLA_GPU_LAUNCH_CHECK();
  }
}

void run_tensor_core(GpuBackend& be, const TensorView& q, const CacheView& cache, const BatchView& batch,
                     const ops::MlaDims& dims, const TensorView& out) {
  const int64_t num_tokens = q.dim(0), heads = dims.num_heads, rank = dims.kv_lora_rank;
  // The kernels compute whole tiles: 64 heads for a forced wgmma kernel, else 16 (Auto takes wgmma
  // where that count is a multiple of 64 on sm_90, e.g. 128 heads, else the mma.sync kernel). The
  // mma.sync kernel takes a partial last tile itself (heads_live: 12 or 8 heads per rank); for the
  // wgmma kernel, forced or possible, q is copied into a zero-padded tile and out sliced back.
  const MlaDecodeKernel kernel = be.mla_state().decode_kernel;
  const int64_t kv_dim = cache.kv_dim;
  const int64_t heads_padded =
      round_up_heads(heads, kernel == MlaDecodeKernel::Wgmma ? kMlaSm90aHeadTile : kMlaTcHeadTile);
  MlaDecodeTcArgs a;
  a.kernel = kernel;
  a.cache = cache.bf16;
  a.block_size = cache.block_size;
  a.q_indptr = batch.q_indptr;
  a.kv_lens = batch.kv_lens;
  a.block_indptr = batch.block_indptr;
  a.block_ids = batch.block_ids;
  a.num_seqs = batch.num_seqs;
  a.num_tokens = int(num_tokens);
  a.num_heads = int(heads_padded);
  a.kv_lora_rank = int(rank);
  a.rope_dim = dims.qk_rope_head_dim;
  a.softmax_scale = dims.softmax_scale;
  const bool partial = heads_padded != heads;
  const bool padded = partial && (kernel == MlaDecodeKernel::Wgmma ||
                                  (kernel == MlaDecodeKernel::Auto && heads_padded % kMlaSm90aHeadTile == 0));
  if (partial && !padded) a.heads_live = int(heads);
  if (padded) {
    a.q_row_stride = heads_padded * kv_dim;
    a.q_head_stride = kv_dim;
    a.out_row_stride = heads_padded * rank;
    a.out_head_stride = rank;
  } else {
    a.q_row_stride = q.stride[0];
    a.q_head_stride = q.stride[1];
    a.out_row_stride = out.stride[0];
    a.out_head_stride = out.stride[1];
  }
  // Layout of the group's scratch: [workspace | q_pad | out_pad]; sizes depend on shapes only.
  const size_t ws_bytes = align_up(mla_decode_tc_workspace_bytes(a));
  const size_t q_bytes = padded ? align_up(size_t(num_tokens * heads_padded * kv_dim) * sizeof(float)) : 0;
  const size_t o_bytes = padded ? size_t(num_tokens * heads_padded * rank) * sizeof(float) : 0;
  char* base = static_cast<char*>(be.mla_state().scratch.get(be, ws_bytes + q_bytes + o_bytes));
  a.workspace = base;
  a.merge = be.mla_state().decode_merge;
  a.tickets = be.mla_state().decode_tickets.get_as<unsigned>(be, size_t(num_tokens * (heads_padded / kMlaTcHeadTile)));
  if (padded) {
    float* q_pad = reinterpret_cast<float*>(base + ws_bytes);
    float* out_pad = reinterpret_cast<float*>(base + ws_bytes + q_bytes);
    pad_heads_kernel<<<unsigned(num_tokens * heads_padded), kAttnThreads, 0, be.stream()>>>(
        q.as<const float>(), q.stride[0], q.stride[1], int(heads), int(heads_padded), int(kv_dim), q_pad);
    MLA_GPU_LAUNCH_CHECK();
    a.q = q_pad;
    a.out = out_pad;
    mla_decode_tc(a, be.stream());
    unpad_heads_kernel<<<unsigned(num_tokens * heads), kAttnThreads, 0, be.stream()>>>(
        out_pad, int(heads), int(heads_padded), int(rank), out.as<float>(), out.stride[0], out.stride[1]);
    MLA_GPU_LAUNCH_CHECK();
  } else {
    a.q = q.as<const float>();
    a.out = out.as<float>();
    mla_decode_tc(a, be.stream());
  }
}

void absorbed_impl(GpuBackend& be, const TensorView& q, const TensorView& cache, const ops::AttentionBatch& batch,
                   const ops::MlaDims& dims, const TensorView& out, MlaAttnPath path) {
  const int64_t heads = dims.num_heads, rank = dims.kv_lora_rank, kv_dim = dims.kv_dim();
  MLA_CHECK(heads > 0 && rank > 0 && dims.qk_rope_head_dim >= 0, "MlaDims: heads {} r {} d_r {}", heads, rank,
            dims.qk_rope_head_dim);
  const int64_t num_tokens = q.ndim == 3 ? q.dim(0) : 0;
  mla_check_heads(q, num_tokens, heads, kv_dim, "mla_attention_absorbed q");
  mla_check_heads(out, num_tokens, heads, rank, "mla_attention_absorbed out");
  MLA_CHECK(q.data != out.data, "mla_attention_absorbed: out aliases q");
  const CacheView cv = mla_cache_view(cache, batch, dims, "mla_attention_absorbed");
  const BatchView bv = mla_batch_view(batch, num_tokens, "mla_attention_absorbed");
  if (num_tokens == 0) return;
  const bool tc_ok = mla_attention_uses_tensor_cores(cache.dtype, dims);
  if (path == MlaAttnPath::Auto) path = tc_ok ? MlaAttnPath::TensorCore : MlaAttnPath::Generic;
  if (path == MlaAttnPath::TensorCore) {
    MLA_CHECK(tc_ok, "mla_attention_absorbed: tensor-core path unsupported (cache {}, heads {}, r {}, d_r {})",
              dtype_name(cache.dtype), heads, rank, dims.qk_rope_head_dim);
    run_tensor_core(be, q, cv, bv, dims, out);
  } else {
    run_generic(be, q, cv, bv, dims, out);
  }
}

}  // namespace

bool mla_attention_uses_tensor_cores(DType cache_dtype, const ops::MlaDims& dims) {
  return cache_dtype == DType::BF16 &&
         mla_decode_tc_supported(int(round_up_heads(dims.num_heads)), dims.kv_lora_rank, dims.qk_rope_head_dim);
}

void mla_attention_absorbed_with_path(ops::Backend& backend, const TensorView& q, const TensorView& cache,
                                      const ops::AttentionBatch& batch, const ops::MlaDims& dims,
                                      const TensorView& out, MlaAttnPath path) {
  auto* gpu = dynamic_cast<GpuBackend*>(&backend);
  MLA_CHECK(gpu != nullptr, "mla_attention_absorbed_with_path: backend '{}' is not a GPU backend", backend.name());
  absorbed_impl(*gpu, q, cache, batch, dims, out, path);
}

void set_mla_decode_kernel(ops::Backend& gpu, MlaDecodeKernel kernel) {
  auto* backend = dynamic_cast<GpuBackend*>(&gpu);
  MLA_CHECK(backend != nullptr, "set_mla_decode_kernel: backend '{}' is not the GPU backend", gpu.name());
  backend->mla_state().decode_kernel = kernel;
}

void set_mla_decode_merge(ops::Backend& gpu, MlaDecodeMerge merge) {
  auto* backend = dynamic_cast<GpuBackend*>(&gpu);
  MLA_CHECK(backend != nullptr, "set_mla_decode_merge: backend '{}' is not the GPU backend", gpu.name());
  backend->mla_state().decode_merge = merge;
}

void GpuBackend::mla_attention_absorbed(const TensorView& q, const TensorView& cache, const ops::AttentionBatch& batch,
                                        const ops::MlaDims& dims, const TensorView& out) {
  absorbed_impl(*this, q, cache, batch, dims, out, MlaAttnPath::Auto);
}

}  // namespace mla::gpu
