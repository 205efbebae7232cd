// Tensor-core chunk kernel of the naive MLA prefill (GemmPrecision::Bf16): a flash-attention pass of
// 128 query rows x one head over a chunk of decompressed keys, S = Q K^T and O += P V on mma.sync
// m16n8k16 bf16 (fp32 accumulation), online softmax in fp32 registers. Trade-off: q, k, v and P are
// rounded to bf16 (~2^-9 relative per term) for ~15x the fp32 FMA rate; the fp32 kernel stays golden.
#include "backend/gpu/gpu_mla_naive_tc.h"

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

// PTX wrappers (cp.async, ldmatrix, mma.sync) and their fragment layouts: gpu_mma.cuh.
using namespace mma;
// Two floats to bf16x2 with round-to-nearest-even (one cvt; the same values as f32_to_bf16_bits for
// the finite, non-negative weights it is used on); `lo` lands in the low half (the lower column).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
__device__ __forceinline__ float bf16_lo(uint32_t p) { return __uint_as_float(p << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t p) { return __uint_as_float(p & 0xffff0000u); }

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
  if (a.dv <= 128) launch_chunk<128>(a, stream);
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
  naive_tc_pack_kernel<<<unsigned(n), 256, 0, stream>>>(kv, rope, n, heads, d_n, d_r, d_v, k, v);
  MLA_GPU_LAUNCH_CHECK();
}

}  // namespace mla::gpu
