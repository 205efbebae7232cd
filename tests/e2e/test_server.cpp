// End-to-end tests of `mlaserve serve` on the trained embedded model (CPU): the official `openai`
// npm client (completions and chat, streaming or not, tools, logprobs), every bad-input case over a
// raw socket, limits, auth, client disconnects and a leak check through /metrics, 429 when the
// queue is full, the SIGTERM drain, and `mlaserve chat` driven through a pipe.
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <memory>

#include <nlohmann/json.hpp>

#include "e2e/test_server_util.h"
#include "stress_scale.h"

namespace mla::test {
namespace {

using Json = nlohmann::json;
constexpr const char* kKey = "test-key";
constexpr const char* kModel = "mla-test";

// `arg`: the mode's size where it has one (leak: the number of requests).
Json run_node(int port, const std::string& mode, const std::string& arg = "") {
  const std::string script = std::string(MLA_NPM_DIR) + "/../server_client.mjs";
  const std::string cmd =
      fmt::format("node {} http://127.0.0.1:{}/v1 {} {} {} {} 2>&1", script, port, kModel, kKey, mode, arg);
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return Json();
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  pclose(p);
  // The script prints one JSON line last (node may warn on earlier lines).
  const size_t nl = out.rfind("\n{");
  Json j = Json::parse(out.substr(nl == std::string::npos ? 0 : nl + 1), nullptr, false);
  if (j.is_discarded()) ADD_FAILURE() << "node output is not JSON:\n" << out;
  return j;
}

Json error_of(const HttpReply& r) {
  Json j = Json::parse(r.body, nullptr, false);
  if (j.is_discarded() || !j.contains("error")) return Json();
  return j["error"];
}

class ServerE2e : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new ServerProcess(fmt::format("--served-model-name {} --max-body-bytes 65536 --max-num-seqs 16 "
                                            "--num-kv-blocks 512 --max-model-len 512",
                                            kModel),
                                kKey);
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  static int port() { return server_->port(); }
  static HttpReply post(const std::string& path, const std::string& body) { return http(port(), "POST", path, body, kKey); }
  static std::string metrics() { return http(port(), "GET", "/metrics", "", kKey).body; }
  static ServerProcess* server_;
};
ServerProcess* ServerE2e::server_ = nullptr;

TEST_F(ServerE2e, StartsAndIsHealthy) {
  ASSERT_GT(port(), 0) << server_->log();
  EXPECT_EQ(http(port(), "GET", "/health").status, 200);  // no key needed
}

TEST_F(ServerE2e, OfficialOpenAiClient) {
  const Json r = run_node(port(), "basic");
  ASSERT_TRUE(r.is_object()) << r.dump();
  ASSERT_FALSE(r.contains("fatal")) << r.dump(2);
  EXPECT_EQ(r["models"], Json::array({kModel}));
  // Non-streaming and streaming greedy completions of the same prompt agree.
  EXPECT_EQ(r["completion"]["object"], "text_completion");
  EXPECT_EQ(r["completion"]["text"], r["completion_stream"]["text"]);
  EXPECT_FALSE(r["completion"]["text"].get<std::string>().empty());
  EXPECT_EQ(r["completion"]["usage"]["completion_tokens"], r["completion_stream"]["usage"]["completion_tokens"]);
  EXPECT_GT(r["completion_stream"]["usage"]["prompt_tokens"].get<int>(), 0);
  EXPECT_NE(r["completion_stream"]["finish_reason"], nullptr);
  ASSERT_TRUE(r["completion_logprobs"].is_object());
  EXPECT_EQ(r["completion_logprobs"]["tokens"].size(), 3u);
  EXPECT_EQ(r["completion_logprobs"]["token_logprobs"].size(), 3u);
  // Chat.
  EXPECT_EQ(r["chat"]["object"], "chat.completion");
  EXPECT_EQ(r["chat"]["message"]["role"], "assistant");
  EXPECT_EQ(r["chat"]["message"]["content"], r["chat_stream"]["content"]);
  EXPECT_EQ(r["chat_stream"]["role"], "assistant");
  EXPECT_EQ(r["chat"]["usage"]["total_tokens"], r["chat_stream"]["usage"]["total_tokens"]);
  EXPECT_TRUE(r["chat"]["finish_reason"] == "stop" || r["chat"]["finish_reason"] == "length") << r["chat"].dump();
  // Tools are accepted and rendered; this model writes plain text, so content comes back.
  EXPECT_TRUE(r["chat_tools"]["message"].contains("content")) << r["chat_tools"].dump();
  EXPECT_EQ(r["chat_tools"]["message"]["content"], r["chat_tools_stream"]["content"]);
  ASSERT_TRUE(r["chat_logprobs"].is_object()) << r.dump();
  ASSERT_EQ(r["chat_logprobs"]["content"].size(), 3u);
  EXPECT_EQ(r["chat_logprobs"]["content"][0]["top_logprobs"].size(), 2u);
  // Errors surface in the client as typed exceptions.
  EXPECT_EQ(r["unknown_model"]["status"], 404);
  EXPECT_EQ(r["unknown_model"]["code"], "model_not_found");
  EXPECT_EQ(r["bad_temperature"]["status"], 400);
  EXPECT_EQ(r["bad_temperature"]["param"], "temperature");
}

TEST_F(ServerE2e, RawSseStreamEndsWithDone) {
  const HttpReply r = post("/v1/completions",
                           R"({"model":"mla-test","prompt":"Hello","max_tokens":5,"stream":true,"temperature":0})");
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.headers.at("content-type").rfind("text/event-stream", 0), 0u);
  EXPECT_EQ(r.body.rfind("data: [DONE]\n\n"), r.body.size() - 14) << r.body;
  EXPECT_EQ(r.body.rfind("data: {", 0), 0u) << r.body;
}

struct BadCase {
  const char* route;
  std::string body;
  int status;
  const char* param;  // nullptr: not checked
  const char* code;   // nullptr: not checked
};

TEST_F(ServerE2e, EveryBadInputGetsAnOpenAiError) {
  const std::vector<BadCase> cases = {
      {"/v1/completions", "{not json", 400, "", nullptr},
      {"/v1/completions", "[1,2,3]", 400, "", nullptr},
      {"/v1/completions", "\"a string\"", 400, "", nullptr},
      {"/v1/completions", R"({"model":"mla-test"})", 400, "prompt", nullptr},
      {"/v1/completions", R"({"prompt":42})", 400, "prompt", nullptr},
      {"/v1/completions", R"({"prompt":"hi","max_tokens":"ten"})", 400, "max_tokens", nullptr},
      {"/v1/completions", R"({"prompt":"hi","max_tokens":0})", 400, "max_tokens", nullptr},
      {"/v1/completions", R"({"prompt":"hi","max_tokens":-5})", 400, "max_tokens", nullptr},
      {"/v1/completions", R"({"prompt":"hi","max_tokens":1.5})", 400, "max_tokens", nullptr},
      {"/v1/completions", R"({"prompt":"hi","temperature":-0.5})", 400, "temperature", nullptr},
      {"/v1/completions", R"({"prompt":"hi","temperature":"hot"})", 400, "temperature", nullptr},
      {"/v1/completions", R"({"prompt":"hi","top_p":0})", 400, "top_p", nullptr},
      {"/v1/completions", R"({"prompt":"hi","top_p":1.5})", 400, "top_p", nullptr},
      {"/v1/completions", R"({"prompt":"hi","top_k":-2})", 400, "top_k", nullptr},
      {"/v1/completions", R"({"prompt":"hi","min_p":2})", 400, "min_p", nullptr},
      {"/v1/completions", R"({"prompt":"hi","n":2})", 400, "n", nullptr},
      {"/v1/completions", R"({"prompt":"hi","n":0})", 400, "n", nullptr},
      {"/v1/completions", R"({"prompt":"hi","logprobs":21})", 400, "logprobs", nullptr},
      {"/v1/completions", R"({"prompt":"hi","logprobs":-1})", 400, "logprobs", nullptr},
      {"/v1/completions", R"({"prompt":"hi","min_tokens":-1})", 400, "min_tokens", nullptr},
      {"/v1/completions", R"({"prompt":"hi","min_tokens":50,"max_tokens":5})", 400, "min_tokens", nullptr},
      {"/v1/completions", R"({"prompt":"hi","stop":[1]})", 400, "stop", nullptr},
      {"/v1/completions", R"({"prompt":"hi","stream":"yes"})", 400, "stream", nullptr},
      {"/v1/completions", R"({"prompt":"hi","stream_options":{"include_usage":true}})", 400, "stream_options", nullptr},
      {"/v1/completions", R"({"prompt":"hi","seed":"x"})", 400, "seed", nullptr},
      {"/v1/completions", R"({"prompt":[1,2,99999]})", 400, "prompt", nullptr},
      {"/v1/completions", R"({"prompt":"hi","max_tokens":100000})", 400, "prompt", "context_length_exceeded"},
      {"/v1/completions", R"({"prompt":"hi","model":"gpt-4"})", 404, "model", "model_not_found"},
      {"/v1/chat/completions", R"({"messages":[]})", 400, "messages", nullptr},
      {"/v1/chat/completions", R"({"messages":"hi"})", 400, "messages", nullptr},
      {"/v1/chat/completions", R"({"messages":[{"role":"wizard","content":"hi"}]})", 400, "messages[0].role", nullptr},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":5}]})", 400, "messages[0].content", nullptr},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi"}],"top_logprobs":21,"logprobs":true})", 400,
       "top_logprobs", nullptr},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi"}],"logprobs":"yes"})", 400, "logprobs", nullptr},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi"}],"tools":{}})", 400, "tools", nullptr},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi"}],"max_completion_tokens":100000})", 400,
       "messages", "context_length_exceeded"},
  };
  for (const BadCase& c : cases) {
    const HttpReply r = post(c.route, c.body);
    EXPECT_EQ(r.status, c.status) << c.body << "\n" << r.raw;
    const Json e = error_of(r);
    ASSERT_TRUE(e.is_object()) << c.body << "\n" << r.raw;
    EXPECT_TRUE(e["message"].is_string() && !e["message"].get<std::string>().empty()) << r.body;
    EXPECT_TRUE(e.contains("type") && e.contains("param") && e.contains("code")) << r.body;
    if (c.param) {
      EXPECT_EQ(e["param"].is_null() ? std::string() : e["param"].get<std::string>(), c.param) << c.body << "\n" << r.body;
    }
    if (c.code) {
      EXPECT_EQ(e["code"], c.code) << r.body;
    }
    if (c.code && std::string(c.code) == "context_length_exceeded") {
      EXPECT_NE(e["message"].get<std::string>().find("512"), std::string::npos) << "names the token counts: " << r.body;
    }
  }
  // The server is unharmed.
  EXPECT_EQ(post("/v1/completions", R"({"prompt":"hi","max_tokens":2})").status, 200);
}

TEST_F(ServerE2e, MalformedAndOversizedHttp) {
  HttpReply r = raw_http(port(), "THIS IS NOT HTTP\r\n\r\n");
  EXPECT_EQ(r.status, 400) << r.raw;
  EXPECT_TRUE(error_of(r).is_object()) << r.raw;
  r = raw_http(port(), "GET /v1/models HTTP/9.9\r\n\r\n");
  EXPECT_EQ(r.status, 400) << r.raw;
  // Body over --max-body-bytes (64 KiB).
  const std::string big = R"({"prompt":")" + std::string(100000, 'a') + R"("})";
  r = post("/v1/completions", big);
  EXPECT_EQ(r.status, 413) << r.raw.substr(0, 300);
  EXPECT_TRUE(error_of(r).is_object());
  // Headers over the limit: many medium headers, and one header line over httplib's 8 KiB.
  std::string many;
  for (int i = 0; i < 40; ++i) many += fmt::format("X-Filler-{}: {}\r\n", i, std::string(500, 'h'));
  r = raw_http(port(), http_request("GET", "/v1/models", "", kKey, many));
  EXPECT_EQ(r.status, 431) << r.raw;
  r = raw_http(port(), http_request("GET", "/v1/models", "", kKey, "X-Huge: " + std::string(9000, 'h') + "\r\n"));
  EXPECT_EQ(r.status, 431) << r.raw;
  // Unknown route.
  r = http(port(), "GET", "/v2/nothing", "", kKey);
  EXPECT_EQ(r.status, 404);
  EXPECT_TRUE(error_of(r).is_object());
  EXPECT_EQ(http(port(), "GET", "/health").status, 200);
}

TEST_F(ServerE2e, ApiKeyOnEveryRouteButHealth) {
  for (const char* path : {"/v1/models", "/metrics"}) {
    EXPECT_EQ(http(port(), "GET", path).status, 401) << path;
    EXPECT_EQ(http(port(), "GET", path, "", "wrong-key").status, 401) << path;
    EXPECT_EQ(http(port(), "GET", path, "", kKey).status, 200) << path;
  }
  const HttpReply r = http(port(), "POST", "/v1/completions", R"({"prompt":"hi"})");
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(error_of(r)["code"], "invalid_api_key");
  EXPECT_EQ(http(port(), "GET", "/health").status, 200);
  // CORS is off unless asked.
  EXPECT_EQ(http(port(), "GET", "/v1/models", "", kKey).headers.count("access-control-allow-origin"), 0u);
}

TEST_F(ServerE2e, MetricsReportTheEngine) {
  ASSERT_EQ(post("/v1/completions", R"({"prompt":"The same long prompt to hit the prefix cache, twice over.","max_tokens":2})").status, 200);
  ASSERT_EQ(post("/v1/completions", R"({"prompt":"The same long prompt to hit the prefix cache, twice over.","max_tokens":2})").status, 200);
  const std::string m = metrics();
  for (const char* name : {"mlaserve:num_requests_running", "mlaserve:num_requests_waiting", "mlaserve:kv_cache_usage_perc",
                           "mlaserve:prefix_cache_hit_rate", "mlaserve:prompt_tokens_total",
                           "mlaserve:generation_tokens_total", "mlaserve:num_preemptions_total",
                           "mlaserve:time_to_first_token_seconds_bucket", "mlaserve:inter_token_latency_seconds_bucket"})
    EXPECT_NE(m.find(name), std::string::npos) << name << "\n" << m;
  EXPECT_GT(metric(m, "mlaserve:generation_tokens_total").value_or(0), 0);
  EXPECT_GT(metric(m, "mlaserve:prefix_cache_hits_total").value_or(0), 0) << m;
}

// Waits until no request holds KV blocks.
bool blocks_drain(int port_) {
  for (int i = 0; i < 100; ++i) {
    const std::string m = http(port_, "GET", "/metrics", "", kKey).body;
    if (metric(m, "mlaserve:kv_cache_blocks_used") == 0.0 && metric(m, "mlaserve:num_requests_running") == 0.0 &&
        metric(m, "mlaserve:num_requests_waiting") == 0.0)
      return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

TEST_F(ServerE2e, DisconnectsAbortAndNothingLeaks) {
  // Non-streaming request whose client goes away: the server notices and aborts it.
  const double before = metric(metrics(), "mlaserve:http_client_disconnects_total").value_or(-1);
  const int fd = connect_local(port());
  ASSERT_GE(fd, 0);
  send_all(fd, http_request("POST", "/v1/completions", R"({"prompt":"hi","max_tokens":400,"ignore_eos":true})", kKey));
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  close(fd);
  bool counted = false;
  for (int i = 0; i < 60 && !counted; ++i) {
    counted = metric(metrics(), "mlaserve:http_client_disconnects_total").value_or(-1) > before;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(counted) << metrics();
  // 200 streamed requests (40 under the sanitizers), a third cancelled mid-stream by the official
  // client. The cancelled ones ask for 400 tokens: had they not been aborted, their blocks would stay
  // in use for many seconds.
  const int requests = stress_size(200, 40);
  const double disconnects = metric(metrics(), "mlaserve:http_client_disconnects_total").value_or(-1);
  const Json r = run_node(port(), "leak", std::to_string(requests));
  ASSERT_TRUE(r.is_object());
  EXPECT_EQ(r.value("failed", -1), 0) << r.dump();
  EXPECT_EQ(r.value("ok", 0) + r.value("cancelled", 0), requests) << r.dump();
  EXPECT_TRUE(blocks_drain(port())) << metrics();
  EXPECT_GE(metric(metrics(), "mlaserve:http_client_disconnects_total").value_or(-1) - disconnects, r.value("cancelled", 0))
      << metrics();
  EXPECT_EQ(post("/v1/completions", R"({"prompt":"still alive?","max_tokens":3})").status, 200);
  EXPECT_EQ(http(port(), "GET", "/health").status, 200);
}

// The port opens before the model loads: /health says 503 "loading" until the startup probe
// generation worked, then 200. (If loading wins the race, only the 200 half is checked.)
TEST(ServerE2eLoading, HealthIs503WhileLoadingThen200) {
  ServerProcess s(fmt::format("--served-model-name {}", kModel), "", /*wait_ready=*/false);
  ASSERT_GT(s.port(), 0) << s.log();
  const HttpReply first = http(s.port(), "GET", "/health");
  if (first.status == 503) {
    EXPECT_EQ(error_of(first)["code"], "loading") << first.raw;
    const HttpReply gen = http(s.port(), "POST", "/v1/completions", R"({"prompt":"hi","max_tokens":2})");
    EXPECT_TRUE(gen.status == 503 || gen.status == 200) << gen.raw;
  } else {
    EXPECT_EQ(first.status, 200) << first.raw;
  }
  int status = 0;
  for (int i = 0; i < 200 && status != 200; ++i) {
    status = http(s.port(), "GET", "/health").status;
    if (status != 200) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(status, 200);
}

TEST(ServerE2eQueue, FullQueueAnswers429WithRetryAfter) {
  ServerProcess s(fmt::format("--served-model-name {} --max-num-seqs 1 --max-queue 1", kModel));
  ASSERT_GT(s.port(), 0) << s.log();
  // The first request must still run when the fourth arrives ~90 ms later: 250 tokens take seconds
  // in the plain build; the sanitized one decodes ~10x slower.
  const std::string body = fmt::format(R"({{"prompt":"hi","max_tokens":{},"ignore_eos":true,"temperature":0}})",
                                       stress_size(250, 40));
  std::vector<HttpReply> replies(4);
  std::vector<std::thread> ts;
  for (int i = 0; i < 4; ++i) {
    ts.emplace_back([&, i] { replies[size_t(i)] = http(s.port(), "POST", "/v1/completions", body); });
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
  }
  for (auto& t : ts) t.join();
  int ok = 0, full = 0;
  for (const HttpReply& r : replies) {
    if (r.status == 200) ++ok;
    if (r.status == 429) {
      ++full;
      EXPECT_TRUE(r.headers.count("retry-after")) << r.raw;
      EXPECT_TRUE(error_of(r).is_object()) << r.raw;
    }
  }
  EXPECT_GE(ok, 1);
  EXPECT_GE(full, 1);
  EXPECT_EQ(ok + full, 4);
}

TEST(ServerE2eLifecycle, SigtermDrainsInFlightRejectsNewAndExits) {
  ServerProcess s(fmt::format("--served-model-name {} --cors-origin https://example.test", kModel));
  ASSERT_GT(s.port(), 0) << s.log();
  // CORS when asked: preflight and the header on responses.
  HttpReply pre = raw_http(s.port(), "OPTIONS /v1/completions HTTP/1.1\r\nHost: x\r\nOrigin: https://example.test\r\n"
                                     "Access-Control-Request-Method: POST\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(pre.status, 204) << pre.raw;
  EXPECT_EQ(pre.headers["access-control-allow-origin"], "https://example.test");
  // An in-flight streaming request, still running 400 ms in when the late request arrives (1000
  // tokens in the plain build; the sanitized one decodes ~10x slower).
  HttpReply inflight;
  const std::string long_body = fmt::format(
      R"({{"prompt":"hi","max_tokens":{},"ignore_eos":true,"stream":true,"temperature":0}})", stress_size(1000, 100));
  std::thread t([&] { inflight = http(s.port(), "POST", "/v1/completions", long_body); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_EQ(kill(s.pid(), SIGTERM), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const HttpReply late = http(s.port(), "POST", "/v1/completions", R"({"prompt":"hi","max_tokens":2})");
  EXPECT_EQ(late.status, 503) << late.raw;  // still listening: the in-flight request is not done
  if (late.status == 503) {
    EXPECT_TRUE(error_of(late).is_object());
  }
  t.join();
  EXPECT_EQ(inflight.status, 200) << inflight.raw.substr(0, 500);
  EXPECT_NE(inflight.body.find("data: [DONE]"), std::string::npos);
  EXPECT_NE(inflight.body.find("\"finish_reason\":\"length\""), std::string::npos) << inflight.body.substr(0, 300);
  EXPECT_EQ(s.wait_exit(), std::optional<int>(0));
}

}  // namespace
}  // namespace mla::test

namespace mla::test {
namespace {

TEST(ChatCommand, StreamsRepliesAndKeepsHistory) {
  const std::string cmd = fmt::format("printf 'Hello\\nAnd then?\\n/reset\\nAgain\\n' | {} chat --model {} --max-tokens 6 "
                                      "--seed 3 2>&1",
                                      MLA_BINARY, default_model_dir());
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int st = pclose(p);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << out;
  EXPECT_NE(out.find("(history cleared)"), std::string::npos) << out;
  // Three replies, each ending its line (the model may write newlines too), plus the reset note.
  size_t lines = 0;
  for (char c : out) lines += c == '\n';
  EXPECT_GE(lines, 4u) << out;
  EXPECT_EQ(out.find("\x1b["), std::string::npos) << out;
}

}  // namespace
}  // namespace mla::test
