// Device pieces shared by the two tensor-core grouped MoE kernels (gpu_moe_grouped_tc.cu: mma.sync;
// gpu_moe_grouped_sm90a.cu: wgmma): the exact FP8 / INT4 -> bf16 conversions, bf16 packing, the
// CTA's weight-row map and the gate/up epilogue. Both kernels compute the same values (gpu_moe_grouped_tc.h).
#pragma once

#include <cstdint>

#include "backend/gpu/gpu_device.cuh"
#include "backend/gpu/gpu_moe_state.h"

#if MLA_GPU_CUDA
#include "backend/gpu/gpu_decode_tc.cuh"
#include "backend/gpu/gpu_mma.cuh"

namespace mla::gpu::moe_grouped {

// Bytes 0, 1 (lo) or 2, 3 (hi) of `w` (e4m3 codes) as an exact bf16x2. The bits placed as
// (b & 0x80) << 8 | (b & 0x7f) << 4 are the bf16 fp8(b) x 2^-120 (fp8 subnormals become bf16
// subnormals, exactly); the FMA by 2^120 (0x7b80) with -0 addend rounds nothing (the product is
// representable). The NaN codes 0x7f / 0xff decode to +-480 here (weight_at: NaN): never in a
// checkpoint, as no finite scale makes them.
__device__ __forceinline__ uint32_t fp8x2_to_bf16x2(uint32_t w, bool hi) {
  const uint32_t t = __byte_perm(w, 0u, hi ? 0x4342u : 0x4140u);  // b | b' << 16
  const uint32_t x = ((t << 8) & 0x80008000u) | ((t << 4) & 0x07f007f0u);
  return mma::fma_bf16x2(x, 0x7b807b80u, 0x80008000u);
}

// 16 e4m3 codes (one 16-byte chunk) as two chunks of 8 exact bf16: elements 0-7 and 8-15.
__device__ __forceinline__ void fp8x16_to_bf16(const uint4& v, uint4& lo, uint4& hi) {
  lo.x = fp8x2_to_bf16x2(v.x, false);
  lo.y = fp8x2_to_bf16x2(v.x, true);
  lo.z = fp8x2_to_bf16x2(v.y, false);
  lo.w = fp8x2_to_bf16x2(v.y, true);
  hi.x = fp8x2_to_bf16x2(v.z, false);
  hi.y = fp8x2_to_bf16x2(v.z, true);
  hi.z = fp8x2_to_bf16x2(v.w, false);
  hi.w = fp8x2_to_bf16x2(v.w, true);
}

// 8 INT4 nibbles (one word: elements 0-7 of its 8-k run) as one chunk of 8 exact bf16(q s), s2 =
// (s, s) the group's bf16 scale twice (decode_tc::int4x2_to_bf16x2 yields the pairs (e_j, e_j+4)).
__device__ __forceinline__ uint4 int4x8_to_bf16(uint32_t word, uint32_t s2) {
  uint32_t p[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) p[j] = decode_tc::int4x2_to_bf16x2(word, j, s2);
  uint4 o;
  o.x = __byte_perm(p[0], p[1], 0x5410u);  // (e0, e1)
  o.y = __byte_perm(p[2], p[3], 0x5410u);  // (e2, e3)
  o.z = __byte_perm(p[0], p[1], 0x7632u);  // (e4, e5)
  o.w = __byte_perm(p[2], p[3], 0x7632u);  // (e6, e7)
  return o;
}

// Two floats as bf16x2 (round to nearest even), `lo` in the low half.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  return uint32_t(f32_to_bf16_bits(lo)) | (uint32_t(f32_to_bf16_bits(hi)) << 16);
}

// Weight row of B row r (0..127) of a CTA whose output columns start at n0: gate/up rows 0..63 are
// gate rows n0 + r, 64..127 up rows n0 + r - 64; down rows are n0 + r.
template <bool kGateUp> __device__ __forceinline__ int64_t b_row(int64_t n0, int r) {
  return kGateUp ? n0 + (r & 63) : n0 + r;
}

// What one CTA of a grouped launch (grid: column tiles x plan row tiles) computes: sorted pairs
// [m0, m0 + m_rows) of one expert (m_rows <= kBM) against output columns from n0 of weights w0, w1
// (gate and up, or down twice).
struct GroupedCta {
  int m0 = 0, m_rows = 0;
  int64_t n0 = 0;
  DeviceWeight w0, w1;
};
// Fills `c` for this CTA; false when it has nothing to do: plan tile blockIdx.y past the plan's
// count, or not the first plan tile of a kBM-row group of its expert's segment (the group's first
// tile covers it). Uniform per CTA: call before any barrier.
template <bool kGateUp, int kBM, int kNMat>
__device__ __forceinline__ bool grouped_cta(const DeviceExpert* table, const moe::Plan& plan, GroupedCta& c) {
  const int tile = int(blockIdx.y);
  if (tile >= plan.counters[1]) return false;
  const int e = plan.tile_expert[tile];
  const int seg_begin = plan.offsets[e], seg_end = plan.offsets[e + 1];
  c.m0 = plan.tile_start[tile];
  if ((c.m0 - seg_begin) % kBM != 0) return false;
  c.m_rows = min(kBM, seg_end - c.m0);
  c.n0 = int64_t(blockIdx.x) * kNMat;
  const DeviceExpert& ex = table[e];
  c.w0 = kGateUp ? ex.gate : ex.down;
  c.w1 = kGateUp ? ex.up : ex.down;
  return true;
}

// silu(g) u, the gate/up epilogue (the CPU reference's formula).
__device__ __forceinline__ float silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

}  // namespace mla::gpu::moe_grouped
#endif  // MLA_GPU_CUDA
