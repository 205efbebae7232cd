// What a speculative proposer needs from a draft, whatever its kind (issue #8): a plain draft model
// (a smaller DeepseekV3 on the same vocabulary), an EAGLE-3 head or DeepSeek MTP (NextN). Each is a
// small model with its own paged cache that SHARES the target's block ids: draft cache layer l is
// [num_blocks, block_size, cache_row_width()] over the same blocks, so the target's block table
// addresses both and rolling back the target's blocks rolls back the draft's (nothing to leak).
//
// Row pairing. A plain draft reads token t at position t. Feature-fed drafts (MTP, EAGLE-3) pair
// token t+1 with the target's feature of position t and store that pair at cache position t (the
// feature's index), so they run one position behind the target. The engine tracks that lag.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/tensor.h"
#include "model/deepseek_v3.h"

namespace mla::spec {

enum class DraftKind : uint8_t { Draft, Eagle3, Mtp };

// Target features a draft consumes: the residual stream leaving each listed target layer, for every
// token row of the target step, concatenated in list order. kFinalNormed names the final hidden state
// after the model's last norm (MTP's h).
inline constexpr int kFinalNormed = model::kFinalNormedFeature;

struct DraftForwardInputs {
  // Token rows, positions, per-sequence slices into the draft's cache (block tables = the target's),
  // logits rows; kv_cache = the draft's own cache layers.
  model::ForwardInputs base;
  // Feature-fed drafts only (empty for a plain draft). F32 [T, hidden_in_width] backend memory:
  // when hidden_from_target, row t is the target feature for token row t's pairing (width
  // target_feature_width()); otherwise it is the draft's own previous output (width hidden_width()).
  TensorView hidden_in;
  bool hidden_from_target = true;
  // When non-empty: F32 [T, hidden_width()] receives each row's draft output (pre-norm), the next
  // chained step's hidden_in.
  TensorView hidden_out;
};

// The MLA formulation a DeepseekV3-based draft (plain draft, MTP block) runs a step with. Draft
// chunks are short after the first round (catch-up: a sequence's accepted tokens plus its newest;
// chained steps: one token), and absorbed steps of equal short chunks replay decode graphs, so such
// steps run absorbed. The target's Auto rule (absorbed only for single-token decodes, so prompt
// logits stay batch-invariant) does not matter here: draft logits steer acceptance, never the
// output. Long catch-ups (a prompt) keep Auto, i.e. naive. A path other than Auto set on the draft
// (tests comparing formulations) is used as is.
inline model::MlaPath draft_mla_path(model::MlaPath configured, const model::ForwardInputs& in) {
  if (configured != model::MlaPath::Auto) return configured;
  for (const model::SequenceSlice& s : in.seqs)
    if (s.q_len > model::kMaxGraphQLen) return model::MlaPath::Auto;
  return model::MlaPath::Absorbed;
}

class DraftModel {
 public:
  virtual ~DraftModel() = default;
  virtual DraftKind kind() const = 0;
  virtual int num_cache_layers() const = 0;
  virtual int64_t cache_row_width() const = 0;  // values per token per cache layer
  // Target layers whose output features this draft reads (empty for a plain draft).
  virtual std::vector<int> target_feature_layers() const = 0;
  virtual int64_t target_feature_width() const = 0;  // sum of the listed features' widths (0: none)
  virtual int64_t hidden_width() const = 0;          // width of hidden_out (0 for a plain draft)
  // Runs one step and writes F32 logits over the TARGET vocabulary [logits_rows, target_vocab]
  // (tokens a reduced-vocabulary draft cannot propose get -inf).
  virtual void forward(const DraftForwardInputs& in, const TensorView& logits) = 0;
  // Drops captured graphs (they point into the buffers of the speculator that ran them).
  virtual void clear_graphs() {}
};

}  // namespace mla::spec
