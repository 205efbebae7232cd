#include "runtime/sampler.h"

#include <cmath>

namespace mla::runtime {

Status validate_sampling_params(const SamplingParams& p) {
  if (!std::isfinite(p.temperature) || p.temperature < 0.0f) return error("temperature must be >= 0, got {}", p.temperature);
  if (!std::isfinite(p.top_p) || p.top_p <= 0.0f || p.top_p > 1.0f) return error("top_p must be in (0, 1], got {}", p.top_p);
  if (!std::isfinite(p.min_p) || p.min_p < 0.0f || p.min_p > 1.0f) return error("min_p must be in [0, 1], got {}", p.min_p);
  if (p.top_k < -1) return error("top_k must be -1, 0 (disabled) or positive, got {}", p.top_k);
  return Status::ok();
}

RequestRng make_request_rng(const SamplingParams& p) {
  if (p.seed) return RequestRng(*p.seed);
  std::random_device rd;
  return RequestRng((uint64_t(rd()) << 32) ^ rd());
}

Sampler::Sampler(ops::Backend& backend, int max_rows, int vocab)
    : backend_(backend), max_rows_(max_rows), vocab_(vocab) {
  auto make = [&](DType t, std::initializer_list<int64_t> dims) {
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    owned_.push_back(backend.alloc(size_t(n) * dtype_size(t)));
    return owned_.back().view(t, dims);
  };
  probs_ = make(DType::F32, {max_rows, vocab});
  temperature_ = make(DType::F32, {max_rows});
  top_k_ = make(DType::I32, {max_rows});
  top_p_ = make(DType::F32, {max_rows});
  min_p_ = make(DType::F32, {max_rows});
  uniforms_ = make(DType::F32, {max_rows});
  ids_ = make(DType::I32, {max_rows});
}

void Sampler::sample(const TensorView& logits, std::span<const SamplingParams> params, std::span<RequestRng*> rngs,
                     std::span<int32_t> out_ids) {
  const int64_t B = logits.dim(0);
  MLA_CHECK(B <= max_rows_ && logits.dim(1) == vocab_ && int64_t(params.size()) == B && int64_t(rngs.size()) == B &&
                int64_t(out_ids.size()) == B,
            "sampler given {} rows for {} params", logits.describe(), params.size());
  h_argmax_.resize(size_t(B));
  const TensorView ids = ids_.slice(0, 0, B);
  backend_.argmax(logits, ids);
  backend_.copy_to_host(h_argmax_.data(), ids);
  bool any_sampled = false;
  h_temperature_.assign(size_t(B), 1.0f);
  h_top_k_.assign(size_t(B), 0);
  h_top_p_.assign(size_t(B), 1.0f);
  h_min_p_.assign(size_t(B), 0.0f);
  h_uniforms_.assign(size_t(B), 0.0f);
  for (int64_t b = 0; b < B; ++b) {
    const SamplingParams& p = params[size_t(b)];
    if (p.greedy()) continue;
    any_sampled = true;
    h_temperature_[size_t(b)] = p.temperature;
    h_top_k_[size_t(b)] = p.top_k;
    h_top_p_[size_t(b)] = p.top_p;
    h_min_p_[size_t(b)] = p.min_p;
    h_uniforms_[size_t(b)] = rngs[size_t(b)]->uniform();
  }
  if (any_sampled) {
    // Order as the verifier uses it (MODELS.md §6): temperature, top-k, top-p, min-p, then sample.
    const TensorView probs = probs_.slice(0, 0, B);
    auto upload = [&](const TensorView& v, const void* src) {
      const TensorView s = v.slice(0, 0, B);
      backend_.copy_from_host(s, src);
      return s;
    };
    backend_.softmax(logits, upload(temperature_, h_temperature_.data()), probs);
    backend_.top_k_renorm_prob(probs, upload(top_k_, h_top_k_.data()), probs);
    backend_.top_p_renorm_prob(probs, upload(top_p_, h_top_p_.data()), probs);
    backend_.min_p_renorm_prob(probs, upload(min_p_, h_min_p_.data()), probs);
    backend_.sample_from_probs(probs, upload(uniforms_, h_uniforms_.data()), ids);
    h_ids_.resize(size_t(B));
    backend_.copy_to_host(h_ids_.data(), ids);
  }
  for (int64_t b = 0; b < B; ++b) out_ids[size_t(b)] = params[size_t(b)].greedy() ? h_argmax_[size_t(b)] : h_ids_[size_t(b)];
}

}  // namespace mla::runtime
