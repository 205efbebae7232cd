// Tensor-core chunk kernel of the naive MLA prefill (GemmPrecision::Bf16): a flash-attention pass of
// 128 query rows x one head over a chunk of decompressed keys, S = Q K^T and O += P V on mma.sync
// m16n8k16 bf16 (fp32 accumulation), online softmax in fp32 registers; a fixed-dims kernel for d_qk 192 /
// d_v 128 (DeepSeek-V3, Kimi K2) and a runtime-dims one for the rest. Trade-off: q, k, v and P are
// rounded to bf16 (~2^-9 relative per term) for ~15x the fp32 FMA rate; the fp32 kernel stays golden.
#include "backend/gpu/gpu_mla_naive_tc.h"
#include "backend/gpu/gpu_mla_naive_sm90a.h"

#include <algorithm>

#include "backend/gpu/gpu_device.cuh"
#include "backend/gpu/gpu_mma.cuh"
#include "core/status.h"

namespace mla::gpu {

namespace {

// kv F32 [n, H (d_n + d_v)] + rope F32 [n, d_r] -> k BF16 [H][n][d_n + d_r], v BF16 [H][n][d_v]. One
// block per key row; the rope part is copied into every head's key row so the attention kernel reads
// one contiguous row per key. Napkin (n = 2048 keys, H = 128, DeepSeek dims): 2048 x 128 x (256 x 4 B
// read + 320 x 2 B written) = 436 MB, ~0.1 ms at HBM rate, against ~1.7 ms of tensor work per chunk
// of a 4096-row prefill (2 x 4096 x 2048 x 128 x 320 FLOP at ~400 TFLOP/s).
__global__ void naive_tc_pack_kernel(const float* __restrict__ kv, const float* __restrict__ rope, int64_t n, int heads,
                                     int d_n, int d_r, int d_v, uint16_t* __restrict__ k, uint16_t* __restrict__ v) {
  const int64_t j = blockIdx.x;
  const int dqk = d_n + d_r, per_head = dqk + d_v;
  const int64_t row_width = int64_t(heads) * (d_n + d_v);
  for (int idx = int(threadIdx.x); idx < heads * per_head; idx += int(blockDim.x)) {  // H (d_qk + d_v) < 2^31
    const int h = idx / per_head, c = idx % per_head;
    if (c < d_n) {
      k[(int64_t(h) * n + j) * dqk + c] = f32_to_bf16_bits(kv[j * row_width + int64_t(h) * (d_n + d_v) + c]);
    } else if (c < dqk) {
      k[(int64_t(h) * n + j) * dqk + c] = f32_to_bf16_bits(rope[j * d_r + (c - d_n)]);
    } else {
      v[(int64_t(h) * n + j) * d_v + (c - dqk)] =
          f32_to_bf16_bits(kv[j * row_width + int64_t(h) * (d_n + d_v) + d_n + (c - dqk)]);
    }
  }
}

// The same with 4 columns per thread (float4 loads, 8-byte stores) when d_n, d_r and d_v are multiples
// of 4 and kv / rope are 16-byte aligned: a quarter of the index math and memory instructions of the
// scalar kernel for the same bytes, so it runs at the copy rate instead of the issue rate.
__global__ void naive_tc_pack4_kernel(const float* __restrict__ kv, const float* __restrict__ rope, int64_t n,
                                      int heads, int d_n, int d_r, int d_v, uint16_t* __restrict__ k,
                                      uint16_t* __restrict__ v) {
  const int64_t j = blockIdx.x;
  const int dqk = d_n + d_r, kvw = d_n + d_v, per_head = (dqk + d_v) / 4;
  const float* kv_row = kv + j * int64_t(heads) * kvw;
  const float* rope_row = rope + j * d_r;
  for (int idx = int(threadIdx.x); idx < heads * per_head; idx += int(blockDim.x)) {
    const int hh = idx / per_head, c = (idx - hh * per_head) * 4;
    const float* src;
    uint16_t* dst;
    if (c < d_n) {
      src = kv_row + hh * kvw + c;
      dst = k + (int64_t(hh) * n + j) * dqk + c;
    } else if (c < dqk) {
      src = rope_row + (c - d_n);
      dst = k + (int64_t(hh) * n + j) * dqk + c;
    } else {
      src = kv_row + hh * kvw + d_n + (c - dqk);
      dst = v + (int64_t(hh) * n + j) * d_v + (c - dqk);
    }
    const float4 x = *reinterpret_cast<const float4*>(src);
    uint2 p;  // little-endian: the lower column in the low half
    p.x = uint32_t(f32_to_bf16_bits(x.x)) | (uint32_t(f32_to_bf16_bits(x.y)) << 16);
    p.y = uint32_t(f32_to_bf16_bits(x.z)) | (uint32_t(f32_to_bf16_bits(x.w)) << 16);
    *reinterpret_cast<uint2*>(dst) = p;
  }
}

}  // namespace

#if MLA_GPU_CUDA
namespace {

constexpr int kWarps = 8, kThreads = kWarps * 32;  // CUDA-only code: warps are 32 lanes
constexpr int kRows = kWarps * 16;                 // query rows per CTA: warp w owns rows [16w, 16w + 16)
constexpr int kKeys = 64;                          // keys per shared-memory tile
constexpr int kSTiles = kKeys / 8;                 // n8 tiles of S per warp
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kNegInf = -__builtin_huge_valf();

// Shared memory (bf16 elements): Q [kRows][dqk + 8], K [2][kKeys][dqk + 8], V [2][kKeys][d_v + 8].
// Padding 8: with d a multiple of 16 a row is an odd number of 16-byte units, so the 8 row addresses
// of an ldmatrix fall on distinct banks. DeepSeek (192, 128): 51.2 + 51.2 + 34.8 = 137 KB.
size_t smem_bytes(int dqk, int dv) {
  return size_t(kRows * (dqk + 8) + 2 * kKeys * (dqk + 8) + 2 * kKeys * (dv + 8)) * 2;
}

// PTX wrappers (cp.async, ldmatrix, mma.sync, pack_bf16, ex2) and their fragment layouts:
// gpu_mma.cuh. pack_bf16 gives the same values as f32_to_bf16_bits for the finite, non-negative
// weights it packs here.
using namespace mma;

// Block (row tile, head): rows [i0, i0 + 128) of the sequence for head h against the chunk's keys,
// 64 keys per cp.async double-buffered tile. Causal: row i sees chunk key jj iff j0 + jj <= first_pos
// + i; a warp skips the key tiles its 16 rows cannot see and masks only the tiles that straddle its
// rows' limits or the chunk end. P goes from the S accumulators straight into A fragments (the C and
// A layouts agree on (row, column) per lane), so only K, V and Q touch shared memory.
// Napkin: FLOPs = 2 H (causal pairs) (d_qk + d_v); H = 128, 4096 rows at 16K context (~59M pairs per
// head) x 320 = 4.8 TFLOP, ~6 ms at 790 TFLOP/s. Per 64-key tile a CTA reads 64 x (192 + 128) x 2 =
// 40 KB (from L2: every row tile of the head shares it) for 2 x 128 x 64 x 320 = 5.2 MFLOP: 128 FLOP/B.
// Shared-memory reads per warp and tile: Q 12 + K 48 + V 32 ldmatrix.x4 for 160 MMAs.
template <int kMaxDv>
__global__ void __launch_bounds__(kThreads, 1) naive_tc_chunk_kernel(NaiveTcArgs a) {
  constexpr int kOTiles = kMaxDv / 8;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const int dqk = a.dqk, dv = a.dv, qst = dqk + 8, vst = dv + 8;
  uint16_t* q_s = reinterpret_cast<uint16_t*>(smem_raw);  // [kRows][qst]
  uint16_t* k_s = q_s + kRows * qst;                      // [2][kKeys][qst]
  uint16_t* v_s = k_s + 2 * kKeys * qst;                  // [2][kKeys][vst]

  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4, mi = lane / 8;
  const int h = int(blockIdx.y);
  // Heaviest row tiles (latest rows: most keys) first, so the causal tail does not straggle.
  const int64_t i0 = int64_t(gridDim.x - 1 - blockIdx.x) * kRows;
  const int qn = int(min(int64_t(kRows), a.q_len - i0));
  // Chunk keys any row of the CTA sees: jj < first_pos + i0 + qn - j0 (and < n). May be <= 0.
  const int64_t n_eff = min(a.n, a.first_pos + i0 + qn - a.j0);
  const int num_tiles = n_eff > 0 ? int((n_eff + kKeys - 1) / kKeys) : 0;

  const uint16_t* k_head = a.k + int64_t(h) * a.n * dqk;
  const uint16_t* v_head = a.v + int64_t(h) * a.n * dv;
  const int k_chunks = dqk / 8, v_chunks = dv / 8;  // 16-byte units per row
  // Keys at or past n_eff are zero-filled: masked anyway, but 0 * garbage could be NaN in P V.
  auto load_tile = [&](int buf, int tile) {
    const uint32_t kd = smem_addr(k_s + buf * kKeys * qst), vd = smem_addr(v_s + buf * kKeys * vst);
    for (int c = tid; c < kKeys * k_chunks; c += kThreads) {
      const int r = c / k_chunks, u = c % k_chunks;
      const int64_t key = int64_t(tile) * kKeys + r;
      const bool ok = key < n_eff;
      cp_async16(kd + uint32_t((r * qst + u * 8) * 2), k_head + (ok ? key : 0) * dqk + u * 8, ok ? 16 : 0);
    }
    for (int c = tid; c < kKeys * v_chunks; c += kThreads) {
      const int r = c / v_chunks, u = c % v_chunks;
      const int64_t key = int64_t(tile) * kKeys + r;
      const bool ok = key < n_eff;
      cp_async16(vd + uint32_t((r * vst + u * 8) * 2), v_head + (ok ? key : 0) * dv + u * 8, ok ? 16 : 0);
    }
    cp_async_commit();
  };
  if (num_tiles > 0) load_tile(0, 0);  // overlaps the Q staging below

  for (int idx = tid; idx < kRows * dqk; idx += kThreads) {
    const int r = idx / dqk, d = idx % dqk;
    const float x = r < qn ? a.q[(a.q0 + i0 + r) * a.q_s0 + int64_t(h) * a.q_s1 + d] : 0.0f;
    q_s[r * qst + d] = f32_to_bf16_bits(x);
  }

  // This warp's rows (sequence-relative): wr0 + g and wr0 + g + 8, valid below q_len.
  const int64_t wr0 = i0 + warp * 16;
  const int64_t r_lo = wr0 + g, r_hi = r_lo + 8;
  const bool ok_lo = r_lo < a.q_len, ok_hi = r_hi < a.q_len;
  const int wrows = max(0, min(16, qn - warp * 16));
  // Keys the warp's last row sees, and the first key its first row does not (mask from there on).
  const int64_t warp_keys = wrows > 0 ? min(a.n, a.first_pos + wr0 + wrows - a.j0) : 0;
  const int warp_tiles = warp_keys > 0 ? int((warp_keys + kKeys - 1) / kKeys) : 0;
  const int64_t unmasked = min(a.n, a.first_pos + wr0 + 1 - a.j0);
  const float scale_log2 = a.scale * kLog2e;  // softmax in base 2: exp(x) = exp2(x log2 e)

  float o[kOTiles][4];
#pragma unroll
  for (int nt = 0; nt < kOTiles; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
  // Running max (log2 units) of rows lo / hi, replicated in the row's 4 lanes; the running sum is kept
  // as per-lane partials (the carried sum enters in lane t4 == 0) and summed over the quad at the end.
  float m_lo = kNegInf, m_hi = kNegInf, l_lo = 0.0f, l_hi = 0.0f;
  if (!a.first) {
    const int64_t s_lo = (a.q0 + r_lo) * a.heads + h, s_hi = (a.q0 + r_hi) * a.heads + h;
    const float* out_lo = a.out + (a.q0 + r_lo) * a.o_s0 + int64_t(h) * a.o_s1;
    const float* out_hi = a.out + (a.q0 + r_hi) * a.o_s0 + int64_t(h) * a.o_s1;
    if (ok_lo) {
      m_lo = a.run_max[s_lo] * kLog2e;
      l_lo = t4 == 0 ? a.run_sum[s_lo] : 0.0f;
    }
    if (ok_hi) {
      m_hi = a.run_max[s_hi] * kLog2e;
      l_hi = t4 == 0 ? a.run_sum[s_hi] : 0.0f;
    }
#pragma unroll
    for (int nt = 0; nt < kOTiles; ++nt) {
      const int col = nt * 8 + 2 * t4;
      if (nt * 8 < dv) {
        if (ok_lo) { o[nt][0] = out_lo[col]; o[nt][1] = out_lo[col + 1]; }
        if (ok_hi) { o[nt][2] = out_hi[col]; o[nt][3] = out_hi[col + 1]; }
      }
    }
  }

  for (int tile = 0; tile < num_tiles; ++tile) {
    const int buf = tile & 1;
    cp_async_wait_all();
    __syncthreads();  // tile visible (and q_s on the first pass); every warp is done with buffer buf ^ 1
    if (tile + 1 < num_tiles) load_tile(buf ^ 1, tile + 1);
    if (tile >= warp_tiles) continue;  // warp-uniform: no row of this warp sees these keys
    const uint16_t* kt = k_s + buf * kKeys * qst;
    const uint16_t* vt = v_s + buf * kKeys * vst;

    // S[16 rows x 64 keys] = Q K^T over d_qk.
    float s[kSTiles][4];
#pragma unroll
    for (int nt = 0; nt < kSTiles; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
    const uint16_t* qrow = q_s + (warp * 16 + (mi % 2) * 8 + lane % 8) * qst + (mi / 2) * 8;
    const uint16_t* krow = kt + ((mi / 2) * 8 + lane % 8) * qst + (mi % 2) * 8;
    for (int k0 = 0; k0 < dqk; k0 += 16) {
      uint32_t qa[4];
      ldmatrix_x4(qa, qrow + k0);
#pragma unroll
      for (int np = 0; np < kSTiles / 2; ++np) {
        // (keys 16np..+7, dims k0..+7), (same keys, k0+8..), (keys 16np+8.., k0..), (.., k0+8..)
        uint32_t b[4];
        ldmatrix_x4(b, krow + np * 16 * qst + k0);
        mma_bf16(s[2 * np], qa, b[0], b[1]);
        mma_bf16(s[2 * np + 1], qa, b[2], b[3]);
      }
    }

    // Scale (base 2), mask, row max over the quad.
    const bool need_mask = int64_t(tile + 1) * kKeys > unmasked;  // warp-uniform
    float mx_lo = kNegInf, mx_hi = kNegInf;
#pragma unroll
    for (int nt = 0; nt < kSTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[nt][e] * scale_log2;
        if (need_mask) {
          const int64_t key = int64_t(tile) * kKeys + nt * 8 + 2 * t4 + (e & 1);
          const int64_t row = e < 2 ? r_lo : r_hi;
          if (key >= a.n || a.j0 + key > a.first_pos + row) x = kNegInf;
        }
        s[nt][e] = x;
        if (e < 2) mx_lo = fmaxf(mx_lo, x); else mx_hi = fmaxf(mx_hi, x);
      }
#pragma unroll
    for (int x = 1; x <= 2; x *= 2) {
      mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, x));
      mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, x));
    }
    const float mn_lo = fmaxf(m_lo, mx_lo), mn_hi = fmaxf(m_hi, mx_hi);
    // A row that has seen no key yet (m = -inf) uses 0 as its reference: exp2(-inf) = 0 everywhere.
    const float mu_lo = mn_lo == kNegInf ? 0.0f : mn_lo, mu_hi = mn_hi == kNegInf ? 0.0f : mn_hi;
    const float al_lo = exp2f(m_lo - mu_lo), al_hi = exp2f(m_hi - mu_hi);
    m_lo = mn_lo;
    m_hi = mn_hi;

    // P in bf16, packed as the A fragments of O += P V: k-step ks covers keys [16 ks, 16 ks + 16) =
    // S n-tiles 2ks (a0: row g, a1: row g+8) and 2ks+1 (a2, a3). The sum uses the rounded weights the
    // MMA sees, so the normalization is a consistent average.
    uint32_t pa[kKeys / 16][4];
    float ps_lo = 0.0f, ps_hi = 0.0f;
#pragma unroll
    for (int ks = 0; ks < kKeys / 16; ++ks)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const float* sv = s[2 * ks + half];
        const uint32_t lo = pack_bf16(exp2f(sv[0] - mu_lo), exp2f(sv[1] - mu_lo));
        const uint32_t hi = pack_bf16(exp2f(sv[2] - mu_hi), exp2f(sv[3] - mu_hi));
        pa[ks][2 * half] = lo;
        pa[ks][2 * half + 1] = hi;
        ps_lo += bf16_lo(lo) + bf16_hi(lo);
        ps_hi += bf16_lo(hi) + bf16_hi(hi);
      }
    l_lo = l_lo * al_lo + ps_lo;
    l_hi = l_hi * al_hi + ps_hi;
#pragma unroll
    for (int nt = 0; nt < kOTiles; ++nt) {
      o[nt][0] *= al_lo; o[nt][1] *= al_lo; o[nt][2] *= al_hi; o[nt][3] *= al_hi;
    }

    // O[16 x d_v] += P[16 x 64] V[64 x d_v].
    const uint16_t* vrow = vt + ((mi % 2) * 8 + lane % 8) * vst + (mi / 2) * 8;
#pragma unroll
    for (int ks = 0; ks < kKeys / 16; ++ks)
#pragma unroll
      for (int np = 0; np < kOTiles / 2; ++np) {
        if (np * 16 < dv) {
          // .trans of (keys k0..+7, cols n0..+7), (k0+8.., n0..), (k0.., n0+8..), (k0+8.., n0+8..)
          uint32_t b[4];
          ldmatrix_x4_trans(b, vrow + ks * 16 * vst + np * 16);
          mma_bf16(o[2 * np], pa[ks], b[0], b[1]);
          mma_bf16(o[2 * np + 1], pa[ks], b[2], b[3]);
        }
      }
  }

#pragma unroll
  for (int x = 1; x <= 2; x *= 2) {
    l_lo += __shfl_xor_sync(0xffffffffu, l_lo, x);
    l_hi += __shfl_xor_sync(0xffffffffu, l_hi, x);
  }
  // Every valid row saw key 0 by its last chunk, so l > 0 there; 0 guards an invalid batch.
  const float f_lo = a.last ? (l_lo > 0.0f ? 1.0f / l_lo : 0.0f) : 1.0f;
  const float f_hi = a.last ? (l_hi > 0.0f ? 1.0f / l_hi : 0.0f) : 1.0f;
  float* out_lo = a.out + (a.q0 + r_lo) * a.o_s0 + int64_t(h) * a.o_s1;
  float* out_hi = a.out + (a.q0 + r_hi) * a.o_s0 + int64_t(h) * a.o_s1;
#pragma unroll
  for (int nt = 0; nt < kOTiles; ++nt) {
    const int col = nt * 8 + 2 * t4;
    if (nt * 8 < dv) {
      if (ok_lo) { out_lo[col] = o[nt][0] * f_lo; out_lo[col + 1] = o[nt][1] * f_lo; }
      if (ok_hi) { out_hi[col] = o[nt][2] * f_hi; out_hi[col + 1] = o[nt][3] * f_hi; }
    }
  }
  if (!a.last && t4 == 0) {
    if (ok_lo) {
      a.run_max[(a.q0 + r_lo) * a.heads + h] = m_lo * kLn2;
      a.run_sum[(a.q0 + r_lo) * a.heads + h] = l_lo;
    }
    if (ok_hi) {
      a.run_max[(a.q0 + r_hi) * a.heads + h] = m_hi * kLn2;
      a.run_sum[(a.q0 + r_hi) * a.heads + h] = l_hi;
    }
  }
}

// ---- Fixed-dims kernel (DeepSeek-V3 / Kimi K2: d_qk 192, d_v 128) ------------------------------------
// The kernel above is instruction- and latency-bound (ncu at 16K ctx / 4096 rows / 16 heads: 1 CTA of
// 8 warps per SM, IPC 1.31, ~1830 instructions per warp and 64-key tile for 160 MMAs, 0.58 ldmatrix
// per MMA, 89 TFLOP/s). This one fixes the head dims at compile time (every loop unrolled, loader
// index math by constants), gives each warp two m16 row tiles (so each K / V ldmatrix feeds 4 MMAs)
// and fits 2 CTAs of 4 warps per SM (<= 255 regs, 92 KB smem). Per warp and 64-key tile:
//   S = Q K^T: 12 k-steps x (2 Q + 4 K ldmatrix.x4, 16 MMA)       =  72 ldmatrix, 192 MMA
//   softmax:   64 FFMA + 68 EX2 + 32 cvt.bf16x2 + ~80 max/shuffle (+64 ISETP/FSEL on diagonal tiles)
//   row sums:  8 MMA of P against a ones B fragment (the bf16 P the PV MMAs see, fp32 accumulated)
//   rescale:   136 FMUL only when some row max of the warp grew (warp vote), else none
//   O += P V:  4 k-steps x 8 x (1 ldmatrix.x4.trans, 4 MMA)         =  32 ldmatrix, 128 MMA
//   loader:    20 cp.async per thread (12 K + 8 V units), 2 barriers
// PTX of the loop body: ~1440 instructions of which ~280 conditional (rescale, mask) and ~150 address
// adds that fold into ldmatrix offsets, so ~1000 per 328 MMAs (was ~1830 per 160: ~3.7x fewer per
// MMA); ptxas: 255 registers, no spills. Shared-memory reads 104 x
// 512 B / 328 MMA = 162 B per MMA (was 294). FLOPs per CTA tile: 2 x 128 x 64 x 320 = 5.2 MFLOP.
// Pipeline (FlashAttention-2 style, one K and one V buffer): V(t) loads during S(t), K(t + 1) during
// P(t) V(t); smem Q 128 x 200 + K 64 x 200 + V 64 x 136 bf16 = 92 KB.
namespace fast {

constexpr int kWarps = 4, kThreads = kWarps * 32;  // CUDA-only: 32 lanes
constexpr int kWarpRows = 32;                      // two m16 tiles: rows [32w, 32w + 16) and [32w + 16, 32w + 32)
constexpr int kRows = kWarps * kWarpRows;          // 128 query rows per CTA
constexpr int kKeys = 64;
constexpr int kSTiles = kKeys / 8, kPSteps = kKeys / 16;
constexpr uint32_t kOnesBf16x2 = 0x3f803f80u;  // bf16 (1.0, 1.0)

template <int DQK, int DV> struct Shape {
  static_assert(DQK % 16 == 0 && DV % 16 == 0, "m16n8k16 tiles");
  static constexpr int kQSt = DQK + 8, kVSt = DV + 8;        // padded row strides (elements): odd 16-B units
  static constexpr int kKUnits = DQK / 8, kVUnits = DV / 8;  // 16-byte units per K / V row
  static constexpr int kKSteps = DQK / 16, kOTiles = DV / 8;
  static constexpr size_t kSmem = size_t(kRows * kQSt + kKeys * kQSt + kKeys * kVSt) * 2;
  static_assert((kKeys * kKUnits) % kThreads == 0 && (kKeys * kVUnits) % kThreads == 0, "whole loader passes");
};

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
// D = A B (C = 0): the first k-step of S needs no zeroed accumulators (saves 64 moves per tile).
__device__ __forceinline__ void mma_bf16_first(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  const float z = 0.0f;
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%10,%10,%10};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(z));
}

// cp.async of keys [key0, key0 + kTileKeys) of a [n][D] bf16 head into a [kTileKeys][kSt] smem tile;
// keys at or past key0 + valid are zero-filled (masked later; 0 x garbage could be NaN in P V).
// Thread tid copies 16-byte unit (tid % kLanes) + kLanes j of rows tid / kLanes + (kThreads / kLanes) p:
// both addresses are a per-thread base plus a compile-time offset (no div / mod per unit), and kLanes
// consecutive threads read kLanes x 16 contiguous bytes of one row.
template <int kTileKeys, int D, int kSt>
__device__ __forceinline__ void load_tile(uint32_t dst_sa, const uint16_t* head, int key0, int valid, int tid) {
  constexpr int kUnits = D / 8, kLanes = kUnits % 16 == 0 ? 16 : 8, kRowsPerPass = kThreads / kLanes;
  static_assert(kUnits % kLanes == 0 && kTileKeys % kRowsPerPass == 0, "whole loader passes");
  const int u = tid % kLanes, rr = tid / kLanes;
  const uint32_t dst = dst_sa + uint32_t((rr * kSt + u * 8) * 2);
  const uint16_t* src = head + (int64_t(key0) + rr) * D + u * 8;
#pragma unroll
  for (int p = 0; p < kTileKeys / kRowsPerPass; ++p) {
    const bool ok = rr + p * kRowsPerPass < valid;
#pragma unroll
    for (int j = 0; j < kUnits / kLanes; ++j)
      cp_async16(dst + uint32_t((p * kRowsPerPass * kSt + j * kLanes * 8) * 2),
                 ok ? src + p * kRowsPerPass * D + j * kLanes * 8 : head, ok ? 16 : 0);
  }
  cp_async_commit();
}

// Fragment index math (g = lane / 4, t = lane % 4, mi = lane / 8, lr = lane % 8; layouts in gpu_mma.cuh):
//  Q (A of S): ldmatrix.x4 matrix mi = quadrant (rows 8 (mi % 2), cols 8 (mi / 2)) of the 16 x 16 block
//    -> regs TL, BL, TR, BR = a0..a3. Lane address: row wrow0 + 16 mt + 8 (mi % 2) + lr, col 16 ks + 8 (mi / 2).
//  K (B of S, B[k][n] = K[key n][dim k], stored key-major = "n-major"): non-trans matrix mi = keys
//    16 np + 8 (mi / 2) + lr, dims 16 ks + 8 (mi % 2): regs 0, 1 = (b0, b1) of n-tile 2 np (keys 16 np..+7),
//    regs 2, 3 = (b0, b1) of n-tile 2 np + 1. Lane l then holds K[key 8j + g][dim 2t..] = B[2t..][g].
//  V (B of O, B[k][n] = V[key k][col n], stored key-major = "k-major"): .trans matrix mi = keys
//    16 ks + 8 (mi % 2) + lr, cols 16 np + 8 (mi / 2): regs 0, 1 = (b0, b1) of n-tile 2 np, 2, 3 of 2 np + 1.
//  P (A of O) from S (C): S n-tile nt holds (row g, keys 8 nt + 2t..) in c0 c1 and (row g + 8, same) in
//    c2 c3; A of k-step ks needs a0 = P[g][16 ks + 2t..] = S tile 2 ks c0c1, a1 = S tile 2 ks c2c3,
//    a2 = S tile 2 ks + 1 c0c1, a3 = S tile 2 ks + 1 c2c3 -- so P never leaves registers.
//  Row sums: D = P x ones(16 x 8) gives every column of row r the sum of row r's bf16 P; c0 (row g)
//    and c2 (row g + 8) are read, c1 / c3 carry the same values.
// Causal rule (as the generic kernel): CTA-relative row r sees chunk key jj iff jj < n and
// jj <= first_pos + i0 + r - j0 =: lim(r); keys past n_eff (the last valid row's limit) are zero-filled.
template <int DQK, int DV>
__global__ void __launch_bounds__(kThreads, 2) naive_tc_fast_kernel(NaiveTcArgs a) {
  using Sh = Shape<DQK, DV>;
  constexpr int kQSt = Sh::kQSt, kVSt = Sh::kVSt, kOTiles = Sh::kOTiles;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  uint16_t* q_s = reinterpret_cast<uint16_t*>(smem_raw);  // [kRows][kQSt]
  const uint32_t q_sa = smem_addr(q_s);
  const uint32_t k_sa = q_sa + uint32_t(kRows * kQSt * 2);  // [kKeys][kQSt]
  const uint32_t v_sa = k_sa + uint32_t(kKeys * kQSt * 2);  // [kKeys][kVSt]

  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
  const int mi = lane / 8, lr = lane % 8;
  const int h = int(blockIdx.y);
  const int64_t i0 = int64_t(gridDim.x - 1 - blockIdx.x) * kRows;  // heaviest row tiles first
  const int qn = int(min(int64_t(kRows), a.q_len - i0));
  const int64_t base_lim = a.first_pos + i0 - a.j0;  // lim(r) = base_lim + r
  const int64_t n_eff = min(a.n, base_lim + qn);      // keys any valid row of the CTA sees; may be <= 0
  const int num_tiles = n_eff > 0 ? int((n_eff + kKeys - 1) / kKeys) : 0;

  const uint16_t* k_head = a.k + int64_t(h) * a.n * DQK;
  const uint16_t* v_head = a.v + int64_t(h) * a.n * DV;
  const int n_valid = int(min(a.n, max(n_eff, int64_t(0))));  // keys loaded (the rest zero-filled)
  auto load_k = [&](int tile) {
    load_tile<kKeys, DQK, kQSt>(k_sa, k_head, tile * kKeys, n_valid - tile * kKeys, tid);
  };
  auto load_v = [&](int tile) { load_tile<kKeys, DV, kVSt>(v_sa, v_head, tile * kKeys, n_valid - tile * kKeys, tid); };
  if (num_tiles > 0) load_k(0);  // overlaps the Q staging

  {  // Q rows -> bf16 smem (rows past q_len zero); coalesced along d, strides need no alignment.
    const float* q_base = a.q + (a.q0 + i0) * a.q_s0 + int64_t(h) * a.q_s1;
#pragma unroll 4
    for (int r = 0; r < kRows; ++r) {
      const bool ok = r < qn;
#pragma unroll
      for (int j = 0; j < (DQK + kThreads - 1) / kThreads; ++j) {
        const int d = tid + j * kThreads;
        if (d < DQK) q_s[r * kQSt + d] = f32_to_bf16_bits(ok ? q_base[int64_t(r) * a.q_s0 + d] : 0.0f);
      }
    }
  }

  const int wrow0 = warp * kWarpRows;  // CTA-relative
  const int wrows = max(0, min(kWarpRows, qn - wrow0));
  const int64_t warp_keys = wrows > 0 ? min(a.n, base_lim + wrow0 + wrows) : 0;
  const int warp_tiles = warp_keys > 0 ? int((warp_keys + kKeys - 1) / kKeys) : 0;
  // Keys [0, unmasked) are seen by every row of the warp (its first row's count, clamped to [0, n]).
  const int unmasked = int(max(int64_t(0), min(a.n, base_lim + wrow0 + 1)));
  // lim of this thread's row g (lane row of m-tile 0), clamped to [-kWarpRows, n]: rows 16 mt + 8 hf
  // above it add 16 mt + 8 hf < kWarpRows, so a clamped value keeps "no key" / "every key < n" true.
  const int lim0 = int(max(int64_t(-kWarpRows), min(a.n, base_lim + wrow0 + g)));
  const int n_last = int(a.n) - 1;
  float m[2][2];      // running max, log2 units of the scaled score, per row (replicated over the quad)
  float l[2][4];      // running sums (ones-MMA accumulators: [0], [1] row g, [2], [3] row g + 8)
  float o[2][kOTiles][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      m[mt][hf] = kNegInf;
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) l[mt][e] = 0.0f;
#pragma unroll
    for (int nt = 0; nt < kOTiles; ++nt) o[mt][nt][0] = o[mt][nt][1] = o[mt][nt][2] = o[mt][nt][3] = 0.0f;
  }
  if (!a.first) {  // carried state of the previous chunks
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int row = wrow0 + mt * 16 + hf * 8 + g;
        if (row < qn) {
          const int64_t seq = a.q0 + i0 + row;
          m[mt][hf] = a.run_max[seq * a.heads + h] * kLog2e;
          l[mt][2 * hf] = l[mt][2 * hf + 1] = a.run_sum[seq * a.heads + h];
          const float* src = a.out + seq * a.o_s0 + int64_t(h) * a.o_s1 + 2 * t4;
#pragma unroll
          for (int nt = 0; nt < kOTiles; ++nt) {
            o[mt][nt][2 * hf] = src[nt * 8];
            o[mt][nt][2 * hf + 1] = src[nt * 8 + 1];
          }
        }
      }
  }

  const float c = a.scale * kLog2e;  // > 0 (dispatcher): max of raw scores scales to the max of scaled ones
  const uint32_t q_lane = q_sa + uint32_t(((wrow0 + (mi % 2) * 8 + lr) * kQSt + (mi / 2) * 8) * 2);
  const uint32_t k_lane = k_sa + uint32_t((((mi / 2) * 8 + lr) * kQSt + (mi % 2) * 8) * 2);
  const uint32_t v_lane = v_sa + uint32_t((((mi % 2) * 8 + lr) * kVSt + (mi / 2) * 8) * 2);

  for (int tile = 0; tile < num_tiles; ++tile) {
    cp_async_wait_all();
    __syncthreads();  // K(tile) (and Q) visible; every warp is done with P V of tile - 1: V free
    load_v(tile);
    const bool active = tile < warp_tiles;  // warp-uniform: some row of the warp sees a key of the tile
    uint32_t pa[2][kPSteps][4];
    if (active) {
      float s[2][kSTiles][4];  // written by the first k-step's C = 0 MMAs
#pragma unroll
      for (int ks = 0; ks < Sh::kKSteps; ++ks) {
        uint32_t qa0[4], qa1[4];
        ldsm_x4(qa0, q_lane + uint32_t(ks * 32));
        ldsm_x4(qa1, q_lane + uint32_t((16 * kQSt + ks * 16) * 2));
#pragma unroll
        for (int np = 0; np < kSTiles / 2; ++np) {
          uint32_t b[4];
          ldsm_x4(b, k_lane + uint32_t((np * 16 * kQSt + ks * 16) * 2));
          if (ks == 0) {
            mma_bf16_first(s[0][2 * np], qa0, b[0], b[1]);
            mma_bf16_first(s[0][2 * np + 1], qa0, b[2], b[3]);
            mma_bf16_first(s[1][2 * np], qa1, b[0], b[1]);
            mma_bf16_first(s[1][2 * np + 1], qa1, b[2], b[3]);
          } else {
            mma_bf16(s[0][2 * np], qa0, b[0], b[1]);
            mma_bf16(s[0][2 * np + 1], qa0, b[2], b[3]);
            mma_bf16(s[1][2 * np], qa1, b[0], b[1]);
            mma_bf16(s[1][2 * np + 1], qa1, b[2], b[3]);
          }
        }
      }
      // Diagonal / chunk-end tiles only: key 64 tile + 8 nt + 2 t4 + e is visible iff <= lim.
      if ((tile + 1) * kKeys > unmasked) {
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int hf = 0; hf < 2; ++hf) {
            const int rel = min(lim0 + mt * 16 + hf * 8, n_last) - tile * kKeys - 2 * t4;
#pragma unroll
            for (int nt = 0; nt < kSTiles; ++nt)
#pragma unroll
              for (int e = 0; e < 2; ++e)
                if (nt * 8 + e > rel) s[mt][nt][2 * hf + e] = kNegInf;
          }
      }
      float mu[2][2], al[2][2];
      bool grew = false;
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          float mx = kNegInf;
#pragma unroll
          for (int nt = 0; nt < kSTiles; ++nt) mx = fmaxf(mx, fmaxf(s[mt][nt][2 * hf], s[mt][nt][2 * hf + 1]));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          const float mn = fmaxf(m[mt][hf], mx * c);
          grew |= mn != m[mt][hf];
          // A row that has seen no key yet (max -inf) uses 0 as reference: ex2(-inf) = 0 everywhere.
          mu[mt][hf] = mn == kNegInf ? 0.0f : mn;
          al[mt][hf] = ex2(m[mt][hf] - mu[mt][hf]);  // exactly 1 when the max did not move
          m[mt][hf] = mn;
        }
      if (__any_sync(0xffffffffu, grew)) {
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          l[mt][0] *= al[mt][0]; l[mt][1] *= al[mt][0]; l[mt][2] *= al[mt][1]; l[mt][3] *= al[mt][1];
#pragma unroll
          for (int nt = 0; nt < kOTiles; ++nt) {
            o[mt][nt][0] *= al[mt][0]; o[mt][nt][1] *= al[mt][0];
            o[mt][nt][2] *= al[mt][1]; o[mt][nt][3] *= al[mt][1];
          }
        }
      }
      // P = 2^(s c - mu) rounded to bf16, packed straight into A fragments; sums from the same bits.
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
        for (int ks = 0; ks < kPSteps; ++ks)
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const float* sv = s[mt][2 * ks + half];
            pa[mt][ks][2 * half] = pack_bf16(ex2(fmaf(sv[0], c, -mu[mt][0])), ex2(fmaf(sv[1], c, -mu[mt][0])));
            pa[mt][ks][2 * half + 1] = pack_bf16(ex2(fmaf(sv[2], c, -mu[mt][1])), ex2(fmaf(sv[3], c, -mu[mt][1])));
          }
#pragma unroll
        for (int ks = 0; ks < kPSteps; ++ks) mma_bf16(l[mt], pa[mt][ks], kOnesBf16x2, kOnesBf16x2);
      }
    }
    cp_async_wait_all();
    __syncthreads();  // V(tile) visible; every warp is done with S of this tile: K free
    if (tile + 1 < num_tiles) load_k(tile + 1);
    if (active) {
#pragma unroll
      for (int ks = 0; ks < kPSteps; ++ks)
#pragma unroll
        for (int np = 0; np < kOTiles / 2; ++np) {
          uint32_t b[4];
          ldsm_x4_t(b, v_lane + uint32_t((ks * 16 * kVSt + np * 16) * 2));
          mma_bf16(o[0][2 * np], pa[0][ks], b[0], b[1]);
          mma_bf16(o[0][2 * np + 1], pa[0][ks], b[2], b[3]);
          mma_bf16(o[1][2 * np], pa[1][ks], b[0], b[1]);
          mma_bf16(o[1][2 * np + 1], pa[1][ks], b[2], b[3]);
        }
    }
  }

#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int row = wrow0 + mt * 16 + hf * 8 + g;
      if (row < qn) {
        const int64_t seq = a.q0 + i0 + row;
        const float sum = l[mt][2 * hf];
        // Every valid row saw key 0 by its last chunk, so sum > 0 there; 0 guards an invalid batch.
        const float f = a.last ? (sum > 0.0f ? 1.0f / sum : 0.0f) : 1.0f;
        float* dst = a.out + seq * a.o_s0 + int64_t(h) * a.o_s1 + 2 * t4;
#pragma unroll
        for (int nt = 0; nt < kOTiles; ++nt) {
          dst[nt * 8] = o[mt][nt][2 * hf] * f;
          dst[nt * 8 + 1] = o[mt][nt][2 * hf + 1] * f;
        }
        if (!a.last && t4 == 0) {
          a.run_max[seq * a.heads + h] = m[mt][hf] * kLn2;
          a.run_sum[seq * a.heads + h] = sum;
        }
      }
    }
}

template <int DQK, int DV> void launch_fast(const NaiveTcArgs& a, Stream stream) {
  constexpr size_t smem = Shape<DQK, DV>::kSmem;
  MLA_GPU_CHECK(cudaFuncSetAttribute(naive_tc_fast_kernel<DQK, DV>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     int(smem)));
  // Two 92 KB CTAs per SM need the largest shared-memory carveout.
  MLA_GPU_CHECK(cudaFuncSetAttribute(naive_tc_fast_kernel<DQK, DV>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                     int(cudaSharedmemCarveoutMaxShared)));
  const dim3 grid(unsigned((a.q_len + kRows - 1) / kRows), unsigned(a.heads));
  naive_tc_fast_kernel<DQK, DV><<<grid, kThreads, smem, stream>>>(a);
  MLA_GPU_LAUNCH_CHECK();
}

}  // namespace fast

template <int kMaxDv> void launch_chunk(const NaiveTcArgs& a, Stream stream) {
  const size_t smem = smem_bytes(a.dqk, a.dv);
  MLA_GPU_CHECK(cudaFuncSetAttribute(naive_tc_chunk_kernel<kMaxDv>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     int(smem)));
  const dim3 grid(unsigned((a.q_len + kRows - 1) / kRows), unsigned(a.heads));
  naive_tc_chunk_kernel<kMaxDv><<<grid, kThreads, smem, stream>>>(a);
  MLA_GPU_LAUNCH_CHECK();
}

}  // namespace

bool naive_tc_supported(int dqk, int dv) {
  if (dqk <= 0 || dv <= 0 || dqk % 16 != 0 || dv % 16 != 0 || dv > 256) return false;
  int dev = 0, major = 0, smem_optin = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) return false;
  return major >= 8 && smem_bytes(dqk, dv) <= size_t(smem_optin);
}

// Preconditions (checked by the caller through naive_tc_supported and its own shape checks): k, v
// 16-byte aligned; q / out last dims contiguous; out does not alias q, k, v or the running state.
void naive_tc_chunk(const NaiveTcArgs& a, Stream stream) {
  MLA_CHECK(a.dqk % 16 == 0 && a.dv % 16 == 0 && a.dv <= 256, "naive_tc_chunk: d_qk {} d_v {}", a.dqk, a.dv);
  MLA_CHECK(reinterpret_cast<uintptr_t>(a.k) % 16 == 0 && reinterpret_cast<uintptr_t>(a.v) % 16 == 0,
            "naive_tc_chunk: k / v not 16-byte aligned");
  if (a.q_len <= 0 || a.heads <= 0) return;
  // The fixed-dims kernel for DeepSeek-V3 / Kimi K2 (it takes the max of raw scores, so scale > 0);
  // any other shape runs the runtime-dims kernel.
  if (a.dqk == 192 && a.dv == 128 && a.scale > 0.0f) {
    // Compute capability 9.0: the wgmma kernel (gpu_mla_naive_sm90a.cu) unless the knob forces one path.
    const NaivePrefillPath path = naive_prefill_path();
    const bool sm90a = path != NaivePrefillPath::MmaSync && naive_sm90a_supported(a.dqk, a.dv);
    MLA_CHECK(sm90a || path == NaivePrefillPath::Auto || path == NaivePrefillPath::MmaSync,
              "naive_tc_chunk: a wgmma path forced on a device without it");
    if (sm90a) naive_sm90a_chunk(a, stream);
    else fast::launch_fast<192, 128>(a, stream);
  } else if (a.dv <= 128) launch_chunk<128>(a, stream);
  else launch_chunk<256>(a, stream);
}

#else  // HIP: no mma.sync; the dispatcher keeps the fp32 chunk kernel.

bool naive_tc_supported(int, int) { return false; }
void naive_tc_chunk(const NaiveTcArgs&, Stream) {
  MLA_CHECK(false, "naive_tc_chunk: the tensor-core naive chunk kernel is NVIDIA-only (check naive_tc_supported)");
}

#endif

void naive_tc_pack(const float* kv, const float* rope, int64_t n, int heads, int d_n, int d_r, int d_v, uint16_t* k,
                   uint16_t* v, Stream stream) {
  if (n <= 0 || heads <= 0) return;
  const bool vec4 = d_n % 4 == 0 && d_r % 4 == 0 && d_v % 4 == 0 && reinterpret_cast<uintptr_t>(kv) % 16 == 0 &&
                    reinterpret_cast<uintptr_t>(rope) % 16 == 0 && reinterpret_cast<uintptr_t>(k) % 8 == 0 &&
                    reinterpret_cast<uintptr_t>(v) % 8 == 0;
  if (vec4)
    naive_tc_pack4_kernel<<<unsigned(n), 256, 0, stream>>>(kv, rope, n, heads, d_n, d_r, d_v, k, v);
  else
    naive_tc_pack_kernel<<<unsigned(n), 256, 0, stream>>>(kv, rope, n, heads, d_n, d_r, d_v, k, v);
  MLA_GPU_LAUNCH_CHECK();
}

}  // namespace mla::gpu
