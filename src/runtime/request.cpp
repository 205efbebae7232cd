// Request validation, the output channel and stop-string hold-back. Validation errors name the
// OpenAI parameter so the server can answer 400 with `param` set.
#include "runtime/request.h"

#include <algorithm>
#include <cmath>

namespace mla::runtime {

namespace {

EngineError invalid(std::string param, std::string message) {
  return EngineError{ErrorCode::InvalidParam, std::move(message), std::move(param)};
}

}  // namespace

std::optional<EngineError> validate_request(const RequestParams& p, const RequestLimits& limits) {
  if (p.prompt.empty()) return invalid("prompt", "prompt must contain at least one token");
  for (int32_t t : p.prompt)
    if (t < 0 || t >= limits.vocab_size)
      return invalid("prompt", fmt::format("token id {} is outside the vocabulary [0, {})", t, limits.vocab_size));
  if (p.max_tokens < 1) return invalid("max_tokens", fmt::format("max_tokens must be >= 1, got {}", p.max_tokens));
  if (p.min_tokens < 0 || p.min_tokens > p.max_tokens)
    return invalid("min_tokens",
                   fmt::format("min_tokens must be in [0, max_tokens={}], got {}", p.max_tokens, p.min_tokens));
  const SamplingParams& s = p.sampling;
  if (!std::isfinite(s.temperature) || s.temperature < 0.0f)
    return invalid("temperature", fmt::format("temperature must be >= 0, got {}", s.temperature));
  if (!std::isfinite(s.top_p) || s.top_p <= 0.0f || s.top_p > 1.0f)
    return invalid("top_p", fmt::format("top_p must be in (0, 1], got {}", s.top_p));
  if (!std::isfinite(s.min_p) || s.min_p < 0.0f || s.min_p > 1.0f)
    return invalid("min_p", fmt::format("min_p must be in [0, 1], got {}", s.min_p));
  if (s.top_k < -1) return invalid("top_k", fmt::format("top_k must be -1, 0 or positive, got {}", s.top_k));
  for (int32_t t : p.stop_token_ids)
    if (t < 0 || t >= limits.vocab_size)
      return invalid("stop_token_ids", fmt::format("stop token id {} is outside the vocabulary", t));
  if (!p.stop.empty() && !limits.has_tokenizer) return invalid("stop", "stop strings need a tokenizer");
  for (const std::string& s2 : p.stop)
    if (s2.empty()) return invalid("stop", "stop strings must be non-empty");
  if (p.logprobs && (*p.logprobs < 0 || *p.logprobs > kMaxTopLogprobs))
    return invalid("logprobs", fmt::format("logprobs must be in [0, {}], got {}", kMaxTopLogprobs, *p.logprobs));
  const int64_t total = int64_t(p.prompt.size()) + p.max_tokens;
  if (total > limits.max_model_len)
    return EngineError{ErrorCode::ContextLengthExceeded,
                       fmt::format("This model's maximum context length is {} tokens. However, you requested {} "
                                   "tokens ({} in the prompt, {} for the completion).",
                                   limits.max_model_len, total, p.prompt.size(), p.max_tokens),
                       "max_tokens"};
  return std::nullopt;
}

std::string_view finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::None: return "";
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Abort: return "abort";
    case FinishReason::Error: return "error";
  }
  return "";
}

// ---- RequestStream ---------------------------------------------------------------------------

void RequestStream::push(RequestOutput out) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_pushed_) return;  // nothing follows the final delta
    finished_pushed_ = out.finished;
    pending_.push_back(std::move(out));
  }
  cv_.notify_all();
}

std::optional<RequestOutput> RequestStream::take_locked() {
  if (pending_.empty()) return std::nullopt;
  RequestOutput merged = std::move(pending_.front());
  pending_.pop_front();
  while (!pending_.empty()) {  // usage counts and finish fields come from the latest delta
    RequestOutput& o = pending_.front();
    merged.token_ids.insert(merged.token_ids.end(), o.token_ids.begin(), o.token_ids.end());
    merged.text += o.text;
    for (TokenLogprob& lp : o.logprobs) merged.logprobs.push_back(std::move(lp));
    merged.finished = o.finished;
    merged.finish_reason = o.finish_reason;
    merged.stop_string = std::move(o.stop_string);
    merged.stop_token = o.stop_token;
    merged.error = std::move(o.error);
    merged.prompt_tokens = o.prompt_tokens;
    merged.completion_tokens = o.completion_tokens;
    merged.cached_tokens = o.cached_tokens;
    pending_.pop_front();
  }
  if (merged.finished) finished_read_ = true;
  return merged;
}

std::optional<RequestOutput> RequestStream::next(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (finished_read_) return std::nullopt;
  cv_.wait_for(lock, timeout, [&] { return !pending_.empty(); });
  return take_locked();
}

std::optional<RequestOutput> RequestStream::next() {
  std::unique_lock<std::mutex> lock(mu_);
  if (finished_read_) return std::nullopt;
  cv_.wait(lock, [&] { return !pending_.empty(); });
  return take_locked();
}

bool RequestStream::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return finished_read_;
}

// ---- StopStringMatcher -----------------------------------------------------------------------

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops, bool include_stop)
    : stops_(std::move(stops)), include_stop_(include_stop) {}

StopStringMatcher::Step StopStringMatcher::push(std::string_view piece, bool check) {
  Step step;
  held_.append(piece);
  if (stops_.empty() || !check) {
    step.emit = std::move(held_);
    held_.clear();
    return step;
  }
  // Earliest match wins (ties: the longer stop string). Everything before `held_` was already
  // scanned, and a match wholly inside it would have ended the request then.
  size_t best = std::string::npos;
  const std::string* best_stop = nullptr;
  for (const std::string& s : stops_) {
    const size_t at = held_.find(s);
    if (at != std::string::npos && (at < best || (at == best && s.size() > best_stop->size()))) {
      best = at;
      best_stop = &s;
    }
  }
  if (best_stop) {
    step.emit = held_.substr(0, include_stop_ ? best + best_stop->size() : best);
    step.matched = *best_stop;
    held_.clear();
    return step;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const std::string& s : stops_) {
    const size_t max_k = std::min(s.size() - 1, held_.size());
    for (size_t k = max_k; k > keep; --k)
      if (std::string_view(held_).substr(held_.size() - k) == std::string_view(s).substr(0, k)) {
        keep = k;
        break;
      }
  }
  step.emit = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return step;
}

std::string StopStringMatcher::flush() {
  std::string out = std::move(held_);
  held_.clear();
  return out;
}

// ---- Request ---------------------------------------------------------------------------------

bool request_transition_allowed(RequestStatus from, RequestStatus to) {
  switch (from) {
    case RequestStatus::Waiting: return to == RequestStatus::Running || to == RequestStatus::Finished;
    case RequestStatus::Running: return to == RequestStatus::Preempted || to == RequestStatus::Finished;
    case RequestStatus::Preempted: return to == RequestStatus::Running || to == RequestStatus::Finished;
    case RequestStatus::Finished: return false;
  }
  return false;
}

Request::Request(uint64_t request_id, uint64_t arrival_order, RequestParams request_params,
                 std::shared_ptr<RequestStream> output, const tokenizer::Tokenizer* tok)
    : id(request_id),
      arrival(arrival_order),
      params(std::move(request_params)),
      stream(std::move(output)),
      tokens(params.prompt),
      prompt_len(int(params.prompt.size())),
      root_hash(prefix_root_hash(params.cache_salt.value_or(""))),
      rng(make_request_rng(params.sampling)),
      stopper(params.stop, params.include_stop_str_in_output),
      arrival_time(std::chrono::steady_clock::now()) {
  if (tok) detok = std::make_unique<tokenizer::IncrementalDetokenizer>(*tok, params.skip_special_tokens);
}

void Request::transition(RequestStatus to) {
  MLA_CHECK(request_transition_allowed(status, to), "request {}: illegal transition {} -> {}", id, int(status),
            int(to));
  status = to;
}

}  // namespace mla::runtime
