// The checkpoint tensor list of a DeepSeek-V3 / Kimi K2 model, derived from its config: names and
// logical shapes exactly as Hugging Face checkpoints store them (MODELS.md §1.2). One list serves
// the loader (what must exist) and the synthetic-model writer (what to write), so they cannot drift.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/model_config.h"

namespace mla::model {

enum class TensorRole : uint8_t {
  Embedding,   // [vocab, hidden], BF16/F32
  Norm,        // [n], BF16/F32 RMSNorm weight
  Linear,      // logical [out, in]; stored dense, FP8 block or INT4 group (see StoredFormat)
  Router,      // mlp.gate.weight [E, hidden]; never quantized
  RouterBias,  // mlp.gate.e_score_correction_bias [E], F32
};

struct TensorSpec {
  std::string name;            // full checkpoint name of the logical weight (".weight" suffix)
  std::vector<int64_t> shape;  // logical shape ([out, in] for Linear)
  TensorRole role = TensorRole::Linear;
  int layer = -1;              // decoder layer, -1 for global tensors
};

// Every tensor of the main model (MTP layers excluded), in layer order.
std::vector<TensorSpec> deepseek_v3_tensor_specs(const io::ModelConfig& cfg);

// The tensors of the num_nextn_predict_layers MTP (NextN) blocks, stored as layers
// L = num_hidden_layers + i (MODELS.md 1.2/1.9): enorm, hnorm [hidden], eh_proj [hidden, 2*hidden],
// a full decoder layer (MoE per is_moe_layer(L)), shared_head.norm [hidden] and shared_head.head
// [vocab, hidden]. Every spec carries layer = L. The per-layer copy of embed_tokens that some
// checkpoints hold is not listed: the MTP block reads the main model.embed_tokens.
std::vector<TensorSpec> deepseek_v3_mtp_tensor_specs(const io::ModelConfig& cfg);

// True for the MTP-only tensors (enorm, hnorm, eh_proj, shared_head.*), false for decoder-layer
// and global tensors.
bool is_mtp_only_tensor(const TensorSpec& spec);

// How a Linear weight is stored under the config's quantization_config:
// FP8 block covers attention projections and all MLP/expert linears (not the router, embeddings or
// lm_head); INT4 covers the Linear modules not matched by the `ignore` list (Kimi K2 Thinking: only
// routed experts).
enum class StoredFormat : uint8_t { Dense, Fp8Block, Int4Group };
StoredFormat stored_format(const io::ModelConfig& cfg, const TensorSpec& spec);

// Module name of a weight ("model.layers.3.mlp.experts.7.up_proj" for "...up_proj.weight").
std::string module_name(const std::string& weight_name);

}  // namespace mla::model
