// CPU throughput of the reference backend on a make-model geometry, reported against ceilings
// measured in the same run: OpenBLAS sgemm GFLOP/s on all cores (compute) and a large memcpy
// (memory bandwidth, bytes read + written).
// Usage: mla_bench_cpu [--preset tiny] [--layers N] [--experts E] [--dtype bf16] [--prompt 256] [--decode 128]
// Napkin math per token: FLOPs ~= 2 x (active linear parameters) + attention (2 x ctx x H x
// (d_n+d_r+d_v) naive-prefill / 2 x ctx x H x (2r+d_r) absorbed-decode); decode bytes ~= the active
// weights once per step (bf16: 2 B/param) plus the latent cache read.
#include <omp.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_blas.h"
#include "io/presets.h"
#include "model/deepseek_v3.h"
#include "model/deepseek_v3_synthetic.h"
#include "runtime/offline_engine.h"

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Best of 5 rounds of one n^3 sgemm per OpenMP thread, all threads at once (OpenBLAS is the serial
// build, so this is how it fills the cores): the machine's fp32 compute ceiling.
double sgemm_gflops(int n) {
  const int threads = omp_get_max_threads();
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> a(size_t(n) * n), b(size_t(n) * n), c(size_t(n) * n * threads);
  for (float& v : a) v = u(rng);
  for (float& v : b) v = u(rng);
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t = Clock::now();
#pragma omp parallel num_threads(threads)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f,
                c.data() + size_t(omp_get_thread_num()) * n * n, n);
    best = std::min(best, seconds_since(t));
  }
  return 2.0 * n * n * double(n) * threads / best / 1e9;
}

// Best of 5 copies of 256 MB: the memory ceiling in GB/s (bytes read + written).
double memcpy_gbps() {
  const size_t bytes = size_t(256) << 20;
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t = Clock::now();
    std::memcpy(dst.data(), src.data(), bytes);
    best = std::min(best, seconds_since(t));
  }
  return 2.0 * double(bytes) / best / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"CPU reference backend throughput against measured ceilings"};
  std::string preset = "tiny", dtype = "bf16";
  std::optional<int> layers, experts;
  int prompt_len = 256, decode_len = 128;
  app.add_option("--preset", preset);
  app.add_option("--layers", layers);
  app.add_option("--experts", experts);
  app.add_option("--dtype", dtype);
  app.add_option("--prompt", prompt_len);
  app.add_option("--decode", decode_len);
  CLI11_PARSE(app, argc, argv);

  const double ceiling_gflops = sgemm_gflops(1024);
  const double ceiling_gbps = memcpy_gbps();

  auto cfg = mla::io::preset_config(preset);
  if (!cfg || !mla::io::apply_overrides(*cfg, layers, experts)) return 1;
  auto q = mla::io::with_quantization(*cfg, dtype);
  if (!q) return 1;
  const std::string dir = (std::filesystem::temp_directory_path() / ("mla_bench_" + std::to_string(getpid()))).string();
  if (!mla::model::write_synthetic_checkpoint(*q, dir, {})) return 1;

  auto backend = mla::cpu::make_cpu_backend();
  mla::dist::SingleProcessCommunicator comm;
  mla::model::ModelLimits limits;
  limits.max_tokens = prompt_len;
  limits.max_seqs = 1;
  auto m = mla::model::DeepseekV3::load(dir, *backend, limits, comm);
  if (!m) { std::fprintf(stderr, "%s\n", m.status().message().c_str()); return 1; }
  const mla::io::ModelConfig& c = (*m)->config();

  mla::runtime::GenerationRequest req;
  std::mt19937 rng(5);
  for (int i = 0; i < prompt_len; ++i) req.prompt.push_back(int32_t(rng() % uint32_t(c.vocab_size)));
  req.max_tokens = decode_len + 1;
  req.sampling.temperature = 0;
  mla::runtime::EngineOptions opt;
  opt.max_tokens_per_step = prompt_len;
  mla::runtime::EngineStats st;
  if (!mla::runtime::generate(**m, *backend, {req}, opt, &st)) return 1;  // warm-up
  auto res = mla::runtime::generate(**m, *backend, {req}, opt, &st);
  std::filesystem::remove_all(dir);
  if (!res) return 1;

  // Active linear parameters per token (embedding lookup excluded: no FLOPs).
  const double active = double(mla::io::active_parameter_count(c)) - double(c.vocab_size) * c.hidden_size;
  const double H = c.num_attention_heads, L = c.num_hidden_layers;
  const double ctx_prefill = prompt_len / 2.0, ctx_decode = prompt_len + decode_len / 2.0;
  const double flops_prefill = 2 * active + L * 2 * ctx_prefill * H * (c.qk_head_dim() + c.v_head_dim);
  const double flops_decode = 2 * active + L * 2 * ctx_decode * H * (2.0 * c.kv_lora_rank + c.qk_rope_head_dim);
  const double bytes_decode = 2 * active + L * ctx_decode * c.kv_cache_dim() * 4.0;
  const double prefill_tps = double(prompt_len) / st.prefill_seconds;
  const double decode_tps = double(decode_len) / st.decode_seconds;
  std::printf("machine ceilings (same run): sgemm %.1f GFLOP/s on %d threads; memcpy %.1f GB/s (read+write)\n",
              ceiling_gflops, omp_get_max_threads(), ceiling_gbps);
  std::printf("model: preset %s, %s, %d layers, %.2fM active linear params/token\n", preset.c_str(), dtype.c_str(),
              c.num_hidden_layers, active / 1e6);
  std::printf("| phase | tokens | tok/s | GFLOP/s | %% of sgemm | GB/s | %% of memcpy |\n|---|---|---|---|---|---|---|\n");
  std::printf("| prefill (one %d-token step) | %d | %.0f | %.2f | %.1f%% | | |\n", prompt_len, prompt_len, prefill_tps,
              prefill_tps * flops_prefill / 1e9, 100 * prefill_tps * flops_prefill / 1e9 / ceiling_gflops);
  std::printf("| decode (batch 1) | %d | %.0f | %.2f | %.1f%% | %.2f | %.1f%% |\n", decode_len, decode_tps,
              decode_tps * flops_decode / 1e9, 100 * decode_tps * flops_decode / 1e9 / ceiling_gflops,
              decode_tps * bytes_decode / 1e9, 100 * decode_tps * bytes_decode / 1e9 / ceiling_gbps);
  return 0;
}
