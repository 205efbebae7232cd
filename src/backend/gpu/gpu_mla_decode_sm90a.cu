// Hopper wgmma absorbed-MLA decode (sm_90a only; built into its own target, see CMakeLists.txt): one
// CTA per (query token, 64-head tile, KV split), two warpgroups, Q and double-buffered 64-key cache
// tiles in 128B-swizzled shared memory read directly by wgmma. Trade-off: 64 heads per CTA (vs 16-32
// for the mma.sync kernel) cut shared-memory traffic per FLOP, but need 225 KB of shared memory, so
// one CTA per SM and only one tile loads while the other computes (an L2 prefetch runs further ahead).
// (A ping-pong variant, the two warpgroups owning alternate tiles with the whole S and softmax of
// their tile, passed parity on the H200 but measured 260.5 TFLOP/s against this kernel's 270.4 at
// batch 64 x ctx 4096 x 128 heads, 2026-11-30; not kept.)
#include "backend/gpu/gpu_mla_decode_sm90a.h"

#include <cstdint>

#include "backend/gpu/gpu_device.cuh"
#include "backend/gpu/gpu_mma.cuh"
#include "core/status.h"

namespace mla::gpu {

#if MLA_GPU_CUDA
namespace {

// ---- work split between the two warpgroups (wg = warp / 4) ---------------------------------------
// Per 64-key tile:  S[64 heads x 64 keys] = Q[64 x 576] K^T,  O[64 x 512] = alpha O + P[64 x 64] V[64 x 512].
//  - S: warpgroup wg computes keys [32 wg, 32 wg + 32) for all 64 heads: 36 x wgmma m64n32k16 (A = Q,
//    B = K rows, both K-major). Splitting keys (not the 576 dims) needs no S reduction, only the row
//    maxima: each warpgroup posts its 64 row maxima to shared memory and both derive the same
//    running max, hence the same alpha, so each keeps a partial row sum l over its own keys.
//  - P (bf16) goes to shared memory (each warpgroup writes its 32 key columns), then warpgroup wg
//    computes O columns [256 wg, 256 wg + 256) over all 64 keys: 4 x wgmma m64n256k16 (A = P K-major,
//    B = V N-major, the "transpose B" flag). O is 64 x 256 fp32 = 128 registers per thread, S 16.
// FLOPs per warpgroup and tile: S 2*64*32*576 = 2.36 M, PV 2*64*256*64 = 2.10 M: balanced.
// Napkin (batch 64 x 128 heads x ctx 4096): 73 GFLOP; 302 MB of cache read once from HBM (the two
// head tiles of a token run side by side: grid x is fastest, they share each tile through L2)
// = 71 us at 4.2 TB/s vs 92 us at the 790 TFLOP/s GEMM rate: tensor-bound if loads overlap.
// Barriers per tile: (A) tile landed, (B) row maxima posted, (C) P complete.
constexpr int kRank = 512, kRope = 64, kKvDim = kRank + kRope;
constexpr int kHeads = kMlaSm90aHeadTile;     // 64 = wgmma M
constexpr int kKeys = kMlaDecodeKeyTile;      // 64 cache positions per tile
constexpr int kThreads = 256;                 // 2 warpgroups of 4 warps (CUDA-only: 32 lanes)
constexpr int kKeysPerWg = kKeys / 2;         // 32: S columns per warpgroup
constexpr int kColsPerWg = kRank / 2;         // 256: O columns per warpgroup
constexpr int kChunks = kKvDim * 2 / 16;      // 72 16-byte chunks per 576-wide bf16 row
constexpr int kKSteps = kKvDim / 16;          // 36 k16 steps of S
constexpr int kPrefetchAhead = 2;             // L2 prefetch distance in tiles

// ---- shared-memory layout (the proof the descriptors below rely on) --------------------------------
// Every operand is stored as "column blocks" of 64 bf16 (128 B) x 64 rows, 8 KB each, in the 128-byte
// swizzle pattern: element (row, col) of a block lives at
//     block + row * 128 + (((col / 8) ^ (row % 8)) * 16) + (col % 8) * 2,
// i.e. the 16-byte chunk index is XORed with row % 8. With every block 1024-byte aligned, the
// swizzle XORs address bits [4,7) with bits [7,10), exactly the hardware's 128B swizzle, so any
// descriptor start address inside a block addresses the logical (row, col) it names.
//   Q   [64 heads][576]: 9 blocks (dims 64c..64c+63 in block c)               73,728 B
//   KV  2 x [64 keys][576], same shape (rows = cache positions of the tile)   147,456 B
//   P   [64 heads][64 keys]: 1 block                                          8,192 B
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
constexpr int kQOff = 0, kKvOff = kTileBytes, kPOff = kKvOff + 2 * kTileBytes, kRedOff = kPOff + kBlockBytes;
constexpr int kRedBytes = 4 * kHeads * 4;                  // row maxima [2][64] + row sums [2][64]
constexpr int kSmemBytes = kRedOff + kRedBytes + 1024;     // + 1024: the base is aligned by hand
static_assert(kSmemBytes <= 227 * 1024, "sm_90 opt-in shared memory per block");
static_assert(kKvDim % 64 == 0 && kKeys == 64 && kHeads == 64 && kRank % 64 == 0);

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kNegInf = -__builtin_huge_valf();

using namespace mma;  // smem_addr, cp_async16, pdl_trigger, prefetch_l2_bytes

// Byte offset of 16-byte chunk `chunk` (0..71) of row `row` in a [64][576] operand (see above).
__device__ __forceinline__ uint32_t sw128(int row, int chunk) {
  return uint32_t((chunk >> 3) * kBlockBytes + row * 128 + (((chunk & 7) ^ (row & 7)) << 4));
}

// wgmma shared-memory matrix descriptor (PTX ISA "Matrix Descriptor Format"): bits 0-13 start
// address >> 4, 16-29 leading-dimension byte offset >> 4, 32-45 stride-dimension byte offset >> 4,
// 49-51 base offset (0: every swizzle pattern starts 1024-aligned), 62-63 swizzle mode (1 = 128B).
__device__ __forceinline__ uint64_t make_desc(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
  return uint64_t((saddr & 0x3FFFFu) >> 4) | (uint64_t(lbo >> 4) << 16) | (uint64_t(sbo >> 4) << 32) |
         (uint64_t(1) << 62);
}

// ---- wgmma PTX wrappers (local to this file) ---------------------------------------------------------
// Accumulator fragment of m64nNk16 f32 (per warpgroup; w = warp % 4, g = lane / 4, t = lane % 4):
// d[4j + 0], d[4j + 1] = D[16w + g][8j + 2t + {0, 1}], d[4j + 2], d[4j + 3] = D[16w + g + 8][8j + 2t +
// {0, 1}] for j < N / 8 (the mma.sync m16n8 C layout, repeated along N).
// scale_d = 0: D = A B (the old D is ignored); 1: D += A B.
template <int TRANS_B>
__device__ __forceinline__ void wgmma_m64n32k16(float (&d)[16], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7,"
      "%8, %9, %10, %11, %12, %13, %14, %15}, "
      "%16, %17, p, 1, 1, 0, %19;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TRANS_B));
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

// After the wait: tie every accumulator register to this point, so that no read of it is scheduled
// between the asynchronous wgmma and its wait.
template <int R> __device__ __forceinline__ void fence_regs(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
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

// Q: 64 heads x 576 fp32 -> bf16 (round to nearest even, as the mma.sync kernel), swizzled, by all
// 256 threads (18 16-byte chunks each); fenced for wgmma, the caller's barrier publishes it.
__device__ __forceinline__ void stage_q(const MlaDecodeTcArgs& a, int token, int head0, int q_vec, unsigned char* smem,
                                        int tid) {
  const float* qt = a.q + int64_t(token) * a.q_row_stride + int64_t(head0) * a.q_head_stride;
  for (int i = tid; i < kHeads * kChunks; i += kThreads) {
    const int h = i / kChunks, c = i % kChunks;
    const float* src = qt + int64_t(h) * a.q_head_stride + c * 8;
    float v[8];
    if (q_vec) {
      const float4 x = *reinterpret_cast<const float4*>(src), y = *reinterpret_cast<const float4*>(src + 4);
      v[0] = x.x; v[1] = x.y; v[2] = x.z; v[3] = x.w; v[4] = y.x; v[5] = y.y; v[6] = y.z; v[7] = y.w;
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = src[e];
    }
    uint4 pk;
    pk.x = uint32_t(f32_to_bf16_bits(v[0])) | (uint32_t(f32_to_bf16_bits(v[1])) << 16);
    pk.y = uint32_t(f32_to_bf16_bits(v[2])) | (uint32_t(f32_to_bf16_bits(v[3])) << 16);
    pk.z = uint32_t(f32_to_bf16_bits(v[4])) | (uint32_t(f32_to_bf16_bits(v[5])) << 16);
    pk.w = uint32_t(f32_to_bf16_bits(v[6])) | (uint32_t(f32_to_bf16_bits(v[7])) << 16);
    *reinterpret_cast<uint4*>(smem + kQOff + sw128(h, c)) = pk;
  }
  fence_proxy_async();
}

// Epilogue of both kernels: row sums over the quad lanes and the two warpgroups (red_l [2][64] must
// not be in use), then O / l to `out` (direct) or the (O, m, l) partial to the workspace. Contains a
// __syncthreads: call from all 256 threads.
__device__ __forceinline__ void finish_rows(const MlaDecodeTcArgs& a, const float (&o)[kColsPerWg / 2],
                                            float (&l_part)[2], const float (&m_run)[2], float* red_l, bool direct,
                                            float* ws_o, float* ws_ml, size_t part_row, int token, int head0) {
  const int tid = int(threadIdx.x), wg = tid / 128, lane = tid % 32, t4 = lane % 4;
  const int r0 = ((tid / 32) % 4) * 16 + lane / 4, r1 = r0 + 8;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l_part[i] += __shfl_xor_sync(0xffffffffu, l_part[i], 1);
    l_part[i] += __shfl_xor_sync(0xffffffffu, l_part[i], 2);
  }
  if (t4 == 0) {
    red_l[wg * kHeads + r0] = l_part[0];
    red_l[wg * kHeads + r1] = l_part[1];
  }
  __syncthreads();
  const float l_tot[2] = {red_l[r0] + red_l[kHeads + r0], red_l[r1] + red_l[kHeads + r1]};
  const int col0 = wg * kColsPerWg + 2 * t4;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = i == 0 ? r0 : r1;
    if (direct) {
      const float inv = l_tot[i] > 0.0f ? 1.0f / l_tot[i] : 0.0f;
      float* orow = a.out + int64_t(token) * a.out_row_stride + int64_t(head0 + r) * a.out_head_stride;
#pragma unroll
      for (int j = 0; j < kColsPerWg / 8; ++j) {
        orow[col0 + 8 * j] = o[4 * j + 2 * i] * inv;
        orow[col0 + 8 * j + 1] = o[4 * j + 2 * i + 1] * inv;
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

// Grid: x = 64-head tile (fastest: a token's head tiles share cache tiles through L2), y = KV split
// (the grid's maximum; a token uses as many as its context fills, like the mma.sync kernel), z =
// query token. 256 threads, one CTA per SM (225 KB of shared memory).
__global__ void __launch_bounds__(kThreads, 1) mla_decode_sm90a_kernel(MlaDecodeTcArgs a, int num_splits, int q_vec) {
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = smem_addr(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;  // the swizzle atoms need 1024-byte alignment
  unsigned char* smem = smem_raw + (base - raw);
  const uint32_t q_s = base + kQOff, kv_s = base + kKvOff, p_s = base + kPOff;
  float* red_max = reinterpret_cast<float*>(smem + kRedOff);  // [2 wg][64 rows]
  float* red_l = red_max + 2 * kHeads;                        // [2 wg][64 rows]

  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32;
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
  const int tile_end = min(tile_begin + tiles_per_split, tiles_total);

  const size_t part_row = (size_t(split) * size_t(a.num_tokens) + size_t(token)) * size_t(a.num_heads) + size_t(head0);
  float* ws_o = static_cast<float*>(a.workspace);                                               // [splits, T, H, r]
  float* ws_ml = ws_o + size_t(num_splits) * size_t(a.num_tokens) * size_t(a.num_heads) * kRank;  // [splits, T, H, 2]
  if (tile_begin >= tile_end) {  // empty split: contributes nothing
    if (direct) {  // only for an invalid batch (kv_len < q_len): no keys, write zeros
      for (int i = tid; i < kHeads * kRank; i += kThreads)
        a.out[int64_t(token) * a.out_row_stride + int64_t(head0 + i / kRank) * a.out_head_stride + i % kRank] = 0.0f;
    } else if (tid < kHeads) {
      ws_ml[(part_row + size_t(tid)) * 2 + 0] = kNegInf;
      ws_ml[(part_row + size_t(tid)) * 2 + 1] = 0.0f;
    }
    return;
  }

  // Cache tile loader: warp w copies rows [8w, 8w + 8); lane i < 8 resolves row 8w + i through the
  // block table, then the warp copies each 1152-byte row as 16-byte chunks lane, lane + 32, lane + 64
  // (coalesced 512-byte runs) into the swizzled layout. Rows at or past `limit` are zero-filled (P is 0
  // there, but 0 * garbage could be NaN in P V). The same lanes ask L2 for their rows of tile +
  // kPrefetchAhead, so the next cp.async mostly hits L2.
  const int block_base = a.block_indptr[seq];
  const char* cache_bytes = reinterpret_cast<const char*>(a.cache);
  auto slot_of = [&](int pos) {
    return a.block_ids[block_base + pos / a.block_size] * a.block_size + pos % a.block_size;
  };
  auto load_tile = [&](int buf, int tile) {
    int my_slot = -1, pf_slot = -1;
    if (lane < 8) {
      const int pos = tile * kKeys + warp * 8 + lane;
      const int pf_pos = (tile + kPrefetchAhead) * kKeys + warp * 8 + lane;
      if (pos < limit) my_slot = slot_of(pos);
      if (tile + kPrefetchAhead < tile_end && pf_pos < limit) pf_slot = slot_of(pf_pos);
    }
    if (pf_slot >= 0) prefetch_l2_bytes(cache_bytes + int64_t(pf_slot) * (kKvDim * 2), kKvDim * 2);
    const uint32_t dst = kv_s + uint32_t(buf * kTileBytes);
#pragma unroll
    for (int rr = 0; rr < 8; ++rr) {
      const int slot = __shfl_sync(0xffffffffu, my_slot, rr);
      const int row = warp * 8 + rr;
      const char* src = cache_bytes + (slot >= 0 ? int64_t(slot) * (kKvDim * 2) : 0);
      const int bytes = slot >= 0 ? 16 : 0;
#pragma unroll
      for (int k = 0; k < 3; ++k) {
        const int c = lane + 32 * k;
        if (c < kChunks) cp_async16(dst + sw128(row, c), src + c * 16, bytes);
      }
    }
    cp_async_commit();
  };
  load_tile(0, tile_begin);

  // Q to shared memory; published to wgmma by stage_q's fence and barrier (A) below.
  stage_q(a, token, head0, q_vec, smem, tid);

  float o[kColsPerWg / 2];  // O[64 x 256 wg..] fragment (layout above)
#pragma unroll
  for (int i = 0; i < kColsPerWg / 2; ++i) o[i] = 0.0f;
  float m_run[2] = {kNegInf, kNegInf};  // running max of rows r0, r1 (log2 units), same in both warpgroups
  float l_part[2] = {0.0f, 0.0f};       // this thread's share of the row sums (its own key columns)
  const float scale_log2 = a.softmax_scale * kLog2e;

  for (int tile = tile_begin; tile < tile_end; ++tile) {
    const int buf = (tile - tile_begin) & 1;
    cp_async_wait_all();
    fence_proxy_async();  // this thread's cp.async bytes -> async proxy, published by (A)
    __syncthreads();      // (A) tile `buf` complete; every warpgroup is done with buf ^ 1, P and red_max
    if (tile + 1 < tile_end) load_tile(buf ^ 1, tile + 1);
    const uint32_t kt = kv_s + uint32_t(buf * kTileBytes);

    // S[64 x 32] over keys [32 wg, +32): K-major A = Q, K-major B = the tile's rows 32 wg.. (1024-
    // aligned: 32 rows = 4 KB). Step ks: column block ks / 4, byte (ks % 4) * 32 within the rows.
    float s[kKeysPerWg / 2];
#pragma unroll
    for (int i = 0; i < kKeysPerWg / 2; ++i) s[i] = 0.0f;
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      const uint32_t koff = uint32_t((ks / 4) * kBlockBytes + (ks % 4) * 32);
      const uint64_t da = make_desc(q_s + koff, 16, 1024);
      const uint64_t db = make_desc(kt + uint32_t(wg * kKeysPerWg * 128) + koff, 16, 1024);
      wgmma_m64n32k16<0>(s, da, db, 1);
    }
    wgmma_commit();
    wgmma_wait_all();
    fence_regs(s);

    // Online softmax, base 2. s[4j + e] is (row r0, key 32 wg + 8j + 2 t4 + e), s[4j + 2 + e] row r1.
    const int key0 = tile * kKeys + wg * kKeysPerWg + 2 * t4;
    float mx[2] = {kNegInf, kNegInf};
#pragma unroll
    for (int j = 0; j < kKeysPerWg / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const bool vis = key0 + 8 * j + e < limit;
        s[4 * j + e] = vis ? s[4 * j + e] * scale_log2 : kNegInf;
        s[4 * j + 2 + e] = vis ? s[4 * j + 2 + e] * scale_log2 : kNegInf;
        mx[0] = fmaxf(mx[0], s[4 * j + e]);
        mx[1] = fmaxf(mx[1], s[4 * j + 2 + e]);
      }
#pragma unroll
    for (int x = 1; x <= 2; x *= 2) {  // the 4 lanes of a quad hold one row's 32 keys
      mx[0] = fmaxf(mx[0], __shfl_xor_sync(0xffffffffu, mx[0], x));
      mx[1] = fmaxf(mx[1], __shfl_xor_sync(0xffffffffu, mx[1], x));
    }
    if (t4 == 0) {
      red_max[wg * kHeads + r0] = mx[0];
      red_max[wg * kHeads + r1] = mx[1];
    }
    __syncthreads();  // (B) both warpgroups' row maxima posted
    float alpha[2], m_use[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = i == 0 ? r0 : r1;
      const float m_new = fmaxf(m_run[i], fmaxf(red_max[r], red_max[kHeads + r]));
      m_use[i] = m_new == kNegInf ? 0.0f : m_new;  // a tile always has a visible key; guard anyway
      alpha[i] = exp2f(m_run[i] - m_use[i]);       // 0 on the first tile (m_run = -inf)
      m_run[i] = m_new;
    }
    // P to shared memory (K-major A of PV: row = head, col = key 32 wg + 8j + 2 t4): one 4-byte store
    // per (row, j); the 8 rows g of a warp hit 8 distinct chunks (XOR with g): conflict-free.
    float psum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < kKeysPerWg / 8; ++j) {
      const int chunk = wg * (kKeysPerWg / 8) + j;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int r = i == 0 ? r0 : r1;
        const uint16_t p0 = f32_to_bf16_bits(exp2f(s[4 * j + 2 * i] - m_use[i]));
        const uint16_t p1 = f32_to_bf16_bits(exp2f(s[4 * j + 2 * i + 1] - m_use[i]));
        // The denominator sums the bf16-rounded weights the P V product uses (as the mma.sync kernel).
        psum[i] += bf16_bits_to_f32(p0) + bf16_bits_to_f32(p1);
        *reinterpret_cast<uint32_t*>(smem + kPOff + r * 128 + ((chunk ^ (r & 7)) << 4) + t4 * 4) =
            uint32_t(p0) | (uint32_t(p1) << 16);
      }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) l_part[i] = l_part[i] * alpha[i] + psum[i];
    // Rescale O (128 FMULs a thread, ~256 issue cycles per SM and tile) only where a row max moved:
    // once the running max settles, alpha is exactly 1 for the whole warp (warp-uniform branch).
    if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
      for (int j = 0; j < kColsPerWg / 8; ++j) {
        o[4 * j + 0] *= alpha[0];
        o[4 * j + 1] *= alpha[0];
        o[4 * j + 2] *= alpha[1];
        o[4 * j + 3] *= alpha[1];
      }
    }
    fence_proxy_async();
    __syncthreads();  // (C) P complete (both halves of the keys)

    // O[64 x 256 wg..] += P[64 x 64] V: A = P (K-major, step ks at byte 32 ks), B = V N-major from
    // column block 4 wg on (LBO 8192 to the next 64 columns), keys 16 ks.. at byte 2048 ks.
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kKeys / 16; ++ks) {
      const uint64_t da = make_desc(p_s + uint32_t(ks * 32), 16, 1024);
      const uint64_t db = make_desc(kt + uint32_t(wg * 4 * kBlockBytes + ks * 16 * 128), kBlockBytes, 1024);
      wgmma_m64n256k16<1>(o, da, db, 1);
    }
    wgmma_commit();
    wgmma_wait_all();
    fence_regs(o);
  }

  finish_rows(a, o, l_part, m_run, red_l, direct, ws_o, ws_ml, part_row, token, head0);  // red_l unused above
}

}  // namespace

bool mla_decode_sm90a_supported(int num_heads, int kv_lora_rank, int rope_dim) {
  if (num_heads <= 0 || num_heads % kHeads != 0 || kv_lora_rank != kRank || rope_dim != kRope) return false;
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) return false;
  return major == 9 && minor == 0;
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
  kernel<<<grid, kThreads, smem_bytes, stream>>>(args, num_splits, q_vec);
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
