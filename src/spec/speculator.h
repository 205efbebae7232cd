// The speculative-decoding mechanics the serving engine drives (issue #8), independent of request
// bookkeeping: the draft's cache, drafting k tokens per sequence, and lossless verification of the
// target's k+1 logits rows per sequence through the backend's `speculative_verify`.
//
// One engine step with speculation: the target runs every scheduled chunk (a decoding sequence's
// chunk is its last token plus its drafts), `verify` turns each sampling sequence's K+1 logits rows
// into the emitted tokens, then `propose` runs the draft over what the target just made valid
// ("catch-up"), plus K-1 chained one-token steps, for the sequences that decode next. Drafting after
// the target means feature-fed drafts (MTP, EAGLE-3) read this step's target features directly.
//
// Invariants: the draft's cache entries are valid exactly where the target's are (catch-up covers
// every position the target validated this step), so prefix-cached blocks carry valid draft entries
// and rolling back the target's blocks rolls back the draft's. Draft rows write only positions
// below num_tokens + K, which the engine's lookahead blocks cover before `propose` runs.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ops/backend.h"
#include "runtime/kv_cache.h"
#include "runtime/sampler.h"
#include "spec/draft_model.h"

namespace mla::spec {

struct SpeculatorConfig {
  int num_draft_tokens = 0;    // K >= 1
  int max_seqs = 0;            // sequences per step (the engine's max_num_seqs)
  int max_target_tokens = 0;   // target rows per step (the engine's token budget)
  int vocab = 0;               // target vocabulary
  int num_blocks = 0;          // the target cache's blocks (shared ids)
  int block_size = 0;
  DType cache_dtype = DType::F32;
};

// Acceptance counters since creation (Prometheus counters; vLLM's spec_decode_* names).
struct SpecStats {
  int64_t num_drafts = 0;           // verification rounds with at least one draft token
  int64_t num_draft_tokens = 0;     // draft tokens verified
  int64_t num_accepted_tokens = 0;  // of those, accepted
  std::vector<int64_t> accepted_per_pos;  // [K]: rounds whose draft at position i was accepted
};

// A sequence that samples this step: its K+1 logits rows are rows [b*(K+1), (b+1)*(K+1)) of the
// verification logits (rows past its drafts repeat its last real row).
struct VerifySeq {
  const runtime::SamplingParams* params = nullptr;
  runtime::RequestRng* rng = nullptr;
  std::span<const int32_t> drafts;  // <= K draft tokens proposed for it (empty: plain sampling)
  int q_row = -1;                   // row of its draft distributions in the last proposal (-1: none)
};

// A sequence the target computed this step. Positions [first_pos, valid_end) are now valid in the
// target's cache; tokens holds prompt + output, including the token(s) emitted this step.
struct DraftSeq {
  std::span<const int32_t> tokens;
  int first_pos = 0;
  int valid_end = 0;
  int target_row0 = 0;       // its first row in this step's target rows (features)
  std::span<const int32_t> block_table;
  int num_drafts = 0;        // drafts to propose (0: catch-up only); blocks cover tokens.size() + K
  const runtime::SamplingParams* params = nullptr;
  runtime::RequestRng* rng = nullptr;
};

class Speculator {
 public:
  Speculator(ops::Backend& backend, DraftModel& draft, const SpeculatorConfig& config);
  int num_draft_tokens() const { return k_; }
  const DraftModel& draft() const { return draft_; }
  // Target layers to capture during the target step, and where (rows = target token rows).
  const std::vector<int>& feature_layers() const { return feature_layers_; }
  TensorView features(int64_t rows) const;
  // Logits buffer for the target's verification rows: [B*(K+1), vocab].
  TensorView target_logits(int64_t num_seqs) const;

  // Verifies (or plainly samples, for sequences without drafts) every sequence in `seqs` from
  // target_logits(seqs.size()); the min_tokens mask must already be applied to those logits.
  // Writes the emitted tokens of sequence b to emitted[b] (accepted drafts, then one more).
  void verify(std::span<const VerifySeq> seqs, std::vector<std::vector<int32_t>>& emitted);

  // Catch-up plus drafting (see the file comment). drafts[i] receives seqs[i]'s proposal;
  // q_rows[i] its row for the next verify (-1 without drafts).
  void propose(std::span<const DraftSeq> seqs, std::vector<std::vector<int32_t>>& drafts, std::vector<int>& q_rows);

  const SpecStats& stats() const { return stats_; }
  // Drops the draft's decode graphs (they point into this object's buffers).
  ~Speculator();

 private:
  TensorView make(DType t, std::initializer_list<int64_t> dims);
  // Moves each verified sequence's draft distributions from its proposal row to its batch row.
  void gather_draft_probs(std::span<const VerifySeq> seqs);
  // Draws draft token `step` for every proposer from draft_logits_ rows [0, P), appending to out.
  void draw_drafts(int64_t P, int step, std::span<const DraftSeq* const> proposers,
                   std::vector<std::vector<int32_t>>& out);
  // The same draw for a batch whose proposers all draw alike (all greedy or all sampled, uniforms
  // already uploaded step-major), into `ids` [P] on the device.
  void draw_drafts_device(int64_t P, int step, const TensorView& ids);

  ops::Backend& backend_;
  DraftModel& draft_;
  const int k_, max_seqs_, vocab_;
  std::vector<int> feature_layers_;
  std::vector<Buffer> owned_;
  runtime::KvCache draft_cache_;  // storage only: block ids are the target's
  std::vector<TensorView> draft_layers_;
  runtime::ProbsFilter filter_;   // rows: max_seqs * (K+1)
  int64_t max_catchup_rows_ = 0;
  TensorView features_, hidden_in_, hidden_out_, hidden_chain_[2];
  TensorView target_logits_, target_probs_, draft_probs_, draft_logits_;  // [S*(K+1),V] [S,K+1,V] [S,K,V] [S,V]
  TensorView uniforms_, draft_ids_, num_drafts_, out_ids_, out_emitted_, argmax_;
  TensorView chain_ids_;  // I32 [K * P]: step-major drafted ids of the device chain
  SpecStats stats_;
  // Host scratch.
  std::vector<const runtime::SamplingParams*> row_params_;
  std::vector<float> h_uniforms_;
  std::vector<int32_t> h_ids_, h_num_drafts_, h_out_ids_, h_out_emitted_, h_argmax_, h_chain_;
  std::vector<int32_t> d_tokens_, d_positions_, d_logits_rows_, last_rows_;
  std::vector<model::SequenceSlice> d_slices_;
  std::vector<const DraftSeq*> proposers_;
};

}  // namespace mla::spec
