// ModelConfig parsing, validation, round trip, presets and parameter counts. The configs are
// written out by hand from the published files (MODELS.md 1.1, 2.1, 2.2); expected parameter
// counts are recomputed here from the tensor list, not taken from the code under test.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>

#include <nlohmann/json.hpp>

#include "io/model_config.h"
#include "io/presets.h"

namespace mla::io {
namespace {

using nlohmann::json;

// DeepSeek-V3 config.json with the full key set of the published file (including the keys HF
// and we ignore: auto_map, ep_size, torch_dtype, ...).
constexpr const char* kDeepSeekV3 = R"json({
  "architectures": ["DeepseekV3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "auto_map": {
    "AutoConfig": "configuration_deepseek.DeepseekV3Config",
    "AutoModel": "modeling_deepseek.DeepseekV3Model",
    "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"
  },
  "aux_loss_alpha": 0.001,
  "bos_token_id": 0,
  "eos_token_id": 1,
  "ep_size": 1,
  "first_k_dense_replace": 3,
  "hidden_act": "silu",
  "hidden_size": 7168,
  "initializer_range": 0.02,
  "intermediate_size": 18432,
  "kv_lora_rank": 512,
  "max_position_embeddings": 163840,
  "model_type": "deepseek_v3",
  "moe_intermediate_size": 2048,
  "moe_layer_freq": 1,
  "n_group": 8,
  "n_routed_experts": 256,
  "n_shared_experts": 1,
  "norm_topk_prob": true,
  "num_attention_heads": 128,
  "num_experts_per_tok": 8,
  "num_hidden_layers": 61,
  "num_key_value_heads": 128,
  "num_nextn_predict_layers": 1,
  "pretraining_tp": 1,
  "q_lora_rank": 1536,
  "qk_nope_head_dim": 128,
  "qk_rope_head_dim": 64,
  "quantization_config": {
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "quant_method": "fp8",
    "weight_block_size": [128, 128]
  },
  "rms_norm_eps": 1e-06,
  "rope_scaling": {
    "beta_fast": 32,
    "beta_slow": 1,
    "factor": 40,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "original_max_position_embeddings": 4096,
    "type": "yarn"
  },
  "rope_theta": 10000,
  "routed_scaling_factor": 2.5,
  "scoring_func": "sigmoid",
  "seq_aux": true,
  "tie_word_embeddings": false,
  "topk_group": 4,
  "topk_method": "noaux_tc",
  "torch_dtype": "bfloat16",
  "transformers_version": "4.33.1",
  "use_cache": true,
  "v_head_dim": 128,
  "vocab_size": 129280
})json";

// Kimi K2-Instruct style: model_type kimi_k2, yarn with beta 1/1 via `rope_type`, eos as a list.
constexpr const char* kKimiK2 = R"json({
  "architectures": ["DeepseekV3ForCausalLM"],
  "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config",
               "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"},
  "model_type": "kimi_k2",
  "vocab_size": 163840, "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
  "num_hidden_layers": 61, "num_attention_heads": 64, "num_key_value_heads": 64,
  "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
  "n_routed_experts": 384, "n_shared_experts": 1, "num_experts_per_tok": 8, "n_group": 1, "topk_group": 1,
  "norm_topk_prob": true, "routed_scaling_factor": 2.827, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
  "first_k_dense_replace": 1, "moe_layer_freq": 1, "rms_norm_eps": 1e-06, "hidden_act": "silu",
  "attention_bias": false, "rope_theta": 50000.0, "max_position_embeddings": 131072,
  "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096,
                   "beta_fast": 1.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0},
  "tie_word_embeddings": false, "bos_token_id": 163584, "eos_token_id": [163585, 163586],
  "num_nextn_predict_layers": 0,
  "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                          "weight_block_size": [128, 128]}
})json";

// Kimi K2 Thinking's compressed-tensors block (MODELS.md 2.2).
constexpr const char* kInt4Quant = R"json({
  "config_groups": {
    "group_0": {
      "input_activations": null,
      "output_activations": null,
      "targets": ["Linear"],
      "weights": {"actorder": null, "block_structure": null, "dynamic": false, "group_size": 32,
                  "num_bits": 4, "observer": "minmax", "observer_kwargs": {}, "strategy": "group",
                  "symmetric": true, "type": "int"}
    }
  },
  "format": "pack-quantized",
  "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
  "kv_cache_scheme": null,
  "quant_method": "compressed-tensors",
  "quantization_status": "compressed"
})json";

constexpr const char* kSource = "/models/x/config.json";

json v3() { return json::parse(kDeepSeekV3); }

ModelConfig parse_ok(const json& j) {
  auto r = parse_model_config(j.dump(), kSource);
  EXPECT_TRUE(r.is_ok()) << r.status().message();
  return r.is_ok() ? r.value() : ModelConfig{};
}

// Applies `mutate` to the V3 config, parses, and checks the one-line error names `key` (and
// `also`, when given) after the source prefix.
void expect_error(const std::function<void(json&)>& mutate, const std::string& key, const std::string& also = "") {
  json j = v3();
  mutate(j);
  auto r = parse_model_config(j.dump(), kSource);
  ASSERT_FALSE(r.is_ok()) << "expected an error naming " << key;
  const std::string m = r.status().message();
  EXPECT_EQ(m.rfind(std::string(kSource) + ": ", 0), 0u) << m;
  EXPECT_NE(m.find(key), std::string::npos) << m;
  if (!also.empty()) {
    EXPECT_NE(m.find(also), std::string::npos) << m;
  }
  EXPECT_EQ(m.find('\n'), std::string::npos) << m;
}

// ---- parsing real configs -----------------------------------------------------------------------

TEST(ModelConfig, ParsesDeepSeekV3) {
  auto r = parse_model_config(kDeepSeekV3, kSource);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  const ModelConfig& c = r.value();
  EXPECT_EQ(c.model_type, "deepseek_v3");
  EXPECT_EQ(c.architectures, std::vector<std::string>{"DeepseekV3ForCausalLM"});
  EXPECT_EQ(c.vocab_size, 129280);
  EXPECT_EQ(c.hidden_size, 7168);
  EXPECT_EQ(c.intermediate_size, 18432);
  EXPECT_EQ(c.moe_intermediate_size, 2048);
  EXPECT_EQ(c.num_hidden_layers, 61);
  EXPECT_EQ(c.num_attention_heads, 128);
  EXPECT_EQ(c.num_key_value_heads, 128);
  ASSERT_TRUE(c.q_lora_rank.has_value());
  EXPECT_EQ(*c.q_lora_rank, 1536);
  EXPECT_EQ(c.kv_lora_rank, 512);
  EXPECT_EQ(c.qk_nope_head_dim, 128);
  EXPECT_EQ(c.qk_rope_head_dim, 64);
  EXPECT_EQ(c.v_head_dim, 128);
  EXPECT_EQ(c.n_routed_experts, 256);
  EXPECT_EQ(c.n_shared_experts, 1);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(c.n_group, 8);
  EXPECT_EQ(c.topk_group, 4);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 2.5);
  EXPECT_EQ(c.first_k_dense_replace, 3);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.max_position_embeddings, 163840);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.bos_token_id, std::optional<int>(0));
  EXPECT_EQ(c.eos_token_id, std::vector<int>{1});
  EXPECT_EQ(c.num_nextn_predict_layers, 1);
  EXPECT_TRUE(c.rope_interleave);  // absent => HF default true
  EXPECT_EQ(c.rope_scaling.type, RopeScalingType::Yarn);
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 40.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 4096);
  EXPECT_DOUBLE_EQ(c.rope_scaling.beta_fast, 32.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling.beta_slow, 1.0);
  EXPECT_EQ(c.rope_scaling.mscale, std::optional<double>(1.0));
  EXPECT_EQ(c.rope_scaling.mscale_all_dim, std::optional<double>(1.0));
  EXPECT_FALSE(c.rope_scaling.attention_factor.has_value());
  EXPECT_TRUE(c.rope_scaling.truncate);
  EXPECT_EQ(c.quantization_config.method, QuantMethod::Fp8Block);
  EXPECT_EQ(c.quantization_config.fmt, "e4m3");
  EXPECT_EQ(c.quantization_config.activation_scheme, "dynamic");
  EXPECT_EQ(c.quantization_config.weight_block_size, (std::array<int, 2>{128, 128}));
  EXPECT_EQ(c.qk_head_dim(), 192);
  EXPECT_EQ(c.kv_cache_dim(), 576);
  EXPECT_FALSE(c.is_moe_layer(0));
  EXPECT_FALSE(c.is_moe_layer(2));
  EXPECT_TRUE(c.is_moe_layer(3));
  EXPECT_TRUE(c.is_moe_layer(60));
}

TEST(ModelConfig, ParsesKimiK2) {
  auto r = parse_model_config(kKimiK2, kSource);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  const ModelConfig& c = r.value();
  EXPECT_EQ(c.model_type, "kimi_k2");
  EXPECT_EQ(c.num_attention_heads, 64);
  EXPECT_EQ(c.n_routed_experts, 384);
  EXPECT_EQ(c.n_group, 1);
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 2.827);
  EXPECT_DOUBLE_EQ(c.rope_theta, 50000.0);
  EXPECT_EQ(c.rope_scaling.type, RopeScalingType::Yarn);  // from `rope_type`
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 32.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling.beta_fast, 1.0);
  EXPECT_EQ(c.bos_token_id, std::optional<int>(163584));
  EXPECT_EQ(c.eos_token_id, (std::vector<int>{163585, 163586}));
  EXPECT_FALSE(c.is_moe_layer(0));
  EXPECT_TRUE(c.is_moe_layer(1));
}

TEST(ModelConfig, ParsesTransformersV5RopeParametersAndNullQLora) {
  json j = v3();
  j.erase("rope_scaling");
  j.erase("rope_theta");  // v5 may keep it only inside rope_parameters
  j["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 12345.0}, {"factor", 8},
                          {"original_max_position_embeddings", 2048}, {"beta_fast", 16}, {"mscale_all_dim", 0.5},
                          {"truncate", false}};
  j["q_lora_rank"] = nullptr;
  j["rope_interleave"] = false;
  const ModelConfig c = parse_ok(j);
  EXPECT_FALSE(c.q_lora_rank.has_value());
  EXPECT_FALSE(c.rope_interleave);
  EXPECT_DOUBLE_EQ(c.rope_theta, 12345.0);
  EXPECT_EQ(c.rope_scaling.type, RopeScalingType::Yarn);
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 8.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 2048);
  EXPECT_DOUBLE_EQ(c.rope_scaling.beta_fast, 16.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling.beta_slow, 1.0);         // default
  EXPECT_FALSE(c.rope_scaling.mscale.has_value());          // absent stays absent (HF None)
  EXPECT_EQ(c.rope_scaling.mscale_all_dim, std::optional<double>(0.5));
  EXPECT_FALSE(c.rope_scaling.truncate);
}

TEST(ModelConfig, RopeParametersWinOverRopeScaling) {
  json j = v3();
  j["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 4}, {"original_max_position_embeddings", 4096}};
  const ModelConfig c = parse_ok(j);
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 4.0);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);  // top-level theta when rope_parameters has none
}

TEST(ModelConfig, RopeDefaultTypeAndNullMeanNoScaling) {
  json j = v3();
  j["rope_scaling"] = {{"type", "default"}, {"factor", 40}};
  EXPECT_EQ(parse_ok(j).rope_scaling.type, RopeScalingType::None);
  j["rope_scaling"] = nullptr;
  EXPECT_EQ(parse_ok(j).rope_scaling.type, RopeScalingType::None);
  j.erase("rope_scaling");
  EXPECT_EQ(parse_ok(j).rope_scaling, RopeScaling{});
}

TEST(ModelConfig, YarnFactorAndOriginalFallBackLikeHf) {
  json j = v3();
  j["rope_scaling"] = {{"type", "yarn"}, {"original_max_position_embeddings", 4096}, {"beta_fast", 0}};
  const ModelConfig c = parse_ok(j);
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 163840.0 / 4096.0);  // max_pos / original
  EXPECT_DOUBLE_EQ(c.rope_scaling.beta_fast, 32.0);             // `or 32`: 0 selects the default
  j["rope_scaling"] = {{"type", "yarn"}, {"factor", 2}};
  EXPECT_EQ(parse_ok(j).rope_scaling.original_max_position_embeddings, 163840);
}

TEST(ModelConfig, ParsesCompressedTensorsInt4) {
  json j = json::parse(kKimiK2);
  j["quantization_config"] = json::parse(kInt4Quant);
  const ModelConfig c = parse_ok(j);
  const QuantizationConfig& q = c.quantization_config;
  EXPECT_EQ(q.method, QuantMethod::Int4PackGroup);
  EXPECT_EQ(q.format, "pack-quantized");
  EXPECT_EQ(q.quantization_status, "compressed");
  EXPECT_EQ(q.num_bits, 4);
  EXPECT_EQ(q.group_size, 32);
  EXPECT_EQ(q.targets, std::vector<std::string>{"Linear"});
  const std::vector<std::string> ignore = {"lm_head", "re:.*self_attn.*", "re:.*shared_experts.*",
                                           "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"};
  EXPECT_EQ(q.ignore, ignore);
}

TEST(ModelConfig, AcceptsIntegralFloatsAndDefaultsOptionalKeys) {
  json j = v3();
  j["hidden_size"] = 7168.0;
  for (const char* k : {"architectures", "num_key_value_heads", "bos_token_id", "eos_token_id", "scoring_func",
                        "topk_method", "hidden_act", "attention_bias", "moe_layer_freq", "tie_word_embeddings",
                        "quantization_config", "num_nextn_predict_layers"}) {
    j.erase(k);
  }
  const ModelConfig c = parse_ok(j);
  EXPECT_EQ(c.hidden_size, 7168);
  EXPECT_EQ(c.architectures, std::vector<std::string>{"DeepseekV3ForCausalLM"});
  EXPECT_EQ(c.num_key_value_heads, 128);
  EXPECT_FALSE(c.bos_token_id.has_value());
  EXPECT_TRUE(c.eos_token_id.empty());
  EXPECT_EQ(c.quantization_config.method, QuantMethod::None);
  EXPECT_EQ(c.num_nextn_predict_layers, 0);
}

// ---- round trip ---------------------------------------------------------------------------------

void expect_round_trip(const ModelConfig& c) {
  const json written = model_config_to_json(c);
  EXPECT_EQ(written["architectures"], json::array({"DeepseekV3ForCausalLM"}));
  auto back = parse_model_config(written.dump(2), "roundtrip");
  ASSERT_TRUE(back.is_ok()) << back.status().message();
  EXPECT_TRUE(back.value() == c) << written.dump(2);
  EXPECT_EQ(model_config_to_json(back.value()), written);
}

TEST(ModelConfig, RoundTripsRealConfigs) {
  expect_round_trip(parse_ok(v3()));
  expect_round_trip(parse_ok(json::parse(kKimiK2)));
  json j = json::parse(kKimiK2);
  j["quantization_config"] = json::parse(kInt4Quant);
  j["q_lora_rank"] = nullptr;
  j["rope_scaling"]["attention_factor"] = 0.9;
  j["rope_scaling"]["truncate"] = false;
  j["rope_scaling"].erase("mscale");
  expect_round_trip(parse_ok(j));
}

TEST(ModelConfig, WriterUsesClassicRopeScalingAndQuantization) {
  json j = v3();
  j.erase("rope_scaling");
  j["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 10000}, {"factor", 40},
                          {"original_max_position_embeddings", 4096}};
  const json w = model_config_to_json(parse_ok(j));
  EXPECT_FALSE(w.contains("rope_parameters"));
  EXPECT_EQ(w["rope_scaling"]["type"], "yarn");
  EXPECT_EQ(w["rope_scaling"]["factor"], 40.0);
  EXPECT_EQ(w["quantization_config"]["quant_method"], "fp8");
  EXPECT_EQ(w["quantization_config"]["weight_block_size"], json::array({128, 128}));
}

// ---- errors: one test per class, each asserting the key is named --------------------------------

TEST(ModelConfigError, UnknownModelTypeListsSupported) {
  expect_error([](json& j) { j["model_type"] = "llama"; }, "model_type",
               "supported: deepseek_v3, kimi_k2 (DeepseekV3ForCausalLM)");
}
TEST(ModelConfigError, UnknownArchitectureListsSupported) {
  expect_error([](json& j) { j["architectures"] = {"LlamaForCausalLM"}; }, "architectures",
               "supported: deepseek_v3, kimi_k2");
}
TEST(ModelConfigError, MissingRequiredKeys) {
  for (const char* key : {"model_type", "hidden_size", "vocab_size", "kv_lora_rank", "q_lora_rank",
                          "n_routed_experts", "first_k_dense_replace", "rope_theta", "rms_norm_eps"}) {
    SCOPED_TRACE(key);
    expect_error([key](json& j) { j.erase(key); }, std::string("missing required key '") + key + "'");
  }
}
TEST(ModelConfigError, WrongJsonTypesNameKeyAndExpectedType) {
  expect_error([](json& j) { j["hidden_size"] = "7168"; }, "hidden_size", "expected an integer");
  expect_error([](json& j) { j["hidden_size"] = 7168.5; }, "hidden_size", "expected an integer");
  expect_error([](json& j) { j["hidden_size"] = 1000000000000LL; }, "hidden_size", "32 bits");
  expect_error([](json& j) { j["norm_topk_prob"] = "true"; }, "norm_topk_prob", "expected a boolean");
  expect_error([](json& j) { j["rms_norm_eps"] = "1e-6"; }, "rms_norm_eps", "expected a finite number");
  expect_error([](json& j) { j["model_type"] = 3; }, "model_type", "expected a string");
  expect_error([](json& j) { j["eos_token_id"] = "1"; }, "eos_token_id", "integer");
  expect_error([](json& j) { j["eos_token_id"] = {1, "x"}; }, "eos_token_id", "integer");
  expect_error([](json& j) { j["rope_scaling"] = 40; }, "rope_scaling", "expected an object");
  expect_error([](json& j) { j["rope_scaling"]["factor"] = "40"; }, "rope_scaling.factor", "expected a finite number");
  expect_error([](json& j) { j["architectures"] = "DeepseekV3ForCausalLM"; }, "architectures", "list of strings");
}
TEST(ModelConfigError, NonPositiveSizesHeadsLayers) {
  expect_error([](json& j) { j["hidden_size"] = 0; }, "hidden_size", "must be >= 1");
  expect_error([](json& j) { j["num_attention_heads"] = -4; }, "num_attention_heads", "must be >= 1");
  expect_error([](json& j) { j["num_hidden_layers"] = 0; }, "num_hidden_layers", "must be >= 1");
  expect_error([](json& j) { j["q_lora_rank"] = 0; }, "q_lora_rank", "must be >= 1");
  expect_error([](json& j) { j["vocab_size"] = 1 << 30; }, "vocab_size", "supported maximum");
}
TEST(ModelConfigError, ExpertsPerTokenAboveRoutedExperts) {
  expect_error([](json& j) { j["num_experts_per_tok"] = 300; }, "num_experts_per_tok", "n_routed_experts");
}
TEST(ModelConfigError, GroupDoesNotDivideExperts) {
  expect_error([](json& j) { j["n_group"] = 7; }, "n_group", "does not divide");
}
TEST(ModelConfigError, TopkGroupAboveGroups) {
  expect_error([](json& j) { j["topk_group"] = 9; }, "topk_group", "exceeds n_group");
}
TEST(ModelConfigError, TooFewCandidateExperts) {
  // 16 experts in 8 groups of 2; 2 kept groups give 4 candidates for top-8.
  expect_error([](json& j) { j["n_routed_experts"] = 16; j["topk_group"] = 2; }, "topk_group",
               "num_experts_per_tok");
}
TEST(ModelConfigError, OddRopeHeadDim) {
  expect_error([](json& j) { j["qk_rope_head_dim"] = 63; }, "qk_rope_head_dim", "even");
}
TEST(ModelConfigError, NonPositiveEps) {
  expect_error([](json& j) { j["rms_norm_eps"] = 0; }, "rms_norm_eps", "positive");
  expect_error([](json& j) { j["rms_norm_eps"] = -1e-6; }, "rms_norm_eps", "positive");
}
TEST(ModelConfigError, DenseLayersAboveLayers) {
  expect_error([](json& j) { j["first_k_dense_replace"] = 62; }, "first_k_dense_replace", "num_hidden_layers");
}
TEST(ModelConfigError, RopeFactorBelowOne) {
  expect_error([](json& j) { j["rope_scaling"]["factor"] = 0.5; }, "rope_scaling.factor", ">= 1");
  expect_error([](json& j) {
    j.erase("rope_scaling");
    j["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 0.25}, {"original_max_position_embeddings", 4096}};
  }, "rope_parameters.factor", ">= 1");
}
TEST(ModelConfigError, UnsupportedRopeTypes) {
  for (const char* t : {"linear", "dynamic", "llama3", "longrope"}) {
    SCOPED_TRACE(t);
    expect_error([t](json& j) { j["rope_scaling"]["type"] = t; }, "rope_scaling.type", t);
  }
  expect_error([](json& j) { j["rope_scaling"].erase("type"); }, "rope_scaling", "rope_type");
  expect_error([](json& j) { j["rope_scaling"]["beta_slow"] = -1; }, "rope_scaling.beta_slow", "positive");
}
TEST(ModelConfigError, TokenIdsOutsideVocab) {
  expect_error([](json& j) { j["eos_token_id"] = 129280; }, "eos_token_id", "outside the vocabulary");
  expect_error([](json& j) { j["eos_token_id"] = {1, 200000}; }, "eos_token_id", "200000");
  expect_error([](json& j) { j["bos_token_id"] = -1; }, "bos_token_id", "outside the vocabulary");
}
TEST(ModelConfigError, UnsupportedForwardPassOptions) {
  expect_error([](json& j) { j["scoring_func"] = "softmax"; }, "scoring_func", "sigmoid");
  expect_error([](json& j) { j["topk_method"] = "greedy"; }, "topk_method", "noaux_tc");
  expect_error([](json& j) { j["moe_layer_freq"] = 2; }, "moe_layer_freq");
  expect_error([](json& j) { j["hidden_act"] = "gelu"; }, "hidden_act", "silu");
  expect_error([](json& j) { j["attention_bias"] = true; }, "attention_bias");
}
TEST(ModelConfigError, Fp8Variants) {
  expect_error([](json& j) { j["quantization_config"]["weight_block_size"] = {64, 64}; },
               "quantization_config.weight_block_size", "64");
  expect_error([](json& j) { j["quantization_config"]["fmt"] = "e5m2"; }, "quantization_config.fmt", "e5m2");
  expect_error([](json& j) { j["quantization_config"]["activation_scheme"] = "static"; },
               "quantization_config.activation_scheme", "static");
  expect_error([](json& j) { j["quantization_config"]["quant_method"] = "gptq"; },
               "quantization_config.quant_method", "gptq");
}
TEST(ModelConfigError, Int4Variants) {
  auto with_int4 = [](const std::function<void(json&)>& edit) {
    return [edit](json& j) {
      j["quantization_config"] = json::parse(kInt4Quant);
      edit(j["quantization_config"]);
    };
  };
  const std::string w = "quantization_config.config_groups.group_0.weights";
  expect_error(with_int4([](json& q) { q["config_groups"]["group_0"]["weights"]["num_bits"] = 8; }),
               w + ".num_bits", "8");
  expect_error(with_int4([](json& q) { q["config_groups"]["group_0"]["weights"]["symmetric"] = false; }),
               w + ".symmetric", "asymmetric");
  expect_error(with_int4([](json& q) { q["config_groups"]["group_0"]["weights"]["group_size"] = 128; }),
               w + ".group_size", "128");
  expect_error(with_int4([](json& q) { q["config_groups"]["group_0"]["weights"]["type"] = "float"; }),
               w + ".type", "float");
  expect_error(with_int4([](json& q) { q["format"] = "mxfp4-pack-quantized"; }), "quantization_config.format",
               "mxfp4-pack-quantized");
  expect_error(with_int4([](json& q) { q["config_groups"]["group_0"]["input_activations"] = {{"num_bits", 8}}; }),
               "input_activations");
  expect_error(with_int4([](json& q) { q["ignore"] = {"lm_head", 3}; }), "quantization_config.ignore");
}
TEST(ModelConfigError, MalformedJsonNeverThrows) {
  for (const char* text : {"", "[]", "{", "{\"model_type\": }", "null", "{\"a\":1,\"a\":2}", "\xff\xfe"}) {
    auto r = parse_model_config(text, kSource);
    ASSERT_FALSE(r.is_ok()) << text;
    EXPECT_EQ(r.status().message().rfind(std::string(kSource) + ": ", 0), 0u) << r.status().message();
    EXPECT_EQ(r.status().message().find('\n'), std::string::npos);
  }
  // Every prefix of a real config: no crash, and only the complete text parses.
  const std::string full = kDeepSeekV3;
  for (size_t n = 0; n < full.size(); ++n) {
    EXPECT_FALSE(parse_model_config(std::string_view(full).substr(0, n), kSource).is_ok()) << n;
  }
  EXPECT_TRUE(parse_model_config(full, kSource).is_ok());
}

// Every key (top level, rope and quantization) replaced by every JSON type or deleted: each result
// is either a one-line error from the source or a config that round-trips through the writer.
TEST(ModelConfigError, EveryKeyWithEveryTypeIsHandled) {
  const json replacements[] = {nullptr, "x", true, -1, 0, 3, 1e300, 2.5, json::array(), json::object(),
                               json::array({1, 2})};
  json base = v3();
  base["quantization_config"] = json::parse(kInt4Quant);
  std::vector<json::json_pointer> pointers;
  const json flat = base.flatten();
  for (auto it = flat.begin(); it != flat.end(); ++it) {
    json::json_pointer p(it.key());
    for (; !p.empty(); p = p.parent_pointer()) pointers.push_back(p);
  }
  int accepted = 0, rejected = 0;
  for (const auto& p : pointers) {
    for (size_t k = 0; k <= std::size(replacements); ++k) {
      json j = base;
      if (k == std::size(replacements)) {
        json& parent = j[p.parent_pointer()];
        if (parent.is_array()) {
          parent.erase(std::stoul(p.back()));
        } else {
          parent.erase(p.back());
        }
      } else {
        j[p] = replacements[k];
      }
      auto r = parse_model_config(j.dump(), kSource);
      if (!r.is_ok()) {
        ++rejected;
        const std::string m = r.status().message();
        EXPECT_EQ(m.rfind(std::string(kSource) + ": ", 0), 0u) << m;
        EXPECT_EQ(m.find('\n'), std::string::npos) << m;
        continue;
      }
      ++accepted;
      auto back = parse_model_config(model_config_to_json(r.value()).dump(), "rt");
      ASSERT_TRUE(back.is_ok()) << p.to_string() << ": " << back.status().message();
      EXPECT_TRUE(back.value() == r.value()) << p.to_string();
    }
  }
  EXPECT_GT(accepted, 50);  // ignored keys, optional keys and valid values
  EXPECT_GT(rejected, 300);
}

TEST(ModelConfigError, LoadReportsPath) {
  const auto dir = std::filesystem::temp_directory_path() / "mla_test_model_config";
  std::filesystem::create_directories(dir);
  auto missing = load_model_config((dir / "nope").string());
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("nope/config.json"), std::string::npos) << missing.status().message();
  {
    std::ofstream(dir / "config.json") << kKimiK2;
  }
  auto ok = load_model_config(dir.string());
  ASSERT_TRUE(ok.is_ok()) << ok.status().message();
  EXPECT_EQ(ok.value().model_type, "kimi_k2");
  {
    json j = json::parse(kKimiK2);
    j["hidden_size"] = "big";
    std::ofstream(dir / "config.json") << j.dump();
  }
  auto bad = load_model_config(dir.string() + "/");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().message().rfind((dir / "config.json").string() + ": hidden_size", 0), 0u)
      << bad.status().message();
  std::filesystem::remove_all(dir);
}

// ---- parameter counts ---------------------------------------------------------------------------

// DeepSeek-V3 by hand from the tensor list (MODELS.md 1.2).
constexpr int64_t kV3Attention = 7168LL * 1536 + 1536 + 1536LL * 128 * 192  // q_a, q_a_norm, q_b
                                 + 7168LL * 576 + 512 + 512LL * 128 * 256    // kv_a, kv_a_norm, kv_b
                                 + 128LL * 128 * 7168;                       // o_proj
constexpr int64_t kV3Expert = 3LL * 7168 * 2048;
constexpr int64_t kV3MoeFfn = 257 * kV3Expert + 256LL * 7168 + 256;  // 256 routed + 1 shared, gate, bias
constexpr int64_t kV3Layer = kV3Attention + 2 * 7168;
constexpr int64_t kV3Total = 2LL * 129280 * 7168 + 7168 + 61 * kV3Layer + 3 * (3LL * 7168 * 18432) + 58 * kV3MoeFfn;

TEST(ModelConfigParams, DeepSeekV3MatchesHandCountAnd671B) {
  auto c = preset_config("deepseek-v3");
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  const int64_t total = parameter_count(c.value());
  EXPECT_EQ(total, kV3Total);
  // DeepSeek's "671B" is the main model without MTP; MTP (one more MoE layer, eh_proj, 2 norms and
  // its own copies of embedding + head) brings the checkpoint to "685B".
  EXPECT_NEAR(double(total), 671.0e9, 0.01 * 671.0e9);
  const int64_t mtp = kV3Layer + kV3MoeFfn + 7168LL * 14336 + 3 * 7168 + 2LL * 129280 * 7168;
  EXPECT_NEAR(double(total + mtp), 685.0e9, 0.01 * 685.0e9);
  // Active: 8 of 256 routed experts per MoE layer.
  const int64_t active = active_parameter_count(c.value());
  EXPECT_EQ(active, kV3Total - 58 * 248 * kV3Expert);
  EXPECT_NEAR(double(active), 37.0e9, 0.03 * 37.0e9);
}

TEST(ModelConfigParams, KimiK2IsAboutOneTrillion) {
  auto c = preset_config("kimi-k2");
  ASSERT_TRUE(c.is_ok());
  const int64_t attn = 7168LL * 1536 + 1536 + 1536LL * 64 * 192 + 7168LL * 576 + 512 + 512LL * 64 * 256 +
                       64LL * 128 * 7168;
  const int64_t moe = 385 * kV3Expert + 384LL * 7168 + 384;
  const int64_t total = 2LL * 163840 * 7168 + 7168 + 61 * (attn + 2 * 7168) + 3LL * 7168 * 18432 + 60 * moe;
  EXPECT_EQ(parameter_count(c.value()), total);
  EXPECT_NEAR(double(total), 1.03e12, 0.01e12);  // "1T total"
  EXPECT_NEAR(double(active_parameter_count(c.value())), 32.5e9, 1.0e9);  // "32B active"
}

TEST(ModelConfigParams, TiedEmbeddingsAndSingleQProj) {
  ModelConfig c = preset_config("tiny").value();
  const int64_t base = parameter_count(c);
  c.tie_word_embeddings = true;
  EXPECT_EQ(parameter_count(c), base - 512LL * 128);
  c.q_lora_rank.reset();
  // q_a (128*64) + norm (64) + q_b (64*12*48) per layer replaced by q_proj (128*12*48).
  EXPECT_EQ(parameter_count(c), base - 512LL * 128 + 4 * (128LL * 12 * 48 - (128LL * 64 + 64 + 64LL * 12 * 48)));
}

// ---- presets ------------------------------------------------------------------------------------

TEST(Presets, AllValidateAndRoundTrip) {
  for (const std::string& name : preset_names()) {
    SCOPED_TRACE(name);
    auto c = preset_config(name);
    ASSERT_TRUE(c.is_ok()) << c.status().message();
    for (const char* w : {"bf16", "fp8", "int4"}) {
      auto q = with_quantization(c.value(), w);
      ASSERT_TRUE(q.is_ok());
      expect_round_trip(q.value());
    }
  }
  auto bad = preset_config("gpt2");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("tiny, deepseek-v3, kimi-k2"), std::string::npos);
}

TEST(Presets, TinyGeometry) {
  const ModelConfig c = preset_config("tiny").value();
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.hidden_size, 128);
  EXPECT_EQ(c.num_hidden_layers, 4);
  EXPECT_EQ(c.first_k_dense_replace, 1);
  EXPECT_EQ(c.num_attention_heads, 12);
  EXPECT_NE(c.num_attention_heads % 16, 0);
  EXPECT_EQ(c.q_lora_rank, std::optional<int>(64));
  EXPECT_EQ(c.kv_cache_dim(), 64 + 16);
  EXPECT_EQ(c.qk_head_dim(), 48);
  EXPECT_EQ(c.n_routed_experts, 16);
  EXPECT_EQ(c.num_experts_per_tok, 4);
  EXPECT_EQ(c.n_group, 4);
  EXPECT_EQ(c.topk_group, 2);
  EXPECT_EQ(c.rope_scaling.type, RopeScalingType::Yarn);
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 4.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 256);
  EXPECT_EQ(c.max_position_embeddings, 1024);
  // Kimi's layout on a byte vocabulary: 256 bytes, then [BOS], [EOS] (make-model's byte tokenizer).
  EXPECT_EQ(c.bos_token_id, 256);
  EXPECT_EQ(c.eos_token_id, std::vector<int>{257});
}

TEST(Presets, KimiK2Geometry) {
  const ModelConfig c = preset_config("kimi-k2").value();
  EXPECT_EQ(c.model_type, "kimi_k2");
  EXPECT_EQ(c.num_attention_heads, 64);
  EXPECT_EQ(c.n_routed_experts, 384);
  EXPECT_EQ(c.vocab_size, 163840);
  EXPECT_DOUBLE_EQ(c.rope_theta, 50000.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 32.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling.beta_fast, 1.0);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_EQ(c.bos_token_id, std::optional<int>(163584));
}

TEST(Presets, OverridesKeepConfigValid) {
  ModelConfig c = preset_config("deepseek-v3").value();
  ASSERT_TRUE(apply_overrides(c, 2, 16).is_ok());
  EXPECT_EQ(c.num_hidden_layers, 2);
  EXPECT_EQ(c.first_k_dense_replace, 2);  // clamped from 3
  EXPECT_EQ(c.n_routed_experts, 16);
  EXPECT_EQ(c.n_group, 8);                // 8 groups of 2 still supply 4*2 = 8 candidates
  EXPECT_EQ(c.topk_group, 4);

  c = preset_config("deepseek-v3").value();
  ASSERT_TRUE(apply_overrides(c, std::nullopt, 12).is_ok());  // 8 does not divide 12
  EXPECT_EQ(c.n_group, 1);
  EXPECT_EQ(c.topk_group, 1);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(c.num_hidden_layers, 61);

  c = preset_config("tiny").value();
  ASSERT_TRUE(apply_overrides(c, 1, 2).is_ok());
  EXPECT_EQ(c.num_experts_per_tok, 2);  // clamped to the expert count
  EXPECT_EQ(c.n_group, 1);
  EXPECT_EQ(c.first_k_dense_replace, 1);

  c = preset_config("tiny").value();
  const ModelConfig before = c;
  EXPECT_FALSE(apply_overrides(c, 0, std::nullopt).is_ok());
  EXPECT_FALSE(apply_overrides(c, std::nullopt, -3).is_ok());
  EXPECT_TRUE(c == before);  // untouched on error
}

TEST(Presets, WithQuantization) {
  const ModelConfig tiny = preset_config("tiny").value();
  EXPECT_EQ(with_quantization(tiny, "bf16").value().quantization_config.method, QuantMethod::None);
  const QuantizationConfig fp8 = with_quantization(tiny, "fp8").value().quantization_config;
  EXPECT_EQ(fp8.method, QuantMethod::Fp8Block);
  EXPECT_EQ(fp8.weight_block_size, (std::array<int, 2>{128, 128}));
  const QuantizationConfig int4 = with_quantization(tiny, "int4").value().quantization_config;
  EXPECT_EQ(int4.method, QuantMethod::Int4PackGroup);
  EXPECT_EQ(int4.group_size, 32);
  EXPECT_EQ(int4.ignore.size(), 4u);
  EXPECT_EQ(int4.ignore[3], "re:.*mlp\\.(gate|up|gate_up|down)_proj.*");
  auto bad = with_quantization(tiny, "fp4");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("fp4"), std::string::npos);
}

TEST(Presets, DescribeMentionsTheEssentials) {
  const std::string d = describe(with_quantization(preset_config("deepseek-v3").value(), "fp8").value());
  for (const char* s : {"deepseek_v3", "61 (3 dense, 58 MoE) + 1 MTP", "128 heads", "576 values", "256 routed",
                        "yarn factor 40", "fp8 e4m3", "671.03B total"}) {
    EXPECT_NE(d.find(s), std::string::npos) << s << "\n" << d;
  }
}

}  // namespace
}  // namespace mla::io
