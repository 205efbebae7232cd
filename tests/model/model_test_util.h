// Helpers shared by the model-level tests (CPU, and the GPU golden test): load a model on a backend,
// run whole-prompt or chunked prefill steps that return logits for every position, and run a
// scripted multi-sequence decode whose logits compare decode graphs on and off.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "model/deepseek_v3.h"
#include "runtime/kv_cache.h"

namespace mla::test {

struct LoadedModel {
  std::unique_ptr<ops::Backend> backend;
  dist::SingleProcessCommunicator comm;
  std::unique_ptr<model::DeepseekV3> model;  // declared last: destroyed before the backend
};

inline std::unique_ptr<LoadedModel> load_model(const std::string& dir, std::unique_ptr<ops::Backend> backend,
                                               int max_tokens = 128, int max_seqs = 8) {
  auto lm = std::make_unique<LoadedModel>();
  lm->backend = std::move(backend);
  model::ModelLimits limits;
  limits.max_tokens = max_tokens;
  limits.max_seqs = max_seqs;
  auto m = model::DeepseekV3::load(dir, *lm->backend, limits, lm->comm);
  EXPECT_TRUE(m.is_ok()) << m.status().message();
  if (!m) return nullptr;
  lm->model = std::move(m).value();
  return lm;
}

inline std::unique_ptr<LoadedModel> load_cpu_model(const std::string& dir, int max_tokens = 128, int max_seqs = 8) {
  return load_model(dir, cpu::make_cpu_backend(), max_tokens, max_seqs);
}

// Runs `prompt` through the model in chunks of `chunk` tokens (one sequence) and returns the logits
// of every position, [prompt.size() * vocab].
inline std::vector<float> prefill_logits(LoadedModel& lm, const std::vector<int32_t>& prompt, int chunk,
                                         model::MlaPath path, int block_size = 16,
                                         DType cache_dtype = DType::F32) {
  model::DeepseekV3& m = *lm.model;
  const int V = m.config().vocab_size, n = int(prompt.size());
  runtime::KvCache cache(*lm.backend,
                         {m.num_cache_layers(), (n + block_size - 1) / block_size + 1, block_size, m.kv_dim(), cache_dtype});
  std::vector<TensorView> layers;
  for (int L = 0; L < m.num_cache_layers(); ++L) layers.push_back(cache.layer(L));
  runtime::BlockTable table;
  EXPECT_TRUE(table.ensure_capacity(cache.pool(), n, block_size));
  m.set_mla_path(path);
  std::vector<float> out(size_t(n) * size_t(V), NAN);
  Buffer logits = lm.backend->alloc(size_t(chunk) * size_t(V) * sizeof(float));
  for (int start = 0; start < n; start += chunk) {
    const int len = std::min(chunk, n - start);
    std::vector<int32_t> ids(prompt.begin() + start, prompt.begin() + start + len);
    std::vector<int32_t> pos(static_cast<size_t>(len)), rows(static_cast<size_t>(len));
    for (int i = 0; i < len; ++i) { pos[size_t(i)] = start + i; rows[size_t(i)] = i; }
    model::SequenceSlice slice{len, start + len, table.blocks()};
    model::ForwardInputs in{ids, pos, {&slice, 1}, rows, layers, block_size};
    const TensorView lv = logits.view(DType::F32, {len, V});
    m.forward(in, lv);
    lm.backend->copy_to_host(out.data() + size_t(start) * size_t(V), lv);
  }
  return out;
}

// A scripted decode over three sequences (prompts of 5, 9 and 3 random tokens, block size 4 so
// contexts cross block edges): one mixed prefill step, then decode steps whose batch changes
// (1, 2, 3 sequences, and back, so each batch size is seen again with longer contexts), feeding
// fixed random tokens. Returns every logits row of every step, in order. With `graphs` the decode
// steps go through captured graphs; `graphs_captured` receives how many the model holds at the end.
inline std::vector<float> decode_trace(LoadedModel& lm, bool graphs, DType cache_dtype, uint32_t seed,
                                       size_t* graphs_captured = nullptr) {
  model::DeepseekV3& m = *lm.model;
  const int V = m.config().vocab_size, block_size = 4;
  std::mt19937 rng(seed);
  auto token = [&] { return int32_t(rng() % uint32_t(V)); };
  runtime::KvCache cache(*lm.backend, {m.num_cache_layers(), 64, block_size, m.kv_dim(), cache_dtype});
  std::vector<TensorView> layers;
  for (int L = 0; L < m.num_cache_layers(); ++L) layers.push_back(cache.layer(L));
  Buffer logits_buf = lm.backend->alloc(size_t(32) * size_t(V) * sizeof(float));
  m.set_mla_path(model::MlaPath::Auto);
  m.set_decode_graphs(graphs);
  std::vector<float> out;
  struct Seq { runtime::BlockTable table; int len = 0; };
  std::vector<Seq> seqs(3);
  // One step: sequences `active` each add `q_lens[i]` fixed random tokens.
  auto step = [&](const std::vector<int>& active, const std::vector<int>& q_lens) {
    std::vector<int32_t> ids, pos, rows;
    std::vector<model::SequenceSlice> slices;
    for (size_t i = 0; i < active.size(); ++i) {
      Seq& s = seqs[size_t(active[i])];
      EXPECT_TRUE(s.table.ensure_capacity(cache.pool(), s.len + q_lens[i], block_size));
      for (int j = 0; j < q_lens[i]; ++j) { ids.push_back(token()); pos.push_back(s.len + j); }
      s.len += q_lens[i];
      rows.push_back(int32_t(ids.size()) - 1);
      slices.push_back({q_lens[i], s.len, s.table.blocks()});
    }
    const TensorView lv = logits_buf.view(DType::F32, {int64_t(rows.size()), V});
    m.forward({ids, pos, slices, rows, layers, block_size}, lv);
    const size_t at = out.size();
    out.resize(at + size_t(lv.numel()));
    lm.backend->copy_to_host(out.data() + at, lv);
  };
  step({0, 1, 2}, {5, 9, 3});
  const std::vector<std::vector<int>> schedule = {{0}, {0, 1}, {0, 1, 2}, {0, 1}, {2}, {0, 1, 2}, {1, 2}, {0},
                                                  {0, 1, 2}, {0, 2}, {1}, {0, 1, 2}, {2, 0}, {0, 1, 2}};
  for (const std::vector<int>& active : schedule) step(active, std::vector<int>(active.size(), 1));
  if (graphs_captured) *graphs_captured = m.num_decode_graphs();
  m.set_decode_graphs(false);  // drops graphs before cache and logits_buf are freed
  return out;
}

// ||a - b|| / ||b|| over one row of n values.
inline double rel_l2(const float* a, const float* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = double(a[i]) - double(b[i]);
    num += d * d;
    den += double(b[i]) * double(b[i]);
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

}  // namespace mla::test
