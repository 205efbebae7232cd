// Tensor-core absorbed-MLA decode over a BF16 paged latent cache: one CTA per (query token, 16- or
// 32-head tile, KV split) streams 32- or 64-position units of cache rows through a ring of
// shared-memory stages (cp.async) and runs S = Q K^T and O += P V on mma.sync m16n8k16 bf16 with
// fp32 accumulation and an fp32 online softmax. Trade-off: q and P are rounded to bf16 for the
// tensor cores (the cache already is bf16), buying ~10x the fp32 FMA rate at ~2^-9 relative error
// per term.
#include "backend/gpu/gpu_mla_decode_tc.h"
#include "backend/gpu/gpu_mla_decode_sm90a.h"

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "backend/gpu/gpu_device.cuh"
#include "backend/gpu/gpu_mma.cuh"
#include "core/status.h"

#if MLA_GPU_CUDA
#include <cooperative_groups.h>
#endif

namespace mla::gpu {

#if MLA_GPU_CUDA
namespace {

// ---- geometry (DeepSeek-V3 / Kimi: r = 512, d_r = 64) ---------------------------------------------
constexpr int kRank = 512;                        // latent width = value width
constexpr int kRope = 64;                         // rotated key part
constexpr int kKvDim = kRank + kRope;             // 576: key width = cache row
constexpr int kHeadTile = kMlaTcHeadTile;         // 16 query heads = one mma M tile
constexpr int kKeys = kMlaDecodeKeyTile;          // 64 cache positions per split tile (split bookkeeping)
constexpr int kWarps = 8, kThreads = kWarps * 32;  // CUDA-only file: warps are 32 lanes
constexpr int kRowElems = kKvDim + 8;             // padded Q staging row: 1168 B = 73 x 16 B (odd) so
                                                  // the 8 row addresses of an ldmatrix hit distinct banks
// The cache ring's rows are not padded: a stage row is the cache row's 1152 B (9 x 128 B), its 16-byte
// chunk c stored at chunk c ^ (row % 8) (an XOR swizzle within each 128-byte line). Why: cp.async
// writes each 128-byte line of global memory into one 128-byte line of shared memory only where both
// sit at the same offset mod 128; padded 1168-byte rows broke that for 7 rows in 8, and the ring's
// fills then took 4x their ideal shared-memory wavefronts: 61% of all of the kernel's (ncu, H100,
// batch 64 x 16 heads, 2026-12-07), whose shared-memory pipe was what bounded it with the cache in
// L2. The swizzle keeps an ldmatrix's 8 rows (8 consecutive keys from a multiple of 8) on distinct
// banks, as the padding did.
constexpr int kKSteps = kKvDim / 16;              // 36 k16 steps of S = Q K^T
// S = Q K^T: warp w computes keys [U/2 (w / 4), +U/2) of a U-key unit over k16 steps w % 4, w % 4 + 4,
// ..., w % 4 + 32 (dims 16 (4 i + w % 4) + [0, 16), i < 9: interleaved so that step i's two chunks sit
// in 128-byte line i, at chunks 2 (w % 4) and 2 (w % 4) + 1 before the swizzle, and a lane's swizzled
// offset is one per-lane constant); the 4 partials are summed through shared memory. Q's fragments
// for those dims stay in registers.
constexpr int kDimSplit = 4, kKeySplit = kWarps / kDimSplit;  // 4 dim quarters x 2 key halves
constexpr int kKStepsPerWarp = kKSteps / kDimSplit;           // 9 k16 steps per warp
constexpr int kColsPerWarp = kRank / kWarps;      // 64: warp w owns O columns [64w, 64w + 64)
constexpr int kNTilesPerWarp = kColsPerWarp / 8;  // 8 n8 accumulator tiles per warp
constexpr int kMaxSplits = kMlaDecodeMaxSplits;  // 32
// A token's context is cut into at most num_splits ranges of at least this many 64-key tiles
// (computed on the device from kv_lens, so a graph's grid stays fixed while the splits in use follow
// the context): a short context (batch 1, ctx 1100 = 18 tiles) uses 9 splits instead of all 28 of
// the grid, and the unused CTAs exit at once.
constexpr int kMinTilesPerSplit = kMlaDecodeMinTilesPerSplit;  // 2
// The attention kernel merges its split partials itself (in a cluster, or given tickets) only in
// grids of at most this many splits: the ticket merge's last CTA per tile reads the partials in
// rounds of two splits, so with many splits the combine kernel's spread over one CTA per row wins.
// Measured on the H200 (2026-12-03, mla-decode bench, same process): batch 64 x 16 heads (4 splits)
// 93.9 us with tickets against 96.7 us with the combine kernel; batch 1 x 128 heads at ctx 1100 (14
// splits, 9 in use) 19.3 us with tickets against 17.9 us.
constexpr int kFusedMaxSplits = kMlaDecodeMaxFusedSplits;
static_assert(kKSteps % kDimSplit == 0 && kRank % (kWarps * 16) == 0 && kHeadTile == 16);

// A CTA runs M head tiles (16 M heads) over the cache in units of U keys that stream through a ring
// of S shared-memory stages (cp.async): while one unit is computed, the next S - 1 are in flight.
// M = 2 halves the shared-memory and L2 reads per FLOP (what bounds many heads), M = 1 keeps twice
// the CTAs (what a 16-head, memory-bound launch needs). Shared memory map (bytes); the Q staging area
// aliases the partial-S area: Q lives in registers after the prologue, and a __syncthreads
// separates the two uses.
template <int M, int U, int S> struct TcGeom {
  static constexpr int kHeads = kHeadTile * M;
  static constexpr int kKeysPerWarp = U / kKeySplit;       // S columns per warp: 16 or 32
  static constexpr int kLoadRowsPerWarp = U / kWarps;      // cache rows copied per warp and unit: 4 or 8
  static constexpr int kSStride = U + 8;                   // fp32 partial-S row (8 mod 32 floats): conflict-free float2
  static constexpr int kPStride = U + 8;                   // bf16 P row (16 B x odd)
  static constexpr int kUnitBytes = U * kKvDim * 2;        // 36,864 or 73,728 (rows of 9 x 128 B)
  static constexpr int kKvBytes = S * kUnitBytes;
  // Softmax: a row's kLanesPerRow lanes (16 or 8, an aligned lane group) hold kKeysPerLane keys each,
  // read as groups of kVec adjacent floats (a row's lanes read 32 consecutive floats per group:
  // conflict-free), group j at key j * kVec * kLanesPerRow.
  static constexpr int kLanesPerRow = kThreads / kHeads;
  static constexpr int kKeysPerLane = U / kLanesPerRow;
  static constexpr int kVec = kKeysPerLane < 4 ? kKeysPerLane : 4;
  static constexpr int kRedBytes = std::max(kDimSplit * kHeads * kSStride * 4, kHeads * kRowElems * 2);
  static constexpr int kPBytes = kHeads * kPStride * 2;
  static constexpr int kSmemBytes = kKvBytes + kRedBytes + kPBytes + 3 * kHeads * 4;
  static_assert(kKeys % U == 0 && U % kWarps == 0 && kKeysPerWarp % 16 == 0 && kRedBytes % 16 == 0 &&
                kPBytes % 16 == 0 && (kVec == 2 || kVec == 4) && kKeysPerLane % kVec == 0 && kLanesPerRow <= 32 &&
                S >= 2 && kSmemBytes <= 227 * 1024);
};

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kNegInf = -__builtin_huge_valf();

// PTX wrappers (cp.async, ldmatrix, mma.sync) and their fragment layouts: gpu_mma.cuh.
using namespace mma;

// Query row `token`'s causal limit (query i of its sequence s sits at position kv_len - q_len + i and
// sees positions < limit; s is the largest with q_indptr[s] <= token, so empty sequences are
// skipped) and, kBlocks, the sequence's first block-table entry. Decode batches (one query per
// sequence: q_indptr[token] = token, q_indptr[token + 1] = token + 1, which pins s = token because
// q_indptr is non-decreasing) take one memory round trip: those two entries, kv_lens[token] and
// block_indptr[token] are loaded together, speculatively. Otherwise s = (the number of s in [0, S)
// with q_indptr[s] <= token) - 1 (q_indptr[0] = 0 <= token): each warp counts 32 entries per ballot,
// with independent loads (one or two round trips for a batch of 64, where a binary search is a
// chain of 6), then the sequence's entries: three round trips where the fast path takes one, each
// ~0.5-1 us before the first cache row can be requested. Call with the whole warp converged.
struct TokenRange {
  int limit, block_base;
};
template <bool kBlocks> __device__ __forceinline__ TokenRange token_range(const MlaDecodeTcArgs& a, int token) {
  if (token < a.num_seqs) {  // uniform per CTA
    const int q0 = a.q_indptr[token], q1 = a.q_indptr[token + 1], kv_len = a.kv_lens[token];
    const int base = kBlocks ? a.block_indptr[token] : 0;
    if (q0 == token && q1 == token + 1) return {kv_len, base};
  }
  const int lane = int(threadIdx.x) % 32;
  int count = 0;
#pragma unroll 4
  for (int s0 = 0; s0 < a.num_seqs; s0 += 32) {
    const bool le = s0 + lane < a.num_seqs && a.q_indptr[s0 + lane] <= token;
    count += __popc(__ballot_sync(0xffffffffu, le));
  }
  const int seq = max(count - 1, 0);
  const int q0 = a.q_indptr[seq], q_len = a.q_indptr[seq + 1] - q0, kv_len = a.kv_lens[seq];
  return {kv_len - q_len + (token - q0) + 1, kBlocks ? a.block_indptr[seq] : 0};
}
// Splits a token of `tiles_total` tiles uses out of the grid's num_splits (>= 1). The attention and
// combine kernels both derive it from the same device data, so they agree on which partials exist.
// 1 means split 0 writes `out` directly and the combine skips the token.
__device__ __forceinline__ int splits_in_use(int tiles_total, int num_splits) {
  return max(1, min(num_splits, (tiles_total + kMinTilesPerSplit - 1) / kMinTilesPerSplit));
}


// ---- the split merge ------------------------------------------------------------------------------
// The weights of one (token, head) row's splits, as the combine kernel and the fused merge both use
// them (split order, deterministic): coef[i] = 2^(m_i - M) for a split with l_i > 0 (M the largest
// such m_i), -1 for an unused or empty split (whose O was never written); returns 1 / sum coef_i l_i
// (0 when no split has a key: only for an invalid batch, kv_len < q_len). All (m, l) loads are issued
// unrolled before use: one memory round trip. ld.cg (L2): other CTAs wrote them during this grid or
// the one before.
template <int N>
__device__ __forceinline__ float split_weights(const float* __restrict__ ws_ml, size_t rows, size_t row, int used,
                                               float (&coef)[N]) {
  float m[N], l[N];
#pragma unroll
  for (int i = 0; i < N; ++i) {
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
  for (int i = 0; i < N; ++i)
    if (l[i] > 0.0f) big_m = fmaxf(big_m, m[i]);
  float den = 0.0f;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    coef[i] = -1.0f;
    if (l[i] > 0.0f) {
      coef[i] = exp2f(m[i] - big_m);
      den += coef[i] * l[i];
    }
  }
  return den > 0.0f ? 1.0f / den : 0.0f;
}

// The fused merge, called by every CTA of a split tile (split < used, not direct) after it wrote its
// partial: the CTA that takes the tile's last ticket merges all `used` partials into `out` (and
// resets the ticket for the next call); the others return. Only grids of at most kFusedMaxSplits
// splits pass tickets (mla_decode_tc), so used <= kFusedMaxSplits. Ordering: each thread fences its
// partial stores device-wide before the barrier that precedes the ticket, and the last CTA fences
// again before its ld.cg reads (the threadfence-reduction pattern). Cost on the critical path: the
// last CTA's merge only: the ticket's round trip, one for the weights' (m, l) together with the
// first kIStep splits' O (independent loads), then one per further kIStep splits; the combine
// kernel adds a launch, a wait for the whole grid and its own round trips.
// coef_s: kFusedMaxSplits * kHeads + kHeads floats of shared memory no warp uses any more.
// Heads present in q and out (MlaDecodeTcArgs::heads_live): rows head0 + r at or past it are computed
// from zero q and never stored.
__device__ __forceinline__ int live_heads(const MlaDecodeTcArgs& a) {
  return a.heads_live > 0 ? a.heads_live : a.num_heads;
}

template <int kHeads>
__device__ void merge_if_last(const MlaDecodeTcArgs& a, int token, int head0, int used, const float* ws_o,
                              const float* ws_ml, float* coef_s, unsigned& last_s) {
  const int tid = int(threadIdx.x);
  __threadfence();
  __syncthreads();
  unsigned* ticket = a.tickets + size_t(token) * size_t(a.num_heads / kMlaTcHeadTile) + size_t(head0 / kMlaTcHeadTile);
  if (tid == 0) last_s = atomicAdd(ticket, 1u) == unsigned(used - 1) ? 1u : 0u;
  __syncthreads();
  if (last_s == 0u) return;
  __threadfence();
  if (tid == 0) *ticket = 0u;  // every CTA of the tile has taken its ticket
  const size_t rows = size_t(a.num_tokens) * size_t(a.num_heads);
  const size_t row0 = size_t(token) * size_t(a.num_heads) + size_t(head0);
  // Thread tid owns float4 columns of kItems (row, col) items; kIStep x kItems float4 loads in flight
  // per round. An empty split's O was never written: it is loaded but never used.
  constexpr int kVecs = kRank / 4, kItems = kHeads * kVecs / kThreads, kIStep = kItems <= 8 ? 2 : 1;
  static_assert(kHeads * kVecs % kThreads == 0 && kThreads % kVecs == 0);
  const int col = (tid % kVecs) * 4, r0 = tid / kVecs;
  float4 v[kIStep][kItems];
  auto load_round = [&](int i) {
#pragma unroll
    for (int s = 0; s < kIStep; ++s)
#pragma unroll
      for (int it = 0; it < kItems; ++it) {
        const int r = r0 + it * (kThreads / kVecs);
        v[s][it] = i + s < used
                       ? __ldcg(reinterpret_cast<const float4*>(ws_o + (size_t(i + s) * rows + row0 + size_t(r)) * kRank + col))
                       : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
  };
  load_round(0);
  float* inv_s = coef_s + kFusedMaxSplits * kHeads;
  if (tid < kHeads) {
    float coef[kFusedMaxSplits];
    inv_s[tid] = split_weights<kFusedMaxSplits>(ws_ml, rows, row0 + size_t(tid), used, coef);
#pragma unroll
    for (int i = 0; i < kFusedMaxSplits; ++i) coef_s[i * kHeads + tid] = coef[i];
  }
  __syncthreads();
  float4 acc[kItems];
#pragma unroll
  for (int it = 0; it < kItems; ++it) acc[it] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int i = 0; i < used; i += kIStep) {
    if (i > 0) load_round(i);
#pragma unroll
    for (int s = 0; s < kIStep; ++s)
#pragma unroll
      for (int it = 0; it < kItems; ++it) {
        const int r = r0 + it * (kThreads / kVecs);
        const float w = i + s < used ? coef_s[(i + s) * kHeads + r] : -1.0f;
        if (w < 0.0f) continue;  // unused or empty split: contributes nothing (as in the combine)
        acc[it].x += w * v[s][it].x;
        acc[it].y += w * v[s][it].y;
        acc[it].z += w * v[s][it].z;
        acc[it].w += w * v[s][it].w;
      }
  }
#pragma unroll
  for (int it = 0; it < kItems; ++it) {
    const int r = r0 + it * (kThreads / kVecs);
    const float inv = inv_s[r];
    if (head0 + r >= live_heads(a)) continue;
    float* out = a.out + int64_t(token) * a.out_row_stride + int64_t(head0 + r) * a.out_head_stride + col;
    out[0] = acc[it].x * inv; out[1] = acc[it].y * inv; out[2] = acc[it].z * inv; out[3] = acc[it].w * inv;
  }
}

// The cluster merge: the `nsplit` CTAs of one (token, head tile) form a thread-block cluster (rank
// = split) and every one calls this, having put its partial in its own shared memory: o_s [kHeads]
// rows of kOStride floats (unnormalized O) and m_s / l_s [kHeads] (an unused or empty split: l = 0,
// o_s not written). After a cluster barrier (release / acquire: the peers' partials are visible)
// each CTA merges an nsplit-th of the tile's (row, 4-column) items, reading the peers' partials
// through distributed shared memory, with the weights and the split order of split_weights and the
// combine kernel (the same bits). A second barrier keeps every CTA's shared memory alive until its
// peers have read it. Cost: two cluster barriers and one round of DSMEM loads (~1 us), where the
// ticket merge pays a fence, the atomic and two rounds of L2 loads in one CTA after the last split.
constexpr int kOStride = kRank + 8;  // o_s row: 520 floats, conflict-free float2 stores of C fragments
template <int kHeads>
__device__ void merge_in_cluster(const MlaDecodeTcArgs& a, int token, int head0, int nsplit, const float* o_s,
                                 const float* m_s, const float* l_s) {
  namespace cg = cooperative_groups;
  const cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  const int rank = int(cluster.block_rank());
  constexpr int kVecs = kRank / 4;
  const float* peer_o[kFusedMaxSplits];
  const float* peer_m[kFusedMaxSplits];
  const float* peer_l[kFusedMaxSplits];
#pragma unroll
  for (int i = 0; i < kFusedMaxSplits; ++i) {
    const int r = i < nsplit ? i : 0;
    peer_o[i] = cluster.map_shared_rank(o_s, r);
    peer_m[i] = cluster.map_shared_rank(m_s, r);
    peer_l[i] = cluster.map_shared_rank(l_s, r);
  }
  for (int idx = rank * kThreads + int(threadIdx.x); idx < kHeads * kVecs; idx += nsplit * kThreads) {
    const int r = idx / kVecs, col = (idx % kVecs) * 4;
    if (head0 + r >= live_heads(a)) continue;
    float m[kFusedMaxSplits], l[kFusedMaxSplits];
    float4 v[kFusedMaxSplits];
#pragma unroll
    for (int i = 0; i < kFusedMaxSplits; ++i) {  // every load issued before any use: one round trip
      m[i] = kNegInf;
      l[i] = 0.0f;
      v[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (i < nsplit) {
        m[i] = peer_m[i][r];
        l[i] = peer_l[i][r];
        v[i] = *reinterpret_cast<const float4*>(peer_o[i] + r * kOStride + col);
      }
    }
    float big_m = kNegInf;
#pragma unroll
    for (int i = 0; i < kFusedMaxSplits; ++i)
      if (l[i] > 0.0f) big_m = fmaxf(big_m, m[i]);
    float den = 0.0f;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int i = 0; i < kFusedMaxSplits; ++i) {
      if (l[i] > 0.0f) {
        const float w = exp2f(m[i] - big_m);
        den += w * l[i];
        acc.x += w * v[i].x; acc.y += w * v[i].y; acc.z += w * v[i].z; acc.w += w * v[i].w;
      }
    }
    const float inv = den > 0.0f ? 1.0f / den : 0.0f;
    float* out = a.out + int64_t(token) * a.out_row_stride + int64_t(head0 + r) * a.out_head_stride + col;
    out[0] = acc.x * inv; out[1] = acc.y * inv; out[2] = acc.z * inv; out[3] = acc.w * inv;
  }
  cluster.sync();
}

// ---- the attention kernel -------------------------------------------------------------------------
// Napkin math per CTA and U-key unit: cache bytes U * 1152; FLOPs 2 * 16M * U * (576 + 512) (16
// heads: 30 FLOP/B, memory-bound; 128 heads = 8/M CTAs per token share the unit through L2:
// tensor-core-bound). Per token and 16-head tile: bytes = ctx * 576 * 2, FLOPs = 2 * 16 * ctx *
// (576 + 512). Shared-memory traffic per 64 keys at M = 1: cp.async writes 74 KB, K reads 74 KB,
// V reads 66 KB, partial S 2 x 16 KB, P 16 KB: ~260 KB, ~1 us at 128 B/clk, against the 2.2 us in
// which one SM's share of the copy bandwidth (batch 64 x 16 heads: 128 CTAs) brings those 74 KB.
// That count holds only where every access is whole wavefronts: with padded ring rows the cp.async
// fills alone took 4x theirs, and the shared-memory pipe (one wavefront per clock) then set the
// kernel's pace with the cache in L2 at about the H200's per-SM copy rate (the swizzled ring above;
// docs/performance.md, session 32).
// Measured on the H200 (2026-12-01): the phases (S, softmax, P V) are separated by barriers and
// their latencies add up, so the CTA's compute per unit, not the bytes in flight, sets the pace: a
// ring of five 32-key stages at one CTA per SM ran at 56% of copy bandwidth against 61-69% for two
// 64-key buffers. Two CTAs per SM on 32-key units overlap one CTA's barriers and softmax with the
// other's MMAs (63-74%).
//
// Grid: x = head group (fastest, so the head groups of one token run together and share the cache
// unit through L2), y = KV split (the most any row may use; a row uses splits_in_use of them), z =
// query token. Block: 8 warps (2 per SM sub-partition, so one warp's ldmatrix/mma latency hides
// behind the other's).
// kCluster: launched as clusters of the grid's num_splits CTAs along y (2..kFusedMaxSplits), which
// merge their partials in merge_in_cluster; a.tickets is then unused.
template <int M, int U, int S, bool kCluster>
__device__ __forceinline__ void attend_tile(const MlaDecodeTcArgs& a, int num_splits, int q_vec, int token) {
  using G = TcGeom<M, U, S>;
  constexpr int kHeads = G::kHeads, kStages = S, kUnit = U, kLoadRowsPerWarp = G::kLoadRowsPerWarp;
  constexpr int kKeysPerWarp = G::kKeysPerWarp, kSStride = G::kSStride, kPStride = G::kPStride;
  constexpr int kUnitBytes = G::kUnitBytes;
  extern __shared__ __align__(128) unsigned char smem[];
  uint16_t* kv_s = reinterpret_cast<uint16_t*>(smem);                         // [kStages][kUnit][kKvDim] swizzled
  float* s_part = reinterpret_cast<float*>(smem + G::kKvBytes);               // [kDimSplit][kHeads][kSStride]
  uint16_t* q_s = reinterpret_cast<uint16_t*>(smem + G::kKvBytes);            // [kHeads][kRowElems] (alias)
  uint16_t* p_s = reinterpret_cast<uint16_t*>(smem + G::kKvBytes + G::kRedBytes);  // [kHeads][kPStride]
  float* alpha_s = reinterpret_cast<float*>(smem + G::kKvBytes + G::kRedBytes + G::kPBytes);  // [kHeads]
  float* m_s = alpha_s + kHeads;                                              // [kHeads] running max (log2)
  float* l_s = m_s + kHeads;                                                  // [kHeads] running sum
  __shared__ unsigned last_s;  // fused merge: this CTA took its tile's last ticket
  static_assert((kFusedMaxSplits + 1) * kHeads * 4 <= G::kKvBytes, "the merge's weights fit the ring");
  static_assert(kHeads * kOStride * 4 <= G::kKvBytes, "the cluster merge's partial O fits the ring");
  float* o_s = reinterpret_cast<float*>(smem);  // cluster merge: [kHeads][kOStride], over the ring

  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t4 = lane % 4;
  const int head0 = int(blockIdx.x) * kHeads, split = int(blockIdx.y);

  const TokenRange tr = token_range<true>(a, token);
  const int limit = tr.limit;
  const int tiles_total = max(0, (limit + kKeys - 1) / kKeys);
  const int used = splits_in_use(tiles_total, num_splits);
  const bool direct = used == 1;  // this CTA (split 0) owns the whole context: write out, no partials
  // Uniform per CTA, before any barrier. The combine reads splits < used; a cluster (one token's
  // splits, so `used` is uniform across it) merges unless direct, and then every CTA takes part.
  if (split >= used && (!kCluster || direct)) return;
  if (kCluster && split >= used) {
    if (tid < kHeads) {
      m_s[tid] = kNegInf;
      l_s[tid] = 0.0f;
    }
    merge_in_cluster<kHeads>(a, token, head0, num_splits, o_s, m_s, l_s);
    return;
  }
  const int tiles_per_split = (tiles_total + used - 1) / used;
  const int tile_begin = split * tiles_per_split;
  const int tile_end = min(tile_begin + tiles_per_split, tiles_total);

  const size_t part_row = (size_t(split) * size_t(a.num_tokens) + size_t(token)) * size_t(a.num_heads) + size_t(head0);
  float* ws_o = static_cast<float*>(a.workspace);                                        // [splits, T, H, r]
  float* ws_ml = ws_o + size_t(num_splits) * size_t(a.num_tokens) * size_t(a.num_heads) * kRank;  // [splits, T, H, 2]
  if (tile_begin >= tile_end) {  // empty split (e.g. 9 tiles over 4 splits of 3): contributes nothing
    if (direct) {  // only for an invalid batch (kv_len < q_len): no keys, write zeros
      for (int i = tid; i < kHeads * kRank; i += kThreads)
        if (head0 + i / kRank < live_heads(a))
          a.out[int64_t(token) * a.out_row_stride + int64_t(head0 + i / kRank) * a.out_head_stride + i % kRank] = 0.0f;
    } else if (kCluster) {
      if (tid < kHeads) {
        m_s[tid] = kNegInf;
        l_s[tid] = 0.0f;
      }
      merge_in_cluster<kHeads>(a, token, head0, num_splits, o_s, m_s, l_s);
    } else {
      if (tid < kHeads) {
        ws_ml[(part_row + size_t(tid)) * 2 + 0] = kNegInf;
        ws_ml[(part_row + size_t(tid)) * 2 + 1] = 0.0f;
      }
      if (a.tickets) merge_if_last<kHeads>(a, token, head0, used, ws_o, ws_ml, reinterpret_cast<float*>(smem), last_s);
    }
    return;
  }
  // This CTA's U-key units: those of its tiles that hold a visible key (the last tile of a context
  // may end in a unit wholly at or past `limit`: it is not loaded). unit_begin < unit_end because
  // tile_begin < tiles_total.
  const int unit_begin = tile_begin * (kKeys / kUnit);
  const int unit_end = min(tile_end * (kKeys / kUnit), (limit + kUnit - 1) / kUnit);

  const int block_base = tr.block_base;
  // Row `lane` (lanes < kLoadRowsPerWarp) of this warp's share of the units, resolved in order
  // unit_begin, unit_begin + 1, ... one unit before its copies are issued: (block id, in-block
  // offset), block id -1 past `limit` or past unit_end. The block-table load then flies while a unit
  // computes, and the slot's multiply waits in load_unit, a unit later (placed right after the load,
  // as it was, it stalled the warp on the load: 3.6% of the stall samples, ncu 2026-12-03). The
  // block-table index and offset advance by kUnit positions per unit: no division in the loop (the
  // run-time pos / block_size took another ~4%).
  int res_unit = unit_begin, res_idx, res_off;
  {
    const int pos = unit_begin * kUnit + warp * kLoadRowsPerWarp + lane;
    res_idx = pos / a.block_size;
    res_off = pos - res_idx * a.block_size;
  }
  auto resolve_next = [&]() {
    int2 ref = make_int2(-1, 0);
    if (lane < kLoadRowsPerWarp && res_unit < unit_end &&
        res_unit * kUnit + warp * kLoadRowsPerWarp + lane < limit)
      ref = make_int2(a.block_ids[block_base + res_idx], res_off);
    ++res_unit;
    res_off += kUnit;
    while (res_off >= a.block_size) {
      res_off -= a.block_size;
      ++res_idx;
    }
    return ref;
  };
  // Issues the cp.async copies of `unit` into ring stage `stage` as one commit group: warp w copies
  // rows [R w, R w + R), R = kLoadRowsPerWarp, whose cache rows its lanes < R hold in `my_row` (slot <
  // 2^31: a cache of 2^31 rows would be 2.4 TB); each 1152-byte row is copied by the warp as 16-byte
  // chunks lane, lane + 32 and lane + 64 (coalesced), to the swizzled chunks (lane ^ row % 8) + 0, 32,
  // 64 of the stage row (the XOR changes the low 3 bits only). Rows at or past `limit` are zero-filled: P is 0
  // there, but 0 * garbage could be NaN in the P V product. A unit past unit_end commits an empty
  // group, so the group count per iteration stays uniform for cp_async_wait.
  // (An L2 prefetch of the next 1-2 tiles was tried on the H200, 2026-11-30, with two 64-key
  // buffers: 16 heads fell from 65% of copy bandwidth to 47-60%; not used.)
  const char* cache_bytes = reinterpret_cast<const char*>(a.cache) + lane * 16;
  const uint32_t kv_base = smem_addr(kv_s) + uint32_t(warp * kLoadRowsPerWarp * kKvDim * 2);
  const int lane_x = lane ^ ((warp * kLoadRowsPerWarp) % 8);  // row rr of this warp: XOR rr too (no carry:
                                                              // (warp R) % 8 is 0 or 4, rr < R <= 8)
  auto load_unit = [&](int stage, int unit, int2 ref) {
    const int my_row = ref.x >= 0 ? ref.x * a.block_size + ref.y : -1;
    if (unit < unit_end) {
      const uint32_t dst = kv_base + uint32_t(stage * kUnitBytes);
#pragma unroll
      for (int rr = 0; rr < kLoadRowsPerWarp; ++rr) {
        const int row_slot = shfl(my_row, rr);
        const char* src = cache_bytes + (row_slot >= 0 ? int64_t(row_slot) * (kKvDim * 2) : 0);
        const int bytes = row_slot >= 0 ? 16 : 0;
        const uint32_t d = dst + uint32_t(rr * kKvDim * 2 + (lane_x ^ rr) * 16);
        cp_async16(d, src, bytes);
        cp_async16(d + 512, src + 512, bytes);
        if (lane < 8) cp_async16(d + 1024, src + 1024, bytes);
      }
    }
    cp_async_commit();
  };

  // The ring's first kStages - 1 units overlap with the Q staging below.
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) load_unit(i, unit_begin + i, resolve_next());
  int2 next_row = resolve_next();  // unit_begin + kStages - 1, for the first iteration's copies

  // Stage Q (kHeads x 576, fp32 -> bf16) and take this warp's A fragments into registers. The
  // vector path issues all of a thread's float4 loads (9 or 18) before converting any: one memory
  // round trip instead of a chain of dependent scalar ones (a batch-1 call is mostly latency).
  // Heads past heads_live stage as zero rows (as the padded copy the dispatcher once made).
  const float* q_tok = a.q + int64_t(token) * a.q_row_stride + int64_t(head0) * a.q_head_stride;
  const int q_rows = min(kHeads, live_heads(a) - head0);
  if (q_vec) {  // host-checked: q 16-byte aligned, strides multiples of 4 floats
    constexpr int kVecPerRow = kKvDim / 4, kVecPerThread = kHeads * kVecPerRow / kThreads;
    static_assert(kHeads * kVecPerRow % kThreads == 0);
    float4 v[kVecPerThread];
#pragma unroll
    for (int i = 0; i < kVecPerThread; ++i) {
      const int idx = tid + i * kThreads, h = idx / kVecPerRow, c = (idx % kVecPerRow) * 4;
      v[i] = h < q_rows ? *reinterpret_cast<const float4*>(q_tok + int64_t(h) * a.q_head_stride + c)
                        : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
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
      q_s[h * kRowElems + d] = h < q_rows ? f32_to_bf16_bits(q_tok[int64_t(h) * a.q_head_stride + d]) : uint16_t(0);
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
        ldmatrix_x4(qf[m][ks], q_s + (m * 16 + row) * kRowElems + (ks * kDimSplit + kq) * 16 + col_off);
  }

  float o[M][kNTilesPerWarp][4];
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int nt = 0; nt < kNTilesPerWarp; ++nt) o[m][nt][0] = o[m][nt][1] = o[m][nt][2] = o[m][nt][3] = 0.0f;
  // Softmax state of row srow, replicated in the row's kLanesPerRow lanes (aligned lane groups); lane
  // cl of the row holds keys j * kGroupStride + W cl + [0, W) of the unit for each group j < V / W.
  constexpr int V = G::kKeysPerLane, W = G::kVec, kGroupStride = W * G::kLanesPerRow;
  const int srow = tid / G::kLanesPerRow, cl = lane % G::kLanesPerRow;
  float m_run = kNegInf, l_run = 0.0f;
  const float scale_log2 = a.softmax_scale * kLog2e;  // softmax in base 2: exp(x) = exp2(x log2 e)

  for (int unit = unit_begin; unit < unit_end; ++unit) {
    const int slot = (unit - unit_begin) % kStages;
    cp_async_wait<kStages - 2>();  // this thread's copies of `unit` landed (newer groups may fly)
    __syncthreads();  // (A) unit visible; every warp is done with the previous unit's slot and with q_s
    load_unit((slot + kStages - 1) % kStages, unit + kStages - 1, next_row);  // unit - 1's stage, read before (A)
    next_row = resolve_next();  // unit + kStages
    const uint16_t* kt = kv_s + size_t(slot) * kUnit * kKvDim;
    const int j0 = unit * kUnit;

    // S partial over this warp's 144 dims and kKeysPerWarp keys: M x [16 heads x kKeysPerWarp], n8 tiles.
    {
      constexpr int kSN = kKeysPerWarp / 8;
      float sacc[M][kSN][4];
#pragma unroll
      for (int m = 0; m < M; ++m)
#pragma unroll
        for (int nt = 0; nt < kSN; ++nt) sacc[m][nt][0] = sacc[m][nt][1] = sacc[m][nt][2] = sacc[m][nt][3] = 0.0f;
      // This lane's ldmatrix row is a key = lane % 8 (mod 8); its chunk in line ks is 2 kq + mi % 2.
      const int mi = lane / 8, key_in = kh * kKeysPerWarp + (mi / 2) * 8 + lane % 8;
      const uint16_t* k_lane = kt + key_in * kKvDim + (((2 * kq + mi % 2) ^ (lane % 8)) * 8);
#pragma unroll
      for (int ks = 0; ks < kKStepsPerWarp; ++ks) {
#pragma unroll
        for (int np = 0; np < kSN / 2; ++np) {
          // Matrices, k0 = 16 (4 ks + kq): (keys 16np..+7, dims k0..+7), (same keys, k0+8..), (keys
          // 16np+8.., k0..), (.., k0+8..) = b0, b1 of n-tile 2np and b0, b1 of n-tile 2np + 1.
          uint32_t b[4];
          ldmatrix_x4(b, k_lane + np * 16 * kKvDim + ks * 64);
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
        for (int nt = 0; nt < kSN; ++nt) {
          *reinterpret_cast<float2*>(sp + g * kSStride + nt * 8 + 2 * t4) = make_float2(sacc[m][nt][0], sacc[m][nt][1]);
          *reinterpret_cast<float2*>(sp + (g + 8) * kSStride + nt * 8 + 2 * t4) =
              make_float2(sacc[m][nt][2], sacc[m][nt][3]);
        }
      }
    }
    __syncthreads();  // (B) partial S complete

    // Online softmax over the unit. The four dim-quarter partials are summed in a fixed order
    // (deterministic).
    {
      float s[V];
#pragma unroll
      for (int i = 0; i < V; ++i) s[i] = 0.0f;
#pragma unroll
      for (int j = 0; j < V / W; ++j)
#pragma unroll
        for (int w = 0; w < kDimSplit; ++w) {
          const float* src = s_part + (w * kHeads + srow) * kSStride + j * kGroupStride + W * cl;
          if constexpr (W == 4) {
            const float4 v = *reinterpret_cast<const float4*>(src);
            s[4 * j] += v.x; s[4 * j + 1] += v.y; s[4 * j + 2] += v.z; s[4 * j + 3] += v.w;
          } else {
            const float2 v = *reinterpret_cast<const float2*>(src);
            s[2 * j] += v.x; s[2 * j + 1] += v.y;
          }
        }
      float mt = kNegInf;
#pragma unroll
      for (int i = 0; i < V; ++i) {
        s[i] = j0 + (i / W) * kGroupStride + W * cl + i % W < limit ? s[i] * scale_log2 : kNegInf;
        mt = fmaxf(mt, s[i]);
      }
      // A row's lanes are an aligned group of kLanesPerRow: xor below kLanesPerRow stays inside it.
#pragma unroll
      for (int x = G::kLanesPerRow / 2; x > 0; x /= 2) mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, x));
      const float m_new = fmaxf(m_run, mt);
      const float m_use = m_new == kNegInf ? 0.0f : m_new;  // a unit always has a visible key; guard anyway
      const float alpha = exp2f(m_run - m_use);               // 0 on the first unit (m_run = -inf)
      float psum = 0.0f;
      uint32_t pk[V / 2];
#pragma unroll
      for (int i = 0; i < V; i += 2) {
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
      for (int j = 0; j < V / W; ++j) {
        uint16_t* dst = p_s + srow * kPStride + j * kGroupStride + W * cl;
        if constexpr (W == 4) *reinterpret_cast<uint2*>(dst) = make_uint2(pk[2 * j], pk[2 * j + 1]);
        else *reinterpret_cast<uint32_t*>(dst) = pk[j];
      }
      if (cl == 0) {
        alpha_s[srow] = alpha;
        m_s[srow] = m_run;
        l_s[srow] = l_run;
      }
    }
    __syncthreads();  // (C) P and alpha complete

    // O[16M x 64w..] = alpha * O + P[16M x U] V[U x 64w..]; V = first 512 dims of the unit's rows.
    {
#pragma unroll
      for (int m = 0; m < M; ++m) {
        const float a_lo = alpha_s[m * 16 + g], a_hi = alpha_s[m * 16 + g + 8];
        // Once the running maxima settle alpha is exactly 1 for the whole warp (warp-uniform branch).
        if (__any_sync(0xffffffffu, a_lo != 1.0f || a_hi != 1.0f)) {
#pragma unroll
          for (int nt = 0; nt < kNTilesPerWarp; ++nt) {
            o[m][nt][0] *= a_lo; o[m][nt][1] *= a_lo; o[m][nt][2] *= a_hi; o[m][nt][3] *= a_hi;
          }
        }
      }
      // This lane's ldmatrix row is a key = lane % 8 (mod 8); its chunks are 8 warp + (mi / 2 + 2 np),
      // swizzled: 8 warp + ((mi / 2) ^ (lane % 8) ^ 2 np) (mi / 2 and 2 np share no bit).
      const int mi = lane / 8, v_chunk = (mi / 2) ^ (lane % 8);
#pragma unroll
      for (int ks = 0; ks < kUnit / 16; ++ks) {
        uint32_t pa[M][4];
#pragma unroll
        for (int m = 0; m < M; ++m)
          ldmatrix_x4(pa[m], p_s + (m * 16 + (mi % 2) * 8 + lane % 8) * kPStride + ks * 16 + (mi / 2) * 8);
        const uint16_t* vrow = kt + (ks * 16 + (mi % 2) * 8 + lane % 8) * kKvDim + warp * kColsPerWarp;
#pragma unroll
        for (int np = 0; np < kNTilesPerWarp / 2; ++np) {
          // .trans of (keys k0..+7, cols n0..+7), (keys k0+8.., n0..), (k0.., n0+8..), (k0+8.., n0+8..)
          // = b0, b1 of n-tile n0 and b0, b1 of n-tile n0 + 8.
          uint32_t b[4];
          ldmatrix_x4_trans(b, vrow + ((v_chunk ^ (2 * np)) * 8));
#pragma unroll
          for (int m = 0; m < M; ++m) {
            mma_bf16(o[m][2 * np], pa[m], b[0], b[1]);
            mma_bf16(o[m][2 * np + 1], pa[m], b[2], b[3]);
          }
        }
      }
    }
  }
  cp_async_wait_all();  // the empty trailing groups; nothing may be in flight when the CTA exits
  // m_s / l_s were written before the last (C) and are not written again: safe to read here.
  if (kCluster && !direct) {
    __syncthreads();  // every warp's last P V read of the ring is done: o_s may overwrite it
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float* lo = o_s + (m * 16 + g) * kOStride + warp * kColsPerWarp + 2 * t4;
#pragma unroll
      for (int nt = 0; nt < kNTilesPerWarp; ++nt) {
        *reinterpret_cast<float2*>(lo + nt * 8) = make_float2(o[m][nt][0], o[m][nt][1]);
        *reinterpret_cast<float2*>(lo + 8 * kOStride + nt * 8) = make_float2(o[m][nt][2], o[m][nt][3]);
      }
    }
    merge_in_cluster<kHeads>(a, token, head0, num_splits, o_s, m_s, l_s);
    return;
  }
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const int r_lo = m * 16 + g, r_hi = r_lo + 8;
    if (direct) {
      const float inv_lo = 1.0f / l_s[r_lo], inv_hi = 1.0f / l_s[r_hi];
      const bool live_lo = head0 + r_lo < live_heads(a), live_hi = head0 + r_hi < live_heads(a);
      float* out_lo = a.out + int64_t(token) * a.out_row_stride + int64_t(head0 + r_lo) * a.out_head_stride;
      float* out_hi = a.out + int64_t(token) * a.out_row_stride + int64_t(head0 + r_hi) * a.out_head_stride;
#pragma unroll
      for (int nt = 0; nt < kNTilesPerWarp; ++nt) {
        const int col = warp * kColsPerWarp + nt * 8 + 2 * t4;
        if (live_lo) {
          out_lo[col] = o[m][nt][0] * inv_lo;
          out_lo[col + 1] = o[m][nt][1] * inv_lo;
        }
        if (live_hi) {
          out_hi[col] = o[m][nt][2] * inv_hi;
          out_hi[col + 1] = o[m][nt][3] * inv_hi;
        }
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
  // The ring (kv_s) is free once every warp passed the merge's barrier (its last P V is done).
  if (!direct && a.tickets) merge_if_last<kHeads>(a, token, head0, used, ws_o, ws_ml, reinterpret_cast<float*>(smem), last_s);
}

// The grid's CTA (blockIdx.x head group, blockIdx.y split) of query token token0 + blockIdx.z.
// Launched with PDL. A main grid (tail = 0) waits for the previous kernel (q's last writer) before
// reading anything, then lets the next grid (the combine, expand_v's matvec, or the tail grid below)
// launch: a successor's CTAs wait in their own pdl_wait until this grid has completed, so only its
// launch latency is hidden.
// A tail grid (tail = 1) runs the last tokens of a call alongside a cluster grid that holds the
// others (mla_decode_tc: the clusters that fit one wave take tokens [0, token0), this grid the rest,
// with tickets, in the SM slots the clusters leave free). It is launched right behind the cluster
// grid, which triggers only after its own pdl_wait, so when a tail CTA starts every kernel before
// the cluster grid has completed and its writes (q, the cache row) are visible: the tail reads them
// at once, without waiting for the cluster grid, and shares nothing with it (its tokens' out rows,
// workspace rows and tickets are its own). It waits for the cluster grid at its end instead and
// never triggers, so its completion implies the cluster grid's and the next kernel sees both
// grids' outputs (the PDL chain rule of launch_maybe_pdl holds past the pair).
template <int M, int U, int S, int CTAS, bool kCluster>
__global__ void __launch_bounds__(kThreads, CTAS)
    mla_decode_tc_kernel(MlaDecodeTcArgs a, int num_splits, int q_vec, int token0, int tail) {
  if (!tail) pdl_enter();
  attend_tile<M, U, S, kCluster>(a, num_splits, q_vec, token0 + int(blockIdx.z));
  if (tail) pdl_wait();
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
  const TokenRange tr = token_range<false>(a, token);
  const int used = splits_in_use(max(0, (tr.limit + kKeys - 1) / kKeys), num_splits);
  pdl_wait();  // every CTA waits, also those that return: this grid's end implies its predecessor's
  pdl_trigger();  // the next grid (expand_v's matvec) may start issuing its weight loads
  if (used == 1 || head >= live_heads(a)) return;
  const size_t rows = size_t(a.num_tokens) * size_t(a.num_heads);
  const size_t row = size_t(token) * size_t(a.num_heads) + size_t(head);
  const float* ws_o = static_cast<const float*>(a.workspace);
  const float* ws_ml = ws_o + size_t(num_splits) * rows * kRank;
  float coef[kMaxSplits];
  const float inv = split_weights(ws_ml, rows, row, used, coef);
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
  for (int i = 0; i < kMaxSplits; ++i) {
    if (coef[i] < 0.0f) continue;  // unused or empty split: its O was never written
    const float4 v = __ldcg(reinterpret_cast<const float4*>(ws_o + (size_t(i) * rows + row) * kRank + col));
    acc.x += coef[i] * v.x; acc.y += coef[i] * v.y; acc.z += coef[i] * v.z; acc.w += coef[i] * v.w;
  }
  float* out = a.out + int64_t(token) * a.out_row_stride + int64_t(head) * a.out_head_stride + col;
  out[0] = acc.x * inv; out[1] = acc.y * inv; out[2] = acc.z * inv; out[3] = acc.w * inv;
}

int sm_count() {
  int dev = 0, sms = 0;
  MLA_GPU_CHECK(cudaGetDevice(&dev));
  MLA_GPU_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return std::max(sms, 1);
}

// ---- which kernel, geometry and split count a call runs (host) ------------------------------------
// A function of (num_tokens, num_heads, forced kernel) and the device only, like the launch grid, so
// the workspace size and a captured graph stay valid while contexts grow.
enum class TcVariant {
  M2U64S2,    // 32 heads per CTA, two 64-key buffers, one CTA per SM
  M1U64S2,    // 16 heads per CTA, two 64-key buffers, one CTA per SM
  M1U32S2x2,  // 16 heads per CTA, two 32-key buffers, two CTAs per SM
};
struct DecodePlan {
  bool wgmma = false;
  TcVariant variant = TcVariant::M1U64S2;
  int heads_per_cta = kHeadTile, ctas_per_sm = 1, splits = 1;
};

// Splits per launch. CTAs = T * H / heads_per_cta * splits at ctas_per_sm per SM; time ~ waves /
// splits, so pick the smallest split count within 15% of the best such ratio (fewer splits = less
// combine traffic and longer streams per CTA). That is the grid's maximum: a row uses
// min(splits, ceil(tiles / kMinTilesPerSplit)) of them (splits_in_use, on the device).
int num_splits_for(int num_tokens, int num_heads, int heads_per_block, int ctas_per_sm) {
  const int64_t base = int64_t(num_tokens) * (num_heads / heads_per_block), slots = int64_t(sm_count()) * ctas_per_sm;
  if (base <= 0) return 1;
  auto cost = [&](int64_t s) { return double((base * s + slots - 1) / slots) / double(s); };
  double best = cost(1);
  for (int s = 2; s <= kMaxSplits; ++s) best = std::min(best, cost(s));
  for (int s = 1; s <= kMaxSplits; ++s)
    if (cost(s) <= best * 1.15) return s;
  return 1;
}

// Auto: the wgmma kernel (64 heads per CTA) where its head tiles alone give at least half a wave
// (batch 64 x 128 heads: 128 CTAs, compute-bound), else the mma.sync kernel: 32 heads per CTA where
// those fill the GPU without splitting; else 16 heads, two CTAs per SM on 32-key units where the
// head tiles alone give a quarter wave (long streams per CTA: batch 64 x 16 heads), else one CTA per
// SM on 64-key tiles (few keys per CTA: batch 1 x 128 heads at ctx 1100 = 8 head tiles x 9 splits
// of 2 tiles, where the 32-key variant's extra barriers show).
// Measured on the H200 (2026-12-01, mla-decode bench; each variant forced in turn, two runs):
// batch 64 x ctx 4096 x 16 heads: 32-key x 2 CTAs 63.3 / 71.5% of copy bandwidth, 64-key 61.4 /
// 68.7%, a 5-stage ring of 32-key units at one CTA per SM 56.1%; batch 1 x ctx 1100 x 128 heads:
// 64-key 17.2 us, 32-key x 2 CTAs 18.9 us, 32-head CTAs 21.6 us, the wgmma kernel 24.8 us.
DecodePlan plan_for(const MlaDecodeTcArgs& args) {
  DecodePlan p;
  const int64_t sms = sm_count();
  const bool partial = args.heads_live > 0 && args.heads_live < args.num_heads;  // the mma.sync kernel's alone
  const bool wg_ok = args.kernel != MlaDecodeKernel::MmaSync && !partial &&
                     mla_decode_sm90a_supported(args.num_heads, args.kv_lora_rank, args.rope_dim);
  MLA_CHECK(wg_ok || args.kernel != MlaDecodeKernel::Wgmma,
            "mla_decode_tc: wgmma kernel forced but unsupported ({} heads, {} live; want all of a multiple of {} "
            "on sm_90)",
            args.num_heads, args.heads_live, kMlaSm90aHeadTile);
  const int64_t wg_ctas = int64_t(args.num_tokens) * (args.num_heads / kMlaSm90aHeadTile);
  p.wgmma = wg_ok && (args.kernel == MlaDecodeKernel::Wgmma || 2 * wg_ctas >= sms);
  if (p.wgmma) {
    p.heads_per_cta = kMlaSm90aHeadTile;
  } else if (args.num_heads % 32 == 0 && int64_t(args.num_tokens) * (args.num_heads / 32) >= sms) {
    p.variant = TcVariant::M2U64S2;
    p.heads_per_cta = 32;
  } else if (int64_t(args.num_tokens) * (args.num_heads / kHeadTile) * 4 >= sms) {
    p.variant = TcVariant::M1U32S2x2;
    p.ctas_per_sm = 2;
  }
  p.splits = num_splits_for(args.num_tokens, args.num_heads, p.heads_per_cta, p.ctas_per_sm);
  return p;
}

// The launch of one geometry over query tokens [token0, token0 + tokens): cluster: clusters of (1,
// splits, 1) CTAs, one per (head tile, token), merging in the kernel (merge_in_cluster); PDL always.
template <int M, int U, int S, int CTAS>
cudaLaunchConfig_t attention_config(const MlaDecodeTcArgs& args, int splits, int tokens, bool cluster, Stream stream,
                                    cudaLaunchAttribute (&attr)[2]) {
  attr[0] = {};
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 1;
  attr[0].val.clusterDim.y = unsigned(splits);
  attr[0].val.clusterDim.z = 1;
  attr[1] = {};
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(args.num_heads / (kHeadTile * M)), unsigned(splits), unsigned(tokens));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = TcGeom<M, U, S>::kSmemBytes;
  cfg.stream = stream;
  cfg.attrs = cluster ? attr : attr + 1;
  cfg.numAttrs = cluster ? 2 : 1;
  return cfg;
}

// How many of the call's tokens, from the first, merge in clusters (the rest: a tail grid with
// tickets beside them, or with no cluster grid the tickets or the combine kernel). A cluster's CTAs
// share one GPC, so clusters pack worse than lone CTAs: on an H100 or H200 (132 SMs) at two 95 KB
// CTAs per SM 62 clusters of 4 are resident at once against 264 lone CTAs, and batch 64 x 16 heads x
// 4 splits = 64 clusters in one grid run a second wave (H200, 2026-12-03: 125.9 us against 92.6 us
// with tickets). Auto therefore gives the clusters the tokens that fit one wave and, where the whole
// grid would fit one wave of lone CTAs (the tail's CTAs find the slots the clusters leave), the rest
// to the tail grid; else tickets for all. ClusterTail forces the pair with at most half the tokens in
// clusters (tests: both grids run at any batch of 2+). The resident-cluster count is asked once per
// (geometry, splits) (cudaOccupancyMaxActiveClusters: what the device holds at once, whatever the
// grid size of the config it is given).
template <int M, int U, int S, int CTAS>
int cluster_tokens_for(const MlaDecodeTcArgs& args, int splits, Stream stream) {
  const int tokens = args.num_tokens;
  if (args.merge == MlaDecodeMerge::Cluster) return tokens;
  static std::atomic<int> max_clusters[kFusedMaxSplits + 1] = {};  // 0: not asked yet
  int n = max_clusters[splits].load(std::memory_order_relaxed);
  if (n == 0) {
    const auto kernel = mla_decode_tc_kernel<M, U, S, CTAS, true>;
    MLA_GPU_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, TcGeom<M, U, S>::kSmemBytes));
    cudaLaunchAttribute attr[2];
    const cudaLaunchConfig_t cfg = attention_config<M, U, S, CTAS>(args, splits, tokens, true, stream, attr);
    MLA_GPU_CHECK(cudaOccupancyMaxActiveClusters(&n, kernel, &cfg));
    n = std::max(n, 1);
    max_clusters[splits].store(n, std::memory_order_relaxed);
  }
  const int64_t groups = args.num_heads / (kHeadTile * M), resident = n / groups;  // tokens whose clusters fit
  if (args.merge == MlaDecodeMerge::ClusterTail) return int(std::min<int64_t>(resident, tokens / 2));
  if (resident >= tokens) return tokens;
  const bool one_wave = int64_t(tokens) * groups * splits <= int64_t(sm_count()) * CTAS;
  return args.tickets != nullptr && one_wave ? int(resident) : 0;
}

// Launches the attention grid over tokens [token0, token0 + tokens); tail: the tail grid beside a
// cluster grid (see mla_decode_tc_kernel).
template <int M, int U, int S, int CTAS>
void launch_attention(const MlaDecodeTcArgs& args, int splits, int q_vec, bool cluster, int token0, int tokens,
                      bool tail, Stream stream) {
  constexpr int kSmem = TcGeom<M, U, S>::kSmemBytes;
  static_assert(CTAS * (kSmem + 1024) <= 228 * 1024, "CTAs per SM must fit the SM's shared memory");
  const auto kernel = cluster ? mla_decode_tc_kernel<M, U, S, CTAS, true> : mla_decode_tc_kernel<M, U, S, CTAS, false>;
  MLA_GPU_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  cudaLaunchAttribute attr[2];
  const cudaLaunchConfig_t cfg = attention_config<M, U, S, CTAS>(args, splits, tokens, cluster, stream, attr);
  MLA_GPU_CHECK(cudaLaunchKernelEx(&cfg, kernel, args, splits, q_vec, token0, tail ? 1 : 0));
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

bool mla_decode_cluster_merge_supported() {
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return false;
  return major >= 9;
}

size_t mla_decode_tc_workspace_bytes(const MlaDecodeTcArgs& args) {
  if (args.num_tokens <= 0 || args.num_heads <= 0) return 0;
  const int splits = plan_for(args).splits;
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
  MLA_CHECK(args.heads_live == 0 ||
                (args.heads_live > 0 && args.heads_live <= args.num_heads && args.num_heads - args.heads_live < kHeadTile),
            "mla_decode_tc: {} live heads of {} (want 0, or a partial last tile only)", args.heads_live,
            args.num_heads);
  MLA_CHECK(args.num_tokens >= 0 && args.num_tokens <= 65535 && args.num_seqs >= 0,
            "mla_decode_tc: {} tokens (max 65535), {} seqs", args.num_tokens, args.num_seqs);
  if (args.num_tokens == 0) return;
  MLA_CHECK(args.num_seqs > 0 && args.block_size > 0, "mla_decode_tc: {} seqs, block_size {}", args.num_seqs,
            args.block_size);
  MLA_CHECK(args.q && args.cache && args.out && args.q_indptr && args.kv_lens && args.block_indptr && args.block_ids,
            "mla_decode_tc: null pointer argument");
  MLA_CHECK(reinterpret_cast<uintptr_t>(args.cache) % 16 == 0, "mla_decode_tc: cache not 16-byte aligned");
  const DecodePlan plan = plan_for(args);
  const int splits = plan.splits;
  if (splits > 1)
    MLA_CHECK(args.workspace && reinterpret_cast<uintptr_t>(args.workspace) % 16 == 0,
              "mla_decode_tc: {} splits need a 16-byte aligned workspace", splits);
  // float4 loads of q need 16-byte rows; otherwise the scalar staging loop (same values).
  const int q_vec = reinterpret_cast<uintptr_t>(args.q) % 16 == 0 && args.q_row_stride % 4 == 0 &&
                    args.q_head_stride % 4 == 0;
  // The mma.sync kernel merges split partials itself (in clusters, or given tickets) where the grid
  // has 2..kFusedMaxSplits splits (see its definition); else the combine kernel does.
  MlaDecodeTcArgs k = args;
  const bool fusable = !plan.wgmma && splits > 1 && splits <= kFusedMaxSplits;
  const bool wants_cluster = args.merge == MlaDecodeMerge::Cluster || args.merge == MlaDecodeMerge::ClusterTail;
  MLA_CHECK(!wants_cluster || !fusable || mla_decode_cluster_merge_supported(),
            "mla_decode_tc: cluster merge forced but thread-block clusters need compute capability 9.0");
  MLA_CHECK(args.merge != MlaDecodeMerge::ClusterTail || !fusable || args.tickets != nullptr,
            "mla_decode_tc: the cluster merge with a tail grid needs tickets");
  int cluster_tokens = 0;  // tokens [0, cluster_tokens) merge in clusters
  if (fusable && (wants_cluster || (args.merge == MlaDecodeMerge::Auto && mla_decode_cluster_merge_supported()))) {
    switch (plan.variant) {
      case TcVariant::M2U64S2: cluster_tokens = cluster_tokens_for<2, 64, 2, 1>(args, splits, stream); break;
      case TcVariant::M1U64S2: cluster_tokens = cluster_tokens_for<1, 64, 2, 1>(args, splits, stream); break;
      case TcVariant::M1U32S2x2: cluster_tokens = cluster_tokens_for<1, 32, 2, 2>(args, splits, stream); break;
    }
  }
  const int tokens = args.num_tokens;
  if (!fusable || cluster_tokens == tokens || args.merge == MlaDecodeMerge::Kernel) k.tickets = nullptr;
  if (plan.wgmma) {
    mla_decode_sm90a_attention(k, splits, q_vec, stream);
  } else {
    // The cluster grid first: its clusters take whole GPC slots before the tail's lone CTAs fill the
    // rest.
    auto launch = [&](bool cluster, int token0, int count, bool tail) {
      switch (plan.variant) {
        case TcVariant::M2U64S2:
          launch_attention<2, 64, 2, 1>(k, splits, q_vec, cluster, token0, count, tail, stream);
          break;
        case TcVariant::M1U64S2:
          launch_attention<1, 64, 2, 1>(k, splits, q_vec, cluster, token0, count, tail, stream);
          break;
        case TcVariant::M1U32S2x2:
          launch_attention<1, 32, 2, 2>(k, splits, q_vec, cluster, token0, count, tail, stream);
          break;
      }
    };
    if (cluster_tokens > 0) launch(true, 0, cluster_tokens, false);
    if (cluster_tokens < tokens) launch(false, cluster_tokens, tokens - cluster_tokens, cluster_tokens > 0);
  }
  if (splits > 1 && cluster_tokens == 0 && k.tickets == nullptr) launch_combine(k, splits, stream);
}

#else  // HIP: no mma.sync; the dispatcher takes the generic path.

bool mla_decode_tc_supported(int, int, int) { return false; }
bool mla_decode_cluster_merge_supported() { return false; }
size_t mla_decode_tc_workspace_bytes(const MlaDecodeTcArgs&) { return 0; }
void mla_decode_tc(const MlaDecodeTcArgs&, Stream) {
  MLA_CHECK(false, "mla_decode_tc: tensor-core MLA decode is NVIDIA-only (check mla_decode_tc_supported)");
}

#endif

}  // namespace mla::gpu
