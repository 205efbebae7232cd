// libFuzzer target for the streaming output parsers (reasoning, three tool-call formats): any
// crash, sanitizer report or thrown exception is a bug, and feeding the same text in chunks must
// give exactly what feeding it whole gives. Byte 0 picks the parser, byte 1 the chunk length.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/reasoning_parser.h"
#include "tokenizer/tool_call_parser.h"

namespace {

using mla::tokenizer::ToolCallFormat;

std::vector<std::string_view> chunk(std::string_view text, size_t len) {
  std::vector<std::string_view> out;
  for (size_t pos = 0; pos < text.size(); pos += len) out.push_back(text.substr(pos, len));
  return out;
}

void check_reasoning(std::string_view text, size_t len, bool starts_in_reasoning) {
  auto run = [&](const std::vector<std::string_view>& chunks) {
    mla::tokenizer::ReasoningOptions options;
    options.starts_in_reasoning = starts_in_reasoning;
    mla::tokenizer::ReasoningParser parser(options);
    std::string reasoning, content;
    for (auto c : chunks) {
      auto d = parser.push(c);
      reasoning += d.reasoning_text;
      content += d.content_text;
    }
    auto d = parser.finish();
    return std::pair(reasoning + d.reasoning_text, content + d.content_text);
  };
  if (run({text}) != run(chunk(text, len))) __builtin_trap();
}

void check_tools(std::string_view text, size_t len, ToolCallFormat format) {
  auto run = [&](const std::vector<std::string_view>& chunks) {
    auto parser = mla::tokenizer::make_tool_call_parser(format);
    std::string content;
    std::string calls;
    auto take = [&](const mla::tokenizer::ToolCallDelta& d) {
      content += d.content_text;
      for (const auto& c : d.tool_calls) calls += c.dump() + "\n";  // must not throw
    };
    for (auto c : chunks) take(parser->push(c));
    take(parser->finish());
    return std::pair(content, calls);
  };
  if (run({text}) != run(chunk(text, len))) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data) + 2, size - 2);
  const size_t len = 1 + data[1] % 16;
  switch (data[0] % 5) {
    case 0: check_reasoning(text, len, false); break;
    case 1: check_reasoning(text, len, true); break;
    case 2: check_tools(text, len, ToolCallFormat::KimiK2); break;
    case 3: check_tools(text, len, ToolCallFormat::KimiK3Xtml); break;
    default: check_tools(text, len, ToolCallFormat::DeepSeekV3); break;
  }
  return 0;
}
