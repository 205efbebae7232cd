// Target feature capture (ForwardInputs::feature_layers, issue #8) on the tiny random model with an
// MTP block: capture leaves the logits bit-identical; the final-normed feature times lm_head is the
// logits; a layer's feature is the stream the next layer reads (a model truncated after that layer
// ends with it); decode graphs key on the feature view. The target loader ignores the MTP layer.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "io/checkpoint.h"
#include "model/model_test_util.h"
#include "model/mtp_test_util.h"

namespace mla::test {
namespace {

// One prefill step of `ids` (one sequence, logits for every row) with optional capture.
struct Step {
  std::vector<float> logits, features;
};

Step run_prefill(LoadedModel& lm, const std::vector<int32_t>& ids, std::span<const int> layers,
                 model::MlaPath path = model::MlaPath::Naive) {
  model::DeepseekV3& m = *lm.model;
  const int V = m.config().vocab_size, n = int(ids.size()), bs = 4;
  const int64_t hid = m.config().hidden_size;
  runtime::KvCache cache(*lm.backend, {m.num_cache_layers(), (n + bs - 1) / bs + 1, bs, m.kv_dim(), DType::F32});
  std::vector<TensorView> kv;
  for (int L = 0; L < m.num_cache_layers(); ++L) kv.push_back(cache.layer(L));
  runtime::BlockTable table;
  EXPECT_TRUE(table.ensure_capacity(cache.pool(), n, bs));
  std::vector<int32_t> pos(static_cast<size_t>(n)), rows(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) pos[size_t(i)] = rows[size_t(i)] = i;
  model::SequenceSlice slice{n, n, table.blocks()};
  model::ForwardInputs in{ids, pos, {&slice, 1}, rows, kv, bs};
  Buffer logits = lm.backend->alloc(size_t(n) * size_t(V) * sizeof(float));
  const int64_t fw = int64_t(layers.size()) * hid;
  Buffer feats = lm.backend->alloc(size_t(n) * size_t(std::max<int64_t>(fw, 1)) * sizeof(float));
  Step out;
  if (!layers.empty()) {
    std::vector<float> poison(size_t(n) * size_t(fw), NAN);
    in.feature_layers = layers;
    in.features = feats.view(DType::F32, {n, fw});
    lm.backend->copy_from_host(in.features, poison.data());
  }
  m.set_mla_path(path);
  const TensorView lv = logits.view(DType::F32, {n, V});
  m.forward(in, lv);
  out.logits.resize(size_t(lv.numel()));
  lm.backend->copy_to_host(out.logits.data(), lv);
  if (!layers.empty()) {
    out.features.resize(size_t(n) * size_t(fw));
    lm.backend->copy_to_host(out.features.data(), in.features);
  }
  return out;
}

TEST(FeatureCapture, LogitsUnchangedAndFinalFeatureTimesLmHeadIsLogits) {
  auto lm = load_cpu_model(tiny_mtp_model(), 64);
  ASSERT_TRUE(lm);
  const io::ModelConfig& c = lm->model->config();
  const int V = c.vocab_size, n = 11;
  const int64_t hid = c.hidden_size;
  const std::vector<int32_t> ids = random_ids(n, V, 3);
  const Step plain = run_prefill(*lm, ids, {});
  const std::vector<int> layers = {1, model::kFinalNormedFeature, 0, c.num_hidden_layers - 1};
  const Step cap = run_prefill(*lm, ids, layers);
  ASSERT_EQ(plain.logits.size(), cap.logits.size());
  EXPECT_EQ(std::memcmp(plain.logits.data(), cap.logits.data(), plain.logits.size() * sizeof(float)), 0);
  for (float v : cap.features) ASSERT_TRUE(std::isfinite(v));  // every row and column was written

  // lm_head(final-normed feature) over a strided view of the feature buffer == the logits.
  ops::Backend& b = *lm->backend;
  const int64_t fw = int64_t(layers.size()) * hid;
  Buffer fbuf = b.alloc(cap.features.size() * sizeof(float));
  const TensorView f = fbuf.view(DType::F32, {n, fw});
  b.copy_from_host(f, cap.features.data());
  Buffer out = b.alloc(size_t(n) * size_t(V) * sizeof(float));
  const TensorView lv = out.view(DType::F32, {n, V});
  b.linear(f.slice(1, hid, hid), lm->model->weights().lm_head, lv);
  std::vector<float> logits(size_t(n) * size_t(V));
  b.copy_to_host(logits.data(), lv);
  for (int t = 0; t < n; ++t)
    EXPECT_LE(rel_l2(logits.data() + size_t(t) * size_t(V), plain.logits.data() + size_t(t) * size_t(V), size_t(V)),
              1e-6)
        << "row " << t;

  // model.norm(feature of the last layer) == the final-normed feature (same op, same input).
  Buffer nbuf = b.alloc(size_t(n) * size_t(hid) * sizeof(float));
  const TensorView normed = nbuf.view(DType::F32, {n, hid});
  b.rms_norm(f.slice(1, 3 * hid, hid), lm->model->weights().norm, float(c.rms_norm_eps), normed);
  std::vector<float> nrm(size_t(n) * size_t(hid));
  b.copy_to_host(nrm.data(), normed);
  for (int t = 0; t < n; ++t)
    for (int64_t j = 0; j < hid; ++j)
      ASSERT_EQ(nrm[size_t(t * hid + j)], cap.features[size_t(t * fw + hid + j)]) << "row " << t << " col " << j;
}

// The feature of layer l is the residual stream leaving layer l: a model made of layers 0..l only
// ends with exactly that stream (its last-layer feature).
TEST(FeatureCapture, LayerFeatureIsTheStreamLeavingThatLayer) {
  const std::string dir = tiny_mtp_model();
  auto lm = load_cpu_model(dir, 64);
  ASSERT_TRUE(lm);
  const io::ModelConfig& c = lm->model->config();
  const int n = 9;
  const int64_t hid = c.hidden_size;
  const std::vector<int32_t> ids = random_ids(n, c.vocab_size, 5);
  const std::vector<int> one = {1};
  const Step full = run_prefill(*lm, ids, one);

  io::ModelConfig cut_cfg = c;
  cut_cfg.num_hidden_layers = 2;
  cut_cfg.num_nextn_predict_layers = 0;
  model::DeepseekV3Weights w;
  w.embed_tokens = lm->model->weights().embed_tokens;
  w.norm = lm->model->weights().norm;
  w.lm_head = lm->model->weights().lm_head;
  w.layers = {lm->model->weights().layers[0], lm->model->weights().layers[1]};
  auto ckpt = io::Checkpoint::open(dir);
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().message();
  LoadedModel cut;
  cut.backend = cpu::make_cpu_backend();
  auto m = model::DeepseekV3::from_weights(cut_cfg, std::move(w), std::make_unique<io::Checkpoint>(std::move(*ckpt)),
                                           *cut.backend, lm->model->limits(), cut.comm);
  ASSERT_TRUE(m.is_ok()) << m.status().message();
  cut.model = std::move(m).value();
  const Step part = run_prefill(cut, ids, one);
  ASSERT_EQ(part.features.size(), size_t(n) * size_t(hid));
  EXPECT_LE(rel_l2(part.features.data(), full.features.data(), part.features.size()), 1e-7);
}

// The target loader ignores layer L = num_hidden_layers: the same seed with and without the MTP
// block gives bit-identical logits.
TEST(FeatureCapture, TargetLoaderIgnoresTheMtpLayer) {
  auto with = load_cpu_model(tiny_mtp_model("bf16", 1), 64);
  auto without = load_cpu_model(tiny_mtp_model("bf16", 0), 64);
  ASSERT_TRUE(with && without);
  const std::vector<int32_t> ids = random_ids(7, with->model->config().vocab_size, 9);
  const Step a = run_prefill(*with, ids, {}), b = run_prefill(*without, ids, {});
  ASSERT_EQ(a.logits.size(), b.logits.size());
  EXPECT_EQ(std::memcmp(a.logits.data(), b.logits.data(), a.logits.size() * sizeof(float)), 0);
}

// Decode graphs key on the capture: a capturing decode step after a plain one of the same shape
// must not replay the plain graph (its features would stay poisoned), and replays of a capturing
// graph keep writing the features (the CPU backend re-runs the recorded compute on replay).
TEST(FeatureCapture, DecodeGraphsKeyOnTheFeatureView) {
  auto lm = load_cpu_model(tiny_mtp_model(), 64);
  ASSERT_TRUE(lm);
  model::DeepseekV3& m = *lm->model;
  const io::ModelConfig& c = m.config();
  const int V = c.vocab_size, bs = 4;
  const int64_t hid = c.hidden_size;
  const std::vector<int32_t> ids = random_ids(12, V, 11);
  auto run = [&](bool graphs, const std::vector<bool>& capture_at) {
    runtime::KvCache cache(*lm->backend, {m.num_cache_layers(), 8, bs, m.kv_dim(), DType::F32});
    std::vector<TensorView> kv;
    for (int L = 0; L < m.num_cache_layers(); ++L) kv.push_back(cache.layer(L));
    runtime::BlockTable table;
    EXPECT_TRUE(table.ensure_capacity(cache.pool(), int(ids.size()), bs));
    Buffer logits = lm->backend->alloc(size_t(V) * sizeof(float));
    Buffer feats = lm->backend->alloc(size_t(2 * hid) * sizeof(float));
    const TensorView fv = feats.view(DType::F32, {1, 2 * hid});
    const std::vector<int> layers = {model::kFinalNormedFeature, 2};
    std::vector<float> out;
    model::ScopedDecodeGraphs scope(m, graphs);
    m.set_mla_path(model::MlaPath::Auto);
    for (size_t t = 0; t < ids.size(); ++t) {
      const int32_t pos = int32_t(t), row = 0;
      model::SequenceSlice slice{1, int(t) + 1, table.blocks()};
      model::ForwardInputs in{{&ids[t], 1}, {&pos, 1}, {&slice, 1}, {&row, 1}, kv, bs};
      if (capture_at[t]) {
        const std::vector<float> poison(size_t(2 * hid), NAN);
        lm->backend->copy_from_host(fv, poison.data());
        in.feature_layers = layers;
        in.features = fv;
      }
      m.forward(in, logits.view(DType::F32, {1, V}));
      if (capture_at[t]) {
        const size_t at = out.size();
        out.resize(at + size_t(2 * hid));
        lm->backend->copy_to_host(out.data() + at, fv);
      }
    }
    return out;
  };
  const std::vector<bool> pattern = {false, false, true, true, false, true, true, true, false, false, true, true};
  const std::vector<float> eager = run(false, pattern), graphed = run(true, pattern);
  ASSERT_EQ(eager.size(), graphed.size());
  for (float v : graphed) ASSERT_TRUE(std::isfinite(v));
  EXPECT_EQ(std::memcmp(eager.data(), graphed.data(), eager.size() * sizeof(float)), 0);
}

}  // namespace
}  // namespace mla::test
