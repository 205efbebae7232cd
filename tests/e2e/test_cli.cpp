// End-to-end tests of the `mlaserve` binary: make-model, generate (text and --json/--logits), info,
// and one-line errors with a non-zero exit for bad input.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "model/model_test_util.h"
#include "runtime/offline_engine.h"

namespace mla::test {
namespace {

struct RunResult {
  int exit_code = -1;
  std::string out;  // stdout and stderr together
};

RunResult run(const std::string& args) {
  RunResult r;
  FILE* p = popen((std::string(MLA_BINARY) + " " + args + " 2>&1").c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

class Cli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = (std::filesystem::temp_directory_path() / fmt::format("mlaserve_cli_{}", getpid())).string();
    const RunResult r = run(fmt::format("make-model --preset tiny --layers 2 --dtype fp8 --seed 3 --max-shard-mb 1 --out {}", dir_));
    ASSERT_EQ(r.exit_code, 0) << r.out;
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(dir_); }
  static std::string dir_;
};
std::string Cli::dir_;

TEST_F(Cli, MakeModelWritesShardedHfLayout) {
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/config.json"));
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/model.safetensors.index.json"));
  const RunResult r = run("info --model " + dir_);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("fp8"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("all checked"), std::string::npos) << r.out;
}

TEST_F(Cli, GenerateSaysWeightsAreRandomAndReportsSpeed) {
  const RunResult r = run("generate --model " + dir_ + " --prompt-ids 0,5,9 --max-tokens 6 --ignore-eos");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("RANDOM"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("generated ids (6"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tok/s"), std::string::npos) << r.out;
}

// --json --logits agrees with the in-process engine: same tokens, same last-prompt logits.
TEST_F(Cli, JsonOutputMatchesInProcessEngine) {
  const RunResult r = run("generate --model " + dir_ + " --prompt-ids 3,1,4,1,5,9,2,6 --max-tokens 5 --json --logits "
                          "--ignore-eos --temperature 0.9 --top-k 40 --seed 11");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  auto lm = load_cpu_model(dir_, 256, 1);
  ASSERT_TRUE(lm);
  runtime::GenerationRequest req;
  req.prompt = {3, 1, 4, 1, 5, 9, 2, 6};
  req.max_tokens = 5;
  req.sampling.temperature = 0.9f;
  req.sampling.top_k = 40;
  req.sampling.seed = 11;
  runtime::EngineOptions opt;
  opt.capture_prompt_logits = true;
  auto res = runtime::generate(*lm->model, *lm->backend, {req}, opt);
  ASSERT_TRUE(res.is_ok());
  EXPECT_EQ(j["tokens"].get<std::vector<int32_t>>(), res->front().tokens);
  const auto logits = j["last_logits"].get<std::vector<float>>();
  ASSERT_EQ(logits.size(), size_t(lm->model->config().vocab_size));
  EXPECT_EQ(logits, res->front().prompt_logits);
  EXPECT_TRUE(j["random_weights"].get<bool>());
}

// make-model's byte-level tokenizer: text in (raw and through the chat template), text out.
TEST_F(Cli, TextPromptsUseTheModelTokenizerAndChatTemplate) {
  RunResult r = run("tokenize --model " + dir_ + " --json h\xC3\xA9llo");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out)["ids"], nlohmann::json::parse("[104,195,169,108,108,111]"));
  r = run("generate --model " + dir_ + " --prompt Hi --max-tokens 4 --json --ignore-eos");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["prompt_tokens"], 3);  // [BOS] 'H' 'i'
  EXPECT_TRUE(j["text"].is_string());
  // <|im_user|>user<|im_middle|>Hi<|im_end|><|im_assistant|>assistant<|im_middle|>: 4 + 2 + 13 specials/bytes.
  r = run("generate --model " + dir_ + " --prompt Hi --chat --max-tokens 2 --json --ignore-eos");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["prompt_tokens"], 1 + 4 + 1 + 2 + 1 + 1 + 9 + 1);
  r = run("generate --model " + dir_ + " --prompt-ids 1 --prompt Hi");
  EXPECT_NE(r.exit_code, 0);
}

// --device and the options that go with it. On the CPU: --kv-cache-dtype bf16 runs (and says so),
// --decode-graphs on gives the tokens of off (the CPU re-runs graphs eagerly), --gemm-precision is
// refused. --device cuda either runs (a GPU build on a GPU host) or fails in one line that says why.
TEST_F(Cli, DeviceOptions) {
  const std::string gen = "generate --model " + dir_ + " --prompt-ids 3,1,4,1,5 --max-tokens 6 --json --ignore-eos";
  RunResult r = run(gen);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const nlohmann::json base = nlohmann::json::parse(r.out);
  EXPECT_EQ(base["kv_cache_dtype"], "F32");
  r = run(gen + " --device cpu --decode-graphs on");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out)["tokens"], base["tokens"]);
  r = run(gen + " --kv-cache-dtype bf16");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out)["kv_cache_dtype"], "BF16");
  EXPECT_EQ(nlohmann::json::parse(r.out)["tokens"].size(), 6u);
  for (const std::string& bad : {gen + " --gemm-precision bf16", gen + " --device tpu"}) {
    r = run(bad);
    EXPECT_NE(r.exit_code, 0) << bad;
  }
  r = run(gen + " --device cuda");
  if (r.exit_code == 0) {
    EXPECT_EQ(nlohmann::json::parse(r.out)["kv_cache_dtype"], "BF16") << "auto picks bf16 on a GPU";
  } else {
    EXPECT_TRUE(r.out.find("GPU") != std::string::npos || r.out.find("cuda") != std::string::npos) << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << "not one line:\n" << r.out;
  }
}

// The planner through the binary: it finds the shipped GPU catalog and answers the K3 fit question.
TEST_F(Cli, SpeculativeGenerateMatchesPlainGreedyAndReportsAcceptance) {
  const std::string models = std::string(MLA_FIXTURE_DIR) + "/../../models";
  const std::string common = fmt::format("generate --model {}/default --prompt \"The Lord is my shepherd\" --max-tokens 20 "
                                         "--ignore-eos --mla-path naive --json",
                                         models);
  const RunResult plain = run(common);
  ASSERT_EQ(plain.exit_code, 0) << plain.out;
  const RunResult spec =
      run(common + fmt::format(" --speculative draft --draft-model {}/draft --num-draft-tokens 3", models));
  ASSERT_EQ(spec.exit_code, 0) << spec.out;
  const auto jp = nlohmann::json::parse(plain.out.substr(plain.out.find('{')));
  const auto js = nlohmann::json::parse(spec.out.substr(spec.out.find('{')));
  EXPECT_EQ(js["tokens"], jp["tokens"]);
  EXPECT_EQ(js["text"], jp["text"]);
  EXPECT_EQ(js["speculative"]["num_draft_tokens"], 3);
  EXPECT_GT(js["speculative"]["rounds"].get<int>(), 0);
  EXPECT_GE(js["speculative"]["mean_accepted_length"].get<double>(), 1.0);
  EXPECT_EQ(js["speculative"]["acceptance_rate_per_position"].size(), 3u);
  const RunResult bad = run(common + " --speculative draft");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.out.find("--draft-model"), std::string::npos) << bad.out;
}

TEST_F(Cli, PlanAnswersWhetherKimiK3Fits) {
  RunResult r = run("plan --preset kimi-k3 --gpu b200 --gpus 8 --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_FALSE(j["fits"].get<bool>());
  EXPECT_GT(j["weight_bytes"].get<double>(), 1.5e12);
  r = run("plan --preset kimi-k3 --gpu mi355x --gpus 8 --context 131072 --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j["fits"].get<bool>());
  EXPECT_GT(j["kv_bytes_per_token"].get<double>(), 0);
  r = run("plan --model " + dir_ + " --gpu h200 --gpus 1 --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_TRUE(nlohmann::json::parse(r.out)["fits"].get<bool>());
  r = run("plan --preset kimi-k3 --gpu nope --gpus 8");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("nope"), std::string::npos) << r.out;
}

TEST_F(Cli, BadInputGivesOneLineErrorAndNonZeroExit) {
  struct Case { std::string args, expect; };
  const std::string missing = dir_ + "_does_not_exist";
  for (const Case& c : {Case{"generate --model " + missing + " --prompt-ids 1", "config.json"},
                        Case{"generate --model " + dir_ + " --prompt-ids 1,x", "--prompt-ids"},
                        Case{"generate --model " + dir_ + " --prompt-ids 1,99999", "outside the vocabulary"},
                        Case{"generate --model " + dir_ + " --prompt-ids 1 --top-p 0", "top_p"},
                        Case{"make-model --preset nope --out " + missing, "nope"}}) {
    const RunResult r = run(c.args);
    EXPECT_NE(r.exit_code, 0) << c.args;
    EXPECT_NE(r.out.find(c.expect), std::string::npos) << c.args << "\n" << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << "not one line:\n" << r.out;
  }
}

TEST_F(Cli, CorruptShardIsRejectedWithItsName) {
  const std::string bad = dir_ + "_corrupt";
  std::filesystem::remove_all(bad);
  std::filesystem::copy(dir_, bad);
  const std::string shard = bad + "/model-00001-of-" + [&] {
    for (const auto& e : std::filesystem::directory_iterator(bad)) {
      const std::string n = e.path().filename().string();
      if (n.starts_with("model-00001-of-")) return n.substr(15);
    }
    return std::string("?");
  }();
  std::filesystem::resize_file(shard, std::filesystem::file_size(shard) - 3);  // truncated download
  const RunResult r = run("generate --model " + bad + " --prompt-ids 1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("model-00001-of-"), std::string::npos) << r.out;
  std::filesystem::remove_all(bad);
}

}  // namespace
}  // namespace mla::test
