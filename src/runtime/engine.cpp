// The engine thread: inbox -> schedule -> apply the plan to the block pool / prefix cache ->
// forward -> sample -> stop checks and detokenization -> per-request streams. Invariants: a
// sequence's blocks cover [0, num_computed) before a step and [0, num_computed + n) during it;
// every block reference a request holds is dropped through PrefixCache::release; requests are
// erased only at the end of a loop iteration, so Request* taken within a step stay valid.
#include "runtime/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

namespace mla::runtime {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// vLLM's bucket edges (seconds), so dashboards built for it read ours.
std::vector<double> ttft_buckets() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
          2.5,   5.0,   7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
}
std::vector<double> itl_buckets() {
  return {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
}
std::vector<double> e2e_buckets() {
  return {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
          960.0, 1920.0, 7680.0};
}

bool contains(const std::vector<int32_t>& v, int32_t x) { return std::find(v.begin(), v.end(), x) != v.end(); }

// log_softmax of one raw logits row at `token`, plus the top `k` entries (descending, ties by id).
TokenLogprob compute_logprobs(const float* row, int vocab, int32_t token, int k, std::vector<int32_t>& scratch) {
  double mx = -std::numeric_limits<double>::infinity();
  for (int v = 0; v < vocab; ++v) mx = std::max(mx, double(row[v]));
  double sum = 0;
  for (int v = 0; v < vocab; ++v) sum += std::exp(double(row[v]) - mx);
  const double lse = mx + std::log(sum);
  TokenLogprob lp;
  lp.token = token;
  lp.logprob = float(double(row[token]) - lse);
  if (k > 0) {
    scratch.resize(size_t(vocab));
    for (int v = 0; v < vocab; ++v) scratch[size_t(v)] = v;
    const int kk = std::min(k, vocab);
    std::partial_sort(scratch.begin(), scratch.begin() + kk, scratch.end(),
                      [row](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
    for (int i = 0; i < kk; ++i) {
      const int32_t id = scratch[size_t(i)];
      lp.top.emplace_back(id, float(double(row[id]) - lse));
    }
  }
  return lp;
}

}  // namespace

LatencyHistogram::LatencyHistogram(std::vector<double> b) : bounds(std::move(b)), counts(bounds.size() + 1, 0) {}

void LatencyHistogram::observe(double seconds) {
  const size_t i = size_t(std::lower_bound(bounds.begin(), bounds.end(), seconds) - bounds.begin());
  ++counts[i];
  sum += seconds;
  ++count;
}

// ---- construction / lifecycle ----------------------------------------------------------------

Result<std::unique_ptr<Engine>> Engine::create(model::DeepseekV3& model, ops::Backend& backend,
                                               const tokenizer::Tokenizer* tok, const EngineConfig& config,
                                               spec::DraftModel* draft) {
  const model::ModelLimits& lim = model.limits();
  if (config.max_num_seqs < 1 || config.max_num_seqs > lim.max_seqs)
    return error("max_num_seqs {} outside [1, {}] (the model's max_seqs)", config.max_num_seqs, lim.max_seqs);
  if (config.max_tokens_per_step < 1 || config.max_tokens_per_step > lim.max_tokens)
    return error("max_tokens_per_step {} outside [1, {}] (the model's max_tokens)", config.max_tokens_per_step,
                 lim.max_tokens);
  if (config.block_size < 1 || config.num_blocks < 1 || config.max_waiting < 0 || config.max_model_len < 0)
    return error("bad engine config: block_size {} num_blocks {} max_waiting {} max_model_len {}", config.block_size,
                 config.num_blocks, config.max_waiting, config.max_model_len);
  // One sequence must always fit the pool and a step's block tables, or it could never finish.
  const int64_t capacity = std::min(int64_t(config.num_blocks), int64_t(lim.max_block_entries)) * config.block_size;
  const int64_t model_len = std::min<int64_t>(model.config().max_position_embeddings, capacity);
  if (config.max_model_len > model_len)
    return error("max_model_len {} exceeds {} (max_position_embeddings {}, KV pool {} blocks x {} tokens)",
                 config.max_model_len, model_len, model.config().max_position_embeddings, config.num_blocks,
                 config.block_size);
  const int max_len = config.max_model_len > 0 ? config.max_model_len : int(model_len);
  if (config.kv_cache_dtype != DType::F32 && config.kv_cache_dtype != DType::BF16)
    return error("KV cache dtype {} is not supported (f32 or bf16)", dtype_name(config.kv_cache_dtype));
  for (int32_t t : config.eos_token_ids)
    if (t < 0 || t >= model.config().vocab_size) return error("eos token id {} outside the vocabulary", t);
  if (draft != nullptr && (config.num_draft_tokens < 1 || config.num_draft_tokens > 16))
    return error("num_draft_tokens {} outside [1, 16]", config.num_draft_tokens);
  std::unique_ptr<Engine> e(new Engine(model, backend, tok, config, max_len, draft));
  e->thread_ = std::thread([p = e.get()] { p->run(); });
  return e;
}

namespace {
KvCacheConfig kv_config(model::DeepseekV3& model, const EngineConfig& config) {
  KvCacheConfig c;
  c.num_layers = model.num_cache_layers();
  c.num_blocks = config.num_blocks;
  c.block_size = config.block_size;
  c.kv_dim = model.kv_dim();
  c.dtype = config.kv_cache_dtype;
  return c;
}
}  // namespace

Engine::Engine(model::DeepseekV3& model, ops::Backend& backend, const tokenizer::Tokenizer* tok,
               const EngineConfig& config, int max_model_len, spec::DraftModel* draft)
    : model_(model),
      backend_(backend),
      tok_(tok),
      config_(config),
      max_model_len_(max_model_len),
      vocab_(model.config().vocab_size),
      cache_(backend, kv_config(model, config)),
      prefix_(cache_.pool()),
      sampler_(backend, config.max_num_seqs, model.config().vocab_size),
      logits_buf_(backend.alloc(size_t(config.max_num_seqs) * size_t(model.config().vocab_size) * sizeof(float))),
      ttft_(ttft_buckets()),
      itl_(itl_buckets()),
      e2e_(e2e_buckets()) {
  for (int L = 0; L < model.num_cache_layers(); ++L) cache_layers_.push_back(cache_.layer(L));
  if (draft != nullptr) {
    spec::SpeculatorConfig sc;
    sc.num_draft_tokens = config.num_draft_tokens;
    sc.max_seqs = config.max_num_seqs;
    sc.max_target_tokens = config.max_tokens_per_step;
    sc.vocab = model.config().vocab_size;
    sc.num_blocks = config.num_blocks;
    sc.block_size = config.block_size;
    sc.cache_dtype = config.kv_cache_dtype;
    speculator_ = std::make_unique<spec::Speculator>(backend, *draft, sc);
  }
  metrics_.num_blocks = config.num_blocks;
  metrics_.ttft = ttft_;
  metrics_.itl = itl_;
  metrics_.e2e = e2e_;
}

Engine::~Engine() { shutdown(/*drain=*/false); }

void Engine::shutdown(bool drain) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopping_) drain_ = drain;
    if (!drain) drain_ = false;  // a later non-draining call cuts a drain short
    stopping_ = true;
  }
  cv_.notify_all();
  std::lock_guard<std::mutex> join_lock(join_mu_);
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) {
    thread_.join();
    delivery_.stop();  // the engine thread posted its last outputs before it returned
  }
}

SubmitResult Engine::submit(RequestParams params) {
  SubmitResult res;
  const RequestLimits limits{vocab_, max_model_len_, tok_ != nullptr};
  if (auto err = validate_request(params, limits)) {
    res.error = std::move(*err);
    return res;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (dead_.load()) {
    res.error = {ErrorCode::EngineDead, "the engine has stopped after an internal error", ""};
  } else if (stopping_) {
    res.error = {ErrorCode::ShuttingDown, "the server is shutting down", ""};
  } else if (num_unstarted_ >= config_.max_waiting) {
    res.error = {ErrorCode::QueueFull,
                 fmt::format("too many queued requests ({}); retry later", num_unstarted_), ""};
  } else {
    const uint64_t id = next_id_++;
    res.stream = std::make_shared<RequestStream>(id);
    inbox_.push_back(std::make_unique<Request>(id, id, std::move(params), res.stream, tok_));
    ++num_unstarted_;
  }
  if (res.ok()) cv_.notify_one();
  return res;
}

void Engine::abort(uint64_t request_id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    abort_inbox_.push_back(request_id);
  }
  cv_.notify_one();
}

EngineMetrics Engine::metrics() const {
  std::lock_guard<std::mutex> lock(mu_);
  EngineMetrics m = metrics_;
  m.num_waiting += int(inbox_.size());
  m.healthy = !dead_.load();
  return m;
}

Request* Engine::find(uint64_t id) {
  const auto it = requests_.find(id);
  return it == requests_.end() || it->second->status == RequestStatus::Finished ? nullptr : it->second.get();
}

// ---- the loop --------------------------------------------------------------------------------

void Engine::run() {
  // Decode graphs point into this engine's cache and logits buffer: start clean, and drop them
  // (restoring the model's setting) before those buffers are freed.
  const model::ScopedDecodeGraphs graphs_scope(model_, config_.decode_graphs);
  std::vector<std::unique_ptr<Request>> fresh;
  std::vector<uint64_t> aborts;
  bool idle_last = false;
  while (true) {
    bool stopping = false, drain = true;
    {
      std::unique_lock<std::mutex> lock(mu_);
      const auto has_input = [&] { return !inbox_.empty() || !abort_inbox_.empty() || stopping_; };
      if (running_.empty() && waiting_.empty()) {
        cv_.wait(lock, has_input);
      } else if (idle_last) {  // work exists but none could be scheduled: do not spin
        cv_.wait_for(lock, std::chrono::milliseconds(1), has_input);
      }
      fresh.swap(inbox_);
      aborts.swap(abort_inbox_);
      stopping = stopping_;
      drain = drain_;
    }
    for (std::unique_ptr<Request>& r : fresh) {
      Request* p = r.get();
      requests_.emplace(p->id, std::move(r));
      waiting_.push_back(p);  // ids grow with arrival: appending keeps FIFO order
    }
    fresh.clear();
    for (uint64_t id : aborts)
      if (Request* r = find(id)) finish(*r, FinishReason::Abort, RequestOutput{});
    aborts.clear();
    if (stopping && !drain) {
      while (!running_.empty()) finish(*running_.back(), FinishReason::Abort, RequestOutput{});
      while (!waiting_.empty()) finish(*waiting_.back(), FinishReason::Abort, RequestOutput{});
    }
    idle_last = false;
    if (!running_.empty() || !waiting_.empty()) {
      const int64_t before = stat_steps_;
      const Clock::time_point t0 = Clock::now();
      step_forward_seconds_ = 0;
      step_decode_only_ = false;
      try {
        step();
      } catch (const std::exception& e) {
        fail_all(fmt::format("engine step failed: {}", e.what()));
      }
      const double dt = seconds_between(t0, Clock::now());
      stat_step_seconds_ += dt;
      stat_forward_seconds_ += step_forward_seconds_;
      if (step_decode_only_ && stat_steps_ > before) {
        ++stat_decode_steps_;
        stat_decode_step_seconds_ += dt;
        stat_decode_forward_seconds_ += step_forward_seconds_;
      }
      idle_last = stat_steps_ == before;
    }
    std::erase_if(requests_, [](const auto& kv) { return kv.second->status == RequestStatus::Finished; });
    publish_metrics();
    // After publishing: a client that has its final output sees metrics that include it.
    delivery_.post(outbox_);  // every output of this iteration (finishes and aborts included)
    if (dead_.load()) return;
    if (stopping && running_.empty() && waiting_.empty()) {
      std::lock_guard<std::mutex> lock(mu_);
      if (inbox_.empty()) return;  // submissions stopped before the last swap: none can follow
    }
  }
}

void Engine::step() {
  const int bs = config_.block_size;
  SchedulerState st;
  st.block_size = bs;
  st.available_blocks = prefix_.num_available();
  // A step's running chunks need at most budget / bs + R new blocks (a chunk of n tokens: at most
  // n / bs + 1). With more than that available nobody can be preempted, so the O(blocks held)
  // freeable count (only read when preempting) is skipped.
  const bool pressure =
      st.available_blocks < config_.max_tokens_per_step / bs + 2 * int(running_.size()) + 1;
  for (Request* r : running_) {
    SchedSeq s;
    s.id = r->id;
    s.arrival = r->arrival;
    s.num_tokens = r->num_tokens();
    s.num_computed = r->num_computed;
    s.num_blocks = int(r->blocks.size());
    s.num_lookahead = int(r->draft_tokens.size());
    if (pressure) {
      for (int32_t b : r->blocks) {
        const int rc = cache_.pool().ref_count(b);
        s.num_freeable_blocks += (rc == 1 || (rc == 2 && prefix_.contains_block(b))) ? 1 : 0;
      }
    }
    st.running.push_back(s);
  }
  // Prefix lookups (O(prompt blocks) each) only for the queue head the scheduler could admit:
  // none while the running set is full, the steady state of a busy server.
  const size_t lookups = size_t(std::max(0, config_.max_num_seqs - int(running_.size())));
  for (size_t i = 0; i < waiting_.size(); ++i) {
    Request& r = *waiting_[i];
    SchedSeq s;
    s.id = r.id;
    s.arrival = r.arrival;
    s.num_tokens = r.num_tokens();
    if (config_.enable_prefix_caching && i < lookups) {
      prefix_extend_hashes(r.hashes, r.root_hash, r.tokens, bs);
      // Leave at least one token to compute: its logits produce the next token.
      const int m = std::min(prefix_.match(r.hashes), (r.num_tokens() - 1) / bs);
      s.prefix_hit_tokens = m * bs;
      s.prefix_hit_evictable = prefix_.count_evictable(r.hashes, m);
    }
    st.waiting.push_back(s);
  }
  SchedulerConfig sc;
  sc.max_num_seqs = config_.max_num_seqs;
  sc.max_tokens_per_step = config_.max_tokens_per_step;
  sc.max_block_entries = model_.limits().max_block_entries;
  const StepPlan plan = schedule(st, sc);
  apply_plan(plan);
  if (plan.chunks.empty()) return;
  step_decode_only_ = std::all_of(plan.chunks.begin(), plan.chunks.end(), [](const ScheduledChunk& c) {
    return c.samples && !c.admitted && c.num_new_tokens - c.num_draft_tokens == 1;
  });
  if (speculator_) {
    forward_and_verify(plan);
  } else {
    forward_and_sample(plan);
  }
}

void Engine::release_blocks(Request& r) {
  // Tail first: the LRU then evicts a sequence's last blocks before its shared-prefix head.
  for (auto it = r.blocks.rbegin(); it != r.blocks.rend(); ++it) prefix_.release(*it);
  r.blocks.clear();
  r.num_computed = 0;
  r.num_registered_blocks = 0;
}

void Engine::preempt(Request& r) {
  release_blocks(r);
  r.draft_tokens.clear();
  r.draft_q_row = -1;
  r.transition(RequestStatus::Preempted);
  ++r.num_preemptions;
  ++stat_preemptions_;
  std::erase(running_, &r);
  const auto pos = std::lower_bound(waiting_.begin(), waiting_.end(), &r,
                                    [](const Request* a, const Request* b) { return a->arrival < b->arrival; });
  waiting_.insert(pos, &r);
}

void Engine::apply_plan(const StepPlan& plan) {
  for (uint64_t id : plan.preempted) preempt(*find(id));
  const int bs = config_.block_size;
  const auto by_arrival = [](const Request* a, const Request* b) { return a->arrival < b->arrival; };
  // Acquire every admitted sequence's prefix hit before any allocation, so no allocation can
  // evict a block the plan counted as a hit.
  for (const ScheduledChunk& c : plan.chunks) {
    if (!c.admitted) continue;
    Request& r = *find(c.id);
    r.transition(RequestStatus::Running);
    std::erase(waiting_, &r);
    running_.insert(std::lower_bound(running_.begin(), running_.end(), &r, by_arrival), &r);
    if (config_.enable_prefix_caching)
      prefix_.acquire(r.hashes, c.prefix_hit_tokens / bs, r.blocks, r.num_tokens(), bs);
    r.num_computed = c.prefix_hit_tokens;
    r.num_registered_blocks = c.prefix_hit_tokens / bs;
    if (!r.admitted_once) {
      r.admitted_once = true;
      r.cached_tokens = c.prefix_hit_tokens;
      stat_prompt_tokens_ += r.prompt_len;
      std::lock_guard<std::mutex> lock(mu_);
      --num_unstarted_;
    }
  }
  for (const ScheduledChunk& c : plan.chunks) {
    Request& r = *find(c.id);
    const size_t need = size_t((r.num_computed + c.num_new_tokens + bs - 1) / bs);
    while (r.blocks.size() < need) {
      const std::optional<int32_t> b = prefix_.allocate();
      MLA_CHECK(b.has_value(), "scheduler overcommitted the KV pool (request {})", r.id);
      r.blocks.push_back(*b);
    }
  }
}

void Engine::register_full_blocks(Request& r) {
  if (!config_.enable_prefix_caching) return;
  const int bs = config_.block_size;
  const int full = r.num_computed / bs;
  if (full <= r.num_registered_blocks) return;
  MLA_CHECK(size_t(full) * size_t(bs) <= r.tokens.size(), "request {}: {} computed tokens but {} known", r.id,
            r.num_computed, r.tokens.size());
  prefix_extend_hashes(r.hashes, r.root_hash, std::span<const int32_t>(r.tokens).first(size_t(full) * size_t(bs)), bs);
  for (int b = r.num_registered_blocks; b < full; ++b) prefix_.insert(r.hashes[size_t(b)], r.blocks[size_t(b)]);
  r.num_registered_blocks = full;
}

void Engine::forward_and_sample(const StepPlan& plan) {
  ids_.clear();
  positions_.clear();
  logits_rows_.clear();
  slices_.clear();
  std::vector<Request*> scheduled, samplers;
  for (const ScheduledChunk& c : plan.chunks) {
    Request& r = *find(c.id);
    scheduled.push_back(&r);
    const int row0 = int(ids_.size());
    for (int i = 0; i < c.num_new_tokens; ++i) {
      ids_.push_back(r.tokens[size_t(r.num_computed + i)]);
      positions_.push_back(r.num_computed + i);
    }
    slices_.push_back({c.num_new_tokens, r.num_computed + c.num_new_tokens, r.blocks});
    if (c.samples) {
      logits_rows_.push_back(row0 + c.num_new_tokens - 1);
      samplers.push_back(&r);
    }
  }
  // The forward produces at least one logits row; a step of unfinished prefill chunks computes
  // one and discards it.
  if (logits_rows_.empty()) logits_rows_.push_back(int(ids_.size()) - 1);
  const TensorView logits = logits_buf_.view(DType::F32, {int64_t(logits_rows_.size()), vocab_});
  model_.set_mla_path(config_.mla_path);
  model::ForwardInputs in{ids_, positions_, slices_, logits_rows_, cache_layers_, config_.block_size};
  const Clock::time_point t0 = Clock::now();
  model_.forward(in, logits);
  ++stat_steps_;
  for (size_t i = 0; i < scheduled.size(); ++i) {
    scheduled[i]->num_computed += plan.chunks[i].num_new_tokens;
    register_full_blocks(*scheduled[i]);
  }
  if (samplers.empty()) {
    backend_.synchronize();  // the forward's time belongs to this step
    step_forward_seconds_ += seconds_between(t0, Clock::now());
    return;
  }

  const int64_t B = int64_t(samplers.size());
  bool any_logprobs = false;
  for (Request* r : samplers) any_logprobs |= r->params.logprobs.has_value();
  if (any_logprobs) {  // raw logits, before the min_tokens mask below
    host_logits_.resize(size_t(B) * size_t(vocab_));
    backend_.copy_to_host(host_logits_.data(), logits.slice(0, 0, B));
  }
  // min_tokens: EOS and stop tokens cannot be sampled yet (vLLM's MinTokensLogitsProcessor).
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int64_t b = 0; b < B; ++b) {
    const Request& r = *samplers[size_t(b)];
    if (r.num_output() >= r.params.min_tokens) continue;
    const TensorView row = logits.slice(0, b, 1);
    for (const std::vector<int32_t>* ids : {&config_.eos_token_ids, &r.params.stop_token_ids})
      for (int32_t t : *ids) backend_.copy_from_host(row.slice(1, t, 1), &neg_inf);
  }
  std::vector<SamplingParams> params;
  std::vector<RequestRng*> rngs;
  for (Request* r : samplers) {
    params.push_back(r->params.sampling);
    rngs.push_back(&r->rng);
  }
  sampled_.assign(size_t(B), 0);
  sampler_.sample(logits, params, rngs, sampled_);
  step_forward_seconds_ += seconds_between(t0, Clock::now());  // ids are on the host: the device is done
  for (int64_t b = 0; b < B; ++b) {
    Request& r = *samplers[size_t(b)];
    emit_token(r, sampled_[size_t(b)], any_logprobs ? host_logits_.data() + b * vocab_ : nullptr,
               r.params.logprobs.has_value());
  }
}

void Engine::emit_token(Request& r, int32_t token, const float* logits_row, bool want_logprobs) {
  const Clock::time_point now = Clock::now();
  if (r.num_output() == 0) {
    ttft_.observe(seconds_between(r.arrival_time, now));
  } else {
    itl_.observe(seconds_between(r.last_token_time, now));
  }
  r.last_token_time = now;
  r.tokens.push_back(token);
  ++stat_generation_tokens_;

  RequestOutput out;
  out.token_ids.push_back(token);
  if (want_logprobs) {
    static thread_local std::vector<int32_t> scratch;
    out.logprobs.push_back(compute_logprobs(logits_row, vocab_, token, *r.params.logprobs, scratch));
  }
  const RequestParams& p = r.params;
  const bool may_stop = r.num_output() > p.min_tokens;
  const bool stop_token =
      may_stop && (contains(p.stop_token_ids, token) || (!p.ignore_eos && contains(config_.eos_token_ids, token)));
  if (stop_token) {
    if (r.detok) {
      if (p.include_stop_str_in_output) out.text += r.stopper.push(r.detok->push(token), false).emit;
      out.text += r.stopper.flush();
      out.text += r.detok->finish();
    }
    out.stop_token = token;
    finish(r, FinishReason::Stop, std::move(out));
    return;
  }
  if (r.detok) {
    StopStringMatcher::Step s = r.stopper.push(r.detok->push(token), may_stop);
    out.text = std::move(s.emit);
    if (s.matched) {
      out.stop_string = std::move(s.matched);
      finish(r, FinishReason::Stop, std::move(out));
      return;
    }
  }
  if (r.num_output() >= p.max_tokens) {
    if (r.detok) {
      StopStringMatcher::Step s = r.stopper.push(r.detok->finish(), may_stop);
      out.text += s.emit;
      if (s.matched) {
        out.stop_string = std::move(s.matched);
        finish(r, FinishReason::Stop, std::move(out));
        return;
      }
      out.text += r.stopper.flush();
    }
    finish(r, FinishReason::Length, std::move(out));
    return;
  }
  out.request_id = r.id;
  out.prompt_tokens = r.prompt_len;
  out.completion_tokens = r.num_output();
  out.cached_tokens = r.cached_tokens;
  outbox_.emplace_back(r.stream, std::move(out));
}

void Engine::finish(Request& r, FinishReason reason, RequestOutput out) {
  release_blocks(r);
  std::erase(running_, &r);
  std::erase(waiting_, &r);
  if (!r.admitted_once) {
    std::lock_guard<std::mutex> lock(mu_);
    --num_unstarted_;
  }
  r.transition(RequestStatus::Finished);
  out.request_id = r.id;
  out.finished = true;
  out.finish_reason = reason;
  out.prompt_tokens = r.prompt_len;
  out.completion_tokens = r.num_output();
  out.cached_tokens = r.cached_tokens;
  ++stat_finished_[size_t(reason)];
  e2e_.observe(seconds_between(r.arrival_time, Clock::now()));
  outbox_.emplace_back(r.stream, std::move(out));
}

void Engine::fail_all(const std::string& why) {
  dead_.store(true);
  std::vector<std::unique_ptr<Request>> pending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending.swap(inbox_);
  }
  for (std::unique_ptr<Request>& r : pending) {
    Request* p = r.get();
    requests_.emplace(p->id, std::move(r));
    waiting_.push_back(p);
  }
  RequestOutput out;
  out.error = why;
  while (!running_.empty()) finish(*running_.back(), FinishReason::Error, out);
  while (!waiting_.empty()) finish(*waiting_.back(), FinishReason::Error, out);
}

void Engine::publish_metrics() {
  EngineMetrics m;
  m.num_running = int(running_.size());
  m.num_waiting = int(waiting_.size());
  m.num_blocks = cache_.pool().num_blocks();
  m.num_blocks_cached_evictable = prefix_.num_evictable();
  m.num_blocks_used = m.num_blocks - cache_.pool().num_free() - m.num_blocks_cached_evictable;
  m.kv_usage = m.num_blocks ? double(m.num_blocks_used) / m.num_blocks : 0.0;
  m.prefix_queried_tokens = prefix_.stats().queried_tokens;
  m.prefix_hit_tokens = prefix_.stats().hit_tokens;
  m.prefix_hit_rate = m.prefix_queried_tokens ? double(m.prefix_hit_tokens) / double(m.prefix_queried_tokens) : 0.0;
  m.prompt_tokens = stat_prompt_tokens_;
  m.generation_tokens = stat_generation_tokens_;
  m.preemptions = stat_preemptions_;
  m.steps = stat_steps_;
  m.forward_seconds = stat_forward_seconds_;
  m.step_seconds = stat_step_seconds_;
  m.decode_steps = stat_decode_steps_;
  m.decode_forward_seconds = stat_decode_forward_seconds_;
  m.decode_step_seconds = stat_decode_step_seconds_;
  std::copy(std::begin(stat_finished_), std::end(stat_finished_), std::begin(m.requests_finished));
  m.ttft = ttft_;
  m.itl = itl_;
  m.e2e = e2e_;
  m.healthy = !dead_.load();
  if (speculator_) {
    m.speculative = true;
    m.spec = speculator_->stats();
  }
  std::lock_guard<std::mutex> lock(mu_);
  metrics_ = std::move(m);
}

}  // namespace mla::runtime
