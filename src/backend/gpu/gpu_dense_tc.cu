// Tensor-core decode matvec for dense layers, GemmPrecision::Bf16 (interface and constraint:
// gpu_decode_tc.h): out[T, out] = x[T, in] W^T for FP8 (128x128 block scales) and INT4 (group 32,
// BF16 scales) weights at T <= 16, and the per-head matvecs of MLA's absorption. Same number formats
// and mma fragments as the MoE kernel (gpu_decode_tc.cu, whose comment holds the fragment proof):
// FP8 weights -> exact f16, activations f16 with a power-of-two scale per 64-k chunk; INT4 -> exact
// bf16(q * s), activations bf16.
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
// scales = 27.5 us at 4.3 TB/s; x is 64 KB (fp32), read once per split from L2. Per 16-byte weight
// load a lane spends 8 cvt + 2 mma + ~3 FFMA + 2 shared loads: ~1 instruction per weight byte
// against an issue budget of ~10. In flight: a warp issues 8 chunks x 2 rows x 16 B per lane (8 KB)
// before consuming any; 4 CTAs x 4 warps per SM keep ~128 KB per SM requested, ~3x what a 4.3 TB/s
// x ~1.5 us latency product needs.
#include <algorithm>
#include <cstdint>

#include "backend/gpu/gpu_decode_tc.cuh"
#include "backend/gpu/gpu_decode_tc.h"
#include "core/status.h"

namespace mla::gpu {

using decode_tc::chunk_k;
using decode_tc::kActChunk;

namespace {

// Resident CTAs per SM (the kernel's __launch_bounds__ minimum). FP8: 4 (<= 128 registers, no
// spills) for more loads in flight; INT4 spills at 128 and keeps 3.
constexpr int dense_tc_min_blocks(MoeFormat format) { return format == MoeFormat::FP8 ? 4 : 3; }

}  // namespace

bool dense_tc_shape_ok(MoeFormat format, int64_t in, int64_t out) {
  if (format != MoeFormat::FP8 && format != MoeFormat::I4_BF16) return false;
  return in > 0 && out > 0 && in % chunk_k(format) == 0 && out % kActChunk == 0 && out / kActChunk <= 65535;
}

DenseTcSplit dense_tc_split(MoeFormat format, int64_t in, int64_t out) {
  // A CTA's time is set by the loads it keeps in flight rather than by its share of the bytes, so the
  // grid should fill the resident slots (dense_tc_min_blocks per SM, 132 SMs on an H200)
  // without a small second wave, yet keep >= 2 CTAs per SM's worth of loads. Measured with ncu on
  // the H200 (2026-11-30, batch 1, DeepSeek-V3 FP8, mean per call over a step, the three-launch
  // kernel): the 10 layers with 7168 outputs (112 row CTAs: o_proj, MLP down, shared-expert down)
  // 52.1 us at 5 splits (560 CTAs, 1.4 waves) vs 50.1 us at 3 (336 CTAs); MLP gate/up 7168 -> 18432
  // (288 row CTAs) 66.4 us at 2 splits (576) vs 74.8 us at 1 (288: too few loads in flight). Hence
  // max(2, floor(resident slots / row CTAs)) splits, at most 32 and at least one chunk each. Depends
  // on the shape only (the same for every T and every replay: a token's sums are batch-invariant).
  const int64_t kWaveCtas = dense_tc_min_blocks(format) * 132, kMaxSplits = 32;
  const int64_t row_ctas = out / kActChunk, chunks = in / chunk_k(format);
  const int64_t want =
      std::clamp<int64_t>(std::max<int64_t>(2, kWaveCtas / row_ctas), 1, std::min(chunks, kMaxSplits));
  const int64_t per = (chunks + want - 1) / want;
  return {(chunks + per - 1) / per, per};
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
constexpr int kU = 8;                               // chunks whose weight loads are in flight together
constexpr int kStageU = 4;                          // float4 loads per thread in flight while staging
constexpr size_t kStageBudget = 40 * 1024;          // dynamic shared memory per CTA (4 per SM fit)
static_assert(kCtaRows == kActChunk, "a CTA's 64 rows lie in one 128-row FP8 scale block");
static_assert(kWarpSize == 32, "mma.sync fragments assume 32-lane warps");

struct DenseTcParams {
  DeviceWeight w;
  const float* x;  // activation row r = t * heads + h at x + r * x_stride
  int64_t x_stride;
  bool x_vec;      // x and x_stride 16-byte aligned: float4 staging loads
  int tokens, heads;
  int64_t w_head_rows, y_head_stride;
  int64_t chunks_per_split;
  int splits;
  int window;      // chunks of x staged in shared memory at a time (a multiple of kU, or the split)
  int stage_cols;  // columns the shared-memory layout holds: min(tokens, kCols)
  float* y;
  int64_t y_stride;
  float* partial;  // splits > 1: [splits][tokens][out]
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
// power-of-two scale per 64-k chunk of a row; INT4 path bf16(v) stored in act_pos_i4 order. A
// half-warp covers one 64-k chunk (16 lanes x float4), so the chunk's max is a 4-step xor shuffle.
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
      } else if (e < total) {
        row[act_pos_i4(k)] = f32_to_bf16_bits(v[u].x);
        row[act_pos_i4(k + 1)] = f32_to_bf16_bits(v[u].y);
        row[act_pos_i4(k + 2)] = f32_to_bf16_bits(v[u].z);
        row[act_pos_i4(k + 3)] = f32_to_bf16_bits(v[u].w);
      }
    }
  }
}

// Grid (splits, out / 64, heads); warp w owns the m16 tile of output rows 64 blockIdx.y + 16 w of
// head blockIdx.z's matrix, over split blockIdx.x's chunks, for every token (8 columns per pass;
// a second pass re-streams the weights). See gpu_decode_tc.cu for the fragment layout.
template <MoeFormat F>
__global__ void __launch_bounds__(kThreads, dense_tc_min_blocks(F)) dense_tc_kernel(const DenseTcParams p) {
  constexpr bool kFp8 = F == MoeFormat::FP8;
  constexpr int kChunkK = int(chunk_k(F));
  constexpr int kBVec = kChunkK / 32;     // uint4 of 16-bit activations per lane per chunk
  constexpr int kSteps = kChunkK / 16;    // mma k16 steps per chunk
  constexpr int kRowUnit = kFp8 ? 1 : 4;  // bytes per data_stride unit
  extern __shared__ uint4 dense_tc_smem[];
  __shared__ unsigned s_last;
  const StageLayout l = stage_layout(F, p.window, p.stage_cols);
  char* smem = reinterpret_cast<char*>(dense_tc_smem);
  uint16_t* s_act = reinterpret_cast<uint16_t*>(smem);
  [[maybe_unused]] float* s_inv = reinterpret_cast<float*>(smem + l.inv_off);
  [[maybe_unused]] float* s_scale = reinterpret_cast<float*>(smem + l.scale_off);

  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int head = int(blockIdx.z);
  const int64_t out = p.w.out;
  const int64_t cta_row0 = int64_t(blockIdx.y) * kCtaRows, row0 = cta_row0 + warp * kTileM;
  // Head h's matrix starts at weight row h * w_head_rows (a multiple of 128 for FP8: the host checks).
  const int64_t wrow0 = int64_t(head) * p.w_head_rows;
  const int64_t c_begin = int64_t(blockIdx.x) * p.chunks_per_split;
  const int64_t c_end = min(p.w.in / kChunkK, c_begin + p.chunks_per_split);

  const uint4* arow[2];                         // lane's piece of chunk 0, rows row0 + g (+8)
  [[maybe_unused]] const uint16_t* i4_scale[2];  // INT4: group t of rows row0 + g (+8)
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t r = wrow0 + row0 + g + 8 * h;
    arow[h] = reinterpret_cast<const uint4*>(static_cast<const char*>(p.w.data) + r * p.w.data_stride * kRowUnit) + t;
    if constexpr (!kFp8) i4_scale[h] = static_cast<const uint16_t*>(p.w.scale) + r * p.w.scale_stride + t;
  }
  [[maybe_unused]] const float* fp8_scale =
      kFp8 ? static_cast<const float*>(p.w.scale) + ((wrow0 + cta_row0) / 128) * p.w.scale_stride : nullptr;

  uint4 a[kU][2];
  [[maybe_unused]] uint32_t sbits[kU][2];  // INT4: bf16 bits of the lane's group scale
  // Every weight load of chunks [c0, c0 + kU) below `lim`, before any is consumed.
  auto issue = [&](int64_t c0, int64_t lim) {
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int64_t c = c0 + u;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        a[u][h] = c < lim ? __ldcs(arow[h] + 4 * c) : make_uint4(0u, 0u, 0u, 0u);
        if constexpr (!kFp8) sbits[u][h] = c < lim ? uint32_t(i4_scale[h][4 * c]) : 0u;
      }
    }
  };

  // The weights are constant, so the first burst is issued before the previous kernel is waited on.
  const int64_t first_lim = min(c_end, c_begin + int64_t(p.window));
  issue(c_begin, first_lim);
  mma::pdl_wait();     // every CTA waits: this grid's end implies its predecessor's
  mma::pdl_trigger();  // the next grid may start (and issue its own weights) once all CTAs are here
  bool burst_ready = true;

  for (int p0 = 0; p0 < p.tokens; p0 += kCols) {  // uniform per CTA
    const int ncols = min(kCols, p.tokens - p0);
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t w0 = c_begin; w0 < c_end; w0 += p.window) {
      const int nwc = int(min(int64_t(p.window), c_end - w0));
      const int64_t w_end = w0 + nwc;
      __syncthreads();  // the previous window's readers are done
      stage_x<F>(p, l, s_act, s_inv, p0, ncols, head, w0, nwc);
      if constexpr (kFp8)
        for (int i = tid; i <= int((w_end - 1) / 2 - w0 / 2); i += kThreads) s_scale[i] = fp8_scale[w0 / 2 + i];
      __syncthreads();
      const uint16_t* srow = s_act + g * l.row_u16 + t * (kChunkK / 4);
      for (int64_t c0 = w0; c0 < w_end; c0 += kU) {
        if (!burst_ready) issue(c0, w_end);
        burst_ready = false;
#pragma unroll
        for (int u = 0; u < kU; ++u) {
          const int64_t c = c0 + u;
          if (c >= w_end) continue;  // warp-uniform; only in a window's last burst
          const int lc = int(c - w0);
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
              const uint32_t lo = word_of(a[u][0], s), hi = word_of(a[u][1], s);
              const uint32_t af[4] = {fp8x2_to_f16x2(lo), fp8x2_to_f16x2(hi), fp8x2_to_f16x2(lo >> 16),
                                      fp8x2_to_f16x2(hi >> 16)};
              mma::mma_f16(tmp, af, word_of(b[(2 * s) / 4], (2 * s) % 4), word_of(b[(2 * s + 1) / 4], (2 * s + 1) % 4));
            }
            const float sw = s_scale[c / 2 - w0 / 2];  // k block (64 c) / 128
            const float f0 = sw * inv0, f1 = sw * inv1;
            acc[0] = fmaf(tmp[0], f0, acc[0]);
            acc[1] = fmaf(tmp[1], f1, acc[1]);
            acc[2] = fmaf(tmp[2], f0, acc[2]);
            acc[3] = fmaf(tmp[3], f1, acc[3]);
          } else {
            const uint32_t s_lo = sbits[u][0] | (sbits[u][0] << 16);
            const uint32_t s_hi = sbits[u][1] | (sbits[u][1] << 16);
#pragma unroll
            for (int s = 0; s < kSteps; ++s) {
              const int wd = s / 2, h = s % 2;
              const uint32_t lo = word_of(a[u][0], wd), hi = word_of(a[u][1], wd);
              const uint32_t af[4] = {int4x2_to_bf16x2(lo, 2 * h, s_lo), int4x2_to_bf16x2(hi, 2 * h, s_hi),
                                      int4x2_to_bf16x2(lo, 2 * h + 1, s_lo), int4x2_to_bf16x2(hi, 2 * h + 1, s_hi)};
              mma::mma_bf16(acc, af, word_of(b[(2 * s) / 4], (2 * s) % 4), word_of(b[(2 * s + 1) / 4], (2 * s + 1) % 4));
            }
          }
        }
      }
    }
    // acc[i] is row row0 + g + 8 (i / 2), column p0 + 2t + i % 2 (valid when 2t + i % 2 < ncols).
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int col = 2 * t + i % 2;
      if (col >= ncols) continue;
      const int64_t row = row0 + g + 8 * (i / 2);
      if (p.splits == 1) p.y[int64_t(p0 + col) * p.y_stride + head * p.y_head_stride + row] = acc[i];
      else p.partial[(int64_t(blockIdx.x) * p.tokens + p0 + col) * out + row] = acc[i];
    }
  }
  if (p.splits == 1) return;

  // Split K: the row block's last CTA (ticket) sums the planes in split order (0 + s0 + s1 + ...,
  // like the reduce pass it replaces) and leaves the ticket at 0 for the next call or replay.
  __threadfence();  // this CTA's partials are visible before its ticket
  __syncthreads();
  if (tid == 0) s_last = atomicAdd(&p.tickets[blockIdx.y], 1u) == unsigned(p.splits - 1) ? 1u : 0u;
  __syncthreads();
  if (s_last == 0u) return;
  __threadfence();  // every other CTA's partials are visible to the loads below
  for (int p0 = 0; p0 < p.tokens; p0 += kCols) {
    const int ncols = min(kCols, p.tokens - p0);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int col = 2 * t + i % 2;
      if (col >= ncols) continue;
      const int64_t row = row0 + g + 8 * (i / 2);
      float sum = 0.0f;
      for (int s = 0; s < p.splits; ++s) sum += __ldcg(p.partial + (int64_t(s) * p.tokens + p0 + col) * out + row);
      p.y[int64_t(p0 + col) * p.y_stride + row] = sum;
    }
  }
  if (tid == 0) p.tickets[blockIdx.y] = 0u;
}

template <MoeFormat F> void launch_dense(const DenseTcArgs& a, Stream stream) {
  DenseTcParams p{};
  p.w = a.w;
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
  p.y = a.y;
  p.y_stride = a.y_stride;
  p.partial = a.partial;
  p.tickets = a.tickets;
  const size_t smem = stage_layout(F, window, p.stage_cols).bytes;
  const dim3 grid(unsigned(a.split.splits), unsigned(a.w.out / kActChunk), unsigned(a.heads));
  mma::launch_maybe_pdl(dense_tc_kernel<F>, grid, dim3(kThreads), smem, true, stream, p);
}

}  // namespace

void dense_tc_launch(MoeFormat format, const DenseTcArgs& args, Stream stream) {
  const bool split_ok = args.split.splits == 1 || (args.heads == 1 && args.partial != nullptr && args.tickets != nullptr);
  MLA_CHECK(dense_tc_shape_ok(format, args.w.in, args.w.out) && args.tokens > 0 && args.split.splits >= 1 &&
                args.split.splits <= 65535 && args.heads >= 1 && args.heads <= 65535 && split_ok &&
                (args.heads == 1 || format != MoeFormat::FP8 || args.w_head_rows % 128 == 0),
            "dense_tc_launch: format {} in {} out {} tokens {} heads {} splits {}", int(format), args.w.in,
            args.w.out, args.tokens, args.heads, args.split.splits);
  if (format == MoeFormat::FP8) launch_dense<MoeFormat::FP8>(args, stream);
  else launch_dense<MoeFormat::I4_BF16>(args, stream);
}

#else  // HIP: no mma.sync; the dispatcher never picks this path.

void dense_tc_launch(MoeFormat, const DenseTcArgs&, Stream) {
  MLA_CHECK(false, "dense_tc_launch: the tensor-core decode matvec needs a CUDA build");
}

#endif  // MLA_GPU_CUDA

}  // namespace mla::gpu
