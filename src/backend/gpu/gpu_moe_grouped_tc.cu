// Tensor-core grouped-GEMM experts (prefill, GemmPrecision::Bf16; constraint and interface:
// gpu_moe_grouped_tc.h). One CTA = 64 sorted pairs of one expert x 128 output columns; x and h are
// bf16 (rounded once), weights become exact bf16 in padded smem (BF16 as stored; FP8 e4m3 bits ->
// bf16 x 2^-120, x 2^120 in a bf16x2 FMA; INT4 bf16(q s) = weight_at's value) and the FP8 128x128
// block scale is applied in fp32 to each 128-k partial sum ("promotion"). Tiles arrive through a
// cp.async ring 4 deep (FP8: 8; INT4 scales: a plain load a step ahead); conversion costs issue
// slots only.
#include "backend/gpu/gpu_moe_grouped_tc.h"

#include <algorithm>
#include <cstdint>

#include "backend/gpu/gpu_device.cuh"
#include "core/status.h"

#if MLA_GPU_CUDA
#include "backend/gpu/gpu_mma.cuh"
#include "backend/gpu/gpu_moe_grouped.cuh"
#include "backend/gpu/gpu_moe_grouped_sm90a.h"
#endif

namespace mla::gpu {

bool moe_grouped_tc_ok(MoeFormat format, int64_t hidden, int64_t inter, bool all_vec) {
#if MLA_GPU_CUDA
  const bool fmt = format == MoeFormat::BF16 || format == MoeFormat::FP8 || format == MoeFormat::I4_BF16;
  return fmt && all_vec && hidden > 0 && inter > 0 && hidden % 32 == 0 && inter % 32 == 0;
#else
  (void)format, (void)hidden, (void)inter, (void)all_vec;
  return false;
#endif
}

#if MLA_GPU_CUDA

namespace {

using moe::Plan;

// ---- napkin math (DeepSeek-V3 expert: gate/up [2048, 7168], down [7168, 2048]; H200) ---------------
// Per gate/up CTA: 64 pairs x (64 gate + 64 up) columns x K 7168 = 117 MFLOP; it streams A = 64 x
// 7168 bf16 (917 KB, L2: shared by the 32 column tiles) and B = 128 weight rows (FP8 917 KB). Per
// down CTA: 64 x 128 x 2048 = 33.5 MFLOP over 262 KB + 262 KB. ~64 FLOP per byte of L2 traffic.
// A layer at 4096 tokens x top-8 of 256 experts: 2 x 32768 x 3 x 7168 x 2048 = 2.89 TFLOP (9.6 ms at
// 300 TFLOP/s) against 11.3 GB of FP8 weights (2.6 ms at 4.3 TB/s): compute-bound as long as an
// expert's 2-3 row tiles share its weight slice through L2 (their CTAs are a few dozen apart in
// launch order, so they run in the same wave; gpu_moe.cu's 1 GiB chunks keep 4096 tokens at 2 x 2048,
// ~64 pairs per expert). At 1024 tokens (~32 pairs per expert) half of each 64-row tile is padding and
// the weights bound it: <= ~280 TFLOP/s-equivalent.
// Issue budget per warp and 32-k step: 32 mma (x 4 tensor cycles per sub-partition = 128 cycles),
// 12 ldmatrix, 2 cp.async for A; B staging per thread: BF16 4 cp.async, FP8 2 cp.async + 32
// elements x ~2.5 instructions (prmt, 2 shifts, lop3, bf16x2 FMA per pair), INT4 1 cp.async + 32 x
// ~2.3. FP8 is the tightest (~110 issue slots per 128 tensor cycles): expect ~50% of mma.sync peak,
// ~300 TFLOP/s. Latency: a step is ~256 cycles with 2 CTAs per SM; loads are issued kStages - 1
// steps ahead (FP8 / INT4: converted one step ahead). Measured (session 33): ~12-17% of the GEMM
// rate, bound by shared-memory wavefronts (kStagesOf's comment), not by this budget.
constexpr int kBM = kMoeGroupedTcRows;  // sorted pairs per CTA
constexpr int kBN = 128;                // B rows per CTA: 64 gate + 64 up, or 128 down
constexpr int kBK = 32;                 // k per pipeline step (one INT4 group; a quarter FP8 block)
constexpr int kLd = kBK + 8;            // smem row pitch in bf16: 80 B, ldmatrix rows conflict-free
// cp.async ring depth per format (kStages - 1 steps of latency cover). FP8 runs 2 CTAs per SM
// (registers) and 8 stages (92 KB) still fit two: 1.1-1.4% faster than 4 at 1024 and 4096 tokens
// on an H100 (session 33), so latency cover is not what bounds it. ncu (H100, session 33, FP8
// gate/up) counts 4.7 M shared-memory wavefronts per SM in 5.3 M active cycles, 41% of them excess:
// cp.async rows of 32 B (raw FP8) and 64 B (A, 80-byte pitch) each take 4x their ideal, and the
// converted tile's 80-byte-pitch stores 2x; the top stall is the wait on shared loads (short
// scoreboard, 28%). BF16 and INT4 fit 3 CTAs per SM at 4 stages.
template <MoeFormat F> constexpr int kStagesOf = F == MoeFormat::FP8 ? 8 : 4;
constexpr int kThreads = 128;           // 4 warps in 2 (m) x 2 (n); mma.sync warps are 32 lanes
static_assert(kBM == 64 && kBN == 128 && kThreads == 128, "the loaders and warp tiles assume these");

using mma::cp_async_wait;
using moe_grouped::b_row;
using moe_grouped::pack_bf16x2;

// x rows -> bf16 rows [tokens, hidden] (round to nearest even). Bytes: 6 per element; ~us.
__global__ void moe_grouped_tc_prep_kernel(const float* __restrict__ x, int64_t x_stride, int64_t tokens,
                                           int64_t hidden, uint32_t* __restrict__ out) {
  const int64_t half = hidden / 2, n = tokens * half;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / half, c = (i - t * half) * 2;
    const float* r = x + t * x_stride + c;
    out[i] = pack_bf16x2(r[0], r[1]);
  }
}

// Dynamic shared memory of one CTA, in bytes. Every global load is a cp.async into a kStages ring
// (A, and B: BF16 as is, FP8 / INT4 raw); FP8 / INT4 raw tiles are converted one step ahead into a
// double-buffered bf16 tile, so MMAs read one padded layout for every format.
template <MoeFormat F> struct TcSmem {
  static constexpr bool kConv = F != MoeFormat::BF16;
  static constexpr int kStages = kStagesOf<F>;
  static constexpr int kTileA = kBM * kLd * 2;  // one bf16 A stage
  static constexpr int kTileB = kBN * kLd * 2;  // one bf16 B tile
  static constexpr int kRaw = F == MoeFormat::FP8 ? kBN * kBK : kBN * kBK / 2;  // raw B bytes per stage
  static constexpr int kOffB = kStages * kTileA;                                // BF16: B ring; else raw ring
  static constexpr int kOffConv = kOffB + kStages * (kConv ? kRaw : kTileB);
  static constexpr int kBytes = kOffConv + (kConv ? 2 * kTileB : 0);
};

// Grid (column tiles, max_tiles). CTA (x, y) takes plan tile y when it starts a 64-row group of its
// expert's segment (the plan's 32-row tiles: the next one is covered here and its CTAs exit), and
// rows [n0, n0 + 64) of gate and up (-> bf16 h at the sorted position) or [n0, n0 + 128) of down
// (-> fp32 y at the pair index). 4 warps in 2 x 2, each 32 pairs x 64 B rows (gate/up: 32 gate +
// the same 32 up columns, so silu(g) u is formed in registers).
// Pipeline: step s (k0 = 32 s) is loaded kStages - 1 steps ahead; FP8 / INT4 raw tiles are
// converted by the thread that loaded them, one step ahead; one barrier per step.
template <MoeFormat F, bool kGateUp>
__global__ void __launch_bounds__(kThreads, 2)
    moe_grouped_tc_kernel(const DeviceExpert* __restrict__ table, Plan plan, int top_k,
                          const uint16_t* __restrict__ a16, int64_t a_stride, int64_t rows, int64_t k_dim,
                          uint16_t* __restrict__ h_out, int64_t h_stride, float* __restrict__ y_out,
                          int64_t y_stride) {
  using Smem = TcSmem<F>;
  constexpr int kStages = Smem::kStages;
  constexpr bool kFp8 = F == MoeFormat::FP8, kInt4 = F == MoeFormat::I4_BF16, kConv = Smem::kConv;
  constexpr int kNMat = kGateUp ? kBN / 2 : kBN;  // output columns per matrix
  moe_grouped::GroupedCta cta;
  if (!moe_grouped::grouped_cta<kGateUp, kBM, kNMat>(table, plan, cta)) return;  // before any barrier
  const int m0 = cta.m0, m_rows = cta.m_rows;
  const int64_t n0 = cta.n0;
  const DeviceWeight w0 = cta.w0, w1 = cta.w1;

  extern __shared__ __align__(16) unsigned char tc_smem[];
  // [m][kLd] bf16 A stage, [n][kLd] bf16 B tile (BF16 ring slot or converted buffer), raw stage.
  auto a_tile = [&](int slot) { return reinterpret_cast<uint16_t*>(tc_smem + slot * Smem::kTileA); };
  auto b_ring = [&](int slot) { return reinterpret_cast<uint16_t*>(tc_smem + Smem::kOffB + slot * Smem::kTileB); };
  auto raw_tile = [&](int slot) { return tc_smem + Smem::kOffB + slot * Smem::kRaw; };
  auto conv_tile = [&](int buf) {
    return reinterpret_cast<uint16_t*>(tc_smem + Smem::kOffConv + buf * Smem::kTileB);
  };

  const int tid = int(threadIdx.x), lane = tid % 32, warp = tid / 32;
  const int wm = warp / 2, wn = warp % 2;
  const int steps = int(k_dim / kBK);

  // A loader: 64 rows x 4 16-byte chunks per step; thread owns chunks tid and tid + 128 (rows
  // tid / 4 and tid / 4 + 32, chunk tid % 4). Rows past the segment are zero-filled (no read).
  const int chunk = tid % 4;
  const uint16_t* a_src[2];
  int a_bytes[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = tid / 4 + 32 * i;
    const bool ok = r < m_rows;
    const int64_t row = !ok ? 0 : kGateUp ? int64_t(plan.sorted[m0 + r] / top_k) : int64_t(m0 + r);
    a_src[i] = a16 + row * a_stride + chunk * 8;
    a_bytes[i] = ok ? 16 : 0;
  }
  // B rows past `rows` are zero-filled. Scalar selects (not a reference to w0 / w1) keep both
  // weights in registers.
  auto b_data = [&](int r) { return (kGateUp && r >= 64) ? w1.data : w0.data; };
  auto b_stride = [&](int r) { return (kGateUp && r >= 64) ? w1.data_stride : w0.data_stride; };

  // Enqueues step s's loads into ring slot s % kStages (nothing past the last step) and commits a
  // group either way, so the group count per step stays uniform for cp_async_wait.
  auto issue = [&](int s) {
    if (s < steps) {
      const int slot = s % kStages;
      const int64_t k0 = int64_t(s) * kBK;
      uint16_t* as = a_tile(slot);
#pragma unroll
      for (int i = 0; i < 2; ++i)
        mma::cp_async16(mma::smem_addr(as + (tid / 4 + 32 * i) * kLd + chunk * 8), a_src[i] + k0, a_bytes[i]);
      if constexpr (F == MoeFormat::BF16) {
        uint16_t* bs = b_ring(slot);
#pragma unroll
        for (int i = 0; i < 4; ++i) {  // 128 rows x 4 chunks: rows tid / 4 + 32 i, chunk tid % 4
          const int r = tid / 4 + 32 * i;
          const int64_t n = b_row<kGateUp>(n0, r);
          const bool ok = n < rows;
          const uint16_t* src = static_cast<const uint16_t*>(b_data(r)) + (ok ? n * b_stride(r) + k0 + chunk * 8 : 0);
          mma::cp_async16(mma::smem_addr(bs + r * kLd + chunk * 8), src, ok ? 16 : 0);
        }
      } else if constexpr (kFp8) {
        unsigned char* raw = raw_tile(slot);
#pragma unroll
        for (int i = 0; i < 2; ++i) {  // 128 rows x 32 bytes: row tid / 2 + 64 i, half tid % 2
          const int r = tid / 2 + 64 * i;
          const int64_t n = b_row<kGateUp>(n0, r);
          const bool ok = n < rows;
          const uint8_t* src =
              static_cast<const uint8_t*>(b_data(r)) + (ok ? n * b_stride(r) + k0 + (tid % 2) * 16 : 0);
          mma::cp_async16(mma::smem_addr(raw + r * 32 + (tid % 2) * 16), src, ok ? 16 : 0);
        }
      } else {
        unsigned char* raw = raw_tile(slot);  // 128 rows x 16 bytes (32 nibbles, one scale group): row tid
        const int64_t n = b_row<kGateUp>(n0, tid);
        const bool ok = n < rows;
        const uint32_t* src = static_cast<const uint32_t*>(b_data(tid)) + (ok ? n * b_stride(tid) + k0 / 8 : 0);
        mma::cp_async16(mma::smem_addr(raw + tid * 16), src, ok ? 16 : 0);
      }
    }
    mma::cp_async_commit();
  };

  // INT4: the bf16 group scale of row tid for step s, loaded a step before its conversion.
  uint32_t scale_next = 0;
  auto load_scale = [&](int s) {
    if constexpr (kInt4) {
      const int64_t n = b_row<kGateUp>(n0, tid);
      const bool up = kGateUp && tid >= 64;
      const uint16_t* scale = static_cast<const uint16_t*>(up ? w1.scale : w0.scale);
      const int64_t scale_stride = up ? w1.scale_stride : w0.scale_stride;
      scale_next = (s < steps && n < rows) ? uint32_t(scale[n * scale_stride + s / (32 / kBK)]) : 0u;
    }
  };

  // Converts raw step s (this thread's own cp.async data) into bf16 buffer s % 2.
  auto convert = [&](int s) {
    if (s >= steps) return;
    const unsigned char* raw = raw_tile(s % kStages);
    uint16_t* bs = conv_tile(s % 2);
    if constexpr (kFp8) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int r = tid / 2 + 64 * i, h = tid % 2;
        const uint4 v = *reinterpret_cast<const uint4*>(raw + r * 32 + h * 16);
        uint4 lo, hi;  // elements 0-7, 8-15 of the 16
        moe_grouped::fp8x16_to_bf16(v, lo, hi);
        *reinterpret_cast<uint4*>(bs + r * kLd + h * 16) = lo;
        *reinterpret_cast<uint4*>(bs + r * kLd + h * 16 + 8) = hi;
      }
    } else if constexpr (kInt4) {
      const uint4 v = *reinterpret_cast<const uint4*>(raw + tid * 16);
      const uint32_t s2 = scale_next | (scale_next << 16);
      const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int c = 0; c < 4; ++c)  // word c = elements 8c .. 8c + 7
        *reinterpret_cast<uint4*>(bs + tid * kLd + 8 * c) = moe_grouped::int4x8_to_bf16(words[c], s2);
    }
  };

  // Accumulators: [m16 tile][n8 tile][c0..c3]. Gate/up: n8 tiles 0-3 gate, 4-7 up, same columns.
  float acc[2][8][4] = {};
  float part[2][8][4] = {};  // FP8: the current 128-k block's partial sums (unused otherwise)
  auto n_base = [&](int j) { return kGateUp ? (j / 4) * 64 + wn * 32 + (j % 4) * 8 : wn * 64 + j * 8; };

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) issue(s);
  if constexpr (kConv) {
    load_scale(0);
    cp_async_wait<kStages - 2>();  // step 0 landed (this thread's own copies are all convert reads)
    convert(0);
    load_scale(1);
  }
  for (int st = 0; st < steps; ++st) {
    // Groups committed so far cover steps 0 .. st + kStages - 2. Converted formats need step st + 1
    // (converted below), BF16 step st.
    cp_async_wait<kConv ? kStages - 3 : kStages - 2>();
    // Step st's tiles visible to all; step st - 1's reads (ring slot (st - 1) % kStages, converted
    // buffer (st + 1) % 2) are finished, so both may be overwritten below.
    __syncthreads();
    issue(st + kStages - 1);
    if constexpr (kConv) {
      convert(st + 1);
      load_scale(st + 2);
    }
    const uint16_t* as = a_tile(st % kStages);
    const uint16_t* bs = kConv ? conv_tile(st % 2) : b_ring(st % kStages);
#pragma unroll
    for (int ks = 0; ks < kBK; ks += 16) {
      uint32_t a[2][4];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
        mma::ldmatrix_x4(a[mi],
                         as + (wm * 32 + mi * 16 + (lane % 8) + ((lane / 8) & 1) * 8) * kLd + ks + (lane / 16) * 8);
      uint32_t b[8][2];
#pragma unroll
      for (int jp = 0; jp < 4; ++jp) {  // matrices: (tile 2jp, k lo), (2jp, k hi), (2jp+1, lo), (2jp+1, hi)
        const int q = lane / 8;
        uint32_t r[4];
        mma::ldmatrix_x4(r, bs + (n_base(2 * jp + (q >> 1)) + (lane % 8)) * kLd + ks + (q & 1) * 8);
        b[2 * jp][0] = r[0];
        b[2 * jp][1] = r[1];
        b[2 * jp + 1][0] = r[2];
        b[2 * jp + 1][1] = r[3];
      }
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int j = 0; j < 8; ++j) mma::mma_bf16(kFp8 ? part[mi][j] : acc[mi][j], a[mi], b[j][0], b[j][1]);
    }
    if constexpr (kFp8) {
      // End of a 128-k scale block (or of K): acc += part x scale. A 128-aligned column tile (gate/up:
      // 64 columns inside one block) sees one scale per matrix and k block.
      const int64_t k0 = int64_t(st) * kBK;
      if ((k0 + kBK) % 128 == 0 || st + 1 == steps) {
        const int64_t srow = n0 / 128, kb = k0 / 128;
        const float s0 = static_cast<const float*>(w0.scale)[srow * w0.scale_stride + kb];
        const float s1 = static_cast<const float*>(w1.scale)[srow * w1.scale_stride + kb];
#pragma unroll
        for (int mi = 0; mi < 2; ++mi)
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            const float s = (kGateUp && j >= 4) ? s1 : s0;
#pragma unroll
            for (int c = 0; c < 4; ++c) {
              acc[mi][j][c] = fmaf(part[mi][j][c], s, acc[mi][j][c]);
              part[mi][j][c] = 0.0f;
            }
          }
      }
    }
  }
  cp_async_wait<0>();  // only empty groups can remain; leave none in flight at exit

  // Epilogue. C fragment: c0, c1 at (row g, cols 2t, 2t + 1), c2, c3 at row g + 8.
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = wm * 32 + mi * 16 + g + half * 8;
      if (r >= m_rows) continue;
      const int p = m0 + r;
      if constexpr (kGateUp) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int64_t col = n0 + wn * 32 + j * 8 + 2 * t;
          if (col >= rows) continue;  // rows % 32 == 0: col and col + 1 are both in or both out
          const float g0 = acc[mi][j][2 * half], g1 = acc[mi][j][2 * half + 1];
          const float u0 = acc[mi][j + 4][2 * half], u1 = acc[mi][j + 4][2 * half + 1];
          const float h0 = moe_grouped::silu_mul(g0, u0), h1 = moe_grouped::silu_mul(g1, u1);
          *reinterpret_cast<uint32_t*>(h_out + int64_t(p) * h_stride + col) = pack_bf16x2(h0, h1);
        }
      } else {
        float* dst = y_out + int64_t(plan.sorted[p]) * y_stride;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int64_t col = n0 + wn * 64 + j * 8 + 2 * t;
          if (col >= rows) continue;
          *reinterpret_cast<float2*>(dst + col) = make_float2(acc[mi][j][2 * half], acc[mi][j][2 * half + 1]);
        }
      }
    }
}

template <MoeFormat F> void launch_format(const MoeGroupedTcArgs& a, Stream stream) {
  // Column tiles vary fastest: the CTAs of one row tile run together and share its A rows in L2, and
  // an expert's 2-3 row tiles are a few dozen CTAs apart, so they share its weight slices too.
  // Dynamic smem (BF16 60 KB, FP8 92 KB, INT4 49 KB) is above the 48 KB default: opt in. Two or
  // three CTAs per SM fit (ptxas: FP8 ~225 registers per thread -> 2, BF16 / INT4 ~145-160 -> 3).
  // Tiles arrive by cp.async.cg (L1 bypassed), so the largest shared carveout costs nothing.
  constexpr int kSmem = TcSmem<F>::kBytes;
  const unsigned tiles = unsigned(a.max_tiles);
  for (const void* fn : {reinterpret_cast<const void*>(moe_grouped_tc_kernel<F, true>),
                         reinterpret_cast<const void*>(moe_grouped_tc_kernel<F, false>)}) {
    MLA_GPU_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    MLA_GPU_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout,
                                       int(cudaSharedmemCarveoutMaxShared)));
  }
  const dim3 g1(unsigned((a.inter + kBN / 2 - 1) / (kBN / 2)), tiles);
  moe_grouped_tc_kernel<F, true><<<g1, kThreads, kSmem, stream>>>(a.table, a.plan, a.top_k, a.x16, a.hidden, a.inter,
                                                                  a.hidden, a.h16, a.inter, nullptr, 0);
  MLA_GPU_LAUNCH_CHECK();
  const dim3 g2(unsigned((a.hidden + kBN - 1) / kBN), tiles);
  moe_grouped_tc_kernel<F, false><<<g2, kThreads, kSmem, stream>>>(a.table, a.plan, a.top_k, a.h16, a.inter,
                                                                   a.hidden, a.inter, nullptr, 0, a.y, a.hidden);
  MLA_GPU_LAUNCH_CHECK();
}

}  // namespace

void moe_grouped_tc_launch(MoeFormat format, const MoeGroupedTcArgs& a, Stream stream) {
  MLA_CHECK(moe_grouped_tc_ok(format, a.hidden, a.inter, true), "moe_grouped_tc: format {} shape {} x {} not taken",
            int(format), a.hidden, a.inter);
  MLA_CHECK(a.plan_tile > 0 && kBM % a.plan_tile == 0, "moe_grouped_tc: plan tiles of {} rows do not divide {}",
            a.plan_tile, kBM);
  MLA_CHECK(a.max_tiles <= kMoeGroupedTcMaxTiles, "moe_grouped_tc: {} row tiles exceed grid y", a.max_tiles);
  if (a.tokens <= 0 || a.max_tiles <= 0) return;
  const int64_t pairs_x = int64_t(a.tokens) * (a.hidden / 2);
  const unsigned blocks = unsigned(std::min<int64_t>((pairs_x + 255) / 256, 132 * 16));
  moe_grouped_tc_prep_kernel<<<blocks, 256, 0, stream>>>(a.x, a.x_stride, a.tokens, a.hidden,
                                                         reinterpret_cast<uint32_t*>(a.x16));
  MLA_GPU_LAUNCH_CHECK();
  // Hopper: the wgmma kernel (same tiles and values; a forced Wgmma where unsupported fails in
  // moe_grouped_sm90a_launch's check).
  const MoeGroupedPath path = moe_grouped_path();
  if (path == MoeGroupedPath::Wgmma || (path == MoeGroupedPath::Auto && moe_grouped_sm90a_supported()))
    return moe_grouped_sm90a_launch(format, a, stream);
  switch (format) {
    case MoeFormat::BF16: return launch_format<MoeFormat::BF16>(a, stream);
    case MoeFormat::FP8: return launch_format<MoeFormat::FP8>(a, stream);
    case MoeFormat::I4_BF16: return launch_format<MoeFormat::I4_BF16>(a, stream);
    default: MLA_CHECK(false, "moe_grouped_tc: format {} not taken", int(format));
  }
}

#else  // HIP: mma.sync is NVIDIA-only; moe_grouped_tc_ok is false, so this is never reached.

void moe_grouped_tc_launch(MoeFormat format, const MoeGroupedTcArgs&, Stream) {
  MLA_CHECK(false, "moe_grouped_tc: not available in this build (format {})", int(format));
}

#endif

}  // namespace mla::gpu
