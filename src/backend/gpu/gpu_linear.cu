// GPU linear, out[T, out] = x[T, in] W^T, for every weight format, and its dispatch. Two exact fp32
// kernels live here: a weight-streaming GEMV for decode (T <= 16, bound by reading W) and a tiled
// SIMT GEMM fallback that takes any format and shape. Serving decode of FP8 / INT4 weights goes to
// the tensor-core matvec (gpu_decode_tc.cu, GemmPrecision::Bf16): the exact GEMV spends ~5-9
// instructions per weight byte on dequantization and reached only 12% of copy bandwidth on
// DeepSeek's 18432 x 7168 FP8 MLP (H200, ncu). The prefill fast paths are in
// gpu_linear_blas.cu (cuBLASLt: BF16, and FP8/INT4 dequantized per call into a bounded bf16 scratch
// chunk) and gpu_linear_tc.cu (mma.sync, FP8/INT4; forced only). Weights stay packed
// (ARCHITECTURE rule 6): both kernels here dequantize in registers/shared memory with exactly
// weight_at()'s values, trading peak FLOPs for one code path per format that is bit-faithful to the
// CPU reference's dequantizer.
#include <algorithm>
#include <array>
#include <optional>
#include <span>

#include "backend/gpu/gpu_backend_impl.h"
#include "backend/gpu/gpu_decode_tc.h"
#include "backend/gpu/gpu_linear.h"
#include "backend/gpu/gpu_linear_state.h"

namespace mla::gpu {

namespace {

// ---- generic tiled SIMT GEMM ---------------------------------------------------------------------
// 64 tokens x 64 outputs per CTA, K in steps of 16; 256 threads, each owning a 4x4 register tile
// (rows ty + 16 i, columns tx + 16 j: strided so the stores of a warp's 16 tx are coalesced).
// Napkin math: per K step a CTA loads 64x16 x + 64x16 W (scalar dequant via weight_at) and does
// 64x64x16 FMAs: 16 FMAs per loaded element, so it runs at a fraction of fp32 peak. It is the
// correctness fallback (FP8/INT4 prefill, HIP), not the fast path.
constexpr int kTileM = 64, kTileN = 64, kTileK = 16, kGenericThreads = 256;

__global__ void __launch_bounds__(kGenericThreads)
    linear_generic_kernel(const float* __restrict__ x, int64_t ldx, int64_t T, DeviceWeight w, float* __restrict__ out,
                          int64_t ldo) {
  __shared__ float xs[kTileK][kTileM + 4];  // +4: spreads the transposed stores over banks
  __shared__ float ws[kTileK][kTileN + 4];
  const int tid = int(threadIdx.x), tx = tid % 16, ty = tid / 16;
  const int64_t n0 = int64_t(blockIdx.x) * kTileN, m0 = int64_t(blockIdx.y) * kTileM;
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < w.in; k0 += kTileK) {
    // Each thread stages 4 elements of each tile: element e = tid + 256 l is (row e / 16, k e % 16),
    // so 16 consecutive lanes read 16 consecutive k of one row.
#pragma unroll
    for (int l = 0; l < 4; ++l) {
      const int e = tid + kGenericThreads * l, r = e / kTileK, kk = e % kTileK;
      const int64_t k = k0 + kk;
      const int64_t m = m0 + r, n = n0 + r;
      xs[kk][r] = (m < T && k < w.in) ? x[m * ldx + k] : 0.0f;
      ws[kk][r] = (n < w.out && k < w.in) ? weight_at(w, n, k) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kTileK; ++kk) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = xs[kk][ty + 16 * i];
#pragma unroll
      for (int j = 0; j < 4; ++j) b[j] = ws[kk][tx + 16 * j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    __syncthreads();  // the next step overwrites the tiles
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t m = m0 + ty + 16 * i;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t n = n0 + tx + 16 * j;
      if (m < T && n < w.out) out[m * ldo + n] = acc[i][j];
    }
  }
}

void run_generic(GpuBackend& be, const float* x, int64_t ldx, int64_t T, const DeviceWeight& w, float* out,
                 int64_t ldo) {
  const dim3 grid(unsigned((w.out + kTileN - 1) / kTileN), unsigned((T + kTileM - 1) / kTileM));
  MLA_CHECK(grid.y <= 65535u, "linear: {} tokens exceed the generic kernel's grid", T);
  linear_generic_kernel<<<grid, kGenericThreads, 0, be.stream()>>>(x, ldx, T, w, out, ldo);
  MLA_GPU_LAUNCH_CHECK();
}

// ---- decode GEMV ---------------------------------------------------------------------------------
// Each warp streams kGemvRows rows of W with 16-byte loads (one "vec" = 8 bf16/f16, 4 f32, 16 fp8 or
// 32 int4 = one INT4 group), dequantizes them in registers and dots them with all NT token rows of
// x, which sit in shared memory one K chunk at a time. Every W byte is read once per call.
// Napkin math (H200, 4.8 TB/s HBM): 18432x7168 bf16 = 264 MB -> 55 us at peak; T=1 is 0.26 GFLOP
// (nothing), T=16 is 4.2 GFLOP -> ~65 us at 67 TFLOP/s fp32, so T=16 is FMA-bound, not HBM-bound,
// and the bandwidth target applies to T <= ~8. 7168x2048 fp8: 14.7 MB -> 3 us at peak.
// Occupancy: few output rows would leave SMs idle, so K is split (gemv_split) and a small kernel sums
// the partials in a fixed order.
// Latency hiding: each lane has kGemvRows x U (manual unroll, 4 for T <= 4) independent 16-byte loads
// in flight, and CTAs are small (128 threads, <= 32 KB smem) so several share an SM.
enum class GemvFmt { Bf16, F16, F32, Fp8, Int4Bf16, Int4F16, Int4F32, Scalar };
constexpr int kGemvThreads = 128;
constexpr int kGemvRows = 2;  // W rows per warp

template <GemvFmt F> constexpr int gemv_vec_elems() {
  switch (F) {
    case GemvFmt::Bf16:
    case GemvFmt::F16: return 8;
    case GemvFmt::F32: return 4;
    case GemvFmt::Fp8: return 16;
    case GemvFmt::Int4Bf16:
    case GemvFmt::Int4F16:
    case GemvFmt::Int4F32: return 32;
    case GemvFmt::Scalar: return 1;
  }
  return 1;
}

// W[o, k0 + j] for j < VE from the 16 bytes `v` at element k0 of row o: weight_at()'s values.
template <GemvFmt F>
__device__ __forceinline__ void gemv_dequant(const DeviceWeight& w, const uint4& v, int64_t o, int64_t k0,
                                             float* out) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
  if constexpr (F == GemvFmt::Bf16 || F == GemvFmt::F16) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {  // little-endian: the low half is the lower element
      const uint16_t lo = uint16_t(words[j] & 0xffffu), hi = uint16_t(words[j] >> 16);
      out[2 * j] = F == GemvFmt::Bf16 ? bf16_bits_to_f32(lo) : f16_bits_to_f32(lo);
      out[2 * j + 1] = F == GemvFmt::Bf16 ? bf16_bits_to_f32(hi) : f16_bits_to_f32(hi);
    }
  } else if constexpr (F == GemvFmt::F32) {
#pragma unroll
    for (int j = 0; j < 4; ++j) out[j] = __uint_as_float(words[j]);
  } else if constexpr (F == GemvFmt::Fp8) {
    // k0 is a multiple of 16, so the vec lies in one 128-wide scale block.
    const float s = static_cast<const float*>(w.scale)[(o / 128) * w.scale_stride + k0 / 128];
#pragma unroll
    for (int j = 0; j < 16; ++j) out[j] = fp8e4m3_to_f32(uint8_t(words[j / 4] >> (8 * (j % 4)))) * s;
  } else {
    // k0 is a multiple of 32: the vec is exactly one INT4 group with one scale.
    const int64_t si = o * w.scale_stride + k0 / 32;
    float s;
    if constexpr (F == GemvFmt::Int4Bf16) s = bf16_bits_to_f32(static_cast<const uint16_t*>(w.scale)[si]);
    else if constexpr (F == GemvFmt::Int4F16) s = f16_bits_to_f32(static_cast<const uint16_t*>(w.scale)[si]);
    else s = static_cast<const float*>(w.scale)[si];
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      const float q = float(int((words[j / 8] >> (4 * (j % 8))) & 0xfu) - 8);
      const float p = q * s;  // rounded to the scale's dtype, as ops/weight.h defines
      if constexpr (F == GemvFmt::Int4Bf16) out[j] = bf16_bits_to_f32(f32_to_bf16_bits(p));
      else if constexpr (F == GemvFmt::Int4F16) out[j] = f16_bits_to_f32(f32_to_f16_bits(p));
      else out[j] = p;
    }
  }
}

// Byte offset of element k of row o (k a multiple of the vec width for packed INT4).
template <GemvFmt F> __device__ __forceinline__ int64_t gemv_byte_offset(const DeviceWeight& w, int64_t o, int64_t k) {
  if constexpr (F == GemvFmt::Bf16 || F == GemvFmt::F16) return (o * w.data_stride + k) * 2;
  else if constexpr (F == GemvFmt::F32) return (o * w.data_stride + k) * 4;
  else if constexpr (F == GemvFmt::Fp8) return o * w.data_stride + k;
  else return (o * w.data_stride + k / 8) * 4;
}

// x rows [0, T) of the call, NT >= T (rows T..NT-1 of the smem tile are zeros). `kc` (multiple of
// 128, so vecs never straddle a chunk, an FP8 block or an INT4 group) is the K chunk in smem.
// Preconditions (vector formats): w.data and each row start are 16-byte aligned.
// Split-K: CTA (blockIdx.x, s = blockIdx.y) covers K range [s * split_k, min(in, (s + 1) * split_k))
// (split_k a multiple of 128). With one split it writes `out`; otherwise it writes its partial sums
// to partial[s][t][n] (contiguous [splits, T, out]) for linear_gemv_reduce_kernel.
// Row blocks: CTA blockIdx.x takes row blocks blockIdx.x, + gridDim.x, ... of `row_blocks` (the grid
// is capped when there are many, e.g. a 129280-row lm_head): when the split's K range fits one smem
// chunk, x is staged once per CTA instead of once per 8 rows, and the CTA streams row after row with
// no barrier between them.
template <GemvFmt F, int NT>
__global__ void __launch_bounds__(kGemvThreads)
    linear_gemv_kernel(const float* __restrict__ x, int64_t ldx, int T, DeviceWeight w, float* __restrict__ out,
                       int64_t ldo, int kc, int64_t split_k, float* __restrict__ partial, int64_t row_blocks) {
  extern __shared__ float4 gemv_smem[];  // float4: 16-byte alignment for vectorized smem reads
  float* xs = reinterpret_cast<float*>(gemv_smem);  // [NT][kc]
  constexpr int VE = gemv_vec_elems<F>();
  const int lane = int(threadIdx.x) % kWarpSize, warp = int(threadIdx.x) / kWarpSize;
  const int warps = int(blockDim.x) / kWarpSize;
  const char* wbytes = static_cast<const char*>(w.data);
  const int64_t k_begin = int64_t(blockIdx.y) * split_k, k_end = min(w.in, k_begin + split_k);
  const bool x_resident = k_end - k_begin <= kc;  // one chunk: staged by the first row block only
  for (int64_t rb = blockIdx.x; rb < row_blocks; rb += gridDim.x) {  // uniform per CTA
    const int64_t row0 = (rb * warps + warp) * kGemvRows;
    float acc[kGemvRows][NT];
#pragma unroll
    for (int r = 0; r < kGemvRows; ++r)
#pragma unroll
      for (int t = 0; t < NT; ++t) acc[r][t] = 0.0f;

    for (int64_t c0 = k_begin; c0 < k_end; c0 += kc) {
      const int len = int(min(int64_t(kc), k_end - c0));
      if (!x_resident || rb == int64_t(blockIdx.x)) {
        __syncthreads();  // the previous chunk's readers are done
        for (int i = int(threadIdx.x); i < NT * kc; i += int(blockDim.x)) {
          const int t = i / kc, k = i % kc;
          xs[i] = (t < T && k < len) ? x[int64_t(t) * ldx + c0 + k] : 0.0f;
        }
        __syncthreads();
      }
      if constexpr (F == GemvFmt::Scalar) {
        for (int k = lane; k < len; k += kWarpSize) {
#pragma unroll
          for (int r = 0; r < kGemvRows; ++r) {
            if (row0 + r < w.out) {
              const float wv = weight_at(w, row0 + r, c0 + k);
#pragma unroll
              for (int t = 0; t < NT; ++t) acc[r][t] = fmaf(wv, xs[t * kc + k], acc[r][t]);
            }
          }
        }
      } else {
        const int nvec = (len + VE - 1) / VE;
        // U vecs per lane per iteration (manual unroll): U x kGemvRows independent loads in flight.
        constexpr int U = NT <= 4 ? 4 : 2;  // fewer at large NT, where the accumulators need the registers
        for (int v0 = lane; v0 < nvec; v0 += U * kWarpSize) {
          uint4 q[U][kGemvRows];
#pragma unroll
          for (int u = 0; u < U; ++u)
#pragma unroll
            for (int r = 0; r < kGemvRows; ++r) {
              const int v = v0 + u * kWarpSize;
              const bool live = row0 + r < w.out && v < nvec;
              const char* p = wbytes + gemv_byte_offset<F>(w, row0 + r, c0 + int64_t(v) * VE);
              q[u][r] = live ? *reinterpret_cast<const uint4*>(p) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
          for (int u = 0; u < U; ++u) {
            const int v = v0 + u * kWarpSize;
            const int64_t k0 = c0 + int64_t(v) * VE;
            const float* xk = xs + v * VE;
#pragma unroll
            for (int r = 0; r < kGemvRows; ++r) {
              if (row0 + r < w.out && v < nvec) {
                float wv[VE];
                gemv_dequant<F>(w, q[u][r], row0 + r, k0, wv);
                if (k0 + VE > w.in) {  // last vec of a row: bytes past `in` are padding, maybe NaN
#pragma unroll
                  for (int j = 0; j < VE; ++j)
                    if (k0 + j >= w.in) wv[j] = 0.0f;
                }
#pragma unroll
                for (int t = 0; t < NT; ++t)
#pragma unroll
                  for (int j = 0; j < VE; ++j) acc[r][t] = fmaf(wv[j], xk[t * kc + j], acc[r][t]);
              }
            }
          }
        }
      }
    }
    // Fixed-order butterfly reduction: deterministic, and independent of other rows/tokens.
#pragma unroll
    for (int r = 0; r < kGemvRows; ++r)
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const float s = warp_sum(acc[r][t]);
        if (lane == 0 && t < T && row0 + r < w.out) {
          if (partial == nullptr) out[int64_t(t) * ldo + row0 + r] = s;
          else partial[(int64_t(blockIdx.y) * T + t) * w.out + row0 + r] = s;
        }
      }
  }  // row blocks
}

// out[t, n] = sum over splits s (in order: deterministic) of partial[s][t][n].
__global__ void linear_gemv_reduce_kernel(const float* __restrict__ partial, int splits, int T, int64_t n_out,
                                          float* __restrict__ out, int64_t ldo) {
  const int64_t total = int64_t(T) * n_out;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    float sum = 0.0f;
    for (int s = 0; s < splits; ++s) sum += partial[int64_t(s) * total + i];
    out[(i / n_out) * ldo + i % n_out] = sum;
  }
}

// Split-K layout of a GEMV: few output rows (kv_a_proj: 576) would leave most SMs idle, so K is cut
// into `splits` ranges of `split_k` (a multiple of 128) until there are about kGemvTargetCtas CTAs.
// Depends on the weight's shape only: the same for every T (batch-invariant) and every graph replay.
constexpr int64_t kGemvTargetCtas = 4 * 132;  // ~4 resident CTAs on each of an H200's 132 SMs
struct GemvSplit {
  int64_t row_ctas, splits, split_k;
};
GemvSplit gemv_split(const DeviceWeight& w) {
  const int64_t rows_per_cta = kGemvThreads / kWarpSize * kGemvRows;
  const int64_t row_ctas = (w.out + rows_per_cta - 1) / rows_per_cta;
  const int64_t units = (w.in + 127) / 128;
  const int64_t max_splits = std::min<int64_t>(units, 64);
  const int64_t want = std::clamp<int64_t>((kGemvTargetCtas + row_ctas - 1) / row_ctas, 1, max_splits);
  const int64_t units_per_split = (units + want - 1) / want;
  return {row_ctas, (units + units_per_split - 1) / units_per_split, units_per_split * 128};
}

template <GemvFmt F, int NT>
void launch_gemv(GpuBackend& be, const float* x, int64_t ldx, int T, const DeviceWeight& w, float* out, int64_t ldo) {
  const GemvSplit sp = gemv_split(w);
  // K chunk: <= 32 KB of x in smem (under every vendor's default 48 KB), no wider than a split needs.
  // One token: up to 8192 (a DeepSeek/Kimi hidden row, 7168, stays resident for the whole CTA).
  constexpr int kMaxChunk = NT == 1 ? 8192 : NT <= 4 ? 2048 : NT == 8 ? 1024 : 512;
  const int kc = int(std::min<int64_t>(kMaxChunk, sp.split_k));
  const size_t smem = size_t(NT) * size_t(kc) * sizeof(float);
  float* partial = nullptr;
  if (sp.splits > 1)
    partial = be.linear_state().gemv_scratch.get_as<float>(be, size_t(sp.splits * T * w.out));
  // Many row blocks (lm_head: 16160): ~2 waves of CTAs (<= 8 per SM) that loop over them.
  constexpr int64_t kMaxRowCtas = 2 * 8 * 132;
  const dim3 grid(unsigned(std::min(sp.row_ctas, kMaxRowCtas)), unsigned(sp.splits));
  linear_gemv_kernel<F, NT><<<grid, kGemvThreads, smem, be.stream()>>>(x, ldx, T, w, out, ldo, kc, sp.split_k, partial,
                                                                       sp.row_ctas);
  MLA_GPU_LAUNCH_CHECK();
  if (partial != nullptr) {
    const int64_t total = int64_t(T) * w.out;
    const unsigned blocks = unsigned(std::min<int64_t>((total + 255) / 256, 4 * 132));
    linear_gemv_reduce_kernel<<<blocks, 256, 0, be.stream()>>>(partial, int(sp.splits), T, w.out, out, ldo);
    MLA_GPU_LAUNCH_CHECK();
  }
}

template <GemvFmt F>
void launch_gemv_nt(GpuBackend& be, const float* x, int64_t ldx, int T, const DeviceWeight& w, float* out,
                    int64_t ldo) {
  if (T <= 1) launch_gemv<F, 1>(be, x, ldx, T, w, out, ldo);
  else if (T <= 4) launch_gemv<F, 4>(be, x, ldx, T, w, out, ldo);
  else if (T <= 8) launch_gemv<F, 8>(be, x, ldx, T, w, out, ldo);
  else launch_gemv<F, 16>(be, x, ldx, T, w, out, ldo);
}

// The vectorized kernel needs 16-byte aligned rows; anything else takes the scalar variant.
GemvFmt gemv_format(const DeviceWeight& w) {
  const size_t elem_bytes = w.format == ops::WeightFormat::Int4Group32 ? 4 : dtype_size(w.data_dtype);
  const bool aligned = reinterpret_cast<uintptr_t>(w.data) % 16 == 0 && (size_t(w.data_stride) * elem_bytes) % 16 == 0;
  if (!aligned) return GemvFmt::Scalar;
  switch (w.format) {
    case ops::WeightFormat::Dense:
      return w.data_dtype == DType::BF16 ? GemvFmt::Bf16 : w.data_dtype == DType::F16 ? GemvFmt::F16 : GemvFmt::F32;
    case ops::WeightFormat::Fp8Block128: return GemvFmt::Fp8;
    case ops::WeightFormat::Int4Group32:
      return w.scale_dtype == DType::BF16  ? GemvFmt::Int4Bf16
             : w.scale_dtype == DType::F16 ? GemvFmt::Int4F16
                                           : GemvFmt::Int4F32;
  }
  return GemvFmt::Scalar;
}

constexpr int64_t kGemvMaxTokens = 16;
// Auto takes DequantBlas for FP8/INT4 prefill in GemmPrecision::Fp32 too (3 W terms x 3 x terms).
constexpr bool kDequantInFp32 = true;

void run_gemv(GpuBackend& be, const float* x, int64_t ldx, int64_t T, const DeviceWeight& w, float* out, int64_t ldo) {
  const GemvFmt f = gemv_format(w);
  for (int64_t t0 = 0; t0 < T; t0 += kGemvMaxTokens) {  // > 16 tokens only when forced (tests)
    const int nt = int(std::min(kGemvMaxTokens, T - t0));
    const float* xt = x + t0 * ldx;
    float* ot = out + t0 * ldo;
    switch (f) {
      case GemvFmt::Bf16: launch_gemv_nt<GemvFmt::Bf16>(be, xt, ldx, nt, w, ot, ldo); break;
      case GemvFmt::F16: launch_gemv_nt<GemvFmt::F16>(be, xt, ldx, nt, w, ot, ldo); break;
      case GemvFmt::F32: launch_gemv_nt<GemvFmt::F32>(be, xt, ldx, nt, w, ot, ldo); break;
      case GemvFmt::Fp8: launch_gemv_nt<GemvFmt::Fp8>(be, xt, ldx, nt, w, ot, ldo); break;
      case GemvFmt::Int4Bf16: launch_gemv_nt<GemvFmt::Int4Bf16>(be, xt, ldx, nt, w, ot, ldo); break;
      case GemvFmt::Int4F16: launch_gemv_nt<GemvFmt::Int4F16>(be, xt, ldx, nt, w, ot, ldo); break;
      case GemvFmt::Int4F32: launch_gemv_nt<GemvFmt::Int4F32>(be, xt, ldx, nt, w, ot, ldo); break;
      case GemvFmt::Scalar: launch_gemv_nt<GemvFmt::Scalar>(be, xt, ldx, nt, w, ot, ldo); break;
    }
  }
}

// GemvTc's format for `w`, or nullopt when the path does not take it (format, shape, alignment).
std::optional<MoeFormat> gemv_tc_format(const DeviceWeight& w) {
  MoeFormat f;
  if (w.format == ops::WeightFormat::Dense && w.data_dtype == DType::BF16) f = MoeFormat::BF16;
  else if (w.format == ops::WeightFormat::Fp8Block128) f = MoeFormat::FP8;
  else if (w.format == ops::WeightFormat::Int4Group32 && w.scale_dtype == DType::BF16) f = MoeFormat::I4_BF16;
  else return std::nullopt;
  if (!dense_tc_weight_ok(f, w)) return std::nullopt;
  return f;
}

bool gemv_tc_device(GpuBackend& be) {
  LinearState& st = be.linear_state();
  if (st.tc_device < 0) st.tc_device = moe_tc_device_ok() ? 1 : 0;
  return st.tc_device == 1;
}

// One launch (gpu_dense_tc.cu) for every part (weights of one input, format and width): split-K
// planes are summed in split order inside it (deterministic). The split follows the parts' summed
// rows, so a grouped weight's sums may differ from its lone call's in the last bits.
void run_gemv_tc(GpuBackend& be, MoeFormat f, const float* x, int64_t ldx, int64_t T,
                 std::span<const DenseTcPart> parts) {
  MLA_CHECK(!parts.empty() && parts.size() <= size_t(kDenseTcMaxParts), "run_gemv_tc: {} parts", parts.size());
  DenseTcArgs a;
  int64_t rows = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    a.part[i] = parts[i];
    rows += parts[i].w.out;
  }
  a.num_parts = int(parts.size());
  a.x = x;
  a.x_stride = ldx;
  a.tokens = int(T);
  const int64_t in = parts[0].w.in;
  a.split = dense_tc_split(f, in, rows);
  if (const int64_t forced = be.linear_state().tc_splits; forced > 0) a.split = dense_tc_split_into(f, in, forced);
  if (a.split.splits > 1) {
    LinearState& st = be.linear_state();
    a.partial = static_cast<float*>(st.tc_scratch.get(be, dense_tc_partial_bytes(a.split, T, rows)));
    // Zero-filled when (re)allocated; the kernel leaves every ticket at zero.
    a.tickets = st.tc_tickets.get_as<unsigned>(be, size_t(rows / 64));
  }
  dense_tc_launch(f, a, be.stream());
}

void check_activation(const TensorView& v, const char* what) {
  check_device_view(v, "linear", what);
  MLA_CHECK(v.dtype == DType::F32 && v.ndim == 2, "linear: {} {} must be F32 [T, n]", what, v.describe());
  MLA_CHECK(v.inner_contiguous(), "linear: last dim of {} {} is strided", what, v.describe());
}

// linear's argument checks (the op's contract); returns the row strides the kernels take (a single
// row's stride is irrelevant: views of one row may carry any stride).
struct LinearStrides {
  int64_t ldx, ldo;
};
LinearStrides check_linear(const TensorView& x, const ops::Weight& w, const TensorView& out) {
  check_activation(x, "x");
  check_activation(out, "out");
  const Status st = ops::validate_weight(w);
  MLA_CHECK(st.is_ok(), "linear: {}", st.message());
  const int64_t T = x.dim(0), in = w.in_features, n_out = w.out_features;
  MLA_CHECK(x.dim(1) == in && out.dim(0) == T && out.dim(1) == n_out, "linear: x {} W [{}, {}] out {}",
            x.describe(), n_out, in, out.describe());
  MLA_CHECK(!views_alias(x, out), "linear: out {} aliases x {}", out.describe(), x.describe());
  const LinearStrides s{T == 1 ? in : x.stride[0], T == 1 ? n_out : out.stride[0]};
  MLA_CHECK(T == 0 || (s.ldx >= in && s.ldo >= n_out), "linear: overlapping rows (x stride {}, out stride {})", s.ldx,
            s.ldo);
  return s;
}

bool auto_takes_gemv_tc(GpuBackend& be, int64_t T, const DeviceWeight& w) {
  return T <= kGemvMaxTokens && be.options().gemm_precision == GemmPrecision::Bf16 && gemv_tc_format(w) &&
         gemv_tc_device(be);
}

}  // namespace

void linear_with_path(ops::Backend& backend, const TensorView& x, const ops::Weight& w, const TensorView& out,
                      LinearPath path) {
  auto* be = dynamic_cast<GpuBackend*>(&backend);
  MLA_CHECK(be != nullptr, "linear_with_path: backend {} is not the GPU backend", backend.name());
  const auto [ldx, ldo] = check_linear(x, w, out);
  const int64_t T = x.dim(0), in = w.in_features, n_out = w.out_features;
  if (T == 0 || n_out == 0) return;
  if (in == 0) {  // empty sum: out = 0 (rows may be strided, so one memset per row)
    for (int64_t t = 0; t < T; ++t)
      MLA_GPU_CHECK(memset_async(out.as<float>() + t * out.stride[0], 0, size_t(n_out) * sizeof(float), be->stream()));
    return;
  }
  const DeviceWeight dw = device_weight(w);
  const bool dense_bf16 = w.format == ops::WeightFormat::Dense && w.data.dtype == DType::BF16;

  if (path == LinearPath::Auto) {
    if (T <= kGemvMaxTokens) path = auto_takes_gemv_tc(*be, T, dw) ? LinearPath::GemvTc : LinearPath::Gemv;
    else if (dense_bf16 && linear_has_blas()) path = LinearPath::Blas;
    // Bf16: a bf16 copy of W (one more rounding) buys cuBLASLt's speed. Fp32: W as 3 exact bf16
    // terms, 9x the FLOPs, still ~6x the mma.sync kernel (kDequantInFp32 off: back to TensorCore).
    else if ((kDequantInFp32 || be->options().gemm_precision == GemmPrecision::Bf16) && linear_has_blas() &&
             linear_dequant_supports(w))
      path = LinearPath::DequantBlas;
    else if (linear_tc_supports(w)) path = LinearPath::TensorCore;
    else path = LinearPath::Generic;
  }
  switch (path) {
    case LinearPath::Gemv: run_gemv(*be, x.as<const float>(), ldx, T, dw, out.as<float>(), ldo); return;
    case LinearPath::GemvTc: {
      const std::optional<MoeFormat> f = gemv_tc_format(dw);
      MLA_CHECK(f.has_value() && gemv_tc_device(*be), "linear: the GemvTc path does not take {} [{}, {}] here",
                ops::weight_format_name(w.format), n_out, in);
      const DenseTcPart part{dw, out.as<float>(), ldo};
      run_gemv_tc(*be, *f, x.as<const float>(), ldx, T, std::span(&part, 1));
      return;
    }
    case LinearPath::Blas: {
      MLA_CHECK(dense_bf16 && linear_has_blas(), "linear: the Blas path needs a Dense BF16 weight on CUDA (got {} {})",
                ops::weight_format_name(w.format), dtype_name(w.data.dtype));
      // Views of one row carry no usable stride: hand cuBLASLt the canonical one.
      TensorView xv = x, ov = out;
      xv.stride[0] = ldx;
      ov.stride[0] = ldo;
      if (linear_blas(*be, xv, w, ov)) return;
      break;  // no cuBLASLt algorithm for this shape: exact fallback below
    }
    case LinearPath::TensorCore: {
      MLA_CHECK(linear_tc_supports(w), "linear: the TensorCore path does not take {} weights (scale {}) here",
                ops::weight_format_name(w.format), dtype_name(w.scale.dtype));
      TensorView xv = x, ov = out;
      xv.stride[0] = ldx;
      ov.stride[0] = ldo;
      if (linear_tc(*be, xv, w, ov)) return;
      break;
    }
    case LinearPath::DequantBlas: {
      MLA_CHECK(linear_has_blas() && linear_dequant_supports(w),
                "linear: the DequantBlas path needs an FP8/INT4 weight on CUDA (got {})", ops::weight_format_name(w.format));
      TensorView xv = x, ov = out;
      xv.stride[0] = ldx;
      ov.stride[0] = ldo;
      if (linear_dequant_blas(*be, xv, w, ov)) return;
      break;  // no cuBLASLt algorithm: the exact fallback rewrites all of out
    }
    case LinearPath::Generic:
    case LinearPath::Auto: break;
  }
  run_generic(*be, x.as<const float>(), ldx, T, dw, out.as<float>(), ldo);
}

void linear_set_gemv_tc_splits(ops::Backend& backend, int64_t splits) {
  auto* be = dynamic_cast<GpuBackend*>(&backend);
  MLA_CHECK(be != nullptr && splits >= 0, "linear_set_gemv_tc_splits: not a GPU backend or splits {} < 0", splits);
  be->linear_state().tc_splits = splits;
}

bool linear_gemv_tc_supports(ops::Backend& backend, const ops::Weight& w) {
  auto* be = dynamic_cast<GpuBackend*>(&backend);
  return be != nullptr && ops::validate_weight(w).is_ok() && gemv_tc_format(device_weight(w)).has_value() &&
         gemv_tc_device(*be);
}

void GpuBackend::linear(const TensorView& x, const ops::Weight& w, const TensorView& out) {
  linear_with_path(*this, x, w, out, LinearPath::Auto);
}

void linear_set_group_one_launch(ops::Backend& backend, bool on) {
  auto* be = dynamic_cast<GpuBackend*>(&backend);
  MLA_CHECK(be != nullptr, "linear_set_group_one_launch: backend {} is not the GPU backend", backend.name());
  be->linear_state().group_one_launch = on;
}

bool linear_group_one_launch(ops::Backend& backend, int64_t T, std::span<const ops::Weight* const> w) {
  auto* be = dynamic_cast<GpuBackend*>(&backend);
  if (be == nullptr || !be->linear_state().group_one_launch || w.size() < 2 ||
      w.size() > ops::Backend::kMaxLinearGroup || T <= 0)
    return false;
  std::optional<MoeFormat> format;
  for (size_t i = 0; i < w.size(); ++i) {
    // Empty weights (which may hold no data) are linear's early returns, never the launch's.
    if (!ops::validate_weight(*w[i]).is_ok() || w[i]->out_features <= 0 || w[i]->in_features <= 0) return false;
    const DeviceWeight dw = device_weight(*w[i]);
    const std::optional<MoeFormat> f = gemv_tc_format(dw);
    if (!auto_takes_gemv_tc(*be, T, dw) || (i > 0 && (f != format || w[i]->in_features != w[0]->in_features)))
      return false;
    format = f;
  }
  return true;
}

// One tensor-core launch where Auto takes GemvTc for every weight and they share format and width
// (the narrow decode layers: q_a + kv_a fill 33 row blocks together where kv_a alone has 9);
// otherwise the separate calls.
void GpuBackend::linear_group(const TensorView& x, std::span<const ops::Weight* const> w,
                              std::span<const TensorView> out) {
  ops::check_linear_group(w, out);
  const int64_t T = x.dim(0);
  if (!linear_group_one_launch(*this, T, w)) {
    for (size_t i = 0; i < w.size(); ++i) linear(x, *w[i], out[i]);
    return;
  }
  std::array<DenseTcPart, kDenseTcMaxParts> parts;
  for (size_t i = 0; i < w.size(); ++i) {
    const LinearStrides s = check_linear(x, *w[i], out[i]);
    parts[i] = DenseTcPart{device_weight(*w[i]), out[i].as<float>(), s.ldo};
  }
  const int64_t ldx = T == 1 ? x.dim(1) : x.stride[0];
  run_gemv_tc(*this, *gemv_tc_format(parts[0].w), x.as<const float>(), ldx, T, std::span(parts.data(), w.size()));
}

}  // namespace mla::gpu
