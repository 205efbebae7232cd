// Tensor-core absorbed-MLA decode over a BF16 paged latent cache: one CTA per (query token, 16-head
// tile, KV split) streams 64-position tiles of cache rows through shared memory (cp.async, double
// buffered) and runs S = Q K^T and O += P V on mma.sync m16n8k16 bf16 with fp32 accumulation and an
// fp32 online softmax. Trade-off: q and P are rounded to bf16 for the tensor cores (the cache already
// is bf16), buying ~10x the fp32 FMA rate at ~2^-9 relative error per term.
#include "backend/gpu/gpu_mla_decode_tc.h"
#include "backend/gpu/gpu_mla_decode_sm90a.h"

#include <algorithm>
#include <cstdint>

#include "backend/gpu/gpu_device.cuh"
#include "backend/gpu/gpu_mma.cuh"
#include "core/status.h"

namespace mla::gpu {

#if MLA_GPU_CUDA
namespace {

// ---- geometry (DeepSeek-V3 / Kimi: r = 512, d_r = 64) ---------------------------------------------
constexpr int kRank = 512;                        // latent width = value width
constexpr int kRope = 64;                         // rotated key part
constexpr int kKvDim = kRank + kRope;             // 576: key width = cache row
constexpr int kHeadTile = kMlaTcHeadTile;         // 16 query heads = one mma M tile
constexpr int kKeys = kMlaDecodeKeyTile;          // 64 cache positions per tile
constexpr int kWarps = 8, kThreads = kWarps * 32;  // CUDA-only file: warps are 32 lanes
constexpr int kRowElems = kKvDim + 8;             // padded smem row: 1168 B = 73 x 16 B (odd) so the
                                                  // 8 row addresses of an ldmatrix hit distinct banks
constexpr int kKSteps = kKvDim / 16;              // 36 k16 steps of S = Q K^T
// S = Q K^T: warp w computes keys [32 (w / 4), +32) over dims [144 (w % 4), +144); the 4 dim
// quarters are summed through shared memory. Q's fragments for those dims stay in registers.
constexpr int kDimSplit = 4, kKeySplit = kWarps / kDimSplit;  // 4 dim quarters x 2 key halves
constexpr int kKStepsPerWarp = kKSteps / kDimSplit;           // 9 k16 steps per warp
constexpr int kKeysPerWarp = kKeys / kKeySplit;               // 32
constexpr int kColsPerWarp = kRank / kWarps;      // 64: warp w owns O columns [64w, 64w + 64)
constexpr int kNTilesPerWarp = kColsPerWarp / 8;  // 8 n8 accumulator tiles per warp
constexpr int kSStride = kKeys + 8;               // fp32 partial-S row (72 floats): conflict-free float2
constexpr int kPStride = kKeys + 8;               // bf16 P row (144 B = 9 x 16 B, odd)
constexpr int kMaxSplits = kMlaDecodeMaxSplits;  // 32
// A token's context is cut into at most num_splits ranges of at least this many tiles (computed on
// the device from kv_lens, so a graph's grid stays fixed while the splits in use follow the context):
// a short context (batch 1, ctx 1100 = 18 tiles) uses 9 splits instead of all 28 of the grid, and
// the unused CTAs exit at once. 2 tiles keep each CTA's double buffer busy once.
constexpr int kMinTilesPerSplit = kMlaDecodeMinTilesPerSplit;  // 2
constexpr int kTileBytes = kKeys * kRowElems * 2;  // 74,752
constexpr int kKvBytes = 2 * kTileBytes;           // 149,504: double-buffered cache tiles
static_assert(kKSteps % kDimSplit == 0 && kRank % (kWarps * 16) == 0 && kKeys == 64 && kHeadTile == 16 &&
              kKeys == kWarps * 8 && kKeysPerWarp % 16 == 0 && kKvBytes % 16 == 0);

// A CTA runs M head tiles (16 M heads) over each cache tile: M = 2 halves the shared-memory and L2
// reads per FLOP (what bounds many heads), M = 1 keeps twice the CTAs (what a 16-head,
// memory-bound launch needs). Shared memory map (bytes); the Q staging area aliases the partial-S
// area: Q lives in registers after the prologue, and a __syncthreads separates the two uses.
template <int M> struct TcGeom {
  static constexpr int kHeads = kHeadTile * M;
  static constexpr int kLanesPerRow = kThreads / kHeads;  // softmax: a row's lanes (16 or 8)
  static constexpr int kKeysPerLane = kKeys / kLanesPerRow;  // 4 or 8, as float4 groups
  static constexpr int kRedBytes = std::max(kDimSplit * kHeads * kSStride * 4, kHeads * kRowElems * 2);
  static constexpr int kPBytes = kHeads * kPStride * 2;
  static constexpr int kSmemBytes = kKvBytes + kRedBytes + kPBytes + 3 * kHeads * 4;  // 170,688 / 192,384
  static_assert(kRedBytes % 16 == 0 && kPBytes % 16 == 0 && kKeysPerLane % 4 == 0 && kLanesPerRow <= 32);
};

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kNegInf = -__builtin_huge_valf();

// PTX wrappers (cp.async, ldmatrix, mma.sync) and their fragment layouts: gpu_mma.cuh.
using namespace mma;

// Query row `token`'s sequence (the largest s with q_indptr[s] <= token; empty sequences are
// skipped) and its causal limit: query i of the sequence sits at position kv_len - q_len + i and
// sees positions < limit. q_indptr is non-decreasing with q_indptr[0] = 0 <= token, so that s is
// (the number of s in [0, S) with q_indptr[s] <= token) - 1: each warp counts 32 entries per ballot,
// with independent loads (one or two memory round trips for a decode batch of 64, where a binary
// search is a chain of 6). Call with the whole warp converged.
struct TokenRange {
  int seq, limit;
};
__device__ __forceinline__ TokenRange token_range(const MlaDecodeTcArgs& a, int token) {
  const int lane = int(threadIdx.x) % 32;
  int count = 0;
#pragma unroll 4
  for (int s0 = 0; s0 < a.num_seqs; s0 += 32) {
    const bool le = s0 + lane < a.num_seqs && a.q_indptr[s0 + lane] <= token;
    count += __popc(__ballot_sync(0xffffffffu, le));
  }
  const int seq = max(count - 1, 0);
  const int q0 = a.q_indptr[seq], q_len = a.q_indptr[seq + 1] - q0, kv_len = a.kv_lens[seq];
  return {seq, kv_len - q_len + (token - q0) + 1};
}
// Splits a token of `tiles_total` tiles uses out of the grid's num_splits (>= 1). The attention and
// combine kernels both derive it from the same device data, so they agree on which partials exist.
// 1 means split 0 writes `out` directly and the combine skips the token.
__device__ __forceinline__ int splits_in_use(int tiles_total, int num_splits) {
  return max(1, min(num_splits, (tiles_total + kMinTilesPerSplit - 1) / kMinTilesPerSplit));
}


// ---- the attention kernel -------------------------------------------------------------------------
// Napkin math per CTA and 64-key tile: cache bytes 64 * 576 * 2 = 73.7 KB; FLOPs 2 * 16M * 64 *
// (576 + 512) = 2.23M MFLOP (16 heads: 30 FLOP/B, memory-bound; 128 heads = 8/M CTAs per token
// share the tile through L2: tensor-core-bound). Per token and 16-head tile: bytes = ctx * 576 * 2,
// FLOPs = 2 * 16 * ctx * (576 + 512). Shared-memory reads per tile: K 73 KB + V 64 KB (shared by the
// M head tiles) + partial S 16M KB + P 2M KB; Q is held in registers, not re-read per tile.
//
// Grid: x = head group (fastest, so the head groups of one token run together and share the cache
// tile through L2), y = KV split (the most any row may use; a row uses splits_in_use of them), z =
// query token. Block: 8 warps (2 per SM sub-partition, so one warp's ldmatrix/mma latency hides
// behind the other's).
template <int M>
__global__ void __launch_bounds__(kThreads, 1) mla_decode_tc_kernel(MlaDecodeTcArgs a, int num_splits, int q_vec) {
  using G = TcGeom<M>;
  constexpr int kHeads = G::kHeads;
  extern __shared__ __align__(128) unsigned char smem[];
  uint16_t* kv_s = reinterpret_cast<uint16_t*>(smem);                       // [2][kKeys][kRowElems]
  float* s_part = reinterpret_cast<float*>(smem + kKvBytes);                 // [kDimSplit][kHeads][kSStride]
  uint16_t* q_s = reinterpret_cast<uint16_t*>(smem + kKvBytes);              // [kHeads][kRowElems] (alias)
  uint16_t* p_s = reinterpret_cast<uint16_t*>(smem + kKvBytes + G::kRedBytes);  // [kHeads][kPStride]
  float* alpha_s = reinterpret_cast<float*>(smem + kKvBytes + G::kRedBytes + G::kPBytes);  // [kHeads]
  float* m_s = alpha_s + kHeads;                                             // [kHeads] running max (log2)
  float* l_s = m_s + kHeads;                                                 // [kHeads] running sum

  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t4 = lane % 4;
  const int head0 = int(blockIdx.x) * kHeads, split = int(blockIdx.y), token = int(blockIdx.z);

  // With a combine behind this grid (num_splits > 1), let it launch now (PDL): its CTAs wait in
  // griddepcontrol.wait until this grid has completed, so only its launch latency is hidden. This
  // grid was launched normally: its predecessors are complete, as the PDL convention requires.
  if (num_splits > 1) pdl_trigger();

  const TokenRange tr = token_range(a, token);
  const int seq = tr.seq, limit = tr.limit;
  const int tiles_total = max(0, (limit + kKeys - 1) / kKeys);
  const int used = splits_in_use(tiles_total, num_splits);
  if (split >= used) return;  // uniform per CTA, before any barrier; the combine reads splits < used
  const bool direct = used == 1;  // this CTA (split 0) owns the whole context: write out, no partials
  const int tiles_per_split = (tiles_total + used - 1) / used;
  const int tile_begin = split * tiles_per_split;
  const int tile_end = min(tile_begin + tiles_per_split, tiles_total);

  const size_t part_row = (size_t(split) * size_t(a.num_tokens) + size_t(token)) * size_t(a.num_heads) + size_t(head0);
  float* ws_o = static_cast<float*>(a.workspace);                                        // [splits, T, H, r]
  float* ws_ml = ws_o + size_t(num_splits) * size_t(a.num_tokens) * size_t(a.num_heads) * kRank;  // [splits, T, H, 2]
  if (tile_begin >= tile_end) {  // empty split (e.g. 9 tiles over 4 splits of 3): contributes nothing
    if (direct) {  // only for an invalid batch (kv_len < q_len): no keys, write zeros
      for (int i = tid; i < kHeads * kRank; i += kThreads)
        a.out[int64_t(token) * a.out_row_stride + int64_t(head0 + i / kRank) * a.out_head_stride + i % kRank] = 0.0f;
    } else if (tid < kHeads) {
      ws_ml[(part_row + size_t(tid)) * 2 + 0] = kNegInf;
      ws_ml[(part_row + size_t(tid)) * 2 + 1] = 0.0f;
    }
    return;
  }

  const int block_base = a.block_indptr[seq];
  // Issues the cp.async copies of tile `tile` into buffer `buf`: warp w copies rows [8w, 8w + 8);
  // lane i < 8 resolves row 8w + i through the block table (slot < 2^31: a cache of 2^31 rows would
  // be 2.4 TB), then each 1152-byte row is copied by the warp as 16-byte chunks lane, lane + 32 and
  // lane + 64 (coalesced). Rows at or past `limit` are zero-filled: P is 0 there, but 0 * garbage
  // could be NaN in the P V product.
  // (An L2 prefetch of the next 1-2 tiles was tried on the H200, 2026-11-30: 16 heads fell from 65%
  // of copy bandwidth without it to 47% (1 tile ahead) and 55-60% (2 ahead); not used.)
  const char* cache_bytes = reinterpret_cast<const char*>(a.cache) + lane * 16;
  const uint32_t kv_base = smem_addr(kv_s) + uint32_t((warp * 8 * kRowElems) * 2 + lane * 16);
  auto load_tile = [&](int buf, int tile) {
    int my_slot = -1;
    if (lane < 8) {
      const int pos = tile * kKeys + warp * 8 + lane;
      if (pos < limit) my_slot = a.block_ids[block_base + pos / a.block_size] * a.block_size + pos % a.block_size;
    }
    const uint32_t dst = kv_base + uint32_t(buf * kTileBytes);
#pragma unroll
    for (int rr = 0; rr < 8; ++rr) {
      const int slot = shfl(my_slot, rr);
      const char* src = cache_bytes + (slot >= 0 ? int64_t(slot) * (kKvDim * 2) : 0);
      const int bytes = slot >= 0 ? 16 : 0;
      const uint32_t d = dst + uint32_t(rr * kRowElems * 2);
      cp_async16(d, src, bytes);
      cp_async16(d + 512, src + 512, bytes);
      if (lane < 8) cp_async16(d + 1024, src + 1024, bytes);
    }
    cp_async_commit();
  };

  load_tile(0, tile_begin);  // overlaps with the Q staging below

  // Stage Q (kHeads x 576, fp32 -> bf16) and take this warp's A fragments into registers. The
  // vector path issues all of a thread's float4 loads (9 or 18) before converting any: one memory
  // round trip instead of a chain of dependent scalar ones (a batch-1 call is mostly latency).
  const float* q_tok = a.q + int64_t(token) * a.q_row_stride + int64_t(head0) * a.q_head_stride;
  if (q_vec) {  // host-checked: q 16-byte aligned, strides multiples of 4 floats
    constexpr int kVecPerRow = kKvDim / 4, kVecPerThread = kHeads * kVecPerRow / kThreads;
    static_assert(kHeads * kVecPerRow % kThreads == 0);
    float4 v[kVecPerThread];
#pragma unroll
    for (int i = 0; i < kVecPerThread; ++i) {
      const int idx = tid + i * kThreads, h = idx / kVecPerRow, c = (idx % kVecPerRow) * 4;
      v[i] = *reinterpret_cast<const float4*>(q_tok + int64_t(h) * a.q_head_stride + c);
    }
#pragma unroll
    for (int i = 0; i < kVecPerThread; ++i) {
      const int idx = tid + i * kThreads, h = idx / kVecPerRow, c = (idx % kVecPerRow) * 4;
      const uint32_t lo = uint32_t(f32_to_bf16_bits(v[i].x)) | (uint32_t(f32_to_bf16_bits(v[i].y)) << 16);
      const uint32_t hi = uint32_t(f32_to_bf16_bits(v[i].z)) | (uint32_t(f32_to_bf16_bits(v[i].w)) << 16);
      *reinterpret_cast<uint2*>(q_s + h * kRowElems + c) = make_uint2(lo, hi);  // 8-byte aligned: 1168 h + 2c
    }
  } else {
    for (int idx = tid; idx < kHeads * kKvDim; idx += kThreads) {
      const int h = idx / kKvDim, d = idx % kKvDim;
      q_s[h * kRowElems + d] = f32_to_bf16_bits(q_tok[int64_t(h) * a.q_head_stride + d]);
    }
  }
  __syncthreads();
  const int kq = warp % kDimSplit, kh = warp / kDimSplit;  // this warp's dim quarter and key half
  uint32_t qf[M][kKStepsPerWarp][4];
  {
    const int mi = lane / 8, row = (mi % 2) * 8 + lane % 8, col_off = (mi / 2) * 8;
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int ks = 0; ks < kKStepsPerWarp; ++ks)
        ldmatrix_x4(qf[m][ks], q_s + (m * 16 + row) * kRowElems + (kq * kKStepsPerWarp + ks) * 16 + col_off);
  }

  float o[M][kNTilesPerWarp][4];
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int nt = 0; nt < kNTilesPerWarp; ++nt) o[m][nt][0] = o[m][nt][1] = o[m][nt][2] = o[m][nt][3] = 0.0f;
  // Softmax state of row srow, replicated in the row's kLanesPerRow lanes (aligned lane groups).
  const int srow = tid / G::kLanesPerRow, cl = lane % G::kLanesPerRow;
  float m_run = kNegInf, l_run = 0.0f;
  const float scale_log2 = a.softmax_scale * kLog2e;  // softmax in base 2: exp(x) = exp2(x log2 e)

  for (int tile = tile_begin; tile < tile_end; ++tile) {
    const int buf = (tile - tile_begin) & 1;
    cp_async_wait_all();
    __syncthreads();  // (A) tile visible; every warp is done with the previous tile and with q_s
    if (tile + 1 < tile_end) load_tile(buf ^ 1, tile + 1);  // buffer buf^1 was last read before (A)
    const uint16_t* kt = kv_s + size_t(buf) * kKeys * kRowElems;
    const int j0 = tile * kKeys;

    // S partial over this warp's 144 dims and 32 keys: M x [16 heads x 32 keys], 4 n8 tiles each.
    {
      float sacc[M][kKeysPerWarp / 8][4];
#pragma unroll
      for (int m = 0; m < M; ++m)
#pragma unroll
        for (int nt = 0; nt < kKeysPerWarp / 8; ++nt) sacc[m][nt][0] = sacc[m][nt][1] = sacc[m][nt][2] = sacc[m][nt][3] = 0.0f;
      const int mi = lane / 8, key_in = kh * kKeysPerWarp + (mi / 2) * 8 + lane % 8, dim_off = (mi % 2) * 8;
#pragma unroll
      for (int ks = 0; ks < kKStepsPerWarp; ++ks) {
        const int k0 = (kq * kKStepsPerWarp + ks) * 16;
#pragma unroll
        for (int np = 0; np < kKeysPerWarp / 16; ++np) {
          // Matrices: (keys 16np..+7, dims k0..+7), (same keys, k0+8..), (keys 16np+8.., k0..), (.., k0+8..)
          // = b0, b1 of n-tile 2np and b0, b1 of n-tile 2np + 1.
          uint32_t b[4];
          ldmatrix_x4(b, kt + (np * 16 + key_in) * kRowElems + k0 + dim_off);
#pragma unroll
          for (int m = 0; m < M; ++m) {
            mma_bf16(sacc[m][2 * np], qf[m][ks], b[0], b[1]);
            mma_bf16(sacc[m][2 * np + 1], qf[m][ks], b[2], b[3]);
          }
        }
      }
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float* sp = s_part + (kq * kHeads + m * 16) * kSStride + kh * kKeysPerWarp;
#pragma unroll
        for (int nt = 0; nt < kKeysPerWarp / 8; ++nt) {
          *reinterpret_cast<float2*>(sp + g * kSStride + nt * 8 + 2 * t4) = make_float2(sacc[m][nt][0], sacc[m][nt][1]);
          *reinterpret_cast<float2*>(sp + (g + 8) * kSStride + nt * 8 + 2 * t4) =
              make_float2(sacc[m][nt][2], sacc[m][nt][3]);
        }
      }
    }
    __syncthreads();  // (B) partial S complete

    // Online softmax: lane cl of row srow holds keys 4 kLanesPerRow j + 4 cl + [0, 4) for each float4
    // group j (a quarter-warp reads 32 consecutive floats: conflict-free). The four dim-quarter
    // partials are summed in a fixed order (deterministic).
    {
      constexpr int kGroups = G::kKeysPerLane / 4, kGroupStride = 4 * G::kLanesPerRow;
      float s[G::kKeysPerLane];
#pragma unroll
      for (int j = 0; j < kGroups; ++j) {
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int w = 0; w < kDimSplit; ++w) {
          const float4 v =
              *reinterpret_cast<const float4*>(s_part + (w * kHeads + srow) * kSStride + j * kGroupStride + 4 * cl);
          acc.x += v.x; acc.y += v.y; acc.z += v.z; acc.w += v.w;
        }
        s[4 * j + 0] = acc.x; s[4 * j + 1] = acc.y; s[4 * j + 2] = acc.z; s[4 * j + 3] = acc.w;
      }
      float mt = kNegInf;
#pragma unroll
      for (int i = 0; i < G::kKeysPerLane; ++i) {
        s[i] = j0 + (i / 4) * kGroupStride + 4 * cl + i % 4 < limit ? s[i] * scale_log2 : kNegInf;
        mt = fmaxf(mt, s[i]);
      }
      // A row's lanes are an aligned group of kLanesPerRow: xor below kLanesPerRow stays inside it.
#pragma unroll
      for (int x = G::kLanesPerRow / 2; x > 0; x /= 2) mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, x));
      const float m_new = fmaxf(m_run, mt);
      const float m_use = m_new == kNegInf ? 0.0f : m_new;  // a tile always has a visible key; guard anyway
      const float alpha = exp2f(m_run - m_use);               // 0 on the first tile (m_run = -inf)
      float psum = 0.0f;
      uint32_t pk[G::kKeysPerLane / 2];
#pragma unroll
      for (int i = 0; i < G::kKeysPerLane; i += 2) {
        const uint16_t p0 = f32_to_bf16_bits(exp2f(s[i] - m_use)), p1 = f32_to_bf16_bits(exp2f(s[i + 1] - m_use));
        // The denominator sums the bf16-rounded weights the P V product uses: a consistent average.
        psum += bf16_bits_to_f32(p0) + bf16_bits_to_f32(p1);
        pk[i / 2] = uint32_t(p0) | (uint32_t(p1) << 16);
      }
#pragma unroll
      for (int x = G::kLanesPerRow / 2; x > 0; x /= 2) psum += __shfl_xor_sync(0xffffffffu, psum, x);
      l_run = l_run * alpha + psum;
      m_run = m_new;
#pragma unroll
      for (int j = 0; j < kGroups; ++j)
        *reinterpret_cast<uint2*>(p_s + srow * kPStride + j * kGroupStride + 4 * cl) = make_uint2(pk[2 * j], pk[2 * j + 1]);
      if (cl == 0) {
        alpha_s[srow] = alpha;
        m_s[srow] = m_run;
        l_s[srow] = l_run;
      }
    }
    __syncthreads();  // (C) P and alpha complete

    // O[16M x 64w..] = alpha * O + P[16M x 64] V[64 x 64w..]; V = first 512 dims of the tile rows.
    {
#pragma unroll
      for (int m = 0; m < M; ++m) {
        const float a_lo = alpha_s[m * 16 + g], a_hi = alpha_s[m * 16 + g + 8];
#pragma unroll
        for (int nt = 0; nt < kNTilesPerWarp; ++nt) {
          o[m][nt][0] *= a_lo; o[m][nt][1] *= a_lo; o[m][nt][2] *= a_hi; o[m][nt][3] *= a_hi;
        }
      }
      const int mi = lane / 8;
#pragma unroll
      for (int ks = 0; ks < kKeys / 16; ++ks) {
        uint32_t pa[M][4];
#pragma unroll
        for (int m = 0; m < M; ++m)
          ldmatrix_x4(pa[m], p_s + (m * 16 + (mi % 2) * 8 + lane % 8) * kPStride + ks * 16 + (mi / 2) * 8);
        const uint16_t* vrow = kt + (ks * 16 + (mi % 2) * 8 + lane % 8) * kRowElems + warp * kColsPerWarp + (mi / 2) * 8;
#pragma unroll
        for (int np = 0; np < kNTilesPerWarp / 2; ++np) {
          // .trans of (keys k0..+7, cols n0..+7), (keys k0+8.., n0..), (k0.., n0+8..), (k0+8.., n0+8..)
          // = b0, b1 of n-tile n0 and b0, b1 of n-tile n0 + 8.
          uint32_t b[4];
          ldmatrix_x4_trans(b, vrow + np * 16);
#pragma unroll
          for (int m = 0; m < M; ++m) {
            mma_bf16(o[m][2 * np], pa[m], b[0], b[1]);
            mma_bf16(o[m][2 * np + 1], pa[m], b[2], b[3]);
          }
        }
      }
    }
  }
  // m_s / l_s were written before the last (C) and are not written again: safe to read here.
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const int r_lo = m * 16 + g, r_hi = r_lo + 8;
    if (direct) {
      const float inv_lo = 1.0f / l_s[r_lo], inv_hi = 1.0f / l_s[r_hi];
      float* out_lo = a.out + int64_t(token) * a.out_row_stride + int64_t(head0 + r_lo) * a.out_head_stride;
      float* out_hi = a.out + int64_t(token) * a.out_row_stride + int64_t(head0 + r_hi) * a.out_head_stride;
#pragma unroll
      for (int nt = 0; nt < kNTilesPerWarp; ++nt) {
        const int col = warp * kColsPerWarp + nt * 8 + 2 * t4;
        out_lo[col] = o[m][nt][0] * inv_lo;
        out_lo[col + 1] = o[m][nt][1] * inv_lo;
        out_hi[col] = o[m][nt][2] * inv_hi;
        out_hi[col + 1] = o[m][nt][3] * inv_hi;
      }
    } else {
      float* po_lo = ws_o + (part_row + size_t(r_lo)) * kRank;
      float* po_hi = ws_o + (part_row + size_t(r_hi)) * kRank;
#pragma unroll
      for (int nt = 0; nt < kNTilesPerWarp; ++nt) {
        const int col = warp * kColsPerWarp + nt * 8 + 2 * t4;
        *reinterpret_cast<float2*>(po_lo + col) = make_float2(o[m][nt][0], o[m][nt][1]);
        *reinterpret_cast<float2*>(po_hi + col) = make_float2(o[m][nt][2], o[m][nt][3]);
      }
    }
  }
  if (!direct && tid < kHeads) {
    ws_ml[(part_row + size_t(tid)) * 2 + 0] = m_s[tid];
    ws_ml[(part_row + size_t(tid)) * 2 + 1] = l_s[tid];
  }
}

// Merges the split partials of one (token, head) row in split order (deterministic):
// out = sum_i 2^(m_i - M) O_i / sum_i 2^(m_i - M) l_i over the `used` splits of the token (the same
// count the attention kernel derived; used = 1: that kernel wrote out, nothing to do). Block: 128
// threads x 4 columns = 512. Launched with PDL: it starts while the attention grid runs and waits in
// pdl_wait for it; q_indptr / kv_lens are read before the wait (complete before the attention grid,
// a normal launch, started). All (m, l) loads, then all O loads, are issued unrolled before use:
// one or two memory round trips instead of 2 x splits dependent ones (the old loop took 13.7 us at
// batch 1 x 128 heads x 28 splits). Napkin: reads used * (512 + 2) * 4 B per row.
__global__ void __launch_bounds__(kRank / 4) mla_decode_tc_combine_kernel(MlaDecodeTcArgs a, int num_splits) {
  const int head = int(blockIdx.x), token = int(blockIdx.y), col = int(threadIdx.x) * 4;
  const TokenRange tr = token_range(a, token);
  const int used = splits_in_use(max(0, (tr.limit + kKeys - 1) / kKeys), num_splits);
  pdl_wait();  // every CTA waits, also those that return: this grid's end implies its predecessor's
  pdl_trigger();  // the next grid (expand_v's matvec) may start issuing its weight loads
  if (used == 1) return;
  const size_t rows = size_t(a.num_tokens) * size_t(a.num_heads);
  const size_t row = size_t(token) * size_t(a.num_heads) + size_t(head);
  const float* ws_o = static_cast<const float*>(a.workspace);
  const float* ws_ml = ws_o + size_t(num_splits) * rows * kRank;
  // ld.cg (L2): the partials were written by a grid that overlapped this one's start.
  float m[kMaxSplits], l[kMaxSplits];
#pragma unroll
  for (int i = 0; i < kMaxSplits; ++i) {
    m[i] = kNegInf;
    l[i] = 0.0f;
    if (i < used) {
      const float2 ml = __ldcg(reinterpret_cast<const float2*>(ws_ml + (size_t(i) * rows + row) * 2));
      m[i] = ml.x;
      l[i] = ml.y;
    }
  }
  float big_m = kNegInf;
#pragma unroll
  for (int i = 0; i < kMaxSplits; ++i)
    if (l[i] > 0.0f) big_m = fmaxf(big_m, m[i]);
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float den = 0.0f;
#pragma unroll
  for (int i = 0; i < kMaxSplits; ++i) {
    if (!(l[i] > 0.0f)) continue;  // unused or empty split: its O was never written
    const float w = exp2f(m[i] - big_m);
    const float4 v = __ldcg(reinterpret_cast<const float4*>(ws_o + (size_t(i) * rows + row) * kRank + col));
    acc.x += w * v.x; acc.y += w * v.y; acc.z += w * v.z; acc.w += w * v.w;
    den += w * l[i];
  }
  // A valid batch gives every query >= 1 key, so some split has l > 0; zeros otherwise (kv_len < q_len).
  const float inv = den > 0.0f ? 1.0f / den : 0.0f;
  float* out = a.out + int64_t(token) * a.out_row_stride + int64_t(head) * a.out_head_stride + col;
  out[0] = acc.x * inv; out[1] = acc.y * inv; out[2] = acc.z * inv; out[3] = acc.w * inv;
}

int sm_count() {
  int dev = 0, sms = 0;
  MLA_GPU_CHECK(cudaGetDevice(&dev));
  MLA_GPU_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return std::max(sms, 1);
}

// Head tiles per CTA of the mma.sync kernel: 2 whenever the heads allow it (see TcGeom).
int heads_per_cta(int num_heads) { return num_heads % TcGeom<2>::kHeads == 0 ? TcGeom<2>::kHeads : kHeadTile; }

// The kernel a call runs (Auto resolved; a forced Wgmma that the device or shape cannot run fails).
bool use_wgmma(const MlaDecodeTcArgs& args) {
  if (args.kernel == MlaDecodeKernel::MmaSync) return false;
  const bool ok = mla_decode_sm90a_supported(args.num_heads, args.kv_lora_rank, args.rope_dim);
  MLA_CHECK(ok || args.kernel != MlaDecodeKernel::Wgmma,
            "mla_decode_tc: wgmma kernel forced but unsupported ({} heads, want a multiple of {} on sm_90)",
            args.num_heads, kMlaSm90aHeadTile);
  return ok;
}
int cta_heads(const MlaDecodeTcArgs& args) {
  return use_wgmma(args) ? kMlaSm90aHeadTile : heads_per_cta(args.num_heads);
}

// Splits per launch: a function of T and H only (graph replay). CTAs = T * H / heads_per_cta *
// splits at one CTA per SM (170-192 KB of smem); time ~ waves / splits, so pick the smallest split
// count within 15% of the best such ratio (fewer splits = less combine traffic and longer streams
// per CTA). On 132 SMs: batch 64 x 16 heads: 2 splits (128 CTAs); batch 64 x 128 heads: 1 split
// (256 CTAs); batch 1 x 16 or 128 heads: 28 splits. That is the grid's maximum: a row uses
// min(28, ceil(tiles / kMinTilesPerSplit)) of them (splits_in_use, on the device).
// The wgmma kernel (64 heads per CTA, also one CTA per SM) uses the same rule with its head count:
// batch 64 x 128 heads = 128 CTAs, 1 split.
int num_splits_for(int num_tokens, int num_heads, int heads_per_block) {
  const int64_t base = int64_t(num_tokens) * (num_heads / heads_per_block), sms = sm_count();
  if (base <= 0) return 1;
  auto cost = [&](int64_t s) { return double((base * s + sms - 1) / sms) / double(s); };
  double best = cost(1);
  for (int s = 2; s <= kMaxSplits; ++s) best = std::min(best, cost(s));
  for (int s = 1; s <= kMaxSplits; ++s)
    if (cost(s) <= best * 1.15) return s;
  return 1;
}

template <int M> void launch_attention(const MlaDecodeTcArgs& args, int splits, int q_vec, Stream stream) {
  constexpr int kSmem = TcGeom<M>::kSmemBytes;
  MLA_GPU_CHECK(cudaFuncSetAttribute(mla_decode_tc_kernel<M>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  const dim3 grid(unsigned(args.num_heads / TcGeom<M>::kHeads), unsigned(splits), unsigned(args.num_tokens));
  mla_decode_tc_kernel<M><<<grid, kThreads, kSmem, stream>>>(args, splits, q_vec);
  MLA_GPU_LAUNCH_CHECK();
}

// The combine, launched with programmatic stream serialization (PDL; a programmatic edge when
// captured): it may start once every attention CTA has triggered, and waits for that grid in-kernel.
void launch_combine(const MlaDecodeTcArgs& args, int splits, Stream stream) {
  launch_maybe_pdl(mla_decode_tc_combine_kernel, dim3(unsigned(args.num_heads), unsigned(args.num_tokens)),
                   dim3(kRank / 4), 0, true, stream, args, splits);
}

}  // namespace

bool mla_decode_tc_supported(int num_heads, int kv_lora_rank, int rope_dim) {
  if (num_heads <= 0 || num_heads % kHeadTile != 0 || kv_lora_rank != kRank || rope_dim != kRope) return false;
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return false;
  return major >= 8;
}

size_t mla_decode_tc_workspace_bytes(const MlaDecodeTcArgs& args) {
  if (args.num_tokens <= 0 || args.num_heads <= 0) return 0;
  const int splits = num_splits_for(args.num_tokens, args.num_heads, cta_heads(args));
  if (splits == 1) return 0;  // the attention kernel writes `out` directly
  return size_t(splits) * size_t(args.num_tokens) * size_t(args.num_heads) * (kRank + 2) * sizeof(float);
}

// q F32 [T, H, 576] (row/head strides in elements, last dim contiguous), cache BF16 [blocks,
// block_size, 576] contiguous and 16-byte aligned, out F32 [T, H, 512] (last dim contiguous); H a
// multiple of 16; workspace of mla_decode_tc_workspace_bytes() (16-byte aligned), may be null when
// that is 0. out must not alias q, cache or workspace. No allocation, no synchronization.
void mla_decode_tc(const MlaDecodeTcArgs& args, Stream stream) {
  MLA_CHECK(args.kv_lora_rank == kRank && args.rope_dim == kRope, "mla_decode_tc: r {} d_r {} (want 512, 64)",
            args.kv_lora_rank, args.rope_dim);
  MLA_CHECK(args.num_heads > 0 && args.num_heads % kHeadTile == 0, "mla_decode_tc: {} heads, want a multiple of {}",
            args.num_heads, kHeadTile);
  MLA_CHECK(args.num_tokens >= 0 && args.num_tokens <= 65535 && args.num_seqs >= 0,
            "mla_decode_tc: {} tokens (max 65535), {} seqs", args.num_tokens, args.num_seqs);
  if (args.num_tokens == 0) return;
  MLA_CHECK(args.num_seqs > 0 && args.block_size > 0, "mla_decode_tc: {} seqs, block_size {}", args.num_seqs,
            args.block_size);
  MLA_CHECK(args.q && args.cache && args.out && args.q_indptr && args.kv_lens && args.block_indptr && args.block_ids,
            "mla_decode_tc: null pointer argument");
  MLA_CHECK(reinterpret_cast<uintptr_t>(args.cache) % 16 == 0, "mla_decode_tc: cache not 16-byte aligned");
  const bool wgmma = use_wgmma(args);
  const int splits =
      num_splits_for(args.num_tokens, args.num_heads, wgmma ? kMlaSm90aHeadTile : heads_per_cta(args.num_heads));
  if (splits > 1)
    MLA_CHECK(args.workspace && reinterpret_cast<uintptr_t>(args.workspace) % 16 == 0,
              "mla_decode_tc: {} splits need a 16-byte aligned workspace", splits);
  // float4 loads of q need 16-byte rows; otherwise the scalar staging loop (same values).
  const int q_vec = reinterpret_cast<uintptr_t>(args.q) % 16 == 0 && args.q_row_stride % 4 == 0 &&
                    args.q_head_stride % 4 == 0;
  if (wgmma) mla_decode_sm90a_attention(args, splits, q_vec, stream);
  else if (heads_per_cta(args.num_heads) == TcGeom<2>::kHeads) launch_attention<2>(args, splits, q_vec, stream);
  else launch_attention<1>(args, splits, q_vec, stream);
  if (splits > 1) launch_combine(args, splits, stream);
}

#else  // HIP: no mma.sync; the dispatcher takes the generic path.

bool mla_decode_tc_supported(int, int, int) { return false; }
size_t mla_decode_tc_workspace_bytes(const MlaDecodeTcArgs&) { return 0; }
void mla_decode_tc(const MlaDecodeTcArgs&, Stream) {
  MLA_CHECK(false, "mla_decode_tc: tensor-core MLA decode is NVIDIA-only (check mla_decode_tc_supported)");
}

#endif

}  // namespace mla::gpu
