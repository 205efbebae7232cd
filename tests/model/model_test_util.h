// Helpers shared by the model-level tests: load a model on the CPU backend and run whole-prompt or
// chunked prefill steps that return logits for every position.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "model/deepseek_v3.h"
#include "runtime/kv_cache.h"

namespace mla::test {

struct LoadedModel {
  std::unique_ptr<ops::Backend> backend = cpu::make_cpu_backend();
  dist::SingleProcessCommunicator comm;
  std::unique_ptr<model::DeepseekV3> model;
};

inline std::unique_ptr<LoadedModel> load_cpu_model(const std::string& dir, int max_tokens = 128, int max_seqs = 8) {
  auto lm = std::make_unique<LoadedModel>();
  model::ModelLimits limits;
  limits.max_tokens = max_tokens;
  limits.max_seqs = max_seqs;
  auto m = model::DeepseekV3::load(dir, *lm->backend, limits, lm->comm);
  EXPECT_TRUE(m.is_ok()) << m.status().message();
  if (!m) return nullptr;
  lm->model = std::move(m).value();
  return lm;
}

// Runs `prompt` through the model in chunks of `chunk` tokens (one sequence) and returns the logits
// of every position, [prompt.size() * vocab].
inline std::vector<float> prefill_logits(LoadedModel& lm, const std::vector<int32_t>& prompt, int chunk,
                                         model::MlaPath path, int block_size = 16) {
  model::DeepseekV3& m = *lm.model;
  const int V = m.config().vocab_size, n = int(prompt.size());
  runtime::KvCache cache(*lm.backend, {m.num_cache_layers(), (n + block_size - 1) / block_size + 1, block_size, m.kv_dim()});
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
