// Per-request sampling (ARCHITECTURE rule 8): logits rows -> token ids through the backend's
// sampling ops, each request with its own seeded generator, so the same seed yields the same
// tokens whatever else shares the batch.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "ops/backend.h"

namespace mla::runtime {

struct SamplingParams {
  float temperature = 1.0f;       // 0 = greedy (argmax)
  int top_k = 0;                  // <= 0: disabled
  float top_p = 1.0f;             // 1: disabled
  float min_p = 0.0f;             // 0: disabled
  std::optional<uint64_t> seed;   // nullopt: drawn from std::random_device

  bool greedy() const { return temperature == 0.0f; }
};

// Validates ranges; errors name the parameter (used for untrusted input).
Status validate_sampling_params(const SamplingParams& p);

// A request's private random stream: uniform floats in [0, 1) with 24 random bits each.
class RequestRng {
 public:
  explicit RequestRng(uint64_t seed) : gen_(seed) {}
  float uniform() { return float(gen_() >> 40) * (1.0f / 16777216.0f); }

 private:
  std::mt19937_64 gen_;
};

RequestRng make_request_rng(const SamplingParams& p);

// The sampler's filter pipeline (MODELS.md section 6): softmax(logits / temperature), then
// top_k_renorm_prob, top_p_renorm_prob, min_p_renorm_prob, each with the row's own parameters. The
// speculative verifier filters draft and target rows with the same object, so q and p are exactly
// the distributions the sampler would have drawn from. Greedy rows are filtered at temperature 1
// (their probabilities are unused).
class ProbsFilter {
 public:
  ProbsFilter(ops::Backend& backend, int max_rows);
  // probs[r] = filtered(logits[r]) with *params[r]. logits, probs F32 [R, V] (rows may be strided).
  void run(const TensorView& logits, std::span<const SamplingParams* const> params, const TensorView& probs);

 private:
  ops::Backend& backend_;
  int max_rows_;
  std::vector<Buffer> owned_;
  TensorView temperature_, top_k_, top_p_, min_p_;
  std::vector<float> h_temperature_, h_top_p_, h_min_p_;
  std::vector<int32_t> h_top_k_;
};

class Sampler {
 public:
  // Workspaces for up to `max_rows` rows of `vocab` logits, allocated once.
  Sampler(ops::Backend& backend, int max_rows, int vocab);

  // One token per row of `logits` (F32 [B, vocab], backend memory). params[b] and rngs[b] belong to
  // row b's request; each sampled row draws exactly one uniform from its rng (greedy rows none).
  void sample(const TensorView& logits, std::span<const SamplingParams> params, std::span<RequestRng*> rngs,
              std::span<int32_t> out_ids);

 private:
  ops::Backend& backend_;
  int max_rows_, vocab_;
  ProbsFilter filter_;
  std::vector<Buffer> owned_;
  TensorView probs_, uniforms_, ids_;
  std::vector<float> h_uniforms_;
  std::vector<int32_t> h_ids_, h_argmax_;
  std::vector<const SamplingParams*> row_params_;
};

}  // namespace mla::runtime
