// `mla_bench_gpu`: the GPU benchmarks of docs/performance.md in one binary. Ceilings (copy
// bandwidth, cuBLASLt bf16 GEMM) are measured first in every run; each benchmark prints its table
// and the whole report goes to --out (JSON + markdown). Run by tools/gpu_check.sh on the GPU host.
// Usage: mla_bench_gpu [--only mla-decode,moe,moe-prefill,dense-decode,...] [--out DIR] [--quick] [--model DIR]
#include <cstdio>
#include <set>
#include <string>

#include <CLI/CLI.hpp>

#include "backend/gpu/gpu_backend.h"
#include "bench_gpu.h"

namespace mla::bench {

std::unique_ptr<ops::Backend> make_bench_backend(bool bf16_gemm) {
  gpu::GpuBackendOptions opt;
  opt.gemm_precision = bf16_gemm ? gpu::GemmPrecision::Bf16 : gpu::GemmPrecision::Fp32;
  auto be = gpu::make_gpu_backend(opt);
  MLA_CHECK(be.is_ok(), "mla_bench_gpu: {}", be.status().message());
  return std::move(*be);
}

}  // namespace mla::bench

int main(int argc, char** argv) {
  using namespace mla::bench;
  CLI::App app{"GPU benchmarks against ceilings measured in the same run"};
  std::string only = "mla-decode,mla-prefill,moe,gemm", out_dir;
  BenchOptions o;
  app.add_option("--only", only,
                 "Comma-separated subset of: ceilings, mla-decode, mla-prefill, moe, moe-prefill, dense-decode, gemm, e2e "
                 "(ceilings always run; moe-prefill (~11 GB of experts) and dense-decode (GemvTc per DeepSeek shape) "
                 "are not in the default list)")
      ->capture_default_str();
  app.add_option("--out", out_dir, "Write bench_gpu.json and bench_gpu.md here");
  app.add_flag("--quick", o.quick, "Smaller sizes and fewer repetitions (a smoke run, not a measurement)");
  app.add_option("--model", o.model_dir, "e2e: a `mlaserve make-model` output directory");
  app.add_option("--decode-tokens", o.e2e_decode_tokens, "e2e: decode steps timed")->capture_default_str();
  app.add_option("--profile-steps", o.e2e_profile_steps,
                 "e2e: after the timed run, decode this many more steps inside a profiler range (run under "
                 "`ncu --profile-from-start off` to see only decode kernels)")
      ->capture_default_str();
  app.add_option("--profile-prefill", o.e2e_profile_prefill,
                 "e2e: after everything else, prefill a prompt of this many tokens inside a profiler range (`ncu "
                 "--profile-from-start off` then sees that prefill's kernels and nothing else)")
      ->check(CLI::Range(0, 1 << 20));
  app.add_flag("--profile-calls", o.profile_calls,
               "moe, gemm, mla-decode (its main rows): after timing each case, call it once more inside a "
               "profiler range (`ncu --profile-from-start off` then sees one call of each case and nothing else)");
  bool moe_ab = false;
  app.add_flag("--moe-ab", moe_ab,
               "moe: time each case twice on the fused persistent grid and twice on the two-grid path, "
               "alternating (same process, same inputs); the same as --moe-variants fused,2grid,fused,2grid");
  app.add_option("--moe-variants", o.moe_variants,
                 "moe: comma-separated decode variants timed in turn on each case: auto | fused | 2grid, optionally "
                 "+nosplit (no gate/up K split) and +noring (INT4 weights through register bursts, not the rings)")
      ->delimiter(',');
  app.add_option("--decode-batch", o.decode_batch,
                 "mla-decode: sequences of the batch rows (the target's 64; fewer keeps one wave on a GPU held to "
                 "fewer SMs, tools/gpu_standin.sh)")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  app.add_option("--decode-contexts", o.decode_contexts,
                 "mla-decode: contexts besides 4096 for the 16-head batch row (how the op's fixed costs "
                 "per call amortize)");
  app.add_option("--prefill-contexts", o.prefill_contexts, "mla-prefill: context lengths")->capture_default_str();
  app.add_option("--prefill-query-chunk", o.prefill_query_chunk,
                 "mla-prefill: queries at the end of the context (0 = q_len = context)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (moe_ab && o.moe_variants.empty()) o.moe_variants = {"fused", "2grid", "fused", "2grid"};

  std::set<std::string> want;
  for (size_t a = 0; a <= only.size();) {
    const size_t b = std::min(only.find(',', a), only.size());
    if (b > a) want.insert(only.substr(a, b - a));
    a = b + 1;
  }
  for (const std::string& w : want)
    if (!std::set<std::string>{"ceilings", "mla-decode", "mla-prefill", "moe", "moe-prefill", "dense-decode", "gemm",
                               "e2e"}
             .count(w)) {
      std::fprintf(stderr, "mla_bench_gpu: unknown benchmark '%s'\n", w.c_str());
      return 2;
    }
  if (!mla::gpu::gpu_available()) {
    std::fprintf(stderr, "mla_bench_gpu: no GPU visible\n");
    return 1;
  }
  std::string command;
  for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);

  Report report;
  const std::string device = device_description();
  report.set_device(device);
  std::printf("== device: %s\n\n== ceilings\n", device.c_str());
  const Ceilings c = measure_ceilings(report, o.quick);
  struct Entry {
    const char* name;
    void (*fn)(Report&, const Ceilings&, const BenchOptions&);
  };
  for (const Entry& e : {Entry{"mla-decode", bench_mla_decode}, Entry{"mla-prefill", bench_mla_prefill},
                         Entry{"moe", bench_moe_decode}, Entry{"moe-prefill", bench_moe_prefill},
                         Entry{"dense-decode", bench_dense_decode},
                         Entry{"gemm", bench_gemm}, Entry{"e2e", bench_e2e}}) {
    if (!want.count(e.name)) continue;
    std::printf("\n== %s\n", e.name);
    std::fflush(stdout);
    e.fn(report, c, o);
    report.write(out_dir, command);  // after each benchmark, so a later crash keeps earlier rows
  }
  std::printf("\n== summary\n");
  report.print();
  report.write(out_dir, command);
  return 0;
}
