// Random-weight EAGLE-3 draft checkpoints (config.json + model.safetensors in the SpecForge / sglang
// layout) for a given target geometry, for tests and the speculative-decoding plumbing. Weights are
// scaled ~N(0, 1/in) per linear so activations stay O(1); values are a deterministic function of
// (seed, tensor name, element index).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/model_config.h"

namespace mla::model {

struct Eagle3SyntheticOptions {
  uint64_t seed = 0;
  int draft_vocab = 0;            // draft_vocab_size; 0: min(V, 64 + V / 4)
  int num_attention_heads = 4;
  int num_key_value_heads = 2;
  int head_dim = 32;
  int intermediate_size = 0;      // 0: 2 * hidden_size
  bool with_embed_tokens = true;  // false: the draft borrows the target's embedding
  std::vector<int> aux_layer_ids;  // written to eagle_config; empty: {0, L/2, L-1} of the target
};

// Writes `dir`/config.json (LlamaForCausalLMEagle3, hidden_size = the target's) and
// `dir`/model.safetensors: fc, midlayer.*, norm, lm_head (BF16), d2t (I64) covering a random subset of
// the target vocabulary that always includes ids [0, min(V, 64)), t2d (BOOL), embed_tokens if asked.
Status write_synthetic_eagle3(const std::string& dir, const io::ModelConfig& target, const Eagle3SyntheticOptions& opt);
inline Status write_synthetic_eagle3(const std::string& dir, const io::ModelConfig& target, uint64_t seed,
                                     int draft_vocab) {
  Eagle3SyntheticOptions opt;
  opt.seed = seed;
  opt.draft_vocab = draft_vocab;
  return write_synthetic_eagle3(dir, target, opt);
}

}  // namespace mla::model
