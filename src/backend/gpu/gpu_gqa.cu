// GPU ops of Llama-style draft heads (EAGLE-3): the paged K/V cache write, grouped-query attention
// over it and the draft-vocabulary column scatter. Attention is one block per (query row, head) with
// an fp32 online softmax over key tiles: simple and exact (~1e-6 from the CPU), sized for a draft's
// decode work (few heads, one layer), not for long prefill; no split-KV and no tensor cores.
#include <algorithm>

#include "backend/gpu/gpu_mla_common.cuh"

namespace mla::gpu {

namespace {

constexpr int kThreads = 128;  // a multiple of kWarpSize on both vendors
constexpr int kKeyTile = 32;   // key positions per online-softmax step

void check_f32_rows(const TensorView& v, int64_t rows, int64_t width, const char* op, const char* what) {
  MLA_CHECK(v.dtype == DType::F32 && v.ndim == 2 && v.inner_contiguous(), "{}: {} {} must be F32 [rows, width], "
            "last dim contiguous", op, what, v.describe());
  MLA_CHECK(v.dim(0) == rows && v.dim(1) == width, "{}: {} {} (want [{}, {}])", op, what, v.describe(), rows, width);
  check_device_view(v, op, what);
}

void check_gqa_cache(const TensorView& cache, int64_t row_width, const char* op) {
  MLA_CHECK((cache.dtype == DType::F32 || cache.dtype == DType::BF16) && cache.ndim == 3 && cache.is_contiguous(),
            "{}: cache {} must be contiguous F32 or BF16 [blocks, block_size, 2*KVH*D]", op, cache.describe());
  MLA_CHECK(cache.dim(2) == row_width, "{}: cache {} rows are not 2*KVH*D = {}", op, cache.describe(), row_width);
  check_device_view(cache, op, "cache");
}

// One block per token; threads stride the 2 * width values of the row ([k | v]). Slots outside
// [0, num_slots) are skipped (device data the host cannot check without a sync; the CPU rejects them).
// bytes per token: 2 W (4 read + 2|4 write).
template <typename CacheT>
__global__ void gqa_cache_write_kernel(const float* __restrict__ k, int64_t k_stride, const float* __restrict__ v,
                                       int64_t v_stride, const int32_t* __restrict__ slots, int64_t slot_stride,
                                       CacheT* __restrict__ cache, int64_t width, int64_t num_slots) {
  const int64_t t = blockIdx.x;
  const int64_t slot = slots[t * slot_stride];
  if (slot < 0 || slot >= num_slots) return;
  CacheT* dst = cache + slot * 2 * width;
  for (int64_t c = threadIdx.x; c < 2 * width; c += blockDim.x) {
    const float x = c < width ? k[t * k_stride + c] : v[t * v_stride + (c - width)];
    if constexpr (sizeof(CacheT) == 2) dst[c] = f32_to_bf16_bits(x);
    else dst[c] = x;
  }
}

// Block (t, h): query row t, head h (kv head g = h / group) over the row's visible keys [0, pos].
// Per key tile: warps score keys (lanes stride D), thread 0 folds the tile into the running max / sum
// and turns scores into weights, then every thread updates its columns of the accumulator (shared).
// Napkin (draft decode: T=1, H=32, KVH=8, D=128, ctx 4096, BF16 cache): a block reads 2 x 4096 x 128
// x 2 B = 2 MB of its kv head (the 4 heads of a group share it through L2), 2 x 4096 x 128 x 2 FLOP;
// 32 blocks: latency-bound at ~10-20 us, fine beside the target step.
__global__ void __launch_bounds__(kThreads)
gqa_attention_kernel(const float* __restrict__ q, int64_t q_stride, CacheView cache, BatchView batch, int num_heads,
                     int group, int head_dim, int kv_width, float scale, float* __restrict__ out,
                     int64_t out_stride) {
  extern __shared__ int64_t smem_i64[];
  int64_t* slot_s = smem_i64;                                // [kKeyTile] cache row of each key
  float* q_s = reinterpret_cast<float*>(slot_s + kKeyTile);  // [D]
  float* acc_s = q_s + head_dim;                             // [D] running sum of p * v
  float* p_s = acc_s + head_dim;                             // [kKeyTile] scores, then weights
  float* stat_s = p_s + kKeyTile;                            // [0] correction of the tile, [1] final l

  const int tid = threadIdx.x;
  const int64_t t = blockIdx.x;
  const int h = blockIdx.y;
  const int64_t k_off = int64_t(h / group) * head_dim, v_off = kv_width + k_off;
  const int s = batch_seq_of_row(batch, t);
  int64_t n_vis = 0;  // keys [0, pos] of this row; 0 only for a row outside every sequence (bad batch)
  if (s >= 0) {
    const int64_t q_len = batch.q_indptr[s + 1] - batch.q_indptr[s], i = t - batch.q_indptr[s];
    n_vis = max(int64_t(0), int64_t(batch.kv_lens[s]) - q_len + i + 1);
  }
  for (int c = tid; c < head_dim; c += blockDim.x) {
    q_s[c] = q[t * q_stride + int64_t(h) * head_dim + c];
    acc_s[c] = 0.0f;
  }
  float m = -__builtin_huge_valf(), l = 0.0f;  // running max / sum (thread 0 only)
  const int lane = tid % kWarpSize, warp = tid / kWarpSize, warps = int(blockDim.x) / kWarpSize;

  for (int64_t j0 = 0; j0 < n_vis; j0 += kKeyTile) {
    const int jn = int(min(int64_t(kKeyTile), n_vis - j0));
    __syncthreads();  // the previous tile's readers of slot_s / p_s are done (first pass: q_s written)
    for (int j = tid; j < jn; j += blockDim.x) slot_s[j] = batch_slot(batch, s, j0 + j);
    __syncthreads();
    for (int j = warp; j < jn; j += warps) {
      float dot = 0.0f;
      for (int c = lane; c < head_dim; c += kWarpSize) dot += q_s[c] * cache_load(cache, slot_s[j], k_off + c);
      dot = warp_sum(dot);  // every lane of the warp takes part
      if (lane == 0) p_s[j] = scale * dot;
    }
    __syncthreads();
    if (tid == 0) {
      float mx = p_s[0];
      for (int j = 1; j < jn; ++j) mx = fmaxf(mx, p_s[j]);
      const float m_new = fmaxf(m, mx);
      const float corr = expf(m - m_new);  // 0 on the first tile (m = -inf), where l and acc are 0
      float sum = 0.0f;
      for (int j = 0; j < jn; ++j) {
        const float p = expf(p_s[j] - m_new);
        p_s[j] = p;
        sum += p;
      }
      l = l * corr + sum;
      m = m_new;
      stat_s[0] = corr;
    }
    __syncthreads();
    const float corr = stat_s[0];
    for (int c = tid; c < head_dim; c += blockDim.x) {
      float a = acc_s[c] * corr;
      for (int j = 0; j < jn; ++j) a += p_s[j] * cache_load(cache, slot_s[j], v_off + c);
      acc_s[c] = a;
    }
  }
  if (tid == 0) stat_s[1] = l;
  __syncthreads();
  // l > 0 for every row of a valid batch (position 0 is always visible); a bad row gets zeros.
  const float inv = stat_s[1] > 0.0f ? 1.0f / stat_s[1] : 0.0f;
  for (int c = tid; c < head_dim; c += blockDim.x) out[t * out_stride + int64_t(h) * head_dim + c] = acc_s[c] * inv;
}

// Grid (rows, column blocks): every column of row n = fill. bytes: 4 V per row.
__global__ void fill_rows_kernel(float* __restrict__ out, int64_t out_stride, int64_t cols, float fill) {
  float* o = out + int64_t(blockIdx.x) * out_stride;
  for (int64_t c = int64_t(blockIdx.y) * blockDim.x + threadIdx.x; c < cols; c += int64_t(gridDim.y) * blockDim.x)
    o[c] = fill;
}

// Grid (rows, column blocks of src): out[n, index[d]] = src[n, d]. Runs after fill_rows_kernel on the
// same stream. Indices outside [0, V) are skipped (device data; the CPU rejects them).
__global__ void scatter_columns_kernel(const float* __restrict__ src, int64_t src_stride,
                                       const int32_t* __restrict__ index, int64_t index_stride, int64_t width,
                                       float* __restrict__ out, int64_t out_stride, int64_t vocab) {
  const int64_t n = blockIdx.x;
  for (int64_t d = int64_t(blockIdx.y) * blockDim.x + threadIdx.x; d < width; d += int64_t(gridDim.y) * blockDim.x) {
    const int32_t col = index[d * index_stride];
    if (col >= 0 && col < vocab) out[n * out_stride + col] = src[n * src_stride + d];
  }
}

unsigned col_blocks(int64_t cols, int64_t cap) {
  return unsigned(std::clamp<int64_t>((cols + kThreads - 1) / kThreads, 1, cap));
}

}  // namespace

void GpuBackend::gqa_cache_write(const TensorView& k, const TensorView& v, const TensorView& slot_mapping,
                                 const TensorView& cache) {
  const int64_t num_tokens = k.ndim == 2 ? k.dim(0) : 0, width = k.ndim == 2 ? k.dim(1) : 0;
  check_f32_rows(k, num_tokens, width, "gqa_cache_write", "k");
  check_f32_rows(v, num_tokens, width, "gqa_cache_write", "v");
  check_gqa_cache(cache, 2 * width, "gqa_cache_write");
  MLA_CHECK(slot_mapping.dtype == DType::I32 && slot_mapping.ndim == 1 && slot_mapping.dim(0) == num_tokens,
            "gqa_cache_write: slot_mapping {} (want I32[{}])", slot_mapping.describe(), num_tokens);
  check_device_view(slot_mapping, "gqa_cache_write", "slot_mapping");
  MLA_CHECK(num_tokens < (int64_t(1) << 31), "gqa_cache_write: {} tokens exceed the grid", num_tokens);
  if (num_tokens == 0 || width == 0) return;
  const int64_t num_slots = cache.dim(0) * cache.dim(1);
  if (cache.dtype == DType::F32)
    gqa_cache_write_kernel<float><<<unsigned(num_tokens), kThreads, 0, stream()>>>(
        k.as<const float>(), k.stride[0], v.as<const float>(), v.stride[0], slot_mapping.as<const int32_t>(),
        slot_mapping.stride[0], cache.as<float>(), width, num_slots);
  else
    gqa_cache_write_kernel<uint16_t><<<unsigned(num_tokens), kThreads, 0, stream()>>>(
        k.as<const float>(), k.stride[0], v.as<const float>(), v.stride[0], slot_mapping.as<const int32_t>(),
        slot_mapping.stride[0], cache.as<uint16_t>(), width, num_slots);
  MLA_GPU_LAUNCH_CHECK();
}

void GpuBackend::gqa_attention(const TensorView& q, const TensorView& cache, const ops::AttentionBatch& batch,
                               const ops::GqaDims& dims, const TensorView& out) {
  const char* op = "gqa_attention";
  MLA_CHECK(dims.num_heads > 0 && dims.num_kv_heads > 0 && dims.head_dim > 0 &&
                dims.num_heads % dims.num_kv_heads == 0 && dims.num_heads <= 65535,
            "{}: GqaDims: heads {} kv heads {} head_dim {} (heads a multiple of kv heads, <= 65535)", op,
            dims.num_heads, dims.num_kv_heads, dims.head_dim);
  const int64_t width = int64_t(dims.num_heads) * dims.head_dim;
  const int64_t num_tokens = q.ndim == 2 ? q.dim(0) : 0;
  check_f32_rows(q, num_tokens, width, op, "q");
  check_f32_rows(out, num_tokens, width, op, "out");
  MLA_CHECK(q.data != out.data, "{}: out aliases q", op);
  check_gqa_cache(cache, dims.cache_row_width(), op);
  MLA_CHECK(batch.block_size > 0 && cache.dim(1) == batch.block_size, "{}: cache {} vs block_size {}", op,
            cache.describe(), batch.block_size);
  const BatchView b = mla_batch_view(batch, num_tokens, op);
  if (num_tokens == 0) return;
  CacheView c;
  if (cache.dtype == DType::F32) c.f32 = cache.as<const float>(); else c.bf16 = cache.as<const uint16_t>();
  c.kv_dim = cache.dim(2);
  c.block_size = batch.block_size;
  const size_t smem = kKeyTile * sizeof(int64_t) + (2 * size_t(dims.head_dim) + kKeyTile + 2) * sizeof(float);
  MLA_CHECK(smem <= 48 * 1024, "{}: head_dim {} too large for shared memory", op, dims.head_dim);
  const dim3 grid{unsigned(num_tokens), unsigned(dims.num_heads)};
  gqa_attention_kernel<<<grid, kThreads, smem, stream()>>>(
      q.as<const float>(), q.stride[0], c, b, dims.num_heads, dims.num_heads / dims.num_kv_heads, dims.head_dim,
      dims.num_kv_heads * dims.head_dim, dims.softmax_scale, out.as<float>(), out.stride[0]);
  MLA_GPU_LAUNCH_CHECK();
}

void GpuBackend::scatter_columns(const TensorView& src, const TensorView& index, float fill, const TensorView& out) {
  const char* op = "scatter_columns";
  const int64_t rows = src.ndim == 2 ? src.dim(0) : 0, width = src.ndim == 2 ? src.dim(1) : 0;
  check_f32_rows(src, rows, width, op, "src");
  MLA_CHECK(out.ndim == 2, "{}: out {} must be F32 [N, V]", op, out.describe());
  const int64_t vocab = out.dim(1);
  check_f32_rows(out, rows, vocab, op, "out");
  MLA_CHECK(index.dtype == DType::I32 && index.ndim == 1 && index.dim(0) == width,
            "{}: index {} (want I32[{}])", op, index.describe(), width);
  check_device_view(index, op, "index");
  MLA_CHECK(src.data != out.data, "{}: out aliases src", op);
  MLA_CHECK(rows < (int64_t(1) << 31), "{}: {} rows exceed the grid", op, rows);
  if (rows == 0 || vocab == 0) return;
  fill_rows_kernel<<<dim3(unsigned(rows), col_blocks(vocab, 64)), kThreads, 0, stream()>>>(out.as<float>(),
                                                                                          out.stride[0], vocab, fill);
  MLA_GPU_LAUNCH_CHECK();
  if (width == 0) return;
  scatter_columns_kernel<<<dim3(unsigned(rows), col_blocks(width, 64)), kThreads, 0, stream()>>>(
      src.as<const float>(), src.stride[0], index.as<const int32_t>(), index.stride[0], width, out.as<float>(),
      out.stride[0], vocab);
  MLA_GPU_LAUNCH_CHECK();
}

}  // namespace mla::gpu
