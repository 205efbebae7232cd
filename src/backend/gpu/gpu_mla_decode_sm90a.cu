// Hopper wgmma absorbed-MLA decode (sm_90a only; built into its own target, see CMakeLists.txt): one
// CTA per (query token, 64-head tile, KV split), warp-specialized. Warpgroup 0 computes S = Q K^T over
// a whole 64-key tile (wgmma N = 64) and its online softmax; warpgroups 0 and 1 each accumulate half
// of O's 512 columns from the P it posts, and warpgroup 1 copies cache tiles into two swizzled
// buffers (cp.async completing on mbarriers). Q (73.7 KB), two cache tiles (147 KB) and P fill the SM's 227
// KB of shared memory: one CTA per SM.
// History: session 5's kernel split S by keys across both warpgroups (wgmma N = 32: its Q + K operand
// reads exceed the shared-memory bandwidth), synchronised the CTA three times per tile and issued the
// loads from the math threads; it held 268-270 TFLOP/s at batch 64 x ctx 4096 x 128 heads. (A
// ping-pong variant, the warpgroups owning alternate tiles, measured 260.5 there; not kept.)
#include "backend/gpu/gpu_mla_decode_sm90a.h"

#include <cstdint>

#include "backend/gpu/gpu_device.cuh"
#include "backend/gpu/gpu_mma.cuh"
#include "backend/gpu/gpu_wgmma.cuh"
#include "core/status.h"

namespace mla::gpu {

#if MLA_GPU_CUDA
namespace {

// ---- roles and schedule -----------------------------------------------------------------------------
// Per 64-key tile j (in buffer j % 2):  S_j[64 heads x 64 keys] = Q[64 x 576] K_j^T,
//                                       O[64 x 512] = alpha_j O + P_j[64 x 64] V_j[64 x 512].
//  - Warpgroup 0, the "S warpgroup", owns S, the running row max m and row sums l, and O columns
//    [0, 256) ("O_L"); warpgroup 1 owns O columns [256, 512) ("O_R"). Both read P_j (bf16) and alpha_j
//    from shared memory once named barrier P (the j-th time) has passed.
//  - S warpgroup, iteration j: issue O_L += P_j V_j (4 x m64n256k16), then S_{j+1} (36 x m64n64k16:
//    part A of tile j+1 as soon as it landed, part B once it did); wait for PV_j alone and release
//    buffer j (empty); wait for S_{j+1}; softmax of S_{j+1} into registers; rescale O_L; once
//    warpgroup 1 has read P_j and alpha_j (p_free), store P_{j+1} and alpha_{j+1} and arrive on
//    barrier P (no wait). PV_j goes first because tile j+2 can only load once PV_j has read buffer j:
//    so it loads while S_{j+1}, the softmax and PV_{j+1} run.
//  - Warpgroup 1, iteration j: barrier P, rescale O_R by alpha_j, O_R += P_j V_j, wait, release P_j
//    (p_free); then, once the S warpgroup released buffer j (empty), copy tile j+2 into it in two
//    parts (cp.async, each part completing on its own mbarrier; see the loader). Rows at or past the
//    row's causal limit are zero-filled (P is 0 there, but 0 x garbage can be NaN in P V).
//    Warpgroup 1 idles during S and the softmax, so it is the copy issuer: a separate producer warp
//    would cap the CTA at 168 registers a thread (9 warps over 4 schedulers), too few for O_L + S.
// FLOPs per tile: S 2*64*64*576 = 4.72 M, PV 2*64*512*64 = 4.19 M = 2176 tensor cycles at the dense
// peak. Shared-memory bytes per tile: S reads Q + K = 147 KB (m64n64k16 reads 4 KB per 32 cycles, the
// 128 B/cycle limit; the N = 32 split read 221 KB), PV reads P twice + V = 80 KB, the copy writes 74
// KB: ~2350 cycles at 128 B/cycle, so the kernel is tensor- and shared-memory-bound together.
// Napkin (batch 64 x 128 heads x ctx 4096): 73 GFLOP; 302 MB of cache read once from HBM (the two
// head tiles of a token run side by side: grid x is fastest, they share each tile through L2)
// = 71 us at 4.2 TB/s vs 92 us at the 790 TFLOP/s GEMM rate.
constexpr int kRank = 512, kRope = 64, kKvDim = kRank + kRope;
constexpr int kHeads = kMlaSm90aHeadTile;     // 64 = wgmma M
constexpr int kKeys = kMlaDecodeKeyTile;      // 64 cache positions per tile = wgmma N of S
constexpr int kThreads = 256;                 // 2 warpgroups of 4 warps (CUDA-only: 32 lanes)
constexpr int kMathThreads = kThreads;        // every thread computes; warpgroup 1 also loads
constexpr int kColsPerWg = kRank / 2;         // 256: O columns per warpgroup
constexpr int kChunks = kKvDim * 2 / 16;      // 72 16-byte chunks per 576-wide bf16 row
constexpr int kKSteps = kKvDim / 16;          // 36 k16 steps of S
constexpr int kPrefetchAhead = 2;             // L2 prefetch distance in tiles (a buffer's next tile)
// Named barriers over all 256 threads (0 is __syncthreads, used once after the mbarrier init). P is a
// producer / consumer barrier: the S warpgroup arrives, warpgroup 1 syncs.
constexpr uint32_t kBarQ = 1, kBarP = 2, kBarL = 3;

// ---- shared-memory layout (the proof the descriptors below rely on) --------------------------------
// Every operand is stored as "column blocks" of 64 bf16 (128 B) x 64 rows, 8 KB each, in the 128-byte
// swizzle pattern: element (row, col) of a block lives at
//     block + row * 128 + (((col / 8) ^ (row % 8)) * 16) + (col % 8) * 2,
// i.e. the 16-byte chunk index is XORed with row % 8. With every block 1024-byte aligned, the
// swizzle XORs address bits [4,7) with bits [7,10), exactly the hardware's 128B swizzle, so any
// descriptor start address inside a block addresses the logical (row, col) it names.
//   Q     [64 heads][576]: 9 blocks (dims 64c..64c+63 in block c)             73,728 B
//   KV    2 x [64 keys][576], same shape (rows = cache positions of the tile) 147,456 B
//   P     [64 heads][64 keys]: 1 block                                        8,192 B
//   alpha [64] and l [64] floats, mbarriers full[2] and empty[2]              544 B
// K-major operands (Q, K rows for S; P for PV): rows = M or N, contiguous = K. A k16 step ks of a
// 576-wide operand starts at block ks / 4, byte (ks % 4) * 32 inside each 128-byte row; its 8-row
// core-matrix groups are 1024 B apart (SBO = 1024); LBO is unused for swizzled K-major layouts (the
// 16 K-elements of one instruction lie inside one 128-byte swizzle row), set to 1 (16 B).
// N-major operand (V for PV, imm-trans-b = 1): K = key = row, N = value column = contiguous. The
// swizzle atom is 8 keys x 64 columns (one 1 KB stretch of a block); atoms adjacent in N (the next
// 64 columns) are 8192 B apart (next block: LBO = 8192), atoms adjacent in K (the next 8 keys) 1024 B
// apart (SBO = 1024). k16 step ks starts at key 16 ks = byte 2048 ks of the block, 1024-aligned.
// (PTX ISA "Canonical Layouts", T = 8 bf16: K-major 128B = ((8,m),(T,2k)) : ((8T,SBO),(1,T)); MN-major
// 128B = ((T,8,m),(8,k)) : ((1,T,LBO),(8T,SBO)), so for MN-major LBO steps between 64-element N atoms
// and SBO between 8-row K groups.)
// If parity fails, check first: (1) PV only wrong -> LBO/SBO of the V descriptor (swap them) or the
// trans-b flag; (2) S wrong -> print S for one row vs a host dot product: a key permutation within 8
// means the swizzle XOR (row & 7) disagrees with the hardware (base not 1024-aligned?); (3) rows
// permuted -> the accumulator fragment mapping (r0/r1 and the 2 t4 column of d[4j + e]).
constexpr int kBlockBytes = 64 * 128;
constexpr int kTileBytes = (kKvDim / 64) * kBlockBytes;  // 73,728
constexpr int kQOff = 0, kKvOff = kTileBytes, kPOff = kKvOff + 2 * kTileBytes;
constexpr int kAlphaOff = kPOff + kBlockBytes;  // alpha_j per row (S warpgroup -> warpgroup 1)
constexpr int kLOff = kAlphaOff + kHeads * 4;   // final row sums (S warpgroup -> warpgroup 1)
// mbarriers: full_a[2] and full_b[2] (the two parts of a buffer landed: 128 copy arrivals each),
// empty[2] (the S warpgroup read a buffer: 4 warp arrivals), p_free (warpgroup 1 read P_j, alpha_j and
// its part of buffer j: 4 warp arrivals; one phase per tile).
constexpr int kBarOff = kLOff + kHeads * 4;
constexpr int kSmemBytes = kBarOff + 64 + 1024;  // + 1024: the base is aligned by hand
static_assert(kSmemBytes <= 227 * 1024, "sm_90 opt-in shared memory per block");
static_assert(kKvDim % 64 == 0 && kKeys == 64 && kHeads == 64 && kRank % 64 == 0);
static_assert(kChunks > 64 && kChunks <= 96, "a row is three 16-byte copies per lane, the third partial");

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kNegInf = -__builtin_huge_valf();

using namespace mma;  // smem_addr, cp_async16, mbarriers, named barriers, wgmma ordering (gpu_mma.cuh)

// Byte offset of 16-byte chunk `chunk` (0..71) of row `row` in a [64][576] operand (see above).
__device__ __forceinline__ uint32_t sw128(int row, int chunk) {
  return uint32_t((chunk >> 3) * kBlockBytes + row * 128 + (((chunk & 7) ^ (row & 7)) << 4));
}

// Swizzled wgmma descriptors and their start-address advance: gpu_wgmma.cuh.
using wgmma::desc_add;
using wgmma::desc_sw128;

// ---- wgmma PTX wrappers (local to this file) ---------------------------------------------------------
// Accumulator fragment of m64nNk16 f32 (per warpgroup; w = warp % 4, g = lane / 4, t = lane % 4):
// d[4j + 0], d[4j + 1] = D[16w + g][8j + 2t + {0, 1}], d[4j + 2], d[4j + 3] = D[16w + g + 8][8j + 2t +
// {0, 1}] for j < N / 8 (the mma.sync m16n8 C layout, repeated along N).
// scale_d = 0: D = A B (the old D is ignored); 1: D += A B.
// S (B = K rows, K-major): D[64 x 64] (+)= A[64 x 16] B[16 x 64], both from shared memory.
__device__ __forceinline__ void wgmma_m64n64k16(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7,"
      "%8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23,"
      "%24, %25, %26, %27, %28, %29, %30, %31"
      "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}
template <int TRANS_B>
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7,"
      "%8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23,"
      "%24, %25, %26, %27, %28, %29, %30, %31,"
      "%32, %33, %34, %35, %36, %37, %38, %39,"
      "%40, %41, %42, %43, %44, %45, %46, %47,"
      "%48, %49, %50, %51, %52, %53, %54, %55,"
      "%56, %57, %58, %59, %60, %61, %62, %63,"
      "%64, %65, %66, %67, %68, %69, %70, %71,"
      "%72, %73, %74, %75, %76, %77, %78, %79,"
      "%80, %81, %82, %83, %84, %85, %86, %87,"
      "%88, %89, %90, %91, %92, %93, %94, %95,"
      "%96, %97, %98, %99, %100, %101, %102, %103,"
      "%104, %105, %106, %107, %108, %109, %110, %111,"
      "%112, %113, %114, %115, %116, %117, %118, %119,"
      "%120, %121, %122, %123, %124, %125, %126, %127}, "
      "%128, %129, p, 1, 1, 0, %131;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TRANS_B));
}

using wgmma::fence_regs;  // after a wait: accumulators tied to that point
// Query row `token`'s sequence and causal limit (keys < limit are visible): the same derivation as
// gpu_mla_decode_tc.cu's token_range (count of q_indptr[s] <= token over s < num_seqs, minus one).
// Call with the whole warp converged.
__device__ __forceinline__ int2 token_seq_limit(const MlaDecodeTcArgs& a, int token) {
  const int lane = int(threadIdx.x) % 32;
  int count = 0;
  for (int s0 = 0; s0 < a.num_seqs; s0 += 32) {
    const bool le = s0 + lane < a.num_seqs && a.q_indptr[s0 + lane] <= token;
    count += __popc(__ballot_sync(0xffffffffu, le));
  }
  const int seq = max(count - 1, 0);
  const int q0 = a.q_indptr[seq], q_len = a.q_indptr[seq + 1] - q0, kv_len = a.kv_lens[seq];
  return make_int2(seq, kv_len - q_len + (token - q0) + 1);
}

// Q: 64 heads x 576 fp32 -> bf16 (round to nearest even, as the mma.sync kernel), swizzled, by the
// 256 threads (18 16-byte chunks each, loaded 6 at a time: one wave of CTAs waits for this, so its
// latency is the kernel's); fenced for wgmma, the caller's barrier publishes it.
__device__ __forceinline__ void stage_q(const MlaDecodeTcArgs& a, int token, int head0, int q_vec, unsigned char* smem,
                                        int tid) {
  constexpr int kItems = kHeads * kChunks / kMathThreads, kBatch = 6;  // 18 chunks a thread, 6 loads in flight
  static_assert(kHeads * kChunks % kMathThreads == 0 && kItems % kBatch == 0);
  const float* qt = a.q + int64_t(token) * a.q_row_stride + int64_t(head0) * a.q_head_stride;
#pragma unroll
  for (int b = 0; b < kItems; b += kBatch) {
    float v[kBatch][8];
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int i = tid + (b + k) * kMathThreads, h = i / kChunks, c = i % kChunks;
      const float* src = qt + int64_t(h) * a.q_head_stride + c * 8;
      if (q_vec) {
        const float4 x = *reinterpret_cast<const float4*>(src), y = *reinterpret_cast<const float4*>(src + 4);
        v[k][0] = x.x; v[k][1] = x.y; v[k][2] = x.z; v[k][3] = x.w;
        v[k][4] = y.x; v[k][5] = y.y; v[k][6] = y.z; v[k][7] = y.w;
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) v[k][e] = src[e];
      }
    }
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int i = tid + (b + k) * kMathThreads, h = i / kChunks, c = i % kChunks;
      const uint4 pk = make_uint4(pack_bf16(v[k][0], v[k][1]), pack_bf16(v[k][2], v[k][3]), pack_bf16(v[k][4], v[k][5]),
                                  pack_bf16(v[k][6], v[k][7]));
      *reinterpret_cast<uint4*>(smem + kQOff + sw128(h, c)) = pk;
    }
  }
  fence_proxy_async();
}

// Softmax of the S warpgroup's tile (base 2). s[4j + e] is (row r0, key key0 + 8j + e), s[4j + 2 + e]
// row r1 (key0 = tile * 64 + 2 t4); the 4 lanes of a quad hold a row's 64 keys. m_ref is each row's
// reference max (log2 units of the scaled score): P = 2^(score - m_ref). It moves only when a tile's
// max exceeds it by more than kRebaseSlack, so P <= 2^8 (bf16 and the fp32 sums hold that; rounding
// is relative, so precision is unchanged) and O is rescaled about once per row instead of whenever
// the running max creeps up (128 FMULs a thread each time). The partials carry m_ref with l, which
// is all the combine needs. Updates m_ref and l_part (this lane's 16 keys of each tile; the quad's
// lanes are summed once at the end), returns alpha per row (1 unless re-based) and P packed as bf16
// pairs: p[2j + i] = row (r0, r1)[i], keys key0 + 8j + {0, 1}. Per score one FFMA, one ex2 (the SFU:
// 16 per cycle and SM, 256 cycles a tile, this step's floor) and half a cvt; the mask runs only on a
// tile that crosses the limit (a warp-uniform branch).
constexpr float kRebaseSlack = 8.0f;
__device__ __forceinline__ void softmax_tile(float (&s)[32], int key0, int limit, float scale_log2, float (&m_ref)[2],
                                             float (&l_part)[2], float (&alpha)[2], uint32_t (&p)[16], int t4) {
  if (__any_sync(0xffffffffu, key0 - 2 * t4 + kKeys > limit)) {
#pragma unroll
    for (int j = 0; j < kKeys / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const bool vis = key0 + 8 * j + e < limit;  // a select, not a multiply: garbage S is discarded
        s[4 * j + e] = vis ? s[4 * j + e] : kNegInf;
        s[4 * j + 2 + e] = vis ? s[4 * j + 2 + e] : kNegInf;
      }
  }
  float mx[2] = {kNegInf, kNegInf};
#pragma unroll
  for (int j = 0; j < kKeys / 8; ++j) {
    mx[0] = fmaxf(mx[0], fmaxf(s[4 * j], s[4 * j + 1]));
    mx[1] = fmaxf(mx[1], fmaxf(s[4 * j + 2], s[4 * j + 3]));
  }
#pragma unroll
  for (int x = 1; x <= 2; x *= 2) {
    mx[0] = fmaxf(mx[0], __shfl_xor_sync(0xffffffffu, mx[0], x));
    mx[1] = fmaxf(mx[1], __shfl_xor_sync(0xffffffffu, mx[1], x));
  }
  float m_use[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float m_tile = mx[i] * scale_log2;                // scale > 0: the max commutes with it
    const bool rebase = m_tile > m_ref[i] + kRebaseSlack;  // always on a row's first tile (m_ref = -inf)
    alpha[i] = rebase ? ex2(m_ref[i] - m_tile) : 1.0f;     // 0 on the first tile
    m_ref[i] = rebase ? m_tile : m_ref[i];
    m_use[i] = m_ref[i] == kNegInf ? 0.0f : m_ref[i];      // a tile always has a visible key; guard anyway
  }
  float psum[2] = {0.0f, 0.0f};
#pragma unroll
  for (int j = 0; j < kKeys / 8; ++j) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      p[2 * j + i] = pack_bf16(ex2(fmaf(s[4 * j + 2 * i], scale_log2, -m_use[i])),
                               ex2(fmaf(s[4 * j + 2 * i + 1], scale_log2, -m_use[i])));
      // The denominator sums the bf16-rounded weights the P V product uses (as the mma.sync kernel).
      psum[i] += bf16_lo(p[2 * j + i]) + bf16_hi(p[2 * j + i]);
    }
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) l_part[i] = l_part[i] * alpha[i] + psum[i];
}

// P (K-major A of PV) and alpha to shared memory: one 4-byte store per (row, j); the 8 rows g of a
// warp hit 8 distinct chunks (XOR with g). The caller has made sure nobody reads either.
__device__ __forceinline__ void store_p(const uint32_t (&p)[16], const float (&alpha)[2], unsigned char* smem, int r0,
                                        int r1, int t4) {
#pragma unroll
  for (int j = 0; j < kKeys / 8; ++j) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = i == 0 ? r0 : r1;
      *reinterpret_cast<uint32_t*>(smem + kPOff + r * 128 + ((j ^ (r & 7)) << 4) + t4 * 4) = p[2 * j + i];
    }
  }
  if (t4 == 0) {
    float* alpha_sm = reinterpret_cast<float*>(smem + kAlphaOff);
    alpha_sm[r0] = alpha[0];
    alpha_sm[r1] = alpha[1];
  }
}

// O *= alpha per row (128 FMULs a thread) only where a row re-based (softmax_tile): otherwise alpha is
// exactly 1 for the whole warp (a warp-uniform branch).
__device__ __forceinline__ void rescale(float (&o)[kColsPerWg / 2], const float (&alpha)[2]) {
  if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
    for (int j = 0; j < kColsPerWg / 8; ++j) {
      o[4 * j + 0] *= alpha[0];
      o[4 * j + 1] *= alpha[0];
      o[4 * j + 2] *= alpha[1];
      o[4 * j + 3] *= alpha[1];
    }
  }
}

// S[64 x 64] = Q K^T over the tile at shared address kt: K-major A = Q, K-major B = the tile's rows.
// Step ks: column block ks / 4, byte (ks % 4) * 32 within the rows. Part A of the tile (column blocks
// 0-3 and the rope block 8) first; then, once part B (blocks 4-7) landed on full_b, the rest. One
// commit group. The two base descriptors are rebuilt from opaque addresses per call: otherwise the
// compiler keeps all 36 Q descriptors (72 registers) live across the tile loop and spills.
__device__ __forceinline__ void issue_s(float (&s)[32], uint32_t q_s, uint32_t kt, uint32_t full_b, uint32_t parity) {
  asm volatile("" : "+r"(q_s), "+r"(kt));
  const uint64_t dq = desc_sw128(q_s, 16, 1024), dk = desc_sw128(kt, 16, 1024);
  auto step = [&](int ks) {
    const uint32_t koff = uint32_t((ks / 4) * kBlockBytes + (ks % 4) * 32);
    wgmma_m64n64k16(s, desc_add(dq, koff), desc_add(dk, koff), ks > 0);
  };
#pragma unroll
  for (int ks = 0; ks < 16; ++ks) step(ks);
#pragma unroll
  for (int ks = 32; ks < kKSteps; ++ks) step(ks);
  mbar_wait(full_b, parity);
  fence_proxy_async();
#pragma unroll
  for (int ks = 16; ks < 32; ++ks) step(ks);
  wgmma_commit();
}

// O[64 x 256 wg..] += P[64 x 64] V: A = P (K-major, step ks at byte 32 ks), B = V N-major from column
// block 4 wg on (LBO 8192 to the next 64 columns), keys 16 ks.. at byte 2048 ks. One commit group.
__device__ __forceinline__ void issue_pv(float (&o)[kColsPerWg / 2], uint32_t p_s, uint32_t kt, int wg) {
  asm volatile("" : "+r"(p_s), "+r"(kt));
  const uint64_t dp = desc_sw128(p_s, 16, 1024);
  const uint64_t dv = desc_sw128(kt + uint32_t(wg * 4 * kBlockBytes), kBlockBytes, 1024);
#pragma unroll
  for (int ks = 0; ks < kKeys / 16; ++ks) wgmma_m64n256k16<1>(o, desc_add(dp, ks * 32), desc_add(dv, ks * 16 * 128), 1);
  wgmma_commit();
}

// Grid: x = 64-head tile (fastest: a token's head tiles share cache tiles through L2), y = KV split
// (the grid's maximum; a token uses as many as its context fills, like the mma.sync kernel), z =
// query token. 256 threads, one CTA per SM.
__global__ void __launch_bounds__(kThreads, 1) mla_decode_sm90a_kernel(MlaDecodeTcArgs a, int num_splits, int q_vec,
                                                                       int out_vec) {
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = smem_addr(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;  // the swizzle atoms need 1024-byte alignment
  unsigned char* smem = smem_raw + (base - raw);
  const uint32_t q_s = base + kQOff, kv_s = base + kKvOff, p_s = base + kPOff;
  const float* alpha_sm = reinterpret_cast<const float*>(smem + kAlphaOff);
  float* l_sm = reinterpret_cast<float*>(smem + kLOff);

  const int tid = int(threadIdx.x), lane = tid % 32;
  // Warp-uniform as far as the compiler can see (a shuffle of lane 0's value): the role branches
  // below then do not make ptxas serialize the wgmma inside them (C7518).
  const int warp = __shfl_sync(0xffffffffu, tid / 32, 0);
  const int wg = warp / 4, g = lane / 4, t4 = lane % 4;
  const int r0 = (warp % 4) * 16 + g, r1 = r0 + 8;  // this thread's two accumulator rows (heads)
  const int head0 = int(blockIdx.x) * kHeads, split = int(blockIdx.y), token = int(blockIdx.z);

  // With a combine behind this grid, let it launch now (it waits in griddepcontrol.wait for this
  // grid's completion; see gpu_mla_decode_tc.cu).
  if (num_splits > 1) pdl_trigger();

  const int2 sl = token_seq_limit(a, token);
  const int seq = sl.x, limit = sl.y;
  const int tiles_total = max(0, (limit + kKeys - 1) / kKeys);
  const int used = max(1, min(num_splits, (tiles_total + kMlaDecodeMinTilesPerSplit - 1) / kMlaDecodeMinTilesPerSplit));
  if (split >= used) return;  // uniform per CTA, before any barrier
  const bool direct = used == 1;
  const int tiles_per_split = (tiles_total + used - 1) / used;
  const int tile_begin = split * tiles_per_split;
  const int num_tiles = min(tiles_per_split, tiles_total - tile_begin);

  const size_t part_row = (size_t(split) * size_t(a.num_tokens) + size_t(token)) * size_t(a.num_heads) + size_t(head0);
  float* ws_o = static_cast<float*>(a.workspace);                                               // [splits, T, H, r]
  float* ws_ml = ws_o + size_t(num_splits) * size_t(a.num_tokens) * size_t(a.num_heads) * kRank;  // [splits, T, H, 2]
  if (num_tiles <= 0) {  // empty split: contributes nothing
    if (direct) {  // only for an invalid batch (kv_len < q_len): no keys, write zeros
      for (int i = tid; i < kHeads * kRank; i += kThreads)
        a.out[int64_t(token) * a.out_row_stride + int64_t(head0 + i / kRank) * a.out_head_stride + i % kRank] = 0.0f;
    } else if (tid < kHeads) {
      ws_ml[(part_row + size_t(tid)) * 2 + 0] = kNegInf;
      ws_ml[(part_row + size_t(tid)) * 2 + 1] = 0.0f;
    }
    return;
  }

  if (tid == 0) {
    const uint32_t bars = base + kBarOff;
    for (int b = 0; b < 2; ++b) {
      mbar_init(bars + 8 * b, kMathThreads / 2);       // full_a: one cp.async arrival per warpgroup-1 thread
      mbar_init(bars + 16 + 8 * b, kMathThreads / 2);  // full_b
      mbar_init(bars + 32 + 8 * b, 4);                 // empty: one arrival per S-warpgroup warp
    }
    mbar_init(bars + 48, 4);  // p_free: one arrival per warpgroup-1 warp
    mbar_init_fence();
  }
  __syncthreads();  // the only CTA-wide barrier: the mbarriers are initialised

  // Cache tile loader (warpgroup 1), in two parts per tile: A = column blocks 0-3 (O_L's V) and 8 (the
  // rope dims), B = blocks 4-7 (O_R's V), each completing on its own mbarrier, so that the S warpgroup
  // starts S on part A while part B lands, and part A of buffer j refills as soon as the S warpgroup
  // released it (its P V half done) while warpgroup 1 may still read part B. Warp w copies rows
  // [16 w, 16 w + 16): per column block, lane l copies chunk l % 8 of rows 16 w + l / 8 + 4 i (i < 4),
  // four fully used 128-byte runs per instruction. resolve_rows: lane l resolves row 16 w + l % 16
  // through the block table (-1 at or past the limit: zero-filled; branch-free, so that it can run
  // while a wgmma is in flight) and asks L2 for its half of that row of the tile this buffer holds
  // next. Each thread's arrival on full_a / full_b fires once its copies of the part landed.
  const uint32_t full_a_s = base + kBarOff, full_b_s = full_a_s + 16, empty_s = full_a_s + 32, p_free_s = full_a_s + 48;
  const int block_base = a.block_indptr[seq];
  const char* cache_bytes = reinterpret_cast<const char*>(a.cache);
  auto slot_of = [&](int pos) {
    const bool ok = pos < limit;
    const int p = ok ? pos : 0;  // block_ids[block_base] exists: limit > 0 here
    const int id = a.block_ids[block_base + p / a.block_size];
    return ok ? id * a.block_size + p % a.block_size : -1;
  };
  const int row_lane = (warp % 4) * 16 + lane % 16;
  auto resolve_rows = [&](int j) {
    const int pf = slot_of((tile_begin + j + kPrefetchAhead) * kKeys + row_lane);
    // Per 128-byte line (a row is 9 lines; lanes i and i + 16 split row i's): the bulk prefetch takes
    // a uniform address, so per-lane rows made ptxas loop over the lanes one at a time.
    const char* pf_row = cache_bytes + int64_t(pf) * (kKvDim * 2);
    if (pf >= 0)
      for (int line = lane / 16; line < kKvDim * 2 / 128; line += 2) prefetch_l2(pf_row + line * 128);
    return slot_of((tile_begin + j) * kKeys + row_lane);
  };
  struct RowSlots {
    int v[4];
  };
  auto copy_rows_of = [&](int my_slot) {  // the slots of this lane's 4 copy rows
    RowSlots r;
#pragma unroll
    for (int i = 0; i < 4; ++i) r.v[i] = __shfl_sync(0xffffffffu, my_slot, lane / 8 + 4 * i);
    return r;
  };
  auto copy_block = [&](uint32_t dst, const RowSlots& rs, int c) {
    const int chunk = c * 8 + lane % 8;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = (warp % 4) * 16 + lane / 8 + 4 * i;
      const char* src = cache_bytes + (rs.v[i] >= 0 ? int64_t(rs.v[i]) * (kKvDim * 2) : 0);
      cp_async16(dst + sw128(row, chunk), src + chunk * 16, rs.v[i] >= 0 ? 16 : 0);
    }
  };
  auto copy_part_a = [&](int j, const RowSlots& rs) {
    const uint32_t dst = kv_s + uint32_t((j & 1) * kTileBytes);
#pragma unroll
    for (int c = 0; c < 4; ++c) copy_block(dst, rs, c);
    copy_block(dst, rs, 8);
    cp_async_mbar_arrive(full_a_s + 8 * uint32_t(j & 1));
  };
  auto copy_part_b = [&](int j, const RowSlots& rs) {
    const uint32_t dst = kv_s + uint32_t((j & 1) * kTileBytes);
#pragma unroll
    for (int c = 4; c < 8; ++c) copy_block(dst, rs, c);
    cp_async_mbar_arrive(full_b_s + 8 * uint32_t(j & 1));
  };
  if (wg == 1) {
    for (int j = 0; j < 2 && j < num_tiles; ++j) {
      const RowSlots rs = copy_rows_of(resolve_rows(j));
      copy_part_a(j, rs);
      copy_part_b(j, rs);
    }
  }

  // Math warpgroups. Q to shared memory, published to wgmma by stage_q's fence and barrier Q.
  stage_q(a, token, head0, q_vec, smem, tid);
  named_barrier_sync<kMathThreads>(kBarQ);

  float o[kColsPerWg / 2];  // O[64 x 256 wg..] fragment (layout above)
#pragma unroll
  for (int i = 0; i < kColsPerWg / 2; ++i) o[i] = 0.0f;
  auto buf_addr = [&](int j) { return kv_s + uint32_t((j & 1) * kTileBytes); };
  // A part of tile j has landed once phase (j / 2) of its full_* barrier for buffer j % 2 completed;
  // the proxy fence then orders its cp.async bytes (generic proxy) before this thread's wgmma reads
  // them (async proxy).
  auto parity_of = [](int j) { return uint32_t(j >> 1) & 1u; };
  auto wait_part = [&](uint32_t full, int j) {
    mbar_wait(full + 8 * uint32_t(j & 1), parity_of(j));
    fence_proxy_async();
  };
  auto s_of = [&](float (&s)[32], int j) {  // S_j: part A, then part B once it landed
    wait_part(full_a_s, j);
    issue_s(s, q_s, buf_addr(j), full_b_s + 8 * uint32_t(j & 1), parity_of(j));
  };

  float m_run[2] = {kNegInf, kNegInf};  // S warpgroup: reference max of rows r0, r1 (see softmax_tile)
  float l_part[2] = {0.0f, 0.0f};       // S warpgroup: this lane's share of the row sums
  if (wg == 0) {
    const float scale_log2 = a.softmax_scale * kLog2e;
    const int key_lane = tile_begin * kKeys + 2 * t4;
    float s[32];
    float alpha[2];
    uint32_t p[16];
    wgmma_fence();
    s_of(s, 0);
    wgmma_wait<0>();
    fence_regs(s);
    softmax_tile(s, key_lane, limit, scale_log2, m_run, l_part, alpha, p, t4);
    store_p(p, alpha, smem, r0, r1, t4);  // alpha_0 = 0 scales warpgroup 1's zero O_R: harmless
    fence_proxy_async();
    named_barrier_arrive_if<kMathThreads>(true, kBarP);  // post P_0 (release); warpgroup 1 syncs on it
    for (int j = 0; j + 1 < num_tiles; ++j) {
      wgmma_fence();
      issue_pv(o, p_s, buf_addr(j), 0);
      wgmma_fence();  // s was rewritten by the softmax since the fence above (ptxas would inject one)
      s_of(s, j + 1);
      wgmma_wait<1>();  // O_L += P_j V_j done (groups complete in order); S_{j+1} may still run
      fence_regs(o);
      // This warp is done with buffer j: warpgroup 1 refills it with tile j + 2 while S_{j+1} runs.
      mbar_arrive_if(lane == 0, empty_s + 8 * uint32_t(j & 1));
      wgmma_wait<0>();
      fence_regs(s);
      softmax_tile(s, key_lane + (j + 1) * kKeys, limit, scale_log2, m_run, l_part, alpha, p, t4);
      rescale(o, alpha);
      mbar_wait(p_free_s, uint32_t(j & 1));  // warpgroup 1 is done with P_j and alpha_j
      store_p(p, alpha, smem, r0, r1, t4);
      fence_proxy_async();
      // Post P_{j+1} without waiting for warpgroup 1 (it may still be issuing tile j+2's copies): it
      // passed barrier P_j already, since it released buffer j above, so arrivals never run ahead.
      named_barrier_arrive_if<kMathThreads>(true, kBarP);
    }
    wgmma_fence();
    issue_pv(o, p_s, buf_addr(num_tiles - 1), 0);
    wgmma_wait<0>();
    fence_regs(o);
    // Row sums: the quad's lanes, then to warpgroup 1.
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      l_part[i] += __shfl_xor_sync(0xffffffffu, l_part[i], 1);
      l_part[i] += __shfl_xor_sync(0xffffffffu, l_part[i], 2);
    }
    if (t4 == 0) {
      l_sm[r0] = l_part[0];
      l_sm[r1] = l_part[1];
    }
  } else {
    for (int j = 0; j < num_tiles; ++j) {
      named_barrier_sync<kMathThreads>(kBarP);  // P_j and alpha_j posted
      wait_part(full_a_s, j);                     // both complete already: orders the bytes for this
      wait_part(full_b_s, j);                     // warpgroup's wgmma
      const float alpha[2] = {alpha_sm[r0], alpha_sm[r1]};
      rescale(o, alpha);
      wgmma_fence();
      issue_pv(o, p_s, buf_addr(j), 1);
      const int next_slot = resolve_rows(j + 2);  // block-table reads overlap the P V product
      wgmma_wait<0>();
      fence_regs(o);
      mbar_arrive_if(lane == 0, p_free_s);
      if (j + 2 < num_tiles) {  // buffer j's next tile: part A once the S warpgroup released it
        const RowSlots rs = copy_rows_of(next_slot);
        mbar_wait(empty_s + 8 * uint32_t(j & 1), parity_of(j));
        copy_part_a(j + 2, rs);
        copy_part_b(j + 2, rs);
      }
    }
    cp_async_wait_all();  // nothing of this thread's left in flight at exit
  }
  named_barrier_sync<kMathThreads>(kBarL);  // row sums posted

  // O / l to `out` (direct) or the (O, m, l) partial to the workspace.
  const float l_tot[2] = {l_sm[r0], l_sm[r1]};
  const int col0 = wg * kColsPerWg + 2 * t4;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = i == 0 ? r0 : r1;
    if (direct) {
      const float inv = l_tot[i] > 0.0f ? 1.0f / l_tot[i] : 0.0f;
      float* orow = a.out + int64_t(token) * a.out_row_stride + int64_t(head0 + r) * a.out_head_stride;
      if (out_vec) {  // the pair of columns a lane holds as one 8-byte store
#pragma unroll
        for (int j = 0; j < kColsPerWg / 8; ++j)
          *reinterpret_cast<float2*>(orow + col0 + 8 * j) = make_float2(o[4 * j + 2 * i] * inv, o[4 * j + 2 * i + 1] * inv);
      } else {
#pragma unroll
        for (int j = 0; j < kColsPerWg / 8; ++j) {
          orow[col0 + 8 * j] = o[4 * j + 2 * i] * inv;
          orow[col0 + 8 * j + 1] = o[4 * j + 2 * i + 1] * inv;
        }
      }
    } else {
      float* po = ws_o + (part_row + size_t(r)) * kRank;
#pragma unroll
      for (int j = 0; j < kColsPerWg / 8; ++j)
        *reinterpret_cast<float2*>(po + col0 + 8 * j) = make_float2(o[4 * j + 2 * i], o[4 * j + 2 * i + 1]);
      if (wg == 0 && t4 == 0) {
        ws_ml[(part_row + size_t(r)) * 2 + 0] = m_run[i];
        ws_ml[(part_row + size_t(r)) * 2 + 1] = l_tot[i];
      }
    }
  }
}

}  // namespace

bool mla_decode_sm90a_supported(int num_heads, int kv_lora_rank, int rope_dim) {
  if (num_heads <= 0 || num_heads % kHeads != 0 || kv_lora_rank != kRank || rope_dim != kRope) return false;
  return wgmma::sm90a_device_fits(kSmemBytes);
}

void mla_decode_sm90a_attention(const MlaDecodeTcArgs& args, int num_splits, int q_vec, Stream stream) {
  MLA_CHECK(args.num_heads > 0 && args.num_heads % kHeads == 0 && num_splits >= 1,
            "mla_decode_sm90a: {} heads (want a multiple of {}), {} splits", args.num_heads, kHeads, num_splits);
  // Errors through MLA_CHECK (core library), not MLA_GPU_CHECK: gpu::fail lives in mla_gpu, which
  // links this separate sm_90a library, not the other way round.
  const auto kernel = mla_decode_sm90a_kernel;
  const int smem_bytes = kSmemBytes;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  MLA_CHECK(err == cudaSuccess, "mla_decode_sm90a: cudaFuncSetAttribute: {}", cudaGetErrorString(err));
  const dim3 grid(unsigned(args.num_heads / kHeads), unsigned(num_splits), unsigned(args.num_tokens));
  // 8-byte output stores where out's rows and heads keep float2 alignment.
  const int out_vec = reinterpret_cast<uintptr_t>(args.out) % 8 == 0 && args.out_row_stride % 2 == 0 &&
                      args.out_head_stride % 2 == 0;
  kernel<<<grid, kThreads, smem_bytes, stream>>>(args, num_splits, q_vec, out_vec);
  err = cudaGetLastError();
  MLA_CHECK(err == cudaSuccess, "mla_decode_sm90a: launch: {}", cudaGetErrorString(err));
}

#else  // HIP: no wgmma.

bool mla_decode_sm90a_supported(int, int, int) { return false; }
void mla_decode_sm90a_attention(const MlaDecodeTcArgs&, int, int, Stream) {
  MLA_CHECK(false, "mla_decode_sm90a: wgmma MLA decode is Hopper-only (check mla_decode_sm90a_supported)");
}

#endif

}  // namespace mla::gpu
