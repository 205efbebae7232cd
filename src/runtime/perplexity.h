// Held-out perplexity of a token stream through the real forward path (DeepseekV3::forward, every
// logits row of a window requested) with the log-softmax in double on the host. The windowing is
// the one the PyTorch reference (tools/train/train_embedded.py, perplexity_windows) uses, so the two
// figures are comparable; it trades context (at most `window` tokens) for a single pass.
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "model/deepseek_v3.h"

namespace mla::runtime {

struct PerplexityOptions {
  int window = 512;  // tokens of context per forward (the model's limits.max_tokens must be >= it)
  model::MlaPath mla_path = model::MlaPath::Auto;
};

struct PerplexityResult {
  int64_t tokens = 0;   // predicted tokens (= the text's ids; [BOS] itself is never predicted)
  int64_t windows = 0;  // forward calls
  double total_nll = 0; // nats, summed over predicted tokens
  double mean_nll = 0;  // total_nll / tokens
  double perplexity = 0;  // exp(mean_nll)
};

// Reports progress: windows done, windows in all.
using PerplexityProgress = std::function<void(int64_t done, int64_t total)>;

// Definition: seq = [bos] + ids, cut into windows seq[i, i + window + 1) for i = 0, window, 2*window,
// ... while i < len(seq) - 1 (consecutive windows overlap by one token); each window is an
// independent sequence (positions from 0, a fresh cache) whose first n = len - 1 tokens are fed and
// whose tokens 1..n are scored, so every id is predicted exactly once with at most `window` tokens
// of context. perplexity = exp(sum NLL / len(ids)).
// Errors: empty `ids`, a window outside [1, model.limits().max_tokens] or beyond
// max_position_embeddings, ids outside the vocabulary.
Result<PerplexityResult> perplexity(model::DeepseekV3& model, ops::Backend& backend, std::span<const int32_t> ids,
                                    int32_t bos_id, const PerplexityOptions& options,
                                    const PerplexityProgress& progress = {});

// NLL (nats) of `target` under softmax(logits), in double: logsumexp(logits) - logits[target].
double token_nll(std::span<const float> logits, int32_t target);

}  // namespace mla::runtime
