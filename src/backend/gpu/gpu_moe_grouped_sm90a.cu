// Hopper (sm_90a) kernel of the tensor-core grouped MoE GEMM for FP8 experts (contract and values:
// gpu_moe_grouped_tc.h). The tiles are the mma.sync kernel's (gpu_moe_grouped_tc.cu): one CTA = 64
// sorted pairs of one expert x 128 weight rows (64 gate + 64 up -> bf16 h at the sorted position, or
// 128 down -> fp32 y at the pair index). x / h are bf16, weights exact bf16 (FP8 codes converted in
// shared memory), and each 128-k partial sum is scaled by its FP8 block scale in fp32 ("promotion").
// What differs: one warpgroup computes the 64 x 128 product with wgmma m64n128k16, both operands read
// by the tensor cores straight from 128-byte-swizzled shared memory.
//
// Why (H100, session 33-34): the mma.sync kernel's FP8 reads 12-17% of the bf16 GEMM rate and takes
// ~60% of a prefill's kernel time; ncu binds it on shared-memory wavefronts (ldmatrix fragments of
// every operand per warp, 32- and 64-byte copy rows, 80-byte-pitch stores). Here no fragment is
// loaded into registers, every copy row is a whole 64- or 128-byte segment, and every shared store of
// the converted tile is a conflict-free 16-byte chunk.
//
// Napkin (per CTA and 64-k step; H100 ~4096 bf16 FLOP/clk/SM): 4 wgmma = 64 x 128 x 64 x 2 = 1.05
// MFLOP = 256 tensor clocks; per thread 8 cp.async, 4 shared loads, 8 shared stores and 64 FP8 -> bf16
// conversions (~5 instructions per pair: ~160). Two CTAs per SM (registers: 2 x 64 fp32 accumulators
// per thread) give each scheduler 2 warps: ~400 issue slots per 512 tensor clocks, so conversion and
// tensor work can overlap with the issue port ~80% busy; expect <= ~60% of the bf16 GEMM rate at 4096
// tokens (compute-bound, gpu_moe_grouped_tc.cu's napkin) and less at 1024 (half-empty row tiles).
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
constexpr int kBK = 64;                 // k per step: one 128-byte bf16 row, half an FP8 scale block
constexpr int kThreads = 128;           // one warpgroup
constexpr int kStages = 4;              // cp.async ring depth: loads run 3 steps ahead
static_assert(kBM == 64 && kBN == 128 && kBK == 64 && kThreads == 128, "the loaders and fragments assume these");
static_assert(128 % kBK == 0, "a scale block is a whole number of steps");

// Shared memory, from a 1024-aligned base (the swizzle pattern is a function of the address):
//   A ring   [kStages][64 rows][128 B]  bf16, swizzled (wgmma A)
//   raw ring [kStages][128 rows][64 B]  FP8 codes as copied (read back only by the copying thread)
//   B tiles  [2][128 rows][128 B]       bf16, swizzled (wgmma B), converted one step ahead
constexpr uint32_t kTileA = kBM * kBK * 2;   // 8 KB
constexpr uint32_t kRaw = kBN * kBK;         // 8 KB
constexpr uint32_t kTileB = kBN * kBK * 2;   // 16 KB
constexpr uint32_t kOffRaw = kStages * kTileA;
constexpr uint32_t kOffB = kOffRaw + kStages * kRaw;
constexpr uint32_t kSmem = kOffB + 2 * kTileB;  // 96 KB
constexpr size_t kSmemAlloc = kSmem + 1024;     // + slack to align the base by hand
static_assert(kTileA % 1024 == 0 && kOffB % 1024 == 0 && kTileB % 1024 == 0, "swizzled tiles 1024-aligned");

// Grid (column tiles, max_tiles) as the mma.sync kernel: CTA (x, y) takes plan tile y when it starts
// a 64-row group of its expert's segment, and output columns [n0, n0 + 64) of gate and up or
// [n0, n0 + 128) of down. The accumulator is D[64 pairs x 128 weight rows] (gpu_wgmma.cuh's fragment):
// gate/up columns j < 8 gate, j + 8 the same up column.
//
// Step st (k0 = 64 st), every thread:
//   1. wait for its own copies of step st + 1 (so also st); fence its shared writes (copies of A st,
//      conversions of B st) to the async proxy the tensor cores read through; barrier: A st and B st
//      are whole, and every thread's wgmma of st - 1 has completed (it waited before this barrier),
//      so ring slot (st - 1) % kStages and B tile (st + 1) % 2 may be overwritten;
//   2. issue 4 wgmma of (A st, B st) into `part` (scale_d 0 at a scale block's first k16 restarts it);
//   3. while they run: enqueue the copies of step st + 3, convert raw step st + 1 into B tile
//      (st + 1) % 2;
//   4. wait for the wgmma; at a scale block's last step (or K's) acc += part x block scale.
// Steps past the end copy nothing (zero-fill) and convert stale bytes into a tile nobody reads: the
// loop body has no branch around its wgmma (a compiler-visible one serializes them, gpu_mma.cuh).
template <bool kGateUp>
__global__ void __launch_bounds__(kThreads, 2)
    moe_grouped_fp8_wgmma_kernel(const DeviceExpert* __restrict__ table, Plan plan, int top_k,
                                 const uint16_t* __restrict__ a16, int64_t a_stride, int64_t rows, int64_t k_dim,
                                 uint16_t* __restrict__ h_out, int64_t h_stride, float* __restrict__ y_out,
                                 int64_t y_stride) {
  constexpr int kNMat = kGateUp ? kBN / 2 : kBN;  // output columns per matrix
  const int tile = int(blockIdx.y);
  if (tile >= plan.counters[1]) return;  // uniform per CTA: before any barrier
  const int e = plan.tile_expert[tile];
  const int seg_begin = plan.offsets[e], seg_end = plan.offsets[e + 1], m0 = plan.tile_start[tile];
  if ((m0 - seg_begin) % kBM != 0) return;  // covered by the CTA of the group's first plan tile
  const int m_rows = min(kBM, seg_end - m0);
  const int64_t n0 = int64_t(blockIdx.x) * kNMat;
  const DeviceExpert& ex = table[e];
  const DeviceWeight w0 = kGateUp ? ex.gate : ex.down;
  const DeviceWeight w1 = kGateUp ? ex.up : ex.down;

  extern __shared__ __align__(1024) unsigned char smem_dyn[];
  unsigned char* smem = smem_dyn + ((1024 - (smem_addr(smem_dyn) & 1023)) & 1023);
  const uint32_t a_sa = smem_addr(smem), raw_sa = a_sa + kOffRaw, b_sa = a_sa + kOffB;
  const unsigned char* raw = smem + kOffRaw;
  unsigned char* b_tiles = smem + kOffB;

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
  // Raw FP8 loader: 128 rows x 4 chunks of 16 codes; thread owns chunk tid % 4 of rows tid / 4 + 32 i
  // (the rows it converts). Rows past `rows` are zero-filled.
  const int b_chunk = tid % 4, b_row0 = tid / 4;
  const uint8_t* b_src[4];
  int b_bytes[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = b_row0 + 32 * i;
    const int64_t n = b_row<kGateUp>(n0, r);
    const bool ok = n < rows;
    const bool up = kGateUp && r >= 64;
    const uint8_t* base = static_cast<const uint8_t*>(up ? w1.data : w0.data);
    b_src[i] = base + (ok ? n * (up ? w1.data_stride : w0.data_stride) : 0) + b_chunk * 16;
    b_bytes[i] = ok ? 16 : 0;
  }

  // Enqueues step s's copies into ring slot s % kStages and commits a group (one per step, so the
  // group count per step stays uniform for cp_async_wait). Chunks past K (or a step past the end)
  // are zero-filled without a read.
  auto issue = [&](int s) {
    const int slot = s % kStages;
    const int64_t k0 = int64_t(s) * kBK;
    const bool a_live = k0 + a_chunk * 8 < k_dim;
    const uint32_t as = a_sa + uint32_t(slot) * kTileA;
#pragma unroll
    for (int i = 0; i < 4; ++i)
      cp_async16(as + wgmma::sw128_off(a_row0 + 16 * i, a_chunk), a_src[i] + (a_live ? k0 : 0),
                 a_live ? a_bytes[i] : 0);
    const bool b_live = k0 + b_chunk * 16 < k_dim;
    const uint32_t rs = raw_sa + uint32_t(slot) * kRaw;
#pragma unroll
    for (int i = 0; i < 4; ++i)
      cp_async16(rs + uint32_t((b_row0 + 32 * i) * 64 + b_chunk * 16), b_src[i] + (b_live ? k0 : 0),
                 b_live ? b_bytes[i] : 0);
    cp_async_commit();
  };
  // Converts this thread's raw chunks of step s into B tile s % 2: 16 codes -> bf16 chunks 2c, 2c + 1.
  auto convert = [&](int s) {
    const unsigned char* rs = raw + (s % kStages) * kRaw;
    unsigned char* bt = b_tiles + (s % 2) * kTileB;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = b_row0 + 32 * i;
      const uint4 v = *reinterpret_cast<const uint4*>(rs + r * 64 + b_chunk * 16);
      uint4 lo, hi;
      moe_grouped::fp8x16_to_bf16(v, lo, hi);
      *reinterpret_cast<uint4*>(bt + wgmma::sw128_off(r, 2 * b_chunk)) = lo;
      *reinterpret_cast<uint4*>(bt + wgmma::sw128_off(r, 2 * b_chunk + 1)) = hi;
    }
  };

  const float* scale0 = static_cast<const float*>(w0.scale) + (n0 / 128) * w0.scale_stride;
  const float* scale1 = static_cast<const float*>(w1.scale) + (n0 / 128) * w1.scale_stride;
  float acc[64], part[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = part[i] = 0.0f;

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) issue(s);
  cp_async_wait<kStages - 2>();  // step 0 landed (a thread converts only what it copied)
  convert(0);
  for (int st = 0; st < steps; ++st) {
    cp_async_wait<kStages - 3>();
    fence_proxy_async();
    __syncthreads();
    const int64_t k0 = int64_t(st) * kBK;
    const int kb = int(k0 / 128);
    const float s0 = scale0[kb], s1 = scale1[kb];  // this block's scales (a 128-aligned column tile has one each)
    const int restart = k0 % 128 == 0 ? 0 : 1;
    const uint64_t da = wgmma::desc_sw128(a_sa + uint32_t(st % kStages) * kTileA);
    const uint64_t db = wgmma::desc_sw128(b_sa + uint32_t(st % 2) * kTileB);
    wgmma::fence_regs(part);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk)
      wgmma::mma_m64n128k16_ss(part, wgmma::desc_add(da, kk * 32), wgmma::desc_add(db, kk * 32), kk > 0 ? 1 : restart);
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

}  // namespace

bool moe_grouped_sm90a_supported() {
  int dev = 0, major = 0, minor = 0, smem_optin = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) return false;
  // sm_90a machine code runs on compute capability 9.0 exactly.
  return major == 9 && minor == 0 && kSmemAlloc <= size_t(smem_optin);
}

void moe_grouped_sm90a_fp8(const MoeGroupedTcArgs& a, Stream stream) {
  MLA_CHECK(moe_grouped_sm90a_supported(), "moe_grouped_sm90a: the wgmma kernel needs a compute capability 9.0 device");
  MLA_CHECK(a.plan_tile > 0 && kBM % a.plan_tile == 0, "moe_grouped_sm90a: plan tiles of {} rows do not divide {}",
            a.plan_tile, kBM);
  MLA_CHECK(a.hidden % 32 == 0 && a.inter % 32 == 0, "moe_grouped_sm90a: shape {} x {} not taken", a.hidden, a.inter);
  if (a.tokens <= 0 || a.max_tiles <= 0) return;
  // Column tiles vary fastest (as the mma.sync kernel): the CTAs of one row tile run together and
  // share its A rows in L2, and an expert's row tiles share its weight slices. Copies are cp.async.cg
  // (L1 bypassed): the largest shared carveout costs nothing, and two CTAs fit per SM.
  for (const void* fn : {reinterpret_cast<const void*>(moe_grouped_fp8_wgmma_kernel<true>),
                         reinterpret_cast<const void*>(moe_grouped_fp8_wgmma_kernel<false>)}) {
    MLA_GPU_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmemAlloc)));
    MLA_GPU_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout,
                                       int(cudaSharedmemCarveoutMaxShared)));
  }
  const unsigned tiles = unsigned(a.max_tiles);
  const dim3 g1(unsigned((a.inter + kBN / 2 - 1) / (kBN / 2)), tiles);
  moe_grouped_fp8_wgmma_kernel<true><<<g1, kThreads, kSmemAlloc, stream>>>(
      a.table, a.plan, a.top_k, a.x16, a.hidden, a.inter, a.hidden, a.h16, a.inter, nullptr, 0);
  MLA_GPU_LAUNCH_CHECK();
  const dim3 g2(unsigned((a.hidden + kBN - 1) / kBN), tiles);
  moe_grouped_fp8_wgmma_kernel<false><<<g2, kThreads, kSmemAlloc, stream>>>(
      a.table, a.plan, a.top_k, a.h16, a.inter, a.hidden, a.inter, nullptr, 0, a.y, a.hidden);
  MLA_GPU_LAUNCH_CHECK();
}

#else  // HIP: no wgmma.

bool moe_grouped_sm90a_supported() { return false; }
void moe_grouped_sm90a_fp8(const MoeGroupedTcArgs&, Stream) {
  MLA_CHECK(false, "moe_grouped_sm90a: the wgmma kernel is NVIDIA Hopper-only (check moe_grouped_sm90a_supported)");
}

#endif

namespace {
MoeGroupedPath g_grouped_path = MoeGroupedPath::Auto;
}  // namespace
void set_moe_grouped_path(MoeGroupedPath path) { g_grouped_path = path; }
MoeGroupedPath moe_grouped_path() { return g_grouped_path; }

}  // namespace mla::gpu
