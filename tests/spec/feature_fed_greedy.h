// Greedy identity of the feature-fed drafts through the serving engine (issue #8), written once for
// every backend: DeepSeek MTP (the NextN block inside the target checkpoint) and EAGLE-3 (a separate
// head reading three target layers), on a tiny random target made for the test. Random drafts are
// rarely accepted, which is the point: greedy output must equal the non-speculative output token for
// token whatever the draft proposes, with blocks rolled back to zero afterwards. The CPU suite
// (tests/spec) and the GPU suite (tests/gpu) instantiate it with their backend.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "model/deepseek_mtp.h"
#include "model/eagle3.h"
#include "model/eagle3_synthetic.h"
#include "model/model_test_util.h"
#include "model/mtp_test_util.h"
#include "runtime/engine.h"
#include "spec/spec_test_util.h"
#include "stress_scale.h"

namespace mla::test {

struct FeatureFedTarget {
  static constexpr int kMaxSeqs = 8, kBudget = 64, kMaxK = 4;
  std::unique_ptr<LoadedModel> lm;
  std::unique_ptr<model::DeepseekMtp> mtp;
  std::unique_ptr<model::Eagle3Draft> eagle;
  std::string dir, eagle_dir;
};

// Loads the tiny MTP target on `backend` and builds both drafts on it. `tag` names the EAGLE-3
// directory, a tiny_mtp_dir that TinyMtpCleanup removes at exit.
inline std::unique_ptr<FeatureFedTarget> make_feature_fed_target(std::unique_ptr<ops::Backend> backend,
                                                                 const std::string& tag) {
  auto x = std::make_unique<FeatureFedTarget>();
  constexpr int S = FeatureFedTarget::kMaxSeqs, B = FeatureFedTarget::kBudget, K = FeatureFedTarget::kMaxK;
  x->dir = tiny_mtp_model("bf16", 1);
  x->lm = load_model(x->dir, std::move(backend), std::max(B, S * (K + 1)), S);
  model::ModelLimits dl;
  dl.max_tokens = B + S;
  dl.max_seqs = S;
  auto m = model::DeepseekMtp::load(x->dir, *x->lm->backend, dl, x->lm->comm, 0, x->lm->model.get());
  EXPECT_TRUE(m.is_ok()) << m.status().message();
  if (m.is_ok()) x->mtp = std::move(m).value();
  x->eagle_dir = tiny_mtp_dir("eagle3_" + tag);
  const Status st = model::write_synthetic_eagle3(x->eagle_dir, x->lm->model->config(), /*seed=*/5, /*draft_vocab=*/200);
  EXPECT_TRUE(st.is_ok()) << st.message();
  auto e = model::Eagle3Draft::load(x->eagle_dir, x->lm->model->config(), *x->lm->backend, dl,
                                    x->lm->model->weights().embed_tokens);
  EXPECT_TRUE(e.is_ok()) << e.status().message();
  if (e.is_ok()) x->eagle = std::move(e).value();
  return x;
}

inline runtime::EngineConfig feature_fed_config(int k) {
  runtime::EngineConfig c;
  c.max_num_seqs = FeatureFedTarget::kMaxSeqs;
  c.max_tokens_per_step = FeatureFedTarget::kBudget;
  c.block_size = 4;
  c.num_blocks = 256;
  c.mla_path = model::MlaPath::Naive;  // verification rows and decode rows: the same arithmetic
  c.num_draft_tokens = k;
  return c;
}

// Runs `batch` random-prompt greedy requests without and with the `kind` draft ("mtp" or "eagle3")
// at K = k and checks the outputs are identical, finished, and no block is left in use.
inline void check_feature_fed_greedy(FeatureFedTarget& t, const std::string& kind, int k, int batch) {
  spec::DraftModel* draft = kind == "mtp" ? static_cast<spec::DraftModel*>(t.mtp.get()) : t.eagle.get();
  ASSERT_NE(draft, nullptr);
  std::vector<runtime::RequestParams> reqs;
  const int vocab = t.lm->model->config().vocab_size;
  for (int i = 0; i < batch; ++i) {
    runtime::RequestParams p;
    p.prompt = random_ids(5 + 3 * i, vocab, uint32_t(100 + i));
    p.max_tokens = 10 + 2 * i;
    p.sampling.temperature = 0.0f;
    p.ignore_eos = true;
    reqs.push_back(p);
  }
  std::vector<runtime::RequestOutput> want;
  {
    auto plain = runtime::Engine::create(*t.lm->model, *t.lm->backend, nullptr, feature_fed_config(0));
    ASSERT_TRUE(plain.is_ok()) << plain.status().message();
    want = run_all(**plain, reqs);
  }
  auto e = runtime::Engine::create(*t.lm->model, *t.lm->backend, nullptr, feature_fed_config(k), draft);
  ASSERT_TRUE(e.is_ok()) << e.status().message();
  const std::vector<runtime::RequestOutput> got = run_all(**e, reqs);
  for (int i = 0; i < batch; ++i) {
    EXPECT_EQ(got[size_t(i)].token_ids, want[size_t(i)].token_ids) << kind << " request " << i;
    EXPECT_TRUE(got[size_t(i)].finished);
  }
  const runtime::EngineMetrics m = settled(**e);
  EXPECT_EQ(m.num_blocks_used, 0);
  EXPECT_GT(m.spec.num_draft_tokens, 0);
}

// The parameter grid both suites use: kind x K in {1, 2, 4} x batch in {1, 8} (batch 4 in the
// sanitized CPU build, stress_scale.h: requests of different lengths still finish at different
// steps; batch 8 under ASan took 36-53 s a case).
inline auto feature_fed_grid() {
  return ::testing::Combine(::testing::Values(std::string("mtp"), std::string("eagle3")), ::testing::Values(1, 2, 4),
                            ::testing::Values(1, stress_size(8, 4)));
}
inline std::string feature_fed_name(const ::testing::TestParamInfo<std::tuple<std::string, int, int>>& p) {
  return fmt::format("{}_K{}_B{}", std::get<0>(p.param), std::get<1>(p.param), std::get<2>(p.param));
}

}  // namespace mla::test
