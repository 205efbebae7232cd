#include "runtime/offline_engine.h"

#include <algorithm>
#include <chrono>
#include <memory>

namespace mla::runtime {

namespace {

struct SeqState {
  const GenerationRequest* req = nullptr;
  std::vector<int32_t> tokens;  // prompt, then generated
  int num_cached = 0;           // tokens whose latents are in the cache
  BlockTable blocks;
  RequestRng rng{0};
  bool done = false;
  GenerationResult result;
  int prompt_len() const { return int(req->prompt.size()); }
};

Status validate(const GenerationRequest& r, const io::ModelConfig& cfg, size_t index) {
  const std::string where = fmt::format("request {}", index);
  if (r.prompt.empty()) return error("{}: prompt is empty", where);
  if (r.max_tokens < 1) return error("{}: max_tokens must be >= 1, got {}", where, r.max_tokens);
  for (int32_t t : r.prompt)
    if (t < 0 || t >= cfg.vocab_size) return error("{}: token id {} outside the vocabulary [0, {})", where, t, cfg.vocab_size);
  if (int64_t(r.prompt.size()) + r.max_tokens > cfg.max_position_embeddings)
    return error("{}: prompt ({}) + max_tokens ({}) exceeds max_position_embeddings {}", where, r.prompt.size(),
                 r.max_tokens, cfg.max_position_embeddings);
  return validate_sampling_params(r.sampling).with_context(where);
}

}  // namespace

Result<std::vector<GenerationResult>> generate(model::DeepseekV3& model, ops::Backend& backend,
                                               const std::vector<GenerationRequest>& requests,
                                               const EngineOptions& options, EngineStats* stats) {
  using Clock = std::chrono::steady_clock;
  const io::ModelConfig& cfg = model.config();
  const model::ModelLimits& lim = model.limits();
  if (requests.empty()) return std::vector<GenerationResult>{};
  if (options.block_size <= 0 || options.max_tokens_per_step <= 0) return error("bad engine options");
  for (size_t i = 0; i < requests.size(); ++i) MLA_RETURN_IF_ERROR(validate(requests[i], cfg, i));

  int need_blocks = 0;
  for (const GenerationRequest& r : requests)
    need_blocks += (int(r.prompt.size()) + r.max_tokens + options.block_size - 1) / options.block_size;
  const int num_blocks = options.num_blocks > 0 ? options.num_blocks : need_blocks;
  if (options.kv_cache_dtype != DType::F32 && options.kv_cache_dtype != DType::BF16)
    return error("KV cache dtype {} is not supported (f32 or bf16)", dtype_name(options.kv_cache_dtype));
  KvCache cache(backend, KvCacheConfig{model.num_cache_layers(), num_blocks, options.block_size, model.kv_dim(),
                                       options.kv_cache_dtype});
  std::vector<TensorView> cache_layers;
  for (int L = 0; L < model.num_cache_layers(); ++L) cache_layers.push_back(cache.layer(L));

  const int budget = std::min(options.max_tokens_per_step, lim.max_tokens);
  Sampler sampler(backend, lim.max_seqs, cfg.vocab_size);
  Buffer logits_buf = backend.alloc(size_t(lim.max_seqs) * size_t(cfg.vocab_size) * sizeof(float));
  model.set_mla_path(options.mla_path);
  // Graphs captured below point into `cache` and `logits_buf`: drop them before those are freed
  // (declared after both, so destroyed first, on every return path), and give the model back its
  // previous setting.
  const model::ScopedDecodeGraphs graphs_scope(model, options.decode_graphs);

  std::vector<SeqState> seqs(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    seqs[i].req = &requests[i];
    seqs[i].tokens = requests[i].prompt;
    seqs[i].rng = make_request_rng(requests[i].sampling);
  }
  EngineStats st;
  for (const GenerationRequest& r : requests) st.prompt_tokens += int64_t(r.prompt.size());
  const Clock::time_point t_start = Clock::now();

  std::vector<int32_t> ids, positions, logits_rows, sampled;
  std::vector<model::SequenceSlice> slices;
  std::vector<SeqState*> sampled_seqs;
  std::vector<SamplingParams> params;
  std::vector<RequestRng*> rngs;
  std::vector<float> host_logits;
  while (true) {
    // Plan: decode rows first (one token each), then prefill chunks, within the token budget.
    ids.clear(); positions.clear(); logits_rows.clear(); slices.clear(); sampled_seqs.clear();
    int used = 0;
    bool any_prefill = false;
    std::vector<SeqState*> order;
    for (SeqState& s : seqs) if (!s.done && int(s.tokens.size()) - s.num_cached == 1) order.push_back(&s);
    for (SeqState& s : seqs) if (!s.done && int(s.tokens.size()) - s.num_cached > 1) order.push_back(&s);
    if (order.empty()) break;
    std::vector<std::pair<SeqState*, int>> chunks;
    for (SeqState* s : order) {
      if (used == budget || int(slices.size()) == lim.max_seqs) break;
      const int n = std::min(int(s->tokens.size()) - s->num_cached, budget - used);
      if (!s->blocks.ensure_capacity(cache.pool(), s->num_cached + n, options.block_size))
        return error("KV cache of {} blocks is too small for this batch", num_blocks);
      chunks.emplace_back(s, n);
      used += n;
    }
    for (auto& [s, n] : chunks) {
      const int row0 = int(ids.size());
      for (int i = 0; i < n; ++i) {
        ids.push_back(s->tokens[size_t(s->num_cached + i)]);
        positions.push_back(s->num_cached + i);
      }
      s->num_cached += n;
      any_prefill |= (n > 1 || s->num_cached <= s->prompt_len());
      slices.push_back({n, s->num_cached, s->blocks.blocks()});
      if (s->num_cached == int(s->tokens.size())) {  // chunk reaches the end: this row samples
        logits_rows.push_back(row0 + n - 1);
        sampled_seqs.push_back(s);
      }
    }
    if (logits_rows.empty()) {
      // A prefill chunk that does not finish its prompt still needs one logits row for the
      // forward contract; it is computed and discarded.
      logits_rows.push_back(int(ids.size()) - 1);
    }
    const Clock::time_point t0 = Clock::now();
    const TensorView logits = logits_buf.view(DType::F32, {int64_t(logits_rows.size()), cfg.vocab_size});
    model::ForwardInputs in{ids, positions, slices, logits_rows, cache_layers, options.block_size};
    model.forward(in, logits);
    if (!sampled_seqs.empty()) {
      const int64_t B = int64_t(sampled_seqs.size());
      params.clear(); rngs.clear(); sampled.assign(size_t(B), 0);
      for (SeqState* s : sampled_seqs) { params.push_back(s->req->sampling); rngs.push_back(&s->rng); }
      sampler.sample(logits.slice(0, 0, B), params, rngs, sampled);
      for (int64_t b = 0; b < B; ++b) {
        SeqState& s = *sampled_seqs[size_t(b)];
        if (s.result.tokens.empty()) {
          s.result.time_to_first_token_s = std::chrono::duration<double>(Clock::now() - t_start).count();
          if (options.capture_prompt_logits) {
            host_logits.resize(size_t(B) * size_t(cfg.vocab_size));
            backend.copy_to_host(host_logits.data(), logits.slice(0, 0, B));
            s.result.prompt_logits.assign(host_logits.begin() + b * cfg.vocab_size,
                                          host_logits.begin() + (b + 1) * cfg.vocab_size);
          }
        }
        const int32_t tok = sampled[size_t(b)];
        s.result.tokens.push_back(tok);
        s.tokens.push_back(tok);
        ++st.generated_tokens;
        const bool stop = std::find(s.req->stop_token_ids.begin(), s.req->stop_token_ids.end(), tok) !=
                          s.req->stop_token_ids.end();
        if (stop || int(s.result.tokens.size()) >= s.req->max_tokens) {
          s.done = true;
          s.result.finish_reason = stop ? "stop" : "length";
          s.blocks.release_all(cache.pool());
        }
      }
    }
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    (any_prefill ? st.prefill_seconds : st.decode_seconds) += dt;
    ++st.steps;
  }
  if (stats) *stats = st;
  std::vector<GenerationResult> out;
  for (SeqState& s : seqs) out.push_back(std::move(s.result));
  return out;
}

}  // namespace mla::runtime
