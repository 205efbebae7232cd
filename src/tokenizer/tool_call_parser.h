// Streaming extraction of tool calls (Kimi K2 section tokens, Kimi K3 XTML, DeepSeek-V3) from
// decoded text chunks cut at arbitrary bytes, into OpenAI `tool_calls` entries. Trade-off: a call
// is reported whole when its end marker arrives (no per-token argument deltas), which keeps the
// arguments validated JSON at the cost of streaming them late.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace mla::tokenizer {

enum class ToolCallFormat { KimiK2, KimiK3Xtml, DeepSeekV3 };

// What is safe to emit now. `tool_calls` holds completed calls in the OpenAI shape
//   {"id": ..., "type": "function", "function": {"name": ..., "arguments": "<JSON text>"}}
// in output order; a call's streaming `index` is its position among all calls of this parser.
// `content_text` never ends inside a UTF-8 character, except from finish().
struct ToolCallDelta {
  std::string content_text;
  std::vector<nlohmann::json> tool_calls;
};

// Rules shared by all formats (deterministic in the text, independent of the chunking):
//  - Text outside a tool-call section is content. Inside a section, whitespace between calls is
//    dropped; any other text between calls is content.
//  - A call is reported when its end marker arrives. If its body cannot be parsed (no name,
//    arguments that are not valid JSON, ...), the call's raw text, markers included, becomes
//    content instead, so nothing the model wrote is lost.
//  - At finish(), an unterminated section keeps the calls already completed; the unfinished rest
//    (section start marker if no call completed yet, open call, held partial marker) is content.
//  - Marker text that appears verbatim inside arguments cannot be told apart from a marker (the
//    model emits markers as special tokens; their text is ambiguous once decoded).
// Per format:
//  - KimiK2: id is the text between <|tool_call_begin|> and <|tool_call_argument_begin|> (trimmed),
//    e.g. "functions.get_weather:0"; name is that text without a "functions." prefix and without
//    a ":<digits>" suffix. Arguments are kept as the model wrote them (trimmed), after checking
//    they parse as JSON; empty arguments become "{}".
//  - DeepSeekV3: `function<｜tool▁sep｜>NAME\n```json\nARGS\n```` ; the fence is optional, and
//    the V3.1 form `NAME<｜tool▁sep｜>ARGS` is accepted too. Ids are "call_<n>", n = 0, 1, ... in
//    the order this parser reports calls.
//  - KimiK3Xtml: `<|open|>call tool="NAME" index="I"<|sep|>` then `<|open|>argument key="K"
//    type="T"<|sep|>RAW<|close|>argument<|sep|>`... ; arguments become a JSON object {K: value}:
//    T = "string" (or absent) keeps RAW verbatim as a string; any other T parses RAW as JSON and
//    falls back to the RAW string if it does not parse. A repeated key keeps the last value.
//    Attribute values are unescaped for &quot; &amp; &lt; &gt; &apos; (the real escaping is
//    unverified, MODELS.md §7); RAW is not unescaped. Ids are "call_<n>" as for DeepSeekV3.
class ToolCallParser {
 public:
  virtual ~ToolCallParser() = default;
  virtual ToolCallDelta push(std::string_view chunk) = 0;
  virtual ToolCallDelta finish() = 0;
  // Calls reported so far (the next call's streaming index).
  virtual size_t tool_call_count() const = 0;
};

std::unique_ptr<ToolCallParser> make_tool_call_parser(ToolCallFormat format);

// Parses a name ("kimi_k2", "kimi_k3_xtml", "deepseek_v3"); false if unknown.
bool parse_tool_call_format(std::string_view name, ToolCallFormat* out);

}  // namespace mla::tokenizer
