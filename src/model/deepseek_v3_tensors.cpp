#include "model/deepseek_v3_tensors.h"

#include <regex>

#include <fmt/format.h>

namespace mla::model {

namespace {

// Appends the tensors of decoder layer L (attention, norms, dense MLP or MoE per is_moe_layer(L)).
void append_decoder_layer_specs(const io::ModelConfig& c, int L, std::vector<TensorSpec>& s) {
  const int64_t hid = c.hidden_size, H = c.num_attention_heads;
  const int64_t dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim, dv = c.v_head_dim, r = c.kv_lora_rank;
  const std::string p = fmt::format("model.layers.{}.", L);
  auto add = [&](std::string name, std::vector<int64_t> shape, TensorRole role) {
    s.push_back({p + name, std::move(shape), role, L});
  };
  add("input_layernorm.weight", {hid}, TensorRole::Norm);
  if (c.q_lora_rank) {
    const int64_t qr = *c.q_lora_rank;
    add("self_attn.q_a_proj.weight", {qr, hid}, TensorRole::Linear);
    add("self_attn.q_a_layernorm.weight", {qr}, TensorRole::Norm);
    add("self_attn.q_b_proj.weight", {H * (dn + dr), qr}, TensorRole::Linear);
  } else {
    add("self_attn.q_proj.weight", {H * (dn + dr), hid}, TensorRole::Linear);
  }
  add("self_attn.kv_a_proj_with_mqa.weight", {r + dr, hid}, TensorRole::Linear);
  add("self_attn.kv_a_layernorm.weight", {r}, TensorRole::Norm);
  add("self_attn.kv_b_proj.weight", {H * (dn + dv), r}, TensorRole::Linear);
  add("self_attn.o_proj.weight", {hid, H * dv}, TensorRole::Linear);
  add("post_attention_layernorm.weight", {hid}, TensorRole::Norm);
  auto mlp = [&](const std::string& prefix, int64_t width) {
    add(prefix + "gate_proj.weight", {width, hid}, TensorRole::Linear);
    add(prefix + "up_proj.weight", {width, hid}, TensorRole::Linear);
    add(prefix + "down_proj.weight", {hid, width}, TensorRole::Linear);
  };
  if (!c.is_moe_layer(L)) {
    mlp("mlp.", c.intermediate_size);
  } else {
    add("mlp.gate.weight", {c.n_routed_experts, hid}, TensorRole::Router);
    add("mlp.gate.e_score_correction_bias", {c.n_routed_experts}, TensorRole::RouterBias);
    for (int e = 0; e < c.n_routed_experts; ++e) mlp(fmt::format("mlp.experts.{}.", e), c.moe_intermediate_size);
    if (c.n_shared_experts > 0) mlp("mlp.shared_experts.", int64_t(c.moe_intermediate_size) * c.n_shared_experts);
  }
}

}  // namespace

std::vector<TensorSpec> deepseek_v3_tensor_specs(const io::ModelConfig& c) {
  const int64_t hid = c.hidden_size;
  std::vector<TensorSpec> s;
  s.push_back({"model.embed_tokens.weight", {c.vocab_size, hid}, TensorRole::Embedding, -1});
  for (int L = 0; L < c.num_hidden_layers; ++L) append_decoder_layer_specs(c, L, s);
  s.push_back({"model.norm.weight", {hid}, TensorRole::Norm, -1});
  if (!c.tie_word_embeddings) s.push_back({"lm_head.weight", {c.vocab_size, hid}, TensorRole::Linear, -1});
  return s;
}

std::vector<TensorSpec> deepseek_v3_mtp_tensor_specs(const io::ModelConfig& c) {
  const int64_t hid = c.hidden_size;
  std::vector<TensorSpec> s;
  for (int i = 0; i < c.num_nextn_predict_layers; ++i) {
    const int L = c.num_hidden_layers + i;
    const std::string p = fmt::format("model.layers.{}.", L);
    s.push_back({p + "enorm.weight", {hid}, TensorRole::Norm, L});
    s.push_back({p + "hnorm.weight", {hid}, TensorRole::Norm, L});
    s.push_back({p + "eh_proj.weight", {hid, 2 * hid}, TensorRole::Linear, L});
    append_decoder_layer_specs(c, L, s);
    s.push_back({p + "shared_head.norm.weight", {hid}, TensorRole::Norm, L});
    s.push_back({p + "shared_head.head.weight", {c.vocab_size, hid}, TensorRole::Linear, L});
  }
  return s;
}

bool is_mtp_only_tensor(const TensorSpec& spec) {
  if (spec.layer < 0) return false;
  const std::string local = spec.name.substr(fmt::format("model.layers.{}.", spec.layer).size());
  return local == "enorm.weight" || local == "hnorm.weight" || local == "eh_proj.weight" ||
         local.starts_with("shared_head.");
}

std::string module_name(const std::string& weight_name) {
  constexpr std::string_view suffix = ".weight";
  if (weight_name.size() > suffix.size() && weight_name.ends_with(suffix))
    return weight_name.substr(0, weight_name.size() - suffix.size());
  return weight_name;
}

StoredFormat stored_format(const io::ModelConfig& cfg, const TensorSpec& spec) {
  if (spec.role != TensorRole::Linear) return StoredFormat::Dense;
  // MTP's eh_proj and shared_head.head are plain (unquantized) linears in the reference engines,
  // like lm_head; the loader detects the stored format from the tensors either way.
  if (is_mtp_only_tensor(spec)) return StoredFormat::Dense;
  const std::string module = module_name(spec.name);
  switch (cfg.quantization_config.method) {
    case io::QuantMethod::None:
      return StoredFormat::Dense;
    case io::QuantMethod::Fp8Block:
      return spec.name.starts_with("lm_head") ? StoredFormat::Dense : StoredFormat::Fp8Block;
    case io::QuantMethod::Int4PackGroup:
      for (const std::string& pattern : cfg.quantization_config.ignore) {
        if (pattern.starts_with("re:")) {
          // compressed-tensors applies Python's re.match: anchored at the start, not at the end.
          try {
            if (std::regex_search(module, std::regex(pattern.substr(3)), std::regex_constants::match_continuous))
              return StoredFormat::Dense;
          } catch (const std::regex_error&) {
            // An invalid pattern ignores nothing; the loader still detects formats from the tensors.
          }
        } else if (pattern == module || module.ends_with("." + pattern)) {
          return StoredFormat::Dense;
        }
      }
      return StoredFormat::Int4Group;
  }
  return StoredFormat::Dense;
}

}  // namespace mla::model
