// Feature-fed drafts through the serving engine (issue #8): DeepSeek MTP (the NextN block inside the
// target checkpoint) and EAGLE-3 (a separate head reading three target layers), on a tiny random
// target made for the test. Random drafts are rarely accepted, which is the point here: greedy
// output must equal the non-speculative output token for token whatever the draft proposes, for
// K in {1, 2, 4} at batch 1 and 8, with blocks rolled back to zero afterwards.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "model/deepseek_mtp.h"
#include "model/eagle3.h"
#include "model/eagle3_synthetic.h"
#include "model/model_test_util.h"
#include "model/mtp_test_util.h"
#include "runtime/engine.h"
#include "spec/spec_test_util.h"

namespace mla::test {
namespace {

using runtime::Engine;
using runtime::EngineConfig;
using runtime::RequestOutput;
using runtime::RequestParams;

constexpr int kMaxSeqs = 8, kBudget = 64, kMaxK = 4;

struct Target {
  std::unique_ptr<LoadedModel> lm;
  std::unique_ptr<model::DeepseekMtp> mtp;
  std::unique_ptr<model::Eagle3Draft> eagle;
  std::string dir, eagle_dir;
};

Target& target() {
  static Target t = [] {
    Target x;
    x.dir = tiny_mtp_model("bf16", 1);
    x.lm = load_cpu_model(x.dir, std::max(kBudget, kMaxSeqs * (kMaxK + 1)), kMaxSeqs);
    model::ModelLimits dl;
    dl.max_tokens = kBudget + kMaxSeqs;
    dl.max_seqs = kMaxSeqs;
    auto m = model::DeepseekMtp::load(x.dir, *x.lm->backend, dl, x.lm->comm, 0, x.lm->model.get());
    EXPECT_TRUE(m.is_ok()) << m.status().message();
    if (m.is_ok()) x.mtp = std::move(m).value();
    x.eagle_dir = x.dir + "_eagle3";
    const Status st = model::write_synthetic_eagle3(x.eagle_dir, x.lm->model->config(), /*seed=*/5, /*draft_vocab=*/200);
    EXPECT_TRUE(st.is_ok()) << st.message();
    auto e = model::Eagle3Draft::load(x.eagle_dir, x.lm->model->config(), *x.lm->backend, dl,
                                      x.lm->model->weights().embed_tokens);
    EXPECT_TRUE(e.is_ok()) << e.status().message();
    if (e.is_ok()) x.eagle = std::move(e).value();
    return x;
  }();
  return t;
}

class EagleDirCleanup : public ::testing::Environment {
 public:
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(tiny_mtp_dir("bf16_1") + "_eagle3", ec);
  }
};
const auto* const kCleanup = ::testing::AddGlobalTestEnvironment(new EagleDirCleanup);

EngineConfig config(int k) {
  EngineConfig c;
  c.max_num_seqs = kMaxSeqs;
  c.max_tokens_per_step = kBudget;
  c.block_size = 4;
  c.num_blocks = 256;
  c.mla_path = model::MlaPath::Naive;  // verification rows and decode rows: the same arithmetic
  c.num_draft_tokens = k;
  return c;
}

std::vector<RequestParams> requests(int n) {
  std::vector<RequestParams> v;
  const int vocab = target().lm->model->config().vocab_size;
  for (int i = 0; i < n; ++i) {
    RequestParams p;
    p.prompt = random_ids(5 + 3 * i, vocab, uint32_t(100 + i));
    p.max_tokens = 10 + 2 * i;
    p.sampling.temperature = 0.0f;
    p.ignore_eos = true;
    v.push_back(p);
  }
  return v;
}

class FeatureFedGreedy : public ::testing::TestWithParam<std::tuple<std::string, int, int>> {};

TEST_P(FeatureFedGreedy, IdenticalToNonSpeculative) {
  const auto [kind, k, batch] = GetParam();
  Target& t = target();
  spec::DraftModel* draft = kind == "mtp" ? static_cast<spec::DraftModel*>(t.mtp.get()) : t.eagle.get();
  ASSERT_NE(draft, nullptr);
  const std::vector<RequestParams> reqs = requests(batch);
  std::vector<RequestOutput> want;
  {
    auto plain = Engine::create(*t.lm->model, *t.lm->backend, nullptr, config(0));
    ASSERT_TRUE(plain.is_ok()) << plain.status().message();
    want = run_all(**plain, reqs);
  }
  auto e = Engine::create(*t.lm->model, *t.lm->backend, nullptr, config(k), draft);
  ASSERT_TRUE(e.is_ok()) << e.status().message();
  const std::vector<RequestOutput> got = run_all(**e, reqs);
  for (int i = 0; i < batch; ++i) {
    EXPECT_EQ(got[size_t(i)].token_ids, want[size_t(i)].token_ids) << kind << " request " << i;
    EXPECT_TRUE(got[size_t(i)].finished);
  }
  const runtime::EngineMetrics m = settled(**e);
  EXPECT_EQ(m.num_blocks_used, 0);
  EXPECT_GT(m.spec.num_draft_tokens, 0);
}

INSTANTIATE_TEST_SUITE_P(KindsKAndBatch, FeatureFedGreedy,
                         ::testing::Combine(::testing::Values(std::string("mtp"), std::string("eagle3")),
                                            ::testing::Values(1, 2, 4), ::testing::Values(1, 8)),
                         [](const ::testing::TestParamInfo<FeatureFedGreedy::ParamType>& p) {
                           return fmt::format("{}_K{}_B{}", std::get<0>(p.param), std::get<1>(p.param),
                                              std::get<2>(p.param));
                         });

}  // namespace
}  // namespace mla::test
