// Kimi K3 XTML: expected strings are assembled from the literal fragments quoted in
// ../shared/MODELS.md §5.1 (message, assistant turn, generation prompt, tools block).
#include <gtest/gtest.h>

#include "tokenizer/xtml_format.h"

namespace mla::tokenizer {
namespace {

using J = nlohmann::ordered_json;

TEST(XtmlFormat, UserTurnAndGenerationPromptThinkingOnAndOff) {
  const J msgs = J::array({J{{"role", "user"}, {"content", "Hi"}}});
  XtmlOptions o;
  // MODELS.md: message `<|open|>message role="user"<|sep|>…<|close|>message<|sep|><|end_of_msg|>`;
  // generation prompt `<|open|>message role="assistant"<|sep|><|open|>think<|sep|>`.
  EXPECT_EQ(render_xtml(msgs, o).value(),
            "<|open|>message role=\"user\"<|sep|>Hi<|close|>message<|sep|><|end_of_msg|>"
            "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>");
  o.thinking = false;  // "thinking off: ends `<|open|>response<|sep|>`"
  EXPECT_EQ(render_xtml(msgs, o).value(),
            "<|open|>message role=\"user\"<|sep|>Hi<|close|>message<|sep|><|end_of_msg|>"
            "<|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|>");
  o.add_generation_prompt = false;
  EXPECT_EQ(render_xtml(msgs, o).value(), "<|open|>message role=\"user\"<|sep|>Hi<|close|>message<|sep|><|end_of_msg|>");
}

TEST(XtmlFormat, AssistantTurnWithToolCallAndPreamble) {
  J assistant = J{{"role", "assistant"}, {"content", "Checking."}, {"reasoning_content", "need weather"}};
  assistant["tool_calls"] = J::array({J{{"type", "function"},
                                        {"function", J{{"name", "get_weather"}, {"arguments", "{\"city\": \"Paris\"}"}}}}});
  const J msgs = J::array({J{{"role", "user"}, {"content", "Weather?"}}, assistant,
                           J{{"role", "tool"}, {"content", "sunny"}}});
  XtmlOptions o;
  o.add_generation_prompt = false;
  o.thinking_effort = "high";
  o.tools = J::array({J{{"type", "function"}, {"function", J{{"name", "get_weather"}}}}});
  const std::string expected =
      "<|open|>message role=\"system\" type=\"tool-declare\"<|sep|>"
      "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}]<|close|>message<|sep|><|end_of_msg|>"
      "<|open|>message role=\"system\" type=\"thinking-effort\"<|sep|>high<|close|>message<|sep|><|end_of_msg|>"
      "<|open|>message role=\"user\"<|sep|>Weather?<|close|>message<|sep|><|end_of_msg|>"
      "<|open|>message role=\"assistant\"<|sep|>"
      "<|open|>think<|sep|>need weather<|close|>think<|sep|><|open|>response<|sep|>Checking.<|close|>response<|sep|>"
      "<|open|>tools<|sep|><|open|>call tool=\"get_weather\" index=\"1\"<|sep|>"
      "<|open|>argument key=\"city\" type=\"string\"<|sep|>Paris<|close|>argument<|sep|><|close|>call<|sep|>"
      "<|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>"
      "<|open|>message role=\"tool\"<|sep|>sunny<|close|>message<|sep|><|end_of_msg|>";
  EXPECT_EQ(render_xtml(msgs, o).value(), expected);
}

TEST(XtmlFormat, RejectsBadInput) {
  EXPECT_FALSE(render_xtml(J::object(), {}).is_ok());
  EXPECT_FALSE(render_xtml(J::array({J{{"content", "no role"}}}), {}).is_ok());
  XtmlOptions o;
  o.thinking_effort = "extreme";
  EXPECT_FALSE(render_xtml(J::array(), o).is_ok());
  J bad = J{{"role", "assistant"}, {"content", ""}};
  bad["tool_calls"] = J::array({J{{"function", J{{"name", "f"}, {"arguments", "{not json"}}}}});
  EXPECT_FALSE(render_xtml(J::array({bad}), {}).is_ok());
}

}  // namespace
}  // namespace mla::tokenizer
