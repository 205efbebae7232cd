// Tensor-core decode matvec for dense layers, GemmPrecision::Bf16 (interface and constraint:
// gpu_decode_tc.h): out[T, out] = x[T, in] W^T for FP8 (128x128 block scales), INT4 (group 32,
// BF16 scales) and BF16 weights at T <= 16, and the per-head matvecs of MLA's absorption. Same
// number formats and mma fragments as the MoE kernel (gpu_decode_tc.cu, whose comment holds the
// fragment proof): FP8 weights -> exact f16, activations f16 with a power-of-two scale per 64-k
// chunk; INT4 -> exact bf16(q * s), activations bf16; BF16 weights as they are, activations bf16
// (the cuBLASLt path's rounding at prefill sizes).
//
// Why a kernel of its own (measured on the H200 with ncu, 2026-11-30): the decode step's dense FP8
// matvecs ran at ~50% of copy bandwidth, latency-bound (10-16 warps per SM, 67% of stalls on global
// loads), and each call was three launches (x -> 16-bit prep, matvec, split-K reduce) of which the
// prep and reduce cost ~0.25 ms of a 2.36 ms DeepSeek-V3 step. Here one launch does all three:
//   - before waiting on the previous kernel (programmatic dependent launch), every warp issues its
//     first burst of weight loads, which depend on nothing the previous kernel writes;
//   - the CTA then rounds its K range of x to 16 bits into shared memory (the same values the prep
//     pass wrote), so the inner loop's only global loads are the streamed weights: activation
//     fragments, activation scales and FP8 block scales are shared-memory reads;
//   - with split K, the last CTA of a row block to finish (a ticket counter) adds the partial planes
//     in split order, so the result does not depend on which CTA finished last.
//
// Napkin math (DeepSeek-V3 o_proj, FP8 [7168, 16384], T = 1): 117.4 MB of weights + 0.9 MB of block
// scales = 27.5 us at 4.3 TB/s; x is 64 KB (fp32), read once per split from L2. Per 16 weight bytes
// a lane spends 1 cp.async + 2 shared loads + 8 cvt + 2 mma + ~3 FFMA: ~1 instruction per weight
// byte against an issue budget of ~10. In flight: each warp keeps one 8 KB burst (16 rows x 512 B)
// streaming into its ring while it consumes the previous one; 3 CTAs x 4 warps per SM = 96 KB per
// SM, ~1.5x what a 4.3 TB/s x ~1.5 us latency product needs.
#include <algorithm>
#include <cstdint>

#include "backend/gpu/gpu_decode_tc.cuh"
#include "backend/gpu/gpu_decode_tc.h"
#include "core/status.h"

namespace mla::gpu {

using decode_tc::chunk_k;
using decode_tc::kActChunk;

namespace {

// Resident CTAs per SM, as shared memory allows (the kernel's __launch_bounds__ minimum): FP8 / BF16
// 64 KB of weight ring + <= 10 KB of staged x per CTA, 3 per SM; INT4 adds 8 KB of scale ring, 2.
constexpr int dense_tc_min_blocks(MoeFormat format) { return format == MoeFormat::I4_BF16 ? 2 : 3; }

// Bytes per data_stride unit: FP8 1, BF16 2, INT4 4 (a word of 8 nibbles).
constexpr int64_t row_unit(MoeFormat format) {
  return format == MoeFormat::FP8 ? 1 : format == MoeFormat::BF16 ? 2 : 4;
}

}  // namespace

bool dense_tc_shape_ok(MoeFormat format, int64_t in, int64_t out) {
  if (format != MoeFormat::FP8 && format != MoeFormat::I4_BF16 && format != MoeFormat::BF16) return false;
  return in > 0 && out > 0 && in % chunk_k(format) == 0 && out % kActChunk == 0 && out / kActChunk <= 65535;
}

bool dense_tc_weight_ok(MoeFormat format, const DeviceWeight& w) {
  const size_t row_bytes = size_t(w.data_stride) * size_t(row_unit(format));
  const bool data = reinterpret_cast<uintptr_t>(w.data) % 16 == 0 && row_bytes % 16 == 0;
  // INT4 group scales travel 8 bytes (one 128-k chunk's 4 groups) at a time.
  const bool scale = format != MoeFormat::I4_BF16 ||
                     (reinterpret_cast<uintptr_t>(w.scale) % 8 == 0 && w.scale_stride % 4 == 0);
  return dense_tc_shape_ok(format, w.in, w.out) && data && scale;
}

DenseTcSplit dense_tc_split_into(MoeFormat format, int64_t in, int64_t want) {
  const int64_t chunks = in / chunk_k(format), n = std::clamp<int64_t>(want, 1, std::max<int64_t>(chunks, 1));
  const int64_t per = (chunks + n - 1) / n;
  return {(chunks + per - 1) / per, per};
}

DenseTcSplit dense_tc_split(MoeFormat format, int64_t in, int64_t out) {
  // Each CTA streams its rows' K range at a rate set by the loads it keeps in flight, so a grid's
  // time is its number of waves (dense_tc_min_blocks per SM x 132 SMs on an H200) more than its
  // bytes: the last, partial wave runs at a fraction of the bandwidth. But a split whose K range is
  // short leaves each warp one or two 512-byte bursts per row, and then a CTA's fixed costs (x
  // staging, the first burst's latency, the split-K ticket) dominate. The rule: among 1 split and
  // the splits that keep >= 3 bursts per row, the fewest whose grid fills its waves to >= 80%, else
  // the fullest; where even those give less than a quarter wave (the narrowest layers), splits of
  // >= 1 burst per row are allowed too. Measured on the H200 (2026-12-01, batch 1, bench
  // dense-decode's forced splits 1 / 2 / 3 / 4 / 6 / 8, % of copy bandwidth):
  //   o_proj 16384 -> 7168 (112 row CTAs)   47 / 65 / 68 / 54 / 65 / 68  -> 3
  //   gate/up 7168 -> 18432 (288)           71 / 64 / 65 / 72 / 65 / 66  -> 4
  //   down 18432 -> 7168 (112)              48 / 67 / 71 / 54 / 69 / 67  -> 3
  //   q_b 1536 -> 24576 (384)               55 / 41 / 38 / 36 / 29 / 25  -> 1 (the old rule, >= 2 splits: 2)
  //   shared down 2048 -> 7168 (112)        30 / 27 / 26 / 23 / 22 / 21  -> 1 (old: 3)
  //   shared gate/up 7168 -> 2048 (32)      13 / 20 / 23 / 26 / 25 / 28  -> 4
  //   q_a 7168 -> 1536 (24), kv_a 7168 -> 576 (9): 10-22% and 4-10% at any split (latency-bound).
  // Depends on the shape only (the same for every T and every replay: a token's sums are
  // batch-invariant).
  constexpr int64_t kBurstChunks = 8, kMaxSplits = 32;  // 8 chunks of 64 B = one 512-byte burst per row
  const int64_t kWaveCtas = dense_tc_min_blocks(format) * 132;
  const int64_t row_ctas = out / kActChunk, chunks = in / chunk_k(format);
  auto fill = [&](const DenseTcSplit& sp) {
    const int64_t ctas = sp.splits * row_ctas, waves = (ctas + kWaveCtas - 1) / kWaveCtas;
    return double(ctas) / double(waves * kWaveCtas);
  };
  auto pick = [&](int64_t min_chunks) {
    DenseTcSplit best = dense_tc_split_into(format, in, 1);
    for (int64_t want = 1; want <= std::min(chunks, kMaxSplits); ++want) {
      const DenseTcSplit sp = dense_tc_split_into(format, in, want);
      if (sp.splits > 1 && sp.chunks_per_split < min_chunks) break;  // shorter for every larger want
      if (fill(sp) >= 0.8) return sp;
      if (fill(sp) > fill(best)) best = sp;
    }
    return best;
  };
  const DenseTcSplit sp = pick(3 * kBurstChunks);
  if (sp.splits * row_ctas * 4 >= kWaveCtas) return sp;
  return pick(kBurstChunks);
}

size_t dense_tc_partial_bytes(const DenseTcSplit& split, int64_t tokens, int64_t out) {
  return split.splits > 1 ? size_t(split.splits * tokens * out) * sizeof(float) : 0;
}

#if MLA_GPU_CUDA

namespace {

using namespace decode_tc;  // act_pos_i4, pow2_scale, f16_bits, word_of, fp8x2_to_f16x2, int4x2_to_bf16x2

constexpr int kWarps = 4, kThreads = kWarps * 32;  // CUDA-only file: mma.sync warps are 32 lanes
constexpr int kTileM = 16;                          // weight rows per warp (one m16 tile)
constexpr int kCtaRows = kWarps * kTileM;           // 64: one FP8 activation chunk of output rows
constexpr int kCols = 8;                            // token columns per pass (mma n)
constexpr int kU = 8;                               // chunks per burst (one ring stage)
constexpr int kStageU = 4;                          // float4 loads per thread in flight while staging
constexpr size_t kStageBudget = 10 * 1024;          // staged x per CTA (next to the ring: 3 CTAs per SM)
static_assert(kCtaRows == kActChunk, "a CTA's 64 rows lie in one 128-row FP8 scale block");
static_assert(kWarpSize == 32, "mma.sync fragments assume 32-lane warps");

// A part as the kernel sees it: its weight's rows and scales, its output, and the first grid row
// (blockIdx.y) of its 64-row blocks.
struct DenseTcPartParams {
  const void* data;
  const void* scale;
  int64_t data_stride, scale_stride;
  float* y;
  int64_t y_stride;
  int cta_begin;
};

struct DenseTcParams {
  DenseTcPartParams part[kDenseTcMaxParts];
  int num_parts;
  int64_t in, total_out;  // every part's width; the parts' rows summed (the partial planes' width)
  const float* x;  // activation row r = t * heads + h at x + r * x_stride
  int64_t x_stride;
  bool x_vec;      // x and x_stride 16-byte aligned: float4 staging loads
  int tokens, heads;
  int64_t w_head_rows, y_head_stride;
  int64_t chunks_per_split;
  int splits;
  int window;      // chunks of x staged in shared memory at a time (a multiple of kU, or the split)
  int stage_cols;  // columns the shared-memory layout holds: min(tokens, kCols)
  float* partial;  // splits > 1: [splits][tokens][total_out], part rows at their cta_begin * 64
  unsigned* tickets;
};

// Shared memory for `window` chunks of `cols` columns:
//   act [cols][row_u16] 16-bit activations, row_u16 = window * K + 8 (rows 16 bytes apart modulo
//       128, so the 8 g-lanes of a B fragment read hit distinct banks);
//   inv [cols][window] f32 (FP8): each 64-k chunk's inverse activation scale;
//   wscale [window / 2 + 2] f32 (FP8): the CTA's 128-row block scales over the window's k blocks.
struct StageLayout {
  int row_u16;
  size_t inv_off, scale_off, bytes;
};
__host__ __device__ constexpr StageLayout stage_layout(MoeFormat f, int window, int cols) {
  StageLayout l{};
  l.row_u16 = window * int(chunk_k(f)) + 8;
  l.inv_off = size_t(cols) * size_t(l.row_u16) * 2;
  const bool fp8 = f == MoeFormat::FP8;
  l.scale_off = l.inv_off + (fp8 ? size_t(cols) * size_t(window) * 4 : 0);
  l.bytes = l.scale_off + (fp8 ? size_t(window / 2 + 2) * 4 : 0);
  return l;
}

// Rounds x[k range [c0, c0 + nwc) chunks] of columns p0 .. p0 + ncols - 1 to the kernel's 16-bit
// B rows in shared memory, exactly as the MoE prep pass does: FP8 path f16(v * 2^s) with one
// power-of-two scale per 64-k chunk of a row; INT4 path bf16(v) stored in act_pos_i4 order; BF16
// path bf16(v) in order. A half-warp covers 64 k (16 lanes x float4), so an FP8 chunk's max is a
// 4-step xor shuffle.
template <MoeFormat F>
__device__ __forceinline__ void stage_x(const DenseTcParams& p, const StageLayout& l, uint16_t* s_act, float* s_inv,
                                        int p0, int ncols, int head, int64_t c0, int nwc) {
  constexpr int kChunkK = int(chunk_k(F));
  const int tid = int(threadIdx.x), lane = tid % 32;
  const int welems = nwc * kChunkK, total = ncols * welems;
  constexpr int kStep = kThreads * 4;
  for (int base = 0; base < total; base += kStep * kStageU) {  // uniform: every lane shuffles
    float4 v[kStageU];
#pragma unroll
    for (int u = 0; u < kStageU; ++u) {
      const int e = base + u * kStep + tid * 4;
      v[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (e < total) {
        const int n = e / welems, k = e - n * welems;
        const float* src = p.x + (int64_t(p0 + n) * p.heads + head) * p.x_stride + c0 * kChunkK + k;
        v[u] = p.x_vec ? *reinterpret_cast<const float4*>(src) : make_float4(src[0], src[1], src[2], src[3]);
      }
    }
#pragma unroll
    for (int u = 0; u < kStageU; ++u) {
      const int e = base + u * kStep + tid * 4;
      const int n = e / welems, k = e - n * welems;
      uint16_t* row = s_act + n * l.row_u16;
      if constexpr (F == MoeFormat::FP8) {
        float m = fmaxf(fmaxf(fabsf(v[u].x), fabsf(v[u].y)), fmaxf(fabsf(v[u].z), fabsf(v[u].w)));
#pragma unroll
        for (int off = 1; off < 16; off <<= 1) m = fmaxf(m, shfl_xor(m, off));  // the half-warp's chunk
        float scale, inv;
        pow2_scale(m, scale, inv);
        if (e < total) {
          const uint32_t lo = uint32_t(f16_bits(v[u].x * scale)) | (uint32_t(f16_bits(v[u].y * scale)) << 16);
          const uint32_t hi = uint32_t(f16_bits(v[u].z * scale)) | (uint32_t(f16_bits(v[u].w * scale)) << 16);
          *reinterpret_cast<uint2*>(row + k) = make_uint2(lo, hi);
          if ((lane & 15) == 0) s_inv[n * p.window + k / kActChunk] = inv;
        }
      } else if constexpr (F == MoeFormat::BF16) {
        if (e < total) {
          const uint32_t lo = uint32_t(f32_to_bf16_bits(v[u].x)) | (uint32_t(f32_to_bf16_bits(v[u].y)) << 16);
          const uint32_t hi = uint32_t(f32_to_bf16_bits(v[u].z)) | (uint32_t(f32_to_bf16_bits(v[u].w)) << 16);
          *reinterpret_cast<uint2*>(row + k) = make_uint2(lo, hi);
        }
      } else if (e < total) {
        row[act_pos_i4(k)] = f32_to_bf16_bits(v[u].x);
        row[act_pos_i4(k + 1)] = f32_to_bf16_bits(v[u].y);
        row[act_pos_i4(k + 2)] = f32_to_bf16_bits(v[u].z);
        row[act_pos_i4(k + 3)] = f32_to_bf16_bits(v[u].w);
      }
    }
  }
}

// Per warp, kStages bursts of its 16 rows x kU chunks (64 bytes of a row per chunk in every format):
// 8 KB of weight bytes a stage, plus (INT4) the 16 rows' group scales of those chunks (1 KB). (Four
// stages at one CTA per SM, three bursts in flight per warp, measured slower on every DeepSeek
// shape, H200 2026-12-02: a CTA's rate is bound by its warps' dependent convert / mma chains, not by
// its loads in flight; docs/performance.md, session 8.)
constexpr int kStages = 2;
constexpr int kStageU4 = kTileM * kU * 4;     // uint4 per weight stage: 16 rows x 32 pieces
constexpr int kScaleU16 = kTileM * kU * 4;    // INT4 scales per stage: 16 rows x 8 chunks x 4 groups
constexpr size_t ring_bytes(MoeFormat f) {
  return size_t(kWarps) * kStages * (size_t(kStageU4) * 16 + (f == MoeFormat::I4_BF16 ? size_t(kScaleU16) * 2 : 0));
}
// Piece p (16 bytes) of row r of a stage sits at unit 32 r + (p ^ swz(r)): a B-fragment read (rows
// g and g + 8, pieces 4u + t) then touches 8 distinct 16-byte bank groups per quarter warp.
__device__ __forceinline__ int swz(int r) { return (r & 1) << 2; }

// Grid (splits, total_out / 64, heads); warp w owns the m16 tile of output rows 64 r + 16 w of head
// blockIdx.z's matrix of the part holding row block blockIdx.y (its r-th), over split blockIdx.x's
// chunks, for every token (8 columns per pass; a second pass re-streams the weights). See
// gpu_decode_tc.cu for the fragment layout: lane (g, t) takes piece t of each 64-byte chunk of rows
// g and g + 8.
//
// Weights reach the mma through a per-warp ring of shared memory filled by cp.async (one row's 512
// contiguous bytes per instruction, no registers held while in flight): the warp issues burst
// b + kStages - 1 before it consumes burst b, so HBM keeps streaming while it converts and
// multiplies. (The register-burst kernel this replaced issued 8 chunks, waited, consumed, and only
// then issued again: 52-64% of copy bandwidth where the same loads with no arithmetic reach 83-89%,
// bench dense-decode's read probe; this kernel reaches 67-71% on DeepSeek-V3's large layers, H200
// 2026-11-30.)
template <MoeFormat F>
__global__ void __launch_bounds__(kThreads, dense_tc_min_blocks(F)) dense_tc_kernel(const DenseTcParams p) {
  constexpr bool kFp8 = F == MoeFormat::FP8, kI4 = F == MoeFormat::I4_BF16;
  constexpr int kChunkK = int(chunk_k(F));
  constexpr int kBVec = kChunkK / 32;   // uint4 of 16-bit activations per lane per chunk (BF16: 1)
  constexpr int kSteps = kChunkK / 16;  // mma k16 steps per chunk
  constexpr int64_t kRowUnit = row_unit(F);
  // No static __shared__ in this kernel: it would precede the dynamic block and shift the ring off
  // 128-byte alignment, and a cp.async whose shared destination is not sector-aligned with its
  // global source moves each 32-byte sector in two pieces (ncu, H200: 2x the L2 sectors and 3x the
  // shared wavefronts of the aligned copy).
  extern __shared__ __align__(128) uint4 dense_tc_smem[];
  const StageLayout l = stage_layout(F, p.window, p.stage_cols);
  char* smem = reinterpret_cast<char*>(dense_tc_smem);
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  uint4* ring = dense_tc_smem + warp * kStages * kStageU4;
  [[maybe_unused]] uint16_t* sring =
      reinterpret_cast<uint16_t*>(smem + size_t(kWarps) * kStages * kStageU4 * 16) + warp * kStages * kScaleU16;
  char* stage_base = smem + ring_bytes(F);
  uint16_t* s_act = reinterpret_cast<uint16_t*>(stage_base);
  [[maybe_unused]] float* s_inv = reinterpret_cast<float*>(stage_base + l.inv_off);
  [[maybe_unused]] float* s_scale = reinterpret_cast<float*>(stage_base + l.scale_off);
  unsigned* s_last = reinterpret_cast<unsigned*>(stage_base + l.bytes);  // the split-K ticket's verdict

  // This CTA's part: the last whose first row block is <= blockIdx.y (static indices, so the
  // parameters stay in the constant bank).
  DenseTcPartParams pt = p.part[0];
#pragma unroll
  for (int i = 1; i < kDenseTcMaxParts; ++i)
    if (i < p.num_parts && int(blockIdx.y) >= p.part[i].cta_begin) pt = p.part[i];
  const int head = int(blockIdx.z);
  const int64_t cta_row0 = int64_t(int(blockIdx.y) - pt.cta_begin) * kCtaRows, row0 = cta_row0 + warp * kTileM;
  const int64_t prow0 = int64_t(blockIdx.y) * kCtaRows + warp * kTileM;  // row0 in the partial planes
  const int64_t c_begin = int64_t(blockIdx.x) * p.chunks_per_split;
  const int64_t c_end = min(p.in / kChunkK, c_begin + p.chunks_per_split);
  // Head h's matrix starts at weight row h * w_head_rows (a multiple of 128 for FP8: the host checks).
  const int64_t wrow0 = int64_t(head) * p.w_head_rows;
  const char* wbase = static_cast<const char*>(pt.data) + (wrow0 + row0) * pt.data_stride * kRowUnit;
  [[maybe_unused]] const uint16_t* i4_scale =
      kI4 ? static_cast<const uint16_t*>(pt.scale) + (wrow0 + row0) * pt.scale_stride : nullptr;
  [[maybe_unused]] const float* fp8_scale =
      kFp8 ? static_cast<const float*>(pt.scale) + ((wrow0 + cta_row0) / 128) * pt.scale_stride : nullptr;

  // Burst order, the same for every warp: pass (8 token columns) -> window -> kU-chunk bursts.
  struct Cursor {
    int p0;
    int64_t w0, c0;
  };
  auto window_end = [&](int64_t w0) { return min(c_end, w0 + int64_t(p.window)); };
  auto advance = [&](Cursor& k) {
    k.c0 += kU;
    if (k.c0 < window_end(k.w0)) return;
    k.w0 += p.window;
    k.c0 = k.w0;
    if (k.w0 < c_end) return;
    k.p0 += kCols;
    k.w0 = c_begin;
    k.c0 = c_begin;
  };
  // Issues burst `ic` into its stage and commits one group (an empty one past the last burst, so
  // every thread's group count stays uniform for cp_async_wait).
  Cursor ic{0, c_begin, c_begin};
  int64_t issued = 0;
  auto issue = [&]() {
    if (ic.p0 < p.tokens) {
      const int64_t lim = window_end(ic.w0);
      const int stage = int(issued % kStages);
      uint4* st = ring + stage * kStageU4;
      const int64_t c = ic.c0 + lane / 4;  // this lane's chunk; piece lane % 4 of it
      const int bytes = c < lim ? 16 : 0;
#pragma unroll
      for (int r = 0; r < kTileM; ++r) {
        const char* src = wbase + int64_t(r) * pt.data_stride * kRowUnit + (bytes ? ic.c0 * 64 + lane * 16 : 0);
        mma::cp_async16(mma::smem_addr(st + r * 32 + (lane ^ swz(r))), src, bytes);
      }
      if constexpr (kI4) {
        uint16_t* sst = sring + stage * kScaleU16;
#pragma unroll
        for (int j = 0; j < 4; ++j) {  // 16 rows x 8 chunks of 4 group scales, 8 bytes each
          const int q = lane + 32 * j, r = q / kU, pc = q % kU;
          const int64_t cc = ic.c0 + pc;
          const uint16_t* src = i4_scale + int64_t(r) * pt.scale_stride + (cc < lim ? 4 * cc : 0);
          mma::cp_async8(mma::smem_addr(sst + r * (kU * 4) + pc * 4), src, cc < lim ? 8 : 0);
        }
      }
      advance(ic);
      ++issued;
    }
    mma::cp_async_commit();
  };

  // The weights are constant, so the first bursts are issued before the previous kernel is waited on.
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) issue();
  pdl_wait();     // every CTA waits: this grid's end implies its predecessor's
  pdl_trigger();  // the next grid may start (and issue its own weights) once all CTAs are here

  Cursor cc{0, c_begin, c_begin};
  int64_t consumed = 0;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  while (cc.p0 < p.tokens) {  // uniform per CTA
    const int ncols = min(kCols, p.tokens - cc.p0);
    const int64_t w_end = window_end(cc.w0);
    if (cc.c0 == cc.w0) {  // a window starts: stage its x (all warps reach this together)
      __syncthreads();     // the previous window's readers are done
      stage_x<F>(p, l, s_act, s_inv, cc.p0, ncols, head, cc.w0, int(w_end - cc.w0));
      if constexpr (kFp8)
        for (int i = tid; i <= int((w_end - 1) / 2 - cc.w0 / 2); i += kThreads)
          s_scale[i] = fp8_scale[cc.w0 / 2 + i];
      __syncthreads();
    }
    mma::cp_async_wait<kStages - 2>();  // burst `consumed` has landed (this lane's copies)
    __syncwarp();                       // ... and every lane's; the stage refilled below is free
    issue();
    const int stage = int(consumed % kStages);
    const uint4* st = ring + stage * kStageU4;
    [[maybe_unused]] const uint16_t* sst = sring + stage * kScaleU16;
    const uint16_t* srow = s_act + g * l.row_u16 + t * (kChunkK / 4);
    // Chunk u of the burst. Bursts that lie inside the window (all but a window's last) run the
    // eight chunks branch-free, so the compiler can overlap one chunk's shared loads and converts
    // with the previous chunk's mma chain: 2-5% more bandwidth on every DeepSeek-V3 shape than one
    // window check per chunk (H200, 2026-12-02, side by side in one process).
    auto chunk = [&](const int u) {
      const int64_t c = cc.c0 + u;
      const int lc = int(c - cc.w0);
      const uint4 a0 = st[g * 32 + ((4 * u + t) ^ swz(g))];
      const uint4 a1 = st[(g + 8) * 32 + ((4 * u + t) ^ swz(g + 8))];
      uint4 b[kBVec];
#pragma unroll
      for (int i = 0; i < kBVec; ++i)
        b[i] = g < ncols ? *reinterpret_cast<const uint4*>(srow + lc * kChunkK + 8 * i) : make_uint4(0u, 0u, 0u, 0u);
      if constexpr (kFp8) {
        const float inv0 = 2 * t < ncols ? s_inv[(2 * t) * p.window + lc] : 0.0f;
        const float inv1 = 2 * t + 1 < ncols ? s_inv[(2 * t + 1) * p.window + lc] : 0.0f;
        float tmp[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int s = 0; s < kSteps; ++s) {
          const uint32_t lo = word_of(a0, s), hi = word_of(a1, s);
          const uint32_t af[4] = {fp8x2_to_f16x2(lo), fp8x2_to_f16x2(hi), fp8x2_to_f16x2(lo >> 16),
                                  fp8x2_to_f16x2(hi >> 16)};
          mma::mma_f16(tmp, af, word_of(b[(2 * s) / 4], (2 * s) % 4), word_of(b[(2 * s + 1) / 4], (2 * s + 1) % 4));
        }
        const float sw = s_scale[c / 2 - cc.w0 / 2];  // k block (64 c) / 128
        const float f0 = sw * inv0, f1 = sw * inv1;
        acc[0] = fmaf(tmp[0], f0, acc[0]);
        acc[1] = fmaf(tmp[1], f1, acc[1]);
        acc[2] = fmaf(tmp[2], f0, acc[2]);
        acc[3] = fmaf(tmp[3], f1, acc[3]);
      } else if constexpr (F == MoeFormat::BF16) {
        // Step s: words 2s (kk 2t, 2t+1) and 2s+1 (kk 2t+8, 2t+9) of the lane's 8 k, in A and B alike.
#pragma unroll
        for (int s = 0; s < kSteps; ++s) {
          const uint32_t af[4] = {word_of(a0, 2 * s), word_of(a1, 2 * s), word_of(a0, 2 * s + 1), word_of(a1, 2 * s + 1)};
          mma::mma_bf16(acc, af, word_of(b[0], 2 * s), word_of(b[0], 2 * s + 1));
        }
      } else {
        const uint32_t b_lo = sst[g * (kU * 4) + 4 * u + t], b_hi = sst[(g + 8) * (kU * 4) + 4 * u + t];
        const uint32_t s_lo = b_lo | (b_lo << 16), s_hi = b_hi | (b_hi << 16);
#pragma unroll
        for (int s = 0; s < kSteps; ++s) {
          const int wd = s / 2, h = s % 2;
          const uint32_t lo = word_of(a0, wd), hi = word_of(a1, wd);
          const uint32_t af[4] = {int4x2_to_bf16x2(lo, 2 * h, s_lo), int4x2_to_bf16x2(hi, 2 * h, s_hi),
                                  int4x2_to_bf16x2(lo, 2 * h + 1, s_lo), int4x2_to_bf16x2(hi, 2 * h + 1, s_hi)};
          mma::mma_bf16(acc, af, word_of(b[(2 * s) / 4], (2 * s) % 4), word_of(b[(2 * s + 1) / 4], (2 * s + 1) % 4));
        }
      }
    };
    if (cc.c0 + kU <= w_end) {
#pragma unroll
      for (int u = 0; u < kU; ++u) chunk(u);
    } else {
#pragma unroll
      for (int u = 0; u < kU; ++u)
        if (cc.c0 + u < w_end) chunk(u);  // warp-uniform
    }
    ++consumed;
    Cursor next = cc;
    advance(next);
    if (next.p0 != cc.p0) {
      // The pass is done: acc[i] is row row0 + g + 8 (i / 2), column p0 + 2t + i % 2.
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int col = 2 * t + i % 2;
        if (col < ncols) {
          const int64_t r = g + 8 * (i / 2);
          if (p.splits == 1) pt.y[int64_t(cc.p0 + col) * pt.y_stride + head * p.y_head_stride + row0 + r] = acc[i];
          else p.partial[(int64_t(blockIdx.x) * p.tokens + cc.p0 + col) * p.total_out + prow0 + r] = acc[i];
        }
        acc[i] = 0.0f;
      }
    }
    cc = next;
  }
  mma::cp_async_wait<0>();  // only empty groups remain; leave none in flight at exit
  if (p.splits == 1) return;

  // Split K: the row block's last CTA (ticket) sums the planes in split order (0 + s0 + s1 + ...,
  // like the reduce pass it replaces) and leaves the ticket at 0 for the next call or replay.
  __threadfence();  // this CTA's partials are visible before its ticket
  __syncthreads();
  if (tid == 0) *s_last = atomicAdd(&p.tickets[blockIdx.y], 1u) == unsigned(p.splits - 1) ? 1u : 0u;
  __syncthreads();
  if (*s_last == 0u) return;
  __threadfence();  // every other CTA's partials are visible to the loads below
  for (int p0 = 0; p0 < p.tokens; p0 += kCols) {
    const int ncols = min(kCols, p.tokens - p0);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int col = 2 * t + i % 2;
      if (col >= ncols) continue;
      const int64_t r = g + 8 * (i / 2);
      float sum = 0.0f;
      for (int s = 0; s < p.splits; ++s)
        sum += __ldcg(p.partial + (int64_t(s) * p.tokens + p0 + col) * p.total_out + prow0 + r);
      pt.y[int64_t(p0 + col) * pt.y_stride + row0 + r] = sum;
    }
  }
  if (tid == 0) p.tickets[blockIdx.y] = 0u;
}

template <MoeFormat F> void launch_dense(const DenseTcArgs& a, Stream stream) {
  DenseTcParams p{};
  p.num_parts = a.num_parts;
  p.in = a.part[0].w.in;
  int ctas = 0;
  for (int i = 0; i < a.num_parts; ++i) {
    const DenseTcPart& src = a.part[i];
    p.part[i] = DenseTcPartParams{src.w.data, src.w.scale, src.w.data_stride, src.w.scale_stride, src.y, src.y_stride,
                                  ctas};
    ctas += int(src.w.out / kActChunk);
  }
  p.total_out = int64_t(ctas) * kActChunk;
  p.x = a.x;
  p.x_stride = a.x_stride;
  p.x_vec = reinterpret_cast<uintptr_t>(a.x) % 16 == 0 && a.x_stride % 4 == 0;
  p.tokens = a.tokens;
  p.heads = a.heads;
  p.w_head_rows = a.w_head_rows;
  p.y_head_stride = a.y_head_stride;
  p.chunks_per_split = a.split.chunks_per_split;
  p.splits = int(a.split.splits);
  p.stage_cols = std::min(a.tokens, kCols);
  // The whole split's K range when it fits the budget (one staging per CTA), else the largest
  // multiple of kU chunks that does (a burst never straddles two windows).
  int window = int(a.split.chunks_per_split);
  if (stage_layout(F, window, p.stage_cols).bytes > kStageBudget) {
    window = kU;
    while (stage_layout(F, window + kU, p.stage_cols).bytes <= kStageBudget) window += kU;
  }
  p.window = window;
  p.partial = a.partial;
  p.tickets = a.tickets;
  const size_t smem = ring_bytes(F) + stage_layout(F, window, p.stage_cols).bytes + 16;  // + s_last
  MLA_GPU_CHECK(cudaFuncSetAttribute(dense_tc_kernel<F>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const dim3 grid(unsigned(a.split.splits), unsigned(ctas), unsigned(a.heads));
  mma::launch_maybe_pdl(dense_tc_kernel<F>, grid, dim3(kThreads), smem, true, stream, p);
}

}  // namespace

void dense_tc_launch(MoeFormat format, const DenseTcArgs& args, Stream stream) {
  const bool split_ok = args.split.splits == 1 || (args.heads == 1 && args.partial != nullptr && args.tickets != nullptr);
  const bool parts_ok = args.num_parts >= 1 && args.num_parts <= kDenseTcMaxParts && (args.num_parts == 1 || args.heads == 1);
  int64_t rows = 0;
  for (int i = 0; parts_ok && i < args.num_parts; ++i) {
    const DenseTcPart& pt = args.part[i];
    MLA_CHECK(dense_tc_weight_ok(format, pt.w) && pt.w.in == args.part[0].w.in && pt.y != nullptr,
              "dense_tc_launch: part {} of {}: format {} in {} out {} (part 0 in {})", i, args.num_parts, int(format),
              pt.w.in, pt.w.out, args.part[0].w.in);
    rows += pt.w.out;
  }
  MLA_CHECK(parts_ok && args.tokens > 0 && args.split.splits >= 1 && args.split.splits <= 65535 && args.heads >= 1 &&
                args.heads <= 65535 && split_ok && rows / kActChunk <= 65535 &&
                (args.heads == 1 || format != MoeFormat::FP8 || args.w_head_rows % 128 == 0),
            "dense_tc_launch: format {} parts {} in {} rows {} tokens {} heads {} splits {}", int(format),
            args.num_parts, args.part[0].w.in, rows, args.tokens, args.heads, args.split.splits);
  if (format == MoeFormat::FP8) launch_dense<MoeFormat::FP8>(args, stream);
  else if (format == MoeFormat::BF16) launch_dense<MoeFormat::BF16>(args, stream);
  else launch_dense<MoeFormat::I4_BF16>(args, stream);
}

#else  // HIP: no mma.sync; the dispatcher never picks this path.

void dense_tc_launch(MoeFormat, const DenseTcArgs&, Stream) {
  MLA_CHECK(false, "dense_tc_launch: the tensor-core decode matvec needs a CUDA build");
}

#endif  // MLA_GPU_CUDA

}  // namespace mla::gpu
