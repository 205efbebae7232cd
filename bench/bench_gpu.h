// Shared scaffolding of `mla_bench_gpu`: GPU-event timing (median of many repetitions after a
// warm-up), random device/host fills (never time zeros), and the result table every benchmark
// appends to (measured value, ceiling measured in the same run, fraction, target).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/gpu/gpu.h"
#include "core/tensor.h"
#include "ops/backend.h"
#include "ops/weight.h"

namespace mla::bench {

// A GPU backend (bench_gpu_main.cpp) for one benchmark section: its placed weights are freed with it.
// `bf16_gemm` picks GemmPrecision::Bf16 (serving) over Fp32. Aborts with the reason when no GPU.
std::unique_ptr<ops::Backend> make_bench_backend(bool bf16_gemm);

// ---- device helpers (bench_gpu_device.cu) -------------------------------------------------------
// The stream every op of `backend` (a GpuBackend) is enqueued on: events are recorded there.
gpu::Stream backend_stream(ops::Backend& backend);
// Uniform random values in [lo, hi) written by a kernel on `stream` (F32, BF16), or random bytes
// (any other dtype; F8_E4M3 avoids the two NaN codes). Deterministic in `seed`.
void fill_random(const TensorView& v, uint64_t seed, float lo, float hi, gpu::Stream stream);
// A kernel that spins for about `microseconds`: enqueued before a timed batch so the host can queue
// every repetition while the GPU is busy (the events then time kernels, not launch latency).
void spin(gpu::Stream stream, double microseconds);
// Starts / stops the profiler's collection range (cudaProfilerStart / Stop): a profiler started with
// collection off (`ncu --profile-from-start off`) then records only the kernels in between.
void profiler_range(bool start);
// Runs `call` once inside a profiler range, the backend's queue drained before and after, so the
// range holds that call's kernels and nothing else (--profile-calls).
void profile_once(ops::Backend& backend, const std::function<void()>& call);
// The current device as the reports name it: "NAME, N SMs" (N as this process sees it: an MPS
// client held to a share of the SMs sees that share; tools/gpu_standin.sh).
std::string device_description();
// One launch of the dense-decode read-pattern probe (bench_gpu_device.cu): reads every byte of the
// [rows, row_bytes] matrix at `w` once, `lanes_per_row` (4, 8 or 32) lanes per row per load, or
// (-2, -3; CUDA) through a cp.async shared-memory ring of that many stages; K cut into `splits`
// ranges; `sink` is a device word it may write.
void row_read_probe(gpu::Stream stream, const void* w, int64_t rows, int64_t row_bytes, int lanes_per_row, int splits,
                    unsigned* sink);

// ---- host helpers (bench_gpu_util.cpp) ----------------------------------------------------------
// Deterministic 64-bit hash (splitmix64 finalizer): the host PRNG, parallel by element index.
inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
inline float unit_float(uint64_t h) { return float(h >> 40) * (1.0f / 16777216.0f); }  // [0, 1)

// Host-resident packed weight (storage + the ops::Weight viewing it), and the same placed on a device.
struct HostWeight {
  std::vector<uint64_t> data, scale;  // 8-byte aligned raw bytes
  ops::Weight w;
};
// Random weights in the packing of ops/weight.h (same layout as tests/unit/cpu_test_util.h
// make_dense/make_fp8/make_int4): BF16 dense values in [-amp, amp); FP8 e4m3 codes drawn uniformly
// (NaN codes excluded) with per-128x128-block scales ~ amp/448 (what amax/448 gives); INT4 random
// nibbles with BF16 group-32 scales ~ amp/7. Values never all zero. OpenMP-parallel.
enum class BenchWeight { BF16, FP8, INT4 };
const char* bench_weight_name(BenchWeight k);
void make_host_weight(HostWeight& hw, BenchWeight kind, int64_t out, int64_t in, uint64_t seed, float amp = 0.05f);
// Copies the weight's tensors to the backend (place_weight), returning the device-side Weight.
ops::Weight place(ops::Backend& backend, const HostWeight& hw);
// Bytes of a weight's data + scales (what a kernel must read once).
uint64_t weight_bytes(const ops::Weight& w);

// An owning device tensor (backend.alloc) and its contiguous view.
struct DevTensor {
  Buffer buf;
  TensorView view;
};
DevTensor dev_tensor(ops::Backend& backend, DType dtype, std::initializer_list<int64_t> dims);
DevTensor dev_from_host(ops::Backend& backend, const std::vector<int32_t>& values);

// ---- timing -------------------------------------------------------------------------------------
struct Timing {
  double median_ms = 0, min_ms = 0, max_ms = 0;
  int reps = 0;
  std::vector<double> per_rep_ms;  // in issue order (rep i ran fn(i))
};
struct TimingPlan {
  int warmup = 3;             // untimed calls first (grow-once scratch, heuristics, clocks)
  int min_reps = 10;          // at least this many timed calls
  int max_reps = 200;         // and at most this many
  double budget_ms = 1500;    // stop adding batches once this much GPU time was measured
};
// Times fn(rep) on `stream` with one event before and after each call, in batches queued behind a
// spin kernel; returns per-call times and their median.
Timing time_on_stream(gpu::Stream stream, const TimingPlan& plan, const std::function<void(int rep)>& fn);

// ---- results ------------------------------------------------------------------------------------
struct Row {
  std::string bench, case_name;
  double time_ms = 0;        // median per call
  double value = 0;          // measured rate, in `unit`
  std::string unit;          // "GB/s" or "TFLOP/s" or "tok/s"
  double ceiling = 0;        // same unit, measured in this run (0: none)
  std::string ceiling_name;  // e.g. "copy BW"
  double target = 0;         // fraction asked for by the issue (0: none)
  std::string note;
  std::string key;           // short label for gpu_check.sh's one-line summary (e.g. "16h", "fp8 b1")
};
class Report {
 public:
  void add(Row row);
  // Prints the markdown table of every row so far (or only rows of `bench`).
  void print(const std::string& bench = "") const;
  // Writes `dir`/bench_gpu.json and `dir`/bench_gpu.md (no-op for an empty dir).
  void write(const std::string& dir, const std::string& command) const;
  const std::vector<Row>& rows() const { return rows_; }
  void set_device(std::string device) { device_ = std::move(device); }

 private:
  std::vector<Row> rows_;
  std::string device_;
};

// Ceilings measured once per run (bench_ceilings.cpp); 0 where not measured.
struct Ceilings {
  double copy_gbps = 0;       // device-to-device copy, bytes read + written per second / 1e9
  double bf16_tflops = 0;     // cuBLASLt bf16 8192^3, fp32 accumulate
};
Ceilings measure_ceilings(Report& report, bool quick);
// Median ms of cuBLASLt alone on D[m, n] = W[m, k] x[n, k]^T (bf16 in, fp32 accumulate, fp32 or bf16
// out), fastest of its first 4 heuristic algorithms (1 when quick): a per-shape reference beside the
// 8192^3 ceiling. 0 on builds without cuBLASLt.
double cublas_bf16_gemm_ms(gpu::Stream stream, int64_t m, int64_t n, int64_t k, bool out_f32, bool quick);

// The benchmarks (each adds rows and prints its table).
struct BenchOptions {
  bool quick = false;                      // fewer cases / reps (a smoke run)
  std::vector<int> decode_contexts;  // mla-decode: more contexts for the 16-head row (batch decode_batch)
  int decode_batch = 64;             // mla-decode: sequences of the batch rows (64: the target's)
  std::vector<int> prefill_contexts = {16384, 32768, 65536, 131072};
  int prefill_query_chunk = 4096;          // queries at the end of the context; 0 = the whole context
  std::string model_dir;                   // e2e: a make-model output
  int e2e_decode_tokens = 128;
  int e2e_profile_steps = 0;               // e2e: decode steps run inside profiler_range after the timing
  int e2e_profile_prefill = 0;             // e2e: a prompt of this many tokens prefilled inside profiler_range last
  bool profile_calls = false;              // moe, gemm: each case once more inside profiler_range
  // moe: decode path variants timed in turn on each case (same process, same inputs), e.g.
  // "fused,2grid,fused,2grid"; each is "auto", "fused" or "2grid", optionally "+nosplit" (no gate/up
  // K split). Empty: the backend's default only.
  std::vector<std::string> moe_variants;
};
void bench_mla_decode(Report& report, const Ceilings& c, const BenchOptions& o);
void bench_mla_prefill(Report& report, const Ceilings& c, const BenchOptions& o);
void bench_moe_decode(Report& report, const Ceilings& c, const BenchOptions& o);
void bench_moe_prefill(Report& report, const Ceilings& c, const BenchOptions& o);
void bench_dense_decode(Report& report, const Ceilings& c, const BenchOptions& o);
void bench_gemm(Report& report, const Ceilings& c, const BenchOptions& o);
void bench_e2e(Report& report, const Ceilings& c, const BenchOptions& o);

}  // namespace mla::bench
