// Tensor-core prefill linear for quantized weights (FP8 block-128, INT4 group-32 with BF16 or F32
// scales), CUDA sm_80+ mma.sync. Weight tiles are dequantized into bf16 in shared memory: fp8 values
// and small integers are exact in bf16, so the scale is applied in fp32 to each 128-K (FP8) / 32-K
// (INT4 F32-scale) partial sum; INT4 with BF16 scale dequantizes to exact bf16 values directly. x
// enters as three bf16 terms (GemmPrecision::Fp32) or one (Bf16). Simple, unpipelined tiles: a
// large step over the SIMT fallback, not a tuned kernel (no cp.async, no ldmatrix). Auto now sends
// FP8/INT4 prefill to DequantBlas (gpu_linear_blas.cu); this stays as a forced path and the fallback
// should gpu_linear.cu's kDequantInFp32 be turned off.
#include "backend/gpu/gpu_backend_impl.h"
#include "backend/gpu/gpu_linear.h"

namespace mla::gpu {

#if MLA_GPU_CUDA

namespace {

// CTA tile 64 tokens x 64 outputs x 32 K; 4 warps in 2x2, each 32x32 = 2 (m16) x 4 (n8) mma tiles.
// Napkin math per K tile: 64x32 fp32 x (8 KB) + 64x32 packed W (2 KB fp8 / 1 KB int4) read, and
// 64x64x32 x terms MACs on tensor cores; no pipelining, so expect latency-bound tens of % of peak.
constexpr int kTcM = 64, kTcN = 64, kTcK = 32, kTcThreads = 128;
constexpr int kTcPad = 8;  // bf16 elements: row stride 40 (20 words) makes fragment loads conflict-free

enum class TcFmt { Fp8, Int4Bf16, Int4F32 };

__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  __trap();  // the host side never launches this below sm_80 (the build targets sm_90)
#endif
}

// Scale group along K (a multiple of kTcK): partial sums are flushed, times the scale, at its end.
template <TcFmt F> constexpr int64_t tc_group() { return F == TcFmt::Fp8 ? 128 : 32; }
template <TcFmt F> constexpr bool tc_scaled() { return F != TcFmt::Int4Bf16; }

// W[n, k] as bf16 bits, before the fp32 scale for the scaled formats (q exactly), or the final
// value for INT4 with BF16 scale (bf16(q * s), exactly weight_at()'s value).
template <TcFmt F> __device__ __forceinline__ uint16_t tc_weight_bits(const DeviceWeight& w, int64_t n, int64_t k) {
  if constexpr (F == TcFmt::Fp8) {
    return f32_to_bf16_bits(fp8e4m3_to_f32(static_cast<const uint8_t*>(w.data)[n * w.data_stride + k]));
  } else {
    const uint32_t word = static_cast<const uint32_t*>(w.data)[n * w.data_stride + k / 8];
    const float q = float(int((word >> (4 * (k % 8))) & 0xfu) - 8);
    if constexpr (F == TcFmt::Int4F32) {
      return f32_to_bf16_bits(q);
    } else {
      const float s = bf16_bits_to_f32(static_cast<const uint16_t*>(w.scale)[n * w.scale_stride + k / 32]);
      return f32_to_bf16_bits(q * s);  // exactly weight_at()'s rounding of q * s to the scale's dtype
    }
  }
}

template <TcFmt F> __device__ __forceinline__ float tc_scale(const DeviceWeight& w, int64_t n, int64_t k0) {
  if (n >= w.out) return 0.0f;
  if constexpr (F == TcFmt::Fp8) return static_cast<const float*>(w.scale)[(n / 128) * w.scale_stride + k0 / 128];
  else return static_cast<const float*>(w.scale)[n * w.scale_stride + k0 / 32];
}

template <TcFmt F, int TERMS>
__global__ void __launch_bounds__(kTcThreads)
    linear_tc_kernel(const float* __restrict__ x, int64_t ldx, int64_t T, DeviceWeight w, float* __restrict__ out,
                     int64_t ldo) {
  __shared__ __align__(16) uint16_t as[TERMS][kTcM][kTcK + kTcPad];  // x terms, [m][k]
  __shared__ __align__(16) uint16_t bs[kTcN][kTcK + kTcPad];         // W, [n][k]
  const int tid = int(threadIdx.x), lane = tid % 32, warp = tid / 32;  // mma.sync is NVIDIA-only: 32 lanes
  const int group = lane / 4, tig = lane % 4;
  const int wm = warp / 2, wn = warp % 2;
  const int64_t m0 = int64_t(blockIdx.y) * kTcM, n0 = int64_t(blockIdx.x) * kTcN;
  float acc[2][4][4] = {}, part[2][4][4] = {};
  constexpr int64_t G = tc_group<F>();

  for (int64_t k0 = 0; k0 < w.in; k0 += kTcK) {
    // Stage x as bf16 terms (residuals are exact in fp32) and W as bf16; zeros outside the matrix.
    for (int e = tid; e < kTcM * kTcK; e += kTcThreads) {
      const int r = e / kTcK, kk = e % kTcK;
      const int64_t m = m0 + r, k = k0 + kk;
      float v = (m < T && k < w.in) ? x[m * ldx + k] : 0.0f;
#pragma unroll
      for (int term = 0; term < TERMS; ++term) {
        const uint16_t b = f32_to_bf16_bits(v);
        as[term][r][kk] = b;
        v -= bf16_bits_to_f32(b);
      }
      const int64_t n = n0 + r;
      bs[r][kk] = (n < w.out && k < w.in) ? tc_weight_bits<F>(w, n, k) : uint16_t(0);
    }
    __syncthreads();
#pragma unroll
    for (int ks = 0; ks < kTcK; ks += 16) {
      const int c = ks + tig * 2;
      uint32_t b[4][2];
#pragma unroll
      for (int ni = 0; ni < 4; ++ni) {
        const int n = wn * 32 + ni * 8 + group;
        b[ni][0] = *reinterpret_cast<const uint32_t*>(&bs[n][c]);
        b[ni][1] = *reinterpret_cast<const uint32_t*>(&bs[n][c + 8]);
      }
      // Smallest term first: lo, mid, hi.
#pragma unroll
      for (int term = TERMS - 1; term >= 0; --term)
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
          const int r = wm * 32 + mi * 16 + group;
          const uint32_t a[4] = {*reinterpret_cast<const uint32_t*>(&as[term][r][c]),
                                 *reinterpret_cast<const uint32_t*>(&as[term][r + 8][c]),
                                 *reinterpret_cast<const uint32_t*>(&as[term][r][c + 8]),
                                 *reinterpret_cast<const uint32_t*>(&as[term][r + 8][c + 8])};
#pragma unroll
          for (int ni = 0; ni < 4; ++ni) mma_bf16_16816(tc_scaled<F>() ? part[mi][ni] : acc[mi][ni], a, b[ni]);
        }
    }
    __syncthreads();  // the next K tile overwrites as/bs
    if constexpr (tc_scaled<F>()) {
      // End of a scale group (or of K): acc += part * scale[n, group], per accumulator column.
      if ((k0 + kTcK) % G == 0 || k0 + kTcK >= w.in) {
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) {
          const int64_t n = n0 + wn * 32 + ni * 8 + tig * 2;
          const float s0 = tc_scale<F>(w, n, k0), s1 = tc_scale<F>(w, n + 1, k0);
#pragma unroll
          for (int mi = 0; mi < 2; ++mi) {
            acc[mi][ni][0] = fmaf(part[mi][ni][0], s0, acc[mi][ni][0]);
            acc[mi][ni][1] = fmaf(part[mi][ni][1], s1, acc[mi][ni][1]);
            acc[mi][ni][2] = fmaf(part[mi][ni][2], s0, acc[mi][ni][2]);
            acc[mi][ni][3] = fmaf(part[mi][ni][3], s1, acc[mi][ni][3]);
#pragma unroll
            for (int q = 0; q < 4; ++q) part[mi][ni][q] = 0.0f;
          }
        }
      }
    }
  }
  // D fragment: d0, d1 at (row group, cols 2 tig, 2 tig + 1); d2, d3 at row group + 8.
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int ni = 0; ni < 4; ++ni)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int64_t m = m0 + wm * 32 + mi * 16 + group + (q >= 2 ? 8 : 0);
        const int64_t n = n0 + wn * 32 + ni * 8 + tig * 2 + (q & 1);
        if (m < T && n < w.out) out[m * ldo + n] = acc[mi][ni][q];
      }
}

template <TcFmt F>
void launch_tc(GpuBackend& be, const float* x, int64_t ldx, int64_t T, const DeviceWeight& w, float* out, int64_t ldo) {
  const dim3 grid(unsigned((w.out + kTcN - 1) / kTcN), unsigned((T + kTcM - 1) / kTcM));
  MLA_CHECK(grid.y <= 65535u, "linear: {} tokens exceed the tensor-core kernel's grid", T);
  if (be.options().gemm_precision == GemmPrecision::Fp32)
    linear_tc_kernel<F, 3><<<grid, kTcThreads, 0, be.stream()>>>(x, ldx, T, w, out, ldo);
  else
    linear_tc_kernel<F, 1><<<grid, kTcThreads, 0, be.stream()>>>(x, ldx, T, w, out, ldo);
  MLA_GPU_LAUNCH_CHECK();
}

}  // namespace

bool linear_tc_supports(const ops::Weight& w) {
  if (w.format == ops::WeightFormat::Fp8Block128) return true;
  return w.format == ops::WeightFormat::Int4Group32 &&
         (w.scale.dtype == DType::BF16 || w.scale.dtype == DType::F32);
}

bool linear_tc(GpuBackend& be, const TensorView& x, const ops::Weight& w, const TensorView& out) {
  if (!linear_tc_supports(w)) return false;
  const DeviceWeight dw = device_weight(w);
  const int64_t T = x.dim(0);
  const float* xp = x.as<const float>();
  float* op = out.as<float>();
  if (w.format == ops::WeightFormat::Fp8Block128) launch_tc<TcFmt::Fp8>(be, xp, x.stride[0], T, dw, op, out.stride[0]);
  else if (w.scale.dtype == DType::BF16) launch_tc<TcFmt::Int4Bf16>(be, xp, x.stride[0], T, dw, op, out.stride[0]);
  else launch_tc<TcFmt::Int4F32>(be, xp, x.stride[0], T, dw, op, out.stride[0]);
  return true;
}

#else  // HIP: mma.sync is NVIDIA-only; the generic kernel takes quantized prefill.

bool linear_tc_supports(const ops::Weight&) { return false; }
bool linear_tc(GpuBackend&, const TensorView&, const ops::Weight&, const TensorView&) { return false; }

#endif

}  // namespace mla::gpu
