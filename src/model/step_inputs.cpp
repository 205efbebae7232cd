// Checking and staging one step's inputs (see step_inputs.h). O(T + block entries) host work.
#include "model/step_inputs.h"

namespace mla::model {

void stage_token_ids(ops::Backend& backend, const ForwardInputs& in, const TensorView& dst, std::string_view who) {
  const int64_t T = int64_t(in.token_ids.size());
  MLA_CHECK(dst.dtype == DType::I32 && dst.ndim == 1 && dst.dim(0) == T, "{}token id buffer {} for {} tokens", who,
            dst.describe(), T);
  const TensorView& dev = in.token_ids_device;
  if (!dev.data) {
    backend.copy_from_host(dst, in.token_ids.data());
    return;
  }
  MLA_CHECK(dev.dtype == DType::I32 && dev.ndim == 1 && dev.dim(0) == T && dev.is_contiguous(),
            "{}token_ids_device {} for {} tokens", who, dev.describe(), T);
  backend.copy(dev, dst);
}

void StepInputs::allocate(ops::Backend& backend, const ModelLimits& limits, std::vector<Buffer>& owned) {
  const auto make = [&](int64_t n) {
    owned.push_back(backend.alloc(size_t(std::max<int64_t>(n, 1)) * sizeof(int32_t)));
    return owned.back().view(DType::I32, {n});
  };
  const int64_t T = limits.max_tokens, S = limits.max_seqs;
  ids = make(T);
  positions = make(T);
  q_indptr = make(S + 1);
  kv_lens = make(S);
  block_indptr = make(S + 1);
  block_ids = make(limits.max_block_entries);
  slots = make(T);
  logits_rows = make(T);
}

void StepInputs::stage(ops::Backend& backend, const ForwardInputs& in, const ModelLimits& limits, std::string_view who) {
  const int T = int(in.token_ids.size()), S = int(in.seqs.size());
  MLA_CHECK(T > 0 && T <= limits.max_tokens, "{}step of {} tokens (limit {})", who, T, limits.max_tokens);
  MLA_CHECK(S > 0 && S <= limits.max_seqs, "{}step of {} sequences (limit {})", who, S, limits.max_seqs);
  MLA_CHECK(int(in.positions.size()) == T, "{}positions {} != tokens {}", who, in.positions.size(), T);
  // Rows may repeat (speculative verification pads each sequence to K+1 rows), so there can be more
  // logits rows than tokens; the buffer holds max_tokens of them.
  MLA_CHECK(!in.logits_rows.empty() && int(in.logits_rows.size()) <= limits.max_tokens, "{}{} logits rows (limit {})",
            who, in.logits_rows.size(), limits.max_tokens);
  for (int32_t r : in.logits_rows) MLA_CHECK(r >= 0 && r < T, "{}logits row {} outside the step's {} tokens", who, r, T);
  const int bs = in.block_size;
  MLA_CHECK(bs > 0, "{}block_size {}", who, bs);
  h_q_indptr.assign(1, 0);
  h_block_indptr.assign(1, 0);
  h_kv_lens.clear();
  h_block_ids.clear();
  h_slots.clear();
  int row = 0;
  for (const SequenceSlice& s : in.seqs) {
    MLA_CHECK(s.q_len > 0 && s.q_len <= s.kv_len, "{}q_len {} kv_len {}", who, s.q_len, s.kv_len);
    MLA_CHECK(int64_t(s.block_table.size()) * bs >= s.kv_len, "{}block table of {} blocks for {} tokens", who,
              s.block_table.size(), s.kv_len);
    for (int i = 0; i < s.q_len; ++i, ++row) {
      const int pos = s.kv_len - s.q_len + i;
      MLA_CHECK(row < T && in.positions[size_t(row)] == pos, "{}row {} position {} != {}", who, row,
                row < T ? in.positions[size_t(row)] : -1, pos);
      h_slots.push_back(s.block_table[size_t(pos / bs)] * bs + pos % bs);
    }
    h_q_indptr.push_back(row);
    h_kv_lens.push_back(s.kv_len);
    h_block_ids.insert(h_block_ids.end(), s.block_table.begin(), s.block_table.end());
    h_block_indptr.push_back(int(h_block_ids.size()));
  }
  MLA_CHECK(row == T, "{}sequences cover {} rows of {}", who, row, T);
  MLA_CHECK(int(h_block_ids.size()) <= limits.max_block_entries, "{}{} block entries (limit {})", who,
            h_block_ids.size(), limits.max_block_entries);
  auto upload = [&](const TensorView& dst, const int32_t* src, int64_t n) {
    TensorView v = dst.slice(0, 0, n);
    backend.copy_from_host(v, src);
    return v;
  };
  stage_token_ids(backend, in, ids.slice(0, 0, T), who);
  upload(positions, in.positions.data(), T);
  batch.num_seqs = S;
  batch.block_size = bs;
  batch.q_indptr = upload(q_indptr, h_q_indptr.data(), S + 1);
  batch.kv_lens = upload(kv_lens, h_kv_lens.data(), S);
  batch.block_indptr = upload(block_indptr, h_block_indptr.data(), S + 1);
  upload(block_ids, h_block_ids.data(), int64_t(h_block_ids.size()));
  // The whole block-id buffer, not the step's prefix: its shape then depends only on the limits, so
  // a graph captured at one context length stays valid as the block tables grow (block_indptr says
  // which entries are live).
  batch.block_ids = block_ids;
  batch.slot_mapping = upload(slots, h_slots.data(), T);
  upload(logits_rows, in.logits_rows.data(), int64_t(in.logits_rows.size()));
  batch.host_q_indptr = h_q_indptr;
  batch.host_kv_lens = h_kv_lens;
  batch.host_block_indptr = h_block_indptr;
  batch.host_block_ids = h_block_ids;
}

}  // namespace mla::model
