// Expert kernels of moe_experts (included by gpu_moe.cu only): per-format dequantization of 16-byte
// weight chunks, the decode path (warps stream an expert's rows once for all tokens routed to it,
// bandwidth-bound) and the grouped-GEMM prefill path (smem-tiled fp32 FMA over sorted pair segments).
// Every weight value is exactly weight_at()'s value; only the fp32 summation order differs from the CPU.
#pragma once

#include <cstdint>

#include "backend/gpu/gpu_device.cuh"
#include "backend/gpu/gpu_moe_state.h"

namespace mla::gpu::moe {

constexpr int kThreads = 256;  // every expert kernel; a multiple of kWarpSize on both vendors
__device__ __forceinline__ float silu_mul1(float g, float u) { return g / (1.0f + expf(-g)) * u; }

// Rounds q * s to the scale dtype like weight_at (ops/weight.h: W = round_scale_dtype(q * s)).
template <MoeFormat F> __device__ __forceinline__ float int4_value(int q, float s) {
  const float v = float(q) * s;
  if constexpr (F == MoeFormat::I4_BF16) return bf16_bits_to_f32(f32_to_bf16_bits(v));
  else if constexpr (F == MoeFormat::I4_F16) return f16_bits_to_f32(f32_to_f16_bits(v));
  else return v;
}

template <MoeFormat F> __device__ __forceinline__ float int4_scale(const DeviceWeight& w, int64_t idx) {
  if constexpr (F == MoeFormat::I4_F32) return static_cast<const float*>(w.scale)[idx];
  else if constexpr (F == MoeFormat::I4_F16) return f16_bits_to_f32(static_cast<const uint16_t*>(w.scale)[idx]);
  else return bf16_bits_to_f32(static_cast<const uint16_t*>(w.scale)[idx]);
}

// W[o, i] for a format known at compile time (same value as weight_at).
template <MoeFormat F> __device__ __forceinline__ float deq_at(const DeviceWeight& w, int64_t o, int64_t i) {
  if constexpr (F == MoeFormat::BF16) {
    return bf16_bits_to_f32(static_cast<const uint16_t*>(w.data)[o * w.data_stride + i]);
  } else if constexpr (F == MoeFormat::F16) {
    return f16_bits_to_f32(static_cast<const uint16_t*>(w.data)[o * w.data_stride + i]);
  } else if constexpr (F == MoeFormat::F32) {
    return static_cast<const float*>(w.data)[o * w.data_stride + i];
  } else if constexpr (F == MoeFormat::FP8) {
    const float q = fp8e4m3_to_f32(static_cast<const uint8_t*>(w.data)[o * w.data_stride + i]);
    return q * static_cast<const float*>(w.scale)[(o / 128) * w.scale_stride + i / 128];
  } else {
    const uint32_t word = static_cast<const uint32_t*>(w.data)[o * w.data_stride + i / 8];
    const int q = int((word >> (4 * (i % 8))) & 0xfu) - 8;
    return int4_value<F>(q, int4_scale<F>(w, o * w.scale_stride + i / 32));
  }
}

// ---- decode path -----------------------------------------------------------------------------------
// Grid (min(P, E) expert slots, ceil(rows / rows per CTA)); the CTA of slot j serves active[j] (slots
// past the active count exit at once: the grid is fixed by shapes, the work by the plan). Each warp
// owns decode_rows() output rows (x 2 matrices for gate/up) and streams them once per kDecodeTokens
// tokens of the expert. Every lane issues 16-byte loads (16 fp8 / 32 int4 / 8 bf16 values) and a warp
// covers 512 contiguous bytes of a row per load; all of a step's loads (decode_unroll per row and
// matrix) are issued before any is consumed, so a lane has 8 x 16 B in flight.
//
// Napkin (DeepSeek-V3 expert 7168 x 2048, FP8, batch 1 = 8 experts, 352 MB; H200 4.3 TB/s -> 82 us):
// - bytes in flight: 256 threads x 8 x 16 B = 32 KB per CTA; ptxas: <= 128 regs (launch bound 2),
//   so 2 CTAs/SM = 64 KB per SM, the ~40-64 KB (4.8 TB/s x ~1 us / 132 SMs) that saturates HBM.
//   (3 CTAs/SM forces 80 regs and 100-170 B of spills per thread for FP8/INT4: worse.)
// - busy CTAs at batch 1 (FP8): gate/up 8 experts x 2048 / 8 rows = 2048, down 8 x 7168 / 16 = 3584
//   (INT4 down: / 32 = 1792); >= 13 per SM on 132 SMs, every CTA of a live slot streams rows.
// - issue budget: 132 SMs x 128 lanes x ~1.75 GHz = 2.9e13 lane-ops/s over 3 TB/s (70% target) is
//   ~10 ops per weight byte. FP8: ~2.75 int ops (bits) + 1 FMUL (scale) + 1 FMA per token per
//   element ~= 5 per byte. INT4 (bf16 scale): per 2 elements 2 int ops + 2 packed bf16 FMAs + 2
//   unpacks, then 1 FMA per token: ~4 per element = ~8 per byte (the per-element scale rounding is
//   what makes INT4 the tight one; the packed bf16 FMA does it exactly at half cost).
// - x / h: fp32, read through L1 (float4), shared by both matrices and all rows of the warp; weights
//   are loaded evict-first (__ldcs) so they do not push x out of L1.
constexpr int kDecodeTokens = 4;

constexpr bool is_int4(MoeFormat f) {
  return f == MoeFormat::I4_BF16 || f == MoeFormat::I4_F16 || f == MoeFormat::I4_F32;
}
// Weight elements per 16-byte load, elements dequantized at a time, and bytes per data_stride unit.
constexpr int vec_elems(MoeFormat f) {
  return f == MoeFormat::FP8 ? 16 : is_int4(f) ? 32 : f == MoeFormat::F32 ? 4 : 8;
}
constexpr int group_elems(MoeFormat f) { return f == MoeFormat::F32 ? 4 : 8; }
constexpr int stride_bytes(MoeFormat f) {
  return f == MoeFormat::FP8 ? 1 : (is_int4(f) || f == MoeFormat::F32) ? 4 : 2;
}

// The scale row serving weight row o (FP8: its 128-row block; INT4: its own; dense: none), and the
// raw bits of 16-byte chunk c's scale in it: FP8 the float of its 128 x 128 block (a 16-element
// chunk never straddles one), INT4 the 16/32-bit scale of its 32-group (a chunk is one group).
template <MoeFormat F> __device__ __forceinline__ const void* scale_row(const DeviceWeight& w, int64_t o) {
  if constexpr (F == MoeFormat::FP8 || F == MoeFormat::I4_F32)
    return static_cast<const float*>(w.scale) + (F == MoeFormat::FP8 ? o / 128 : o) * w.scale_stride;
  else if constexpr (F == MoeFormat::I4_BF16 || F == MoeFormat::I4_F16)
    return static_cast<const uint16_t*>(w.scale) + o * w.scale_stride;
  else
    return nullptr;
}
template <MoeFormat F> __device__ __forceinline__ uint32_t chunk_scale_bits(const void* srow, int64_t c) {
  if constexpr (F == MoeFormat::FP8) return __float_as_uint(static_cast<const float*>(srow)[c / 8]);
  else if constexpr (F == MoeFormat::I4_F32) return __float_as_uint(static_cast<const float*>(srow)[c]);
  else if constexpr (F == MoeFormat::I4_BF16 || F == MoeFormat::I4_F16) return static_cast<const uint16_t*>(srow)[c];
  else return 0u;
}

// Per-chunk dequantization constants. FP8 fast path: the byte's bits placed in an f32 as
// (b & 0x80) << 24 | (b & 0x7f) << 20 are exactly fp8(b) * 2^-120 (subnormals included, f32
// denormals are not flushed in this build), so fp32(that * (s * 2^120)) == fp32(fp8(b) * s): the same
// real product, rounded once. It needs s * 2^120 finite (|s| < 2^8) and no NaN code (low 7 bits all
// ones); otherwise the chunk takes the exact scalar decode.
struct ChunkScale {
  float s = 0.0f, s_hi = 0.0f;
  uint32_t bits = 0;
  bool fast = true;
};

template <MoeFormat F> __device__ __forceinline__ ChunkScale chunk_scale(const uint4& raw, uint32_t bits) {
  ChunkScale cs;
  cs.bits = bits;
  if constexpr (F == MoeFormat::FP8) {
    cs.s = __uint_as_float(bits);
    cs.s_hi = cs.s * 0x1p120f;
    const uint32_t m = 0x7f7f7f7fu, one = 0x01010101u;
    const uint32_t nan_bytes = ((raw.x & m) + one) | ((raw.y & m) + one) | ((raw.z & m) + one) | ((raw.w & m) + one);
    cs.fast = (nan_bytes & 0x80808080u) == 0u && fabsf(cs.s) < 256.0f;
  } else if constexpr (F == MoeFormat::I4_F32) {
    cs.s = __uint_as_float(bits);
  } else if constexpr (F == MoeFormat::I4_BF16) {
    cs.s = bf16_bits_to_f32(uint16_t(bits));
  } else if constexpr (F == MoeFormat::I4_F16) {
    cs.s = f16_bits_to_f32(uint16_t(bits));
  }
  return cs;
}

__device__ __forceinline__ uint32_t word_of(const uint4& r, int i) {
  return i == 0 ? r.x : i == 1 ? r.y : i == 2 ? r.z : r.w;
}

#if MLA_GPU_CUDA && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
// Packed 16-bit FMAs with a single rounding of the exact a * b + c (subnormals kept).
__device__ __forceinline__ uint32_t fma_bf16x2(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
__device__ __forceinline__ uint32_t fma_f16x2(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
#define MLA_MOE_PACKED_INT4 1
#else
#define MLA_MOE_PACKED_INT4 0
#endif

// Elements g * G .. g * G + G of a 16-byte chunk as fp32, each exactly weight_at's value.
template <MoeFormat F> __device__ __forceinline__ void deq_group(const uint4& raw, int g, const ChunkScale& cs,
                                                                 float (&v)[group_elems(F)]) {
  if constexpr (F == MoeFormat::FP8) {
    if (cs.fast) {  // one branch per group, not a select per element
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t word = word_of(raw, 2 * g + h);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const uint32_t b = word >> (8 * j);
          v[4 * h + j] = __uint_as_float(((b << 24) & 0x80000000u) | ((b << 20) & 0x07f00000u)) * cs.s_hi;
        }
      }
    } else {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t word = word_of(raw, 2 * g + h);
#pragma unroll
        for (int j = 0; j < 4; ++j) v[4 * h + j] = fp8e4m3_to_f32(uint8_t(word >> (8 * j))) * cs.s;
      }
    }
  } else if constexpr (is_int4(F)) {
    const uint32_t word = word_of(raw, g);
    constexpr bool kPacked = MLA_MOE_PACKED_INT4 && (F == MoeFormat::I4_BF16 || F == MoeFormat::I4_F16);
    if constexpr (kPacked) {
#if MLA_MOE_PACKED_INT4
      // Nibble n into the mantissa of 128.0 (bf16 0x4300) / 1024.0 (f16 0x6400): exactly 128 + n /
      // 1024 + n; fma(x, 1, -136 / -1032) = n - 8 exactly; fma(q, s, -0) = round16(q * s) with q * s
      // exact in the fma, i.e. weight_at's round_scale_dtype(q * s), sign of zero included.
      constexpr bool kBf = F == MoeFormat::I4_BF16;
      constexpr uint32_t kMagic = kBf ? 0x43004300u : 0x64006400u, kOne = kBf ? 0x3f803f80u : 0x3c003c00u;
      constexpr uint32_t kBias = kBf ? 0xc308c308u : 0xe408e408u, kNegZero = 0x80008000u;
      const uint32_t s2 = cs.bits | (cs.bits << 16);
#pragma unroll
      for (int p = 0; p < 4; ++p) {  // lanes: element p (low half), element p + 4 (high half)
        const uint32_t x = ((word >> (4 * p)) & 0x000f000fu) | kMagic;
        const uint32_t q = kBf ? fma_bf16x2(x, kOne, kBias) : fma_f16x2(x, kOne, kBias);
        const uint32_t w = kBf ? fma_bf16x2(q, s2, kNegZero) : fma_f16x2(q, s2, kNegZero);
        if constexpr (kBf) {
          v[p] = __uint_as_float(w << 16);
          v[p + 4] = __uint_as_float(w & 0xffff0000u);
        } else {
          asm("cvt.f32.f16 %0, %1;" : "=f"(v[p]) : "h"(uint16_t(w & 0xffffu)));
          asm("cvt.f32.f16 %0, %1;" : "=f"(v[p + 4]) : "h"(uint16_t(w >> 16)));
        }
      }
#endif
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int q = int((word >> (4 * j)) & 0xfu) - 8;
        if constexpr (F == MoeFormat::I4_F32) v[j] = float(q) * cs.s;
        else v[j] = int4_value<F>(q, cs.s);
      }
    }
  } else if constexpr (F == MoeFormat::BF16) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t word = word_of(raw, j);
      v[2 * j] = __uint_as_float(word << 16);
      v[2 * j + 1] = __uint_as_float(word & 0xffff0000u);
    }
  } else if constexpr (F == MoeFormat::F16) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t word = word_of(raw, j);
      v[2 * j] = f16_bits_to_f32(uint16_t(word & 0xffffu));
      v[2 * j + 1] = f16_bits_to_f32(uint16_t(word >> 16));
    }
  } else {
    v[0] = __uint_as_float(raw.x);
    v[1] = __uint_as_float(raw.y);
    v[2] = __uint_as_float(raw.z);
    v[3] = __uint_as_float(raw.w);
  }
}

// Streaming 16-byte weight load: evict-first so the reused x / h rows stay in L1.
__device__ __forceinline__ uint4 load_weight16(const uint4* p) {
#if MLA_GPU_CUDA
  return __ldcs(p);
#else
  return *p;
#endif
}

// x[k0 .. k0+N) of an fp32 row; `vec`: the row is 16-byte aligned (uniform per launch).
template <int N> __device__ __forceinline__ void load_x(const float* row, int64_t k0, bool vec, float (&v)[N]) {
  if (vec) {
#pragma unroll
    for (int i = 0; i < N; i += 4) {
      const float4 a = *reinterpret_cast<const float4*>(row + k0 + i);
      v[i] = a.x;
      v[i + 1] = a.y;
      v[i + 2] = a.z;
      v[i + 3] = a.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = row[k0 + i];
  }
}

// Output rows per warp and 16-byte loads per row-stream per step: every lane keeps 8 loads (128 B)
// in flight. Gate/up streams 2 matrices per row; down 1 matrix over 2 rows, or for INT4 over 4 rows
// with 2 loads each (a 2048-wide INT4 row is only 64 chunks = 2 warp steps, so more rows, not more
// depth, is what fills the pipe). I4_F16 keeps 2 rows: its portable scalar rounding path is too
// big for hipcc to unroll 4 rows. Host and device passes must agree (grid), so no __CUDA_ARCH__ here.
template <MoeFormat F, bool kGateUp> constexpr int decode_rows() {
  return kGateUp ? 1 : (is_int4(F) && F != MoeFormat::I4_F16) ? 4 : 2;
}
template <MoeFormat F, bool kGateUp> constexpr int decode_unroll() { return !kGateUp && is_int4(F) ? 2 : 4; }

template <MoeFormat F, bool kGateUp>
__global__ void __launch_bounds__(kThreads, 2) moe_decode_kernel(const DeviceExpert* __restrict__ table, Plan plan,
                                                               const float* __restrict__ a, int64_t a_stride,
                                                               int a_vec, int top_k, int64_t rows, int64_t k_dim,
                                                               float* __restrict__ out, int64_t out_stride) {
  if (int(blockIdx.x) >= plan.counters[0]) return;
  constexpr int kWarps = kThreads / kWarpSize;
  constexpr int kMats = kGateUp ? 2 : 1;
  constexpr int kRows = decode_rows<F, kGateUp>(), kUnroll = decode_unroll<F, kGateUp>();
  constexpr int kE = vec_elems(F), kG = group_elems(F), kGroups = kE / kG;
  const int lane = int(threadIdx.x) % kWarpSize;
  const int64_t row0 = (int64_t(blockIdx.y) * kWarps + int(threadIdx.x) / kWarpSize) * kRows;
  if (row0 >= rows) return;  // whole warps only; no block-wide barrier below
  int64_t row[kRows];        // rows past the end repeat the last row (computed, never stored)
#pragma unroll
  for (int r = 0; r < kRows; ++r) row[r] = min(row0 + r, rows - 1);
  const int e = plan.active[blockIdx.x];
  const DeviceExpert& ex = table[e];
  DeviceWeight w[kMats];
  w[0] = kGateUp ? ex.gate : ex.down;
  if constexpr (kGateUp) w[kMats - 1] = ex.up;
  const bool vec = (kGateUp ? ex.vec_gate_up : ex.vec_down) != 0;
  const int64_t chunks = vec ? k_dim / kE : 0;  // 16-byte chunks per row; the rest is the scalar tail
  const uint4* wrow[kMats][kRows];
  const void* srow[kMats][kRows];
#pragma unroll
  for (int m = 0; m < kMats; ++m)
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      wrow[m][r] = reinterpret_cast<const uint4*>(static_cast<const char*>(w[m].data) +
                                                  row[r] * w[m].data_stride * stride_bytes(F));
      srow[m][r] = scale_row<F>(w[m], row[r]);
    }
  const int begin = plan.offsets[e], end = plan.offsets[e + 1];

  for (int p0 = begin; p0 < end; p0 += kDecodeTokens) {
    const int n = min(kDecodeTokens, end - p0);  // warp-uniform
    const float* arow[kDecodeTokens];
#pragma unroll
    for (int j = 0; j < kDecodeTokens; ++j) {
      const int p = p0 + min(j, n - 1);
      arow[j] = kGateUp ? a + int64_t(plan.sorted[p] / top_k) * a_stride : a + int64_t(p) * a_stride;
    }
    float acc[kMats][kRows][kDecodeTokens] = {};
    for (int64_t c0 = lane; c0 < chunks; c0 += int64_t(kUnroll) * kWarpSize) {
      // Issue every load of this step before consuming any: kMats x kRows x kUnroll in flight.
      uint4 raw[kUnroll][kMats][kRows];
      uint32_t sbits[kUnroll][kMats][kRows];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t c = c0 + int64_t(u) * kWarpSize;
#pragma unroll
        for (int m = 0; m < kMats; ++m)
#pragma unroll
          for (int r = 0; r < kRows; ++r) {
            if (c < chunks) {
              raw[u][m][r] = load_weight16(wrow[m][r] + c);
              sbits[u][m][r] = chunk_scale_bits<F>(srow[m][r], c);
            } else {
              raw[u][m][r] = make_uint4(0u, 0u, 0u, 0u);
              sbits[u][m][r] = 0u;
            }
          }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t c = c0 + int64_t(u) * kWarpSize;
        if (c < chunks) {  // false only in a row's last step; no shuffles inside
          ChunkScale cs[kMats][kRows];
#pragma unroll
          for (int m = 0; m < kMats; ++m)
#pragma unroll
            for (int r = 0; r < kRows; ++r) cs[m][r] = chunk_scale<F>(raw[u][m][r], sbits[u][m][r]);
#pragma unroll
          for (int g = 0; g < kGroups; ++g) {
            float wv[kMats][kRows][kG];
#pragma unroll
            for (int m = 0; m < kMats; ++m)
#pragma unroll
              for (int r = 0; r < kRows; ++r) deq_group<F>(raw[u][m][r], g, cs[m][r], wv[m][r]);
#pragma unroll
            for (int j = 0; j < kDecodeTokens; ++j) {
              if (j < n) {
                float xv[kG];
                load_x<kG>(arow[j], c * kE + g * kG, a_vec != 0, xv);
#pragma unroll
                for (int m = 0; m < kMats; ++m)
#pragma unroll
                  for (int r = 0; r < kRows; ++r)
#pragma unroll
                    for (int i = 0; i < kG; ++i) acc[m][r][j] = fmaf(wv[m][r][i], xv[i], acc[m][r][j]);
              }
            }
          }
        }
      }
    }
    // Tail (k_dim % kE) or rows not 16-byte readable: scalar, exact weight_at values.
    for (int64_t k = chunks * kE + lane; k < k_dim; k += kWarpSize) {
      float wv[kMats][kRows];
#pragma unroll
      for (int m = 0; m < kMats; ++m)
#pragma unroll
        for (int r = 0; r < kRows; ++r) wv[m][r] = deq_at<F>(w[m], row[r], k);
#pragma unroll
      for (int j = 0; j < kDecodeTokens; ++j) {
        if (j < n) {
          const float xv = arow[j][k];
#pragma unroll
          for (int m = 0; m < kMats; ++m)
#pragma unroll
            for (int r = 0; r < kRows; ++r) acc[m][r][j] = fmaf(wv[m][r], xv, acc[m][r][j]);
        }
      }
    }
#pragma unroll
    for (int j = 0; j < kDecodeTokens; ++j) {
      if (j < n) {  // warp-uniform: the shuffles see the whole warp
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          const float s0 = warp_sum(acc[0][r][j]);
          const float s1 = kGateUp ? warp_sum(acc[kMats - 1][r][j]) : 0.0f;
          if (lane == 0 && row0 + r < rows) {
            if constexpr (kGateUp) out[int64_t(p0 + j) * out_stride + row[r]] = silu_mul1(s0, s1);
            else out[int64_t(plan.sorted[p0 + j]) * out_stride + row[r]] = s0;
          }
        }
      }
    }
  }
}

// ---- grouped (prefill) path ------------------------------------------------------------------------
// One CTA per (row tile of kBM sorted pairs of one expert, kBN output rows). A = the tile's
// activation rows (gathered x rows, or h rows which are contiguous in sorted order), B = dequantized
// weight rows, both staged in smem per kBK slice; each thread owns a 2 x 4 micro-tile (per matrix).
// Napkin: per kBK step 32x64 (x2 for gate/up) FMAs per 2 KB weights dequantized once per CTA; fp32
// FMA bound (~60 TFLOP/s on H200), weights reread once per 32 pairs. Correct first; tensor cores later.
constexpr int kBM = 32, kBN = 64, kBK = 32;

template <MoeFormat F, bool kGateUp>
__global__ void __launch_bounds__(kThreads) moe_grouped_kernel(const DeviceExpert* __restrict__ table, Plan plan,
                                                               const float* __restrict__ a, int64_t a_stride,
                                                               int top_k, int64_t rows, int64_t k_dim,
                                                               float* __restrict__ out, int64_t out_stride) {
  const int tile = int(blockIdx.x);
  if (tile >= plan.counters[1]) return;  // uniform per CTA: before any barrier
  const int64_t n0 = int64_t(blockIdx.y) * kBN;
  const int e = plan.tile_expert[tile];
  const int m0 = plan.tile_start[tile], seg_end = plan.offsets[e + 1];
  const DeviceExpert& ex = table[e];
  const DeviceWeight w0 = kGateUp ? ex.gate : ex.down;
  const DeviceWeight w1 = ex.up;

  __shared__ float as[kBK][kBM + 1];
  __shared__ float bs0[kBK][kBN + 1];
  __shared__ float bs1[kGateUp ? kBK : 1][kGateUp ? kBN + 1 : 1];

  const int tid = int(threadIdx.x);
  // A loader: thread loads k = tid % 32 of rows m = tid / 32 + 8 i (i < 4): coalesced along k.
  const int ak = tid % kBK;
  const float* arow[kBM * kBK / kThreads];
#pragma unroll
  for (int i = 0; i < kBM * kBK / kThreads; ++i) {
    const int m = tid / kBK + i * (kThreads / kBK), p = m0 + m;
    if (p < seg_end) arow[i] = kGateUp ? a + int64_t(plan.sorted[p] / top_k) * a_stride : a + int64_t(p) * a_stride;
    else arow[i] = nullptr;
  }
  const int ty = tid / 16, tx = tid % 16;  // micro-tile rows ty*2 + {0,1}, cols tx + 16 j
  float acc0[2][4] = {}, acc1[2][4] = {};

  for (int64_t k0 = 0; k0 < k_dim; k0 += kBK) {
    const int64_t k = k0 + ak;
#pragma unroll
    for (int i = 0; i < kBM * kBK / kThreads; ++i)
      as[ak][tid / kBK + i * (kThreads / kBK)] = (arow[i] != nullptr && k < k_dim) ? arow[i][k] : 0.0f;
#pragma unroll
    for (int i = 0; i < kBN * kBK / kThreads; ++i) {
      const int n = tid / kBK + i * (kThreads / kBK);
      const int64_t o = n0 + n;
      const bool ok = o < rows && k < k_dim;
      bs0[ak][n] = ok ? deq_at<F>(w0, o, k) : 0.0f;
      if constexpr (kGateUp) bs1[ak][n] = ok ? deq_at<F>(w1, o, k) : 0.0f;
    }
    __syncthreads();
#pragma unroll 8
    for (int kk = 0; kk < kBK; ++kk) {
      const float x0 = as[kk][ty * 2], x1 = as[kk][ty * 2 + 1];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float b0 = bs0[kk][tx + 16 * j];
        acc0[0][j] = fmaf(x0, b0, acc0[0][j]);
        acc0[1][j] = fmaf(x1, b0, acc0[1][j]);
        if constexpr (kGateUp) {
          const float b1 = bs1[kk][tx + 16 * j];
          acc1[0][j] = fmaf(x0, b1, acc1[0][j]);
          acc1[1][j] = fmaf(x1, b1, acc1[1][j]);
        }
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int p = m0 + ty * 2 + r;
    if (p >= seg_end) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t o = n0 + tx + 16 * j;
      if (o >= rows) continue;
      if constexpr (kGateUp) out[int64_t(p) * out_stride + o] = silu_mul1(acc0[r][j], acc1[r][j]);
      else out[int64_t(plan.sorted[p]) * out_stride + o] = acc0[r][j];
    }
  }
}

}  // namespace mla::gpu::moe
