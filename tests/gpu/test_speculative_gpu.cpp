// Speculative decoding on the GPU backend (issue #8, "the same tests on the H200"): the embedded model
// with its trained draft, greedy output against non-speculative greedy output at K in {1, 2, 4} and
// batch 1 and 8, no leaked blocks, and a sampled run that completes; the same greedy identity for
// the feature-fed drafts (MTP, EAGLE-3) on the tiny MTP target (spec/feature_fed_greedy.h). fp32 GEMMs and the naive MLA path
// on both sides, so a verification row and a decode row differ at most by summation order inside the
// GPU kernels; the test reports the acceptance it measured.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "backend/gpu/gpu_backend.h"
#include "model/model_test_util.h"
#include "runtime/engine.h"
#include "spec/spec_test_util.h"
#include "spec/deepseek_draft.h"
#include "spec/feature_fed_greedy.h"
#include "tokenizer/tokenizer.h"

namespace mla::test {
namespace {

// MLA_FIXTURE_DIR in the environment overrides the build-time path (a build carried to another host).
const std::string kModels = std::string(std::getenv("MLA_FIXTURE_DIR") ? std::getenv("MLA_FIXTURE_DIR") : MLA_FIXTURE_DIR) +
                            "/../../models";
constexpr int kMaxSeqs = 8, kBudget = 128, kMaxK = 4;

struct GpuModels {
  std::unique_ptr<LoadedModel> target;
  dist::SingleProcessCommunicator comm;
  std::unique_ptr<model::DeepseekV3> draft_lm;
  std::unique_ptr<spec::DeepseekDraft> draft;
  std::unique_ptr<tokenizer::Tokenizer> tok;
};

GpuModels& models() {
  static GpuModels m = [] {
    GpuModels x;
    gpu::GpuBackendOptions o;
    o.gemm_precision = gpu::GemmPrecision::Fp32;
    auto b = gpu::make_gpu_backend(o);
    EXPECT_TRUE(b.is_ok()) << b.status().message();
    x.target = load_model(kModels + "/default", std::move(b).value(), std::max(kBudget, kMaxSeqs * (kMaxK + 1)), kMaxSeqs);
    model::ModelLimits dl;
    dl.max_tokens = kBudget + kMaxSeqs;
    dl.max_seqs = kMaxSeqs;
    auto d = model::DeepseekV3::load(kModels + "/draft", *x.target->backend, dl, x.comm);
    EXPECT_TRUE(d.is_ok()) << d.status().message();
    x.draft_lm = std::move(d).value();
    x.draft = std::make_unique<spec::DeepseekDraft>(*x.draft_lm);
    auto t = tokenizer::Tokenizer::from_model_dir(kModels + "/default");
    EXPECT_TRUE(t.is_ok());
    x.tok = std::move(t).value();
    return x;
  }();
  return m;
}

runtime::EngineConfig config(int k) {
  runtime::EngineConfig c;
  c.max_num_seqs = kMaxSeqs;
  c.max_tokens_per_step = kBudget;
  c.block_size = 16;
  c.num_blocks = 256;
  c.mla_path = model::MlaPath::Naive;
  c.num_draft_tokens = k;
  c.eos_token_ids = models().tok->eos_ids();
  return c;
}

// Token ids of each request, in request order.
std::vector<std::vector<int32_t>> run_ids(runtime::Engine& e, const std::vector<runtime::RequestParams>& reqs) {
  std::vector<std::vector<int32_t>> ids;
  for (const runtime::RequestOutput& o : run_all(e, reqs)) ids.push_back(o.token_ids);
  return ids;
}

std::vector<runtime::RequestParams> requests(int n) {
  const char* prompts[] = {"In the beginning God created", "The quick brown fox", "def main():\n    ",
                           "Blessed are the", "A noun is a word that", "And it came to pass, when",
                           "import os\nimport sys\n", "The Lord is my shepherd;"};
  std::vector<runtime::RequestParams> v;
  for (int i = 0; i < n; ++i) {
    runtime::RequestParams p;
    p.prompt = models().tok->encode(prompts[i % 8], {tokenizer::EncodeOptions::Special::None});
    p.prompt.insert(p.prompt.begin(), *models().tok->bos_id());
    p.max_tokens = 24 + 3 * i;
    p.sampling.temperature = 0.0f;
    v.push_back(p);
  }
  return v;
}

class GpuSpeculativeGreedy : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(GpuSpeculativeGreedy, IdenticalToNonSpeculative) {
  const auto [k, batch] = GetParam();
  GpuModels& m = models();
  const auto reqs = requests(batch);
  std::vector<std::vector<int32_t>> want;
  {
    auto plain = runtime::Engine::create(*m.target->model, *m.target->backend, m.tok.get(), config(0));
    ASSERT_TRUE(plain.is_ok()) << plain.status().message();
    want = run_ids(**plain, reqs);
  }
  auto e = runtime::Engine::create(*m.target->model, *m.target->backend, m.tok.get(), config(k), m.draft.get());
  ASSERT_TRUE(e.is_ok()) << e.status().message();
  const auto got = run_ids(**e, reqs);
  for (int i = 0; i < batch; ++i) EXPECT_EQ(got[size_t(i)], want[size_t(i)]) << "request " << i << " K=" << k;
  const runtime::EngineMetrics mt = settled(**e);
  EXPECT_EQ(mt.num_blocks_used, 0);
  std::printf("[ spec gpu ] K=%d batch=%d: %lld/%lld drafts accepted, mean accepted length %.2f\n", k, batch,
              static_cast<long long>(mt.spec.num_accepted_tokens), static_cast<long long>(mt.spec.num_draft_tokens),
              1.0 + double(mt.spec.num_accepted_tokens) / double(std::max<int64_t>(1, mt.spec.num_drafts)));
}

INSTANTIATE_TEST_SUITE_P(KAndBatch, GpuSpeculativeGreedy,
                         ::testing::Combine(::testing::Values(1, 2, 4), ::testing::Values(1, 8)));

TEST(GpuSpeculative, SampledRequestsComplete) {
  GpuModels& m = models();
  auto e = runtime::Engine::create(*m.target->model, *m.target->backend, m.tok.get(), config(3), m.draft.get());
  ASSERT_TRUE(e.is_ok());
  auto reqs = requests(8);
  for (size_t i = 0; i < reqs.size(); ++i) {
    reqs[i].sampling.temperature = 0.8f;
    reqs[i].sampling.top_k = i % 2 ? 40 : 0;
    reqs[i].sampling.top_p = 0.9f;
    reqs[i].sampling.seed = 11 + i;
    reqs[i].ignore_eos = true;
  }
  const auto outs = run_ids(**e, reqs);
  for (size_t i = 0; i < outs.size(); ++i) EXPECT_EQ(int(outs[i].size()), reqs[i].max_tokens);
  EXPECT_GT((*e)->metrics().spec.num_accepted_tokens, 0);
}

// The serving configuration (MlaPath::Auto, decode graphs, BF16 cache): verification steps run
// absorbed and replay graphs per (T, q_len); batches of different sizes make the backend's scratch
// grow after earlier graphs were captured. Regression: growth used to free the buffer those graphs
// wrote to (an illegal address on the H200, found by compute-sanitizer in `serve`).
TEST(GpuSpeculative, GraphsSurviveScratchGrowthAcrossBatchSizes) {
  GpuModels& m = models();
  runtime::EngineConfig c = config(2);
  c.mla_path = model::MlaPath::Auto;
  c.decode_graphs = true;
  c.kv_cache_dtype = DType::BF16;
  auto e = runtime::Engine::create(*m.target->model, *m.target->backend, m.tok.get(), c, m.draft.get());
  ASSERT_TRUE(e.is_ok()) << e.status().message();
  for (int batch : {1, 8, 2, 8, 1}) {
    auto reqs = requests(batch);
    for (auto& r : reqs) r.ignore_eos = true;
    const auto outs = run_ids(**e, reqs);
    for (size_t i = 0; i < outs.size(); ++i) EXPECT_EQ(int(outs[i].size()), reqs[i].max_tokens) << batch;
  }
  EXPECT_TRUE((*e)->healthy());
  EXPECT_GT((*e)->metrics().spec.num_accepted_tokens, 0);
}

// Rollback on the GPU: the CPU suite's 100 requests, a third cancelled, on the embedded pair in the
// serving configuration (graphs, BF16 cache, absorbed verification).
TEST(GpuSpeculative, NoBlockLeaksAfter100RequestsSomeCancelled) {
  GpuModels& m = models();
  runtime::EngineConfig c = config(4);
  c.mla_path = model::MlaPath::Auto;
  c.decode_graphs = true;
  c.kv_cache_dtype = DType::BF16;
  c.num_blocks = 160;
  auto e = runtime::Engine::create(*m.target->model, *m.target->backend, m.tok.get(), c, m.draft.get());
  ASSERT_TRUE(e.is_ok()) << e.status().message();
  const std::vector<runtime::RequestParams> base = requests(8);
  runtime::RequestParams after = base[0];
  after.ignore_eos = true;
  check_no_block_leaks_after_requests_some_cancelled(
      **e, 100,
      [&](int i) {
        runtime::RequestParams p = base[size_t(i % 8)];
        p.max_tokens = 6 + i % 13;
        return p;
      },
      after);
}

// MTP and EAGLE-3 on the GPU (fp32 GEMMs, naive MLA on both sides, as above).
FeatureFedTarget& feature_fed_target() {
  static std::unique_ptr<FeatureFedTarget> t = [] {
    gpu::GpuBackendOptions o;
    o.gemm_precision = gpu::GemmPrecision::Fp32;
    auto b = gpu::make_gpu_backend(o);
    EXPECT_TRUE(b.is_ok()) << b.status().message();
    return make_feature_fed_target(std::move(b).value(), "gpu");
  }();
  return *t;
}
const auto* const kMtpCleanup = ::testing::AddGlobalTestEnvironment(new TinyMtpCleanup);

class GpuFeatureFedGreedy : public ::testing::TestWithParam<std::tuple<std::string, int, int>> {};

TEST_P(GpuFeatureFedGreedy, IdenticalToNonSpeculative) {
  const auto [kind, k, batch] = GetParam();
  check_feature_fed_greedy(feature_fed_target(), kind, k, batch);
}

INSTANTIATE_TEST_SUITE_P(KindsKAndBatch, GpuFeatureFedGreedy, feature_fed_grid(), feature_fed_name);

}  // namespace
}  // namespace mla::test
