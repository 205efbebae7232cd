// Tensor-core decode matvec for GemmPrecision::Bf16: MoE experts (constraint and interface:
// gpu_decode_tc.h; dense layers: gpu_dense_tc.cu). Weights are the mma A operand, read once from HBM
// with 16-byte evict-first loads straight into fragments (no shared memory); an expert's tokens are
// the B columns (n = 8), prepared once as 16-bit rows. FP8: e4m3 -> f16 exact (cvt.rn.f16x2.e4m3x2),
// activations f16 with a power-of-two scale per 64-k chunk, block scale applied to each 64-k partial
// sum in fp32. INT4: the mma multiplies the raw nibbles (as 1024 + n or 1024 + 16 n, exact in f16)
// against f16 activations under a power-of-two scale (per row for x, per 64-k chunk for h), one
// 32-k group per output column, and each group's fp32 partial becomes s (partial - offset) x inverse
// scale = sum((n - 8) s x): the weights enter exactly (q s in fp32, not rounded to bf16 as weight_at
// rounds them: <= 2^-9 relative per weight, more than the activations' own f16 rounding).
#include "backend/gpu/gpu_decode_tc.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "backend/gpu/gpu_decode_tc.cuh"
#include "backend/gpu/gpu_tensor_map.cuh"  // tensor_map_encoder, CUtensorMap
#include "core/status.h"

namespace mla::gpu {

using decode_tc::chunk_k;
using decode_tc::kActChunk;

namespace {

constexpr size_t align256(size_t n) { return (n + 255) / 256 * 256; }

// Scratch: x16 [tokens, hidden] u16 | x_aux [tokens, hidden / 32 + 1] f32 | h16 [pairs, inter] u16 |
// h_aux [pairs, inter / 32 x 2] f32, each piece 256-byte aligned (16-byte rows: hidden, inter % 64 ==
// 0). aux rows: FP8, the inverse activation scale of each 64-k chunk (the first k / 64 entries); INT4
// x, each 32-k group's offset and then the row's inverse scale (moe_tc_prep_i4_kernel); INT4 h, per
// 32-k group the pair (-offset x inverse scale, inverse scale) of its chunk (write_pass).
constexpr int64_t kAuxK = 32;     // k per aux entry at most (INT4 groups; FP8 uses one per 64)
constexpr int64_t kHAuxI4 = 2;    // INT4 h: floats per 32-k group
struct TcLayout {
  size_t x16 = 0, x_aux = 0, h16 = 0, h_aux = 0, k_part = 0, total = 0;
};
// The fused grid (moe_tc_fused_kernel) splits any format's gate/up tiles in two when they are fewer
// than two per CTA of the grid and every expert has one pass of columns (<= split_max_tokens); the
// k_part scratch holds this many tiles' halves.
constexpr int64_t kKSplitMaxTilesFused = 1024;
// Tokens of one pass of columns (= pass_cols below): a K split needs every expert to have one pass.
constexpr int64_t split_max_tokens(MoeFormat f) { return f == MoeFormat::FP8 ? 8 : 2; }
constexpr int64_t kKPartFloats = 2 * 4 * 128;  // per tile and half: kMats x 4 floats x kThreads
TcLayout tc_layout(MoeFormat format, int64_t tokens, int64_t pairs, int64_t hidden, int64_t inter) {
  TcLayout l;
  l.x16 = 0;
  l.x_aux = l.x16 + align256(size_t(tokens * hidden) * 2);
  l.h16 = l.x_aux + align256(size_t(tokens * (hidden / kAuxK + 1)) * 4);
  l.h_aux = l.h16 + align256(size_t(pairs * inter) * 2);
  l.k_part = l.h_aux + align256(size_t(pairs * (inter / kAuxK) * kHAuxI4) * 4);
  const int64_t split_tiles =
      tokens <= split_max_tokens(format) ? std::min(kKSplitMaxTilesFused, pairs * (inter / kActChunk)) : 0;
  l.total = l.k_part + align256(size_t(split_tiles * 2 * kKPartFloats) * 4);
  return l;
}

}  // namespace

bool moe_tc_shape_ok(MoeFormat format, int64_t hidden, int64_t inter) {
  if (format != MoeFormat::FP8 && format != MoeFormat::I4_BF16) return false;
  const int64_t k = chunk_k(format);
  return hidden > 0 && inter > 0 && hidden % k == 0 && inter % k == 0 && hidden / kActChunk <= 65535 &&
         inter / kActChunk <= 65535;
}

size_t moe_tc_scratch_bytes(MoeFormat format, int64_t tokens, int64_t pairs, int64_t hidden, int64_t inter) {
  return tc_layout(format, tokens, pairs, hidden, inter).total;
}

#if MLA_GPU_CUDA

namespace {

// ---- napkin math (DeepSeek-V3 expert: gate/up [2048, 7168], down [7168, 2048]; H200) ---------------
// Bytes per expert: FP8 3 x 14.68 MB data + 3 x 3.5 KB scales = 44.05 MB; INT4 3 x (7.34 MB packed +
// 0.92 MB bf16 scales) = 24.8 MB. Batch 1 = 8 experts: FP8 352 MB = 82 us at 4.3 TB/s.
// Lane instructions per weight byte (issue budget at 3 TB/s on 132 SMs x 128 lanes x ~1.75 GHz:
// ~10 per byte):
//   FP8, per 16-byte load: 8 cvt + 2 mma + 3 scale FFMA/FMUL + the load + ~1 shared B / inv / scale
//        load ~= 15 per 16 B ~= 1 per byte (the fp32 decode kernel: ~5);
//   INT4, per 8 nibbles: 1 shift + 4 lop3 as f16x2 (int4x8_magic_f16x2; gate/up since 2026-12-03,
//        down since 2026-12-06: before, 3 shifts + 4 lop3 as bf16x2 128 + n against bf16 h), + mma,
//        loads and per chunk 8 FFMA (offset and scale of 4 group partials) ~= 2 per byte (the fp32
//        kernel: ~9). Until 2026-12-03 each nibble pair also took 2 bf16x2 fma (q = n - 8, then bf16(q s)
//        before the mma, because one mma step spans the 4 t-lanes' different 32-groups): ~4.3 per
//        byte, and ncu (H200) showed the batch-1 gate/up pass issue-bound at 3.0 lane instructions per
//        weight, 45% of copy bandwidth. Now each group has its own output column (B below), so the
//        scale moves behind the mma.
// In flight: a warp issues kU chunks x kMats matrices x 2 rows x 16 B per lane before consuming any
// (gate/up 4 x 2 x 2, down 8 x 1 x 2 = 256 B per lane, 8 KB per warp). At batch 1 gate/up runs
// 8 experts x 32 CTAs = 256 CTAs (~2 per SM, 64 KB per SM in flight), down 8 x 112 = 896 CTAs;
// ~40-64 KB per SM (4.3 TB/s x ~1.5 us / 132 SMs) saturates HBM.
constexpr int kWarps = 4, kThreads = kWarps * 32;  // CUDA-only file: mma.sync warps are 32 lanes
constexpr int kTileM = 16;                          // weight rows per warp (one m16 tile)
constexpr int kCtaRows = kWarps * kTileM;           // 64 = kActChunk: a gate/up CTA owns one h chunk
constexpr int kCols = 8;                            // mma n: FP8 token columns per pass
constexpr int kI4Pass = 2;                          // INT4 tokens per pass: 2 tokens x 4 group columns
// Token columns per pass of the expert kernel (its smem staging is sized for this many).
constexpr int pass_cols(MoeFormat f) { return f == MoeFormat::FP8 ? kCols : kI4Pass; }
static_assert(kCtaRows == kActChunk, "the FP8 h scale chunk is one gate/up CTA's rows");
static_assert(split_max_tokens(MoeFormat::FP8) == pass_cols(MoeFormat::FP8) &&
                  split_max_tokens(MoeFormat::I4_BF16) == pass_cols(MoeFormat::I4_BF16) &&
                  kKPartFloats == 2 * 4 * kThreads,
              "K split bookkeeping");
static_assert(kWarpSize == 32, "mma.sync fragments assume 32-lane warps");

// 16-bit activation rows the B fragments read, and per row the aux values: FP8, the inverse
// power-of-two scale of each 64-k chunk (true activation = stored value x inv); INT4, per 32-k group
// the offset that int4x8_magic_f16x2's 1024 bias adds to its partial (x: then the row's inverse
// scale; h: each group as (-offset x inv, inv) of its 64-k chunk).
struct TcAct {
  const uint16_t* data;  // f16 [rows, k]; INT4: odd k hold value / 16, permuted per 8-group (act_pos)
  int64_t stride;        // elements per row (a multiple of 8: rows are 16-byte aligned)
  const float* aux;      // FP8: [rows, k / 64]; INT4 x: [rows, k / 32 + 1]; INT4 h: [rows, k / 32 x 2]
  int64_t aux_stride;
};
struct TcOut {
  uint16_t* h;          // gate/up: [pairs, inter] by sorted position, 16-bit as TcAct
  int64_t h_stride;
  float* h_aux;         // gate/up: [pairs, inter / 64] FP8 inverse scales or [pairs, inter / 32 x 2] INT4 pairs
  int64_t h_aux_stride;
  float* y;             // down: [pairs, hidden] by pair index
  int64_t y_stride;
  float* k_part;        // gate/up K split: [tiles][2 halves][kMats * 4][kThreads] partial sums
  unsigned* k_tickets;  // gate/up K split: [tiles] counters, zero between calls (left zero)
};

using namespace decode_tc;  // act_pos_i4, pow2_scale, f16_bits, word_of, fp8x2_to_f16x2, int4x8_magic_f16x2

// ---- prep: x rows -> 16-bit B rows ---------------------------------------------------------------
// FP8: grid (ceil(k / 64 / kWarps), rows); one warp per 64-element chunk, 2 elements per lane. ~us.
// Writes the aux row too: the chunk's inverse scale.
__global__ void __launch_bounds__(kThreads) moe_tc_prep_fp8_kernel(const float* __restrict__ x, int64_t x_stride,
                                                             int64_t k_dim, uint16_t* __restrict__ out,
                                                             int64_t out_stride, float* __restrict__ aux,
                                                             int64_t aux_stride) {
  pdl_enter();  // launched with PDL (launch_maybe_pdl)
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int64_t c = int64_t(blockIdx.x) * kWarps + warp;
  if (c * kActChunk >= k_dim) return;  // whole warps; no barrier below
  const int64_t row = blockIdx.y, k = c * kActChunk + 2 * lane;
  const float v0 = x[row * x_stride + k], v1 = x[row * x_stride + k + 1];
  uint16_t* o = out + row * out_stride;
  const float m = warp_max(fmaxf(fabsf(v0), fabsf(v1)));
  float scale, iv;
  pow2_scale(m, scale, iv);
  o[k] = f16_bits(v0 * scale);
  o[k + 1] = f16_bits(v1 * scale);
  if (lane == 0) aux[row * aux_stride + c] = iv;
}

// INT4 gate/up activations (x) as f16 B rows for int4x8_magic_f16x2's pairs. y = f16(x scale), one
// power-of-two scale per row (max |y| in [2^14, 2^15): f16 keeps 11 bits down to 2^-28 of the row's
// max); odd k hold y / 16 (exact), because their A halves carry 1024 + 16 n; stored at act_pos_i4(k).
// The mma's partial of a group is then sum((n - 8) y) + 1032 sum_even(y) + 72 sum_odd(y): aux row =
// that offset per 32-group (fixed-order warp sum), then 1 / scale. Grid (ceil(k / kPrepI4Slice),
// rows): every CTA finds the row's max itself (the row is ~28 KB, L2-resident after the first CTA)
// and converts its slice, so a batch-1 row is not one CTA's serial loop.
constexpr int kPrepI4Slice = 1024;
__global__ void __launch_bounds__(256) moe_tc_prep_i4_kernel(const float* __restrict__ x, int64_t x_stride, int64_t k_dim,
                                                             uint16_t* __restrict__ out, int64_t out_stride,
                                                             float* __restrict__ aux, int64_t aux_stride) {
  pdl_enter();  // launched with PDL (launch_maybe_pdl)
  __shared__ float red[256 / 32];
  const float* xr = x + int64_t(blockIdx.y) * x_stride;
  float amax = 0.0f;
  constexpr int kLoads = 16;  // independent loads per round trip (DeepSeek-V3's 7168: two rounds)
  for (int64_t k0 = threadIdx.x; k0 < k_dim; k0 += 256 * kLoads) {
    float v[kLoads];
#pragma unroll
    for (int j = 0; j < kLoads; ++j) v[j] = k0 + 256 * j < k_dim ? fabsf(xr[k0 + 256 * j]) : 0.0f;
#pragma unroll
    for (int j = 0; j < kLoads; ++j) amax = fmaxf(amax, v[j]);
  }
  amax = block_max(amax, red);
  float scale, inv;
  pow2_scale(amax, scale, inv);
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  uint16_t* o = out + int64_t(blockIdx.y) * out_stride;
  float* a = aux + int64_t(blockIdx.y) * aux_stride;
  const int64_t slice_end = int64_t(blockIdx.x + 1) * kPrepI4Slice;
  const int64_t g_end = (slice_end < k_dim ? slice_end : k_dim) / 32;
#pragma unroll 4
  for (int64_t grp = int64_t(blockIdx.x) * (kPrepI4Slice / 32) + warp; grp < g_end; grp += 256 / 32) {
    const int64_t k = grp * 32 + lane;
    const float y = __half2float(__float2half_rn(xr[k] * scale));
    const bool odd = (k & 1) != 0;
    const uint16_t b = f16_bits(odd ? y * 0.0625f : y);
    o[act_pos_i4(k)] = b;
    const float off = odd ? 72.0f * 16.0f * __half2float(__ushort_as_half(b)) : 1032.0f * y;  // 16 b = y unless subnormal
    const float sum = warp_sum(off);
    if (lane == 0) a[grp] = sum;
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) a[k_dim / 32] = inv;
}

// ---- expert kernel --------------------------------------------------------------------------------
// Grid (expert slots, rows / 64, K halves): the CTA of slot j serves plan.active[j] (slots past the
// active count exit at once) and output rows [64 y, 64 y + 64); warp w owns the m16 tile at 64 y +
// 16 w, for gate and up together (kGateUp) or down. Columns: the expert's pairs in sorted order, 8
// (FP8) or 2 (INT4) at a time. z: the INT4 gate/up K split (gridDim.z = 2, one K half per CTA; else
// 1 and the CTA sums both halves apart, then adds them: the same bits).
//
// Fragment proof (PTX m16n8k16, g = lane / 4, t = lane % 4). mma computes D[m][n] += sum_kk A[m][kk]
// B[kk][n]; lane (g, t) supplies A[g | g+8][kk] and B[kk][g] for kk in K(t) = {2t, 2t+1, 2t+8, 2t+9}
// only. So any map kk -> actual k that depends on (t, step, kk) but not on g is a valid reordering
// of the dot product, provided A and B lanes with the same t use the same map. Ours: in chunk c,
// lane t's actual k are the 16-byte piece it loads, [c K + t K / 4, + K / 4) (K = chunk_k):
//   FP8 (16 k per lane, 4 steps): step s takes weight word s = k 4s..4s+3 of the piece; a0 = its low
//     two bytes (k 4s, 4s+1) = kk 2t, 2t+1; a2 = its high two (4s+2, 4s+3) = kk 2t+8, 2t+9; a1 / a3
//     the same of row g+8. B: the f16 row's piece is 8 words, word 2s = (4s, 4s+1) = b0, 2s+1 = b1.
//   INT4 (32 k per lane, 8 steps): step s = 2 w + h takes weight word w (k 8w..8w+7, nibble j = k
//     8w+j); a0 = nibbles (2h, 2h+4), a2 = (2h+1, 2h+5). B: act_pos stores the group as (x0, x4),
//     (x1, x5), (x2, x6), (x3, x7), so word 4w + 2h = (x_{2h}, x_{2h+4}) = b0 and word 4w+2h+1 = b1:
//     again step s reads B words 2s, 2s+1 of the piece.
// C: c0, c1 = D[g][2t, 2t+1], c2, c3 = D[g+8][2t, 2t+1]: rows row0 + g (+8), columns 2t (+1).
// Scales: FP8's 128x128 block is constant over the warp's 16 rows (row0 % 16 == 0) and a 64-k chunk,
// and the f16 activation scale is constant per (column, 64-k chunk), so a chunk's 4 steps go into a
// zeroed partial tmp and acc += tmp * (block scale x column inv).
// INT4 group columns: lane t's piece is exactly group 4c + t of its rows. Column n = 4 j + t' holds
// token j of the pass (j < 2) restricted to group slot t': lane (g, t) supplies B[kk][g] = the
// token's activation only when g % 4 == t, else 0. So D[m][n] = sum over kk in K(n % 4) = the 32 k of
// group 4c + n % 4 of token n / 4, and lane (g, t) ends a chunk holding token t / 2's partials of
// groups 4c + 2 (t % 2) and + 1 (c0, c1 for row g; c2, c3 for row g+8). A holds 1024 + n (even k)
// and 1024 + 16 n (odd k, whose B is the activation / 16), so each partial is sum((n - 8) y) +
// offset, offset = 1032 sum_even(y) + 72 sum_odd(y) (moe_tc_prep_i4_kernel's for x, write_pass's for
// h), and acc += s (partial - offset) per group; the inverse activation scale multiplies the sums
// (x: the row's, after the last chunk; h: its 64-k chunk's, per group); lanes t and t ^ 1 add their
// halves at the end. The offset cancels within one group's 32 terms (fp32, ~1e-5 relative to the
// partial, next to 2^-11 for the f16 activations).
//
// The B columns of a pass are copied into shared memory a window of chunks at a time (whole K when
// it fits kMoeStageBudget: DeepSeek-V3's experts up to batch 2), with their FP8 activation scales and the CTA's 128-row
// block scales, so the consume loop's only global loads are the streamed weights. (Reading them from
// L2 inside the loop, one dependent round trip per chunk, held the dense twin of this kernel at
// 50-60% of copy bandwidth; gpu_dense_tc.cu.) Both launches use programmatic dependent launch: the
// plan was complete before the preceding prep kernel started, so a CTA reads it and issues its
// first weight burst before pdl_wait; x16 / h16 are read only after it.
template <MoeFormat F, bool kGateUp> constexpr int moe_tc_burst() { return kGateUp ? 4 : 8; }
// INT4: the burst's two halves are refilled one at a time (each with the chunks a burst ahead as
// soon as it is consumed), so half the burst stays in flight during the other half's mma work.
// Same-process A/B (H200, 2026-12-03): INT4 +0.3-1.1 points at batch 1-8; FP8 -1.4 at batch 1,
// within noise elsewhere, so FP8 keeps whole bursts.
template <MoeFormat F> constexpr bool moe_tc_pipelined() { return F != MoeFormat::FP8; }
// The gate/up pass's K halves meet at chunk k_half (a multiple of the burst; from the shape only).
__host__ __device__ constexpr int64_t k_half(int64_t chunks, int burst) {
  return (chunks / 2 + burst - 1) / burst * burst < chunks ? (chunks / 2 + burst - 1) / burst * burst : chunks;
}

// Shared memory of one CTA for `window` chunks of `cols` columns: colmax [kWarps][kCols] f32 |
// B [cols][window K + 8] u16 (rows 16 bytes apart modulo 128) | aux [cols][window x aux_per_chunk]
// f32 (FP8: 1 inverse scale; INT4: 4 group offsets of x, 4 (offset, inverse scale) pairs of h) |
// block scales [2][window / 2 + 2] f32 (FP8).
constexpr int aux_per_chunk(MoeFormat f, bool gate_up) {
  return f == MoeFormat::FP8 ? 1 : gate_up ? 4 : 4 * int(kHAuxI4);
}
struct MoeStage {
  int row_u16;
  size_t b_off, inv_off, ws_off, bytes;
};
__host__ __device__ constexpr MoeStage moe_stage(MoeFormat f, bool gate_up, int window, int cols) {
  MoeStage l{};
  l.row_u16 = window * int(chunk_k(f)) + 8;
  l.b_off = size_t(kWarps) * kCols * 4;
  l.inv_off = l.b_off + size_t(cols) * size_t(l.row_u16) * 2;
  const bool fp8 = f == MoeFormat::FP8;
  l.ws_off = l.inv_off + size_t(cols) * size_t(window) * size_t(aux_per_chunk(f, gate_up)) * 4;
  l.bytes = l.ws_off + (fp8 ? size_t(2) * size_t(window / 2 + 2) * 4 : 0);
  return l;
}
constexpr size_t kMoeStageBudget = 32 * 1024;  // 3 CTAs per SM keep 96 KB; whole K up to batch 2

// One chunk's tensor-core work (fragment proof above). a: the lane's 16-byte weight pieces of rows
// g, g + 8 per matrix; b: its piece of the B column (from the staged rows); FP8: inv0 / inv1 the
// inverse activation scales of columns 2t, 2t + 1 and sw the matrices' block scales; INT4: sb the
// bf16 scale pairs of the lane's two groups and xs the token's sums of those groups' activations.
template <int kMats>
__device__ __forceinline__ void chunk_fp8(const uint4 (&a)[kMats][2], const uint4 (&b)[2], float inv0, float inv1,
                                          const float (&sw)[kMats], float (&acc)[kMats][4]) {
#pragma unroll
  for (int m = 0; m < kMats; ++m) {
    float tmp[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const uint32_t lo = word_of(a[m][0], s), hi = word_of(a[m][1], s);
      const uint32_t af[4] = {fp8x2_to_f16x2(lo), fp8x2_to_f16x2(hi), fp8x2_to_f16x2(lo >> 16),
                              fp8x2_to_f16x2(hi >> 16)};
      mma::mma_f16(tmp, af, word_of(b[(2 * s) / 4], (2 * s) % 4), word_of(b[(2 * s + 1) / 4], (2 * s + 1) % 4));
    }
    const float f0 = sw[m] * inv0, f1 = sw[m] * inv1;
    acc[m][0] = fmaf(tmp[0], f0, acc[m][0]);
    acc[m][1] = fmaf(tmp[1], f1, acc[m][1]);
    acc[m][2] = fmaf(tmp[2], f0, acc[m][2]);
    acc[m][3] = fmaf(tmp[3], f1, acc[m][3]);
  }
}
// f16 B (moe_tc_prep_i4_kernel's x or write_pass's h), A from int4x8_magic_f16x2; the lane's two
// groups' partials become fmaf(partial, f, o) with xo = (o, f) of the first group, then of the second:
// gate/up (-offset, 1) (its row's inverse scale comes after the sum), down (-offset x inv, inv) of
// the groups' 64-k chunk (fmaf(p, inv, -offset x inv) = (p - offset) x inv exactly: inv is a power of
// two).
template <int kMats>
__device__ __forceinline__ void chunk_i4(const uint4 (&a)[kMats][2], const uint32_t (&sb)[kMats][2], const uint4 (&b)[4],
                                         float4 xo, float (&acc)[kMats][4]) {
#pragma unroll
  for (int m = 0; m < kMats; ++m) {
    float tmp[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int wd = 0; wd < 4; ++wd) {
      uint32_t pl[4], ph[4];
      int4x8_magic_f16x2(word_of(a[m][0], wd), pl);
      int4x8_magic_f16x2(word_of(a[m][1], wd), ph);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int s = 2 * wd + h;
        const uint32_t b0 = word_of(b[(2 * s) / 4], (2 * s) % 4), b1 = word_of(b[(2 * s + 1) / 4], (2 * s + 1) % 4);
        const uint32_t af[4] = {pl[2 * h], ph[2 * h], pl[2 * h + 1], ph[2 * h + 1]};
        mma::mma_f16(tmp, af, b0, b1);
      }
    }
    const float p0 = fmaf(tmp[0], xo.y, xo.x), p1 = fmaf(tmp[1], xo.w, xo.z);
    const float p2 = fmaf(tmp[2], xo.y, xo.x), p3 = fmaf(tmp[3], xo.w, xo.z);
    const uint32_t sg = sb[m][0], sg8 = sb[m][1];
    acc[m][0] = fmaf(bf16_bits_to_f32(uint16_t(sg)), p0, acc[m][0]);
    acc[m][0] = fmaf(bf16_bits_to_f32(uint16_t(sg >> 16)), p1, acc[m][0]);
    acc[m][1] = fmaf(bf16_bits_to_f32(uint16_t(sg8)), p2, acc[m][1]);
    acc[m][1] = fmaf(bf16_bits_to_f32(uint16_t(sg8 >> 16)), p3, acc[m][1]);
  }
}

// Writes one pass's outputs (rows row0 + [0, 16) of warp `warp` in 64-row tile `tile`; columns p0 +
// [0, ncols) of the expert's sorted pairs). Called by every thread of the CTA (barriers inside).
template <MoeFormat F, bool kGateUp, int kMats>
__device__ __forceinline__ void write_pass(float (&acc)[kMats][4], const moe::Plan& plan, const TcOut& out, int p0,
                                           int ncols, int64_t row0, int tile, float (*colmax)[kCols]) {
  constexpr bool kFp8 = F == MoeFormat::FP8;
  constexpr int kPass = pass_cols(F);
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  if constexpr (kFp8) {
    // acc[m][i] is row row0 + g + 8 (i / 2), column 2t + i % 2 (valid when < ncols).
    if constexpr (kGateUp) {
      float hv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) hv[i] = acc[0][i] / (1.0f + expf(-acc[0][i])) * acc[1][i];  // silu(g) u
      // Per column max |h| over the CTA's 64 rows (= the down pass's 64-k chunk `tile`).
      float m0 = fmaxf(fabsf(hv[0]), fabsf(hv[2])), m1 = fmaxf(fabsf(hv[1]), fabsf(hv[3]));
#pragma unroll
      for (int off = 4; off < 32; off <<= 1) {  // across g (lane bits 2..4), same t
        m0 = fmaxf(m0, shfl_xor(m0, off));
        m1 = fmaxf(m1, shfl_xor(m1, off));
      }
      if (g == 0) {
        colmax[warp][2 * t] = m0;
        colmax[warp][2 * t + 1] = m1;
      }
      __syncthreads();
      float amax[2] = {colmax[0][2 * t], colmax[0][2 * t + 1]};
#pragma unroll
      for (int w = 1; w < kWarps; ++w)
#pragma unroll
        for (int j = 0; j < 2; ++j) amax[j] = fmaxf(amax[j], colmax[w][2 * t + j]);
      __syncthreads();  // colmax is rewritten by the next column group
      float scale[2], inv[2];
#pragma unroll
      for (int j = 0; j < 2; ++j) pow2_scale(amax[j], scale[j], inv[j]);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int col = 2 * t + i % 2;
        if (col < ncols) out.h[int64_t(p0 + col) * out.h_stride + row0 + g + 8 * (i / 2)] = f16_bits(hv[i] * scale[i % 2]);
      }
      if (warp == 0 && g == 0)
#pragma unroll
        for (int j = 0; j < 2; ++j)
          if (2 * t + j < ncols) out.h_aux[int64_t(p0 + 2 * t + j) * out.h_aux_stride + tile] = inv[j];
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int col = 2 * t + i % 2;
        if (col < ncols) out.y[int64_t(plan.sorted[p0 + col]) * out.y_stride + row0 + g + 8 * (i / 2)] = acc[0][i];
      }
    }
  } else {
    // Lanes t and t ^ 1 hold the two halves of token t / 2's groups; after the exchange acc[m][i] is
    // row row0 + g + 8 i of token `tok` (valid when tok < ncols), written by even t.
    const int tok = t >> 1;
#pragma unroll
    for (int m = 0; m < kMats; ++m)
#pragma unroll
      for (int i = 0; i < 2; ++i) acc[m][i] += shfl_xor(acc[m][i], 1);
    const bool writer = (t & 1) == 0 && tok < ncols;
    if constexpr (kGateUp) {
      // h = silu(g) u for the down pass's f16 B, as moe_tc_prep_i4_kernel writes x but with one
      // power-of-two scale per token and 64-k chunk (this CTA's 64 rows, which know their max): y =
      // f16(h scale) keeps 11 significant bits down to 2^-28 of the chunk's max (a chunk far below
      // its neighbours loses nothing), odd k hold y / 16, and each 32-group gets its offset (1032
      // sum_even(y) + 72 sum_odd(y)) as (-offset inv, inv) in h_aux. Fixed-order sums and maxima:
      // deterministic.
      float hr[2];
      float hmax = 0.0f;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        hr[i] = acc[0][i] / (1.0f + expf(-acc[0][i])) * acc[1][i];  // silu(g) u
        hmax = fmaxf(hmax, fabsf(hr[i]));
      }
#pragma unroll
      for (int off = 4; off < 32; off <<= 1) hmax = fmaxf(hmax, shfl_xor(hmax, off));  // across g, same t
      // colmax[w][j]: warp w's max of token j's rows, colmax[w][kPass + j]: its offset sum.
      if (g == 0 && (t & 1) == 0) colmax[warp][tok] = hmax;
      __syncthreads();
      float amax = colmax[0][tok];
#pragma unroll
      for (int w = 1; w < kWarps; ++w) amax = fmaxf(amax, colmax[w][tok]);
      float scale, inv;
      pow2_scale(amax, scale, inv);
      const bool odd = (g & 1) != 0;  // row row0 + g + 8 i has g's parity (row0 % 16 == 0)
      float off = 0.0f;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const float y = __half2float(__float2half_rn(hr[i] * scale));
        const uint16_t b = f16_bits(odd ? y * 0.0625f : y);
        if (writer) out.h[int64_t(p0 + tok) * out.h_stride + act_pos_i4(row0 + g + 8 * i)] = b;
        off += odd ? 72.0f * 16.0f * __half2float(__ushort_as_half(b)) : 1032.0f * y;  // 16 b = y unless subnormal
      }
      // The warp's 16 rows are half of 32-group 2 tile + q (warps 2q and 2q + 1).
#pragma unroll
      for (int o = 4; o < 32; o <<= 1) off += shfl_xor(off, o);  // across g, same t
      if (g == 0 && (t & 1) == 0) colmax[warp][kPass + tok] = off;
      __syncthreads();
      if (tid < 2 * kPass) {
        const int q = tid / kPass, j = tid % kPass;
        if (j < ncols) {
          float jmax = colmax[0][j];
#pragma unroll
          for (int w = 1; w < kWarps; ++w) jmax = fmaxf(jmax, colmax[w][j]);
          float jscale, jinv;
          pow2_scale(jmax, jscale, jinv);
          const float goff = colmax[2 * q][kPass + j] + colmax[2 * q + 1][kPass + j];
          float* dst = out.h_aux + int64_t(p0 + j) * out.h_aux_stride + kHAuxI4 * (2 * int64_t(tile) + q);
          dst[0] = -goff * jinv;
          dst[1] = jinv;
        }
      }
      __syncthreads();  // colmax is rewritten by the next pass
    } else if (writer) {
#pragma unroll
      for (int i = 0; i < 2; ++i) out.y[int64_t(plan.sorted[p0 + tok]) * out.y_stride + row0 + g + 8 * i] = acc[0][i];
    }
  }
}

// Copies window [w0, w_end) of the pass's B columns (and their aux values) into shared memory.
// Called by every thread; the caller brackets it with barriers. Down reads h with ld.cg: in the
// fused grid another CTA wrote it during this grid (an L1 line may hold a neighbour's stale bytes).
template <MoeFormat F, bool kGateUp>
__device__ __forceinline__ void stage_columns(const TcAct& act, const moe::Plan& plan, int top_k, int p0, int ncols,
                                              int64_t w0, int nwc, int window, const MoeStage& sl, uint16_t* s_b,
                                              float* s_inv) {
  constexpr int kChunkK = int(chunk_k(F)), kAux = aux_per_chunk(F, kGateUp);
  const int tid = int(threadIdx.x);
  // Activation row of column n: the token (gate/up: x16 rows) or the sorted position (down: h rows).
  auto act_row = [&](int n) -> int64_t { return kGateUp ? int64_t(plan.sorted[p0 + n] / top_k) : int64_t(p0 + n); };
  // Calls visit(b, n, j, act_row(n)) for (n, j) = (i / per, i % per), i = tid, tid + kThreads, ...
  // below ncols x per (per > 0: nwc >= 1, kAux >= 1), b counting 0 .. kBatch - 1 within each batch
  // of kBatch elements, and flush() after each batch: two divisions up front, then steps (i +
  // kThreads adds kThreads / per to n and kThreads % per to j, carrying once), and act_row once per
  // column the thread meets. This runs before each window's math, on its critical path; a runtime
  // division is ~20 dependent instructions.
  auto walk = [&]<int kBatch>(int per, auto&& visit, auto&& flush) {
    int n = tid / per, j = tid - n * per, row_n = -1;
    const int dn = kThreads / per, dj = kThreads - dn * per;
    int64_t row = 0;
    while (n < ncols) {
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        if (n >= ncols) break;
        if (n != row_n) {
          row = act_row(n);
          row_n = n;
        }
        visit(b, n, j, row);
        n += dn;
        j += dj;
        if (j >= per) {
          j -= per;
          ++n;
        }
      }
      flush();
    }
  };
  // The 16-bit rows by cp.async (L2 only, as h must be read: other CTAs of the fused grid write it),
  // all issued before any lands; then the aux values through registers, kAuxBatch loads in flight
  // at a time, while those copies fly. A loop of load-then-store waits out one L2 round trip per
  // element a thread stages (ptxas does not pipeline it: 4-5 round trips per gate/up item at batch
  // 1, before the item's math can start); this way the staging costs about one. H200 (session 28):
  // INT4 +1.6 / +2.1 / +3.0 / +3.0 points of copy bandwidth at batch 1 / 2 / 4 / 8, FP8 +0 to +1.
  walk.template operator()<1>(
      nwc * kChunkK / 8,
      [&](int, int n, int j, int64_t row) {  // uint4 of 16-bit activations per column
        mma::cp_async16(mma::smem_addr(s_b + n * sl.row_u16 + 8 * j), act.data + row * act.stride + w0 * kChunkK + 8 * j,
                        16);
      },
      [] {});
  mma::cp_async_commit();
  constexpr int kAuxBatch = 4;
  float v[kAuxBatch] = {};
  int at[kAuxBatch];  // s_inv index of v[b], -1 where the batch ended early
#pragma unroll
  for (int b = 0; b < kAuxBatch; ++b) at[b] = -1;
  walk.template operator()<kAuxBatch>(
      nwc * kAux,
      [&](int b, int n, int j, int64_t row) {
        const float* src = act.aux + row * act.aux_stride + w0 * kAux + j;
        v[b] = kGateUp ? *src : __ldcg(src);
        at[b] = n * window * kAux + j;
      },
      [&] {
#pragma unroll
        for (int b = 0; b < kAuxBatch; ++b) {
          if (at[b] >= 0) s_inv[at[b]] = v[b];
          at[b] = -1;
        }
      });
  mma::cp_async_wait_all();  // this thread's copies; the caller's barrier makes every thread's visible
}
// FP8: the block scales of window [w0, w_end) for the CTA's 128-row block (scale rows fp8_scale[m]).
template <int kMats>
__device__ __forceinline__ void stage_block_scales(const float* const (&fp8_scale)[kMats], int64_t w0, int64_t w_end,
                                                   int window, float* s_ws) {
  const int nb = int((w_end - 1) / 2 - w0 / 2 + 1);
  for (int i = int(threadIdx.x); i < kMats * nb; i += kThreads) {
    const int m = i >= nb ? 1 : 0;  // a select, not a dynamic index (which would put the pointers on the stack)
    s_ws[m * (window / 2 + 2) + i - m * nb] = (m ? fp8_scale[kMats - 1] : fp8_scale[0])[w0 / 2 + i - m * nb];
  }
}

// ---- per-warp weight ring (sm_90, copy engine) ----------------------------------------------------
// Why: the register bursts above hold at most 8 KB per warp in flight, and the 168-register cap of 3
// CTAs per SM is already reached (H200 INT4: 43-66% of copy bandwidth at batch 1-4, where Little's
// law asks for ~6-8.5 MB in flight, 48-64 KB per SM; performance.md, session 18). Here each warp
// streams its 16 rows through a ring of shared-memory stages that the copy engine fills, so the
// bytes in flight cost no registers: up to a warp's 18 KB ring. A stage is 2-D boxes of
// tensor maps (moe_tc_ring_maps): per matrix, 16 rows x 64 B per chunk of weights and 16 rows x 8 B
// per chunk of INT4 scales, completing on the stage's mbarrier. (One 1-D bulk copy per row instead,
// 64 copies per gate/up stage, read 40-47% of copy bandwidth at every batch on an H100: the copy
// engine's cost per copy, not the bytes, bounded it.)
// Each warp owns its ring and refills a stage as soon as it has read it, so no warp ever waits for
// another (the CTA's barriers stay those of the staging and the outputs). The fragments read from a
// stage are the same 16-byte pieces the bursts load, consumed in the same chunk order: the sums are
// bit-identical to the register path.
// Stage layout (per warp): weights [kMats][16 rows][kChunks x 64 B] | INT4 scales [kMats][16
// rows][kChunks x 8 B] (chunk j's 4 group scales at 8 j). A fragment load (8 lanes per 128-byte
// phase: rows 2q, 2q + 1, pieces t) meets a 2-way bank conflict (rows 128 or 256 B apart): ncu
// (H100, session 27) counts 43-45% of the kernel's shared wavefronts as excess, at 0.27-0.31
// instructions issued per cycle. Padding the rows would cost a third of the ring. Storing each
// stage chunk-major (a 16 x 64 B box per chunk, rows 64 B apart) removes the conflict and was timed
// on the H200 (session 28): the grid without copies got 3-7 points faster, the op 0.3-1.1 points
// slower (twice the boxes per stage), so the layout stays. One 3-D box per stage and matrix
// ({16 four-byte elements, rows, chunks}, strides {pitch, 64 B}) writes that layout in a single copy
// (the driver takes the 64-byte dim-2 stride): on an H100 (session 33) the grid without copies got
// 4% faster, the grid without arithmetic 0.4-1.7% slower (the copy engine then walks 64-byte
// rows), and the op lost 0.4-0.8 points on the whole card, 0.6-1.4 on the stand-in; not kept.
// Chunks per stage (ring_chunks, RingGeom::kChunks), two geometries chosen by shape (ring_wide):
// - wide (gate/up 4, down 8) where hidden % 512 == 0 and inter % 1024 == 0 (DeepSeek-V3, Kimi K2):
//   2 stages of 9 KB per warp for either kind, boxes of 16 x 256 B (gate/up) and 16 x 512 B (down)
//   plus their scales; a DeepSeek-V3 down item (16 KB per warp) is two stages of one weight box
//   and one scale box each.
// - narrow (gate/up 2, down 4) for the other shapes the rings take (hidden % 256, inter % 512: Kimi
//   Linear's 2304 x 1024): 4 stages of 4.5 KB for gate/up, 4 of 4.5 KB for down.
// What binds a short item is what its copies cost per byte, not the bytes in flight (a down item
// fits its warp's ring whole either way): each halving of the copies per byte gained, most where the
// bandwidth per SM is the H200's. INT4 % of copy at batch 1 / 2 / 4 / 8, DeepSeek-V3 shapes:
// - H100 (4-5 processes each): down 2 -> 4 chunks 76.5 / 86.4 / 93.0 / 95.9 -> 79.2 / 89.4 / 94.3 /
//   97.1 (session 29); gate/up 2 -> 4 chunks 79.2 -> 79.7 at batch 1, batch 8 -0.3 (session 30).
// - H100 held by MPS to 92 of its 132 SMs (the H200's copy bandwidth per SM; session 30, 4
//   processes each; it ranked session 28's three builds as the H200 did): narrow 74.5-75.0 / 84.4-
//   84.7 / 91.3-92.0 / 93.9-94.3; gate/up 4 77.0-77.1 / 85.7-85.9 / 92.4-92.6 / 94.5-94.6; wide
//   78.6-79.2 / 87.6-88.0 / 94.4-94.7 / 96.7-96.8.
// A tensor-map box row is at most 256 elements: the maps take 4-byte elements (kRingMapElem), so
// the 512-byte down boxes are 128 elements.
struct RingChunks {
  int gate_up, down;
  constexpr int of(bool gate_up_kind) const { return gate_up_kind ? gate_up : down; }
};
constexpr RingChunks kRingNarrow{2, 4}, kRingWide{4, 8};
constexpr RingChunks ring_chunks(bool wide) { return wide ? kRingWide : kRingNarrow; }
// Whether a shape's rings take the wide stages (the kernels' kWide, the maps' box widths): every K
// range a tile streams (the gate/up K halves: k_half rounds to 4 chunks) then starts and ends on
// a stage.
constexpr bool ring_wide(int64_t hidden, int64_t inter) {
  return hidden % (kRingWide.gate_up * chunk_k(MoeFormat::I4_BF16)) == 0 &&
         inter % (kRingWide.down * chunk_k(MoeFormat::I4_BF16)) == 0;
}
constexpr int kRingMapElem = 4;  // bytes per element of the ring's tensor maps (moe_tc_ring_maps)
constexpr int kRingWarpBytes = 18 * 1024;        // per warp: 72 KB per CTA, 2 CTAs per SM with the staging
constexpr int kRingMaxStages = 8;
template <MoeFormat F, int kMats, bool kWide> struct RingGeom {
  static constexpr int kChunks = ring_chunks(kWide).of(kMats == 2);
  static constexpr int kRowBytes = kChunks * 64;  // a row's bytes per stage (a chunk: 64 B of a row, either format)
  static constexpr int kScaleRowBytes = kChunks * 8;  // INT4: a row's 4 bf16 group scales per chunk
  static constexpr int kWBytes = kMats * kTileM * kRowBytes;
  static constexpr int kSBytes = F == MoeFormat::FP8 ? 0 : kMats * kTileM * kScaleRowBytes;
  static constexpr int kStageBytes = kWBytes + kSBytes;
  static constexpr int kStages =
      kRingWarpBytes / kStageBytes < kRingMaxStages ? kRingWarpBytes / kStageBytes : kRingMaxStages;
  static_assert(kStages >= 2 && kStageBytes % 16 == 0 && kMats * kTileM <= 32, "one copy per lane and stage");
};
// The ring needs whole narrow stages (every K range the tiles stream starts and ends on a stage:
// hidden a multiple of 256, inter of 512 for INT4); the maps need 16-byte aligned rows
// (moe_tc_ring_maps checks).
constexpr int64_t ring_k_multiple(MoeFormat f, bool gate_up) { return ring_chunks(false).of(gate_up) * chunk_k(f); }

struct WarpRing {
  const unsigned char* buf = nullptr;  // this warp's kRingWarpBytes (generic: the fragment loads)
  uint32_t buf_s = 0, bars = 0;        // shared addresses: the ring, the mbarrier of slot 0 (slots 8 B apart)
  uint32_t phase = 0;                  // bit s: parity of slot s's next phase (uniform per warp)
};
// Called once per CTA by every thread, before any copy; `bars` has kWarps x kRingMaxStages entries.
__device__ __forceinline__ WarpRing ring_init(unsigned char* ring_smem, uint64_t* bars) {
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  WarpRing r;
  r.buf = ring_smem + warp * kRingWarpBytes;
  r.buf_s = mma::smem_addr(r.buf);
  r.bars = mma::smem_addr(bars + warp * kRingMaxStages);
  if (lane < kRingMaxStages) mma::mbar_init(r.bars + 8 * uint32_t(lane), 1);  // lane 0's arrive.expect_tx
  mma::mbar_init_fence();
  __syncwarp();
  return r;
}

// Fused grid only: the expert-slot counters that order a slot's down tiles after its gate/up tiles.
struct TcDeps {
  const unsigned* h_ready = nullptr;  // down: wait until *h_ready >= h_tiles before reading h
  unsigned h_tiles = 0;
  unsigned* h_written = nullptr;      // gate/up: +1 once this tile's h is written and visible
};

// ld.acquire at GPU scope: a counter another CTA of this grid raises with a release.
__device__ __forceinline__ unsigned ld_acquire_gpu(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
// One thread's release (and acquire) at GPU scope for its whole CTA, after a barrier: the CTA's
// stores before that barrier are ordered before the counter's update (release is cumulative over
// what the barrier ordered before it), and for the acq_rel add, the loads after the next barrier
// after the other CTAs' released stores (those loads go to L2: __ldcg). One fence for the CTA
// instead of __threadfence in every thread (fence.sc.gpu: MEMBAR.SC.GPU and an L1 invalidation per
// thread in the SASS): INT4 +0.6 points at batch 1-2 and the math-only row +3.5 (H100, session 27).
__device__ __forceinline__ void red_release_gpu(unsigned* p, unsigned v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned atom_add_acq_rel_gpu(unsigned* p, unsigned v) {
  unsigned old;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;\n" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}

// One work item of either grid: (expert slot, 64-row tile, K half z of kz) of gate/up, or (slot,
// `tiles` consecutive 64-row tiles from tile_y) of down (tiles > 1: the fused ring grid only,
// fused_down_tiles), over all of the expert's passes of columns. Called by every thread of the CTA
// with uniform arguments; the caller's next barrier frees the shared memory for another item.
// `first`: the CTA's first item, which waits for the previous grid (pdl_wait) once its first weight
// burst is issued.
// The structs come by value: a reference to a kernel parameter can make ptxas copy it to the stack.
// kRing: the weights stream through the warp's ring (WarpRing, ring_k_multiple), else through
// register bursts. kProbe (ring only; set_moe_tc_probe; outputs are garbage): kProbeNoMath, a warp
// waits for each stage and refills it without reading it, so the item streams its bytes with no
// arithmetic; kProbeNoCopy, no stage is copied or waited for and the math reads whatever the ring
// holds, so the item costs its arithmetic and structure with no weight bytes.
constexpr int kProbeNoMath = 1, kProbeNoCopy = 2;
template <MoeFormat F, bool kGateUp, bool kRing, bool kWide, int kProbe = 0>
__device__ __forceinline__ void moe_tc_tile(const DeviceExpert* __restrict__ table, moe::Plan plan, TcAct act,
                                            int top_k, int64_t k_dim, TcOut out, int window, int stage_cols, int slot,
                                            int tile_y, int tiles, int z, int kz, int tiles_per_slot, bool first,
                                            TcDeps deps, const MoeRingMap* __restrict__ ring_maps, WarpRing& ring) {
  constexpr bool kFp8 = F == MoeFormat::FP8;
  constexpr int kMats = kGateUp ? 2 : 1;
  constexpr int kU = moe_tc_burst<F, kGateUp>();  // chunks whose weight loads are in flight together
  constexpr bool kPipe = moe_tc_pipelined<F>();
  constexpr int kChunkK = int(chunk_k(F));
  constexpr int kBVec = kChunkK / 32;          // uint4 of 16-bit activations per lane per chunk
  constexpr int kRowUnit = kFp8 ? 1 : 4;       // bytes per data_stride unit
  constexpr int kAux = aux_per_chunk(F, kGateUp);
  extern __shared__ __align__(128) unsigned char moe_tc_smem[];
  __shared__ unsigned s_klast;  // K split: this CTA is its tile's second to finish
  const MoeStage sl = moe_stage(F, kGateUp, window, stage_cols);
  float (*colmax)[kCols] = reinterpret_cast<float (*)[kCols]>(moe_tc_smem);
  uint16_t* s_b = reinterpret_cast<uint16_t*>(moe_tc_smem + sl.b_off);
  [[maybe_unused]] float* s_inv = reinterpret_cast<float*>(moe_tc_smem + sl.inv_off);
  [[maybe_unused]] float* s_ws = reinterpret_cast<float*>(moe_tc_smem + sl.ws_off);

  // The CTA's matrices (gate, up or down of its expert), columns and K chunks.
  const int e = plan.active[slot];
  const DeviceExpert& ex = table[e];
  const DeviceWeight* wsel[kMats];
  wsel[0] = kGateUp ? &ex.gate : &ex.down;
  if constexpr (kMats > 1) wsel[1] = &ex.up;
  const int begin = plan.slot_offsets ? plan.slot_offsets[slot] : plan.offsets[e];
  const int end = plan.slot_offsets ? plan.slot_offsets[slot + 1] : plan.offsets[e + 1];
  // Passes of stage_cols = min(tokens, pass_cols(F)) columns: the staging holds that many. An expert has at
  // most `tokens` pairs unless a token names it twice (ids the routing never produces; the op then
  // sums both, as the CPU does): it then takes more passes than the host planned for. A K split needs
  // one pass, so such an expert's tile is computed whole by its z = 0 CTA (the same bits: the two K
  // halves are summed apart either way), and the z = 1 CTA leaves at once (after the wait that the
  // CTA's first item owes the previous grid).
  if (kz == 2 && end - begin > stage_cols) {
    if (z == 1) {
      if (first) {
        pdl_wait();
        pdl_trigger();
      }
      return;
    }
    kz = 1;
  }
  const int64_t c_end = k_dim / kChunkK;
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  // Rows of the warp's m16 tile in the item's first 64-row tile (`tiles` > 1: ring only, one tile
  // after another through the same ring, row0 moving on by 64 per tile).
  const int64_t row_base = int64_t(tile_y) * kCtaRows + warp * kTileM;
  int64_t row0 = row_base;
  [[maybe_unused]] const int tok = t >> 1;  // INT4: the pass token of this lane's outputs (group columns)

  const uint4* arow[kMats][2];                         // lane's piece of chunk 0, rows row0 + g (+8)
  [[maybe_unused]] const float* fp8_scale[kMats];       // FP8: the 128-row block's scale row
  [[maybe_unused]] const uint16_t* i4_scale[kMats][2];  // INT4: groups 2 (t % 2), + 1 of rows row0 + g (+8)
#pragma unroll
  for (int m = 0; m < kMats; ++m) {
    const DeviceWeight& w = *wsel[m];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t r = row0 + g + 8 * h;
      arow[m][h] = reinterpret_cast<const uint4*>(static_cast<const char*>(w.data) + r * w.data_stride * kRowUnit) + t;
      if constexpr (!kFp8) i4_scale[m][h] = static_cast<const uint16_t*>(w.scale) + r * w.scale_stride + 2 * (t & 1);
    }
    if constexpr (kFp8) fp8_scale[m] = static_cast<const float*>(w.scale) + (row0 / 128) * w.scale_stride;
  }

  uint4 a[kU][kMats][2];
  [[maybe_unused]] uint32_t sbits[kU][kMats][2];  // INT4: bf16 scales of the lane's 2 output groups (low: first)
  // Issues the weight loads of chunks c0 + u below `lim` into slots u in [lo, hi) (constants after
  // unrolling), all before any is consumed.
  auto issue_slots = [&](int64_t c0, int64_t lim, int lo, int hi) {
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      if (u < lo || u >= hi) continue;
      const int64_t c = c0 + u;
#pragma unroll
      for (int m = 0; m < kMats; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          a[u][m][h] = c < lim ? __ldcs(arow[m][h] + 4 * c) : make_uint4(0u, 0u, 0u, 0u);
          // 4-byte aligned: MoeExpertTable::scale_pairs.
          if constexpr (!kFp8) sbits[u][m][h] = c < lim ? *reinterpret_cast<const uint32_t*>(i4_scale[m][h] + 4 * c) : 0u;
        }
    }
  };
  auto issue = [&](int64_t c0, int64_t lim) { issue_slots(c0, lim, 0, kU); };
  // The weights are constant and the plan was complete before the prep kernel started.
  // K halves (gate/up): chunks [0, c_mid) and [c_mid, c_end) are summed apart and added at the end,
  // by this CTA or, with a K split (gridDim.z == 2: CTA z takes half z), by the tile's last CTA: the
  // same sums either way, so a token's outputs do not depend on the split (nor on the batch).
  const int64_t c_mid = kGateUp ? k_half(c_end, kU) : c_end;
  const int64_t c_lo = kz == 2 && z == 1 ? c_mid : 0, c_hi = kz == 2 && z == 0 ? c_mid : c_end;
  // Ring: the item's stages (each pass of columns streams [c_lo, c_hi) again, RG::kChunks chunks per
  // stage; the K halves and windows start and end on stages: ring_k_multiple) and the copies of one
  // stage: lane m < kMats copies the warp's 16 rows of matrix m (one 2-D box of 16 x RG::kRowBytes),
  // lane kMats + m their INT4 scales (16 x RG::kScaleRowBytes).
  using RG = RingGeom<F, kMats, kWide>;
  [[maybe_unused]] const MoeRingMap* ring_map = nullptr;  // this lane's map (copying lanes)
  [[maybe_unused]] uint32_t ring_dst = 0;                 // and its box's offset in a stage
  [[maybe_unused]] int ring_x_per_chunk = 0;              // box x per chunk in map elements (64 B or 8 B)
  [[maybe_unused]] uint64_t policy = 0;
  [[maybe_unused]] int ring_stages = 0, ring_per_tile = 1;
  if constexpr (kRing) {
    const int m = lane < kMats ? lane : lane - kMats;
    const int data_map = kGateUp ? m : 2;
    if (lane < kMats) {
      ring_map = ring_maps + int64_t(e) * kMoeRingMapsPerExpert + data_map;
      ring_dst = uint32_t(m * kTileM * RG::kRowBytes);
      ring_x_per_chunk = 64 / kRingMapElem;
    } else if (!kFp8 && lane < 2 * kMats) {
      ring_map = ring_maps + int64_t(e) * kMoeRingMapsPerExpert + 3 + data_map;
      ring_dst = uint32_t(RG::kWBytes + m * kTileM * RG::kScaleRowBytes);
      ring_x_per_chunk = 8 / kRingMapElem;
    }
    policy = mma::l2_evict_first_policy();
    ring_per_tile = ((end - begin + stage_cols - 1) / stage_cols) * int((c_hi - c_lo) / RG::kChunks);
    ring_stages = ring_per_tile * tiles;
  }
  // Issues the item's next stage into its slot (uniform per warp; nothing past the item's last
  // stage). Stage q covers chunks c_lo + (q % stages per pass) x RG::kChunks of tile q /
  // ring_per_tile; the issuer steps through them in order (stages are issued in q order), so no
  // division runs per stage.
  [[maybe_unused]] int ring_next = 0, ring_in_tile = 0, ring_c = int(c_lo);
  [[maybe_unused]] int64_t ring_row = row_base;
  [[maybe_unused]] auto ring_issue = [&]() {
    if (kProbe == kProbeNoCopy || ring_next >= ring_stages) return;
    const int st = ring_next % RG::kStages;
    const uint32_t bar = ring.bars + 8 * uint32_t(st);
    mma::mbar_arrive_expect_tx_if(lane == 0, bar, RG::kStageBytes);
    if (ring_map != nullptr)
      mma::tensor_copy_2d_g2s(ring.buf_s + uint32_t(st * RG::kStageBytes) + ring_dst, ring_map,
                              ring_c * ring_x_per_chunk, int(ring_row), bar, policy);
    ++ring_next;
    ring_c += RG::kChunks;
    if (ring_c == int(c_hi)) ring_c = int(c_lo);  // the next pass of columns (or tile) starts over
    if (++ring_in_tile == ring_per_tile) {
      ring_in_tile = 0;
      ring_row += kCtaRows;
    }
  };
  [[maybe_unused]] int ring_q = 0;  // the item's next stage to consume
  if constexpr (kRing) {
    for (int q = 0; q < RG::kStages; ++q) ring_issue();
  } else {
    issue(c_lo, min(c_lo < c_mid ? min(c_mid, c_hi) : c_hi, c_lo + int64_t(window)));
  }
  if (first) {
    pdl_wait();
    pdl_trigger();  // the next grid (down after gate/up, or the combine) may start issuing its own loads
  }
  if constexpr (!kGateUp) {
    if (deps.h_ready != nullptr) {  // fused grid: h of this slot is complete once all its gate/up tiles are
      if (tid == 0) {
        // The producers never wait, so this ends; a broken invariant traps (~10 s) rather than hangs.
        for (unsigned spins = 0; ld_acquire_gpu(deps.h_ready) < deps.h_tiles; ++spins) {
          if (spins == (1u << 27)) __trap();
          __nanosleep(64);
        }
      }
      __syncthreads();
    }
  }
  bool burst_ready = true;

  for (int sub = 0; sub < tiles; ++sub) {  // the item's 64-row tiles, in the ring's stage order
    row0 = row_base + int64_t(sub) * kCtaRows;
    for (int p0 = begin; p0 < end; p0 += stage_cols) {  // uniform per CTA (same expert)
      const int ncols = min(stage_cols, end - p0);
      // FP8: the C fragment; INT4: [0], [1] = rows g, g + 8 of token t / 2 (half its groups). acc_lo:
      // the first K half's sums once the second half starts.
      float acc[kMats][4], acc_lo[kMats][4];
#pragma unroll
      for (int m = 0; m < kMats; ++m)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[m][i] = acc_lo[m][i] = 0.0f;
      // INT4 gate/up: 1 / the f16 scale of this lane's token (moe_tc_prep_i4_kernel), applied at the end.
      [[maybe_unused]] float xinv = 1.0f;
      if constexpr (kGateUp && !kFp8)
        if (tok < ncols) xinv = act.aux[int64_t(plan.sorted[p0 + tok] / top_k) * act.aux_stride + k_dim / kAuxK];

      for (int half = 0; half < (kGateUp ? 2 : 1); ++half) {  // down: one range, [0, c_end)
        const int64_t r0 = half == 0 ? c_lo : max(c_lo, c_mid), r1 = half == 0 ? min(c_hi, c_mid) : c_hi;
        if (half == 1) {
#pragma unroll
          for (int m = 0; m < kMats; ++m)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              acc_lo[m][i] = acc[m][i];
              acc[m][i] = 0.0f;
            }
        }
        for (int64_t w0 = r0; w0 < r1; w0 += window) {
          const int64_t w_end = min(r1, w0 + int64_t(window));
          const int nwc = int(w_end - w0);
          __syncthreads();  // the previous window's (or column group's) readers are done
          stage_columns<F, kGateUp>(act, plan, top_k, p0, ncols, w0, nwc, window, sl, s_b, s_inv);
          if constexpr (kFp8) stage_block_scales<kMats>(fp8_scale, w0, w_end, window, s_ws);
          __syncthreads();
          // FP8: lane (g, t) supplies column g's activations; INT4: token g / 4's, in group column g only
          // when g % 4 == t (group columns, above).
          const int brow = kFp8 ? g : g >> 2;
          const bool b_live = kFp8 ? g < ncols : ((g & 3) == t && brow < ncols);
          const uint16_t* srow = s_b + brow * sl.row_u16 + t * (kChunkK / 4);
          // INT4: the aux values of this lane's two output groups (2 (t % 2), + 1 of each chunk).
          [[maybe_unused]] const float* s_gsum = s_inv + tok * window * kAux + (kAux / 2) * (t & 1);
          // Chunk c from the lane's weight pieces av and INT4 scale pairs sv.
          auto chunk_at = [&](const uint4 (&av)[kMats][2], const uint32_t (&sv)[kMats][2], const int64_t c) {
            const int lc = int(c - w0);
            uint4 b[kBVec];
#pragma unroll
            for (int i = 0; i < kBVec; ++i)
              b[i] = b_live ? *reinterpret_cast<const uint4*>(srow + lc * kChunkK + 8 * i) : make_uint4(0u, 0u, 0u, 0u);
            if constexpr (kFp8) {
              const float inv0 = 2 * t < ncols ? s_inv[(2 * t) * window + lc] : 0.0f;
              const float inv1 = 2 * t + 1 < ncols ? s_inv[(2 * t + 1) * window + lc] : 0.0f;
              float sw[kMats];
#pragma unroll
              for (int m = 0; m < kMats; ++m)
                sw[m] = s_ws[m * (window / 2 + 2) + int(c / 2 - w0 / 2)];  // k block (64 c) / 128
              chunk_fp8<kMats>(av, b, inv0, inv1, sw, acc);
            } else {
              // chunk_i4's (o, f) of this lane's two groups for token `tok` (0 past the pass's columns).
              float4 xo = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
              if (tok < ncols) {
                if constexpr (kGateUp) {
                  const float2 off = *reinterpret_cast<const float2*>(s_gsum + lc * kAux);
                  xo = make_float4(-off.x, 1.0f, -off.y, 1.0f);
                } else {
                  xo = *reinterpret_cast<const float4*>(s_gsum + lc * kAux);
                }
              }
              chunk_i4<kMats>(av, sv, b, xo, acc);
            }
          };
          if constexpr (kRing) {
            for (int64_t c0 = w0; c0 < w_end; c0 += RG::kChunks) {
              const int st = ring_q % RG::kStages;
              if constexpr (kProbe != kProbeNoCopy) {
                mma::mbar_wait(ring.bars + 8 * uint32_t(st), (ring.phase >> st) & 1u);
                ring.phase ^= 1u << st;
              }
              const unsigned char* sp = ring.buf + st * RG::kStageBytes;
#pragma unroll
              for (int j = 0; j < (kProbe == kProbeNoMath ? 0 : RG::kChunks); ++j) {
                uint4 av[kMats][2];
                uint32_t sv[kMats][2];
#pragma unroll
                for (int m = 0; m < kMats; ++m)
#pragma unroll
                  for (int h = 0; h < 2; ++h) {
                    const int row = m * kTileM + g + 8 * h;
                    av[m][h] = *reinterpret_cast<const uint4*>(sp + row * RG::kRowBytes + j * 64 + t * 16);
                    const unsigned char* sg = sp + RG::kWBytes + row * RG::kScaleRowBytes + j * 8 + 4 * (t & 1);
                    sv[m][h] = kFp8 ? 0u : *reinterpret_cast<const uint32_t*>(sg);
                  }
                chunk_at(av, sv, c0 + j);
              }
              __syncwarp();
              mma::fence_proxy_async();  // this warp's reads of the stage come before the copy engine's writes
              ring_issue();  // stage ring_q + kStages, into the slot just read
              ++ring_q;
            }
          } else {
            for (int64_t c0 = w0; c0 < w_end; c0 += kU) {
              if (!burst_ready) issue(c0, w_end);
              burst_ready = false;
              // Chunk u of the burst; bursts inside the window (all but a window's last) run the chunks
              // branch-free, so one chunk's loads and converts overlap the previous chunk's mma chain
              // (u is a constant after unrolling: a[u] and sbits[u] stay in registers).
              auto chunk = [&](const int u) { chunk_at(a[u], sbits[u], c0 + u); };
              if constexpr (kPipe) {
                // Two stages of kU / 2 chunks: each refilled with the chunks kU ahead as soon as it is
                // consumed, so the other stage's loads stay in flight during the mma work.
                constexpr int kH = kU / 2;
                const bool full = c0 + kU <= w_end;
#pragma unroll
                for (int u = 0; u < kH; ++u)
                  if (full || c0 + u < w_end) chunk(u);
                issue_slots(c0 + kU, w_end, 0, kH);
#pragma unroll
                for (int u = kH; u < kU; ++u)
                  if (full || c0 + u < w_end) chunk(u);
                issue_slots(c0 + kU, w_end, kH, kU);
                burst_ready = true;
              } else if (c0 + kU <= w_end) {
#pragma unroll
                for (int u = 0; u < kU; ++u) chunk(u);
              } else {
#pragma unroll
                for (int u = 0; u < kU; ++u)
                  if (c0 + u < w_end) chunk(u);  // warp-uniform
              }
            }
            if constexpr (kPipe) burst_ready = false;  // the refills past the window were empty
          }
        }
      }
      if (kz == 2) {
        // K split (one pass only: see the check at the top): publish this half's sums, and the tile's
        // second CTA to arrive adds them in half order.
        const size_t tile_id = size_t(slot) * size_t(tiles_per_slot) + size_t(tile_y);
        float* mine = out.k_part + (tile_id * 2 + size_t(z)) * (kMats * 4 * kThreads) + tid;
#pragma unroll
        for (int m = 0; m < kMats; ++m)
#pragma unroll
          for (int i = 0; i < 4; ++i) mine[(m * 4 + i) * kThreads] = z == 0 ? acc_lo[m][i] : acc[m][i];
        __syncthreads();  // every thread's partial, then the ticket (released and acquired by thread 0)
        if (tid == 0) s_klast = atom_add_acq_rel_gpu(out.k_tickets + tile_id, 1u) == 1u ? 1u : 0u;
        __syncthreads();
        if (s_klast == 0u) return;  // uniform: the other half's CTA finishes the tile
        if (tid == 0) out.k_tickets[tile_id] = 0u;  // both CTAs took theirs: zero for the next call
        const float* other = out.k_part + (tile_id * 2 + size_t(z ^ 1)) * (kMats * 4 * kThreads) + tid;
#pragma unroll
        for (int m = 0; m < kMats; ++m)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const float v = __ldcg(other + (m * 4 + i) * kThreads);
            if (z == 0) acc[m][i] = v;
            else acc_lo[m][i] = v;
          }
      }
      if constexpr (kGateUp) {
#pragma unroll
        for (int m = 0; m < kMats; ++m)
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[m][i] = (acc_lo[m][i] + acc[m][i]) * xinv;
      }
      write_pass<F, kGateUp, kMats>(acc, plan, out, p0, ncols, row0, tile_y + sub, colmax);
    }
  }
  if constexpr (kGateUp) {
    if (deps.h_written != nullptr) {  // release: every thread's h stores, then the count
      __syncthreads();
      if (tid == 0) red_release_gpu(deps.h_written, 1u);
    }
  }
}

// The two-grid path: gate/up then down, one CTA per item. Grid (expert slots, rows / 64, K halves):
// slots past the active count exit at once.
// kRing: the weights come through per-warp rings at dynamic shared memory offset ring_off (2 CTAs
// per SM: the rings' 72 KB each), else through register bursts (3 CTAs per SM at 168 registers).
template <MoeFormat F, bool kGateUp, bool kRing, bool kWide>
__global__ void __launch_bounds__(kThreads, kRing ? 2 : 3)
    moe_tc_kernel(const DeviceExpert* __restrict__ table, moe::Plan plan, TcAct act, int top_k, int64_t k_dim,
                  TcOut out, int window, int stage_cols, const MoeRingMap* __restrict__ ring_maps, int ring_off) {
  if (int(blockIdx.x) >= plan.counters[0]) {  // uniform per CTA
    pdl_wait();  // every CTA waits: this grid's end implies its predecessor's
    return;
  }
  extern __shared__ __align__(128) unsigned char moe_tc_smem[];
  __shared__ uint64_t ring_bars[kRing ? kWarps * kRingMaxStages : 1];
  WarpRing ring;
  if constexpr (kRing) ring = ring_init(moe_tc_smem + ring_off, ring_bars);
  moe_tc_tile<F, kGateUp, kRing, kWide>(table, plan, act, top_k, k_dim, out, window, stage_cols, int(blockIdx.x),
                                        int(blockIdx.y), 1, kGateUp ? int(blockIdx.z) : 0, kGateUp ? int(gridDim.z) : 1,
                                        int(gridDim.y), true, TcDeps{}, ring_maps, ring);
}

// The fused grid's own routing plan (MoeTcArgs::grid_plan): every CTA builds it in shared memory
// from the ids, so no plan kernel runs before the grid: one kernel and its boundary fewer on the
// decode step's critical path. The same plan as moe_plan_kernel's where it matters: held experts
// with a pair, ascending, as the slots; a slot's pairs contiguous in `sorted` (here in pair order;
// the plan kernel's order inside an expert may differ, which changes no bits: every column of a
// pass is computed on its own). Each of the first `pairs` threads ranks its pair against all others
// (O(pairs) shared-memory reads each, pairs <= kGridPlanMaxPairs).
// The ids are complete when the grid starts: they were written before the grid's predecessor (the
// prep kernel) started, so the CTA reads them before pdl_wait, as it reads the weights.
static_assert(kThreads >= kGridPlanMaxPairs, "one thread per pair");
struct GridPlan {
  int32_t expert[kGridPlanMaxPairs];  // pair p's expert, -1 where not held (or out of range)
  int32_t first[kGridPlanMaxPairs];   // 1 where p is its expert's first pair
  int32_t active[kGridPlanMaxPairs];
  int32_t slot_offsets[kGridPlanMaxPairs + 1];
  int32_t sorted[kGridPlanMaxPairs];
  int32_t count[2];                   // active slots, held pairs
};
__device__ __forceinline__ moe::Plan build_grid_plan(const MoeGridPlanArgs& a, GridPlan& s) {
  const int tid = int(threadIdx.x);
  int e = -1;
  if (tid < a.pairs) {
    const int id = a.ids[int64_t(tid / a.top_k) * a.ids_stride + tid % a.top_k];
    if (held(a.table, a.num_experts, id)) e = id;
    s.expert[tid] = e;
  }
  if (tid < 2) s.count[tid] = 0;
  __syncthreads();
  int rank = 0;
  if (e >= 0) {
    bool first = true;
    for (int u = 0; u < a.pairs; ++u) {
      const int eu = s.expert[u];
      const bool before = eu >= 0 && (eu < e || (eu == e && u < tid));
      rank += before ? 1 : 0;
      first = first && !(eu == e && u < tid);
    }
    s.first[tid] = first ? 1 : 0;
    s.sorted[rank] = tid;
    atomicAdd(&s.count[1], 1);  // a sum: the same whatever the order
  }
  __syncthreads();
  if (e >= 0 && s.first[tid] != 0) {
    int slot = 0;
    for (int u = 0; u < a.pairs; ++u) {
      const int eu = s.expert[u];
      slot += eu >= 0 && eu < e && s.first[u] != 0 ? 1 : 0;
    }
    s.active[slot] = e;
    s.slot_offsets[slot] = rank;
    atomicAdd(&s.count[0], 1);
  }
  __syncthreads();
  if (tid == 0) s.slot_offsets[s.count[0]] = s.count[1];
  __syncthreads();
  moe::Plan p{};
  p.active = s.active;
  p.sorted = s.sorted;
  p.slot_offsets = s.slot_offsets;
  p.counters = s.count;
  return p;
}

// The fused grid's work queue (MoeTcArgs::queue; every counter zero between calls).
struct TcQueue {
  unsigned* head;    // next item to take
  unsigned* exited;  // CTAs that found the queue empty
  unsigned* done;    // [slots] gate/up tiles of expert slot j whose h is written
  int slots;
};

// The fused, persistent path: one grid of as many CTAs as the GPU holds at once takes items from a
// queue: first every gate/up item (expert slot major; a tile's K halves adjacent), then every down
// item (slot major; down_tiles 64-row tiles each). A down item waits for its slot's gate/up tiles
// (TcDeps) after issuing its first weight burst; those items were all taken before it by running
// CTAs, which never wait, so the wait ends (also when the grid exceeds what is resident). Why: at
// DeepSeek-V3 batch 1 the two grids are 512 and 896 CTAs on 396 slots, i.e. 1.3 and 2.3 waves of
// latency-bound CTAs, two tails and a kernel boundary; here the down items fill the gate/up tail
// and one short tail remains. Each item computes exactly what the two-grid path's CTA computes (the
// same K halves, fold and order), so the two paths give the same bits. A CTA takes its next ticket
// when it starts an item (the atomic's round trip hides behind the item); the last CTA out zeroes
// the queue for the next call. (Streaming a CTA's next item into its weight rings while an item
// ends measured slower on an H100 at batch 1-8 three times and was dropped: with the ticket taken
// one or two items ahead (sessions 19, 22), and with today's ticket, each warp issuing the next
// item's first stages once it had read its last (session 29: -2 to -5 points, -3.5 with no
// arithmetic); docs/performance.md.)
// kProbe (bench only, MoeTcArgs::probe): bit 0 skips the gate/up items' arithmetic, bit 1 the down
// items'; kProbeArgMathOnly skips every weight copy instead (MoeTcProbe::MathOnly).
constexpr int kProbeArgMathOnly = 4;
template <MoeFormat F, bool kRing, bool kWide, int kProbe = 0>
__global__ void __launch_bounds__(kThreads, kRing ? 2 : 3)
    moe_tc_fused_kernel(const DeviceExpert* __restrict__ table, moe::Plan plan_arg, MoeGridPlanArgs grid_plan,
                        TcAct x_act, TcAct h_act, int top_k, int64_t hidden, int64_t inter, TcOut o1, TcOut o2, int w1,
                        int w2, int stage_cols, int kz, int down_tiles, TcQueue q,
                        const MoeRingMap* __restrict__ ring_maps, int ring_off) {
  constexpr int kGateUpProbe = kProbe == kProbeArgMathOnly ? kProbeNoCopy : (kProbe & 1) != 0 ? kProbeNoMath : 0;
  constexpr int kDownProbe = kProbe == kProbeArgMathOnly ? kProbeNoCopy : (kProbe & 2) != 0 ? kProbeNoMath : 0;
  __shared__ unsigned s_item, s_last;
  __shared__ GridPlan s_plan;
  const moe::Plan plan = grid_plan.ids != nullptr ? build_grid_plan(grid_plan, s_plan) : plan_arg;  // uniform
  extern __shared__ __align__(128) unsigned char moe_tc_smem[];
  __shared__ uint64_t ring_bars[kRing ? kWarps * kRingMaxStages : 1];
  WarpRing ring;  // one ring per warp for all the CTA's items (the slots' phases carry over)
  if constexpr (kRing) ring = ring_init(moe_tc_smem + ring_off, ring_bars);
  const int tid = int(threadIdx.x);
  const unsigned ic = unsigned(inter / kCtaRows), hc = unsigned(hidden / kCtaRows);
  // The plan kernel's plan was complete before the prep kernel started; the grid's own is built above.
  const unsigned active = unsigned(plan.counters[0]);
  const unsigned dn_per_slot = hc / unsigned(down_tiles);  // down items of a slot: down_tiles 64-row tiles each
  const unsigned gu_per_slot = ic * unsigned(kz), n_gu = active * gu_per_slot, total = n_gu + active * dn_per_slot;
  if (tid == 0) s_item = atomicAdd(q.head, 1u);
  __syncthreads();
  unsigned item = s_item;
  bool first = true;
  while (item < total) {  // uniform per CTA
    unsigned next = 0;
    if (tid == 0) next = atomicAdd(q.head, 1u);  // in flight during the item
    if (item < n_gu) {
      const int slot = int(item / gu_per_slot), r = int(item % gu_per_slot);
      TcDeps d;
      d.h_written = q.done + slot;
      moe_tc_tile<F, true, kRing, kWide, kGateUpProbe>(table, plan, x_act, top_k, hidden, o1, w1, stage_cols, slot,
                                                       r / kz, 1, r % kz, kz, int(ic), first, d, ring_maps, ring);
    } else {
      const int slot = int((item - n_gu) / dn_per_slot), y = int((item - n_gu) % dn_per_slot) * down_tiles;
      TcDeps d;
      d.h_ready = q.done + slot;
      d.h_tiles = ic;
      moe_tc_tile<F, false, kRing, kWide, kDownProbe>(table, plan, h_act, top_k, inter, o2, w2, stage_cols, slot, y,
                                                      down_tiles, 0, 1, int(hc), first, d, ring_maps, ring);
    }
    first = false;
    if (tid == 0) s_item = next;  // every thread read s_item before the tile's barriers
    __syncthreads();  // also: every thread is done with the tile's shared memory
    item = s_item;
    __syncthreads();  // s_item is rewritten after the next item
  }
  if (first) pdl_wait();  // every CTA waits: this grid's end implies its predecessor's
  if (tid == 0) s_last = atomicAdd(q.exited, 1u) == gridDim.x - 1 ? 1u : 0u;
  __syncthreads();
  if (s_last != 0u) {  // every other CTA has left the loop: nothing reads the queue any more
    for (int j = tid; j < q.slots; j += kThreads) q.done[j] = 0u;
    if (tid == 0) {
      *q.head = 0u;
      *q.exited = 0u;
    }
  }
}

// Two-grid path: the INT4 gate/up pass splits K over two CTAs per tile when its unsplit grid is at
// most this many tiles and every expert has one pass of columns (<= 2 tokens). DeepSeek-V3 batch 1:
// 8 experts x 32 tiles = 256 CTAs, ~8 warps per SM, too few to cover the weight stream's latency; split, 512 CTAs
// read 51-52% of copy bandwidth against 44-45% (H200, 2026-12-03). Batch 2 (16 x 32 = 512 tiles:
// 512 whole-K CTAs are 1.3 waves of 396 slots) split, 1024 CTAs: 58.1% against 49.4% (two processes
// each, same build; batch 1, 4 and 8 unchanged). FP8 batch 1 measured slower split (65.5% against
// 70.7-72.1%) and stays whole.
// Measured and not kept (2026-12-03): K in four fixed parts, four CTAs per tile at batch 1, read
// 46.7-47.4% there against 43.1-43.3% split in two (same calls), but the four-part fold cost the
// unsplit batch 8 2.7 points (69.5% against 72.2%) and FP8 batch 8 1.7.
constexpr int64_t kKSplitMaxTiles = 512;

// 64-row tiles per down item of the fused ring grid (a divisor of hidden / 64): from 4 tokens two,
// one after the other through the warps' rings, so the second tile's stages stream while the first's
// math runs (a one-tile item issues all its stages at once and then computes with nothing in
// flight), and the queue has half the item boundaries. Below 4 tokens the longer items balance the
// queue's tail worse. H100, DeepSeek-V3 shapes, INT4, % of copy at batch 1 / 2 / 4 / 8 (two
// processes each, 2026-12-06): one tile 68.5-68.8 / 78.8-79.0 / 83.4-83.6 / 85.6-85.7; two tiles
// 64.8-64.9 / 77.6-77.8 / 83.8-84.3 / 86.8-86.9; four 59.5-59.6 / 74.0-74.1 / 82.1-82.3 / 86.3-86.5.
int fused_down_tiles(int64_t tokens, int64_t hc) { return tokens >= 4 && hc % 2 == 0 ? 2 : 1; }

// The ring path's dynamic shared memory: the staging area, then the warps' rings from this offset.
constexpr int ring_offset(size_t stage_bytes) { return int((stage_bytes + 127) / 128 * 128); }
constexpr size_t kRingCtaBytes = size_t(kWarps) * kRingWarpBytes;
static_assert(2 * (kMoeStageBudget + kRingCtaBytes + 2048) <= 228 * 1024, "2 ring CTAs per SM");
// Past 48 KB of dynamic shared memory a kernel must opt in (per launch size: cheap, and legal while
// a graph is being captured).
template <typename Kernel> void opt_in_smem(Kernel kernel, size_t bytes) {
  MLA_GPU_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

template <MoeFormat F> void launch_tc(const MoeTcArgs& a, Stream stream) {
  constexpr bool kFp8 = F == MoeFormat::FP8;
  const TcLayout l = tc_layout(F, a.tokens, a.pairs, a.hidden, a.inter);
  char* base = static_cast<char*>(a.scratch);
  auto* x16 = reinterpret_cast<uint16_t*>(base + l.x16);
  auto* x_aux = reinterpret_cast<float*>(base + l.x_aux);
  auto* h16 = reinterpret_cast<uint16_t*>(base + l.h16);
  auto* h_aux = reinterpret_cast<float*>(base + l.h_aux);
  const int64_t hc = a.hidden / kActChunk, ic = a.inter / kActChunk;
  // aux entries per row: FP8 one per 64 k; INT4 x one per 32-group and the inverse scale, h two per 32-group.
  const int64_t x_aux_stride = kFp8 ? hc : a.hidden / kAuxK + 1, h_aux_stride = kFp8 ? ic : a.inter / kAuxK * kHAuxI4;

  if constexpr (kFp8) {
    const dim3 gp(unsigned((hc + kWarps - 1) / kWarps), unsigned(a.tokens));
    launch_maybe_pdl(moe_tc_prep_fp8_kernel, gp, dim3(kThreads), 0, true, stream, a.x, a.x_stride, a.hidden, x16, a.hidden,
                     x_aux, x_aux_stride);
  } else {
    const dim3 gp(unsigned((a.hidden + kPrepI4Slice - 1) / kPrepI4Slice), unsigned(a.tokens));
    launch_maybe_pdl(moe_tc_prep_i4_kernel, gp, dim3(256), 0, true, stream, a.x, a.x_stride, a.hidden, x16, a.hidden, x_aux,
                     x_aux_stride);
  }
  MLA_GPU_LAUNCH_CHECK();

  // Staging window: the whole K when a pass's columns (min(tokens, pass)) fit the budget, else the
  // largest multiple of the burst that does. An expert has at most `tokens` pairs.
  const int cols = std::min(a.tokens, pass_cols(F));
  auto window_for = [&](bool gate_up, int64_t chunks, int burst) {
    if (moe_stage(F, gate_up, int(chunks), cols).bytes <= kMoeStageBudget) return int(chunks);
    int w = burst;
    while (moe_stage(F, gate_up, w + burst, cols).bytes <= kMoeStageBudget) w += burst;
    return w;
  };
  const int w1 = window_for(true, a.hidden / chunk_k(F), moe_tc_burst<F, true>());
  const int w2 = window_for(false, a.inter / chunk_k(F), moe_tc_burst<F, false>());
  const size_t st1 = moe_stage(F, true, w1, cols).bytes, st2 = moe_stage(F, false, w2, cols).bytes;

  TcOut o1{};
  o1.k_part = reinterpret_cast<float*>(base + l.k_part);
  o1.k_tickets = a.k_tickets;
  o1.h = h16;
  o1.h_stride = a.inter;
  o1.h_aux = h_aux;
  o1.h_aux_stride = h_aux_stride;
  TcOut o2{};
  o2.y = a.y;
  o2.y_stride = a.hidden;
  const TcAct x_act{x16, a.hidden, x_aux, x_aux_stride}, h_act{h16, a.inter, h_aux, h_aux_stride};
  const int64_t gu_tiles = int64_t(a.slots) * ic;  // at most; the active experts' tiles on the device
  const bool one_pass = a.k_tickets != nullptr && a.tokens <= split_max_tokens(F);

  // Dynamic shared memory: the staging area, then (ring) the warps' rings at a 128-aligned offset.
  // kWide: the rings' stage widths (ring_wide; either value without rings).
  auto launch = [&]<bool kRing, bool kWide>() {
    auto smem_for = [](size_t stage) { return kRing ? size_t(ring_offset(stage)) + kRingCtaBytes : stage; };
    if (a.fused_ctas > 0) {
      // K split where the gate/up tiles are fewer than two per CTA (DeepSeek-V3 batch 1 and 2).
      const bool ksplit = one_pass && gu_tiles <= kKSplitMaxTilesFused && gu_tiles < 2 * int64_t(a.fused_ctas);
      const TcQueue q{a.queue, a.queue + 1, a.queue + 2, a.slots};
      const size_t stage = std::max(st1, st2);
      auto kernel = moe_tc_fused_kernel<F, kRing, kWide>;
      if constexpr (kRing && !kFp8) {
        if (a.probe == 1) kernel = moe_tc_fused_kernel<F, kRing, kWide, 1>;
        if (a.probe == 2) kernel = moe_tc_fused_kernel<F, kRing, kWide, 2>;
        if (a.probe == 3) kernel = moe_tc_fused_kernel<F, kRing, kWide, 3>;
        if (a.probe == kProbeArgMathOnly) kernel = moe_tc_fused_kernel<F, kRing, kWide, kProbeArgMathOnly>;
      }
      if constexpr (kRing) opt_in_smem(kernel, smem_for(stage));
      mma::launch_maybe_pdl(kernel, dim3(unsigned(a.fused_ctas)), dim3(kThreads), smem_for(stage), true, stream,
                            a.table, a.plan, a.grid_plan, x_act, h_act, a.top_k, a.hidden, a.inter, o1, o2, w1, w2,
                            cols, ksplit ? 2 : 1, kRing ? fused_down_tiles(a.tokens, hc) : 1, q, a.ring_maps,
                            ring_offset(stage));
      return;
    }
    // Two grids. K split of the INT4 gate/up pass (kKSplitMaxTiles): one pass per expert (an expert
    // has at most `tokens` pairs) and a small grid.
    const bool ksplit = !kFp8 && one_pass && gu_tiles <= kKSplitMaxTiles;
    const auto k1 = moe_tc_kernel<F, true, kRing, kWide>;
    const auto k2 = moe_tc_kernel<F, false, kRing, kWide>;
    if constexpr (kRing) {
      opt_in_smem(k1, smem_for(st1));
      opt_in_smem(k2, smem_for(st2));
    }
    mma::launch_maybe_pdl(k1, dim3(unsigned(a.slots), unsigned(ic), ksplit ? 2u : 1u), dim3(kThreads), smem_for(st1),
                          true, stream, a.table, a.plan, x_act, a.top_k, a.hidden, o1, w1, cols, a.ring_maps,
                          ring_offset(st1));
    mma::launch_maybe_pdl(k2, dim3(unsigned(a.slots), unsigned(hc)), dim3(kThreads), smem_for(st2), true, stream,
                          a.table, a.plan, h_act, a.top_k, a.inter, o2, w2, cols, a.ring_maps, ring_offset(st2));
  };
  // The ring path is built for INT4 only (FP8 meets its target on register bursts; an FP8 ring is a
  // template argument away, not measured).
  if constexpr (kFp8) launch.template operator()<false, false>();
  else if (a.ring_maps == nullptr) launch.template operator()<false, false>();
  else if (ring_wide(a.hidden, a.inter)) launch.template operator()<true, true>();
  else launch.template operator()<true, false>();
}

// CTAs of the fused grid: as many as the device holds at once (the window logic keeps a CTA's
// staging within kMoeStageBudget, under the 48 KB that needs no opt-in; the rings add theirs).
template <MoeFormat F, bool kRing> int fused_grid() {
  int dev = 0, sms = 0, per_sm = 0;
  MLA_GPU_CHECK(cudaGetDevice(&dev));
  MLA_GPU_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const size_t smem = kRing ? size_t(ring_offset(kMoeStageBudget)) + kRingCtaBytes : kMoeStageBudget;
  // Either ring geometry: the same shared memory, registers capped by the launch bounds.
  const auto kernel = moe_tc_fused_kernel<F, kRing, kRing>;
  if constexpr (kRing) opt_in_smem(kernel, smem);
  MLA_GPU_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem));
  return std::max(1, sms * per_sm);
}
}  // namespace

bool moe_tc_ring_maps(const DeviceExpert* host_table, int64_t experts, int64_t hidden, int64_t inter,
                      MoeRingMap* maps) {
  static_assert(sizeof(CUtensorMap) == sizeof(MoeRingMap) && alignof(MoeRingMap) >= alignof(CUtensorMap));
  const auto encode = tensor_map_encoder();
  if (encode == nullptr) return false;
  // A [rows, row_bytes] byte matrix of pitch `pitch`, read in boxes of 16 rows x box_bytes, as 4-byte
  // elements (kRingMapElem): a box row is at most 256 elements, so 1 KB rather than 256 B of bytes.
  auto make = [&](MoeRingMap& out, const void* base, int64_t rows, int64_t row_bytes, int64_t pitch, int box_bytes) {
    if (reinterpret_cast<uintptr_t>(base) % 16 != 0 || pitch % 16 != 0 || row_bytes % box_bytes != 0 ||
        box_bytes % kRingMapElem != 0)
      return false;
    const cuuint64_t dim[2] = {cuuint64_t(row_bytes / kRingMapElem), cuuint64_t(rows)}, stride[1] = {cuuint64_t(pitch)};
    const cuuint32_t box[2] = {cuuint32_t(box_bytes / kRingMapElem), cuuint32_t(kTileM)}, estride[2] = {1, 1};
    return encode(reinterpret_cast<CUtensorMap*>(&out), CU_TENSOR_MAP_DATA_TYPE_UINT32, 2, const_cast<void*>(base), dim,
                  stride, box, estride, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                  CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
  };
  const RingChunks rc = ring_chunks(ring_wide(hidden, inter));  // the launches' kWide
  for (int64_t e = 0; e < experts; ++e) {
    MoeRingMap* m = maps + e * kMoeRingMapsPerExpert;
    std::memset(static_cast<void*>(m), 0, sizeof(MoeRingMap) * kMoeRingMapsPerExpert);
    const DeviceExpert& d = host_table[e];
    if (d.gate.data == nullptr) continue;  // not held by this rank: never in a plan
    const DeviceWeight* w[3] = {&d.gate, &d.up, &d.down};
    for (int i = 0; i < 3; ++i) {
      const int64_t rows = i < 2 ? inter : hidden, k = i < 2 ? hidden : inter;
      // INT4 group-32 weights: k / 2 bytes per row (data_stride in int32 words), bf16 scales.
      const int chunks = rc.of(i < 2);  // the stage's RingGeom::kChunks
      if (!make(m[i], w[i]->data, rows, k / 2, w[i]->data_stride * 4, chunks * 64) ||
          !make(m[3 + i], w[i]->scale, rows, k / 32 * 2, w[i]->scale_stride * 2, chunks * 8))
        return false;
    }
  }
  return true;
}

bool moe_tc_device_ok() {
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return false;
  return major >= 8;
}

int moe_tc_fused_grid(MoeFormat format, bool ring) {
  if (format == MoeFormat::FP8) return fused_grid<MoeFormat::FP8, false>();
  return ring ? fused_grid<MoeFormat::I4_BF16, true>() : fused_grid<MoeFormat::I4_BF16, false>();
}

bool moe_tc_ring_ok(MoeFormat format, int64_t hidden, int64_t inter) {
  static const int major = [] {
    int dev = 0, m = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&m, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess)
      return 0;
    return m;
  }();
  return format == MoeFormat::I4_BF16 && major >= 9 && moe_tc_shape_ok(format, hidden, inter) &&
         hidden % ring_k_multiple(format, true) == 0 && inter % ring_k_multiple(format, false) == 0;
}

void moe_tc_launch(MoeFormat format, const MoeTcArgs& args, Stream stream) {
  MLA_CHECK(moe_tc_shape_ok(format, args.hidden, args.inter), "moe_tc_launch: format {} hidden {} inter {}",
            int(format), args.hidden, args.inter);
  if (args.tokens <= 0 || args.pairs <= 0) return;
  if (format == MoeFormat::FP8) launch_tc<MoeFormat::FP8>(args, stream);
  else launch_tc<MoeFormat::I4_BF16>(args, stream);
}

#else  // HIP: no mma.sync; the dispatcher never picks this path.

bool moe_tc_device_ok() { return false; }

int moe_tc_fused_grid(MoeFormat, bool) { return 0; }

bool moe_tc_ring_ok(MoeFormat, int64_t, int64_t) { return false; }

bool moe_tc_ring_maps(const DeviceExpert*, int64_t, int64_t, int64_t, MoeRingMap*) { return false; }

void moe_tc_launch(MoeFormat, const MoeTcArgs&, Stream) {
  MLA_CHECK(false, "moe_tc_launch: tensor-core MoE decode needs a CUDA build");
}

#endif  // MLA_GPU_CUDA

// Same-process A/B on an H200 (2026-12-06, `mla_bench_gpu --only moe --moe-ab`, DeepSeek-V3
// experts, two alternating rows each, copy ceiling 4231 GB/s), fraction of copy bandwidth at batch
// 1 / 2 / 4 / 8, fused against two grids:
//   FP8  66.5 / 82.9 / 89.7 / 93.6%  against  72.1 / 74.5 / 86.0 / 92.3%
//   INT4 32.8 / 45.2 / 50.9 / 64.9%  against  43.3 / 59.2 / 66.3 / 72.2%
// The fused grid wins FP8 from batch 2 (one queue fills the gate/up tail with down items) and loses
// FP8 batch 1 (it splits that gate/up pass over K, which measured slower for FP8 in two grids too)
// and every INT4 batch on register bursts (its 168-register cap spills 228 B of the two bodies' live
// state). On an H100 (same day, `--moe-variants`, copy 3025 GB/s) this rule read FP8 79.4 / 89.4 /
// 96.4 / 96.3% against two grids' 79.2 / 83.6 / 93.0 / 94.0%; the fused grid unsplit at FP8 batch 1,
// 78.5%.
// INT4 with the weight rings (no spills; session 19, H100, `--moe-variants
// 2grid+noring,2grid,fused,...`, copy 3028 GB/s): fused 66.8 / 76.4 / 84.1 / 87.4%, two grids 59.5
// / 65.7 / 75.5 / 79.9%, register bursts in two grids 51.6 / 69.5 / 77.7 / 79.9%. On an H200
// (session 20, copy 4256 GB/s): fused 51.9 / 59.3 / 65.6 / 69.1%, two grids 48.2 / 53.4 / 60.8 /
// 65.9%, register bursts in two grids 42.4 / 57.9 / 65.1 / 70.5%: the rings lose 1.4 points there at
// batch 8 only, too little for a device-keyed rule.
bool moe_tc_fused_auto(MoeFormat format, int64_t tokens, bool ring) {
  return format == MoeFormat::FP8 ? tokens >= 2 : ring;
}

}  // namespace mla::gpu
