// Speculative decoding through the serving engine on the CPU backend (issue #8): greedy output is
// token-for-token the non-speculative output for K in {1, 2, 4} at batch 1 and 8 (the embedded model
// with its trained draft); a draft equal to the target is always accepted (acceptance accounting,
// bonus tokens); rollback leaks no block after 100 speculative requests (40 under the sanitizers),
// some cancelled; preemption and stop conditions inside an accepted run behave as without speculation.
//
// Both engines run the target with MlaPath::Naive so a verification row (one of K+1 in a chunk) and
// a plain decode row execute the same arithmetic: CPU ops are batch-invariant, so the greedy
// comparison is exact rather than "equal unless two logits nearly tie".
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "model/model_test_util.h"
#include "spec/spec_test_util.h"
#include "stress_scale.h"
#include "runtime/engine.h"
#include "spec/deepseek_draft.h"
#include "tokenizer/tokenizer.h"

namespace mla::test {
namespace {

using runtime::Engine;
using runtime::EngineConfig;
using runtime::RequestOutput;
using runtime::RequestParams;

const std::string kModels = std::string(MLA_FIXTURE_DIR) + "/../../models";

struct Models {
  std::unique_ptr<LoadedModel> target;
  dist::SingleProcessCommunicator comm;
  std::unique_ptr<model::DeepseekV3> draft_lm;
  std::unique_ptr<spec::DeepseekDraft> draft;
  std::unique_ptr<spec::DeepseekDraft> self_draft;  // the target as its own draft
  std::unique_ptr<tokenizer::Tokenizer> tok;
};

constexpr int kMaxSeqs = 8, kBudget = 96, kMaxK = 4;

Models& models() {
  static Models m = [] {
    Models x;
    // Target rows: the budget, or K+1 logits rows per sequence.
    x.target = load_cpu_model(kModels + "/default", std::max(kBudget, kMaxSeqs * (kMaxK + 1)), kMaxSeqs);
    model::ModelLimits dl;
    dl.max_tokens = kBudget + kMaxSeqs;
    dl.max_seqs = kMaxSeqs;
    auto d = model::DeepseekV3::load(kModels + "/draft", *x.target->backend, dl, x.comm);
    EXPECT_TRUE(d.is_ok()) << d.status().message();
    x.draft_lm = std::move(d).value();
    x.draft = std::make_unique<spec::DeepseekDraft>(*x.draft_lm);
    x.self_draft = std::make_unique<spec::DeepseekDraft>(*x.target->model);
    auto t = tokenizer::Tokenizer::from_model_dir(kModels + "/default");
    EXPECT_TRUE(t.is_ok());
    x.tok = std::move(t).value();
    return x;
  }();
  return m;
}

EngineConfig config(int k, int num_blocks = 256) {
  EngineConfig c;
  c.max_num_seqs = kMaxSeqs;
  c.max_tokens_per_step = kBudget;
  c.block_size = 4;  // small blocks: lookahead and rollback cross block edges often
  c.num_blocks = num_blocks;
  c.mla_path = model::MlaPath::Naive;
  c.num_draft_tokens = k;
  c.eos_token_ids = models().tok->eos_ids();
  return c;
}

std::unique_ptr<Engine> make_engine(const EngineConfig& c, spec::DraftModel* draft) {
  Models& m = models();
  auto e = Engine::create(*m.target->model, *m.target->backend, m.tok.get(), c, draft);
  EXPECT_TRUE(e.is_ok()) << e.status().message();
  return e.is_ok() ? std::move(e).value() : nullptr;
}

const char* const kPrompts[] = {
    "In the beginning God created", "The quick brown fox", "def main():\n    ", "Blessed are the",
    "A noun is a word that", "And it came to pass, when", "import os\nimport sys\n", "The Lord is my shepherd;",
};

std::vector<RequestParams> greedy_requests(int n, int max_tokens) {
  std::vector<RequestParams> v;
  for (int i = 0; i < n; ++i) {
    RequestParams p;
    p.prompt = models().tok->encode(kPrompts[i % 8], {tokenizer::EncodeOptions::Special::None});
    p.prompt.insert(p.prompt.begin(), *models().tok->bos_id());
    p.max_tokens = max_tokens + 3 * i;  // different lengths: requests finish at different steps
    p.sampling.temperature = 0.0f;
    v.push_back(p);
  }
  return v;
}

class SpeculativeGreedy : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(SpeculativeGreedy, IdenticalToNonSpeculative) {
  const auto [k, batch] = GetParam();
  const std::vector<RequestParams> reqs = greedy_requests(batch, 24);
  std::vector<RequestOutput> want, got;
  {
    auto plain = make_engine(config(0), nullptr);
    ASSERT_TRUE(plain);
    want = run_all(*plain, reqs);
  }
  auto e = make_engine(config(k), models().draft.get());
  ASSERT_TRUE(e);
  got = run_all(*e, reqs);
  for (int i = 0; i < batch; ++i) {
    EXPECT_EQ(got[size_t(i)].token_ids, want[size_t(i)].token_ids) << "request " << i << " K=" << k;
    EXPECT_EQ(got[size_t(i)].text, want[size_t(i)].text);
    EXPECT_EQ(got[size_t(i)].finish_reason, want[size_t(i)].finish_reason);
  }
  const runtime::EngineMetrics m = settled(*e);
  EXPECT_TRUE(m.speculative);
  EXPECT_GT(m.spec.num_drafts, 0);
  EXPECT_LE(m.spec.num_accepted_tokens, m.spec.num_draft_tokens);
  // The trained draft agrees with its target often (the point of training one).
  EXPECT_GT(double(m.spec.num_accepted_tokens) / double(m.spec.num_draft_tokens), 0.2);
  EXPECT_EQ(m.num_blocks_used, 0);
  std::printf("[ spec ] K=%d batch=%d: %lld rounds, %lld/%lld drafts accepted, mean accepted length %.2f\n", k, batch,
              static_cast<long long>(m.spec.num_drafts), static_cast<long long>(m.spec.num_accepted_tokens),
              static_cast<long long>(m.spec.num_draft_tokens),
              1.0 + double(m.spec.num_accepted_tokens) / double(std::max<int64_t>(1, m.spec.num_drafts)));
}

INSTANTIATE_TEST_SUITE_P(KAndBatch, SpeculativeGreedy,
                         ::testing::Combine(::testing::Values(1, 2, 4), ::testing::Values(1, 8)));

TEST(Speculative, SelfDraftIsAlwaysAcceptedGreedyAndSampled) {
  // q == p: greedy drafts equal the argmax, and sampled drafts pass u * q < p for every u < 1.
  const int k = 3;
  auto e = make_engine(config(k), models().self_draft.get());
  ASSERT_TRUE(e);
  std::vector<RequestParams> reqs = greedy_requests(4, 20);
  for (size_t i = 2; i < reqs.size(); ++i) {
    reqs[i].sampling.temperature = 0.9f;
    reqs[i].sampling.top_k = 40;
    reqs[i].sampling.top_p = 0.95f;
    reqs[i].sampling.seed = 7 + i;
    reqs[i].ignore_eos = true;
  }
  const std::vector<RequestOutput> outs = run_all(*e, reqs);
  for (size_t i = 0; i < outs.size(); ++i) EXPECT_TRUE(outs[i].finished);
  const runtime::EngineMetrics m = settled(*e);
  EXPECT_GT(m.spec.num_draft_tokens, 0);
  EXPECT_EQ(m.spec.num_accepted_tokens, m.spec.num_draft_tokens);
  ASSERT_EQ(m.spec.accepted_per_pos.size(), size_t(k));
  EXPECT_EQ(m.spec.accepted_per_pos[0], m.spec.num_drafts);
}

TEST(Speculative, StopTokenInsideAcceptedRunEndsThere) {
  // The same greedy run, once plain and once speculative, with the 6th generated token made a stop
  // token: both end at it, nothing after it is emitted.
  const std::vector<RequestParams> base = greedy_requests(1, 20);
  std::vector<RequestOutput> plain_out;
  {
    auto plain = make_engine(config(0), nullptr);
    plain_out = run_all(*plain, base);
  }
  ASSERT_GE(plain_out[0].token_ids.size(), 8u);
  RequestParams p = base[0];
  p.stop_token_ids = {plain_out[0].token_ids[5]};
  auto plain = make_engine(config(0), nullptr);
  const RequestOutput want = run_all(*plain, {p})[0];
  plain.reset();
  auto e = make_engine(config(4), models().self_draft.get());  // long accepted runs
  const RequestOutput got = run_all(*e, {p})[0];
  EXPECT_EQ(got.token_ids, want.token_ids);
  EXPECT_EQ(got.finish_reason, runtime::FinishReason::Stop);
  EXPECT_EQ(settled(*e).num_blocks_used, 0);
}

TEST(Speculative, PreemptionUnderATinyPoolKeepsGreedyOutput) {
  // 6 requests growing to 8-13 blocks of 4 tokens each in a pool of 30 blocks.
  std::vector<RequestParams> reqs = greedy_requests(6, 28);
  for (RequestParams& p : reqs) p.ignore_eos = true;
  std::vector<RequestOutput> want;
  {
    auto plain = make_engine(config(0), nullptr);
    want = run_all(*plain, reqs);
  }
  auto e = make_engine(config(3, /*num_blocks=*/30), models().draft.get());
  ASSERT_TRUE(e);
  const std::vector<RequestOutput> got = run_all(*e, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(got[i].token_ids, want[i].token_ids) << i;
  const runtime::EngineMetrics m = settled(*e);
  EXPECT_GT(m.preemptions, 0) << "pool not tight enough to exercise preemption";
  EXPECT_EQ(m.num_blocks_used, 0);
}

TEST(Speculative, NoBlockLeaksAfterManyRequestsSomeCancelled) {
  auto e = make_engine(config(4, /*num_blocks=*/160), models().draft.get());
  ASSERT_TRUE(e);
  check_no_block_leaks_after_requests_some_cancelled(
      *e, stress_size(100, 20), [](int i) { return greedy_requests(1, 6 + i % 13)[0]; }, greedy_requests(1, 5)[0]);
}

TEST(Speculative, LogprobsMatchNonSpeculative) {
  RequestParams p = greedy_requests(1, 12)[0];
  p.logprobs = 3;
  std::vector<RequestOutput> want;
  {
    auto plain = make_engine(config(0), nullptr);
    want = run_all(*plain, {p});
  }
  auto e = make_engine(config(2), models().draft.get());
  const RequestOutput got = run_all(*e, {p})[0];
  ASSERT_EQ(got.token_ids, want[0].token_ids);
  ASSERT_EQ(got.logprobs.size(), want[0].logprobs.size());
  for (size_t i = 0; i < got.logprobs.size(); ++i) {
    EXPECT_EQ(got.logprobs[i].token, want[0].logprobs[i].token);
    EXPECT_FLOAT_EQ(got.logprobs[i].logprob, want[0].logprobs[i].logprob) << i;
    ASSERT_EQ(got.logprobs[i].top.size(), 3u);
    EXPECT_EQ(got.logprobs[i].top[0].first, want[0].logprobs[i].top[0].first);
  }
}

}  // namespace
}  // namespace mla::test
