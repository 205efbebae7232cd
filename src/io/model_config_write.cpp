// ModelConfig -> config.json, the human summary, and parameter counts. The writer emits exactly
// the keys the parser reads (plus HF boilerplate it ignores), so parse(write(c)) == c; counts use
// saturating arithmetic because they are also shown for configs nobody could allocate.
#include <cmath>
#include <limits>

#include <fmt/ranges.h>

#include "io/model_config.h"

namespace mla::io {

namespace {

using nlohmann::json;

constexpr int64_t kSat = std::numeric_limits<int64_t>::max();

int64_t sat_mul(int64_t a, int64_t b) {
  int64_t r = 0;
  return __builtin_mul_overflow(a, b, &r) ? kSat : r;
}
int64_t sat_add(int64_t a, int64_t b) {
  int64_t r = 0;
  return __builtin_add_overflow(a, b, &r) ? kSat : r;
}
int64_t sat_mul3(int64_t a, int64_t b, int64_t c) { return sat_mul(sat_mul(a, b), c); }

// Parameter groups of one decoder layer (MODELS 1.2 tensor list).
int64_t attention_params(const ModelConfig& c) {
  const int64_t h = c.hidden_size, heads = c.num_attention_heads;
  int64_t n = 0;
  if (c.q_lora_rank) {
    const int64_t r = *c.q_lora_rank;
    n = sat_add(n, sat_mul(h, r));                       // q_a_proj [r, h]
    n = sat_add(n, r);                                   // q_a_layernorm
    n = sat_add(n, sat_mul3(r, heads, c.qk_head_dim())); // q_b_proj [heads*qk_head, r]
  } else {
    n = sat_add(n, sat_mul3(h, heads, c.qk_head_dim())); // q_proj [heads*qk_head, h]
  }
  n = sat_add(n, sat_mul(h, c.kv_cache_dim()));                                    // kv_a_proj_with_mqa
  n = sat_add(n, c.kv_lora_rank);                                                  // kv_a_layernorm
  n = sat_add(n, sat_mul3(c.kv_lora_rank, heads, c.qk_nope_head_dim + c.v_head_dim));  // kv_b_proj
  n = sat_add(n, sat_mul3(heads, c.v_head_dim, h));                                // o_proj
  return n;
}
int64_t expert_params(const ModelConfig& c) { return sat_mul3(3, c.hidden_size, c.moe_intermediate_size); }
int64_t moe_params(const ModelConfig& c, int64_t experts_counted) {
  int64_t n = sat_mul(experts_counted, expert_params(c));
  n = sat_add(n, sat_mul(c.n_shared_experts, expert_params(c)));            // shared_experts (fused)
  n = sat_add(n, sat_mul(c.n_routed_experts, int64_t(c.hidden_size) + 1));  // gate.weight + correction bias
  return n;
}

int64_t count(const ModelConfig& c, bool active_only) {
  const int64_t h = c.hidden_size;
  int64_t n = sat_mul(c.vocab_size, h);                     // embed_tokens
  if (!c.tie_word_embeddings) n = sat_add(n, sat_mul(c.vocab_size, h));  // lm_head
  n = sat_add(n, h);                                         // model.norm
  const int64_t per_layer = sat_add(attention_params(c), 2 * h);  // + input/post_attention norms
  const int64_t dense_ffn = sat_mul3(3, h, c.intermediate_size);
  const int64_t moe_ffn = moe_params(c, active_only ? c.num_experts_per_tok : c.n_routed_experts);
  const int64_t dense_layers = c.first_k_dense_replace;
  const int64_t moe_layers = int64_t(c.num_hidden_layers) - dense_layers;
  n = sat_add(n, sat_mul(c.num_hidden_layers, per_layer));
  n = sat_add(n, sat_mul(dense_layers, dense_ffn));
  n = sat_add(n, sat_mul(moe_layers, moe_ffn));
  return n;
}

std::string human_count(int64_t n) {
  if (n == kSat) return "overflow";
  const double d = double(n);
  if (d >= 1e12) return fmt::format("{:.3f}T", d / 1e12);
  if (d >= 1e9) return fmt::format("{:.2f}B", d / 1e9);
  if (d >= 1e6) return fmt::format("{:.2f}M", d / 1e6);
  if (d >= 1e3) return fmt::format("{:.1f}K", d / 1e3);
  return fmt::format("{}", n);
}

json quantization_to_json(const QuantizationConfig& q) {
  if (q.method == QuantMethod::Fp8Block) {
    return json{{"quant_method", "fp8"},
                {"fmt", q.fmt},
                {"activation_scheme", q.activation_scheme},
                {"weight_block_size", json::array({q.weight_block_size[0], q.weight_block_size[1]})}};
  }
  // Shape of compressed-tensors' own serialization (Kimi K2 Thinking), one weight-only group.
  json weights = {{"num_bits", q.num_bits}, {"type", "int"},         {"symmetric", true},
                  {"strategy", "group"},    {"group_size", q.group_size}, {"dynamic", false},
                  {"actorder", nullptr},    {"block_structure", nullptr}, {"observer", "minmax"}};
  json group = {{"targets", q.targets},
                {"weights", weights},
                {"input_activations", nullptr},
                {"output_activations", nullptr}};
  json j = {{"quant_method", "compressed-tensors"},
            {"format", q.format},
            {"config_groups", {{"group_0", group}}},
            {"ignore", q.ignore},
            {"kv_cache_scheme", nullptr}};
  if (!q.quantization_status.empty()) j["quantization_status"] = q.quantization_status;
  return j;
}

}  // namespace

json model_config_to_json(const ModelConfig& c) {
  json j;
  j["architectures"] = c.architectures.empty() ? json::array({"DeepseekV3ForCausalLM"}) : json(c.architectures);
  j["model_type"] = c.model_type;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["moe_intermediate_size"] = c.moe_intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["q_lora_rank"] = c.q_lora_rank ? json(*c.q_lora_rank) : json(nullptr);
  j["kv_lora_rank"] = c.kv_lora_rank;
  j["qk_nope_head_dim"] = c.qk_nope_head_dim;
  j["qk_rope_head_dim"] = c.qk_rope_head_dim;
  j["v_head_dim"] = c.v_head_dim;
  j["n_routed_experts"] = c.n_routed_experts;
  j["n_shared_experts"] = c.n_shared_experts;
  j["num_experts_per_tok"] = c.num_experts_per_tok;
  j["n_group"] = c.n_group;
  j["topk_group"] = c.topk_group;
  j["norm_topk_prob"] = c.norm_topk_prob;
  j["routed_scaling_factor"] = c.routed_scaling_factor;
  j["scoring_func"] = c.scoring_func;
  j["topk_method"] = c.topk_method;
  j["first_k_dense_replace"] = c.first_k_dense_replace;
  j["moe_layer_freq"] = c.moe_layer_freq;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["hidden_act"] = c.hidden_act;
  j["attention_bias"] = c.attention_bias;
  j["attention_dropout"] = 0.0;
  j["rope_theta"] = c.rope_theta;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["bos_token_id"] = c.bos_token_id ? json(*c.bos_token_id) : json(nullptr);
  if (c.eos_token_id.empty()) {
    j["eos_token_id"] = nullptr;
  } else if (c.eos_token_id.size() == 1) {
    j["eos_token_id"] = c.eos_token_id[0];
  } else {
    j["eos_token_id"] = c.eos_token_id;
  }
  j["num_nextn_predict_layers"] = c.num_nextn_predict_layers;
  j["rope_interleave"] = c.rope_interleave;
  j["torch_dtype"] = "bfloat16";
  j["use_cache"] = true;
  const RopeScaling& y = c.rope_scaling;
  if (y.type == RopeScalingType::Yarn) {
    json r = {{"type", "yarn"},
              {"factor", y.factor},
              {"original_max_position_embeddings", y.original_max_position_embeddings},
              {"beta_fast", y.beta_fast},
              {"beta_slow", y.beta_slow}};
    if (y.mscale) r["mscale"] = *y.mscale;
    if (y.mscale_all_dim) r["mscale_all_dim"] = *y.mscale_all_dim;
    if (y.attention_factor) r["attention_factor"] = *y.attention_factor;
    if (!y.truncate) r["truncate"] = false;
    j["rope_scaling"] = r;
  } else {
    j["rope_scaling"] = nullptr;
  }
  if (c.quantization_config.method != QuantMethod::None) {
    j["quantization_config"] = quantization_to_json(c.quantization_config);
  }
  return j;
}

int64_t parameter_count(const ModelConfig& cfg) { return count(cfg, false); }
int64_t active_parameter_count(const ModelConfig& cfg) { return count(cfg, true); }

std::string describe(const ModelConfig& c) {
  std::string s;
  auto line = [&s](const std::string& l) { s += l; s += '\n'; };
  line(fmt::format("model: {} ({})", c.model_type, fmt::join(c.architectures, ", ")));
  line(fmt::format("layers: {} ({} dense, {} MoE) + {} MTP; hidden {}; vocab {}; tied embeddings {}",
                   c.num_hidden_layers, c.first_k_dense_replace, c.num_hidden_layers - c.first_k_dense_replace,
                   c.num_nextn_predict_layers, c.hidden_size, c.vocab_size, c.tie_word_embeddings ? "yes" : "no"));
  line(fmt::format("attention: MLA, {} heads; q_lora_rank {}; kv_lora_rank {}; qk {} nope + {} rope; v {}; "
                   "latent cache {} values/token/layer",
                   c.num_attention_heads, c.q_lora_rank ? std::to_string(*c.q_lora_rank) : "none (q_proj)",
                   c.kv_lora_rank, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim, c.kv_cache_dim()));
  line(fmt::format("moe: {} routed experts, top-{} ({} groups, keep {}), {} shared; expert width {}, dense width {}; "
                   "routed_scaling_factor {}; norm_topk_prob {}",
                   c.n_routed_experts, c.num_experts_per_tok, c.n_group, c.topk_group, c.n_shared_experts,
                   c.moe_intermediate_size, c.intermediate_size, c.routed_scaling_factor, c.norm_topk_prob));
  const RopeScaling& y = c.rope_scaling;
  std::string rope = fmt::format("rope: theta {}; max positions {}; {}", c.rope_theta, c.max_position_embeddings,
                                 c.rope_interleave ? "interleaved pairs" : "half-split");
  if (y.type == RopeScalingType::Yarn) {
    rope += fmt::format("; yarn factor {} (original {}, beta {}/{}, mscale {}/{}{}{})", y.factor,
                        y.original_max_position_embeddings, y.beta_fast, y.beta_slow,
                        y.mscale ? fmt::format("{}", *y.mscale) : "-",
                        y.mscale_all_dim ? fmt::format("{}", *y.mscale_all_dim) : "-",
                        y.attention_factor ? fmt::format(", attention_factor {}", *y.attention_factor) : "",
                        y.truncate ? "" : ", untruncated");
  }
  line(rope);
  line(fmt::format("norm eps {}; act {}; bos {}; eos [{}]", c.rms_norm_eps, c.hidden_act,
                   c.bos_token_id ? std::to_string(*c.bos_token_id) : "none", fmt::join(c.eos_token_id, ", ")));
  const QuantizationConfig& q = c.quantization_config;
  switch (q.method) {
    case QuantMethod::None: line("weights: unquantized"); break;
    case QuantMethod::Fp8Block:
      line(fmt::format("weights: fp8 {} blocks {}x{}, {} activations", q.fmt, q.weight_block_size[0],
                       q.weight_block_size[1], q.activation_scheme));
      break;
    case QuantMethod::Int4PackGroup:
      line(fmt::format("weights: int{} symmetric group {} ({}), targets [{}], ignore [{}]", q.num_bits, q.group_size,
                       q.format, fmt::join(q.targets, ", "), fmt::join(q.ignore, ", ")));
      break;
  }
  const int64_t total = parameter_count(c), active = active_parameter_count(c);
  line(fmt::format("parameters: {} total ({}), {} active per token; MTP layers not counted", human_count(total),
                   total, human_count(active)));
  return s;
}

}  // namespace mla::io
