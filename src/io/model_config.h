// ModelConfig: a Hugging Face `config.json` of DeepSeek-V3 / Kimi K2 with HF key names, parsed and
// validated once so nothing downstream re-checks geometry. Trade-off: any value the forward pass
// does not implement (rope types, activations, quant schemes) is rejected rather than approximated.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace mla::io {

enum class RopeScalingType : uint8_t {
  None,  // plain RoPE ("rope_scaling" absent/null, or rope_type "default")
  Yarn,  // YaRN ("yarn"); the only scaled variant DeepSeek-V3 / Kimi K2 use
};

// `rope_scaling` (classic) or transformers-v5 `rope_parameters`. Only meaningful when type == Yarn.
// Absent optional keys keep HF's `None`, because HF's rules test presence/truthiness (see
// model/rope_yarn.h), so a default value would not reproduce HF for every input.
struct RopeScaling {
  RopeScalingType type = RopeScalingType::None;  // none | yarn
  double factor = 1.0;                           // s: context extension factor, >= 1 (HF default if
                                                 // absent: max_position_embeddings / original)
  int original_max_position_embeddings = 0;      // L0: pre-training context (HF fallback: the top-level
                                                 // key of that name, else max_position_embeddings)
  double beta_fast = 32.0;                       // rotations at which dims start being interpolated
  double beta_slow = 1.0;                        // rotations at which dims are fully interpolated
  std::optional<double> mscale;                  // cos/sin magnitude numerator exponent; HF None if absent
  std::optional<double> mscale_all_dim;          // softmax-scale mscale; absent behaves as 0 (no m^2)
  std::optional<double> attention_factor;        // explicit cos/sin multiplier; overrides the mscale rule
  bool truncate = true;                          // floor/ceil the correction range (HF default true)

  bool operator==(const RopeScaling&) const = default;
};

enum class QuantMethod : uint8_t {
  None,          // plain bf16/f32 weights
  Fp8Block,      // DeepSeek fp8: quant_method "fp8", e4m3, 128x128 weight blocks
  Int4PackGroup  // compressed-tensors "pack-quantized" W4A16, symmetric int4, group 32
};

// `quantization_config`. Only the two schemes the engine implements are representable; everything
// else is rejected at parse time with a message naming the offending key and value.
struct QuantizationConfig {
  QuantMethod method = QuantMethod::None;  // which scheme (None: key absent or null)
  // fp8 block
  std::string fmt;                         // "e4m3" (only value accepted)
  std::array<int, 2> weight_block_size{};  // [128,128] (only value accepted)
  std::string activation_scheme;           // "dynamic" (only value accepted)
  // compressed-tensors int4
  std::string format;                      // "pack-quantized"
  std::string quantization_status;         // e.g. "compressed"; kept for the writer, not interpreted
  int num_bits = 0;                        // 4
  int group_size = 0;                      // 32
  std::vector<std::string> targets;        // module classes quantized, e.g. ["Linear"]
  std::vector<std::string> ignore;         // module names kept unquantized; "re:" prefix = regex

  bool operator==(const QuantizationConfig&) const = default;
};

struct ModelConfig {
  std::string model_type;                  // "deepseek_v3" or "kimi_k2"
  std::vector<std::string> architectures;  // contains "DeepseekV3ForCausalLM" (filled in if absent)
  int vocab_size = 0;                      // rows of embed_tokens and lm_head
  int hidden_size = 0;                     // residual stream width (7168)
  int intermediate_size = 0;               // dense-layer MLP width (layers < first_k_dense_replace)
  int moe_intermediate_size = 0;           // width of each routed expert; shared = this * n_shared
  int num_hidden_layers = 0;               // decoder layers, excluding MTP layers
  int num_attention_heads = 0;             // query heads (128 V3, 64 K2)
  int num_key_value_heads = 0;             // kept for the writer; MLA does not use it
  std::optional<int> q_lora_rank;          // q_a_proj rank; nullopt (JSON null) => single q_proj
  int kv_lora_rank = 0;                    // latent c_kv width (512)
  int qk_nope_head_dim = 0;                // per-head q/k dims without RoPE (128)
  int qk_rope_head_dim = 0;                // per-head q/k dims with RoPE, even (64)
  int v_head_dim = 0;                      // per-head value width (128)
  int n_routed_experts = 0;                // routed experts per MoE layer
  int n_shared_experts = 0;                // shared experts (fused into one MLP) per MoE layer
  int num_experts_per_tok = 0;             // routed top-k
  int n_group = 0;                         // expert groups for group-limited routing
  int topk_group = 0;                      // groups kept per token
  bool norm_topk_prob = true;              // renormalize the top-k router weights
  double routed_scaling_factor = 1.0;      // multiplies routed weights (not the shared path)
  std::string scoring_func;                // "sigmoid" (only value accepted)
  std::string topk_method;                 // "noaux_tc" (only value accepted)
  int first_k_dense_replace = 0;           // layers [0, k) are dense, the rest MoE
  int moe_layer_freq = 1;                  // must be 1 (HF ignores it)
  double rms_norm_eps = 1e-6;              // eps of the layer norms (q_a/kv_a norms use 1e-6, MODELS 1.3)
  std::string hidden_act;                  // "silu" (only value accepted)
  bool attention_bias = false;             // must be false
  double rope_theta = 10000.0;             // RoPE base
  int max_position_embeddings = 0;         // longest supported context, in tokens
  bool tie_word_embeddings = false;        // lm_head shares embed_tokens
  std::optional<int> bos_token_id;         // nullopt: JSON null or absent
  std::vector<int> eos_token_id;           // int or list in JSON; empty: null or absent
  int num_nextn_predict_layers = 0;        // MTP layers stored after the decoder layers
  bool rope_interleave = true;             // checkpoint rotates interleaved pairs (MODELS 1.7)
  RopeScaling rope_scaling;                // YaRN parameters (from rope_scaling or rope_parameters)
  QuantizationConfig quantization_config;  // weight format of the checkpoint

  // Layer `layer` (0-based; MTP layers count after the decoder layers) has a MoE FFN.
  bool is_moe_layer(int layer) const { return layer >= first_k_dense_replace; }
  // Per-head query/key width: nope + rope (192).
  int qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  // Values cached per token per MLA layer: latent + rotated k_pe (576).
  int kv_cache_dim() const { return kv_lora_rank + qk_rope_head_dim; }

  bool operator==(const ModelConfig&) const = default;
};

// Parses and validates a config.json text. Never throws: every failure is a one-line error that
// starts with `source_for_errors` (e.g. "/m/config.json: ") and names the offending key.
Result<ModelConfig> parse_model_config(std::string_view json_text, const std::string& source_for_errors);

// Reads `<model_dir>/config.json` and parses it.
Result<ModelConfig> load_model_config(const std::string& model_dir);

// Re-checks a config built in code (presets, overrides) with the same rules as the parser.
Status validate_model_config(const ModelConfig& cfg, const std::string& source_for_errors);

// HF-style config.json (architectures ["DeepseekV3ForCausalLM"], classic `rope_scaling`,
// `quantization_config` when quantized). parse_model_config(to_json(c)) == c for any valid c.
nlohmann::json model_config_to_json(const ModelConfig& cfg);

// Multi-line human summary: geometry, routing, rope, quantization and parameter counts.
std::string describe(const ModelConfig& cfg);

// All weights of the main model: embeddings, lm_head (unless tied), every layer including all
// routed experts, the router and its e_score_correction_bias, and all norms. MTP layers are
// excluded (DeepSeek's "671B" is this number; the 14B MTP module comes on top). Saturates at
// INT64_MAX for absurd geometries instead of overflowing.
int64_t parameter_count(const ModelConfig& cfg);

// Weights touched for one token: parameter_count minus the routed experts not selected
// (n_routed_experts - num_experts_per_tok per MoE layer). Embedding table counted whole.
int64_t active_parameter_count(const ModelConfig& cfg);

std::string_view rope_scaling_type_name(RopeScalingType t);
std::string_view quant_method_name(QuantMethod m);

}  // namespace mla::io
