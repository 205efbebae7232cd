// EAGLE-3 draft head (LlamaForCausalLMEagle3, MODELS.md §4) for a DeepSeek-V3 / Kimi K2 target: one
// Llama decoder layer whose attention reads [input_layernorm(embed) | hidden_norm(h)] (width 2H),
// fed by fc(concatenated target features) or by its own previous output, with logits over a reduced
// draft vocabulary scattered to the target's (-inf elsewhere). Written against ops::Backend like
// DeepseekV3; workspaces are sized at load from ModelLimits, so forward() never allocates.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/model_config.h"
#include "model/deepseek_v3.h"
#include "ops/backend.h"
#include "spec/draft_model.h"

namespace mla::model {

// config.json of an EAGLE-3 draft, HF key names. Parsed strictly: anything the forward does not
// implement (biases, other activations, unknown rope types) is an error naming the key.
struct Eagle3Config {
  std::vector<std::string> architectures;  // contains "LlamaForCausalLMEagle3"
  int hidden_size = 0;                     // H: draft width (= the target's hidden for DeepSeek drafts)
  int target_hidden_size = 0;              // H_t: width of one target feature (default hidden_size)
  int intermediate_size = 0;               // MLP width
  int num_attention_heads = 0;             // query heads
  int num_key_value_heads = 0;             // K/V heads (divides num_attention_heads)
  int head_dim = 0;                        // D (default hidden_size / num_attention_heads)
  int vocab_size = 0;                      // the target vocabulary (rows of embed_tokens)
  int draft_vocab_size = 0;                // rows of lm_head and d2t (default vocab_size)
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  // RoPE scaling: none ("default" or null), "linear", "llama3" or "yarn" (Llama rotate_half layout).
  std::string rope_type = "default";
  double rope_factor = 1.0;
  double rope_low_freq_factor = 1.0, rope_high_freq_factor = 4.0;  // llama3
  int rope_original_max_position_embeddings = 0;                   // llama3, yarn
  io::RopeScaling yarn;                                            // yarn parameters (type Yarn)
  std::vector<int> aux_layer_ids;  // target layers whose outputs are the features (list order)
};

// Parses config.json text; `target` gives the defaults (aux ids) and the checks (vocab, widths).
Result<Eagle3Config> parse_eagle3_config(std::string_view json_text, const std::string& source,
                                         const io::ModelConfig& target);

class Eagle3Draft final : public spec::DraftModel {
 public:
  // Opens `dir` (config.json + safetensors), checks every tensor against the config and `target`,
  // places the weights on `backend` and sizes workspaces for `limits`. `target_embed_tokens` is the
  // target's embedding table in backend memory ([vocab, H] BF16/F32); it is used (not copied) when
  // the draft has no embed_tokens of its own, so it must outlive the draft. An empty view is fine
  // when the draft carries embed_tokens.
  static Result<std::unique_ptr<Eagle3Draft>> load(const std::string& dir, const io::ModelConfig& target,
                                                   ops::Backend& backend, const ModelLimits& limits,
                                                   const TensorView& target_embed_tokens = {});
  ~Eagle3Draft() override;

  const Eagle3Config& config() const { return cfg_; }
  const ops::GqaDims& dims() const { return dims_; }

  spec::DraftKind kind() const override { return spec::DraftKind::Eagle3; }
  int num_cache_layers() const override { return 1; }
  int64_t cache_row_width() const override { return dims_.cache_row_width(); }
  std::vector<int> target_feature_layers() const override { return cfg_.aux_layer_ids; }
  int64_t target_feature_width() const override {
    return int64_t(cfg_.aux_layer_ids.size()) * cfg_.target_hidden_size;
  }
  int64_t hidden_width() const override { return cfg_.hidden_size; }
  // One step (MODELS.md §4 "Draft step"). Preconditions (checked): as DeepseekV3::forward (limits,
  // positions[t] = kv_len - q_len + i of its sequence, block tables cover kv_len); one cache layer
  // F32/BF16 [blocks, block_size, cache_row_width()]; hidden_in F32 [T, target_feature_width()] when
  // hidden_from_target, else [T, hidden_width()]; hidden_out empty or F32 [T, hidden_width()] (it may
  // be the same buffer as hidden_in); logits F32 [logits_rows, target vocab], contiguous.
  void forward(const spec::DraftForwardInputs& in, const TensorView& logits) override;

 private:
  struct Weights;
  struct Workspace;
  Eagle3Draft(Eagle3Config cfg, ops::Backend& backend, const ModelLimits& limits);
  void stage_inputs(const ForwardInputs& in);

  Eagle3Config cfg_;
  ops::Backend& backend_;
  ModelLimits limits_;
  int64_t target_vocab_ = 0;
  std::unique_ptr<io::Checkpoint> checkpoint_;  // keeps the mmapped weights alive (CPU: zero copy)
  std::unique_ptr<Weights> weights_;
  std::unique_ptr<Workspace> ws_;
  ops::GqaDims dims_;
  ops::RopeTable rope_;
};

// RoPE inverse frequencies of a Llama-style config (default, linear, llama3 or yarn), head_dim / 2
// values, and the cos/sin multiplier (1 except yarn). Exposed for tests.
std::vector<float> eagle3_rope_inv_freq(const Eagle3Config& cfg);
float eagle3_rope_attention_factor(const Eagle3Config& cfg);

}  // namespace mla::model
