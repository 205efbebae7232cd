// Hopper (sm_90a) kernel of the tensor-core grouped MoE GEMM (contract, formats and values:
// gpu_moe_grouped_tc.h). The tiles are the mma.sync kernel's (gpu_moe_grouped_tc.cu): one CTA = 64
// sorted pairs of one expert x 128 weight rows (64 gate + 64 up -> bf16 h at the sorted position, or
// 128 down -> fp32 y at the pair index). x / h are bf16, weights exact bf16 (FP8 / INT4 codes
// converted in shared memory), and FP8 scales each 128-k partial sum by its block scale in fp32
// ("promotion"). What differs: one warpgroup computes the 64 x 128 product with wgmma m64n128k16,
// both operands read by the tensor cores straight from 128-byte-swizzled shared memory.
//
// Why (H100, sessions 33-34): the mma.sync kernel's FP8 reads 12-17% of the bf16 GEMM rate and takes
// ~60% of a prefill's kernel time; ncu binds it on shared-memory wavefronts (ldmatrix fragments of
// every operand per warp, 32- and 64-byte copy rows, 80-byte-pitch stores). Here no fragment is
// loaded into registers, every copy row is a whole 32-, 64- or 128-byte segment, and every shared
// store of a converted tile is a conflict-free 16-byte chunk.
//
// Napkin (FP8, per CTA and 64-k step; H100 ~4096 bf16 FLOP/clk/SM): 4 wgmma = 64 x 128 x 64 x 2 =
// 1.05 MFLOP = 256 tensor clocks; per thread 8 cp.async, 4 shared loads, 8 shared stores and 64
// FP8 -> bf16 conversions (~5 instructions per pair: ~160). Two CTAs per SM (registers: 2 x 64 fp32
// accumulators per thread) give each scheduler 2 warps: ~400 issue slots per 512 tensor clocks, so
// conversion and tensor work can overlap with the issue port ~80% busy; expect <= ~60% of the bf16
// GEMM rate at 4096 tokens (compute-bound, gpu_moe_grouped_tc.cu's napkin) and less at 1024
// (half-empty row tiles). BF16 converts nothing; INT4 converts 64 codes per thread and step at ~2.3
// instructions each.
#include "backend/gpu/gpu_moe_grouped_sm90a.h"

#include <algorithm>
#include <cstdint>

#include "backend/gpu/gpu_device.cuh"
#include "backend/gpu/gpu_moe_grouped_tc.h"
#include "core/status.h"

#if MLA_GPU_CUDA
#include "backend/gpu/gpu_mma.cuh"
#include "backend/gpu/gpu_moe_grouped.cuh"
#include "backend/gpu/gpu_wgmma.cuh"
#endif

namespace mla::gpu {

#if MLA_GPU_CUDA

namespace {

using moe::Plan;
using namespace mma;  // smem_addr, cp.async, wgmma ordering, fence_proxy_async
using moe_grouped::b_row;

constexpr int kBM = kMoeGroupedTcRows;  // 64 sorted pairs per CTA = wgmma M
constexpr int kBN = 128;                // weight rows per CTA = wgmma N
constexpr int kBK = 64;                 // k per step: one 128-byte bf16 row; half an FP8 scale block, two INT4 groups
constexpr int kThreads = 128;           // one warpgroup
constexpr int kStages = 4;              // cp.async ring depth: loads run 3 steps ahead
static_assert(kBM == 64 && kBN == 128 && kBK == 64 && kThreads == 128, "the loaders and fragments assume these");

// Shared memory per format, from a 1024-aligned base (the swizzle pattern is a function of the
// address). Swizzled bf16 tiles have 128-byte rows (wgmma::sw128_off):
//   A ring [kStages][64 rows]: x or h rows (wgmma A);
//   BF16:  B ring [kStages][128 rows] (wgmma B straight from the copies);
//   FP8 / INT4: raw ring [kStages][128 rows][64 / 32 B] of codes as copied (read back only by the
//          thread that copied them) and B tiles [2][128 rows], converted one step ahead.
template <MoeFormat F> struct Sm90aSmem {
  static constexpr bool kConv = F != MoeFormat::BF16;
  static constexpr uint32_t kTileA = kBM * kBK * 2;  // 8 KB
  static constexpr uint32_t kTileB = kBN * kBK * 2;  // 16 KB
  static constexpr uint32_t kRawRow = F == MoeFormat::FP8 ? kBK : kBK / 2;  // bytes of codes per row and step
  static constexpr uint32_t kRaw = kBN * kRawRow;
  static constexpr uint32_t kOffRing = kStages * kTileA;  // BF16: B ring; else raw ring
  static constexpr uint32_t kOffConv = kOffRing + kStages * (kConv ? kRaw : kTileB);
  static constexpr uint32_t kBytes = kOffConv + (kConv ? 2 * kTileB : 0);  // FP8 96 KB, INT4 80 KB, BF16 96 KB
  static constexpr size_t kAlloc = kBytes + 1024;  // + slack to align the base by hand
  static_assert(kTileA % 1024 == 0 && kOffRing % 1024 == 0 && kOffConv % 1024 == 0, "swizzled tiles 1024-aligned");
};

// Grid (column tiles, max_tiles) as the mma.sync kernel: CTA (x, y) takes plan tile y when it starts
// a 64-row group of its expert's segment, and output columns [n0, n0 + 64) of gate and up or
// [n0, n0 + 128) of down. The accumulator is D[64 pairs x 128 weight rows] (gpu_wgmma.cuh's fragment):
// gate/up columns j < 8 gate, j + 8 the same up column.
//
// Step st (k0 = 64 st), every thread:
//   1. wait for its own copies of step st + 1 (so also st); fence its shared writes (copies of A st
//      and, BF16, B st; conversions of B st) to the async proxy the tensor cores read through;
//      barrier: step st's operands are whole, and every thread's wgmma of st - 1 has completed (it
//      waited before this barrier), so ring slot (st - 1) % kStages and B tile (st + 1) % 2 are free;
//   2. issue 4 wgmma on step st. FP8 accumulates into `part` (scale_d 0 at a scale block's first
//      k16 restarts it), BF16 / INT4 into `acc`;
//   3. while they run: enqueue the copies of step st + 3, convert raw step st + 1 (FP8 / INT4; INT4
//      also loads the group scales of step st + 2);
//   4. wait for the wgmma; FP8 at a scale block's last step (or K's): acc += part x block scale.
// Steps past the end copy nothing (zero-fill) and convert stale bytes into a tile nobody reads: the
// loop body has no branch around its wgmma (a compiler-visible one serializes them, gpu_mma.cuh).
template <MoeFormat F, bool kGateUp>
__global__ void __launch_bounds__(kThreads, 2)
    moe_grouped_wgmma_kernel(const DeviceExpert* __restrict__ table, Plan plan, int top_k,
                             const uint16_t* __restrict__ a16, int64_t a_stride, int64_t rows, int64_t k_dim,
                             uint16_t* __restrict__ h_out, int64_t h_stride, float* __restrict__ y_out,
                             int64_t y_stride) {
  using Smem = Sm90aSmem<F>;
  constexpr bool kFp8 = F == MoeFormat::FP8, kInt4 = F == MoeFormat::I4_BF16, kConv = Smem::kConv;
  constexpr int kNMat = kGateUp ? kBN / 2 : kBN;  // output columns per matrix
  moe_grouped::GroupedCta cta;
  if (!moe_grouped::grouped_cta<kGateUp, kBM, kNMat>(table, plan, cta)) return;  // before any barrier
  const int m0 = cta.m0, m_rows = cta.m_rows;
  const int64_t n0 = cta.n0;
  const DeviceWeight w0 = cta.w0, w1 = cta.w1;

  extern __shared__ __align__(1024) unsigned char smem_dyn[];
  unsigned char* smem = smem_dyn + ((1024 - (smem_addr(smem_dyn) & 1023)) & 1023);
  const uint32_t a_sa = smem_addr(smem), ring_sa = a_sa + Smem::kOffRing, conv_sa = a_sa + Smem::kOffConv;

  const int tid = int(threadIdx.x), lane = tid % 32, warp = tid / 32;
  const int steps = int((k_dim + kBK - 1) / kBK);  // K % 32 == 0: the last step may hold 32 live k

  // A loader: 64 rows x 8 chunks per step; thread owns chunk tid % 8 of rows tid / 8 + 16 i (8 threads
  // copy one row's contiguous 128 bytes). Rows past the segment are zero-filled (no read).
  const int a_chunk = tid % 8, a_row0 = tid / 8;
  const uint16_t* a_src[4];
  int a_bytes[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = a_row0 + 16 * i;
    const bool ok = r < m_rows;
    const int64_t row = !ok ? 0 : kGateUp ? int64_t(plan.sorted[m0 + r] / top_k) : int64_t(m0 + r);
    a_src[i] = a16 + row * a_stride + a_chunk * 8;
    a_bytes[i] = ok ? 16 : 0;
  }
  // B loader: 128 rows x kChunks 16-byte chunks of one step (BF16 8: bf16 into the ring; FP8 4: codes;
  // INT4 2: one 32-nibble group each); thread owns chunk tid % kChunks of rows tid / kChunks + kRowStep i
  // (FP8 / INT4: the rows it converts). Rows past `rows` are zero-filled. Byte offsets per k: BF16 2,
  // FP8 1, INT4 1/2 (data_stride counts bf16, bytes and 32-bit words respectively).
  constexpr int kChunks = kFp8 ? 4 : kInt4 ? 2 : 8;
  constexpr int kRowStep = kThreads / kChunks, kBRows = kBN / kRowStep;
  const int b_chunk = tid % kChunks, b_row0 = tid / kChunks;
  const unsigned char* b_src[kBRows];
  int b_bytes[kBRows];
#pragma unroll
  for (int i = 0; i < kBRows; ++i) {
    const int r = b_row0 + kRowStep * i;
    const int64_t n = b_row<kGateUp>(n0, r);
    const bool ok = n < rows;
    const bool up = kGateUp && r >= 64;
    const unsigned char* base = static_cast<const unsigned char*>(up ? w1.data : w0.data);
    const int64_t row_bytes = (up ? w1.data_stride : w0.data_stride) * (kFp8 ? 1 : kInt4 ? 4 : 2);
    b_src[i] = base + (ok ? n * row_bytes : 0) + b_chunk * 16;
    b_bytes[i] = ok ? 16 : 0;
  }
  // k (elements) per 16-byte chunk of B as stored, and the step's byte offset in a weight row.
  constexpr int kChunkK = kFp8 ? 16 : kInt4 ? 32 : 8;
  auto b_step_bytes = [](int64_t k0) { return kFp8 ? k0 : kInt4 ? k0 / 2 : k0 * 2; };

  // Enqueues step s's copies into ring slot s % kStages and commits a group (one per step, so the
  // group count per step stays uniform for cp_async_wait). Chunks past K (or a step past the end)
  // are zero-filled without a read.
  auto issue = [&](int s) {
    const int slot = s % kStages;
    const int64_t k0 = int64_t(s) * kBK;
    const bool a_live = k0 + a_chunk * 8 < k_dim;
    const uint32_t as = a_sa + uint32_t(slot) * Smem::kTileA;
#pragma unroll
    for (int i = 0; i < 4; ++i)
      cp_async16(as + wgmma::sw128_off(a_row0 + 16 * i, a_chunk), a_src[i] + (a_live ? k0 : 0),
                 a_live ? a_bytes[i] : 0);
    const bool b_live = k0 + b_chunk * kChunkK < k_dim;
    const int64_t off = b_live ? b_step_bytes(k0) : 0;
#pragma unroll
    for (int i = 0; i < kBRows; ++i) {
      const int r = b_row0 + kRowStep * i;
      const uint32_t dst = kConv ? ring_sa + uint32_t(slot) * Smem::kRaw + uint32_t(r) * Smem::kRawRow + b_chunk * 16
                                 : ring_sa + uint32_t(slot) * Smem::kTileB + wgmma::sw128_off(r, b_chunk);
      cp_async16(dst, b_src[i] + off, b_live ? b_bytes[i] : 0);
    }
    cp_async_commit();
  };

  // INT4: the bf16 group scale of each converted chunk (row b_row0 + 64 i, group 2 s + b_chunk),
  // loaded a step before its conversion; 0 past K or `rows` (the codes there are zero-filled: 0 x
  // (0 - 8) = 0).
  uint32_t scale_next[kInt4 ? kBRows : 1] = {};
  auto load_scale = [&](int s) {
    if constexpr (kInt4) {
      const int64_t group = int64_t(s) * 2 + b_chunk;
#pragma unroll
      for (int i = 0; i < kBRows; ++i) {
        const int r = b_row0 + kRowStep * i;
        const int64_t n = b_row<kGateUp>(n0, r);
        const bool up = kGateUp && r >= 64;
        const uint16_t* scale = static_cast<const uint16_t*>(up ? w1.scale : w0.scale);
        const int64_t scale_stride = up ? w1.scale_stride : w0.scale_stride;
        scale_next[i] = (group * 32 < k_dim && n < rows) ? uint32_t(scale[n * scale_stride + group]) : 0u;
      }
    }
  };
  // Converts this thread's raw chunks of step s into B tile s % 2 (FP8: 16 codes -> bf16 chunks 2c,
  // 2c + 1; INT4: 32 nibbles -> chunks 4c .. 4c + 3).
  auto convert = [&](int s) {
    if constexpr (kConv) {
      const unsigned char* rs = smem + Smem::kOffRing + (s % kStages) * Smem::kRaw;
      unsigned char* bt = smem + Smem::kOffConv + (s % 2) * Smem::kTileB;
#pragma unroll
      for (int i = 0; i < kBRows; ++i) {
        const int r = b_row0 + kRowStep * i;
        const uint4 v = *reinterpret_cast<const uint4*>(rs + r * Smem::kRawRow + b_chunk * 16);
        if constexpr (kFp8) {
          uint4 lo, hi;
          moe_grouped::fp8x16_to_bf16(v, lo, hi);
          *reinterpret_cast<uint4*>(bt + wgmma::sw128_off(r, 2 * b_chunk)) = lo;
          *reinterpret_cast<uint4*>(bt + wgmma::sw128_off(r, 2 * b_chunk + 1)) = hi;
        } else {
          const uint32_t s2 = scale_next[i] | (scale_next[i] << 16);
          const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
          for (int w = 0; w < 4; ++w)  // word w = elements 8w .. 8w + 7 of the group
            *reinterpret_cast<uint4*>(bt + wgmma::sw128_off(r, 4 * b_chunk + w)) =
                moe_grouped::int4x8_to_bf16(words[w], s2);
        }
      }
    }
  };

  // FP8 block scales of this column tile (a 128-aligned tile has one per matrix and k block).
  const float* scale0 = kFp8 ? static_cast<const float*>(w0.scale) + (n0 / 128) * w0.scale_stride : nullptr;
  const float* scale1 = kFp8 ? static_cast<const float*>(w1.scale) + (n0 / 128) * w1.scale_stride : nullptr;
  float acc[64], part[kFp8 ? 64 : 1];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
#pragma unroll
  for (int i = 0; i < (kFp8 ? 64 : 1); ++i) part[i] = 0.0f;

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) issue(s);
  if constexpr (kConv) {
    load_scale(0);
    cp_async_wait<kStages - 2>();  // step 0 landed (a thread converts only what it copied)
    convert(0);
    load_scale(1);
  }
  for (int st = 0; st < steps; ++st) {
    // Groups committed so far cover steps 0 .. st + kStages - 2. Converted formats need step st + 1
    // (converted below), BF16 step st.
    cp_async_wait<kConv ? kStages - 3 : kStages - 2>();
    fence_proxy_async();
    __syncthreads();
    const int64_t k0 = int64_t(st) * kBK;
    const uint64_t da = wgmma::desc_sw128(a_sa + uint32_t(st % kStages) * Smem::kTileA);
    const uint64_t db = wgmma::desc_sw128(kConv ? conv_sa + uint32_t(st % 2) * Smem::kTileB
                                                : ring_sa + uint32_t(st % kStages) * Smem::kTileB);
    if constexpr (kFp8) {
      const int kb = int(k0 / 128);
      const float s0 = scale0[kb], s1 = scale1[kb];
      const int restart = k0 % 128 == 0 ? 0 : 1;
      wgmma::fence_regs(part);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk)
        wgmma::mma_m64n128k16_ss(part, wgmma::desc_add(da, kk * 32), wgmma::desc_add(db, kk * 32),
                                 kk > 0 ? 1 : restart);
      wgmma_commit();
      issue(st + kStages - 1);
      convert(st + 1);
      wgmma_wait<0>();
      wgmma::fence_regs(part);
      // Fold at a scale block's end or K's: acc += part x scale (x 0 elsewhere, branch-free; part is
      // finite, and restarts at the next block's first wgmma).
      const bool fold = (k0 + kBK) % 128 == 0 || st + 1 == steps;
      const float f0 = fold ? s0 : 0.0f, f1 = fold ? s1 : 0.0f;
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const float f = (kGateUp && j >= 8) ? f1 : f0;
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[4 * j + c] = fmaf(part[4 * j + c], f, acc[4 * j + c]);
      }
    } else {
      wgmma::fence_regs(acc);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk)
        wgmma::mma_m64n128k16_ss(acc, wgmma::desc_add(da, kk * 32), wgmma::desc_add(db, kk * 32), 1);
      wgmma_commit();
      issue(st + kStages - 1);
      convert(st + 1);
      load_scale(st + 2);
      wgmma_wait<0>();
      wgmma::fence_regs(acc);
    }
  }
  cp_async_wait<0>();  // the zero-fills of steps past the end; leave none in flight at exit

  // Epilogue: d[4j + 2 half + {0, 1}] = D[16 warp + g + 8 half][8j + 2t + {0, 1}].
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = 16 * warp + g + 8 * half;
    if (r >= m_rows) continue;
    const int p = m0 + r;
    if constexpr (kGateUp) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int64_t col = n0 + 8 * j + 2 * t;
        if (col >= rows) continue;  // rows % 32 == 0: col and col + 1 are both in or both out
        const float h0 = moe_grouped::silu_mul(acc[4 * j + 2 * half], acc[4 * (j + 8) + 2 * half]);
        const float h1 = moe_grouped::silu_mul(acc[4 * j + 2 * half + 1], acc[4 * (j + 8) + 2 * half + 1]);
        *reinterpret_cast<uint32_t*>(h_out + int64_t(p) * h_stride + col) = moe_grouped::pack_bf16x2(h0, h1);
      }
    } else {
      float* dst = y_out + int64_t(plan.sorted[p]) * y_stride;
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const int64_t col = n0 + 8 * j + 2 * t;
        if (col >= rows) continue;
        *reinterpret_cast<float2*>(dst + col) = make_float2(acc[4 * j + 2 * half], acc[4 * j + 2 * half + 1]);
      }
    }
  }
}

template <MoeFormat F> void launch_format(const MoeGroupedTcArgs& a, Stream stream) {
  // Column tiles vary fastest (as the mma.sync kernel): the CTAs of one row tile run together and
  // share its A rows in L2, and an expert's row tiles share its weight slices. Copies are cp.async.cg
  // (L1 bypassed): the largest shared carveout costs nothing, and two CTAs fit per SM.
  constexpr size_t kAlloc = Sm90aSmem<F>::kAlloc;
  for (const void* fn : {reinterpret_cast<const void*>(moe_grouped_wgmma_kernel<F, true>),
                         reinterpret_cast<const void*>(moe_grouped_wgmma_kernel<F, false>)}) {
    MLA_GPU_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kAlloc)));
    MLA_GPU_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout,
                                       int(cudaSharedmemCarveoutMaxShared)));
  }
  const unsigned tiles = unsigned(a.max_tiles);
  const dim3 g1(unsigned((a.inter + kBN / 2 - 1) / (kBN / 2)), tiles);
  moe_grouped_wgmma_kernel<F, true><<<g1, kThreads, kAlloc, stream>>>(a.table, a.plan, a.top_k, a.x16, a.hidden,
                                                                      a.inter, a.hidden, a.h16, a.inter, nullptr, 0);
  MLA_GPU_LAUNCH_CHECK();
  const dim3 g2(unsigned((a.hidden + kBN - 1) / kBN), tiles);
  moe_grouped_wgmma_kernel<F, false><<<g2, kThreads, kAlloc, stream>>>(a.table, a.plan, a.top_k, a.h16, a.inter,
                                                                       a.hidden, a.inter, nullptr, 0, a.y, a.hidden);
  MLA_GPU_LAUNCH_CHECK();
}

constexpr size_t kMaxAlloc = std::max({Sm90aSmem<MoeFormat::BF16>::kAlloc, Sm90aSmem<MoeFormat::FP8>::kAlloc,
                                       Sm90aSmem<MoeFormat::I4_BF16>::kAlloc});

}  // namespace

bool moe_grouped_sm90a_supported() { return wgmma::sm90a_device_fits(kMaxAlloc); }

void moe_grouped_sm90a_launch(MoeFormat format, const MoeGroupedTcArgs& a, Stream stream) {
  MLA_CHECK(moe_grouped_sm90a_supported(), "moe_grouped_sm90a: the wgmma kernel needs a compute capability 9.0 device");
  MLA_CHECK(a.plan_tile > 0 && kBM % a.plan_tile == 0, "moe_grouped_sm90a: plan tiles of {} rows do not divide {}",
            a.plan_tile, kBM);
  MLA_CHECK(a.hidden % 32 == 0 && a.inter % 32 == 0, "moe_grouped_sm90a: shape {} x {} not taken", a.hidden, a.inter);
  if (a.tokens <= 0 || a.max_tiles <= 0) return;
  switch (format) {
    case MoeFormat::BF16: return launch_format<MoeFormat::BF16>(a, stream);
    case MoeFormat::FP8: return launch_format<MoeFormat::FP8>(a, stream);
    case MoeFormat::I4_BF16: return launch_format<MoeFormat::I4_BF16>(a, stream);
    default: MLA_CHECK(false, "moe_grouped_sm90a: format {} not taken", int(format));
  }
}

#else  // HIP: no wgmma.

bool moe_grouped_sm90a_supported() { return false; }
void moe_grouped_sm90a_launch(MoeFormat format, const MoeGroupedTcArgs&, Stream) {
  MLA_CHECK(false, "moe_grouped_sm90a: the wgmma kernel is NVIDIA Hopper-only (format {}; check "
                   "moe_grouped_sm90a_supported)", int(format));
}

#endif

namespace {
MoeGroupedPath g_grouped_path = MoeGroupedPath::Auto;
}  // namespace
void set_moe_grouped_path(MoeGroupedPath path) { g_grouped_path = path; }
MoeGroupedPath moe_grouped_path() { return g_grouped_path; }

}  // namespace mla::gpu
