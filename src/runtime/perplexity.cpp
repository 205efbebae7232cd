// Perplexity through the engine's forward: one window per step (one sequence, q_len = kv_len = n,
// all n logits rows), the cache blocks reused by every window. The NLL of a row is computed in
// double from the F32 logits, rows in parallel, then summed in row order (deterministic).
#include "runtime/perplexity.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "runtime/kv_cache.h"

namespace mla::runtime {

double token_nll(std::span<const float> logits, int32_t target) {
  double mx = -INFINITY;
  for (float v : logits) mx = std::max(mx, double(v));
  double sum = 0;
  for (float v : logits) sum += std::exp(double(v) - mx);
  return mx + std::log(sum) - double(logits[size_t(target)]);
}

Result<PerplexityResult> perplexity(model::DeepseekV3& model, ops::Backend& backend, std::span<const int32_t> ids,
                                    int32_t bos_id, const PerplexityOptions& options,
                                    const PerplexityProgress& progress) {
  const io::ModelConfig& cfg = model.config();
  const int W = options.window;
  if (ids.empty()) return error("perplexity: no tokens to predict (empty text)");
  if (W < 1 || W > model.limits().max_tokens)
    return error("perplexity: window {} outside [1, {}] (the model's step limit)", W, model.limits().max_tokens);
  if (W > cfg.max_position_embeddings)
    return error("perplexity: window {} exceeds max_position_embeddings {}", W, cfg.max_position_embeddings);
  if (bos_id < 0 || bos_id >= cfg.vocab_size) return error("perplexity: BOS id {} outside the vocabulary", bos_id);
  for (int32_t t : ids)
    if (t < 0 || t >= cfg.vocab_size) return error("perplexity: token id {} outside the vocabulary [0, {})", t, cfg.vocab_size);

  // seq = [BOS] + ids; window k feeds seq[k*W, k*W + n) and scores seq[k*W + 1, k*W + n + 1).
  std::vector<int32_t> seq;
  seq.reserve(ids.size() + 1);
  seq.push_back(bos_id);
  seq.insert(seq.end(), ids.begin(), ids.end());
  const int64_t predicted = int64_t(ids.size());
  const int64_t num_windows = (predicted + W - 1) / W;

  constexpr int kBlockSize = 16;
  const int num_blocks = (W + kBlockSize - 1) / kBlockSize;
  KvCache cache(backend, KvCacheConfig{model.num_cache_layers(), num_blocks, kBlockSize, model.kv_dim(), DType::F32});
  std::vector<TensorView> cache_layers;
  for (int L = 0; L < model.num_cache_layers(); ++L) cache_layers.push_back(cache.layer(L));
  std::vector<int32_t> block_table(static_cast<size_t>(num_blocks));
  std::iota(block_table.begin(), block_table.end(), 0);  // every window overwrites the same blocks

  // Windows are never decode-only graph keys we want to keep: a captured graph would point into this
  // function's cache. Switch graphs off for the call and give the model back its setting.
  const model::ScopedDecodeGraphs graphs_scope(model, false);
  model.set_mla_path(options.mla_path);

  const int64_t V = cfg.vocab_size;
  Buffer logits_buf = backend.alloc(size_t(W) * size_t(V) * sizeof(float));
  std::vector<float> host_logits(size_t(W) * size_t(V));
  std::vector<int32_t> positions(static_cast<size_t>(W)), rows(static_cast<size_t>(W));
  std::iota(positions.begin(), positions.end(), 0);
  std::iota(rows.begin(), rows.end(), 0);
  std::vector<double> row_nll(static_cast<size_t>(W));

  PerplexityResult r;
  for (int64_t k = 0; k < num_windows; ++k) {
    const int64_t start = k * W;
    const int n = int(std::min<int64_t>(W, predicted - start));  // tokens fed = tokens scored
    const model::SequenceSlice slice{n, n, std::span<const int32_t>(block_table)};
    const TensorView logits = logits_buf.view(DType::F32, {n, V});  // {n, vocab}
    model::ForwardInputs in{std::span<const int32_t>(seq).subspan(size_t(start), size_t(n)),
                            std::span<const int32_t>(positions).first(size_t(n)),
                            std::span<const model::SequenceSlice>(&slice, 1),
                            std::span<const int32_t>(rows).first(size_t(n)),
                            cache_layers,
                            kBlockSize};
    model.forward(in, logits);
    backend.copy_to_host(host_logits.data(), logits);
    // 2 exp-passes over n x V doubles: ~4 ns/element, comparable to the forward at this model size.
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; ++i)
      row_nll[size_t(i)] = token_nll(std::span<const float>(host_logits).subspan(size_t(i) * size_t(V), size_t(V)),
                                     seq[size_t(start + i + 1)]);
    for (int i = 0; i < n; ++i) r.total_nll += row_nll[size_t(i)];
    ++r.windows;
    if (progress) progress(k + 1, num_windows);
  }
  r.tokens = predicted;
  r.mean_nll = r.total_nll / double(predicted);
  r.perplexity = std::exp(r.mean_nll);
  return r;
}

}  // namespace mla::runtime
