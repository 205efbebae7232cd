// Streaming output parsers (reasoning, tool calls): every full model output is fed whole, one
// byte at a time, split at every point into two chunks, and in random chunkings (fixed seed); all
// must give the hand-written expected content, reasoning and tool calls.
#include <cstddef>
#include <functional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tokenizer/marker_scan.h"
#include "tokenizer/reasoning_parser.h"
#include "tokenizer/tool_call_parser.h"

namespace mla::tokenizer {
namespace {

using nlohmann::json;
using Chunks = std::vector<std::string>;

// All chunkings of `text` the tests use: whole, bytewise, every two-way split, random.
std::vector<Chunks> all_chunkings(const std::string& text) {
  std::vector<Chunks> out;
  out.push_back({text});
  Chunks bytes;
  for (char c : text) bytes.emplace_back(1, c);
  out.push_back(bytes);
  for (size_t split = 0; split <= text.size(); ++split) {
    out.push_back({text.substr(0, split), text.substr(split)});
  }
  std::mt19937 rng(20240611);
  for (int trial = 0; trial < 40; ++trial) {
    Chunks chunks;
    size_t pos = 0;
    while (pos < text.size()) {
      size_t len = 1 + rng() % 9;
      chunks.push_back(text.substr(pos, len));
      pos += len;
    }
    out.push_back(chunks);
  }
  return out;
}

std::string describe(const Chunks& chunks) {
  std::string s = "chunks:";
  for (const auto& c : chunks) s += " [" + c + "]";
  return s;
}

// ---- Reasoning -------------------------------------------------------------------------------

struct ReasoningCase {
  const char* label;
  ReasoningOptions options;
  std::string text;
  std::string reasoning;
  std::string content;
};

std::vector<ReasoningCase> reasoning_cases() {
  ReasoningOptions in_reasoning;
  in_reasoning.starts_in_reasoning = true;
  ReasoningOptions k3;
  k3.start_marker = "<|open|>think<|sep|>";
  k3.end_marker = "<|close|>think<|sep|>";
  k3.starts_in_reasoning = true;
  return {
      {"think block then answer", {},
       "<think>Let me think: 2<3 and </thin is not the end. 日本語 😀 <think></think>The answer is 4.",
       "Let me think: 2<3 and </thin is not the end. 日本語 😀 <think>", "The answer is 4."},
      {"prompt ended inside reasoning", in_reasoning,
       "thinking… 🤔\n</think>\n\nHello <think> stays </think> too",
       "thinking… 🤔\n", "\n\nHello <think> stays </think> too"},
      {"leading whitespace is content", {}, "\n <think>r</think>c", "r", "\n c"},
      {"no reasoning block", {}, "Hello <think>x</think> <thi", "", "Hello <think>x</think> <thi"},
      {"unterminated reasoning", {}, "<think>partial thought </thi", "partial thought </thi", ""},
      {"repeated start marker dropped", in_reasoning, "\n<think>abc</think>def", "\nabc", "def"},
      {"empty output", in_reasoning, "", "", ""},
      {"K3 XTML markers", k3,
       "plan: <|open|>x<|close|>think<|sep|><|open|>response<|sep|>Hi",
       "plan: <|open|>x", "<|open|>response<|sep|>Hi"},
  };
}

struct ReasoningRun {
  std::string reasoning;
  std::string content;
};

ReasoningRun run_reasoning(const ReasoningOptions& options, const Chunks& chunks, bool* utf8_ok) {
  ReasoningParser parser(options);
  ReasoningRun run;
  for (const auto& c : chunks) {
    ReasoningDelta d = parser.push(c);
    if (!is_valid_utf8(d.reasoning_text) || !is_valid_utf8(d.content_text)) *utf8_ok = false;
    run.reasoning += d.reasoning_text;
    run.content += d.content_text;
  }
  ReasoningDelta d = parser.finish();
  run.reasoning += d.reasoning_text;
  run.content += d.content_text;
  return run;
}

TEST(OutputParsersReasoning, EveryChunkingGivesTheSameSplit) {
  for (const auto& tc : reasoning_cases()) {
    for (const auto& chunks : all_chunkings(tc.text)) {
      bool utf8_ok = true;
      ReasoningRun run = run_reasoning(tc.options, chunks, &utf8_ok);
      ASSERT_EQ(run.reasoning, tc.reasoning) << tc.label << " " << describe(chunks);
      ASSERT_EQ(run.content, tc.content) << tc.label << " " << describe(chunks);
      ASSERT_TRUE(utf8_ok) << tc.label << " emitted a broken UTF-8 character; " << describe(chunks);
    }
  }
}

TEST(OutputParsersReasoning, ReleasesTextOnceItCannotBeAMarker) {
  ReasoningParser parser;
  ReasoningDelta d = parser.push("<thi");
  EXPECT_EQ(d.content_text, "");
  EXPECT_EQ(d.reasoning_text, "");
  d = parser.push("s is");
  EXPECT_EQ(d.content_text, "<this is");
  d = parser.push(" <think>");  // after non-blank content no marker is looked for
  EXPECT_EQ(d.content_text, " <think>");
}

TEST(OutputParsersReasoning, HoldsOnlyThePossibleEndMarker) {
  ReasoningOptions options;
  options.starts_in_reasoning = true;
  ReasoningParser parser(options);
  EXPECT_TRUE(parser.in_reasoning());
  ReasoningDelta d = parser.push("abc</th");
  EXPECT_EQ(d.reasoning_text, "abc");
  d = parser.push("X");
  EXPECT_EQ(d.reasoning_text, "</thX");
  d = parser.push("</think");
  EXPECT_EQ(d.reasoning_text, "");
  d = parser.push(">x");
  EXPECT_EQ(d.reasoning_text, "");
  EXPECT_EQ(d.content_text, "x");
  EXPECT_FALSE(parser.in_reasoning());
  d = parser.push("<");  // content after reasoning is never held for markers
  EXPECT_EQ(d.content_text, "<");
}

TEST(OutputParsersReasoning, HoldsAnIncompleteUtf8Character) {
  ReasoningOptions options;
  options.starts_in_reasoning = true;
  ReasoningParser parser(options);
  ReasoningDelta d = parser.push("a\xE6\x97");
  EXPECT_EQ(d.reasoning_text, "a");
  d = parser.push("\xA5");
  EXPECT_EQ(d.reasoning_text, "\xE6\x97\xA5");
  d = parser.push("\xF0\x9F");
  EXPECT_EQ(d.reasoning_text, "");
  d = parser.finish();  // a truncated character is released, not dropped
  EXPECT_EQ(d.reasoning_text, "\xF0\x9F");
}

// ---- Tool calls ------------------------------------------------------------------------------

struct ExpectedCall {
  std::string id;
  std::string name;
  json arguments;             // compared after parsing the arguments string
  std::string raw_arguments;  // when non-empty, the exact arguments string
};

struct ToolCase {
  const char* label;
  ToolCallFormat format;
  std::string text;
  std::string content;
  std::vector<ExpectedCall> calls;
};

const std::string kK2Begin = "<|tool_calls_section_begin|>";
const std::string kK2End = "<|tool_calls_section_end|>";
const std::string kK2CallBegin = "<|tool_call_begin|>";
const std::string kK2Arg = "<|tool_call_argument_begin|>";
const std::string kK2CallEnd = "<|tool_call_end|>";

const std::string kDsBegin = "<｜tool▁calls▁begin｜>";
const std::string kDsEnd = "<｜tool▁calls▁end｜>";
const std::string kDsCallBegin = "<｜tool▁call▁begin｜>";
const std::string kDsSep = "<｜tool▁sep｜>";
const std::string kDsCallEnd = "<｜tool▁call▁end｜>";

std::string k3_arg(const std::string& key_attr, const std::string& type, const std::string& raw) {
  return "<|open|>argument key=\"" + key_attr + "\" type=\"" + type + "\"<|sep|>" + raw +
         "<|close|>argument<|sep|>";
}

std::vector<ToolCase> tool_cases() {
  std::vector<ToolCase> cases;
  // Kimi K2.
  const std::string k2_args1 = R"({"city": "北京", "unit": "c"})";
  const std::string k2_args2 =
      R"({"q": "a } { \"<|tool_call\" ``` <|tool_calls_section_end", "nested": {"a": [1, {"b": "}"}]}})";
  cases.push_back({"K2 two calls with text around", ToolCallFormat::KimiK2,
                   "Let me check.\n" + kK2Begin + kK2CallBegin + "functions.get_weather:0" + kK2Arg +
                       k2_args1 + kK2CallEnd + "\n" + kK2CallBegin + " functions.search:1 " + kK2Arg +
                       " " + k2_args2 + " " + kK2CallEnd + kK2End + "Done 😀.",
                   "Let me check.\nDone 😀.",
                   {{"functions.get_weather:0", "get_weather", json::parse(k2_args1), k2_args1},
                    {"functions.search:1", "search", json::parse(k2_args2), k2_args2}}});
  cases.push_back({"K2 look-alikes outside a section are content", ToolCallFormat::KimiK2,
                   "a <|tool_calls_sec b " + kK2CallBegin + " c " + kK2End + " <|tool_calls_section_begin",
                   "a <|tool_calls_sec b " + kK2CallBegin + " c " + kK2End + " <|tool_calls_section_begin",
                   {}});
  cases.push_back({"K2 bad JSON becomes content, next call survives", ToolCallFormat::KimiK2,
                   "x" + kK2Begin + kK2CallBegin + "functions.f:0" + kK2Arg + "{bad" + kK2CallEnd +
                       kK2CallBegin + "functions.g:1" + kK2Arg + kK2CallEnd + kK2End + "y",
                   "x" + kK2CallBegin + "functions.f:0" + kK2Arg + "{bad" + kK2CallEnd + "y",
                   {{"functions.g:1", "g", json::object(), "{}"}}});
  cases.push_back({"K2 missing argument marker and junk between calls", ToolCallFormat::KimiK2,
                   kK2Begin + "junk" + kK2CallBegin + "functions.f:0{}" + kK2CallEnd + kK2End,
                   "junk" + kK2CallBegin + "functions.f:0{}" + kK2CallEnd, {}});
  cases.push_back({"K2 unterminated call at finish", ToolCallFormat::KimiK2,
                   "hi" + kK2Begin + kK2CallBegin + "functions.f:0" + kK2Arg + R"({"a": "<|tool_call_e)",
                   "hi" + kK2Begin + kK2CallBegin + "functions.f:0" + kK2Arg + R"({"a": "<|tool_call_e)",
                   {}});
  cases.push_back({"K2 unterminated section keeps completed calls", ToolCallFormat::KimiK2,
                   kK2Begin + kK2CallBegin + "functions.f:7" + kK2Arg + "{\"k\":[]}" + kK2CallEnd +
                       kK2CallBegin + "functions.g:8",
                   kK2CallBegin + "functions.g:8",
                   {{"functions.f:7", "f", json{{"k", json::array()}}, "{\"k\":[]}"}}});
  cases.push_back({"K2 section start only", ToolCallFormat::KimiK2, "ok" + kK2Begin + "<|tool_call_be",
                   "ok" + kK2Begin + "<|tool_call_be", {}});

  // DeepSeek-V3.
  const std::string ds_args1 = R"({"location": "Zürich", "code": "```json\n{}\n```"})";
  const std::string ds_args2 = R"({"expr": "{[()]}", "n": {"deep": [1, 2, {"x": "<｜tool▁call"}]}})";
  cases.push_back({"DeepSeek two fenced calls", ToolCallFormat::DeepSeekV3,
                   "好的，我来查。" + kDsBegin + kDsCallBegin + "function" + kDsSep + "get_weather\n```json\n" +
                       ds_args1 + "\n```" + kDsCallEnd + "\n" + kDsCallBegin + "function" + kDsSep +
                       "calc\n```json\n" + ds_args2 + "\n```" + kDsCallEnd + kDsEnd + " 完",
                   "好的，我来查。 完",
                   {{"call_0", "get_weather", json::parse(ds_args1), ds_args1},
                    {"call_1", "calc", json::parse(ds_args2), ds_args2}}});
  cases.push_back({"DeepSeek V3.1 bare form", ToolCallFormat::DeepSeekV3,
                   kDsBegin + kDsCallBegin + "lookup" + kDsSep + R"({"id": 5})" + kDsCallEnd + kDsEnd,
                   "", {{"call_0", "lookup", json{{"id", 5}}, R"({"id": 5})"}}});
  cases.push_back({"DeepSeek malformed call then valid call", ToolCallFormat::DeepSeekV3,
                   kDsBegin + kDsCallBegin + "function get_weather {}" + kDsCallEnd + kDsCallBegin +
                       "function" + kDsSep + "ping\n```json\n{}\n```" + kDsCallEnd + kDsEnd,
                   kDsCallBegin + "function get_weather {}" + kDsCallEnd,
                   {{"call_0", "ping", json::object(), "{}"}}});
  cases.push_back({"DeepSeek unterminated section", ToolCallFormat::DeepSeekV3,
                   "a" + kDsBegin + kDsCallBegin + "function" + kDsSep + "f\n```json\n{\"x\": 1",
                   "a" + kDsBegin + kDsCallBegin + "function" + kDsSep + "f\n```json\n{\"x\": 1", {}});

  // Kimi K3 XTML.
  cases.push_back(
      {"K3 typed arguments and escaping", ToolCallFormat::KimiK3Xtml,
       "Sure.<|open|>tools<|sep|><|open|>call tool=\"get_weather\" index=\"1\"<|sep|>" +
           k3_arg("city", "string", "São Paulo \"quoted\" {x} <|close|>call") + "\n" +
           k3_arg("days", "number", "3") + "<|close|>call<|sep|>\n<|open|>call tool=\"a&amp;b\" index=\"2\"<|sep|>" +
           k3_arg("opts", "object", R"({"k": [1, "<|close|>tools"], "s": "}{"})") +
           k3_arg("flag", "boolean", "true") + k3_arg("bad", "number", "12abc") +
           k3_arg("&quot;q&quot; &lt;&gt;", "string", "1") + "<|close|>call<|sep|><|close|>tools<|sep|>after",
       "Sure.after",
       {{"call_0", "get_weather", json{{"city", "São Paulo \"quoted\" {x} <|close|>call"}, {"days", 3}}, ""},
        {"call_1", "a&b",
         json{{"opts", json{{"k", json::array({1, "<|close|>tools"})}, {"s", "}{"}}},
              {"flag", true},
              {"bad", "12abc"},
              {"\"q\" <>", "1"}},
         ""}}});
  cases.push_back({"K3 call without arguments", ToolCallFormat::KimiK3Xtml,
                   "<|open|>tools<|sep|><|open|>call tool=\"now\" index=\"1\"<|sep|><|close|>call<|sep|><|close|>tools<|sep|>",
                   "", {{"call_0", "now", json::object(), "{}"}}});
  cases.push_back({"K3 call without tool attribute is content", ToolCallFormat::KimiK3Xtml,
                   "<|open|>tools<|sep|><|open|>call index=\"1\"<|sep|>" + k3_arg("a", "string", "b") +
                       "<|close|>call<|sep|><|close|>tools<|sep|>",
                   "<|open|>call index=\"1\"<|sep|>" + k3_arg("a", "string", "b") + "<|close|>call<|sep|>", {}});
  cases.push_back({"K3 unterminated argument at finish", ToolCallFormat::KimiK3Xtml,
                   "x<|open|>tools<|sep|><|open|>call tool=\"f\"<|sep|><|open|>argument key=\"a\" type=\"string\"<|sep|>ab",
                   "x<|open|>tools<|sep|><|open|>call tool=\"f\"<|sep|><|open|>argument key=\"a\" type=\"string\"<|sep|>ab",
                   {}});
  return cases;
}

struct ToolRun {
  std::string content;
  std::vector<json> calls;
};

ToolRun run_tools(ToolCallFormat format, const Chunks& chunks, bool* utf8_ok) {
  auto parser = make_tool_call_parser(format);
  ToolRun run;
  auto take = [&](ToolCallDelta d) {
    if (!is_valid_utf8(d.content_text)) *utf8_ok = false;
    run.content += d.content_text;
    for (auto& c : d.tool_calls) run.calls.push_back(std::move(c));
  };
  for (const auto& c : chunks) take(parser->push(c));
  take(parser->finish());
  EXPECT_EQ(parser->tool_call_count(), run.calls.size());
  return run;
}

void expect_calls(const std::vector<json>& got, const std::vector<ExpectedCall>& want, const std::string& where) {
  ASSERT_EQ(got.size(), want.size()) << where;
  for (size_t i = 0; i < want.size(); ++i) {
    const json& call = got[i];
    ASSERT_EQ(call.size(), 3u) << where << " " << call.dump();
    EXPECT_EQ(call.at("id"), want[i].id) << where;
    EXPECT_EQ(call.at("type"), "function") << where;
    ASSERT_EQ(call.at("function").size(), 2u) << where;
    EXPECT_EQ(call.at("function").at("name"), want[i].name) << where;
    const json& args = call.at("function").at("arguments");
    ASSERT_TRUE(args.is_string()) << where;
    EXPECT_EQ(json::parse(args.get<std::string>()), want[i].arguments) << where;
    if (!want[i].raw_arguments.empty()) {
      EXPECT_EQ(args.get<std::string>(), want[i].raw_arguments) << where;
    }
    // The OpenAI shape must serialize (valid UTF-8 throughout).
    EXPECT_NO_THROW((void)call.dump()) << where;
  }
}

TEST(OutputParsersToolCalls, EveryChunkingGivesTheSameCalls) {
  for (const auto& tc : tool_cases()) {
    std::vector<json> whole;
    for (const auto& chunks : all_chunkings(tc.text)) {
      bool utf8_ok = true;
      ToolRun run = run_tools(tc.format, chunks, &utf8_ok);
      std::string where = std::string(tc.label) + " " + describe(chunks);
      ASSERT_EQ(run.content, tc.content) << where;
      ASSERT_TRUE(utf8_ok) << "broken UTF-8 character emitted; " << where;
      expect_calls(run.calls, tc.calls, where);
      if (::testing::Test::HasFailure()) return;
      if (whole.empty()) whole = run.calls;
      ASSERT_EQ(run.calls, whole) << where;  // byte-identical JSON across chunkings
    }
  }
}

TEST(OutputParsersToolCalls, ReleasesContentOnceItCannotBeAMarker) {
  auto parser = make_tool_call_parser(ToolCallFormat::KimiK2);
  ToolCallDelta d = parser->push("a<|tool_calls_sec");
  EXPECT_EQ(d.content_text, "a");
  d = parser->push("ond");
  EXPECT_EQ(d.content_text, "<|tool_calls_second");
  d = parser->push("\xE2\x96");  // first two bytes of U+2581
  EXPECT_EQ(d.content_text, "");
  d = parser->push("\x81!");
  EXPECT_EQ(d.content_text, "\xE2\x96\x81!");
}

TEST(OutputParsersToolCalls, ReportsEachCallAtItsEndMarker) {
  auto parser = make_tool_call_parser(ToolCallFormat::DeepSeekV3);
  ToolCallDelta d = parser->push("x" + kDsBegin + kDsCallBegin + "function" + kDsSep + "f\n```json\n{}\n```");
  EXPECT_EQ(d.content_text, "x");
  EXPECT_TRUE(d.tool_calls.empty());
  d = parser->push(kDsCallEnd.substr(0, 5));
  EXPECT_TRUE(d.tool_calls.empty());
  d = parser->push(kDsCallEnd.substr(5) + kDsCallBegin);
  ASSERT_EQ(d.tool_calls.size(), 1u);  // before the section end arrives
  EXPECT_EQ(d.tool_calls[0]["function"]["name"], "f");
  EXPECT_EQ(parser->tool_call_count(), 1u);
}

TEST(OutputParsersToolCalls, InvalidUtf8NeverThrows) {
  // Invalid bytes in names or arguments must not reach nlohmann::json::dump (it would throw).
  std::vector<std::pair<ToolCallFormat, std::string>> inputs = {
      {ToolCallFormat::KimiK2, kK2Begin + kK2CallBegin + "functions.\xFF:0" + kK2Arg + "{}" + kK2CallEnd + kK2End},
      {ToolCallFormat::KimiK2, kK2Begin + kK2CallBegin + "functions.f:0" + kK2Arg + "{\"a\":\"\xC3\"}" + kK2CallEnd},
      {ToolCallFormat::KimiK3Xtml, "<|open|>tools<|sep|><|open|>call tool=\"f\"<|sep|>" + k3_arg("k", "string", "\xFE") +
                                       "<|close|>call<|sep|>"},
      {ToolCallFormat::KimiK3Xtml, "<|open|>tools<|sep|><|open|>call tool=\"\xC0\"<|sep|><|close|>call<|sep|>"},
      // Found by the fuzzer: nlohmann's parser treats a NUL as the end of input.
      {ToolCallFormat::KimiK2, kK2Begin + kK2CallBegin + "functions.f:0" + kK2Arg + std::string("7\0\xFF", 3) +
                                   kK2CallEnd + kK2End},
  };
  for (const auto& [format, text] : inputs) {
    for (const auto& chunks : all_chunkings(text)) {
      bool utf8_ok = true;
      ToolRun run = run_tools(format, chunks, &utf8_ok);
      for (const auto& call : run.calls) EXPECT_NO_THROW((void)call.dump());
    }
  }
  bool utf8_ok = true;
  ToolRun k3 = run_tools(ToolCallFormat::KimiK3Xtml, {inputs[2].second}, &utf8_ok);
  ASSERT_EQ(k3.calls.size(), 1u);  // a raw string argument is kept with U+FFFD
  EXPECT_EQ(json::parse(k3.calls[0]["function"]["arguments"].get<std::string>())["k"], "\xEF\xBF\xBD");
  ToolRun k2 = run_tools(ToolCallFormat::KimiK2, {inputs[0].second}, &utf8_ok);
  EXPECT_TRUE(k2.calls.empty());  // a name that is not UTF-8 is returned as content
  EXPECT_NE(k2.content.find("functions.\xFF:0"), std::string::npos);
  ToolRun nul = run_tools(ToolCallFormat::KimiK2, {inputs[4].second}, &utf8_ok);
  EXPECT_TRUE(nul.calls.empty());
  EXPECT_NE(nul.content.find(std::string("7\0\xFF", 3)), std::string::npos);
}

TEST(OutputParsersToolCalls, FormatNames) {
  ToolCallFormat f = ToolCallFormat::KimiK2;
  EXPECT_TRUE(parse_tool_call_format("deepseek_v3", &f));
  EXPECT_EQ(f, ToolCallFormat::DeepSeekV3);
  EXPECT_TRUE(parse_tool_call_format("kimi_k3_xtml", &f));
  EXPECT_EQ(f, ToolCallFormat::KimiK3Xtml);
  EXPECT_FALSE(parse_tool_call_format("hermes", &f));
}

// ---- Scanning helpers ------------------------------------------------------------------------

TEST(OutputParsersScan, PartialSuffixAndUtf8Tail) {
  EXPECT_EQ(partial_marker_suffix("abc<thi", {"<think>", "</think>"}), 4u);
  EXPECT_EQ(partial_marker_suffix("abc</", {"<think>", "</think>"}), 2u);
  EXPECT_EQ(partial_marker_suffix("abc<think>", {"<think>"}), 0u);  // complete, not partial
  EXPECT_EQ(partial_marker_suffix("<<", {"<<x"}), 2u);
  EXPECT_EQ(incomplete_utf8_suffix("a\xF0\x9F\x98"), 3u);
  EXPECT_EQ(incomplete_utf8_suffix("a\xF0\x9F\x98\x80"), 0u);
  EXPECT_EQ(incomplete_utf8_suffix("\x80\x80"), 0u);
  EXPECT_EQ(incomplete_utf8_suffix("a\xFF"), 0u);
  MarkerHit hit = find_first_marker("xx<ab<a", {"<a", "<ab"});
  EXPECT_EQ(hit.pos, 2u);
  EXPECT_EQ(hit.which, 1u);
  EXPECT_TRUE(is_valid_utf8("日本 😀"));
  EXPECT_FALSE(is_valid_utf8("\xED\xA0\x80"));  // surrogate
  EXPECT_FALSE(is_valid_utf8("\xC0\xAF"));      // overlong
}

}  // namespace
}  // namespace mla::tokenizer
