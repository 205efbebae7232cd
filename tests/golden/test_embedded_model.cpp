// Golden test of the shipped models (models/default, models/draft) against their PyTorch reference
// (models/*/reference.json, written by tools/train/train_embedded.py eval: transformers fp32 on the
// same bf16 weights). Greedy continuations must match token for token, through the offline engine
// (prefill, then paged-cache decode). Perplexity of the first 4096 characters of the held-out text
// must match within 1% (the bar; fp32 vs fp32, so the measured difference is ~1e-5).
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>

#include "model/model_test_util.h"
#include "runtime/offline_engine.h"
#include "runtime/perplexity.h"
#include "tokenizer/tokenizer.h"

namespace mla::test {
namespace {

const std::string kModelsDir = std::string(MLA_FIXTURE_DIR) + "/../../models";

nlohmann::json load_reference(const std::string& dir) {
  std::ifstream f(dir + "/reference.json");
  EXPECT_TRUE(f.good()) << dir;
  return nlohmann::json::parse(f);
}

class EmbeddedModel : public ::testing::TestWithParam<std::string> {
 protected:
  std::string dir() const { return kModelsDir + "/" + GetParam(); }
};

TEST_P(EmbeddedModel, GreedyContinuationsMatchPyTorch) {
  const nlohmann::json ref = load_reference(dir());
  auto lm = load_cpu_model(dir(), 64, 8);
  ASSERT_TRUE(lm);
  std::vector<runtime::GenerationRequest> reqs;
  for (const nlohmann::json& g : ref["greedy"]) {
    runtime::GenerationRequest r;
    r.prompt = g["prompt_ids"].get<std::vector<int32_t>>();
    r.max_tokens = int(g["greedy_ids"].size());
    r.sampling.temperature = 0.0f;  // argmax; no stop ids: the reference ran through [EOS] too
    reqs.push_back(r);
  }
  ASSERT_FALSE(reqs.empty());
  auto res = runtime::generate(*lm->model, *lm->backend, reqs, {});
  ASSERT_TRUE(res.is_ok()) << res.status().message();
  for (size_t i = 0; i < reqs.size(); ++i) {
    const nlohmann::json& g = ref["greedy"][i];
    EXPECT_EQ((*res)[i].tokens, g["greedy_ids"].get<std::vector<int32_t>>())
        << GetParam() << " prompt '" << g["prompt"].get<std::string>() << "' (reference min top-1/top-2 margin "
        << g["min_margin"].get<double>() << ")";
  }
}

TEST_P(EmbeddedModel, HeldoutHeadPerplexityMatchesPyTorch) {
  const nlohmann::json ref = load_reference(dir());
  const nlohmann::json& want = ref["perplexity"]["heldout_head_4k"];
  std::ifstream f(std::string(MLA_FIXTURE_DIR) + "/embedded/heldout_head_4k.txt", std::ios::binary);
  ASSERT_TRUE(f.good());
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  ASSERT_EQ(int64_t(text.size()), want["bytes"].get<int64_t>());
  auto tok = tokenizer::Tokenizer::from_model_dir(dir());
  ASSERT_TRUE(tok.is_ok()) << tok.status().message();
  const std::vector<int32_t> ids = (*tok)->encode(text, {tokenizer::EncodeOptions::Special::None});
  ASSERT_TRUE((*tok)->bos_id().has_value());

  const int window = ref["window"].get<int>();
  auto lm = load_cpu_model(dir(), window, 1);
  ASSERT_TRUE(lm);
  runtime::PerplexityOptions opt;
  opt.window = window;
  auto r = runtime::perplexity(*lm->model, *lm->backend, ids, *(*tok)->bos_id(), opt);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->tokens, want["tokens"].get<int64_t>());
  const double ref_ppl = want["perplexity"].get<double>();
  const double rel = std::abs(r->perplexity - ref_ppl) / ref_ppl;
  std::printf("[ %s ] heldout_head_4k perplexity: mlaserve %.6f, PyTorch %.6f, relative difference %.2e\n",
              GetParam().c_str(), r->perplexity, ref_ppl, rel);
  EXPECT_LT(rel, 0.01);
}

INSTANTIATE_TEST_SUITE_P(Shipped, EmbeddedModel, ::testing::Values("default", "draft"));

// The windowing and the input checks of runtime::perplexity, on the draft (the cheaper model).
TEST(EmbeddedModelPerplexity, WindowingAndErrors) {
  auto lm = load_cpu_model(kModelsDir + "/draft", 16, 1);
  ASSERT_TRUE(lm);
  const int32_t bos = 3840;
  std::vector<int32_t> ids(37);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((i * 131 + 7) % 3840);
  runtime::PerplexityOptions opt;
  opt.window = 16;
  auto r = runtime::perplexity(*lm->model, *lm->backend, ids, bos, opt);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->tokens, 37);
  EXPECT_EQ(r->windows, 3);  // 16 + 16 + 5 predicted tokens
  EXPECT_NEAR(r->perplexity, std::exp(r->total_nll / 37), 1e-9 * r->perplexity);
  // A second run reuses the cache blocks and gives the same bits.
  auto again = runtime::perplexity(*lm->model, *lm->backend, ids, bos, opt);
  ASSERT_TRUE(again.is_ok());
  EXPECT_EQ(again->total_nll, r->total_nll);

  EXPECT_FALSE(runtime::perplexity(*lm->model, *lm->backend, std::vector<int32_t>{}, bos, opt).is_ok());
  EXPECT_FALSE(runtime::perplexity(*lm->model, *lm->backend, std::vector<int32_t>{1, 4096}, bos, opt).is_ok());
  opt.window = 17;  // beyond the model's step limit
  EXPECT_FALSE(runtime::perplexity(*lm->model, *lm->backend, ids, bos, opt).is_ok());
  opt.window = 0;
  EXPECT_FALSE(runtime::perplexity(*lm->model, *lm->backend, ids, bos, opt).is_ok());

  // token_nll: -log softmax in double; uniform logits give log(V).
  const std::vector<float> flat(8, 3.0f);
  EXPECT_NEAR(runtime::token_nll(flat, 5), std::log(8.0), 1e-12);
  const std::vector<float> peaked = {0.0f, 1000.0f, 0.0f};  // no overflow: max subtracted first
  EXPECT_NEAR(runtime::token_nll(peaked, 1), 0.0, 1e-12);
  EXPECT_NEAR(runtime::token_nll(peaked, 0), 1000.0, 1e-9);
}

// `mlaserve perplexity --json` on the fixture: the CLI path (file read as bytes, ordinary encode, BOS)
// gives the reference figure too; a missing file is a one-line error and a non-zero exit.
TEST(EmbeddedModelPerplexity, CliMatchesReference) {
  auto run = [](const std::string& args, std::string& out) {
    FILE* p = popen((std::string(MLA_BINARY) + " " + args + " 2>&1").c_str(), "r");
    if (!p) return -1;
    std::array<char, 4096> buf;
    size_t n;
    while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
    const int status = pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  };
  const std::string dir = kModelsDir + "/draft";
  std::string out;
  ASSERT_EQ(run("perplexity --json --model " + dir + " --file " + MLA_FIXTURE_DIR + "/embedded/heldout_head_4k.txt", out), 0)
      << out;
  const nlohmann::json j = nlohmann::json::parse(out);
  const nlohmann::json want = load_reference(dir)["perplexity"]["heldout_head_4k"];
  EXPECT_EQ(j["tokens"].get<int64_t>(), want["tokens"].get<int64_t>());
  EXPECT_EQ(j["windows"].get<int64_t>(), 3);
  EXPECT_NEAR(j["perplexity"].get<double>(), want["perplexity"].get<double>(), 1e-4 * want["perplexity"].get<double>());
  std::string err;
  EXPECT_EQ(run("perplexity --model " + dir + " --file /nonexistent/text.txt", err), 1);
  EXPECT_NE(err.find("cannot open /nonexistent/text.txt"), std::string::npos) << err;
}

// The size budget for everything shipped under models/{default,draft}.
TEST(EmbeddedModelSize, WithinTwelveMegabytes) {
  uintmax_t total = 0;
  for (const char* name : {"default", "draft"})
    for (const auto& e : std::filesystem::directory_iterator(kModelsDir + "/" + name))
      if (e.is_regular_file()) total += e.file_size();
  std::printf("[ size ] models/default + models/draft: %ju bytes\n", total);
  EXPECT_LE(total, uintmax_t(12'000'000));
}

}  // namespace
}  // namespace mla::test
