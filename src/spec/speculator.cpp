// Speculator: draft cache, catch-up + chained drafting, and verification (see speculator.h).
// Cost per round for B sequences and K drafts: one draft forward over the catch-up rows, K-1 draft
// forwards of B rows, K sampling passes over [B, V], one filter pass over the target's B*(K+1)
// rows and one verification kernel; host traffic is O(B*K) ids, never a vocabulary row, read once
// per proposal (per draft step when greedy and sampled sequences share a batch).
#include "spec/speculator.h"

#include <algorithm>

#include "core/status.h"

namespace mla::spec {

namespace {

// Rows [0, rows) of a [*, cols] matrix whose rows are `row_stride` elements apart.
TensorView strided_rows(void* data, DType dtype, int64_t rows, int64_t cols, int64_t row_stride) {
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.ndim = 2;
  v.shape = {rows, cols, 1, 1};
  v.stride = {row_stride, 1, 1, 1};
  return v;
}

runtime::KvCacheConfig draft_cache_config(const DraftModel& draft, const SpeculatorConfig& c) {
  runtime::KvCacheConfig kc;
  kc.num_layers = draft.num_cache_layers();
  kc.num_blocks = c.num_blocks;
  kc.block_size = c.block_size;
  kc.kv_dim = int(draft.cache_row_width());
  kc.dtype = c.cache_dtype;
  return kc;
}

}  // namespace

TensorView Speculator::make(DType t, std::initializer_list<int64_t> dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  owned_.push_back(backend_.alloc(size_t(std::max<int64_t>(n, 1)) * dtype_size(t)));
  return owned_.back().view(t, dims);
}

Speculator::Speculator(ops::Backend& backend, DraftModel& draft, const SpeculatorConfig& config)
    : backend_(backend),
      draft_(draft),
      k_(config.num_draft_tokens),
      max_seqs_(config.max_seqs),
      vocab_(config.vocab),
      feature_layers_(draft.target_feature_layers()),
      draft_cache_(backend, draft_cache_config(draft, config)),
      filter_(backend, config.max_seqs * (config.num_draft_tokens + 1)) {
  MLA_CHECK(k_ >= 1 && max_seqs_ >= 1 && vocab_ >= 1 && config.max_target_tokens >= 1,
            "speculator: bad config (K {}, max_seqs {}, vocab {})", k_, max_seqs_, vocab_);
  draft.clear_graphs();  // graphs of an earlier speculator point into freed buffers
  for (int l = 0; l < draft.num_cache_layers(); ++l) draft_layers_.push_back(draft_cache_.layer(l));
  const int64_t S = max_seqs_, K = k_, V = vocab_;
  // Catch-up rows: every target row of a step, plus (plain drafts) each sequence's newest token.
  max_catchup_rows_ = int64_t(config.max_target_tokens) + S;
  const int64_t W = draft.target_feature_width(), Hd = draft.hidden_width();
  if (W > 0) {
    features_ = make(DType::F32, {config.max_target_tokens, W});
    hidden_in_ = make(DType::F32, {max_catchup_rows_, W});
  }
  if (Hd > 0) {
    hidden_out_ = make(DType::F32, {max_catchup_rows_, Hd});
    hidden_chain_[0] = make(DType::F32, {S, Hd});
    hidden_chain_[1] = make(DType::F32, {S, Hd});
  }
  target_logits_ = make(DType::F32, {S * (K + 1), V});
  target_probs_ = make(DType::F32, {S, K + 1, V});
  draft_probs_ = make(DType::F32, {S, K, V});
  draft_logits_ = make(DType::F32, {S, V});
  uniforms_ = make(DType::F32, {S, K + 1});
  draft_ids_ = make(DType::I32, {S, K});
  num_drafts_ = make(DType::I32, {S});
  out_ids_ = make(DType::I32, {S, K + 1});
  out_emitted_ = make(DType::I32, {S});
  argmax_ = make(DType::I32, {S * (K + 1)});
  chain_ids_ = make(DType::I32, {K * S});
  stats_.accepted_per_pos.assign(size_t(k_), 0);
}

Speculator::~Speculator() { draft_.clear_graphs(); }

TensorView Speculator::features(int64_t rows) const {
  return features_.data ? features_.slice(0, 0, rows) : TensorView{};
}

TensorView Speculator::target_logits(int64_t num_seqs) const { return target_logits_.slice(0, 0, num_seqs * (k_ + 1)); }

// ---- verification -----------------------------------------------------------------------------

void Speculator::gather_draft_probs(std::span<const VerifySeq> seqs) {
  // Row b of the verification reads proposal row q_row(b). Proposals were made in running order
  // and verification keeps that order, so q_row is increasing over the rows that have one: move
  // rows that go up (q_row > b) ascending, then rows that go down descending, and no source is
  // overwritten before it is read (the memmove argument, per row).
  const auto move_row = [&](int64_t from, int64_t to) {
    backend_.copy(draft_probs_.slice(0, from, 1), draft_probs_.slice(0, to, 1));
  };
  const int64_t B = int64_t(seqs.size());
  for (int64_t b = 0; b < B; ++b)
    if (!seqs[size_t(b)].drafts.empty() && seqs[size_t(b)].q_row > b) move_row(seqs[size_t(b)].q_row, b);
  for (int64_t b = B - 1; b >= 0; --b)
    if (!seqs[size_t(b)].drafts.empty() && seqs[size_t(b)].q_row < b) move_row(seqs[size_t(b)].q_row, b);
}

void Speculator::verify(std::span<const VerifySeq> seqs, std::vector<std::vector<int32_t>>& emitted) {
  const int64_t B = int64_t(seqs.size()), K1 = k_ + 1, R = B * K1;
  MLA_CHECK(B >= 1 && B <= max_seqs_, "speculator: {} sequences to verify (max {})", B, max_seqs_);
  int last_q = -1;
  for (const VerifySeq& s : seqs) {
    MLA_CHECK(int(s.drafts.size()) <= k_, "speculator: {} drafts (K = {})", s.drafts.size(), k_);
    if (s.drafts.empty()) continue;
    MLA_CHECK(s.q_row > last_q && s.q_row < max_seqs_, "speculator: draft rows out of order ({} after {})", s.q_row,
              last_q);
    last_q = s.q_row;
  }
  const TensorView logits = target_logits(B);
  bool any_sampled = false, any_greedy = false;
  for (const VerifySeq& s : seqs) (s.params->greedy() ? any_greedy : any_sampled) = true;

  if (any_sampled) {
    row_params_.clear();
    for (const VerifySeq& s : seqs)
      for (int64_t i = 0; i < K1; ++i) row_params_.push_back(s.params);
    const TensorView probs = target_probs_.slice(0, 0, B);
    filter_.run(logits, row_params_, probs.reshape({R, vocab_}));
    gather_draft_probs(seqs);
    h_ids_.assign(size_t(B * k_), 0);
    h_num_drafts_.assign(size_t(B), 0);
    h_uniforms_.assign(size_t(R), 0.0f);
    for (int64_t b = 0; b < B; ++b) {
      const VerifySeq& s = seqs[size_t(b)];
      if (s.params->greedy()) continue;  // its row is decided from the argmax below
      h_num_drafts_[size_t(b)] = int32_t(s.drafts.size());
      std::copy(s.drafts.begin(), s.drafts.end(), h_ids_.begin() + b * k_);
      // K+1 draws per round whatever the draft count, so a request's stream stays in step.
      for (int64_t i = 0; i < K1; ++i) h_uniforms_[size_t(b * K1 + i)] = s.rng->uniform();
    }
    const TensorView ids = draft_ids_.slice(0, 0, B), nd = num_drafts_.slice(0, 0, B);
    const TensorView u = uniforms_.slice(0, 0, B), out = out_ids_.slice(0, 0, B), em = out_emitted_.slice(0, 0, B);
    backend_.copy_from_host(ids, h_ids_.data());
    backend_.copy_from_host(nd, h_num_drafts_.data());
    backend_.copy_from_host(u, h_uniforms_.data());
    backend_.speculative_verify(draft_probs_.slice(0, 0, B), ids, nd, probs, u, out, em);
    h_out_ids_.resize(size_t(R));
    h_out_emitted_.resize(size_t(B));
    backend_.copy_to_host(h_out_ids_.data(), out);
    backend_.copy_to_host(h_out_emitted_.data(), em);
  }
  if (any_greedy) {
    const TensorView am = argmax_.slice(0, 0, R);
    backend_.argmax(logits, am);
    h_argmax_.resize(size_t(R));
    backend_.copy_to_host(h_argmax_.data(), am);
  }

  emitted.resize(size_t(B));
  for (int64_t b = 0; b < B; ++b) {
    const VerifySeq& s = seqs[size_t(b)];
    std::vector<int32_t>& e = emitted[size_t(b)];
    e.clear();
    const int n = int(s.drafts.size());
    if (s.params->greedy()) {
      // Greedy verification: accept while the draft equals the target's argmax, then emit the
      // argmax at the first mismatch (or the bonus after the last draft).
      const int32_t* a = h_argmax_.data() + b * K1;
      int m = 0;
      while (m < n && s.drafts[size_t(m)] == a[m]) ++m;
      e.assign(s.drafts.begin(), s.drafts.begin() + m);
      e.push_back(a[m]);
    } else {
      const int32_t count = h_out_emitted_[size_t(b)];
      MLA_CHECK(count >= 1 && count <= n + 1, "speculative_verify emitted {} tokens for {} drafts", count, n);
      e.assign(h_out_ids_.begin() + b * K1, h_out_ids_.begin() + b * K1 + count);
    }
    if (n > 0) {
      const int accepted = int(e.size()) - 1;
      ++stats_.num_drafts;
      stats_.num_draft_tokens += n;
      stats_.num_accepted_tokens += accepted;
      for (int i = 0; i < accepted; ++i) ++stats_.accepted_per_pos[size_t(i)];
    }
  }
}

// ---- drafting ---------------------------------------------------------------------------------

void Speculator::draw_drafts(int64_t P, int step, std::span<const DraftSeq* const> proposers,
                             std::vector<std::vector<int32_t>>& out) {
  // Row p of draft_logits_ belongs to proposers[p]. Greedy rows take the argmax; sampled rows draw
  // from q = filtered(draft logits), which is kept as draft_probs_[p, step] for verification.
  const TensorView logits = draft_logits_.slice(0, 0, P);
  bool any_sampled = false, any_greedy = false;
  for (const DraftSeq* s : proposers) (s->params->greedy() ? any_greedy : any_sampled) = true;
  const TensorView ids = out_emitted_.slice(0, 0, P);  // [P] I32 scratch (verification is done)
  std::vector<int32_t>& h = h_out_emitted_;
  h.assign(size_t(P), 0);
  if (any_greedy) {
    backend_.argmax(logits, ids);
    backend_.copy_to_host(h.data(), ids);
  }
  if (any_sampled) {
    const int64_t KV = int64_t(k_) * vocab_;
    const TensorView q = strided_rows(draft_probs_.as<float>() + int64_t(step) * vocab_, DType::F32, P, vocab_, KV);
    row_params_.clear();
    for (const DraftSeq* s : proposers) row_params_.push_back(s->params);
    filter_.run(logits, row_params_, q);
    h_uniforms_.assign(size_t(P), 0.0f);
    for (int64_t p = 0; p < P; ++p)
      if (!proposers[size_t(p)]->params->greedy()) h_uniforms_[size_t(p)] = proposers[size_t(p)]->rng->uniform();
    const TensorView uf = uniforms_.reshape({int64_t(max_seqs_) * (k_ + 1)}).slice(0, 0, P);
    backend_.copy_from_host(uf, h_uniforms_.data());
    const TensorView sids = argmax_.slice(0, 0, P);
    backend_.sample_from_probs(q, uf, sids);
    h_argmax_.resize(size_t(P));
    backend_.copy_to_host(h_argmax_.data(), sids);
    for (int64_t p = 0; p < P; ++p)
      if (!proposers[size_t(p)]->params->greedy()) h[size_t(p)] = h_argmax_[size_t(p)];
  }
  for (int64_t p = 0; p < P; ++p) out[size_t(p)].push_back(h[size_t(p)]);
}

void Speculator::draw_drafts_device(int64_t P, int step, const TensorView& ids) {
  const TensorView logits = draft_logits_.slice(0, 0, P);
  if (proposers_.front()->params->greedy()) {
    backend_.argmax(logits, ids);
    return;
  }
  const int64_t KV = int64_t(k_) * vocab_;
  const TensorView q = strided_rows(draft_probs_.as<float>() + int64_t(step) * vocab_, DType::F32, P, vocab_, KV);
  row_params_.clear();
  for (const DraftSeq* s : proposers_) row_params_.push_back(s->params);
  filter_.run(logits, row_params_, q);
  const TensorView u = uniforms_.reshape({int64_t(max_seqs_) * (k_ + 1)}).slice(0, int64_t(step) * P, P);
  backend_.sample_from_probs(q, u, ids);
}

void Speculator::propose(std::span<const DraftSeq> seqs, std::vector<std::vector<int32_t>>& drafts,
                         std::vector<int>& q_rows) {
  const bool fed = draft_.target_feature_width() > 0;
  drafts.assign(seqs.size(), {});
  q_rows.assign(seqs.size(), -1);
  d_tokens_.clear();
  d_positions_.clear();
  d_logits_rows_.clear();
  d_slices_.clear();
  proposers_.clear();
  last_rows_.clear();
  int64_t row = 0;
  for (const DraftSeq& s : seqs) {
    MLA_CHECK(s.first_pos < s.valid_end && s.valid_end <= int(s.tokens.size()),
              "speculator: catch-up [{}, {}) of {} tokens", s.first_pos, s.valid_end, s.tokens.size());
    const bool proposes = s.num_drafts > 0;
    MLA_CHECK(!proposes || s.valid_end + 1 == int(s.tokens.size()),
              "speculator: a proposing sequence must have exactly its newest token uncomputed");
    // Plain draft: token p at position p over [first_pos, end) (+ the newest token when drafting).
    // Fed draft: the pair (token j+1, feature j) at position j over [first_pos, valid_end).
    const int end = fed ? s.valid_end : s.valid_end + (proposes ? 1 : 0);
    if (fed) MLA_CHECK(s.valid_end < int(s.tokens.size()), "speculator: token after position {} unknown", s.valid_end - 1);
    const int64_t row0 = row;
    for (int p = s.first_pos; p < end; ++p) {
      d_tokens_.push_back(s.tokens[size_t(fed ? p + 1 : p)]);
      d_positions_.push_back(p);
      ++row;
    }
    MLA_CHECK(row <= max_catchup_rows_, "speculator: {} catch-up rows exceed {}", row, max_catchup_rows_);
    if (fed) {
      backend_.copy(features_.slice(0, s.target_row0, end - s.first_pos), hidden_in_.slice(0, row0, end - s.first_pos));
    }
    d_slices_.push_back({end - s.first_pos, end, s.block_table});
    if (proposes) {
      MLA_CHECK(s.num_drafts <= k_, "speculator: {} drafts asked (K = {})", s.num_drafts, k_);
      q_rows[size_t(&s - seqs.data())] = int(proposers_.size());
      proposers_.push_back(&s);
      last_rows_.push_back(int32_t(row - 1));
      d_logits_rows_.push_back(int32_t(row - 1));
    }
  }
  if (row == 0) return;
  const int64_t P = int64_t(proposers_.size());
  MLA_CHECK(P <= max_seqs_, "speculator: {} proposing sequences (max {})", P, max_seqs_);
  if (d_logits_rows_.empty()) d_logits_rows_.push_back(int32_t(row - 1));  // a forward yields >= 1 row

  DraftForwardInputs in;
  in.base = model::ForwardInputs{d_tokens_, d_positions_, d_slices_, d_logits_rows_, draft_layers_, draft_cache_.block_size()};
  if (fed) {
    in.hidden_in = hidden_in_.slice(0, 0, row);
    in.hidden_from_target = true;
  }
  if (hidden_out_.data) in.hidden_out = hidden_out_.slice(0, 0, row);
  draft_.forward(in, draft_logits_.slice(0, 0, int64_t(d_logits_rows_.size())));
  if (P == 0) return;

  // Drafts stay on the device when every proposer draws the same way (all greedy or all sampled):
  // step s's ids land in row s of chain_ids_ [K, P] and are the next step's token ids, so the K
  // steps queue back to back with one read of all K x P ids at the end. A mixed batch draws on the
  // host per step (same draws, one round trip per step).
  bool any_sampled = false, any_greedy = false;
  for (const DraftSeq* s : proposers_) (s->params->greedy() ? any_greedy : any_sampled) = true;
  const bool on_device = !(any_sampled && any_greedy);
  std::vector<std::vector<int32_t>> proposed(static_cast<size_t>(P));
  const auto chain_row = [&](int step) { return chain_ids_.slice(0, int64_t(step) * P, P); };
  if (on_device && any_sampled) {
    // Every uniform of the round up front, per proposer in step order: each request's generator
    // yields the same sequence as drawing step by step.
    h_uniforms_.assign(size_t(k_ * P), 0.0f);
    for (int64_t p = 0; p < P; ++p)
      for (int step = 0; step < k_; ++step) h_uniforms_[size_t(step * P + p)] = proposers_[size_t(p)]->rng->uniform();
    backend_.copy_from_host(uniforms_.reshape({int64_t(max_seqs_) * (k_ + 1)}).slice(0, 0, k_ * P), h_uniforms_.data());
  }
  const auto draw = [&](int step) {
    if (on_device)
      draw_drafts_device(P, step, chain_row(step));
    else
      draw_drafts(P, step, proposers_, proposed);
  };
  draw(0);
  // Chained steps: each proposer feeds its newest draft at the next position. Every proposer runs
  // K-1 steps (blocks cover tokens + K, checked by the engine); extra drafts past num_drafts are
  // dropped, which keeps the batch shape fixed for the draft's decode graphs.
  int cur = 0;
  if (hidden_out_.data)
    for (int64_t p = 0; p < P; ++p)
      backend_.copy(hidden_out_.slice(0, last_rows_[size_t(p)], 1), hidden_chain_[0].slice(0, p, 1));
  for (int step = 1; step < k_; ++step) {
    d_tokens_.clear();
    d_positions_.clear();
    d_logits_rows_.clear();
    d_slices_.clear();
    for (int64_t p = 0; p < P; ++p) {
      const DraftSeq& s = *proposers_[size_t(p)];
      const int pos = (fed ? s.valid_end - 1 : s.valid_end) + step;
      d_tokens_.push_back(on_device ? 0 : proposed[size_t(p)].back());  // on the device: row step-1
      d_positions_.push_back(pos);
      d_logits_rows_.push_back(int32_t(p));
      d_slices_.push_back({1, pos + 1, s.block_table});
    }
    in.base = model::ForwardInputs{d_tokens_, d_positions_, d_slices_, d_logits_rows_, draft_layers_,
                                   draft_cache_.block_size()};
    if (on_device) in.base.token_ids_device = chain_row(step - 1);
    if (hidden_out_.data) {
      in.hidden_in = hidden_chain_[cur].slice(0, 0, P);
      in.hidden_from_target = false;
      in.hidden_out = hidden_chain_[1 - cur].slice(0, 0, P);
      cur = 1 - cur;
    } else {
      in.hidden_in = TensorView{};
    }
    draft_.forward(in, draft_logits_.slice(0, 0, P));
    draw(step);
  }
  if (on_device) {
    h_chain_.resize(size_t(k_ * P));
    backend_.copy_to_host(h_chain_.data(), chain_ids_.slice(0, 0, k_ * P));
    for (int64_t p = 0; p < P; ++p)
      for (int step = 0; step < k_; ++step) proposed[size_t(p)].push_back(h_chain_[size_t(step * P + p)]);
  }
  for (int64_t p = 0; p < P; ++p) {
    const DraftSeq& s = *proposers_[size_t(p)];
    proposed[size_t(p)].resize(size_t(s.num_drafts));
    drafts[size_t(&s - seqs.data())] = std::move(proposed[size_t(p)]);
  }
}

}  // namespace mla::spec
