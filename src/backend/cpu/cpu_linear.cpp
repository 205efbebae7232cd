// CPU reference GEMM, out = x W^T, for every weight format. Weights stay packed: a chunk of W's rows is
// dequantized by ops::dequantize_rows (the reference dequantizer) into per-thread scratch and
// multiplied there, so memory grows by one chunk per thread, never by the whole weight.
// Threading: OpenMP is the only thread pool. OpenBLAS is set to one thread and called from one thread
// only (the serial build is not re-entrant). Mixing the two pools (OpenMP loops next to a
// multi-threaded sgemm) made both spin-wait on the same cores: 3x slower on 2 cores.
// Within that, two regimes:
//  * dot regime: every out[t, o] is `dot` (fixed 16-lane summation order) of x row t and W row o,
//    so each value is independent of how many other tokens share the call. This makes the CPU
//    reference batch-invariant (ARCHITECTURE rule 8) and is the default; it is also the right
//    kernel for few tokens (decode, bound by reading W);
//  * sgemm regime (only when batch invariance is switched off, and T > 16): one single-threaded
//    OpenBLAS sgemm per chunk. Faster prefill, but OpenBLAS's result for a row depends on how many
//    rows the call has (measured: M=1 vs M=7 differ in the last bits), so it is opt-in.
// Napkin math (decode, T=1, 7168 -> 18432 fp8): 132 MB of weights read, 264 MFLOP.
#include <omp.h>

#include <algorithm>

#include "backend/cpu/cpu_blas.h"

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_util.h"

namespace mla::cpu {

namespace {

// Token count up to which the GEMV regime is used: there the weight read dominates and sgemm's
// packing of each chunk would cost more than it saves.
constexpr int64_t kGemvMaxTokens = 16;
// Rows per chunk. GEMV regime: small, so the freshly dequantized chunk (32 x in fp32, 0.9 MB at
// in = 7168) is still in L2 when it is read back. GEMM regime: about 1 MB of fp32 per chunk (16 to
// 256 rows), wide enough for an efficient sgemm while bounding per-thread scratch at large `in`.
constexpr int64_t kGemvChunkRows = 32;
constexpr int64_t kGemmChunkFloats = int64_t(1) << 18;
constexpr int64_t kGemmMaxChunkRows = 256;  // also the chunk of in-place F32 weights (no scratch)

int64_t gemm_chunk_rows(int64_t in) {
  return std::clamp<int64_t>(kGemmChunkFloats / in / 16 * 16, 16, kGemmMaxChunkRows);
}

void check_weight(const ops::Weight& w) {
  const Status st = ops::validate_weight(w);
  MLA_CHECK(st.is_ok(), "linear: {}", st.message());
}

}  // namespace

void CpuBackend::linear(const TensorView& x, const ops::Weight& w, const TensorView& out) {
  check_view(x, DType::F32, 2, "linear x");
  check_view(out, DType::F32, 2, "linear out");
  check_weight(w);
  const int64_t num_tokens = x.dim(0), in = w.in_features, out_features = w.out_features;
  MLA_CHECK(x.dim(1) == in && out.dim(0) == num_tokens && out.dim(1) == out_features,
            "linear: x {} W [{}, {}] out {}", x.describe(), out_features, in, out.describe());
  MLA_CHECK(!views_alias(x, out), "linear: out {} aliases x {}", out.describe(), x.describe());
  if (num_tokens == 0) return;
  // A single row's stride is irrelevant; BLAS only requires ld >= the row length.
  const int64_t lda = num_tokens == 1 ? in : x.stride[0];
  const int64_t ldc = num_tokens == 1 ? out_features : out.stride[0];
  MLA_CHECK(lda >= in && ldc >= out_features, "linear: overlapping rows (x stride {}, out stride {})", lda, ldc);
  const float* xp = x.as<const float>();
  float* op = out.as<float>();

  // F32 dense weights are used in place; other formats are dequantized chunk by chunk.
  const bool in_place = w.format == ops::WeightFormat::Dense && w.data.dtype == DType::F32;
  const bool gemv = options_.batch_invariant || num_tokens <= kGemvMaxTokens;
  const int64_t chunk =
      std::min(out_features, gemv ? kGemvChunkRows : in_place ? kGemmMaxChunkRows : gemm_chunk_rows(in));
  const int64_t num_chunks = (out_features + chunk - 1) / chunk;
  // Small GEMMs run on the calling thread: waking the pool costs more than the work (and under load
  // a descheduled worker stalls the whole region).
  constexpr int64_t kParallelMinMacs = int64_t(1) << 18;
  const bool small = num_tokens * out_features * in < kParallelMinMacs;
  // Debian's serial OpenBLAS is not safe to call from several threads at once (its buffer pool is
  // unlocked: concurrent sgemm calls gave wrong, run-to-run different results), so the sgemm regime
  // runs on one thread; the dot regime parallelizes over chunks.
  const int threads = small || !gemv ? 1 : int(std::min<int64_t>(omp_get_max_threads(), num_chunks));
  float* scratch = in_place ? nullptr : grow(linear_scratch_, size_t(threads) * size_t(chunk * in));
#pragma omp parallel for schedule(dynamic) num_threads(threads)
  for (int64_t c = 0; c < num_chunks; ++c) {
    const int64_t row0 = c * chunk, rows = std::min(chunk, out_features - row0);
    const float* w_rows;  // rows [row0, row0 + rows) of W as fp32 [rows, in]
    if (in_place) {
      w_rows = w.data.as<const float>() + row0 * in;
    } else {
      float* buf = scratch + size_t(omp_get_thread_num()) * size_t(chunk * in);
      ops::dequantize_rows(w, row0, rows, buf);
      w_rows = buf;
    }
    if (gemv) {
      // Token blocks keep a few x rows hot while the chunk's W rows are swept.
      constexpr int64_t kTokenBlock = 8;
      for (int64_t t0 = 0; t0 < num_tokens; t0 += kTokenBlock)
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t t = t0; t < std::min(num_tokens, t0 + kTokenBlock); ++t)
            op[t * ldc + row0 + r] = dot(xp + t * lda, w_rows + r * in, in);
    } else {
      // out[:, row0 : row0+rows] = x [T, in] * W_rows^T [in, rows]
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(num_tokens), int(rows), int(in), 1.0f, xp, int(lda),
                  w_rows, int(in), 0.0f, op + row0, int(ldc));
    }
  }
}

// The reference runs the group as its separate calls: each out[i] is exactly linear(x, *w[i])'s.
void CpuBackend::linear_group(const TensorView& x, std::span<const ops::Weight* const> w,
                              std::span<const TensorView> out) {
  ops::check_linear_group(w, out);
  for (size_t i = 0; i < w.size(); ++i) linear(x, *w[i], out[i]);
}

CpuBackend::CpuBackend(const CpuBackendOptions& options) : options_(options) {
  // All parallelism is OpenMP's (see the top of this file); OpenBLAS runs in the calling thread.
  // This is a process-wide OpenBLAS setting: nothing else in mlaserve calls BLAS.
  openblas_set_num_threads(1);
}

}  // namespace mla::cpu
