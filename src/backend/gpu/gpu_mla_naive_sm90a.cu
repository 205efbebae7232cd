// Hopper (sm_90a) chunk kernel of the naive MLA prefill for d_qk 192 / d_v 128: the semantics of
// naive_tc_chunk (gpu_mla_naive_tc.cu) on wgmma instead of mma.sync. Trade-off: the simplest wgmma
// design that can be proved right on paper (K / V by the bulk tensor copy engine into 128-byte-swizzled
// tiles, issued by one producer warp on full / empty mbarriers; two stages, no setmaxnreg) over the
// whole of FlashAttention-3's warp-specialized pipeline.
#include "backend/gpu/gpu_mla_naive_sm90a.h"

#include <algorithm>

#include "backend/gpu/gpu_device.cuh"
#include "core/status.h"

#if MLA_GPU_CUDA
#include "backend/gpu/gpu_mma.cuh"
#include "backend/gpu/gpu_tensor_map.cuh"  // tensor_map_encoder, CUtensorMap
#include "backend/gpu/gpu_wgmma.cuh"
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "gpu_mla_naive_sm90a.cu must be compiled for sm_90a only (src/backend/gpu/CMakeLists.txt)"
#endif
#endif

namespace mla::gpu {

#if MLA_GPU_CUDA
namespace {

using namespace mma;  // smem_addr, cp.async (gpu_mma.cuh)

// ---- Design -------------------------------------------------------------------------------------
// CTA = 2 math warpgroups (256 threads) + 1 producer warp; 128 query rows x one head; warpgroup w
// owns rows [64 w, 64 w + 64) (wgmma m64). Key tiles of 128 keys, double-buffered in shared memory:
// the producer warp's lane 0 fills a buffer with the bulk tensor copy engine (TMA: 5 boxes of 128 keys
// x 64 dims, completing on the buffer's "full" mbarrier) as soon as both warpgroups released it on its
// "empty" mbarrier; no CTA-wide barrier inside the loop. Per warpgroup and tile:
//   S[64 x 128]  = Q K^T:  12 x wgmma m64n128k16, A = Q (smem), B = K (smem, K-major)
//   softmax on the fp32 accumulators (2 rows per thread, quad shuffles), P -> bf16 A fragments
//   O[64 x 128] += P V:     8 x wgmma m64n128k16, A = P (registers), B = V (smem, MN-major, trans-b)
// Napkin: per CTA tile 2 x 128 x 128 x 320 = 10.5 MFLOP for 80 KB of K/V (from L2; the 16-32 row
// tiles of a head share them): 128 FLOP/B. At 16K context, 4096 rows, 128 heads: 4.8 TFLOP causal.
// Registers per thread: S 64 + O 64 + P 32 (P overwrites dead S) fp32/bf16x2; ptxas (CUDA 13.0): 168
// with TMA (no per-thread copy addresses), no spills, under the 224 cap of one 288-thread CTA per SM.
// Shared memory: Q 48 KB + 2 x (K 48 KB + V 32 KB) = 208 KB (1 CTA per SM).
// Softmax cost: 64 ex2 per thread and tile; MUFU does 4 / clk per SM sub-partition, so a warp's 2048
// take 512 clk against 768 + 512 clk of its warpgroup's wgmma (m64n128k16 ~ 64 clk at 4096 FLOP/clk/SM)
// -- 40% of the tensor time, lost if both warpgroups exponentiate at once. A named barrier orders the
// two warpgroups' S issue (ping-pong, below) so each softmax runs under the other's GEMMs.
// Why TMA (session 10): with per-lane 16-byte cp.async copies the L2 served twice the K / V bytes the
// kernel asked for and sat 72% busy with the tensor pipe 24% active (ncu, docs/performance.md session 9);
// a box copy moves whole 128-byte lines and takes the 80 copy instructions per thread and tile off the
// math warps. Why a producer warp rather than thread 0: the refill then waits only for the buffer's
// readers, not for a __syncthreads that also stalled warpgroup 0 behind warpgroup 1's P V. Not done
// (FA3): a third stage (no shared memory left at d_qk 192), setmaxnreg (168 registers fit without it).
// (An intra-warpgroup-overlap variant, S(t + 1) and its softmax under P V(t), passed parity on the
// H200 but measured 8-10% slower in the cp.async kernel: 194 / 210 TFLOP/s against 211 / 233 at
// 16 / 128 heads, ctx 16K, 2026-11-30; not kept.)
//
// ---- Shared-memory layouts ----------------------------------------------------------------------
// Descriptors (PTX ISA "Matrix Descriptor Format"): bits 0-13 start address >> 4, 16-29 leading byte
// offset (LBO) >> 4, 32-45 stride byte offset (SBO) >> 4, 49-51 base offset (0: every swizzled tile
// starts 1024-byte aligned), 62-63 swizzle mode (0 none, 1 = 128 B). T = 8 bf16 = 16 B below.
// Q (A of S; staged by the threads from fp32): no swizzle, "interleaved" core matrices. A core matrix
//   is 8 rows x 16 bytes stored as 128 contiguous bytes, row r at byte 16 r; core matrix (row block rb,
//   unit u of 8 dims) at byte (rb 24 + u) 128, so element (row, col) lives at
//   ((row / 8) 24 + col / 8) 128 + (row % 8) 16 + (col % 8) 2, and linear 16-byte unit c = 8 (rb 24 + u)
//   + row % 8 is byte 16 c. K-major, no swizzle: ((8, m), (T, 2k)) : ((1T, SBO), (1, LBO)) -> LBO =
//   128 (next 8 dims), SBO = 24 x 128 = 3072 (next 8 rows). k-step ks starts at + 256 ks B; warpgroup
//   w's rows at + 8 w x 3072 B.
// K and V (written by TMA, CU_TENSOR_MAP_SWIZZLE_128B): a box of 128 keys x 64 dims lands as 128 rows
//   of 128 B, row r at byte 128 r with its eight 16-byte units permuted, unit u at u ^ (r % 8). K's 192
//   dims are 3 such boxes (16 KB apart), V's 128 columns 2.
//   K (B of S, K-major, 128-byte swizzle): ((8, m), (T, 2k)) : ((8T, SBO), (1, T)) -> SBO = 1024 (next
//     8 keys); LBO unused (a k-step never leaves its 128-byte row; encoded 16). k-step ks (dims
//     16 ks ..) starts in box ks / 4 at + 32 (ks % 4) B: the hardware applies the XOR to the address
//     bits, so a start inside the swizzle row is how a k-step is selected (the tile base stays aligned).
//   V (B of P V, MN-major, 128-byte swizzle): ((T, 8, m), (8, k)) : ((1, T, LBO), (8T, SBO)) -> LBO =
//     16384 (the next 64 columns = the next box), SBO = 1024 (next 8 keys). k-step ks (keys 16 ks ..)
//     starts at + 2048 ks B. (The swizzled MN-major modes put the MN-direction repeat in LBO; the
//     no-swizzle mode puts it in SBO.)
//   Transpose flags: S uses tnspA = tnspB = 0 (both K-major); P V uses tnspB = 1 (MN-major B).
//
// ---- Register fragments (wgmma m64nNk16, per PTX ISA; g = lane / 4, t = lane % 4, warp q = warp % 4
// of the warpgroup owns rows 16 q .. 16 q + 15) --------------------------------------------------
//   D (f32, N / 2 regs): d[4 i + e] = D[16 q + g + 8 (e / 2)][8 i + 2 t + (e % 2)], i < N / 8.
//   A (bf16 from registers, 4 x b32): a0 = A[16 q + g][2t, 2t+1], a1 = A[16 q + g + 8][2t, 2t+1],
//     a2 = A[16 q + g][2t+8, 2t+9], a3 = A[16 q + g + 8][2t+8, 2t+9]  (low half = lower column).
//   So P's k-step ks (keys 16 ks .. 16 ks + 15 = S n8-blocks 2 ks, 2 ks + 1) is, register-locally,
//   a0 = (s[8ks], s[8ks+1]), a1 = (s[8ks+2], s[8ks+3]), a2 = (s[8ks+4], s[8ks+5]), a3 = (s[8ks+6], s[8ks+7]).
//
// ---- If parity fails, check first ----------------------------------------------------------------
//   1. V descriptor: swap LBO / SBO (16384 <-> 1024) -- the one layout that is MN-major.
//   2. S alone: set O += P V aside and dump S for one tile against Q K^T on the host (descriptor of
//      Q / K, the 256-B / 32-B k-step advances, warpgroup row offset 8 x 3072).
//   3. cuobjdump -sass: HGMMA present, no "wgmma serialized" ptxas warning, no local memory.
//   4. The proxy fence after the Q stores; the mbarrier parities (full: (tile / 2) % 2 for buffer
//      tile % 2; empty: the producer's wait before tile t >= 2 is for phase ((t / 2) - 1) % 2).

constexpr int kDqk = 192, kDv = 128;
constexpr int kWarpgroups = 2, kMathThreads = kWarpgroups * 128;  // CUDA-only: 32-lane warps
constexpr int kProducerWarp = kMathThreads / 32;                   // warp 8: the copy issuer
constexpr int kThreads = kMathThreads + 32;
constexpr int kRows = kWarpgroups * 64;                       // query rows per CTA
constexpr int kKeys = 128;                                    // keys per tile (wgmma N of S)
constexpr int kQUnits = kDqk / 8;                             // 16-byte units per Q row: 24
constexpr uint32_t kQBytes = kRows * kDqk * 2;                // 48 KB
constexpr uint32_t kKBytes = kKeys * kDqk * 2;                // 48 KB per stage
constexpr uint32_t kVBytes = kKeys * kDv * 2;                 // 32 KB per stage
constexpr size_t kSmem = size_t(kQBytes) + 2 * size_t(kKBytes + kVBytes);  // 208 KB
constexpr uint32_t kQSbo = kQUnits * 128;   // 3072: next 8 rows of Q
constexpr int kBoxDims = 64;                  // dims (K) or columns (V) per TMA box: one 128-byte row
constexpr uint32_t kBoxBytes = kKeys * kBoxDims * 2;  // 16 KB
constexpr uint32_t kTileTx = kKBytes + kVBytes;       // bytes the copy engine credits per tile (5 boxes)
constexpr uint32_t kSwRowGroup = 1024;                // 8 swizzled 128-byte rows: SBO of K and V
constexpr uint32_t kBarOffset = kQBytes + 2 * (kKBytes + kVBytes);  // 4 mbarriers: full[2], empty[2]
constexpr size_t kSmemAlloc = kSmem + 64 + 1024;  // + barriers + slack to align the base to 1024
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kNegInf = -__builtin_huge_valf();
static_assert((kRows * kQUnits) % kMathThreads == 0, "whole Q staging passes");
static_assert(kSmemAlloc <= 227 * 1024, "one CTA per SM within the opt-in limit");
static_assert(kQBytes % 1024 == 0 && kKBytes % 1024 == 0 && kVBytes % 1024 == 0, "swizzled tiles 1024-aligned");
static_assert(kKBytes == (kDqk / kBoxDims) * kBoxBytes && kVBytes == (kDv / kBoxDims) * kBoxBytes, "whole boxes");

// Descriptor of a no-swizzle tile at shared address `addr` (16-byte aligned, < 256 KB).
__device__ __forceinline__ uint64_t make_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return uint64_t((addr >> 4) & 0x3fff) | (uint64_t((lbo >> 4) & 0x3fff) << 16) |
         (uint64_t((sbo >> 4) & 0x3fff) << 32);  // base offset 0, swizzle mode 0
}
// 128-byte-swizzled descriptors and the start-address advance: gpu_wgmma.cuh.
using wgmma::desc_add;
using wgmma::desc_sw128;

// ---- bulk tensor copy (PTX ISA 8.0, sm_90; the mbarriers are gpu_mma.cuh's) ----------------------
// Thread with p: copy box (c0, c1, c2) of the 3-D tensor map into shared `dst`, completing on `bar`.
__device__ __forceinline__ void tma_load_3d_if(bool p, uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0,
                                               int c1, int c2) {
  asm volatile(
      "{\n.reg .pred q;\nsetp.ne.u32 q, %0, 0;\n"
      "@q cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%1], [%2, {%4, %5, %6}], [%3];\n}\n" ::"r"(
          uint32_t(p)),
      "r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

// Named barriers over the 256 math threads (gpu_mma.cuh; id 0 is __syncthreads): 1 + w = "warpgroup w
// may issue its S"; 3 = Q staged.
constexpr uint32_t kBarQ = 3;
// Pins a register value at this point of the instruction stream: the compiler may not move its
// producers below, nor its consumers above (wgmma reads / writes registers asynchronously, between
// issue and wait_group, which the compiler cannot see).
__device__ __forceinline__ void pin(float& x) { asm volatile("" : "+f"(x)::"memory"); }
__device__ __forceinline__ void pin(uint32_t& x) { asm volatile("" : "+r"(x)::"memory"); }

// D[64 x 128] (+)= A[64 x 16] B[16 x 128], A and B from shared memory, both K-major (gpu_wgmma.cuh).
using wgmma::mma_m64n128k16_ss;
// D[64 x 128] += A[64 x 16] B[16 x 128], A from registers (bf16x2), B from shared memory MN-major
// (imm-trans-b = 1).
__device__ __forceinline__ void wgmma_rs_tb(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, "
      "%8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, "
      "%40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, "
      "%56, %57, %58, %59, %60, %61, %62, %63"
      "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      :
        "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}

// Block (row tile, head): rows [i0, i0 + 128) of the sequence for head h against the chunk's keys.
// Causal rule (as naive_tc_chunk): CTA-relative row r sees chunk key jj iff jj < n and
// jj <= first_pos + i0 + r - j0 =: lim(r); a warpgroup skips the key tiles none of its 64 rows sees and
// masks only the tiles that straddle its rows' limits or the chunk end. Running state (m in log2
// units of the scaled score, per-lane partial sums l, unnormalized O) as the mma.sync kernels.
// Tensor maps (host, naive_sm90a_chunk): K as [H][n][192] and V as [H][n][128] bf16, boxes of
// 64 x 128 x 1, 128-byte swizzle; keys at or past n read as zeros (0 x garbage could be NaN in P V).
__global__ void __launch_bounds__(kThreads, 1)
    naive_sm90a_kernel(const NaiveTcArgs a, const __grid_constant__ CUtensorMap k_map,
                       const __grid_constant__ CUtensorMap v_map) {
  extern __shared__ __align__(1024) unsigned char smem_dyn[];
  // The swizzle pattern is a function of the address: align the base to 1024 B (kSmemAlloc has slack).
  unsigned char* smem_raw = smem_dyn + ((1024 - (smem_addr(smem_dyn) & 1023)) & 1023);
  const uint32_t q_sa = smem_addr(smem_raw);     // Q [128 rows x 192]
  const uint32_t k_sa = q_sa + kQBytes;          // K [2][3 boxes][128 keys x 64]
  const uint32_t v_sa = k_sa + 2 * kKBytes;      // V [2][2 boxes][128 keys x 64]
  // mbarriers: full[b] at + 8 b (the copy engine's bytes of the tile in buffer b landed; 1 arrival +
  // tx), empty[b] at + 16 + 8 b (both warpgroups are done reading buffer b: lane 0 of each of the 8
  // math warps arrives after its last wgmma wait on the tile).
  const uint32_t full_sa = q_sa + kBarOffset, empty_sa = full_sa + 16;

  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
  const int wg = warp / 4, wq = warp % 4;
  const int h = int(blockIdx.y);
  const int64_t i0 = int64_t(gridDim.x - 1 - blockIdx.x) * kRows;  // heaviest row tiles first
  const int qn = int(min(int64_t(kRows), a.q_len - i0));
  const int64_t base_lim = a.first_pos + i0 - a.j0;  // lim(r) = base_lim + r
  const int64_t n_eff = min(a.n, base_lim + qn);      // keys any valid row of the CTA sees; may be <= 0
  const int num_tiles = n_eff > 0 ? int((n_eff + kKeys - 1) / kKeys) : 0;
  if (tid == 0) {
    for (int b = 0; b < 2; ++b) {
      mbar_init(full_sa + 8 * b, 1);
      mbar_init(empty_sa + 8 * b, kMathThreads / 32);
    }
    mbar_init_fence();
  }
  __syncthreads();  // the barriers are initialised; the last barrier over all 288 threads

  if (warp == kProducerWarp) {
    // Producer: lane 0 refills buffer tile % 2 once both warpgroups released the tile two before it;
    // one expect_tx and 5 box copies per tile. Keys past the tensor's n arrive as zeros; keys in
    // [n_eff, n) are real data that the causal mask gives weight 0.
    if (lane == 0) {
      for (int tile = 0; tile < num_tiles; ++tile) {
        const uint32_t buf = uint32_t(tile & 1), bar = full_sa + 8 * buf;
        if (tile >= 2) mbar_wait(empty_sa + 8 * buf, uint32_t((tile >> 1) - 1) & 1u);
        mbar_arrive_expect_tx_if(true, bar, kTileTx);
        for (int b = 0; b < kDqk / kBoxDims; ++b)
          tma_load_3d_if(true, k_sa + buf * kKBytes + uint32_t(b) * kBoxBytes, &k_map, bar, b * kBoxDims,
                         tile * kKeys, h);
        for (int b = 0; b < kDv / kBoxDims; ++b)
          tma_load_3d_if(true, v_sa + buf * kVBytes + uint32_t(b) * kBoxBytes, &v_map, bar, b * kBoxDims,
                         tile * kKeys, h);
      }
    }
    return;  // no CTA-wide barrier follows: the math threads use named barriers of 256
  }

  {  // Q rows -> bf16 core-matrix layout (rows past q_len zero), one 16-byte unit per thread and pass.
    const float* q_base = a.q + (a.q0 + i0) * a.q_s0 + int64_t(h) * a.q_s1;
    const int r8 = tid % 8, c8 = tid / 8;
#pragma unroll 4
    for (int p = 0; p < kRows * kQUnits / kMathThreads; ++p) {
      const int blk = c8 + (kMathThreads / 8) * p, rb = blk / kQUnits, u = blk - rb * kQUnits;
      const int row = rb * 8 + r8;
      uint4 w = make_uint4(0u, 0u, 0u, 0u);
      if (row < qn) {
        const float* src = q_base + int64_t(row) * a.q_s0 + u * 8;
        uint32_t b[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) b[e] = f32_to_bf16_bits(src[e]);
        w = make_uint4(b[0] | (b[1] << 16), b[2] | (b[3] << 16), b[4] | (b[5] << 16), b[6] | (b[7] << 16));
      }
      *reinterpret_cast<uint4*>(smem_raw + (tid + kMathThreads * p) * 16) = w;
    }
  }
  fence_proxy_async();  // the Q stores -> wgmma reads
  named_barrier_sync<kMathThreads>(kBarQ);
  // Ping-pong turn: warpgroup 1 hands warpgroup 0 its first turn.
  named_barrier_arrive_if<kMathThreads>(wg == 1 && num_tiles > 0, 1);

  // This thread's rows (CTA-relative) and their key limits clamped to [-1, n - 1]: key jj visible iff
  // jj <= lim (the clamp folds in jj < n; -1 sees nothing).
  const int row_lo = wg * 64 + wq * 16 + g, row_hi = row_lo + 8;
  const int lim_lo = int(max(int64_t(-1), min(a.n - 1, base_lim + row_lo)));
  const int lim_hi = int(max(int64_t(-1), min(a.n - 1, base_lim + row_hi)));
  const int wg_rows = max(0, min(64, qn - wg * 64));
  const int64_t wg_keys = wg_rows > 0 ? min(a.n, base_lim + wg * 64 + wg_rows) : 0;
  const int wg_tiles = wg_keys > 0 ? int((wg_keys + kKeys - 1) / kKeys) : 0;
  // Keys [0, unmasked) are seen by every row of the warpgroup (its first row's count, in [0, n]).
  const int unmasked = int(max(int64_t(0), min(a.n, base_lim + wg * 64 + 1)));

  float o[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.0f;
  // Running max (log2 units) replicated over the row's quad; the sum as per-lane partials (the carried
  // sum enters in lane t4 == 0), summed over the quad at the end.
  float m_lo = kNegInf, m_hi = kNegInf, l_lo = 0.0f, l_hi = 0.0f;
  if (!a.first) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int row = hf ? row_hi : row_lo;
      if (row < qn) {
        const int64_t seq = a.q0 + i0 + row;
        const float mm = a.run_max[seq * a.heads + h] * kLog2e;
        const float ll = t4 == 0 ? a.run_sum[seq * a.heads + h] : 0.0f;
        if (hf) { m_hi = mm; l_hi = ll; } else { m_lo = mm; l_lo = ll; }
        const float* src = a.out + seq * a.o_s0 + int64_t(h) * a.o_s1 + 2 * t4;
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          o[4 * i + 2 * hf] = src[8 * i];
          o[4 * i + 2 * hf + 1] = src[8 * i + 1];
        }
      }
    }
  }

  const float c = a.scale * kLog2e;  // > 0 (dispatcher): the max of raw scores scales to the max of scaled ones
  const uint64_t dq = make_desc(q_sa + uint32_t(wg) * 8 * kQSbo, 128, kQSbo);

  for (int tile = 0; tile < num_tiles; ++tile) {
    const int buf = tile & 1;
    const uint32_t empty = empty_sa + 8 * uint32_t(buf);
    const bool release = lane == 0;  // one arrival per math warp on empty[buf]
    // Ping-pong: the warpgroups take turns issuing S (barrier 1 + w: "w's turn"), so the tensor pipes
    // run S0 then S1 (during softmax 0), then P V 0 (during softmax 1), then P V 1, instead of both
    // softmaxes idling the tensor cores together. Each warpgroup waits for its turn and hands the
    // other one its turn exactly once per tile, active or not; warpgroup 1 handed the first turn
    // before the loop and skips the hand-over after the last tile, so every barrier phase gets 128
    // waiting + 128 arriving threads (a warpgroup cannot arrive twice on one phase: its next arrival
    // follows its own next wait, which needs the other's arrival).
    const bool hand_over = wg == 0 || tile + 1 < num_tiles;
    mbar_wait(full_sa + 8 * uint32_t(buf), uint32_t(tile >> 1) & 1u);  // K / V (tile) landed
    const bool active = tile < wg_tiles;  // warpgroup-uniform: some row of the warpgroup sees these keys
    const uint32_t k_tile = k_sa + uint32_t(buf) * kKBytes;
    const uint64_t dv = desc_sw128(v_sa + uint32_t(buf) * kVBytes, kBoxBytes, kSwRowGroup);

    // S[64 x 128] = Q K^T over d_qk: 12 k-steps of 16 dims (Q: 2 core-matrix units = 256 B; K: 32 B
    // within box ks / 4).
    if (!active) {
      named_barrier_sync<kMathThreads>(1 + uint32_t(wg));
      named_barrier_arrive_if<kMathThreads>(hand_over, 2 - uint32_t(wg));
      mbar_arrive_if(release, empty);
      continue;
    }
    float s[64];  // zeroed for the compiler's sake only: the first k-step ignores D's input
#pragma unroll
    for (int i = 0; i < 64; ++i) {
      s[i] = 0.0f;
      pin(s[i]);
    }
    named_barrier_sync<kMathThreads>(1 + uint32_t(wg));
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kDqk / 16; ++ks)
      mma_m64n128k16_ss(s, desc_add(dq, ks * 256),
                        desc_sw128(k_tile + uint32_t(ks / 4) * kBoxBytes + uint32_t(ks % 4) * 32, 16, kSwRowGroup),
                        ks > 0);
    wgmma_commit();
    named_barrier_arrive_if<kMathThreads>(hand_over, 2 - uint32_t(wg));
    wgmma_wait_all();
#pragma unroll
    for (int i = 0; i < 64; ++i) pin(s[i]);

    // Diagonal / chunk-end tiles only: key 128 tile + 8 i + 2 t4 + e is visible iff <= lim.
    if ((tile + 1) * kKeys > unmasked) {
      const int rel_lo = lim_lo - tile * kKeys - 2 * t4, rel_hi = lim_hi - tile * kKeys - 2 * t4;
#pragma unroll
      for (int i = 0; i < 16; ++i)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          if (8 * i + e > rel_lo) s[4 * i + e] = kNegInf;
          if (8 * i + e > rel_hi) s[4 * i + 2 + e] = kNegInf;
        }
    }
    float mx_lo = kNegInf, mx_hi = kNegInf;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      mx_lo = fmaxf(mx_lo, fmaxf(s[4 * i], s[4 * i + 1]));
      mx_hi = fmaxf(mx_hi, fmaxf(s[4 * i + 2], s[4 * i + 3]));
    }
#pragma unroll
    for (int x = 1; x <= 2; x *= 2) {  // the row's 4 lanes are one quad
      mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, x));
      mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, x));
    }
    const float mn_lo = fmaxf(m_lo, mx_lo * c), mn_hi = fmaxf(m_hi, mx_hi * c);
    // A row that has seen no key yet (max -inf) uses 0 as reference: ex2(-inf) = 0 everywhere.
    const float mu_lo = mn_lo == kNegInf ? 0.0f : mn_lo, mu_hi = mn_hi == kNegInf ? 0.0f : mn_hi;
    const float al_lo = ex2(m_lo - mu_lo), al_hi = ex2(m_hi - mu_hi);  // 1 when the max did not move
    m_lo = mn_lo;
    m_hi = mn_hi;
    l_lo *= al_lo;
    l_hi *= al_hi;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      o[4 * i] *= al_lo;
      o[4 * i + 1] *= al_lo;
      o[4 * i + 2] *= al_hi;
      o[4 * i + 3] *= al_hi;
    }
    // P = 2^(s c - mu) rounded to bf16, packed straight into A fragments (layout proof at the top);
    // the sums add the same rounded weights the MMA sees.
    uint32_t pa[kKeys / 16][4];
#pragma unroll
    for (int ks = 0; ks < kKeys / 16; ++ks)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float mu = (j & 1) ? mu_hi : mu_lo;
        const uint32_t p = pack_bf16(ex2(fmaf(s[8 * ks + 2 * j], c, -mu)), ex2(fmaf(s[8 * ks + 2 * j + 1], c, -mu)));
        pa[ks][j] = p;
        if (j & 1) l_hi += bf16_lo(p) + bf16_hi(p);
        else l_lo += bf16_lo(p) + bf16_hi(p);
      }

    // O[64 x 128] += P[64 x 128] V[128 x 128]: 8 k-steps of 16 keys = 2 swizzle row groups (2048 B).
#pragma unroll
    for (int i = 0; i < 64; ++i) pin(o[i]);
#pragma unroll
    for (int ks = 0; ks < kKeys / 16; ++ks)
#pragma unroll
      for (int j = 0; j < 4; ++j) pin(pa[ks][j]);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kKeys / 16; ++ks) wgmma_rs_tb(o, pa[ks], desc_add(dv, ks * 2 * kSwRowGroup));
    wgmma_commit();
    wgmma_wait_all();  // K / V (tile) read: the producer may refill buffer buf
    mbar_arrive_if(release, empty);
#pragma unroll
    for (int i = 0; i < 64; ++i) pin(o[i]);
#pragma unroll
    for (int ks = 0; ks < kKeys / 16; ++ks)
#pragma unroll
      for (int j = 0; j < 4; ++j) pin(pa[ks][j]);  // the A registers stay untouched until the wait
  }

#pragma unroll
  for (int x = 1; x <= 2; x *= 2) {
    l_lo += __shfl_xor_sync(0xffffffffu, l_lo, x);
    l_hi += __shfl_xor_sync(0xffffffffu, l_hi, x);
  }
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int row = hf ? row_hi : row_lo;
    if (row < qn) {
      const int64_t seq = a.q0 + i0 + row;
      const float sum = hf ? l_hi : l_lo;
      // Every valid row saw key 0 by its last chunk, so sum > 0 there; 0 guards an invalid batch.
      const float f = a.last ? (sum > 0.0f ? 1.0f / sum : 0.0f) : 1.0f;
      float* dst = a.out + seq * a.o_s0 + int64_t(h) * a.o_s1 + 2 * t4;
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        dst[8 * i] = o[4 * i + 2 * hf] * f;
        dst[8 * i + 1] = o[4 * i + 2 * hf + 1] * f;
      }
      if (!a.last && t4 == 0) {
        a.run_max[seq * a.heads + h] = (hf ? m_hi : m_lo) * kLn2;
        a.run_sum[seq * a.heads + h] = sum;
      }
    }
  }
}

// Tensor map of one [heads][n][cols] bf16 tensor for boxes of kBoxDims columns x kKeys keys x 1 head,
// 128-byte swizzle, zeros outside. Host-only work (no allocation, no device call): cheap per chunk.
CUtensorMap make_kv_map(const uint16_t* base, int cols, int64_t n, int heads) {
  CUtensorMap map{};
  const cuuint64_t dims[3] = {cuuint64_t(cols), cuuint64_t(n), cuuint64_t(heads)};
  const cuuint64_t strides[2] = {cuuint64_t(cols) * 2, cuuint64_t(n) * cuuint64_t(cols) * 2};  // bytes, dims 1..2
  const cuuint32_t box[3] = {cuuint32_t(kBoxDims), cuuint32_t(kKeys), 1};
  const cuuint32_t unit[3] = {1, 1, 1};
  const CUresult r = tensor_map_encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<uint16_t*>(base), dims,
                                          strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                          CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  MLA_CHECK(r == CUDA_SUCCESS, "naive_sm90a_chunk: cuTensorMapEncodeTiled failed ({}) for [{}][{}][{}]", int(r), heads,
            n, cols);
  return map;
}

}  // namespace

bool naive_sm90a_supported(int dqk, int dv) {
  if (dqk != kDqk || dv != kDv) return false;
  return wgmma::sm90a_device_fits(kSmemAlloc) && tensor_map_encoder() != nullptr;
}

// Preconditions (naive_tc_chunk checks them): d_qk 192, d_v 128, scale > 0, k / v 16-byte aligned,
// q / out last dims contiguous, out not aliasing q, k, v or the running state.
void naive_sm90a_chunk(const NaiveTcArgs& a, Stream stream) {
  MLA_CHECK(a.dqk == kDqk && a.dv == kDv && a.scale > 0.0f, "naive_sm90a_chunk: d_qk {} d_v {} scale {}", a.dqk, a.dv,
            a.scale);
  MLA_CHECK(reinterpret_cast<uintptr_t>(a.k) % 16 == 0 && reinterpret_cast<uintptr_t>(a.v) % 16 == 0,
            "naive_sm90a_chunk: k / v not 16-byte aligned");
  if (a.q_len <= 0 || a.heads <= 0) return;
  const auto kernel = naive_sm90a_kernel;
  MLA_CHECK(a.n < (int64_t(1) << 31), "naive_sm90a_chunk: chunk of {} keys past the copy engine's coordinates", a.n);
  // No keys (n <= 0): the kernel issues no copy (num_tiles 0) but still finalises the rows, so it runs
  // with empty maps.
  const CUtensorMap k_map = a.n > 0 ? make_kv_map(a.k, kDqk, a.n, a.heads) : CUtensorMap{};
  const CUtensorMap v_map = a.n > 0 ? make_kv_map(a.v, kDv, a.n, a.heads) : CUtensorMap{};
  MLA_GPU_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmemAlloc)));
  const dim3 grid(unsigned((a.q_len + kRows - 1) / kRows), unsigned(a.heads));
  kernel<<<grid, kThreads, kSmemAlloc, stream>>>(a, k_map, v_map);
  MLA_GPU_LAUNCH_CHECK();
}

#else  // HIP: no wgmma.

bool naive_sm90a_supported(int, int) { return false; }
void naive_sm90a_chunk(const NaiveTcArgs&, Stream) {
  MLA_CHECK(false, "naive_sm90a_chunk: the wgmma kernel is NVIDIA Hopper-only (check naive_sm90a_supported)");
}

#endif

namespace {
NaivePrefillPath g_naive_path = NaivePrefillPath::Auto;
}  // namespace
void set_naive_prefill_path(NaivePrefillPath path) { g_naive_path = path; }
NaivePrefillPath naive_prefill_path() { return g_naive_path; }

}  // namespace mla::gpu
