// Preset geometries: values from MODELS.md 1.1 (DeepSeek-V3 / Kimi K2-Instruct) and the tiny
// model every test and the default demo use. The tiny model is shaped to hit awkward paths on
// purpose (12 heads, not a multiple of 16; grouped routing; YaRN with a real ramp).
#include "io/presets.h"

#include <algorithm>

#include <fmt/ranges.h>

namespace mla::io {

namespace {

// Fields shared by every preset (DeepSeek-V3 defaults); each preset overwrites the geometry.
ModelConfig base_config() {
  ModelConfig c;
  c.model_type = "deepseek_v3";
  c.architectures = {"DeepseekV3ForCausalLM"};
  c.norm_topk_prob = true;
  c.scoring_func = "sigmoid";
  c.topk_method = "noaux_tc";
  c.moe_layer_freq = 1;
  c.hidden_act = "silu";
  c.attention_bias = false;
  c.tie_word_embeddings = false;
  c.rope_interleave = true;
  c.rms_norm_eps = 1e-6;
  return c;
}

ModelConfig tiny() {
  ModelConfig c = base_config();
  c.vocab_size = 512;
  c.hidden_size = 128;
  c.intermediate_size = 256;
  c.moe_intermediate_size = 64;
  c.num_hidden_layers = 4;
  c.first_k_dense_replace = 1;
  c.num_attention_heads = 12;  // deliberately not a multiple of 16: exercises head padding
  c.num_key_value_heads = 12;
  c.q_lora_rank = 64;
  c.kv_lora_rank = 64;
  c.qk_nope_head_dim = 32;
  c.qk_rope_head_dim = 16;
  c.v_head_dim = 32;
  c.n_routed_experts = 16;
  c.n_shared_experts = 1;
  c.num_experts_per_tok = 4;
  c.n_group = 4;
  c.topk_group = 2;
  c.routed_scaling_factor = 2.5;
  c.rope_theta = 10000.0;
  c.max_position_embeddings = 1024;
  c.rope_scaling.type = RopeScalingType::Yarn;
  c.rope_scaling.factor = 4.0;
  c.rope_scaling.original_max_position_embeddings = 256;
  c.rope_scaling.beta_fast = 32.0;
  c.rope_scaling.beta_slow = 1.0;
  c.rope_scaling.mscale = 1.0;          // V3-style: cos/sin factor 1, softmax scale gets m^2
  c.rope_scaling.mscale_all_dim = 1.0;
  // Kimi's id layout on a byte-level vocabulary: 256 byte tokens, then 256 special slots starting
  // with [BOS] and [EOS] (make-model writes the matching tokenizer files).
  c.bos_token_id = 256;
  c.eos_token_id = {257};
  c.num_nextn_predict_layers = 0;
  return c;
}

ModelConfig deepseek_v3() {
  ModelConfig c = base_config();
  c.vocab_size = 129280;
  c.hidden_size = 7168;
  c.intermediate_size = 18432;
  c.moe_intermediate_size = 2048;
  c.num_hidden_layers = 61;
  c.first_k_dense_replace = 3;
  c.num_attention_heads = 128;
  c.num_key_value_heads = 128;
  c.q_lora_rank = 1536;
  c.kv_lora_rank = 512;
  c.qk_nope_head_dim = 128;
  c.qk_rope_head_dim = 64;
  c.v_head_dim = 128;
  c.n_routed_experts = 256;
  c.n_shared_experts = 1;
  c.num_experts_per_tok = 8;
  c.n_group = 8;
  c.topk_group = 4;
  c.routed_scaling_factor = 2.5;
  c.rope_theta = 10000.0;
  c.max_position_embeddings = 163840;
  c.rope_scaling.type = RopeScalingType::Yarn;
  c.rope_scaling.factor = 40.0;
  c.rope_scaling.original_max_position_embeddings = 4096;
  c.rope_scaling.beta_fast = 32.0;
  c.rope_scaling.beta_slow = 1.0;
  c.rope_scaling.mscale = 1.0;
  c.rope_scaling.mscale_all_dim = 1.0;
  c.bos_token_id = 0;
  c.eos_token_id = {1};
  c.num_nextn_predict_layers = 1;
  return c;
}

// Kimi K2-Instruct (factor 32 / 131072 positions; K2-0905 and K2-Thinking use 64 / 262144).
ModelConfig kimi_k2() {
  ModelConfig c = deepseek_v3();
  c.model_type = "kimi_k2";
  c.vocab_size = 163840;
  c.num_attention_heads = 64;
  c.num_key_value_heads = 64;
  c.first_k_dense_replace = 1;
  c.n_routed_experts = 384;
  c.n_group = 1;
  c.topk_group = 1;
  c.routed_scaling_factor = 2.827;
  c.rope_theta = 50000.0;
  c.max_position_embeddings = 131072;
  c.rope_scaling.factor = 32.0;
  c.rope_scaling.beta_fast = 1.0;
  c.rope_scaling.beta_slow = 1.0;
  c.bos_token_id = 163584;
  c.eos_token_id = {163585};
  c.num_nextn_predict_layers = 0;
  return c;
}

}  // namespace

std::vector<std::string> preset_names() { return {"tiny", "deepseek-v3", "kimi-k2"}; }

Result<ModelConfig> preset_config(std::string_view name) {
  ModelConfig c;
  if (name == "tiny") {
    c = tiny();
  } else if (name == "deepseek-v3") {
    c = deepseek_v3();
  } else if (name == "kimi-k2") {
    c = kimi_k2();
  } else {
    return error("unknown preset '{}' (available: {})", name, fmt::join(preset_names(), ", "));
  }
  MLA_RETURN_IF_ERROR(validate_model_config(c, fmt::format("preset {}", name)));
  return c;
}

Status apply_overrides(ModelConfig& cfg, std::optional<int> layers, std::optional<int> experts,
                       std::optional<int> dense_layers) {
  if (layers && *layers < 1) return error("--layers: must be >= 1, got {}", *layers);
  if (experts && *experts < 1) return error("--experts: must be >= 1, got {}", *experts);
  if (dense_layers && *dense_layers < 0) return error("--dense-layers: must be >= 0, got {}", *dense_layers);
  ModelConfig c = cfg;
  if (layers) {
    c.num_hidden_layers = *layers;
    c.first_k_dense_replace = std::min(c.first_k_dense_replace, *layers);
  }
  if (experts) {
    const int e = *experts;
    c.n_routed_experts = e;
    c.num_experts_per_tok = std::min(c.num_experts_per_tok, e);
    const bool divides = e % c.n_group == 0;
    const int per_group = divides ? e / c.n_group : 0;
    const bool grouping_ok = divides && (c.n_group == 1 || per_group >= 2) && c.topk_group <= c.n_group &&
                             int64_t(c.topk_group) * per_group >= c.num_experts_per_tok;
    if (!grouping_ok) {
      c.n_group = 1;
      c.topk_group = 1;
    }
  }
  if (dense_layers) {
    if (*dense_layers > c.num_hidden_layers) {
      return error("--dense-layers: {} exceeds the model's {} layers", *dense_layers, c.num_hidden_layers);
    }
    c.first_k_dense_replace = *dense_layers;
  }
  MLA_RETURN_IF_ERROR(validate_model_config(c, "overridden config"));
  cfg = std::move(c);
  return Status::ok();
}

Result<ModelConfig> with_quantization(ModelConfig cfg, std::string_view weights) {
  QuantizationConfig q;
  if (weights == "bf16") {
    // q stays None
  } else if (weights == "fp8") {
    q.method = QuantMethod::Fp8Block;
    q.fmt = "e4m3";
    q.weight_block_size = {128, 128};
    q.activation_scheme = "dynamic";
  } else if (weights == "int4") {
    // Kimi K2 Thinking (MODELS.md 2.2): attention, shared experts, dense MLPs and lm_head stay
    // bf16; only routed experts `mlp.experts.{e}.{gate,up,down}_proj` are int4.
    q.method = QuantMethod::Int4PackGroup;
    q.format = "pack-quantized";
    q.quantization_status = "compressed";
    q.num_bits = 4;
    q.group_size = 32;
    q.targets = {"Linear"};
    q.ignore = {"lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", R"(re:.*mlp\.(gate|up|gate_up|down)_proj.*)"};
  } else {
    return error("unknown weight format '{}' (available: bf16, fp8, int4)", weights);
  }
  cfg.quantization_config = std::move(q);
  return cfg;
}

}  // namespace mla::io
