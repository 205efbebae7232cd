// GPU MLA ops outside the attention kernels: the paged cache write (F32 or BF16 cache) and the two
// per-head absorption GEMMs (absorb_q, expand_v), plus the shared host-side checks. The exact GEMMs
// are plain fp32 FMA over weight tiles dequantized in registers (weight_at): at decode T is tiny, so
// they should be bound by reading kv_b_proj once, but the scalar FP8 dequantization held them to
// ~140 GB/s on the H200 (ncu: 72.6 + 48.0 us per DeepSeek layer, 16.8 MB). In GemmPrecision::Bf16
// quantized kv_b goes to the tensor-core matvec of gpu_decode_tc.cu instead: expand_v as per-head
// dense matvecs over W_UV's rows, absorb_q over W_UK^T, transposed per call into scratch (FP8 only:
// the 128 x 128 scale blocks transpose with it; an 8 MB copy, ~5x cheaper than the exact kernel).
#include <algorithm>
#include <optional>

#include "backend/gpu/gpu_decode_tc.h"
#include "backend/gpu/gpu_mla_common.cuh"
#include "backend/gpu/gpu_mla_state.h"

namespace mla::gpu {

// ---- host checks ---------------------------------------------------------------------------------
namespace {
void check_i32_vector(const TensorView& v, int64_t n, const char* op, const char* what) {
  MLA_CHECK(v.dtype == DType::I32 && v.ndim == 1 && v.dim(0) == n && (n == 0 || v.is_contiguous()),
            "{}: {} is {} (want contiguous I32[{}])", op, what, v.describe(), n);
  check_device_view(v, op, what);
}
}  // namespace

CacheView mla_cache_view(const TensorView& cache, const ops::AttentionBatch& batch, const ops::MlaDims& dims,
                         const char* op) {
  MLA_CHECK((cache.dtype == DType::F32 || cache.dtype == DType::BF16) && cache.ndim == 3 && cache.is_contiguous(),
            "{}: cache {} must be contiguous F32 or BF16 [blocks, block_size, kv_dim]", op, cache.describe());
  MLA_CHECK(cache.dim(1) == batch.block_size && batch.block_size > 0 && cache.dim(2) == dims.kv_dim(),
            "{}: cache {} vs block_size {} kv_dim {}", op, cache.describe(), batch.block_size, dims.kv_dim());
  check_device_view(cache, op, "cache");
  CacheView c;
  if (cache.dtype == DType::F32) c.f32 = cache.as<const float>(); else c.bf16 = cache.as<const uint16_t>();
  c.kv_dim = cache.dim(2);
  c.block_size = batch.block_size;
  return c;
}

BatchView mla_batch_view(const ops::AttentionBatch& batch, int64_t num_tokens, const char* op) {
  const int64_t seqs = batch.num_seqs;
  MLA_CHECK(seqs >= 0 && num_tokens >= 0 && num_tokens < (int64_t(1) << 31), "{}: {} sequences, {} tokens", op,
            seqs, num_tokens);
  check_i32_vector(batch.q_indptr, seqs + 1, op, "q_indptr");
  check_i32_vector(batch.kv_lens, seqs, op, "kv_lens");
  check_i32_vector(batch.block_indptr, seqs + 1, op, "block_indptr");
  MLA_CHECK(batch.block_ids.dtype == DType::I32 && batch.block_ids.ndim == 1 &&
                (batch.block_ids.dim(0) == 0 || batch.block_ids.is_contiguous()),
            "{}: block_ids {}", op, batch.block_ids.describe());
  BatchView b;
  b.q_indptr = batch.q_indptr.as<const int32_t>();
  b.kv_lens = batch.kv_lens.as<const int32_t>();
  b.block_indptr = batch.block_indptr.as<const int32_t>();
  b.block_ids = batch.block_ids.as<const int32_t>();
  b.num_seqs = int(seqs);
  b.block_size = batch.block_size;
  return b;
}

void mla_check_kv_b(const ops::Weight& kv_b_proj, const ops::MlaDims& dims, const char* op) {
  const Status st = ops::validate_weight(kv_b_proj);
  MLA_CHECK(st.is_ok(), "{}: kv_b_proj: {}", op, st.message());
  MLA_CHECK(dims.num_heads > 0 && dims.kv_lora_rank > 0 && dims.qk_nope_head_dim > 0 && dims.v_head_dim > 0 &&
                dims.qk_rope_head_dim >= 0,
            "{}: MlaDims: heads {} d_n {} d_r {} d_v {} r {}", op, dims.num_heads, dims.qk_nope_head_dim,
            dims.qk_rope_head_dim, dims.v_head_dim, dims.kv_lora_rank);
  MLA_CHECK(kv_b_proj.in_features == dims.kv_lora_rank &&
                kv_b_proj.out_features == int64_t(dims.num_heads) * (dims.qk_nope_head_dim + dims.v_head_dim),
            "{}: kv_b_proj [{}, {}] vs {} heads x ({} + {}) rows, rank {}", op, kv_b_proj.out_features,
            kv_b_proj.in_features, dims.num_heads, dims.qk_nope_head_dim, dims.v_head_dim, dims.kv_lora_rank);
}

void mla_check_heads(const TensorView& v, int64_t tokens, int64_t heads, int64_t d, const char* what) {
  MLA_CHECK(v.dtype == DType::F32 && v.ndim == 3 && v.inner_contiguous(), "{}: {} must be F32 [T, H, d], last dim "
            "contiguous", what, v.describe());
  MLA_CHECK(v.dim(0) == tokens && v.dim(1) == heads && v.dim(2) == d, "{}: {} (want [{}, {}, {}])", what,
            v.describe(), tokens, heads, d);
  check_device_view(v, what, "view");
}

// ---- kv_cache_write ------------------------------------------------------------------------------
namespace {

constexpr int kCopyThreads = 128;

// One block per token (grid.y splits long rows). Slots outside [0, num_slots) are skipped rather than
// trusted: the contents are device data the host cannot check without a sync (the CPU reference
// rejects them; a negative slot is the usual "padding token" marker elsewhere).
template <typename CacheT>
__global__ void kv_cache_write_kernel(const float* __restrict__ latent, int64_t latent_stride,
                                      const int32_t* __restrict__ slots, int64_t slot_stride, CacheT* __restrict__ cache,
                                      int64_t kv_dim, int64_t num_slots) {
  pdl_enter();  // launched with PDL (launch_maybe_pdl)
  const int64_t t = blockIdx.x;
  const int64_t slot = slots[t * slot_stride];
  if (slot < 0 || slot >= num_slots) return;
  const float* src = latent + t * latent_stride;
  CacheT* dst = cache + slot * kv_dim;
  for (int64_t c = int64_t(blockIdx.y) * blockDim.x + threadIdx.x; c < kv_dim; c += int64_t(gridDim.y) * blockDim.x) {
    if constexpr (sizeof(CacheT) == 2) dst[c] = f32_to_bf16_bits(src[c]);
    else dst[c] = src[c];
  }
}

}  // namespace

void GpuBackend::kv_cache_write(const TensorView& latent, const TensorView& slot_mapping, const TensorView& cache) {
  MLA_CHECK(latent.dtype == DType::F32 && latent.ndim == 2 && latent.inner_contiguous(),
            "kv_cache_write: latent {} must be F32 [T, kv_dim], rows contiguous", latent.describe());
  MLA_CHECK((cache.dtype == DType::F32 || cache.dtype == DType::BF16) && cache.ndim == 3 && cache.is_contiguous(),
            "kv_cache_write: cache {} must be contiguous F32 or BF16 [blocks, block_size, kv_dim]", cache.describe());
  const int64_t num_tokens = latent.dim(0), kv_dim = latent.dim(1);
  MLA_CHECK(cache.dim(2) == kv_dim, "kv_cache_write: latent {} vs cache {}", latent.describe(), cache.describe());
  MLA_CHECK(slot_mapping.dtype == DType::I32 && slot_mapping.ndim == 1 && slot_mapping.dim(0) == num_tokens,
            "kv_cache_write: slot_mapping {} (want I32[{}])", slot_mapping.describe(), num_tokens);
  check_device_view(latent, "kv_cache_write", "latent");
  check_device_view(cache, "kv_cache_write", "cache");
  check_device_view(slot_mapping, "kv_cache_write", "slot_mapping");
  if (num_tokens == 0 || kv_dim == 0) return;
  const int64_t num_slots = cache.dim(0) * cache.dim(1);
  // Up to 4 blocks per row (kv_dim 576 = 5 passes of 128 over 4 blocks): enough parallelism at T = 1.
  const int64_t row_blocks = std::min<int64_t>(4, (kv_dim + kCopyThreads - 1) / kCopyThreads);
  const dim3 grid{unsigned(num_tokens), unsigned(row_blocks)};
  if (cache.dtype == DType::F32)
    launch_maybe_pdl(kv_cache_write_kernel<float>, dim3(grid), dim3(kCopyThreads), 0, true, stream(),
        latent.as<const float>(), latent.stride[0], slot_mapping.as<const int32_t>(), slot_mapping.stride[0],
        cache.as<float>(), kv_dim, num_slots);
  else
    launch_maybe_pdl(kv_cache_write_kernel<uint16_t>, dim3(grid), dim3(kCopyThreads), 0, true, stream(),
        latent.as<const float>(), latent.stride[0], slot_mapping.as<const int32_t>(), slot_mapping.stride[0],
        cache.as<uint16_t>(), kv_dim, num_slots);
  MLA_GPU_LAUNCH_CHECK();
}

// ---- absorb_q / expand_v -------------------------------------------------------------------------
namespace {

constexpr int kGemmThreads = 128;  // a multiple of kWarpSize on both vendors
constexpr int kTokenTile = 8;      // tokens sharing each weight element read

// absorb_q: out[t, h, c] = sum_{d < d_n} q[t, h, d] W[h (d_n + d_v) + d, c], c < r.
// Grid (ceil(r / 128), H, ceil(T / 8)); thread = one column c, kTokenTile accumulators. The weight
// rows of W_UK[h] are read along c (coalesced), each element once per token tile. The sum runs over d
// in increasing order, as the CPU's axpy loop does.
// Napkin (DeepSeek-V3 decode, H=128, d_n=128, r=512, FP8): 8.4 MB of weight, 2 T x 8.4 M FLOPs: at
// 4.8 TB/s about 2 us; at T=8 still weight-bound (16 FLOP per weight byte).
__global__ void absorb_q_kernel(const float* __restrict__ q, int64_t q_s0, int64_t q_s1, DeviceWeight w, int d_n,
                                int d_v, int r, int num_tokens, float* __restrict__ out, int64_t o_s0, int64_t o_s1) {
  extern __shared__ float q_tile[];  // [kTokenTile][d_n]
  const int h = blockIdx.y, t0 = blockIdx.z * kTokenTile;
  const int tn = min(kTokenTile, num_tokens - t0);
  for (int i = threadIdx.x; i < kTokenTile * d_n; i += blockDim.x) {
    const int tt = i / d_n, d = i % d_n;
    q_tile[i] = tt < tn ? q[int64_t(t0 + tt) * q_s0 + int64_t(h) * q_s1 + d] : 0.0f;
  }
  __syncthreads();
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= r) return;
  float acc[kTokenTile];
#pragma unroll
  for (int tt = 0; tt < kTokenTile; ++tt) acc[tt] = 0.0f;
  const int64_t row0 = int64_t(h) * (d_n + d_v);
  for (int d = 0; d < d_n; ++d) {
    const float wv = weight_at(w, row0 + d, c);
#pragma unroll
    for (int tt = 0; tt < kTokenTile; ++tt) acc[tt] += q_tile[tt * d_n + d] * wv;
  }
#pragma unroll
  for (int tt = 0; tt < kTokenTile; ++tt)
    if (tt < tn) out[int64_t(t0 + tt) * o_s0 + int64_t(h) * o_s1 + c] = acc[tt];
}

// expand_v: out[t, h, v] = sum_{c < r} W[h (d_n + d_v) + d_n + v, c] o[t, h, c].
// Grid (ceil(d_v / kRowsPerBlock), H, ceil(T / 8)); one warp per output row v at a time, lanes stride
// over c (coalesced weight reads), kTokenTile accumulators per lane, warp_sum at the end.
// Napkin: as absorb_q (the same bytes of W_UV, r x d_v per head).
constexpr int kRowsPerBlock = 16;
__global__ void expand_v_kernel(const float* __restrict__ o, int64_t o_s0, int64_t o_s1, DeviceWeight w, int d_n,
                                int d_v, int r, int num_tokens, float* __restrict__ out, int64_t y_s0, int64_t y_s1) {
  extern __shared__ float o_tile[];  // [kTokenTile][r]
  const int h = blockIdx.y, t0 = blockIdx.z * kTokenTile;
  const int tn = min(kTokenTile, num_tokens - t0);
  for (int i = threadIdx.x; i < kTokenTile * r; i += blockDim.x) {
    const int tt = i / r, c = i % r;
    o_tile[i] = tt < tn ? o[int64_t(t0 + tt) * o_s0 + int64_t(h) * o_s1 + c] : 0.0f;
  }
  __syncthreads();
  const int lane = int(threadIdx.x) % kWarpSize, warp = int(threadIdx.x) / kWarpSize;
  const int warps = int(blockDim.x) / kWarpSize;
  const int v_end = min(d_v, int(blockIdx.x + 1) * kRowsPerBlock);
  for (int v = int(blockIdx.x) * kRowsPerBlock + warp; v < v_end; v += warps) {
    const int64_t row = int64_t(h) * (d_n + d_v) + d_n + v;
    float acc[kTokenTile];
#pragma unroll
    for (int tt = 0; tt < kTokenTile; ++tt) acc[tt] = 0.0f;
    for (int c = lane; c < r; c += kWarpSize) {
      const float wv = weight_at(w, row, c);
#pragma unroll
      for (int tt = 0; tt < kTokenTile; ++tt) acc[tt] += o_tile[tt * r + c] * wv;
    }
#pragma unroll
    for (int tt = 0; tt < kTokenTile; ++tt) {
      const float sum = warp_sum(acc[tt]);  // every lane takes part (no divergence around the shuffle)
      if (lane == 0 && tt < tn) out[int64_t(t0 + tt) * y_s0 + int64_t(h) * y_s1 + v] = sum;
    }
  }
}

// Dynamic shared memory above the 48 KB every device grants without opting in is not used here.
constexpr size_t kMaxDefaultSmem = 48 * 1024;

// W_UK^T of every head, for the tensor-core absorb_q: wt[h r + c][d] = W[h (d_n + d_v) + d][c]
// (FP8 bytes), one 32 x 32 tile per block through shared memory so reads and writes are coalesced.
constexpr int kTr = 32;
__global__ void transpose_uk_kernel(const uint8_t* __restrict__ w, int64_t w_stride, int d_n, int d_v, int r,
                                    uint8_t* __restrict__ wt) {
  __shared__ uint8_t tile[kTr][kTr + 1];
  const int h = blockIdx.z, c0 = blockIdx.x * kTr, d0 = blockIdx.y * kTr;
  const int tx = threadIdx.x, ty = threadIdx.y;  // 32 x 8 threads
  for (int i = ty; i < kTr; i += 8) {
    const int d = d0 + i, c = c0 + tx;
    if (d < d_n && c < r) tile[i][tx] = w[(int64_t(h) * (d_n + d_v) + d) * w_stride + c];
  }
  __syncthreads();
  for (int i = ty; i < kTr; i += 8) {
    const int c = c0 + i, d = d0 + tx;
    if (d < d_n && c < r) wt[(int64_t(h) * r + c) * d_n + d] = tile[tx][i];
  }
}

// Its scales: block (h r / 128 + rb, cb) of W_UK^T is block (h (d_n + d_v) / 128 + cb, rb) of W.
__global__ void transpose_uk_scale_kernel(const float* __restrict__ s, int64_t s_stride, int d_n, int d_v, int r,
                                          int heads, float* __restrict__ st) {
  const int rbs = r / 128, cbs = (d_n + 127) / 128;
  const int64_t total = int64_t(heads) * rbs * cbs;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t h = i / (rbs * cbs), rb = i / cbs % rbs, cb = i % cbs;
    st[i] = s[(h * (d_n + d_v) / 128 + cb) * s_stride + rb];
  }
}

// The tensor-core format of kv_b for this op, or nullopt: Bf16 mode on an sm_80+ CUDA device, FP8
// (both ops) or INT4 with BF16 scales (expand_v only), 16-byte rows, and head blocks that keep the
// FP8 128-row scale blocks whole.
std::optional<MoeFormat> absorb_tc_format(GpuBackend& be, const ops::Weight& kv_b, const ops::MlaDims& d,
                                          bool transposed) {
  if (be.options().gemm_precision != GemmPrecision::Bf16) return std::nullopt;
  MlaState& st = be.mla_state();
  if (st.tc_device < 0) st.tc_device = moe_tc_device_ok() ? 1 : 0;
  if (st.tc_device != 1) return std::nullopt;
  const DeviceWeight w = device_weight(kv_b);
  const int64_t dn = d.qk_nope_head_dim, dv = d.v_head_dim, r = d.kv_lora_rank;
  const bool aligned = reinterpret_cast<uintptr_t>(w.data) % 16 == 0;
  if (w.format == ops::WeightFormat::Fp8Block128) {
    const bool blocks = (dn + dv) % 128 == 0 && r % 128 == 0 && (transposed || dn % 128 == 0);
    const bool shape = transposed ? dense_tc_shape_ok(MoeFormat::FP8, dn, r) : dense_tc_shape_ok(MoeFormat::FP8, r, dv);
    if (aligned && blocks && shape && w.data_stride % 16 == 0) return MoeFormat::FP8;
  } else if (!transposed && w.format == ops::WeightFormat::Int4Group32 && w.scale_dtype == DType::BF16) {
    // expand_v reads head h's W_UV from row h (dn + dv) + dn: those rows' scales must stay 8-byte aligned.
    const bool scales = reinterpret_cast<uintptr_t>(w.scale) % 8 == 0 && w.scale_stride % 4 == 0;
    if (aligned && scales && dense_tc_shape_ok(MoeFormat::I4_BF16, r, dv) && (w.data_stride * 4) % 16 == 0)
      return MoeFormat::I4_BF16;
  }
  return std::nullopt;
}

// Per-head tensor-core matvecs out[t, h, :] = W_h x[t, h, :]: `w` holds head 0's matrix at row 0 and
// head h's at row h * head_rows. x and out are [T, H, *] views whose heads are adjacent
// (stride[0] == H * stride[1]); the caller checked it.
void run_heads_tc(GpuBackend& be, MoeFormat f, const DeviceWeight& w, int64_t head_rows, const TensorView& x,
                  const TensorView& out) {
  DenseTcArgs a;
  a.part[0].w = w;
  a.part[0].y = out.as<float>();
  a.part[0].y_stride = out.stride[0];
  a.x = x.as<const float>();
  a.x_stride = x.stride[1];
  a.tokens = int(x.dim(0));
  a.heads = int(x.dim(1));
  a.w_head_rows = head_rows;
  a.split = DenseTcSplit{1, w.in / (f == MoeFormat::FP8 ? 64 : 128)};
  a.y_head_stride = out.stride[1];
  dense_tc_launch(f, a, be.stream());
}

bool heads_adjacent(const TensorView& v) { return v.stride[0] == v.dim(1) * v.stride[1]; }

}  // namespace

void GpuBackend::mla_absorb_q(const TensorView& q_nope, const ops::Weight& kv_b_proj, const ops::MlaDims& dims,
                              const TensorView& out) {
  mla_check_kv_b(kv_b_proj, dims, "mla_absorb_q");
  const int64_t heads = dims.num_heads, d_n = dims.qk_nope_head_dim, rank = dims.kv_lora_rank;
  const int64_t num_tokens = q_nope.ndim == 3 ? q_nope.dim(0) : 0;
  mla_check_heads(q_nope, num_tokens, heads, d_n, "mla_absorb_q q_nope");
  mla_check_heads(out, num_tokens, heads, rank, "mla_absorb_q out");
  MLA_CHECK(q_nope.data != out.data, "mla_absorb_q: out aliases q_nope");
  if (num_tokens == 0) return;
  if (const auto f = absorb_tc_format(*this, kv_b_proj, dims, /*transposed=*/true);
      f && heads_adjacent(q_nope) && num_tokens * heads <= 65535) {
    // W_UK^T [H r, d_n] and its scales [H r / 128, ceil(d_n / 128)].
    const DeviceWeight w = device_weight(kv_b_proj);
    const int64_t cbs = (d_n + 127) / 128, dv = dims.v_head_dim;
    const size_t wt_bytes = (size_t(heads * rank * d_n) + 255) / 256 * 256;
    const size_t st_bytes = (size_t(heads * (rank / 128) * cbs) * sizeof(float) + 255) / 256 * 256;
    char* base = nullptr;
    // A placed weight's transpose is built once (outside capture) and kept: it cost ~20 us per
    // layer per decode step on the H200 (DeepSeek-V3, 128 heads) when rebuilt per call.
    const auto cached = mla_->uk_t.find(w.data);
    const bool keep = cached == mla_->uk_t.end() && !capturing() && is_placed(w.data);
    if (cached != mla_->uk_t.end()) base = static_cast<char*>(cached->second.data());
    else if (keep) base = static_cast<char*>(mla_->uk_t.emplace(w.data, alloc(wt_bytes + st_bytes)).first->second.data());
    else base = static_cast<char*>(mla_->tc_scratch.get(*this, wt_bytes + st_bytes));
    auto* wt = reinterpret_cast<uint8_t*>(base);
    auto* st = reinterpret_cast<float*>(base + wt_bytes);
    if (cached == mla_->uk_t.end()) {
      const dim3 tg(unsigned((rank + kTr - 1) / kTr), unsigned((d_n + kTr - 1) / kTr), unsigned(heads));
      transpose_uk_kernel<<<tg, dim3(kTr, 8), 0, stream()>>>(static_cast<const uint8_t*>(w.data), w.data_stride,
                                                             int(d_n), int(dv), int(rank), wt);
      MLA_GPU_LAUNCH_CHECK();
      const int64_t ns = heads * (rank / 128) * cbs;
      transpose_uk_scale_kernel<<<unsigned(std::min<int64_t>((ns + 255) / 256, 1024)), 256, 0, stream()>>>(
          static_cast<const float*>(w.scale), w.scale_stride, int(d_n), int(dv), int(rank), int(heads), st);
      MLA_GPU_LAUNCH_CHECK();
    }
    DeviceWeight wtw = w;
    wtw.out = rank;  // head 0's matrix; head h at row h r
    wtw.in = d_n;
    wtw.data = wt;
    wtw.data_stride = d_n;
    wtw.scale = st;
    wtw.scale_stride = cbs;
    run_heads_tc(*this, *f, wtw, rank, q_nope, out);
    return;
  }
  const size_t smem = size_t(kTokenTile * d_n) * sizeof(float);
  MLA_CHECK(smem <= kMaxDefaultSmem, "mla_absorb_q: d_n {} too large for the token tile", d_n);
  const dim3 grid(unsigned((rank + kGemmThreads - 1) / kGemmThreads), unsigned(heads),
                  unsigned((num_tokens + kTokenTile - 1) / kTokenTile));
  absorb_q_kernel<<<grid, kGemmThreads, smem, stream()>>>(
      q_nope.as<const float>(), q_nope.stride[0], q_nope.stride[1], device_weight(kv_b_proj), int(d_n),
      dims.v_head_dim, int(rank), int(num_tokens), out.as<float>(), out.stride[0], out.stride[1]);
  MLA_GPU_LAUNCH_CHECK();
}

void GpuBackend::mla_expand_v(const TensorView& o_latent, const ops::Weight& kv_b_proj, const ops::MlaDims& dims,
                              const TensorView& out) {
  mla_check_kv_b(kv_b_proj, dims, "mla_expand_v");
  const int64_t heads = dims.num_heads, d_v = dims.v_head_dim, rank = dims.kv_lora_rank;
  const int64_t num_tokens = o_latent.ndim == 3 ? o_latent.dim(0) : 0;
  mla_check_heads(o_latent, num_tokens, heads, rank, "mla_expand_v o_latent");
  mla_check_heads(out, num_tokens, heads, d_v, "mla_expand_v out");
  MLA_CHECK(o_latent.data != out.data, "mla_expand_v: out aliases o_latent");
  if (num_tokens == 0) return;
  if (const auto f = absorb_tc_format(*this, kv_b_proj, dims, /*transposed=*/false);
      f && heads_adjacent(o_latent) && num_tokens * heads <= 65535) {
    // Head h's W_UV is rows [h (d_n + d_v) + d_n, + d_v): start the view at row d_n (a whole FP8
    // scale block: d_n % 128 == 0 for FP8, checked; INT4 scales are per row).
    DeviceWeight w = device_weight(kv_b_proj);
    const int64_t dn = dims.qk_nope_head_dim;
    const bool fp8 = *f == MoeFormat::FP8;
    w.data = static_cast<const char*>(w.data) + dn * w.data_stride * (fp8 ? 1 : 4);
    w.scale = static_cast<const char*>(w.scale) +
              (fp8 ? (dn / 128) * w.scale_stride * int64_t(sizeof(float)) : dn * w.scale_stride * 2);
    w.out = d_v;
    run_heads_tc(*this, *f, w, dn + d_v, o_latent, out);
    return;
  }
  const size_t smem = size_t(kTokenTile * rank) * sizeof(float);
  MLA_CHECK(smem <= kMaxDefaultSmem, "mla_expand_v: rank {} too large for the token tile", rank);
  const dim3 grid(unsigned((d_v + kRowsPerBlock - 1) / kRowsPerBlock), unsigned(heads),
                  unsigned((num_tokens + kTokenTile - 1) / kTokenTile));
  expand_v_kernel<<<grid, kGemmThreads, smem, stream()>>>(
      o_latent.as<const float>(), o_latent.stride[0], o_latent.stride[1], device_weight(kv_b_proj),
      dims.qk_nope_head_dim, int(d_v), int(rank), int(num_tokens), out.as<float>(), out.stride[0], out.stride[1]);
  MLA_GPU_LAUNCH_CHECK();
}

}  // namespace mla::gpu
