// Planner arithmetic. Model geometries are flat tensor lists so that parameters, stored bytes and
// scale tensors come from one loop; throughput is a roofline over datasheet peaks (no efficiency
// factors), so decode/prefill figures are ceilings that a real engine approaches but never beats.
#include "plan/planner.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "io/presets.h"

namespace mla::plan {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Stored bytes of one copy of `t` under format `f`; `scales` receives the scale-tensor part.
double tensor_bytes(const TensorGroup& t, WeightFormat f, double& scales) {
  const double n = double(t.rows) * double(t.cols);
  scales = 0;
  if (t.f32) return 4 * n;
  if (t.linear) {
    const bool expert = t.component == Component::RoutedExperts;
    if (f == WeightFormat::Fp8 && (expert || t.component == Component::Attention ||
                                   t.component == Component::DenseFfn || t.component == Component::SharedExperts)) {
      scales = 4.0 * double(ceil_div(t.rows, 128) * ceil_div(t.cols, 128));  // f32 per 128x128 block
      return n + scales;
    }
    if (f == WeightFormat::Int4 && expert) {
      scales = 2.0 * double(t.rows * ceil_div(t.cols, 32));  // bf16 per 32 inputs
      return n / 2 + scales;
    }
    if (f == WeightFormat::Mxfp4 && expert) {
      scales = 1.0 * double(t.rows * ceil_div(t.cols, 32));  // e8m0 per 32 inputs
      return n / 2 + scales;
    }
  }
  return 2 * n;
}

// Dense tensor rate used for the format: W4A16 int4 computes in bf16; mxfp4 uses the fp4 units
// where the chip has them. Falls back to whatever rate the chip does list.
double tflops_for(const GpuSpec& g, WeightFormat f) {
  std::optional<double> r;
  switch (f) {
    case WeightFormat::Bf16: case WeightFormat::Int4: r = g.bf16_tflops; break;
    case WeightFormat::Fp8: r = g.fp8_tflops; break;
    case WeightFormat::Mxfp4: r = g.fp4_tflops ? g.fp4_tflops : g.fp8_tflops; break;
  }
  if (!r) r = g.bf16_tflops ? g.bf16_tflops : g.fp8_tflops ? g.fp8_tflops : g.fp4_tflops;
  return r.value_or(0);
}

void add(ModelGeometry& m, std::string name, Component c, int64_t rows, int64_t cols, int64_t count, bool linear,
         bool f32 = false) {
  if (count > 0) m.tensors.push_back({std::move(name), c, rows, cols, count, linear, f32});
}

}  // namespace

std::string_view component_name(Component c) {
  switch (c) {
    case Component::Embedding: return "embedding";
    case Component::Attention: return "attention";
    case Component::DenseFfn: return "dense_ffn";
    case Component::RoutedExperts: return "routed_experts";
    case Component::SharedExperts: return "shared_experts";
    case Component::LmHead: return "lm_head";
    case Component::Other: return "others";
  }
  return "?";
}

Result<WeightFormat> parse_weight_format(std::string_view s) {
  if (s == "bf16") return WeightFormat::Bf16;
  if (s == "fp8") return WeightFormat::Fp8;
  if (s == "int4") return WeightFormat::Int4;
  if (s == "mxfp4") return WeightFormat::Mxfp4;
  return error("--weights: unknown format \"{}\" (bf16 | fp8 | int4 | mxfp4)", s);
}

std::string_view weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::Bf16: return "bf16";
    case WeightFormat::Fp8: return "fp8";
    case WeightFormat::Int4: return "int4";
    case WeightFormat::Mxfp4: return "mxfp4";
  }
  return "?";
}

ModelGeometry geometry_from_config(const io::ModelConfig& c, std::string name) {
  ModelGeometry m;
  m.name = std::move(name);
  const int64_t h = c.hidden_size, L = c.num_hidden_layers, heads = c.num_attention_heads;
  const int64_t dense = std::min<int64_t>(c.first_k_dense_replace, L), moe = L - dense;
  const int64_t E = c.n_routed_experts, w = c.moe_intermediate_size;
  add(m, "embed_tokens", Component::Embedding, c.vocab_size, h, 1, false);
  if (!c.tie_word_embeddings) add(m, "lm_head", Component::LmHead, c.vocab_size, h, 1, false);
  add(m, "norms (model.norm, input/post_attention)", Component::Other, h, 1, 1 + 2 * L, false);
  if (c.q_lora_rank) {
    add(m, "q_a_proj", Component::Attention, *c.q_lora_rank, h, L, true);
    add(m, "q_a_layernorm", Component::Attention, *c.q_lora_rank, 1, L, false);
    add(m, "q_b_proj", Component::Attention, heads * c.qk_head_dim(), *c.q_lora_rank, L, true);
  } else {
    add(m, "q_proj", Component::Attention, heads * c.qk_head_dim(), h, L, true);
  }
  add(m, "kv_a_proj_with_mqa", Component::Attention, c.kv_cache_dim(), h, L, true);
  add(m, "kv_a_layernorm", Component::Attention, c.kv_lora_rank, 1, L, false);
  add(m, "kv_b_proj", Component::Attention, heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank, L, true);
  add(m, "o_proj", Component::Attention, h, heads * c.v_head_dim, L, true);
  add(m, "mlp.{gate,up}_proj", Component::DenseFfn, c.intermediate_size, h, 2 * dense, true);
  add(m, "mlp.down_proj", Component::DenseFfn, h, c.intermediate_size, dense, true);
  add(m, "gate.weight", Component::Other, E, h, moe, false);
  add(m, "gate.e_score_correction_bias", Component::Other, E, 1, moe, false, true);
  add(m, "experts.{gate,up}_proj", Component::RoutedExperts, w, h, 2 * E * moe, true);
  add(m, "experts.down_proj", Component::RoutedExperts, h, w, E * moe, true);
  const int64_t sw = w * c.n_shared_experts;
  add(m, "shared_experts.{gate,up}_proj", Component::SharedExperts, sw, h, 2 * moe, true);
  add(m, "shared_experts.down_proj", Component::SharedExperts, h, sw, moe, true);
  m.mla_layers = int(L);
  m.kv_lora_rank = c.kv_lora_rank;
  m.qk_rope_head_dim = c.qk_rope_head_dim;
  m.attention_heads = int(heads);
  m.moe_layers = int(moe);
  m.routed_experts = int(E);
  m.experts_per_token = c.num_experts_per_tok;
  switch (c.quantization_config.method) {
    case io::QuantMethod::None: m.shipped = WeightFormat::Bf16; break;
    case io::QuantMethod::Fp8Block: m.shipped = WeightFormat::Fp8; break;
    case io::QuantMethod::Int4PackGroup: m.shipped = WeightFormat::Int4; break;
  }
  return m;
}

ModelGeometry kimi_k3_geometry() {
  ModelGeometry m;
  m.name = "kimi-k3";
  m.shipped = WeightFormat::Mxfp4;
  const int64_t h = 7168, L = 93, mla = 24, kda = 69, heads = 96, vocab = 163840;
  const int64_t qr = 1536, kvr = 512, nope = 128, rope = 64, vd = 128;
  const int64_t kh = 96, kd = 128, kw = kh * kd, conv = 4;
  const int64_t E = 896, ew = 3072, latent = 3584, shared = 6144, dense_w = 33792, moe = L - 1;
  add(m, "embed_tokens", Component::Embedding, vocab, h, 1, false);
  add(m, "lm_head", Component::LmHead, vocab, h, 1, false);
  // Per layer: input/post_attention norms, two AttnRes norms, two AttnRes projections [1,h]; plus
  // model.norm and the output AttnRes norm/projection.
  add(m, "norms and attention-residual mixers", Component::Other, h, 1, 6 * L + 3, false);
  // MLA (MODELS 3.3): DeepSeek tensors with 96 heads and an output gate g_proj.
  add(m, "mla.q_a_proj", Component::Attention, qr, h, mla, true);
  add(m, "mla.q_a_layernorm", Component::Attention, qr, 1, mla, false);
  add(m, "mla.q_b_proj", Component::Attention, heads * (nope + rope), qr, mla, true);
  add(m, "mla.kv_a_proj_with_mqa", Component::Attention, kvr + rope, h, mla, true);
  add(m, "mla.kv_a_layernorm", Component::Attention, kvr, 1, mla, false);
  add(m, "mla.kv_b_proj", Component::Attention, heads * (nope + vd), kvr, mla, true);
  add(m, "mla.g_proj", Component::Attention, heads * vd, h, mla, true);
  add(m, "mla.o_proj", Component::Attention, h, heads * vd, mla, true);
  // KDA (MODELS 3.6).
  add(m, "kda.{q,k,v,g}_proj", Component::Attention, kw, h, 4 * kda, true);
  add(m, "kda.{q,k,v}_conv1d", Component::Attention, kw, conv, 3 * kda, false, true);
  add(m, "kda.f_a_proj", Component::Attention, kd, h, kda, true);
  add(m, "kda.f_b_proj", Component::Attention, kw, kd, kda, true);
  add(m, "kda.A_log", Component::Attention, kd, 1, kda, false, true);
  add(m, "kda.dt_bias", Component::Attention, kw, 1, kda, false, true);
  add(m, "kda.b_proj", Component::Attention, kh, h, kda, true);
  add(m, "kda.o_norm", Component::Attention, kd, 1, kda, false, true);
  add(m, "kda.o_proj", Component::Attention, h, kw, kda, true);
  // Layer 0 dense MLP; layers 1..92 latent MoE (MODELS 3.4).
  add(m, "mlp.{gate,up}_proj", Component::DenseFfn, dense_w, h, 2, true);
  add(m, "mlp.down_proj", Component::DenseFfn, h, dense_w, 1, true);
  add(m, "gate.weight", Component::Other, E, h, moe, false);
  add(m, "gate.e_score_correction_bias", Component::Other, E, 1, moe, false, true);
  add(m, "routed_expert_down_proj", Component::Other, latent, h, moe, false);
  add(m, "routed_expert_norm", Component::Other, latent, 1, moe, false);
  add(m, "routed_expert_up_proj", Component::Other, h, latent, moe, false);
  add(m, "experts.w{1,3}", Component::RoutedExperts, ew, latent, 2 * E * moe, true);
  add(m, "experts.w2", Component::RoutedExperts, latent, ew, E * moe, true);
  add(m, "shared_experts.{gate,up}_proj", Component::SharedExperts, shared, h, 2 * moe, true);
  add(m, "shared_experts.down_proj", Component::SharedExperts, h, shared, moe, true);
  m.mla_layers = int(mla);
  m.kv_lora_rank = int(kvr);
  m.qk_rope_head_dim = int(rope);
  m.attention_heads = int(heads);
  m.kda_layers = int(kda);
  m.kda_heads = int(kh);
  m.kda_head_dim = int(kd);
  m.kda_conv_kernel = int(conv);
  m.moe_layers = int(moe);
  m.routed_experts = int(E);
  m.experts_per_token = 16;
  return m;
}

std::vector<std::string> plan_preset_names() { return {"deepseek-v3", "kimi-k2", "kimi-k2-thinking", "kimi-k3"}; }

Result<ModelGeometry> plan_preset(std::string_view name) {
  if (name == "kimi-k3") return kimi_k3_geometry();
  std::string base(name), weights = "fp8";
  if (name == "kimi-k2-thinking") base = "kimi-k2", weights = "int4";
  if (base != "deepseek-v3" && base != "kimi-k2")
    return error("--preset: unknown \"{}\" (one of {})", name, fmt::join(plan_preset_names(), ", "));
  MLA_ASSIGN_OR_RETURN(io::ModelConfig c, io::preset_config(base));
  MLA_ASSIGN_OR_RETURN(c, io::with_quantization(std::move(c), weights));
  return geometry_from_config(c, std::string(name));
}

Result<PlanResult> plan(const ModelGeometry& m, const GpuSpec& g, const PlanInput& in) {
  if (in.gpus < 1) return error("--gpus: must be >= 1, got {}", in.gpus);
  const int tp = in.tp ? in.tp : in.gpus, ep = in.ep ? in.ep : in.gpus;
  if (tp < 1 || in.gpus % tp) return error("--tp: must divide --gpus {}, got {}", in.gpus, tp);
  if (ep < 1 || in.gpus % ep) return error("--ep: must divide --gpus {}, got {}", in.gpus, ep);
  if (in.context < 1) return error("--context: must be >= 1, got {}", in.context);
  if (in.concurrency < 1) return error("--concurrency: must be >= 1, got {}", in.concurrency);
  if (m.routed_experts > 0 && (m.experts_per_token < 1 || m.experts_per_token > m.routed_experts))
    return error("{}: experts per token must be in [1, {}]", m.name, m.routed_experts);

  PlanResult r;
  r.model = m.name;
  r.gpu = g.key;
  r.gpus = in.gpus, r.tp = tp, r.ep = ep;
  double expert_params = 0;
  for (const TensorGroup& t : m.tensors) {
    double scales = 0;
    const double bytes = tensor_bytes(t, in.weights, scales) * double(t.count);
    const int64_t params = t.rows * t.cols * t.count;
    ComponentStat& s = r.by_component[int(t.component)];
    s.params += params;
    s.bytes += bytes;
    r.total_params += params;
    r.weight_bytes += bytes;
    r.scale_bytes += scales * double(t.count);
    if (t.component == Component::RoutedExperts) r.expert_bytes += bytes, expert_params += double(params);
  }
  const double k_frac = m.routed_experts ? double(m.experts_per_token) / m.routed_experts : 0;
  r.active_params = r.total_params - int64_t(std::llround(expert_params * (1 - k_frac)));
  const double nonexpert_bytes = r.weight_bytes - r.expert_bytes;
  r.weight_bytes_per_gpu = nonexpert_bytes / tp + r.expert_bytes / ep;

  r.kv_bytes_per_token = double(m.mla_layers) * (m.kv_lora_rank + m.qk_rope_head_dim) * in.cache_dtype_bytes;
  // KDA: fp32 state S [H,K,K] plus the last (kernel-1) bf16 inputs of the q, k and v convolutions.
  const double kw = double(m.kda_heads) * m.kda_head_dim;
  r.state_bytes_per_seq = double(m.kda_layers) * (4.0 * kw * m.kda_head_dim + 3.0 * kw * (m.kda_conv_kernel - 1) * 2);

  r.fit_rule = fmt::format(
      "usable = {:.0f}% of HBM per GPU; weights per GPU = non-expert/tp + routed experts/ep; KV budget per GPU = "
      "usable - weights - {:.1f} GB workspace; the MLA latent is replicated across the tp ranks of a group, so "
      "total KV budget = per-GPU budget x gpus/tp; fits = weights fit and the budget holds one {}-token sequence",
      in.usable_fraction * 100, in.workspace_gb, in.context);
  r.usable_bytes_per_gpu = in.usable_fraction * g.memory_gb * 1e9;
  r.kv_budget_bytes_per_gpu = r.usable_bytes_per_gpu - r.weight_bytes_per_gpu - in.workspace_gb * 1e9;
  r.weights_fit = r.kv_budget_bytes_per_gpu > 0;
  r.kv_budget_bytes = std::max(0.0, r.kv_budget_bytes_per_gpu) * (in.gpus / tp);
  const double per_seq = double(in.context) * r.kv_bytes_per_token + r.state_bytes_per_seq;
  r.kv_tokens = r.kv_bytes_per_token > 0 ? r.kv_budget_bytes / r.kv_bytes_per_token : 0;
  r.max_concurrency = per_seq > 0 ? int64_t(r.kv_budget_bytes / per_seq) : 0;
  r.fits = r.weights_fit && r.max_concurrency >= 1;
  r.batch = std::min<int64_t>(in.concurrency, std::max<int64_t>(r.max_concurrency, 1));

  // FLOPs per token: 2 per active matmul weight (embedding is a lookup) plus attention over the
  // context: MLA absorbed scores + values over the latent, KDA ~7 H*K*V for decay/update/readout.
  const double matmul_flops = 2.0 * double(r.active_params - r.by_component[int(Component::Embedding)].params);
  auto attn_flops = [&](double ctx) {
    return double(m.mla_layers) * 2.0 * m.attention_heads * (2.0 * m.kv_lora_rank + m.qk_rope_head_dim) * ctx +
           double(m.kda_layers) * 7.0 * kw * m.kda_head_dim;
  };
  const double rate = tflops_for(g, in.weights) * 1e12 * in.gpus, bw = g.hbm_tbps * 1e12 * in.gpus;
  // Decode step over `batch` sequences at full context. Every attention replica (gpus/tp) reads its
  // non-expert weights; each expert replica (gpus/ep) reads the distinct experts its share of the
  // batch routes to (expected count E(1-(1-k/E)^b)); every sequence reads its cache and rewrites its state.
  const double B = double(r.batch), ctx = double(in.context);
  double expert_read = 0;
  if (m.routed_experts > 0 && m.moe_layers > 0) {
    const double per_expert = r.expert_bytes / (double(m.routed_experts) * m.moe_layers);
    const double replicas = double(in.gpus / ep), b = std::max(1.0, B / replicas);
    const double touched = m.routed_experts * (1 - std::pow(1 - k_frac, b));
    expert_read = replicas * touched * per_expert * m.moe_layers;
  }
  const double bytes = nonexpert_bytes * (in.gpus / tp) + expert_read + B * (ctx * r.kv_bytes_per_token + 2 * r.state_bytes_per_seq);
  const double flops = B * (matmul_flops + attn_flops(ctx));
  const double t_mem = bytes / bw, t_compute = rate > 0 ? flops / rate : 0;
  const double step = std::max(t_mem, t_compute);
  r.decode_bandwidth_bound = t_mem >= t_compute;
  r.decode_tok_s = r.fits ? B / step : 0;
  r.decode_tok_s_per_user = r.fits ? 1 / step : 0;
  r.prefill_tok_s = r.fits && rate > 0 ? rate / (matmul_flops + attn_flops(ctx / 2)) : 0;
  r.price_per_hour = g.price_per_gpu_hour * in.gpus;
  if (r.decode_tok_s > 0) r.usd_per_mtok_output = r.price_per_hour / 3600 / r.decode_tok_s * 1e6;
  if (r.prefill_tok_s > 0) r.usd_per_mtok_input = r.price_per_hour / 3600 / r.prefill_tok_s * 1e6;
  return r;
}

nlohmann::json plan_to_json(const PlanResult& r) {
  nlohmann::json comps = nlohmann::json::object();
  for (int i = 0; i < kNumComponents; ++i)
    comps[std::string(component_name(Component(i)))] = {{"params", r.by_component[i].params},
                                                        {"bytes", r.by_component[i].bytes}};
  return {{"model", r.model}, {"gpu", r.gpu}, {"gpus", r.gpus}, {"tp", r.tp}, {"ep", r.ep},
          {"total_params", r.total_params}, {"active_params", r.active_params}, {"components", comps},
          {"weight_bytes", r.weight_bytes}, {"scale_bytes", r.scale_bytes},
          {"weight_bytes_per_gpu", r.weight_bytes_per_gpu}, {"kv_bytes_per_token", r.kv_bytes_per_token},
          {"state_bytes_per_seq", r.state_bytes_per_seq}, {"usable_bytes_per_gpu", r.usable_bytes_per_gpu},
          {"kv_budget_bytes", r.kv_budget_bytes}, {"weights_fit", r.weights_fit}, {"fits", r.fits},
          {"kv_tokens", r.kv_tokens}, {"max_concurrency", r.max_concurrency}, {"batch", r.batch},
          {"decode_tok_s", r.decode_tok_s}, {"decode_tok_s_per_user", r.decode_tok_s_per_user},
          {"decode_bandwidth_bound", r.decode_bandwidth_bound}, {"prefill_tok_s", r.prefill_tok_s},
          {"price_per_hour", r.price_per_hour}, {"usd_per_mtok_output", r.usd_per_mtok_output},
          {"usd_per_mtok_input", r.usd_per_mtok_input}, {"fit_rule", r.fit_rule}};
}

std::string describe_plan(const PlanResult& r) {
  std::string s = fmt::format("{} on {}x {} (tp {}, ep {})\n", r.model, r.gpus, r.gpu, r.tp, r.ep);
  for (int i = 0; i < kNumComponents; ++i)
    s += fmt::format("  {:<15} {:>10.2f}B params {:>10.1f} GB\n", component_name(Component(i)),
                     double(r.by_component[i].params) / 1e9, r.by_component[i].bytes / 1e9);
  s += fmt::format("total {:.3f}B params ({:.2f}B active), {:.1f} GB weights ({:.2f} GB scales), {:.1f} GB/GPU\n",
                   double(r.total_params) / 1e9, double(r.active_params) / 1e9, r.weight_bytes / 1e9,
                   r.scale_bytes / 1e9, r.weight_bytes_per_gpu / 1e9);
  s += fmt::format("cache: {:.0f} B/token MLA latent, {:.1f} MB/sequence KDA state\n", r.kv_bytes_per_token,
                   r.state_bytes_per_seq / 1e6);
  s += fmt::format("fits: {} (weights {}); KV budget {:.1f} GB = {:.0f} tokens, max concurrency {}\n",
                   r.fits ? "yes" : "no", r.weights_fit ? "fit" : "do not fit", r.kv_budget_bytes / 1e9, r.kv_tokens,
                   r.max_concurrency);
  s += fmt::format("roofline at batch {}: decode {:.0f} tok/s ({:.1f} per user, {}), prefill {:.0f} tok/s\n", r.batch,
                   r.decode_tok_s, r.decode_tok_s_per_user, r.decode_bandwidth_bound ? "bandwidth-bound" : "compute-bound",
                   r.prefill_tok_s);
  s += fmt::format("cost: ${:.2f}/h; ${:.3f}/Mtok output, ${:.3f}/Mtok input\n", r.price_per_hour,
                   r.usd_per_mtok_output, r.usd_per_mtok_input);
  s += "rule: " + r.fit_rule + "\n";
  return s;
}

}  // namespace mla::plan
