// Device helpers shared by the two tensor-core decode matvecs (gpu_decode_tc.cu: MoE experts;
// gpu_dense_tc.cu: dense linear layers and per-head MLA matvecs). Both take the weights as the
// mma.sync A operand straight from 16-byte loads and the activations as 16-bit B columns; this
// header fixes the number formats they share so the two kernels round identically.
#pragma once

#include <cstdint>

#include "backend/gpu/gpu_device.cuh"
#include "backend/gpu/gpu_moe_state.h"

#if MLA_GPU_CUDA
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "backend/gpu/gpu_mma.cuh"
#endif

namespace mla::gpu::decode_tc {

constexpr int64_t kActChunk = 64;  // k per activation scale (FP8 path) = rows per CTA

// k per lane-quad chunk (4 lanes x 16 bytes = 64 bytes of one row): 64 fp8, 32 bf16 (dense layers
// only) or 128 int4 weights.
constexpr int64_t chunk_k(MoeFormat f) { return f == MoeFormat::FP8 ? 64 : f == MoeFormat::BF16 ? 32 : 128; }

#if MLA_GPU_CUDA

// INT4 B storage order: logical k = 8 c + j sits at 8 c + 2 (j % 4) + j / 4, i.e. a group of 8 is
// stored (x0, x4, x1, x5, x2, x6, x3, x7) so that 32-bit word p holds the pair (x_p, x_{p+4}) that
// the nibble extraction ((w >> 4p) & 0x000f000f) pairs in the A fragment.
__device__ __forceinline__ int64_t act_pos_i4(int64_t k) {
  const int j = int(k & 7);
  return (k & ~int64_t(7)) | int64_t(((j & 3) << 1) | (j >> 2));
}

// scale = 2^s with max|v| * scale in [2^14, 2^15) (so f16 neither overflows nor loses range), inv =
// 2^-s; both exact. Zero, NaN or inf max: s = 0. |s| <= 100 keeps both normal.
__device__ __forceinline__ void pow2_scale(float amax, float& scale, float& inv) {
  const int e = int((__float_as_uint(amax) >> 23) & 0xffu);  // biased exponent of the max
  int s = (amax > 0.0f && e < 255) ? 14 - (max(e, 1) - 127) : 0;
  s = min(max(s, -100), 100);
  scale = __uint_as_float(uint32_t(127 + s) << 23);
  inv = __uint_as_float(uint32_t(127 - s) << 23);
}

__device__ __forceinline__ uint16_t f16_bits(float v) { return __half_as_ushort(__float2half_rn(v)); }

__device__ __forceinline__ uint32_t word_of(const uint4& r, int i) {
  return i == 0 ? r.x : i == 1 ? r.y : i == 2 ? r.z : r.w;
}

// Two e4m3 (low byte -> low half) as an exact f16x2.
__device__ __forceinline__ uint32_t fp8x2_to_f16x2(uint32_t two) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(two & 0xffffu), __NV_E4M3);
  return uint32_t(h.x) | (uint32_t(h.y) << 16);
}

// (a & kMask) | kBits as one LOP3. Written as C++, ptxas emits an AND and an OR here (a SASS LOP3
// takes at most one immediate and it does not move the other constant to a register), which made
// every magic below two instructions per output (SASS of the fused MoE kernel, session 25).
template <uint32_t kMask, uint32_t kBits>
__device__ __forceinline__ uint32_t and_or(uint32_t a) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(d) : "r"(a), "n"(kMask), "n"(kBits));  // 0xea: (a & b) | c
  return d;
}

// Nibbles p and p + 4 of `w` as the bf16x2 (128 + n_p, 128 + n_{p+4}), exact: 0x4300 | n is 128 + n
// (bf16's ulp at 128 is 1). One shift and one lop3.
__device__ __forceinline__ uint32_t int4x2_magic_bf16x2(uint32_t w, int p) {
  return and_or<0x000f000fu, 0x43004300u>(w >> (4 * p));
}

// The four nibble pairs (p, p + 4) of `w` as f16x2, exact, for p = 0..3: (1024 + n_p, 1024 +
// n_{p+4}) for even p and (1024 + 16 n_p, 1024 + 16 n_{p+4}) for odd p (0x6400 | n is 1024 + n; f16's
// ulp at 1024 is 1, so a nibble at bits 4..7 of a half adds 16 n). Five instructions for eight
// weights (one shift, four lop3) against seven for int4x2_magic_bf16x2's bf16 pairs; the caller's
// B carries the activation / 16 for odd p and an offset per group (gpu_decode_tc.cu:
// moe_tc_prep_i4_kernel for x, write_pass for h).
__device__ __forceinline__ void int4x8_magic_f16x2(uint32_t w, uint32_t (&p)[4]) {
  const uint32_t w8 = w >> 8;
  p[0] = and_or<0x000f000fu, 0x64006400u>(w);
  p[1] = and_or<0x00f000f0u, 0x64006400u>(w);
  p[2] = and_or<0x000f000fu, 0x64006400u>(w8);
  p[3] = and_or<0x00f000f0u, 0x64006400u>(w8);
}

// Nibbles p and p + 4 of `w` as the bf16x2 (bf16(q_p s), bf16(q_{p+4} s)), q = nibble - 8:
// fma(128 + n, 1, -136) = q exactly; fma(q, s, -0) rounds the exact q s once to bf16 = weight_at's
// round_scale_dtype(q * s) (sign of zero included). s2 = (s, s).
__device__ __forceinline__ uint32_t int4x2_to_bf16x2(uint32_t w, int p, uint32_t s2) {
  const uint32_t x = int4x2_magic_bf16x2(w, p);
  const uint32_t q = mma::fma_bf16x2(x, 0x3f803f80u, 0xc308c308u);
  return mma::fma_bf16x2(q, s2, 0x80008000u);
}

#endif  // MLA_GPU_CUDA

}  // namespace mla::gpu::decode_tc
