// End to end on the GPU: a make-model checkpoint loaded with DeepseekV3::load, driven step by step
// through DeepseekV3::forward (absorbed decode with decode graphs, BF16 latent cache, greedy argmax
// on the device): single-stream decode tokens/s beside the bandwidth roofline, and prefill tokens/s.
// Driving forward directly (not runtime::generate) keeps the timing to the model's own work plus
// the one 4-byte token readback per step that any single-stream server pays.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>

#include <fmt/format.h>

#include "backend/gpu/gpu_linear.h"
#include "bench_gpu.h"
#include "dist/communicator.h"
#include "model/deepseek_v3.h"
#include "runtime/kv_cache.h"

namespace mla::bench {

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

// Bytes one decode token must read at context `ctx`, from the checkpoint's own tensor sizes:
// every tensor of the main model once (attention, dense MLPs, shared experts, routers, norms,
// lm_head), one embedding row, top_k routed experts per MoE layer, and the BF16 latent cache.
struct TokenBytes {
  double dense = 0, routed = 0, embed_row = 0, cache_per_ctx = 0;
  double at(int ctx) const { return dense + routed + embed_row + cache_per_ctx * ctx; }
};
TokenBytes token_bytes(const model::DeepseekV3& m) {
  const io::ModelConfig& c = m.config();
  TokenBytes b;
  double experts_total = 0;
  for (const std::string& name : m.checkpoint().tensor_names()) {
    const io::TensorInfo* info = m.checkpoint().find(name);
    if (info == nullptr) continue;
    const double bytes = double(info->nbytes());
    int layer = -1;
    if (std::sscanf(name.c_str(), "model.layers.%d.", &layer) == 1 && layer >= c.num_hidden_layers) continue;  // MTP
    if (name.find(".mlp.experts.") != std::string::npos) experts_total += bytes;
    else if (name == "model.embed_tokens.weight") b.embed_row = bytes / c.vocab_size;
    else b.dense += bytes;
  }
  const int moe_layers = std::max(0, c.num_hidden_layers - c.first_k_dense_replace);
  if (moe_layers > 0 && c.n_routed_experts > 0)
    b.routed = experts_total / (double(moe_layers) * c.n_routed_experts) * c.num_experts_per_tok * moe_layers;
  b.cache_per_ctx = double(c.num_hidden_layers) * c.kv_cache_dim() * 2.0;
  return b;
}

// One sequence on the model: prefill a prompt in chunks, then greedy decode, timing both.
class Runner {
 public:
  Runner(model::DeepseekV3& m, ops::Backend& be, int max_ctx)
      : m_(m), be_(be), cache_(be, cache_config(m, max_ctx)) {
    for (int l = 0; l < m.num_cache_layers(); ++l) layers_.push_back(cache_.layer(l));
    logits_ = dev_tensor(be, DType::F32, {1, m.config().vocab_size});
    next_ = dev_tensor(be, DType::I32, {1});
  }
  ~Runner() { m_.clear_decode_graphs(); }

  // Prefills `prompt` (fresh sequence) in chunks of the model's max_tokens; returns wall ms.
  double prefill(const std::vector<int32_t>& prompt) {
    table_.release_all(cache_.pool());
    MLA_CHECK(table_.ensure_capacity(cache_.pool(), int(prompt.size()), kBlock), "KV cache too small");
    be_.synchronize();
    const auto t0 = Clock::now();
    const int chunk = m_.limits().max_tokens;
    for (int a = 0; a < int(prompt.size()); a += chunk) {
      const int b = std::min(int(prompt.size()), a + chunk);
      step({prompt.begin() + a, prompt.begin() + b}, a);
    }
    be_.synchronize();
    len_ = int(prompt.size());
    return ms_since(t0);
  }
  // Greedy decode of `n` tokens after prefill; returns each step's wall ms (token readback included).
  std::vector<double> decode(int n) {
    std::vector<double> ms;
    int32_t token = 0;
    be_.copy_to_host(&token, next_.view);
    for (int i = 0; i < n; ++i) {
      MLA_CHECK(table_.ensure_capacity(cache_.pool(), len_ + 1, kBlock), "KV cache too small");
      const auto t0 = Clock::now();
      step({token}, len_);
      be_.copy_to_host(&token, next_.view);  // synchronizes: the host needs the id for the next step
      ms.push_back(ms_since(t0));
      ++len_;
    }
    return ms;
  }

 private:
  static constexpr int kBlock = 64;
  static runtime::KvCacheConfig cache_config(const model::DeepseekV3& m, int max_ctx) {
    runtime::KvCacheConfig kc;
    kc.num_layers = m.num_cache_layers();
    kc.block_size = kBlock;
    kc.num_blocks = (max_ctx + kBlock - 1) / kBlock + 1;
    kc.kv_dim = m.kv_dim();
    kc.dtype = DType::BF16;
    return kc;
  }
  void step(std::vector<int32_t> ids, int start) {
    std::vector<int32_t> pos(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) pos[i] = start + int(i);
    const model::SequenceSlice seq{int(ids.size()), start + int(ids.size()), table_.blocks()};
    const int32_t last = int32_t(ids.size()) - 1;
    model::ForwardInputs in;
    in.token_ids = ids;
    in.positions = pos;
    in.seqs = {&seq, 1};
    in.logits_rows = {&last, 1};
    in.kv_cache = layers_;
    in.block_size = kBlock;
    m_.forward(in, logits_.view);
    be_.argmax(logits_.view, next_.view);
  }

  model::DeepseekV3& m_;
  ops::Backend& be_;
  runtime::KvCache cache_;
  std::vector<TensorView> layers_;
  runtime::BlockTable table_;
  DevTensor logits_, next_;
  int len_ = 0;
};

}  // namespace

// Napkin math for the default 5-layer DeepSeek-V3 FP8 model (3 dense + 2 MoE layers): per decode
// token ~0.19 GB attention x 5 + 0.40 GB dense MLP x 3 + (0.04 shared + 8 x 0.044 routed) GB x 2 +
// 1.85 GB lm_head (bf16) ~ 4.8 GB -> ~1.1 ms at 4.3 TB/s, i.e. a roofline near 900 tok/s; the full
// 61-layer model reads ~37 GB per token (~115 tok/s on one H200, were it to fit).
void bench_e2e(Report& report, const Ceilings& c, const BenchOptions& o) {
  MLA_CHECK(!o.model_dir.empty(), "e2e needs --model DIR (a make-model output)");
  auto be = make_bench_backend(true);
  dist::SingleProcessCommunicator comm;
  const int long_prompt = o.quick ? 4096 : 32768, short_prompt = 1024;
  model::ModelLimits limits;
  limits.max_tokens = 4096;
  limits.max_seqs = 1;
  limits.max_block_entries = (long_prompt + o.e2e_decode_tokens) / 64 + 2;
  const auto t_load = Clock::now();
  auto loaded = model::DeepseekV3::load(o.model_dir, *be, limits, comm);
  MLA_CHECK(loaded.is_ok(), "loading {}: {}", o.model_dir, loaded.status().message());
  model::DeepseekV3& m = **loaded;
  const double load_s = ms_since(t_load) / 1e3;
  const io::ModelConfig& cfg = m.config();
  m.set_mla_path(model::MlaPath::Auto);  // absorbed for decode-only steps, naive for prefill
  m.set_decode_graphs(true);
  const TokenBytes tb = token_bytes(m);
  std::printf("model %s: %d layers (%d dense), %d experts top-%d, loaded in %.1f s; bytes/token %.2f GB + cache\n",
              o.model_dir.c_str(), cfg.num_hidden_layers, std::min(cfg.first_k_dense_replace, cfg.num_hidden_layers),
              cfg.n_routed_experts, cfg.num_experts_per_tok, load_s, (tb.dense + tb.routed + tb.embed_row) / 1e9);

  std::mt19937 rng(23);
  auto random_prompt = [&](int n) {
    std::vector<int32_t> p(static_cast<size_t>(n));
    for (int32_t& t : p) t = int32_t(rng() % uint32_t(cfg.vocab_size));
    return p;
  };
  Runner run(m, *be, long_prompt + o.e2e_decode_tokens + 64);
  // Warm-up: sizes every grow-once scratch (full 4096-token prefill chunks over a longer context,
  // then decode) and captures the decode graph, so no timed step allocates.
  run.prefill(random_prompt(std::min(long_prompt, 2 * limits.max_tokens)));
  run.decode(4);

  // Single-stream decode after a 1024-token prompt: median step time.
  const double pf_short_ms = run.prefill(random_prompt(short_prompt));
  std::vector<double> steps = run.decode(o.e2e_decode_tokens);
  std::sort(steps.begin(), steps.end());
  const double step_ms = steps[steps.size() / 2];
  if (o.e2e_profile_steps > 0) {
    // The same kernels launched eagerly (with their PDL attributes): Nsight Compute profiles kernel
    // nodes of a graph that has programmatic edges only by failing the launch (seen on the H200,
    // 2026-12-01: LaunchFailed), so the profiled steps run outside the captured graph.
    m.set_decode_graphs(false);
    profiler_range(true);
    run.decode(o.e2e_profile_steps);
    profiler_range(false);
    m.set_decode_graphs(true);
  }
  const int mid_ctx = short_prompt + o.e2e_decode_tokens / 2;
  const double roof_tps = c.copy_gbps * 1e9 / tb.at(mid_ctx);
  report.add({"e2e", fmt::format("decode batch 1, ctx {}..{}, BF16 cache, graphs", short_prompt,
                                 short_prompt + o.e2e_decode_tokens),
              step_ms, 1e3 / step_ms, "tok/s", roof_tps, "roofline tok/s (copy BW)", 0,
              fmt::format("{:.2f} GB/token; {:.0f} GB/s achieved", tb.at(mid_ctx) / 1e9, tb.at(mid_ctx) / step_ms / 1e6),
              "decode b1"});
  // A/B in the same process, each variant with freshly captured graphs, alternating twice (the
  // sequence keeps growing, by the same steps for each): session 7's dispatch (separate q_a / kv_a
  // and gate / up launches, the shared expert as its own MLP), then linear_group's one launch, then
  // also the shared expert as a routed slot (this build's default).
  struct Variant {
    const char* name;
    bool grouped, shared_slot;
  };
  const Variant variants[] = {{"separate linears, shared expert MLP", false, false},
                              {"linear_group, shared expert MLP", true, false},
                              {"linear_group, shared expert as a routed slot", true, true}};
  for (int rep = 0; rep < 2; ++rep)
    for (const Variant& v : variants) {
      gpu::linear_set_group_one_launch(*be, v.grouped);
      m.set_fuse_shared_expert(v.shared_slot);
      m.clear_decode_graphs();
      run.decode(4);  // recapture
      std::vector<double> ab = run.decode(o.e2e_decode_tokens);
      std::sort(ab.begin(), ab.end());
      const double ab_ms = ab[ab.size() / 2];
      report.add({"e2e", fmt::format("decode batch 1, A/B {}: {}", rep + 1, v.name), ab_ms, 1e3 / ab_ms, "tok/s",
                  roof_tps, "roofline tok/s (copy BW)", 0, "same process, later context",
                  fmt::format("decode ab{} v{}", rep + 1, &v - variants)});
    }

  // Prefill: linear FLOPs (2 x active linear params, embedding excluded) + causal attention FLOPs
  // (naive: 2 H (d_qk + d_v) per query-key pair), against the bf16 GEMM ceiling.
  const double active = double(io::active_parameter_count(cfg)) - double(cfg.vocab_size) * cfg.hidden_size;
  auto prefill_row = [&](int n, double ms) {
    const double pairs = double(n) * (n + 1) / 2.0;
    const double flops = 2.0 * active * n + double(cfg.num_hidden_layers) * 2.0 * cfg.num_attention_heads *
                                                 (cfg.qk_head_dim() + cfg.v_head_dim) * pairs;
    const double ceiling_tps = c.bf16_tflops * 1e12 / (flops / n);
    report.add({"e2e", fmt::format("prefill {} tokens (chunks of {})", n, limits.max_tokens), ms, n / (ms * 1e-3),
                "tok/s", ceiling_tps, "bf16 GEMM-bound tok/s", 0,
                fmt::format("{:.1f} TFLOP/s", flops / (ms * 1e-3) / 1e12), fmt::format("prefill {}", n)});
  };
  prefill_row(short_prompt, pf_short_ms);
  prefill_row(long_prompt, run.prefill(random_prompt(long_prompt)));
  if (o.e2e_profile_prefill > 0) {
    // One more prefill of that many tokens (at most the long prompt's, which the cache was sized
    // for), alone inside the profiler range after every timing.
    profiler_range(true);
    run.prefill(random_prompt(std::min(o.e2e_profile_prefill, long_prompt)));
    profiler_range(false);
  }
  report.print("e2e");
}

}  // namespace mla::bench
