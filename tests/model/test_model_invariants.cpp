// Model-level invariants on random-weight models from make-model (no oracle needed: each test
// compares two ways of computing the same thing). Tolerance: relative L2 1e-5 per row (fp32,
// different reduction order only).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "model/model_test_util.h"
#include "io/presets.h"
#include "model/deepseek_v3_synthetic.h"
#include "runtime/offline_engine.h"

namespace mla::test {
namespace {

constexpr double kSamePathTol = 1e-5;

std::string tiny_dir(const std::string& dtype) {
  return (std::filesystem::temp_directory_path() / fmt::format("mlaserve_test_tiny_{}_{}", dtype, getpid())).string();
}

// Removes the models written below when the test binary ends.
class TinyModelCleanup : public ::testing::Environment {
 public:
  void TearDown() override {
    for (const char* d : {"bf16", "fp8", "int4"}) std::filesystem::remove_all(tiny_dir(d));
  }
};
const auto* const kCleanup = ::testing::AddGlobalTestEnvironment(new TinyModelCleanup);

// Writes a tiny-preset model once per dtype into a temp dir shared by the tests of this binary.
std::string tiny_model(const std::string& dtype) {
  const std::string dir = tiny_dir(dtype);
  if (std::filesystem::exists(dir + "/config.json")) return dir;
  auto cfg = io::preset_config("tiny");
  EXPECT_TRUE(cfg.is_ok());
  auto q = io::with_quantization(*cfg, dtype);
  EXPECT_TRUE(q.is_ok()) << q.status().message();
  model::SyntheticOptions opt;
  opt.seed = 7;
  opt.max_shard_bytes = 1 << 20;  // several shards, exercising the index
  const Status st = model::write_synthetic_checkpoint(*q, dir, opt);
  EXPECT_TRUE(st.is_ok()) << st.message();
  return dir;
}

std::vector<int32_t> random_prompt(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int32_t& t : p) t = int32_t(rng() % uint32_t(vocab));
  return p;
}

class ModelInvariants : public ::testing::TestWithParam<std::string> {};

TEST_P(ModelInvariants, AbsorbedEqualsNaiveAndChunkingChangesNothing) {
  auto lm = load_cpu_model(tiny_model(GetParam()), 64);
  ASSERT_TRUE(lm);
  const int V = lm->model->config().vocab_size;
  const std::vector<int32_t> prompt = random_prompt(37, V, 1);
  const std::vector<float> naive = prefill_logits(*lm, prompt, 64, model::MlaPath::Naive);
  const std::vector<float> absorbed = prefill_logits(*lm, prompt, 64, model::MlaPath::Absorbed);
  const std::vector<float> chunked = prefill_logits(*lm, prompt, 5, model::MlaPath::Naive, 4);
  // Prefill of N tokens then decode of token N+1 (chunk 1) equals a prefill of N+1 tokens.
  const std::vector<float> decode = prefill_logits(*lm, prompt, 1, model::MlaPath::Auto, 8);
  for (size_t t = 0; t < prompt.size(); ++t) {
    const float* ref = naive.data() + t * size_t(V);
    for (const auto* other : {&absorbed, &chunked, &decode}) {
      ASSERT_LE(rel_l2(other->data() + t * size_t(V), ref, size_t(V)), kSamePathTol) << "position " << t;
    }
    for (int v = 0; v < V; ++v) ASSERT_TRUE(std::isfinite(ref[v]));
  }
}

// The shared expert run as one more routed expert (MoeWeights::experts_and_shared: expert E in an
// extra top-k slot of weight 1) is the same sum as its own MLP added after the routed experts: the
// CPU's logits agree bit for bit, at prefill (37 tokens) and at decode (one token per step). Where
// the shared expert is stored in another format than the routed ones (INT4 checkpoints quantize
// only the routed experts, as Kimi K2 Thinking does) it keeps its own MLP.
TEST_P(ModelInvariants, SharedExpertAsRoutedSlotEqualsItsOwnMlp) {
  auto lm = load_cpu_model(tiny_model(GetParam()), 64);
  ASSERT_TRUE(lm);
  ASSERT_EQ(lm->model->config().n_shared_experts, 1);
  for (const model::LayerWeights& L : lm->model->weights().layers) {
    if (!L.is_moe) continue;
    const bool same_format = L.moe.shared_experts.gate_proj.format == L.moe.experts[0].gate_proj.format;
    ASSERT_EQ(!L.moe.experts_and_shared.empty(), same_format) << GetParam();
    if (same_format) {
      EXPECT_EQ(L.moe.experts_and_shared.size(), L.moe.experts.size() + 1);
    }
  }
  const std::vector<int32_t> prompt = random_prompt(37, lm->model->config().vocab_size, 2);
  for (const int chunk : {64, 1}) {
    lm->model->set_fuse_shared_expert(true);
    const std::vector<float> as_slot = prefill_logits(*lm, prompt, chunk, model::MlaPath::Auto);
    lm->model->set_fuse_shared_expert(false);
    const std::vector<float> own_mlp = prefill_logits(*lm, prompt, chunk, model::MlaPath::Auto);
    ASSERT_EQ(as_slot.size(), own_mlp.size());
    EXPECT_EQ(0, std::memcmp(as_slot.data(), own_mlp.data(), as_slot.size() * sizeof(float))) << "chunk " << chunk;
  }
  lm->model->set_fuse_shared_expert(true);
}

// A sequence's tokens and logits do not depend on which other sequences share its steps: the CPU
// backend is batch-invariant by construction, so the logits must be bit-identical.
TEST_P(ModelInvariants, OutputIndependentOfBatchCompanions) {
  auto lm = load_cpu_model(tiny_model(GetParam()), 48, 8);
  ASSERT_TRUE(lm);
  const int V = lm->model->config().vocab_size;
  runtime::GenerationRequest target;
  target.prompt = random_prompt(23, V, 2);
  target.max_tokens = 12;
  target.sampling.temperature = 0.8f;
  target.sampling.top_k = 50;
  target.sampling.top_p = 0.9f;
  target.sampling.seed = 1234;
  runtime::EngineOptions opt;
  opt.max_tokens_per_step = 16;  // forces chunked prefill, mixed with other sequences' decodes
  opt.capture_prompt_logits = true;
  auto alone = runtime::generate(*lm->model, *lm->backend, {target}, opt);
  ASSERT_TRUE(alone.is_ok()) << alone.status().message();

  std::vector<runtime::GenerationRequest> batch;
  for (int i = 0; i < 5; ++i) {
    runtime::GenerationRequest other;
    other.prompt = random_prompt(3 + 7 * i, V, 100 + uint32_t(i));
    other.max_tokens = 5 + i;
    other.sampling.temperature = i % 2 ? 0.0f : 1.2f;
    other.sampling.seed = uint64_t(i);
    batch.push_back(other);
    if (i == 2) batch.push_back(target);
  }
  auto together = runtime::generate(*lm->model, *lm->backend, batch, opt);
  ASSERT_TRUE(together.is_ok()) << together.status().message();
  const runtime::GenerationResult& a = alone->front();
  const runtime::GenerationResult& b = (*together)[3];
  EXPECT_EQ(a.tokens, b.tokens);
  ASSERT_EQ(a.prompt_logits.size(), size_t(V));
  EXPECT_EQ(0, std::memcmp(a.prompt_logits.data(), b.prompt_logits.data(), size_t(V) * sizeof(float)));
}

TEST_P(ModelInvariants, SeededSamplingIsReproducible) {
  auto lm = load_cpu_model(tiny_model(GetParam()), 32);
  ASSERT_TRUE(lm);
  runtime::GenerationRequest r;
  r.prompt = random_prompt(9, lm->model->config().vocab_size, 3);
  r.max_tokens = 20;
  r.sampling.temperature = 1.0f;
  r.sampling.seed = 99;
  auto a = runtime::generate(*lm->model, *lm->backend, {r}, {});
  auto b = runtime::generate(*lm->model, *lm->backend, {r}, {});
  r.sampling.seed = 100;
  auto c = runtime::generate(*lm->model, *lm->backend, {r}, {});
  ASSERT_TRUE(a.is_ok() && b.is_ok() && c.is_ok());
  EXPECT_EQ(a->front().tokens, b->front().tokens);
  EXPECT_NE(a->front().tokens, c->front().tokens);  // 20 draws at T=1 over 512 tokens: collision ~impossible
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ModelInvariants, ::testing::Values("bf16", "fp8", "int4"));

TEST(ModelLoad, RejectsBadRequestsWithClearErrors) {
  auto lm = load_cpu_model(tiny_model("bf16"), 32);
  ASSERT_TRUE(lm);
  runtime::GenerationRequest r;
  r.prompt = {1, 2, 100000};
  auto res = runtime::generate(*lm->model, *lm->backend, {r}, {});
  ASSERT_FALSE(res.is_ok());
  EXPECT_NE(res.status().message().find("outside the vocabulary"), std::string::npos) << res.status().message();
  r.prompt = {};
  EXPECT_FALSE(runtime::generate(*lm->model, *lm->backend, {r}, {}).is_ok());
  r.prompt = {1};
  r.sampling.top_p = 0.0f;
  res = runtime::generate(*lm->model, *lm->backend, {r}, {});
  ASSERT_FALSE(res.is_ok());
  EXPECT_NE(res.status().message().find("top_p"), std::string::npos);
}

TEST(ModelLoad, MissingTensorNamesTheTensor) {
  const std::string src = tiny_model("bf16");
  const std::string dir = src + "_broken";
  std::filesystem::remove_all(dir);
  auto cfg = io::load_model_config(src);
  ASSERT_TRUE(cfg.is_ok());
  io::ModelConfig bigger = *cfg;
  bigger.num_hidden_layers += 1;  // config promises a layer the checkpoint lacks
  std::filesystem::create_directories(dir);
  for (const auto& e : std::filesystem::directory_iterator(src))
    std::filesystem::copy(e.path(), dir + "/" + e.path().filename().string());
  {
    std::ofstream f(dir + "/config.json");
    f << io::model_config_to_json(bigger).dump(2);
  }
  auto backend = cpu::make_cpu_backend();
  dist::SingleProcessCommunicator comm;
  auto m = model::DeepseekV3::load(dir, *backend, {}, comm);
  ASSERT_FALSE(m.is_ok());
  EXPECT_NE(m.status().message().find(fmt::format("model.layers.{}.", cfg->num_hidden_layers)), std::string::npos)
      << m.status().message();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace mla::test
