// A fake OpenAI completions server on loopback for the load-generator tests: it streams SSE with
// known delays (first token after `ttft_s`, then one token every `itl_s`), records every request
// body and counts requests in flight, so the bench arithmetic can be checked against known timings.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

namespace mla::test {

struct FakeServerOptions {
  double ttft_s = 0.05;       // request arrival -> first token
  double itl_s = 0.01;        // between tokens
  int tokens = 0;             // tokens per response; 0: the request's max_tokens
  bool send_usage = true;     // final usage chunk (stream_options.include_usage)
  bool send_done = true;      // the final "data: [DONE]"
  int fail_every = 0;         // > 0: every n-th request (1-based) answers HTTP 400
  // /metrics: per streamed token the fake "engine" counts one step of forward_s (step_s in all) and,
  // per request, one speculative round of 3 drafts with 2 accepted (positions 0 and 1).
  bool metrics = false;
  double forward_s = 0.008, step_s = 0.009;
};

class FakeOpenAiServer {
 public:
  explicit FakeOpenAiServer(FakeServerOptions o) : opts_(o) {
    svr_.set_tcp_nodelay(true);
    svr_.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) { handle(req, res); });
    if (opts_.metrics)
      svr_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
        std::lock_guard<std::mutex> lock(mu_);
        std::string t = "# HELP mlaserve:engine_steps_total Engine steps.\n# TYPE mlaserve:engine_steps_total counter\n";
        t += "mlaserve:engine_steps_total{model_name=\"fake\"} " + std::to_string(steps_) + "\n";
        t += "mlaserve:engine_forward_seconds_total{model_name=\"fake\"} " + std::to_string(steps_ * opts_.forward_s) + "\n";
        t += "mlaserve:engine_step_seconds_total{model_name=\"fake\"} " + std::to_string(steps_ * opts_.step_s) + "\n";
        t += "vllm:spec_decode_num_drafts_total{model_name=\"fake\"} " + std::to_string(rounds_) + "\n";
        t += "vllm:spec_decode_num_draft_tokens_total{model_name=\"fake\"} " + std::to_string(3 * rounds_) + "\n";
        t += "vllm:spec_decode_num_accepted_tokens_total{model_name=\"fake\"} " + std::to_string(2 * rounds_) + "\n";
        for (int pos = 0; pos < 3; ++pos)
          t += "vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"fake\",position=\"" + std::to_string(pos) +
               "\"} " + std::to_string(pos < 2 ? rounds_ : 0) + "\n";
        res.set_content(t, "text/plain; version=0.0.4");
      });
    port_ = svr_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { svr_.listen_after_bind(); });
    while (!svr_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~FakeOpenAiServer() {
    svr_.stop();
    thread_.join();
  }
  FakeOpenAiServer(const FakeOpenAiServer&) = delete;
  FakeOpenAiServer& operator=(const FakeOpenAiServer&) = delete;

  int port() const { return port_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int max_in_flight() const { return max_in_flight_.load(); }
  void reset_max_in_flight() { max_in_flight_ = 0; }
  std::vector<nlohmann::json> bodies() const {
    std::lock_guard<std::mutex> lock(mu_);
    return bodies_;
  }

 private:
  void handle(const httplib::Request& req, httplib::Response& res) {
    const nlohmann::json body = nlohmann::json::parse(req.body, nullptr, false);
    int n = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      bodies_.push_back(body);
      n = int(bodies_.size());
    }
    if (opts_.fail_every > 0 && n % opts_.fail_every == 0) {
      res.status = 400;
      res.set_content(R"({"error":{"message":"fake failure","type":"invalid_request_error"}})", "application/json");
      return;
    }
    const int tokens = opts_.tokens > 0 ? opts_.tokens : body.value("max_tokens", 16);
    const int prompt_tokens = body.contains("prompt") && body["prompt"].is_array() ? int(body["prompt"].size()) : 7;
    const auto arrived = std::chrono::steady_clock::now();
    const int now_in = ++in_flight_;
    int prev = max_in_flight_.load();
    while (prev < now_in && !max_in_flight_.compare_exchange_weak(prev, now_in)) {
    }
    res.set_chunked_content_provider(
        "text/event-stream", [this, tokens, prompt_tokens, arrived](size_t, httplib::DataSink& sink) {
          auto event = [&sink](const nlohmann::json& j) {
            const std::string s = "data: " + j.dump() + "\n\n";
            sink.write(s.data(), s.size());
          };
          // Deadlines from the arrival, so the delays do not accumulate scheduling overshoot.
          for (int i = 0; i < tokens; ++i) {
            std::this_thread::sleep_until(arrived + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                        std::chrono::duration<double>(opts_.ttft_s + i * opts_.itl_s)));
            nlohmann::json choice{{"index", 0}, {"text", "t"}, {"finish_reason", nullptr}};
            if (i + 1 == tokens) choice["finish_reason"] = "length";
            event({{"object", "text_completion"}, {"choices", nlohmann::json::array({choice})}});
          }
          if (opts_.send_usage)
            event({{"object", "text_completion"},
                   {"choices", nlohmann::json::array()},
                   {"usage", {{"prompt_tokens", prompt_tokens}, {"completion_tokens", tokens}}}});
          const std::string done = "data: [DONE]\n\n";
          if (opts_.send_done) sink.write(done.data(), done.size());
          --in_flight_;
          {
            std::lock_guard<std::mutex> lock(mu_);
            steps_ += tokens;
            ++rounds_;
          }
          sink.done();
          return true;
        });
  }

  FakeServerOptions opts_;
  httplib::Server svr_;
  std::thread thread_;
  int port_ = -1;
  std::atomic<int> in_flight_{0}, max_in_flight_{0};
  mutable std::mutex mu_;
  std::vector<nlohmann::json> bodies_;
  long steps_ = 0, rounds_ = 0;  // /metrics counters (under mu_)
};

}  // namespace mla::test
