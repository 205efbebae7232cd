// A synchronous engine for `mlaserve generate` and tests: runs a fixed set of requests to completion
// with chunked prefill under a per-step token budget, decode rows first, over the paged cache.
// It is the smallest loop that exercises the real step path (mixed prefill/decode batches, block
// tables, per-request sampling); the serving scheduler (its own issue) replaces the planning part.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/deepseek_v3.h"
#include "runtime/kv_cache.h"
#include "runtime/sampler.h"

namespace mla::runtime {

struct GenerationRequest {
  std::vector<int32_t> prompt;          // token ids, non-empty
  int max_tokens = 16;                  // tokens to generate, >= 1
  SamplingParams sampling;
  std::vector<int32_t> stop_token_ids;  // emitting one of these ends the request (it is kept in tokens)
};

struct GenerationResult {
  std::vector<int32_t> tokens;      // generated ids
  std::string finish_reason;        // "length" or "stop"
  std::vector<float> prompt_logits; // F32 logits at the last prompt position (when asked for)
  double time_to_first_token_s = 0;
};

struct EngineOptions {
  int max_tokens_per_step = 256;  // token budget of one forward step (chunked prefill)
  int block_size = 16;            // tokens per KV block
  int num_blocks = 0;             // KV blocks; 0 = enough for every request's full length
  model::MlaPath mla_path = model::MlaPath::Auto;
  bool capture_prompt_logits = false;
  DType kv_cache_dtype = DType::F32;  // F32 or BF16 latents (the CLI picks BF16 on GPUs)
  bool decode_graphs = false;         // replay captured graphs for decode-only steps (GPU: on)
};

struct EngineStats {
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  int64_t steps = 0;
  double prefill_seconds = 0;  // wall time of steps that held any prefill rows
  double decode_seconds = 0;   // wall time of decode-only steps
};

// Runs `requests` together to completion on `model`. Errors: invalid requests (empty prompt, token
// ids outside the vocabulary, a prompt + max_tokens beyond max_position_embeddings, bad sampling
// parameters) and a KV cache too small for the batch. The model's limits bound the step size.
Result<std::vector<GenerationResult>> generate(model::DeepseekV3& model, ops::Backend& backend,
                                               const std::vector<GenerationRequest>& requests,
                                               const EngineOptions& options, EngineStats* stats = nullptr);

}  // namespace mla::runtime
