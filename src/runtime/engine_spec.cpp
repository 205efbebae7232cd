// The engine's speculative step (issue #8). A decoding sequence's chunk is its newest token plus
// the drafts proposed last step; every sampling chunk gets K+1 logits rows (rows past its drafts
// repeat its last row), so one verification call covers drafted, undrafted and prefill-finishing
// sequences alike (no drafts = plain sampling from the first row). Afterwards each sequence's cache
// is valid for the tokens it accepted: num_computed advances by those, the blocks past what the
// next step needs go back to the pool (the rollback), and the draft catches up and proposes.
#include <algorithm>
#include <chrono>
#include <limits>

#include "runtime/engine.h"

namespace mla::runtime {

void Engine::trim_blocks(Request& r, int tokens) {
  const size_t keep = size_t((tokens + config_.block_size - 1) / config_.block_size);
  while (r.blocks.size() > keep) {  // tail first, like release_blocks
    prefix_.release(r.blocks.back());
    r.blocks.pop_back();
  }
}

void Engine::forward_and_verify(const StepPlan& plan) {
  const int K = speculator_->num_draft_tokens();
  const int64_t K1 = K + 1;
  ids_.clear();
  positions_.clear();
  logits_rows_.clear();
  slices_.clear();
  std::vector<Request*> scheduled;
  std::vector<int> first_pos, row0s;
  std::vector<size_t> sampling;  // chunk indices that sample, in verification order
  for (size_t ci = 0; ci < plan.chunks.size(); ++ci) {
    const ScheduledChunk& c = plan.chunks[ci];
    Request& r = *find(c.id);
    scheduled.push_back(&r);
    const int row0 = int(ids_.size());
    const int plain = c.num_new_tokens - c.num_draft_tokens;  // tokens already known to be right
    MLA_CHECK(c.num_draft_tokens <= int(r.draft_tokens.size()), "request {}: {} drafts scheduled, {} proposed", r.id,
              c.num_draft_tokens, r.draft_tokens.size());
    for (int i = 0; i < plain; ++i) ids_.push_back(r.tokens[size_t(r.num_computed + i)]);
    for (int i = 0; i < c.num_draft_tokens; ++i) ids_.push_back(r.draft_tokens[size_t(i)]);
    for (int i = 0; i < c.num_new_tokens; ++i) positions_.push_back(r.num_computed + i);
    slices_.push_back({c.num_new_tokens, r.num_computed + c.num_new_tokens, r.blocks});
    first_pos.push_back(r.num_computed);
    row0s.push_back(row0);
    if (c.samples) {
      sampling.push_back(ci);
      const int last_plain = row0 + plain - 1;  // predicts the first draft (or the next token)
      for (int64_t i = 0; i < K1; ++i) logits_rows_.push_back(last_plain + int(std::min<int64_t>(i, c.num_draft_tokens)));
    }
  }
  const int64_t B = int64_t(sampling.size());
  if (logits_rows_.empty()) logits_rows_.push_back(int(ids_.size()) - 1);
  const TensorView logits = B > 0 ? speculator_->target_logits(B) : logits_buf_.view(DType::F32, {1, vocab_});
  // A step of decodes only (each the newest token plus its drafts) runs absorbed like plain decode:
  // verification chunks are decode-sized, and equal-length ones replay a decode graph.
  const bool decodes_only = std::all_of(plan.chunks.begin(), plan.chunks.end(), [&](const ScheduledChunk& c) {
    return c.num_new_tokens - c.num_draft_tokens == 1 && c.samples && c.num_new_tokens <= model::kMaxGraphQLen;
  });
  model_.set_mla_path(config_.mla_path == model::MlaPath::Auto && decodes_only ? model::MlaPath::Absorbed
                                                                                : config_.mla_path);
  model::ForwardInputs in{ids_, positions_, slices_, logits_rows_, cache_layers_, config_.block_size};
  in.feature_layers = speculator_->feature_layers();
  if (!in.feature_layers.empty()) in.features = speculator_->features(int64_t(ids_.size()));
  const auto t0 = std::chrono::steady_clock::now();
  model_.forward(in, logits);
  ++stat_steps_;

  // Chunks that do not sample computed all their rows.
  for (size_t ci = 0; ci < plan.chunks.size(); ++ci) {
    if (plan.chunks[ci].samples) continue;
    scheduled[ci]->num_computed += plan.chunks[ci].num_new_tokens;
    register_full_blocks(*scheduled[ci]);
  }
  if (B > 0) {
    // min_tokens: EOS and stop tokens cannot be emitted yet, at any row that would emit before it.
    const float neg_inf = -std::numeric_limits<float>::infinity();
    bool any_logprobs = false;
    for (int64_t b = 0; b < B; ++b) {
      const Request& r = *scheduled[sampling[size_t(b)]];
      any_logprobs |= r.params.logprobs.has_value();
    }
    if (any_logprobs) {  // raw logits, before the mask
      host_logits_.resize(size_t(B * K1) * size_t(vocab_));
      backend_.copy_to_host(host_logits_.data(), logits);
    }
    for (int64_t b = 0; b < B; ++b) {
      const Request& r = *scheduled[sampling[size_t(b)]];
      for (int64_t i = 0; i < K1 && r.num_output() + i < r.params.min_tokens; ++i) {
        const TensorView row = logits.slice(0, b * K1 + i, 1);
        for (const std::vector<int32_t>* ids : {&config_.eos_token_ids, &r.params.stop_token_ids})
          for (int32_t t : *ids) backend_.copy_from_host(row.slice(1, t, 1), &neg_inf);
      }
    }
    std::vector<spec::VerifySeq> vs;
    for (int64_t b = 0; b < B; ++b) {
      const ScheduledChunk& c = plan.chunks[sampling[size_t(b)]];
      Request& r = *scheduled[sampling[size_t(b)]];
      spec::VerifySeq v;
      v.params = &r.params.sampling;
      v.rng = &r.rng;
      v.drafts = std::span<const int32_t>(r.draft_tokens).first(size_t(c.num_draft_tokens));
      v.q_row = c.num_draft_tokens > 0 ? r.draft_q_row : -1;
      vs.push_back(v);
    }
    std::vector<std::vector<int32_t>> emitted;
    speculator_->verify(vs, emitted);
    step_forward_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (int64_t b = 0; b < B; ++b) {
      const ScheduledChunk& c = plan.chunks[sampling[size_t(b)]];
      Request& r = *scheduled[sampling[size_t(b)]];
      const std::vector<int32_t>& e = emitted[size_t(b)];
      const int accepted = int(e.size()) - 1;
      r.draft_tokens.clear();
      r.draft_q_row = -1;
      const bool want_lp = r.params.logprobs.has_value();
      for (size_t i = 0; i < e.size(); ++i) {
        const float* lp_row = want_lp ? host_logits_.data() + (size_t(b * K1) + i) * size_t(vocab_) : nullptr;
        emit_token(r, e[i], lp_row, want_lp);
        if (r.status == RequestStatus::Finished) break;  // its blocks are released: nothing to advance
      }
      // After emitting: the accepted drafts are now in r.tokens, which block hashing reads.
      if (r.status != RequestStatus::Finished) {
        r.num_computed += c.num_new_tokens - c.num_draft_tokens + accepted;
        register_full_blocks(r);
      }
    }
  }
  if (B == 0) {
    backend_.synchronize();
    step_forward_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  const auto t1 = std::chrono::steady_clock::now();
  propose_drafts(plan, first_pos, row0s);  // drafting is device work too (ids come back to the host)
  step_forward_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
}

void Engine::propose_drafts(const StepPlan& plan, std::span<const int> first_pos, std::span<const int> row0) {
  const int K = speculator_->num_draft_tokens();
  // Stale proposals (sequences not scheduled this step) are dropped: the new proposal reuses rows.
  for (Request* r : running_) {
    r->draft_tokens.clear();
    r->draft_q_row = -1;
  }
  std::unordered_map<uint64_t, size_t> chunk_of;
  for (size_t ci = 0; ci < plan.chunks.size(); ++ci) chunk_of.emplace(plan.chunks[ci].id, ci);
  std::vector<spec::DraftSeq> seqs;
  std::vector<Request*> owners;
  // Running order (oldest first) is the order the scheduler serves decodes in, which keeps the
  // proposal rows increasing along the next verification (Speculator::gather_draft_probs).
  for (Request* r : running_) {
    const auto it = chunk_of.find(r->id);
    if (it == chunk_of.end()) continue;
    const size_t ci = it->second;
    // Roll back: keep the blocks for the computed tokens plus the newest one.
    trim_blocks(*r, r->num_tokens());
    spec::DraftSeq d;
    d.tokens = r->tokens;
    d.first_pos = first_pos[ci];
    d.valid_end = r->num_computed;
    d.target_row0 = row0[ci];
    d.params = &r->params.sampling;
    d.rng = &r->rng;
    const bool decodes_next = r->num_tokens() - r->num_computed == 1;
    const int room = r->params.max_tokens - r->num_output() - 1;  // drafts that could still be emitted
    if (decodes_next && room > 0 && r->num_tokens() + K <= max_model_len_) {
      // Lookahead: blocks for the next step's K+1 rows (the draft writes inside them too).
      const size_t need = size_t((r->num_tokens() + K + config_.block_size - 1) / config_.block_size);
      if (need - std::min(need, r->blocks.size()) <= size_t(prefix_.num_available())) {
        while (r->blocks.size() < need) {
          const std::optional<int32_t> blk = prefix_.allocate();
          MLA_CHECK(blk.has_value(), "KV pool lost blocks it reported available");
          r->blocks.push_back(*blk);
        }
        d.num_drafts = std::min(K, room);
      }
    }
    d.block_table = r->blocks;
    seqs.push_back(d);
    owners.push_back(r);
  }
  if (seqs.empty()) return;
  std::vector<std::vector<int32_t>> drafts;
  std::vector<int> q_rows;
  speculator_->propose(seqs, drafts, q_rows);
  for (size_t i = 0; i < owners.size(); ++i) {
    owners[i]->draft_tokens = std::move(drafts[i]);
    owners[i]->draft_q_row = q_rows[i];
  }
}

}  // namespace mla::runtime
