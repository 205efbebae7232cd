// The inputs of one forward step in backend memory, shared by every model written against
// ops::Backend (DeepseekV3, the EAGLE-3 head): token ids, positions, the attention batch (rows per
// sequence, block tables, the cache slot of each new token) and the logits rows. One definition of
// how a step is checked and staged, so the two models cannot disagree about the batch layout.
#pragma once

#include <string_view>
#include <vector>

#include "model/deepseek_v3.h"

namespace mla::model {

// Puts the step's token ids into `dst` (I32 [T] backend memory): from in.token_ids_device when set
// (a copy on the backend's stream), else uploaded from in.token_ids.
void stage_token_ids(ops::Backend& backend, const ForwardInputs& in, const TensorView& dst, std::string_view who);

struct StepInputs {
  TensorView ids, positions, q_indptr, kv_lens, block_indptr, block_ids, slots, logits_rows;  // I32
  // Host staging for the same (and the host mirrors the attention ops plan with).
  std::vector<int32_t> h_q_indptr, h_kv_lens, h_block_indptr, h_block_ids, h_slots;
  // The current step's batch: views of the buffers above, refreshed by stage(). Captured graphs refer
  // to this object, so a backend whose replay re-runs the ops (CPU) sees the current mirrors.
  ops::AttentionBatch batch;

  // Sized by `limits`; the buffers are appended to `owned`.
  void allocate(ops::Backend& backend, const ModelLimits& limits, std::vector<Buffer>& owned);
  // Checks `in` against `limits` (token and sequence counts, positions matching the slices, block
  // tables covering kv_len, block-table entries, logits rows inside the step; rows may repeat) and
  // uploads it. Errors (MLA_CHECK) start with `who`.
  void stage(ops::Backend& backend, const ForwardInputs& in, const ModelLimits& limits, std::string_view who);
};

}  // namespace mla::model
