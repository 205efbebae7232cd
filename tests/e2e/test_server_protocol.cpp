// The server's pure pieces without HTTP or a model: request parsing (types, ranges, the param each
// error names, context length), response assembly (SSE framing, usage chunk, errors after the
// stream began, stop reasons) and the Prometheus exposition (cumulative buckets).
#include <gtest/gtest.h>

#include "server/metrics_text.h"
#include "server/openai_request.h"
#include "server/openai_response.h"

namespace mla::server {
namespace {

ModelContext ids_only() {
  ModelContext c;
  c.served_model_name = std::string(1, 'm');  // (not = "m": GCC 12 -O3 raises a bogus -Wrestrict)
  c.max_model_len = 64;
  c.vocab_size = 100;
  return c;
}

ApiError parse_error(const std::string& body, bool chat = false) {
  auto r = parse_request(body, chat, ids_only());
  if (auto* e = std::get_if<ApiError>(&r)) return *e;
  return ApiError{0, "parsed", "", "", ""};
}

TEST(ServerProtocol, ParsesTokenPromptAndSampling) {
  const ModelContext ctx = ids_only();
  auto r = parse_request(R"({"model":"m","prompt":[1,2,3],"max_tokens":5,"temperature":0.5,"top_p":0.9,"top_k":7,
                             "min_p":0.1,"seed":-3,"stop_token_ids":[9],"logprobs":2,"ignore_eos":true,"min_tokens":1,
                             "cache_salt":"t1","stream":true,"stream_options":{"include_usage":true}})",
                         false, ctx);
  ASSERT_TRUE(std::holds_alternative<ParsedRequest>(r)) << std::get<ApiError>(r).message;
  const ParsedRequest& p = std::get<ParsedRequest>(r);
  EXPECT_EQ(p.params.prompt, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(p.params.max_tokens, 5);
  EXPECT_FLOAT_EQ(p.params.sampling.temperature, 0.5f);
  EXPECT_EQ(p.params.sampling.top_k, 7);
  EXPECT_EQ(p.params.sampling.seed, std::optional<uint64_t>(uint64_t(int64_t(-3))));
  EXPECT_EQ(p.params.stop_token_ids, std::vector<int32_t>{9});
  EXPECT_EQ(p.params.logprobs, std::optional<int>(2));
  EXPECT_TRUE(p.params.ignore_eos);
  EXPECT_EQ(p.params.cache_salt, std::optional<std::string>("t1"));
  EXPECT_TRUE(p.stream && p.include_usage);
}

TEST(ServerProtocol, ErrorsNameTheParam) {
  EXPECT_EQ(parse_error("{").param, "");
  EXPECT_EQ(parse_error("{").status, 400);
  EXPECT_EQ(parse_error("[]").status, 400);
  EXPECT_EQ(parse_error(R"({"prompt":[1],"temperature":-1})").param, "temperature");
  EXPECT_EQ(parse_error(R"({"prompt":[1],"top_p":0})").param, "top_p");
  EXPECT_EQ(parse_error(R"({"prompt":[1],"top_k":-7})").param, "top_k");
  EXPECT_EQ(parse_error(R"({"prompt":[1],"max_tokens":0})").param, "max_tokens");
  EXPECT_EQ(parse_error(R"({"prompt":[1],"max_tokens":true})").param, "max_tokens");
  EXPECT_EQ(parse_error(R"({"prompt":[1],"n":3})").param, "n");
  EXPECT_EQ(parse_error(R"({"prompt":[1],"logprobs":21})").param, "logprobs");
  EXPECT_EQ(parse_error(R"({"prompt":[1],"presence_penalty":1})").param, "presence_penalty");
  EXPECT_EQ(parse_error(R"({"prompt":[1],"stream_options":{"include_usage":true}})").param, "stream_options");
  EXPECT_EQ(parse_error(R"({"prompt":[1],"stream":true,"stream_options":{"include_usage":1}})").param,
            "stream_options.include_usage");
  EXPECT_EQ(parse_error(R"({"prompt":[100]})").param, "prompt");
  EXPECT_EQ(parse_error(R"({"prompt":"text"})").param, "prompt");  // no tokenizer: ids only
  EXPECT_EQ(parse_error(R"({"messages":[{"role":"user","content":"hi"}]})", true).param, "messages");  // no template
  const ApiError nf = parse_error(R"({"model":"other","prompt":[1]})");
  EXPECT_EQ(nf.status, 404);
  EXPECT_EQ(nf.code, "model_not_found");
  const ApiError cl = parse_error(R"({"prompt":[1,2,3,4],"max_tokens":61})");
  EXPECT_EQ(cl.code, "context_length_exceeded");
  EXPECT_NE(cl.message.find("65 tokens (4 in the prompt, 61 in the completion)"), std::string::npos) << cl.message;
  EXPECT_EQ(parse_error(R"({"prompt":[1,2,3,4],"max_tokens":60})").status, 0);  // exactly fits
}

TEST(ServerProtocol, StreamFramingUsageAndErrors) {
  const ModelContext ctx = ids_only();
  auto r = parse_request(R"({"prompt":[1],"stream":true,"stream_options":{"include_usage":true}})", false, ctx);
  ASSERT_TRUE(std::holds_alternative<ParsedRequest>(r));
  const ParsedRequest& p = std::get<ParsedRequest>(r);
  ResponseAssembler a(p, ctx, "cmpl-1", 0);
  runtime::RequestOutput d;
  d.text = "ab";
  d.token_ids = {5};
  d.prompt_tokens = 1;
  d.completion_tokens = 1;
  const std::string first = a.stream(d);
  EXPECT_EQ(first.rfind("data: {", 0), 0u);
  EXPECT_NE(first.find("\"text\":\"ab\""), std::string::npos) << first;
  EXPECT_NE(first.find("\"usage\":null"), std::string::npos) << first;
  d.text = "c";
  d.finished = true;
  d.finish_reason = runtime::FinishReason::Stop;
  d.stop_string = "zz";
  d.completion_tokens = 2;
  const std::string last = a.stream(d);
  EXPECT_NE(last.find("\"finish_reason\":\"stop\""), std::string::npos) << last;
  EXPECT_NE(last.find("\"stop_reason\":\"zz\""), std::string::npos) << last;
  EXPECT_NE(last.find("\"choices\":[],"), std::string::npos) << last;  // the usage chunk
  EXPECT_NE(last.find("\"completion_tokens\":2"), std::string::npos) << last;
  EXPECT_EQ(last.substr(last.size() - 14), "data: [DONE]\n\n");

  ResponseAssembler b(p, ctx, "cmpl-2", 0);
  runtime::RequestOutput e;
  e.finished = true;
  e.finish_reason = runtime::FinishReason::Error;
  e.error = "boom";
  const std::string err = b.stream(e);
  EXPECT_EQ(err.rfind("data: {\"error\":", 0), 0u) << err;
  EXPECT_EQ(err.substr(err.size() - 14), "data: [DONE]\n\n");
}

// Reasoning and a Kimi K2 tool call split across deltas at awkward bytes, streamed and not.
TEST(ServerProtocol, ChatReasoningAndToolCalls) {
  ModelContext ctx = ids_only();
  ctx.tool_call_format = tokenizer::ToolCallFormat::KimiK2;
  ctx.reasoning = true;
  ParsedRequest p;
  p.chat = true;
  p.parse_tools = true;
  const std::string text =
      "<think>hmm</think>Sure<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
      "<|tool_call_argument_begin|>{\"city\":\"Paris\"}<|tool_call_end|><|tool_calls_section_end|>";
  auto deltas = [&] {
    std::vector<runtime::RequestOutput> v;
    for (size_t i = 0; i < text.size(); i += 5) {
      runtime::RequestOutput d;
      d.text = text.substr(i, 5);
      d.finished = i + 5 >= text.size();
      if (d.finished) d.finish_reason = runtime::FinishReason::Stop;
      v.push_back(d);
    }
    return v;
  }();
  ResponseAssembler whole(p, ctx, "chatcmpl-1", 0);
  for (const auto& d : deltas) whole.add(d);
  const nlohmann::json body = whole.final_body();
  const nlohmann::json& msg = body["choices"][0]["message"];
  EXPECT_EQ(msg["reasoning_content"], "hmm") << body.dump();
  EXPECT_EQ(msg["content"], "Sure") << body.dump();
  ASSERT_EQ(msg["tool_calls"].size(), 1u) << body.dump();
  EXPECT_EQ(msg["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(nlohmann::json::parse(msg["tool_calls"][0]["function"]["arguments"].get<std::string>())["city"], "Paris");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "tool_calls");

  ResponseAssembler streamed(p, ctx, "chatcmpl-2", 0);
  std::string sse;
  for (const auto& d : deltas) sse += streamed.stream(d);
  std::string reasoning, content, name;
  std::string finish;
  size_t pos = 0;
  while ((pos = sse.find("data: ", pos)) != std::string::npos) {
    const size_t end = sse.find("\n\n", pos);
    const std::string payload = sse.substr(pos + 6, end - pos - 6);
    pos = end;
    if (payload == "[DONE]") break;
    const nlohmann::json c = nlohmann::json::parse(payload);
    const nlohmann::json& ch = c["choices"][0];
    if (ch["delta"].contains("reasoning_content")) reasoning += ch["delta"]["reasoning_content"].get<std::string>();
    if (ch["delta"].contains("content")) content += ch["delta"]["content"].get<std::string>();
    if (ch["delta"].contains("tool_calls")) {
      EXPECT_EQ(ch["delta"]["tool_calls"][0]["index"], 0);
      name = ch["delta"]["tool_calls"][0]["function"]["name"];
    }
    if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
  }
  EXPECT_EQ(reasoning, "hmm");
  EXPECT_EQ(content, "Sure");
  EXPECT_EQ(name, "get_weather");
  EXPECT_EQ(finish, "tool_calls");
  EXPECT_EQ(sse.substr(sse.size() - 14), "data: [DONE]\n\n");
}

TEST(ServerProtocol, PrometheusHistogramsAreCumulative) {
  runtime::EngineMetrics m;
  m.ttft = runtime::LatencyHistogram({0.1, 1.0});
  m.ttft.observe(0.05);
  m.ttft.observe(0.5);
  m.ttft.observe(5.0);
  const std::string t = prometheus_text(m, ServerCounters{}, "m");
  EXPECT_NE(t.find("mlaserve:time_to_first_token_seconds_bucket{model_name=\"m\",le=\"0.1\"} 1\n"), std::string::npos) << t;
  EXPECT_NE(t.find("mlaserve:time_to_first_token_seconds_bucket{model_name=\"m\",le=\"1\"} 2\n"), std::string::npos) << t;
  EXPECT_NE(t.find("mlaserve:time_to_first_token_seconds_bucket{model_name=\"m\",le=\"+Inf\"} 3\n"), std::string::npos) << t;
  EXPECT_NE(t.find("mlaserve:time_to_first_token_seconds_count{model_name=\"m\"} 3\n"), std::string::npos) << t;
}

}  // namespace
}  // namespace mla::server
