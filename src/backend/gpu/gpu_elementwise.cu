// GPU elementwise and normalization ops: embedding (and the F32 row gather), RMSNorm with the fused
// residual add, strided copy and add, SiLU gating and RoPE (interleaved or rotate_half pairs). All
// are memory-bound single passes that keep the CPU reference's exact fp32 operation order (double
// row statistics, no FMA contraction where the CPU has none, precise expf/cosf/sinf). At decode
// sizes (one row) they are latency-bound, so each thread issues all of its loads before its first
// store or reduction (one memory round trip, not one per loop step); rows that allow 16-byte
// accesses take a register-resident RMSNorm, others the scalar two-pass kernel.
#include <algorithm>
#include <cmath>

#include "backend/gpu/gpu_backend_impl.h"

namespace mla::gpu {

namespace {

constexpr int kThreads = 256;  // a multiple of every kWarpSize (32, 64)
// rms_norm of a wide row (decode: one block per token, D = 7168) uses 1024 threads, so each thread
// has few loads in a row to wait on.
constexpr int kWideThreads = 1024, kWideRow = 2048;
constexpr int kMaxWarps = kWideThreads / kWarpSize;
// Register-resident rms_norm: each thread keeps up to kNormVec float4 chunks of its row (plus their
// weights) in registers, so a row is read once; 512 threads x kNormVec chunks cover D <= 16384.
constexpr int kNormVec = 8;
constexpr int kNormMaxThreads = 512;  // ~100 registers per thread: 512 is the most that fit a CTA
constexpr int kNormMaxWarps = kNormMaxThreads / kWarpSize;
constexpr int kEmbedPer = 4;          // embedding elements per thread (loads issued together)
constexpr int kRopePer = 4;           // rope (head, pair) elements per thread

__device__ __forceinline__ float quiet_nan() { return __int_as_float(0x7fc00000); }
__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(uint16_t bf16) { return bf16_bits_to_f32(bf16); }

// ---- host-side argument checks (mirror the CPU backend's, which are the specification) ----------
void check_rows(const TensorView& v, DType dtype, int ndim, const char* op, const char* what) {
  MLA_CHECK(v.dtype == dtype && v.ndim == ndim, "{}: {} is {} (want {} of rank {})", op, what, v.describe(),
            dtype_name(dtype), ndim);
  MLA_CHECK(v.inner_contiguous(), "{}: last dim of {} {} is strided", op, what, v.describe());
  check_device_view(v, op, what);
}

void check_vec(const TensorView& v, DType dtype, int64_t n, const char* op, const char* what) {
  MLA_CHECK(v.dtype == dtype && v.ndim == 1 && v.dim(0) == n, "{}: {} is {} (want {}[{}])", op, what,
            v.describe(), dtype_name(dtype), n);
  check_device_view(v, op, what);
}

// Shape and per-operand strides of an up-to-4-D elementwise op, padded with leading extent-1 dims.
struct Nd4 {
  int64_t n[kMaxDims];
  int64_t s[3][kMaxDims];  // strides of up to three operands, in elements
};

Nd4 make_nd4(const TensorView* const* views, int count) {
  Nd4 nd{};
  const int pad = kMaxDims - views[0]->ndim;
  for (int d = 0; d < kMaxDims; ++d) nd.n[d] = 1;
  for (int d = 0; d < views[0]->ndim; ++d) {
    nd.n[pad + d] = views[0]->dim(d);
    for (int k = 0; k < count; ++k) nd.s[k][pad + d] = views[k]->stride[size_t(d)];
  }
  return nd;
}

// Grid for a grid-stride loop over `total` elements (capped; the loop covers the rest).
unsigned flat_blocks(int64_t total) {
  const int64_t blocks = (total + kThreads - 1) / kThreads;
  return unsigned(blocks < (int64_t(1) << 20) ? blocks : (int64_t(1) << 20));
}

// ---- kernels -------------------------------------------------------------------------------------

// grid.x = token rows, grid.y = column blocks of kThreads * kEmbedPer. Each thread loads its
// kEmbedPer elements before storing any (a decode row of D = 7168 is then 7 CTAs and two dependent
// round trips: the id, then the row). bytes: 4 (id) + D * (2|4 read + 4 write) per row. The table
// is a weight or an activation other than out (the op does not allow them to overlap).
template <typename T>
__global__ void embedding_kernel(const int32_t* ids, int64_t ids_stride, const T* __restrict__ table,
                                 int64_t table_stride, int64_t vocab, int64_t d, float* __restrict__ out,
                                 int64_t out_stride) {
  pdl_enter();  // launched with PDL (launch_maybe_pdl)
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t * ids_stride];
  float* o = out + t * out_stride;
  const int64_t i0 = int64_t(blockIdx.y) * (int64_t(blockDim.x) * kEmbedPer) + threadIdx.x;
  if (id < 0 || id >= vocab) {
    // The CPU CHECKs the id; a device check would need a sync, so a bad id yields a NaN row that
    // poisons everything downstream visibly instead of reading out of bounds.
#pragma unroll
    for (int j = 0; j < kEmbedPer; ++j)
      if (i0 + j * int64_t(blockDim.x) < d) o[i0 + j * int64_t(blockDim.x)] = quiet_nan();
    return;
  }
  const T* row = table + int64_t(id) * table_stride;
  float v[kEmbedPer];
#pragma unroll
  for (int j = 0; j < kEmbedPer; ++j) {
    const int64_t i = i0 + j * int64_t(blockDim.x);
    v[j] = i < d ? to_f32(row[i]) : 0.0f;
  }
#pragma unroll
  for (int j = 0; j < kEmbedPer; ++j) {
    const int64_t i = i0 + j * int64_t(blockDim.x);
    if (i < d) o[i] = v[j];
  }
}

// General rms_norm (any D, strides and alignment): one block per row, pass 1 (optionally
// residual += x, stored) accumulates sum(x^2) in double, pass 2 writes w * (x * inv_rms). Each thread
// touches the same indices in both passes, so out may alias x (or residual). bytes per row: D * (4 + 4) (+ D * 8 with the residual), FLOPs ~ 4 D.
template <bool kAdd, typename W>
__global__ void __launch_bounds__(kWideThreads) rms_norm_kernel(const float* x, int64_t x_stride, float* residual, int64_t res_stride,
                                const W* weight, int64_t w_stride, float eps, int64_t d, float* out,
                                int64_t out_stride) {
  __shared__ double smem[kMaxWarps];
  pdl_enter();  // launched with PDL (launch_maybe_pdl)
  const int64_t t = blockIdx.x;
  const float* xr = x + t * x_stride;
  float* res = kAdd ? residual + t * res_stride : nullptr;
  float* o = out + t * out_stride;
  double sum_sq = 0.0;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    float v = xr[i];
    if constexpr (kAdd) {
      v = res[i] + v;
      res[i] = v;
    }
    sum_sq += double(v) * double(v);
  }
  sum_sq = block_sum_f64(sum_sq, smem);
  // Same rounding points as the CPU: the mean in double, rounded once to fp32; IEEE sqrt and divide.
  const float variance = float(sum_sq / double(d));
  const float inv_rms = 1.0f / sqrtf(variance + eps);
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    const float v = kAdd ? res[i] : xr[i];
    o[i] = to_f32(weight[i * w_stride]) * (v * inv_rms);
  }
}

// Four weights w[4c .. 4c + 3] as fp32 (F32: one 16-byte load; BF16: one 8-byte load).
__device__ __forceinline__ float4 load_w4(const float* w, int c) { return reinterpret_cast<const float4*>(w)[c]; }
__device__ __forceinline__ float4 load_w4(const uint16_t* w, int c) {
  const uint2 u = reinterpret_cast<const uint2*>(w)[c];  // little-endian: element 4c is u.x's low half
  return make_float4(bf16_bits_to_f32(uint16_t(u.x & 0xffffu)), bf16_bits_to_f32(uint16_t(u.x >> 16)),
                     bf16_bits_to_f32(uint16_t(u.y & 0xffffu)), bf16_bits_to_f32(uint16_t(u.y >> 16)));
}

// Register-resident rms_norm of rows of D = 4 * d4 floats, one block per row. Chunk c (4 floats) of
// the row belongs to thread c % blockDim.x, slot c / blockDim.x < kNormVec. Each thread issues every
// load (x, residual, weights) before its first store or add, so a row costs one memory round trip;
// the double sum of squares takes one barrier (warp shuffles, one shared exchange, then every thread
// adds the warp totals in warp order: deterministic). Same rounding points as the CPU: the mean in
// double rounded once to fp32, IEEE sqrt and divide, w * (x * inv_rms) unfused.
// A thread writes only the chunks it read, after reading them, so out may alias x or residual.
// Decode, D = 7168: 224 threads x 8 chunks; bytes 28 KB read (+28 KB residual read and write)
// + 14 KB bf16 weights + 28 KB written; FLOPs ~ 4 D.
// Preconditions: rows and weight 16-byte (F32) / 8-byte (BF16) aligned, d4 <= blockDim.x * kNormVec.
template <bool kAdd, typename W>
__global__ void __launch_bounds__(kNormMaxThreads)
    rms_norm_vec_kernel(const float* x, int64_t x_stride, float* residual, int64_t res_stride, const W* weight,
                        float eps, int d4, float* out, int64_t out_stride) {
  __shared__ double warp_sum_sq[kNormMaxWarps];
  pdl_enter();  // launched with PDL (launch_maybe_pdl)
  const int tid = int(threadIdx.x), nt = int(blockDim.x);
  const int64_t t = blockIdx.x;
  const float4* xr = reinterpret_cast<const float4*>(x + t * x_stride);
  float4* res = kAdd ? reinterpret_cast<float4*>(residual + t * res_stride) : nullptr;
  float4* o = reinterpret_cast<float4*>(out + t * out_stride);
  float4 v[kNormVec], w[kNormVec];
  // All loads first (x, weights, residual): no store sits between them, so none waits for another.
#pragma unroll
  for (int j = 0; j < kNormVec; ++j)
    v[j] = tid + j * nt < d4 ? xr[tid + j * nt] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
  for (int j = 0; j < kNormVec; ++j)
    w[j] = tid + j * nt < d4 ? load_w4(weight, tid + j * nt) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if constexpr (kAdd) {
    float4 r[kNormVec];
#pragma unroll
    for (int j = 0; j < kNormVec; ++j)
      r[j] = tid + j * nt < d4 ? res[tid + j * nt] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int j = 0; j < kNormVec; ++j)
      if (tid + j * nt < d4) {
        v[j] = make_float4(r[j].x + v[j].x, r[j].y + v[j].y, r[j].z + v[j].z, r[j].w + v[j].w);
        res[tid + j * nt] = v[j];
      }
  }
  // Four independent accumulators (one per lane of the float4) keep the double FMA chain short.
  double acc[4] = {0.0, 0.0, 0.0, 0.0};
#pragma unroll
  for (int j = 0; j < kNormVec; ++j)
    if (tid + j * nt < d4) {
      acc[0] += double(v[j].x) * double(v[j].x);
      acc[1] += double(v[j].y) * double(v[j].y);
      acc[2] += double(v[j].z) * double(v[j].z);
      acc[3] += double(v[j].w) * double(v[j].w);
    }
  double sum_sq = (acc[0] + acc[1]) + (acc[2] + acc[3]);
  for (int m = kWarpSize / 2; m > 0; m /= 2) sum_sq += shfl_xor(sum_sq, m);
  const int warps = (nt + kWarpSize - 1) / kWarpSize;
  if (tid % kWarpSize == 0) warp_sum_sq[tid / kWarpSize] = sum_sq;
  __syncthreads();
  sum_sq = 0.0;
  for (int k = 0; k < warps; ++k) sum_sq += warp_sum_sq[k];  // fixed order: deterministic
  const float variance = float(sum_sq / double(4 * int64_t(d4)));
  const float inv_rms = 1.0f / sqrtf(variance + eps);
#pragma unroll
  for (int j = 0; j < kNormVec; ++j)
    if (tid + j * nt < d4)
      o[tid + j * nt] = make_float4(w[j].x * (v[j].x * inv_rms), w[j].y * (v[j].y * inv_rms),
                                    w[j].z * (v[j].z * inv_rms), w[j].w * (v[j].w * inv_rms));
}

// Flat grid-stride loop over up to 4-D operands; Index is uint32_t when the element count allows it
// (64-bit division is several times slower). Each element is read and written by one thread, so
// identical in/out views are safe.
template <typename Index>
__device__ __forceinline__ void nd4_offsets(const Nd4& nd, int64_t k, int64_t* off, int count) {
  Index r = Index(k);
  const Index i3 = r % Index(nd.n[3]);
  r /= Index(nd.n[3]);
  const Index i2 = r % Index(nd.n[2]);
  r /= Index(nd.n[2]);
  const Index i1 = r % Index(nd.n[1]);
  const Index i0 = r / Index(nd.n[1]);
  for (int j = 0; j < count; ++j)
    off[j] = int64_t(i0) * nd.s[j][0] + int64_t(i1) * nd.s[j][1] + int64_t(i2) * nd.s[j][2] + int64_t(i3) * nd.s[j][3];
}

// copy: operand 0 = src, 1 = dst. bytes: 8 per element.
template <typename Index>
__global__ void copy_kernel(const uint32_t* src, uint32_t* dst, Nd4 nd, int64_t total) {  // F32 or I32 bits
  pdl_enter();  // launched with PDL (launch_maybe_pdl)
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < total; k += int64_t(gridDim.x) * blockDim.x) {
    int64_t off[2];
    nd4_offsets<Index>(nd, k, off, 2);
    dst[off[1]] = src[off[0]];
  }
}

// add: operands a, b, out. bytes: 12 per element.
template <typename Index>
__global__ void add_kernel(const float* a, const float* b, float* out, Nd4 nd, int64_t total) {
  pdl_enter();  // launched with PDL (launch_maybe_pdl)
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < total; k += int64_t(gridDim.x) * blockDim.x) {
    int64_t off[3];
    nd4_offsets<Index>(nd, k, off, 3);
    out[off[2]] = a[off[0]] + b[off[1]];
  }
}

// grid.x = rows, grid.y splits a row's columns (a decode step has one row of I = 18432 at most, which
// one block would walk serially). bytes: 12 per element; out may alias gate (same-index read, write).
__global__ void silu_mul_kernel(const float* gate, int64_t g_stride, const float* up, int64_t u_stride, float* out,
                                int64_t o_stride, int64_t d) {
  pdl_enter();  // launched with PDL (launch_maybe_pdl)
  const int64_t t = blockIdx.x;
  const float* g = gate + t * g_stride;
  const float* u = up + t * u_stride;
  float* o = out + t * o_stride;
  for (int64_t i = int64_t(blockIdx.y) * blockDim.x + threadIdx.x; i < d; i += int64_t(gridDim.y) * blockDim.x) {
    const float gv = g[i];
    // silu(g) = g / (1 + exp(-g)); for g -> -inf the quotient is -0, as on the CPU and in torch.
    o[i] = gv / (1.0f + expf(-gv)) * u[i];
  }
}

// grid.x = tokens, grid.y = blocks of kThreads * kRopePer (head, pair) elements of a token. Each
// thread loads its kRopePer pairs first; meanwhile the first `pairs` threads compute cos/sin (precise
// cosf/sinf of the fp32 angle, as the CPU) into shared memory, which every block of the token redoes
// (pairs sincos, cheap next to a memory round trip). One barrier, then rotate and store. Explicit _rn
// intrinsics keep nvcc from fusing x0*c - x1*s into an FMA, which the CPU reference (no FMA) does not
// do. Decode, 128 heads x 32 pairs: 4 CTAs, one round trip; bytes 16 per pair (read + write).
__global__ void __launch_bounds__(kThreads)
    rope_kernel(float* x, int64_t t_stride, int64_t h_stride, int heads, int pairs, const int32_t* positions,
                int64_t pos_stride, const float* inv_freq, int64_t freq_stride, float factor, bool interleaved) {
  extern __shared__ float cos_sin[];  // [pairs] cos then [pairs] sin
  pdl_enter();  // launched with PDL (launch_maybe_pdl)
  const int64_t t = blockIdx.x;
  float* row = x + t * t_stride;
  const int total = heads * pairs;
  const int k0 = int(blockIdx.y) * (kThreads * kRopePer) + int(threadIdx.x);
  const int64_t partner = interleaved ? 1 : pairs;  // b = a + partner
  float x0[kRopePer], x1[kRopePer];
  int64_t off[kRopePer];
#pragma unroll
  for (int j = 0; j < kRopePer; ++j) {
    const int k = k0 + j * kThreads;
    off[j] = 0;
    x0[j] = x1[j] = 0.0f;
    if (k < total) {
      // Pair i: (2i, 2i+1) interleaved, (i, i + pairs) rotate_half. Each (h, i) is one thread's.
      const int h = k / pairs, i = k - h * pairs;
      off[j] = int64_t(h) * h_stride + (interleaved ? 2 * i : i);
      x0[j] = row[off[j]];
      x1[j] = row[off[j] + partner];
    }
  }
  if (int(threadIdx.x) < pairs) {
    const int32_t pos = positions[t * pos_stride];
    for (int i = threadIdx.x; i < pairs; i += blockDim.x) {
      const float angle = __fmul_rn(float(pos), inv_freq[i * freq_stride]);
      cos_sin[i] = cosf(angle) * factor;
      cos_sin[pairs + i] = sinf(angle) * factor;
    }
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < kRopePer; ++j) {
    const int k = k0 + j * kThreads;
    if (k < total) {
      const int i = k - (k / pairs) * pairs;
      const float c = cos_sin[i], s = cos_sin[pairs + i];
      row[off[j]] = __fsub_rn(__fmul_rn(x0[j], c), __fmul_rn(x1[j], s));
      row[off[j] + partner] = __fadd_rn(__fmul_rn(x1[j], c), __fmul_rn(x0[j], s));
    }
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The register-resident kernel when every row and the weight allow vector accesses and the row fits
// kNormMaxThreads * kNormVec chunks; else the general two-pass kernel.
template <bool kAdd>
void launch_rms_norm(Stream stream, const TensorView& x, float* residual, int64_t res_stride, const TensorView& weight,
                     float eps, const TensorView& out) {
  const int64_t rows = x.dim(0), d = x.dim(1);
  if (rows == 0) return;
  const float* xp = x.as<const float>();
  const int64_t d4 = d / 4;
  const bool w_ok = weight.stride[0] == 1 &&
                    reinterpret_cast<uintptr_t>(weight.data) % (weight.dtype == DType::F32 ? 16 : 8) == 0;
  const bool vec = d % 4 == 0 && d4 > 0 && d4 <= int64_t(kNormMaxThreads) * kNormVec && w_ok && aligned16(xp) &&
                   x.stride[0] % 4 == 0 && aligned16(out.data) && out.stride[0] % 4 == 0 &&
                   (!kAdd || (aligned16(residual) && res_stride % 4 == 0));
  if (vec) {
    // About kNormVec chunks per thread, whole warps: D = 7168 -> 224 threads, 1536 -> 64, 512 -> 32.
    const int64_t per = (d4 + kNormVec - 1) / kNormVec;
    const int threads = int(std::min<int64_t>((per + kWarpSize - 1) / kWarpSize * kWarpSize, kNormMaxThreads));
    if (weight.dtype == DType::F32) {
      launch_maybe_pdl(rms_norm_vec_kernel<kAdd, float>, dim3(unsigned(rows)), dim3(threads), 0, true, stream,
          xp, x.stride[0], residual, res_stride, weight.as<const float>(), eps, int(d4), out.as<float>(),
          out.stride[0]);
    } else {
      launch_maybe_pdl(rms_norm_vec_kernel<kAdd, uint16_t>, dim3(unsigned(rows)), dim3(threads), 0, true, stream,
          xp, x.stride[0], residual, res_stride, weight.as<const uint16_t>(), eps, int(d4), out.as<float>(),
          out.stride[0]);
    }
    MLA_GPU_LAUNCH_CHECK();
    return;
  }
  const int threads = d >= kWideRow ? kWideThreads : kThreads;
  if (weight.dtype == DType::F32) {
    launch_maybe_pdl(rms_norm_kernel<kAdd, float>, dim3(unsigned(rows)), dim3(threads), 0, true, stream,
        xp, x.stride[0], residual, res_stride, weight.as<const float>(), weight.stride[0], eps, d, out.as<float>(),
        out.stride[0]);
  } else {
    launch_maybe_pdl(rms_norm_kernel<kAdd, uint16_t>, dim3(unsigned(rows)), dim3(threads), 0, true, stream,
        xp, x.stride[0], residual, res_stride, weight.as<const uint16_t>(), weight.stride[0], eps, d,
        out.as<float>(), out.stride[0]);
  }
  MLA_GPU_LAUNCH_CHECK();
}

void check_norm_weight(const TensorView& weight, int64_t d, const char* op) {
  MLA_CHECK(weight.dtype == DType::F32 || weight.dtype == DType::BF16, "{}: weight {} is not F32/BF16", op,
            weight.describe());
  MLA_CHECK(weight.ndim == 1 && weight.dim(0) == d, "{}: weight {} does not match D={}", op, weight.describe(), d);
  check_device_view(weight, op, "weight");
}

// Rows go on grid.x (limit 2^31 - 1): more than any step's token count.
void check_grid_rows(int64_t rows, const char* op) {
  MLA_CHECK(rows < (int64_t(1) << 31), "{}: {} rows exceed the grid", op, rows);
}

}  // namespace

void GpuBackend::embedding(const TensorView& ids, const TensorView& table, const TensorView& out) {
  check_rows(out, DType::F32, 2, "embedding", "out");
  const int64_t num_tokens = out.dim(0), d = out.dim(1);
  check_vec(ids, DType::I32, num_tokens, "embedding", "ids");
  MLA_CHECK(table.dtype == DType::F32 || table.dtype == DType::BF16, "embedding: table {} is not F32/BF16",
            table.describe());
  MLA_CHECK(table.ndim == 2 && table.dim(1) == d && table.inner_contiguous(), "embedding: table {} vs out {}",
            table.describe(), out.describe());
  check_device_view(table, "embedding", "table");
  check_grid_rows(num_tokens, "embedding");
  if (num_tokens == 0) return;
  // Ids are not range-checked here (that needs the ids on the host): an id outside [0, V) gives a
  // NaN row (see embedding_kernel).
  const int64_t col_blocks = (d + kThreads * kEmbedPer - 1) / (kThreads * kEmbedPer);
  if (col_blocks == 0) return;
  MLA_CHECK(col_blocks <= 65535, "embedding: D={} too wide", d);
  const dim3 grid(static_cast<unsigned>(num_tokens), static_cast<unsigned>(col_blocks));
  if (table.dtype == DType::F32) {
    launch_maybe_pdl(embedding_kernel<float>, dim3(grid), dim3(kThreads), 0, true, stream(),
        ids.as<const int32_t>(), ids.stride[0], table.as<const float>(), table.stride[0], table.dim(0), d,
        out.as<float>(), out.stride[0]);
  } else {
    launch_maybe_pdl(embedding_kernel<uint16_t>, dim3(grid), dim3(kThreads), 0, true, stream(),
        ids.as<const int32_t>(), ids.stride[0], table.as<const uint16_t>(), table.stride[0], table.dim(0), d,
        out.as<float>(), out.stride[0]);
  }
  MLA_GPU_LAUNCH_CHECK();
}

void GpuBackend::rms_norm(const TensorView& x, const TensorView& weight, float eps, const TensorView& out) {
  check_rows(x, DType::F32, 2, "rms_norm", "x");
  check_rows(out, DType::F32, 2, "rms_norm", "out");
  MLA_CHECK(same_shape(x, out), "rms_norm: x {} vs out {}", x.describe(), out.describe());
  check_norm_weight(weight, x.dim(1), "rms_norm");
  check_grid_rows(x.dim(0), "rms_norm");
  launch_rms_norm<false>(stream(), x, nullptr, 0, weight, eps, out);
}

void GpuBackend::add_rms_norm(const TensorView& residual, const TensorView& x, const TensorView& weight, float eps,
                              const TensorView& out) {
  check_rows(residual, DType::F32, 2, "add_rms_norm", "residual");
  check_rows(x, DType::F32, 2, "add_rms_norm", "x");
  check_rows(out, DType::F32, 2, "add_rms_norm", "out");
  MLA_CHECK(same_shape(residual, x) && same_shape(x, out), "add_rms_norm: residual {} x {} out {}",
            residual.describe(), x.describe(), out.describe());
  check_norm_weight(weight, x.dim(1), "add_rms_norm");
  check_grid_rows(x.dim(0), "add_rms_norm");
  launch_rms_norm<true>(stream(), x, residual.as<float>(), residual.stride[0], weight, eps, out);
}

void GpuBackend::copy(const TensorView& src, const TensorView& dst) {
  MLA_CHECK((src.dtype == DType::F32 || src.dtype == DType::I32) && dst.dtype == src.dtype &&
                src.ndim == dst.ndim && src.ndim <= kMaxDims,
            "copy: {} -> {}", src.describe(), dst.describe());
  for (int d = 0; d < src.ndim; ++d)
    MLA_CHECK(src.dim(d) == dst.dim(d), "copy: {} -> {}", src.describe(), dst.describe());
  check_device_view(src, "copy", "src");
  check_device_view(dst, "copy", "dst");
  const int64_t total = src.numel();
  if (total == 0) return;
  const TensorView* views[] = {&src, &dst};
  const Nd4 nd = make_nd4(views, 2);
  if (total <= int64_t(UINT32_MAX)) {
    launch_maybe_pdl(copy_kernel<uint32_t>, dim3(flat_blocks(total)), dim3(kThreads), 0, true, stream(),
                     static_cast<const uint32_t*>(src.data), static_cast<uint32_t*>(dst.data), nd, total);
  } else {
    launch_maybe_pdl(copy_kernel<uint64_t>, dim3(flat_blocks(total)), dim3(kThreads), 0, true, stream(),
                     static_cast<const uint32_t*>(src.data), static_cast<uint32_t*>(dst.data), nd, total);
  }
  MLA_GPU_LAUNCH_CHECK();
}

void GpuBackend::add(const TensorView& a, const TensorView& b, const TensorView& out) {
  MLA_CHECK(a.dtype == DType::F32 && same_shape(a, b) && same_shape(a, out), "add: a {} b {} out {}", a.describe(),
            b.describe(), out.describe());
  MLA_CHECK(a.ndim >= 1 && a.ndim <= kMaxDims, "add: rank {}", a.ndim);
  check_device_view(a, "add", "a");
  check_device_view(b, "add", "b");
  check_device_view(out, "add", "out");
  const int64_t total = a.numel();
  if (total == 0) return;
  const TensorView* views[] = {&a, &b, &out};
  const Nd4 nd = make_nd4(views, 3);
  if (total <= int64_t(UINT32_MAX)) {
    launch_maybe_pdl(add_kernel<uint32_t>, dim3(flat_blocks(total)), dim3(kThreads), 0, true, stream(),
                     a.as<const float>(), b.as<const float>(), out.as<float>(), nd, total);
  } else {
    launch_maybe_pdl(add_kernel<uint64_t>, dim3(flat_blocks(total)), dim3(kThreads), 0, true, stream(),
                     a.as<const float>(), b.as<const float>(), out.as<float>(), nd, total);
  }
  MLA_GPU_LAUNCH_CHECK();
}

void GpuBackend::silu_mul(const TensorView& gate, const TensorView& up, const TensorView& out) {
  check_rows(gate, DType::F32, 2, "silu_mul", "gate");
  check_rows(up, DType::F32, 2, "silu_mul", "up");
  check_rows(out, DType::F32, 2, "silu_mul", "out");
  MLA_CHECK(same_shape(gate, up) && same_shape(gate, out), "silu_mul: gate {} up {} out {}", gate.describe(),
            up.describe(), out.describe());
  const int64_t rows = gate.dim(0), d = gate.dim(1);
  check_grid_rows(rows, "silu_mul");
  if (rows == 0) return;
  const int64_t col_blocks = std::min<int64_t>((d + kThreads - 1) / kThreads, 64);
  if (col_blocks == 0) return;
  launch_maybe_pdl(silu_mul_kernel, dim3(unsigned(rows), unsigned(col_blocks)), dim3(kThreads), 0, true, stream(),
                   gate.as<const float>(), gate.stride[0], up.as<const float>(), up.stride[0], out.as<float>(),
                   out.stride[0], d);
  MLA_GPU_LAUNCH_CHECK();
}

void GpuBackend::rope(const TensorView& x, const TensorView& positions, const ops::RopeTable& rope) {
  check_rows(x, DType::F32, 3, "rope", "x");
  const int64_t num_tokens = x.dim(0), heads = x.dim(1), rope_dim = x.dim(2);
  MLA_CHECK(rope_dim % 2 == 0, "rope: odd rope_dim {}", rope_dim);
  const int64_t pairs = rope_dim / 2;
  check_vec(positions, DType::I32, num_tokens, "rope", "positions");
  check_vec(rope.inv_freq, DType::F32, pairs, "rope", "inv_freq");
  // cos/sin of one token live in shared memory (8 bytes per pair, default 48 KiB limit).
  MLA_CHECK(pairs * 8 <= 48 * 1024 && heads * pairs < (int64_t(1) << 31), "rope: {} too large", x.describe());
  check_grid_rows(num_tokens, "rope");
  if (num_tokens == 0 || heads == 0 || pairs == 0) return;
  // Positions are not checked for >= 0 here (the CPU CHECKs them); a negative one rotates backwards.
  const int64_t blocks = (heads * pairs + kThreads * kRopePer - 1) / (kThreads * kRopePer);
  MLA_CHECK(blocks <= 65535, "rope: {} too large", x.describe());
  launch_maybe_pdl(rope_kernel, dim3(unsigned(num_tokens), unsigned(blocks)), dim3(kThreads), size_t(pairs) * 8, true,
                   stream(),
      x.as<float>(), x.stride[0], x.stride[1], int(heads), int(pairs), positions.as<const int32_t>(),
      positions.stride[0], rope.inv_freq.as<const float>(), rope.inv_freq.stride[0], rope.attention_factor,
      rope.interleaved);
  MLA_GPU_LAUNCH_CHECK();
}

}  // namespace mla::gpu
