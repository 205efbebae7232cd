// Typed per-layer weights of DeepSeek-V3 / Kimi K2 (STYLE 7: the dtype is part of each view and is
// checked at load), loaded from a checkpoint as the shard a rank holds. Quantized linears stay in
// their stored format; only the tiny router bias is converted (to F32) when stored otherwise.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "dist/communicator.h"
#include "io/checkpoint.h"
#include "io/model_config.h"
#include "ops/backend.h"

namespace mla::model {

struct AttentionWeights {
  ops::Weight q_proj;              // [H*(d_n+d_r), hidden]; only when q_lora_rank is null
  ops::Weight q_a_proj;            // [q_lora_rank, hidden]
  TensorView q_a_layernorm;        // [q_lora_rank]
  ops::Weight q_b_proj;            // [H*(d_n+d_r), q_lora_rank]; per head d_n nope rows, then d_r rope rows
  ops::Weight kv_a_proj_with_mqa;  // [r+d_r, hidden]: rows [0,r) c_kv, [r, r+d_r) k_rope
  TensorView kv_a_layernorm;       // [r]
  ops::Weight kv_b_proj;           // [H*(d_n+d_v), r]: per head d_n rows W_UK, then d_v rows W_UV
  ops::Weight o_proj;              // [hidden, H*d_v]
};

struct MoeWeights {
  ops::Weight gate;                           // router [E, hidden], dense
  TensorView e_score_correction_bias;         // F32 [E], selection-only bias
  std::vector<ops::ExpertWeights> experts;    // [E]; empty weights for experts other ranks hold
  ops::ExpertWeights shared_experts;          // width moe_intermediate_size * n_shared_experts
  bool has_shared = false;
  // [E + 1] when the shared expert can ride along as one more routed expert (its width and formats
  // are the routed experts'; world size 1): the routed experts, then the shared one as expert E,
  // which every token takes with weight 1 (an extra top-k slot). Empty otherwise.
  std::vector<ops::ExpertWeights> experts_and_shared;
};

struct LayerWeights {
  TensorView input_layernorm;           // [hidden]
  TensorView post_attention_layernorm;  // [hidden]
  AttentionWeights attn;
  bool is_moe = false;
  ops::ExpertWeights mlp;               // dense layers (layer < first_k_dense_replace)
  MoeWeights moe;                       // MoE layers
};

struct DeepseekV3Weights {
  TensorView embed_tokens;  // [vocab, hidden]
  TensorView norm;          // [hidden]
  ops::Weight lm_head;      // [vocab, hidden] (a dense view of embed_tokens when tied)
  std::vector<LayerWeights> layers;
  std::vector<Buffer> owned;  // converted tensors (router bias to F32), kept alive here
};

// Called after each tensor is placed: bytes placed so far (stored bytes, companions included).
using PlacedBytes = std::function<void(uint64_t bytes)>;

// Loads and checks every tensor of the main model (shapes, dtypes, quantized companions). Errors
// name the checkpoint directory, the tensor and the problem.
Result<DeepseekV3Weights> load_deepseek_v3_weights(const io::ModelConfig& cfg, const io::Checkpoint& ckpt,
                                                   ops::Backend& backend, const dist::ParallelPlan& plan,
                                                   const PlacedBytes& on_placed = {});

// One MTP (NextN) block, laid out as a one-layer model so DeepseekV3's forward runs it:
// block.layers = {model.layers.L} (L = num_hidden_layers + mtp index), block.norm =
// shared_head.norm, block.lm_head = shared_head.head, block.embed_tokens = the main
// model.embed_tokens (MODELS.md 1.9); plus the input fusion enorm, hnorm and eh_proj.
struct DeepseekMtpWeights {
  DeepseekV3Weights block;
  TensorView enorm;        // [hidden], applied to embed(token)
  TensorView hnorm;        // [hidden], applied to the incoming hidden state
  ops::Weight eh_proj;     // [hidden, 2*hidden]: input = [enorm(e) | hnorm(h)] (embedding first)
};

// Loads MTP block `mtp_layer` (0 <= mtp_layer < num_nextn_predict_layers) from the target's
// checkpoint. `shared_embed_tokens`, when given, is the target's placed embedding (same backend):
// it is used instead of placing model.embed_tokens a second time.
Result<DeepseekMtpWeights> load_deepseek_mtp_weights(const io::ModelConfig& cfg, const io::Checkpoint& ckpt,
                                                     ops::Backend& backend, const dist::ParallelPlan& plan,
                                                     int mtp_layer = 0,
                                                     const TensorView* shared_embed_tokens = nullptr);

}  // namespace mla::model
