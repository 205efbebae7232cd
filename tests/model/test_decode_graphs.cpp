// Decode graphs and the BF16 latent cache on the CPU backend. The CPU's graphs re-run the recorded
// ops, so graphs on must give bit-identical logits to graphs off: this holds the model's staging /
// compute split to its contract (the compute reads only the workspace, the batch object it
// re-reads, and the views it was captured with) over changing batch sizes and growing contexts.
#include <gtest/gtest.h>

#include <cstring>

#include "golden/golden_fixture.h"
#include "runtime/kv_cache.h"

namespace mla::test {
namespace {

class DecodeGraphs : public ::testing::TestWithParam<std::string> {};

TEST_P(DecodeGraphs, LogitsIdenticalWithGraphsOnAndOff) {
  auto lm = load_cpu_model(golden_case_dir(GetParam()), 32, 8);
  ASSERT_TRUE(lm);
  for (DType cache : {DType::F32, DType::BF16}) {
    size_t captured = 0;
    const std::vector<float> off = decode_trace(*lm, false, cache, 11);
    const std::vector<float> on = decode_trace(*lm, true, cache, 11, &captured);
    ASSERT_EQ(on.size(), off.size());
    ASSERT_FALSE(on.empty());
    EXPECT_EQ(std::memcmp(on.data(), off.data(), on.size() * sizeof(float)), 0) << dtype_name(cache);
    // Batch sizes 1, 2 and 3 each got one graph; the later steps of each size replayed it.
    EXPECT_EQ(captured, 3u) << dtype_name(cache);
    EXPECT_EQ(lm->model->num_decode_graphs(), 0u) << "turning graphs off drops them";
  }
}

// Prefill steps and the naive path never use graphs, even when they are on; one-token auto steps do.
TEST_P(DecodeGraphs, OnlyAbsorbedDecodeStepsAreCaptured) {
  auto lm = load_cpu_model(golden_case_dir(GetParam()), 32, 8);
  ASSERT_TRUE(lm);
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6};
  lm->model->set_decode_graphs(true);
  const std::vector<float> a = prefill_logits(*lm, prompt, 1, model::MlaPath::Naive);
  EXPECT_EQ(lm->model->num_decode_graphs(), 0u);
  lm->model->set_decode_graphs(false);
  const std::vector<float> b = prefill_logits(*lm, prompt, 1, model::MlaPath::Naive);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  // One-token chunks on the auto path are absorbed decode-shaped steps: one graph, replayed.
  const std::vector<float> c = prefill_logits(*lm, prompt, 1, model::MlaPath::Auto);
  lm->model->set_decode_graphs(true);
  const std::vector<float> d = prefill_logits(*lm, prompt, 1, model::MlaPath::Auto);
  EXPECT_EQ(lm->model->num_decode_graphs(), 1u);
  lm->model->set_decode_graphs(false);
  EXPECT_EQ(std::memcmp(c.data(), d.data(), c.size() * sizeof(float)), 0);
}

// A BF16 cache rounds each latent once (8 significant bits, relative error <= 2^-9 ~ 2e-3 per
// value); through a few layers the logits move by well under 1e-2 relative L2, and the engine runs
// with it end to end. The cache takes half the bytes.
TEST_P(DecodeGraphs, Bf16CacheIsCloseToF32) {
  const std::string dir = golden_case_dir(GetParam());
  auto lm = load_cpu_model(dir, 32, 8);
  ASSERT_TRUE(lm);
  const GoldenReference ref = load_golden_reference(dir);
  const std::vector<int32_t> prompt = ref.ints("greedy_prompt");
  const int V = lm->model->config().vocab_size;
  const std::vector<float> f32 = prefill_logits(*lm, prompt, 4, model::MlaPath::Auto, 16, DType::F32);
  const std::vector<float> bf16 = prefill_logits(*lm, prompt, 4, model::MlaPath::Auto, 16, DType::BF16);
  double worst = 0;
  for (size_t t = 0; t < prompt.size(); ++t)
    worst = std::max(worst, rel_l2(bf16.data() + t * size_t(V), f32.data() + t * size_t(V), size_t(V)));
  EXPECT_LT(worst, 1e-2);
  EXPECT_GT(worst, 0.0) << "a BF16 cache that changes nothing is not in use";

  runtime::KvCache a(*lm->backend, {2, 3, 4, 8, DType::F32}), b(*lm->backend, {2, 3, 4, 8, DType::BF16});
  EXPECT_EQ(a.bytes(), 2 * b.bytes());
  EXPECT_EQ(b.layer(1).dtype, DType::BF16);
  EXPECT_EQ(static_cast<const char*>(b.layer(1).data) - static_cast<const char*>(b.layer(0).data), 3 * 4 * 8 * 2);

  runtime::EngineOptions opt;
  opt.kv_cache_dtype = DType::BF16;
  opt.decode_graphs = true;
  check_golden_greedy(*lm, ref, GetParam() + " bf16 cache", opt, 0.1f, 8);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DecodeGraphs, ::testing::Values("ds_h12_yarn_group", "k2_int4"));

}  // namespace
}  // namespace mla::test
