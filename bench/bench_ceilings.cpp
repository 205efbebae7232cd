// The two ceilings every GPU number is reported against, measured in the same run (shared/GPU.md
// "Measuring"): device-to-device copy bandwidth and the cuBLASLt bf16 GEMM rate. Both use the
// vendor runtime directly, not the backend, so they bound what any kernel of ours could reach.
#include <algorithm>
#include <cstdio>

#include <fmt/format.h>

#include "bench_gpu.h"

#if MLA_GPU_CUDA
#include <cublasLt.h>
#endif

namespace mla::bench {

namespace {

struct DeviceBuffer {
  void* p = nullptr;
  explicit DeviceBuffer(size_t bytes) { MLA_GPU_CHECK(gpu::malloc(&p, bytes)); }
  ~DeviceBuffer() { (void)gpu::free(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

// 1 GiB copied device to device: bytes read + written per second. Far beyond the 60 MB L2, so every
// copy streams HBM both ways.
double copy_bandwidth(Report& report, gpu::Stream s, bool quick) {
  const size_t bytes = size_t(1) << 30;
  DeviceBuffer src(bytes), dst(bytes);
  fill_random(TensorView::contiguous(src.p, DType::U8, {int64_t(bytes)}), 1, 0, 1, s);
  TimingPlan plan;
  plan.min_reps = quick ? 5 : 20;
  plan.max_reps = quick ? 5 : 50;
  const Timing t = time_on_stream(s, plan, [&](int) { MLA_GPU_CHECK(gpu::memcpy_d2d(dst.p, src.p, bytes, s)); });
  const double gbps = 2.0 * double(bytes) / (t.median_ms * 1e-3) / 1e9;
  report.add({"ceiling", "d2d copy 1 GiB (read+write)", t.median_ms, gbps, "GB/s", 0, "", 0,
              fmt::format("min {:.3f} ms, {} reps", t.min_ms, t.reps)});
  return gbps;
}

#if MLA_GPU_CUDA
#define MLA_LT_CHECK(expr)                                                                        \
  do {                                                                                            \
    const cublasStatus_t st_ = (expr);                                                            \
    MLA_CHECK(st_ == CUBLAS_STATUS_SUCCESS, "{} failed: cublas status {}", #expr, int(st_));      \
  } while (0)

// D[m,n] = A^T B with bf16 inputs, fp32 accumulation and a bf16 or fp32 output (the "TN" layout that
// PyTorch's row-major x @ W^T maps to: A = W [m rows of k], B = x [n rows of k]). FLOPs = 2 m n k.
// Returns the median ms of the fastest of the first `candidates` heuristic algorithms (what a tuned
// library reaches at this shape) and which one it was.
struct GemmTiming {
  double ms = 0;
  int found = 0, best = 0;
};
GemmTiming time_cublas_gemm(gpu::Stream s, int64_t m, int64_t n, int64_t k, bool out_f32, int candidates,
                            bool quick) {
  DeviceBuffer a(size_t(m * k) * 2), b(size_t(k * n) * 2), d(size_t(m * n) * (out_f32 ? 4 : 2));
  const size_t ws_bytes = size_t(64) << 20;
  DeviceBuffer ws(ws_bytes);
  fill_random(TensorView::contiguous(a.p, DType::BF16, {m, k}), 2, -1, 1, s);
  fill_random(TensorView::contiguous(b.p, DType::BF16, {n, k}), 3, -1, 1, s);

  cublasLtHandle_t lt = nullptr;
  MLA_LT_CHECK(cublasLtCreate(&lt));
  cublasLtMatmulDesc_t op = nullptr;
  MLA_LT_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
  MLA_LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof trans_a));
  MLA_LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof trans_b));
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  MLA_LT_CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, uint64_t(k), uint64_t(m), k));
  MLA_LT_CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, uint64_t(k), uint64_t(n), k));
  MLA_LT_CHECK(cublasLtMatrixLayoutCreate(&ld, out_f32 ? CUDA_R_32F : CUDA_R_16BF, uint64_t(m), uint64_t(n), m));
  cublasLtMatmulPreference_t pref = nullptr;
  MLA_LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  MLA_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                    sizeof ws_bytes));
  cublasLtMatmulHeuristicResult_t cand[8] = {};
  GemmTiming r;
  MLA_LT_CHECK(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, ld, ld, pref, std::clamp(candidates, 1, 8), cand,
                                              &r.found));
  MLA_CHECK(r.found > 0, "cuBLASLt found no bf16 algorithm for {} x {} x {}", m, n, k);
  const float alpha = 1.0f, beta = 0.0f;
  r.ms = 1e30;
  for (int i = 0; i < r.found; ++i) {
    TimingPlan plan;
    // Warm-up long enough for the clocks to settle under tensor load (~0.1 s at 8192^3): one run
    // with the default 3 measured 746 TFLOP/s, the same binary 785-803 in others.
    plan.warmup = quick ? 3 : std::max(3, int(1.0e11 / (2.0 * double(m) * double(n) * double(k)) * 1000));
    plan.min_reps = quick ? 5 : 20;
    plan.max_reps = quick ? 5 : 40;
    const Timing t = time_on_stream(s, plan, [&](int) {
      MLA_LT_CHECK(cublasLtMatmul(lt, op, &alpha, a.p, la, b.p, lb, &beta, d.p, ld, d.p, ld, &cand[i].algo, ws.p,
                                  ws_bytes, s));
    });
    if (t.median_ms < r.ms) r.ms = t.median_ms, r.best = i;
  }
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatmulDescDestroy(op);
  cublasLtDestroy(lt);
  return r;
}

double bf16_gemm_rate(Report& report, gpu::Stream s, bool quick) {
  const int64_t n = 8192;
  const GemmTiming t = time_cublas_gemm(s, n, n, n, false, quick ? 1 : 4, quick);
  const double tflops = 2.0 * double(n) * double(n) * double(n) / (t.ms * 1e-3) / 1e12;
  report.add({"ceiling", "cuBLASLt bf16 8192^3 (fp32 acc, bf16 out)", t.ms, tflops, "TFLOP/s", 0, "", 0,
              fmt::format("best of {} heuristic algos (#{})", t.found, t.best)});
  return tflops;
}
#endif

}  // namespace

Ceilings measure_ceilings(Report& report, bool quick) {
  gpu::Stream s = nullptr;
  MLA_GPU_CHECK(gpu::stream_create(&s));
  Ceilings c;
  c.copy_gbps = copy_bandwidth(report, s, quick);
#if MLA_GPU_CUDA
  c.bf16_tflops = bf16_gemm_rate(report, s, quick);
#endif
  MLA_GPU_CHECK(gpu::stream_sync(s));
  MLA_GPU_CHECK(gpu::stream_destroy(s));
  report.print("ceiling");
  return c;
}

double cublas_bf16_gemm_ms(gpu::Stream stream, int64_t m, int64_t n, int64_t k, bool out_f32, bool quick) {
#if MLA_GPU_CUDA
  return time_cublas_gemm(stream, m, n, k, out_f32, quick ? 1 : 4, quick).ms;
#else
  (void)stream, (void)m, (void)n, (void)k, (void)out_f32, (void)quick;
  return 0;
#endif
}

}  // namespace mla::bench
