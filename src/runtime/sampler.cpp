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

namespace {
// A backend buffer of `dims` owned by `owned`.
TensorView make_buffer(ops::Backend& backend, std::vector<Buffer>& owned, DType t, std::initializer_list<int64_t> dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  owned.push_back(backend.alloc(size_t(n) * dtype_size(t)));
  return owned.back().view(t, dims);
}
}  // namespace

ProbsFilter::ProbsFilter(ops::Backend& backend, int max_rows) : backend_(backend), max_rows_(max_rows) {
  temperature_ = make_buffer(backend, owned_, DType::F32, {max_rows});
  top_k_ = make_buffer(backend, owned_, DType::I32, {max_rows});
  top_p_ = make_buffer(backend, owned_, DType::F32, {max_rows});
  min_p_ = make_buffer(backend, owned_, DType::F32, {max_rows});
}

void ProbsFilter::run(const TensorView& logits, std::span<const SamplingParams* const> params, const TensorView& probs) {
  const int64_t R = logits.dim(0);
  MLA_CHECK(R <= max_rows_ && int64_t(params.size()) == R, "probs filter given {} rows for {} params (max {})",
            logits.describe(), params.size(), max_rows_);
  h_temperature_.assign(size_t(R), 1.0f);
  h_top_k_.assign(size_t(R), 0);
  h_top_p_.assign(size_t(R), 1.0f);
  h_min_p_.assign(size_t(R), 0.0f);
  for (int64_t r = 0; r < R; ++r) {
    const SamplingParams& p = *params[size_t(r)];
    if (p.greedy()) continue;
    h_temperature_[size_t(r)] = p.temperature;
    h_top_k_[size_t(r)] = p.top_k;
    h_top_p_[size_t(r)] = p.top_p;
    h_min_p_[size_t(r)] = p.min_p;
  }
  auto upload = [&](const TensorView& v, const void* src) {
    const TensorView s = v.slice(0, 0, R);
    backend_.copy_from_host(s, src);
    return s;
  };
  // Order as the verifier uses it (MODELS.md section 6): temperature, top-k, top-p, min-p.
  backend_.softmax(logits, upload(temperature_, h_temperature_.data()), probs);
  backend_.top_k_renorm_prob(probs, upload(top_k_, h_top_k_.data()), probs);
  backend_.top_p_renorm_prob(probs, upload(top_p_, h_top_p_.data()), probs);
  backend_.min_p_renorm_prob(probs, upload(min_p_, h_min_p_.data()), probs);
}

Sampler::Sampler(ops::Backend& backend, int max_rows, int vocab)
    : backend_(backend), max_rows_(max_rows), vocab_(vocab), filter_(backend, max_rows) {
  probs_ = make_buffer(backend, owned_, DType::F32, {max_rows, vocab});
  uniforms_ = make_buffer(backend, owned_, DType::F32, {max_rows});
  ids_ = make_buffer(backend, owned_, DType::I32, {max_rows});
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
  h_uniforms_.assign(size_t(B), 0.0f);
  row_params_.clear();
  for (int64_t b = 0; b < B; ++b) {
    const SamplingParams& p = params[size_t(b)];
    row_params_.push_back(&p);
    if (p.greedy()) continue;
    any_sampled = true;
    h_uniforms_[size_t(b)] = rngs[size_t(b)]->uniform();
  }
  if (any_sampled) {
    const TensorView probs = probs_.slice(0, 0, B);
    filter_.run(logits, row_params_, probs);
    const TensorView u = uniforms_.slice(0, 0, B);
    backend_.copy_from_host(u, h_uniforms_.data());
    backend_.sample_from_probs(probs, u, ids);
    h_ids_.resize(size_t(B));
    backend_.copy_to_host(h_ids_.data(), ids);
  }
  for (int64_t b = 0; b < B; ++b) out_ids[size_t(b)] = params[size_t(b)].greedy() ? h_argmax_[size_t(b)] : h_ids_[size_t(b)];
}

}  // namespace mla::runtime
