// Load generator: prompts, request bodies, one streamed request over cpp-httplib (SSE parsed as it
// arrives, each non-empty chunk timestamped), and the worker pools of the sweep and rate modes.
#include "bench/loadgen.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include <fmt/format.h>
#include <httplib.h>

namespace mla::bench {

namespace {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// "http://h:p", "http://h:p/", "http://h:p/v1" -> "http://h:p" (the endpoint carries the /v1).
std::string base_url(std::string url) {
  while (!url.empty() && url.back() == '/') url.pop_back();
  if (url.size() >= 3 && url.compare(url.size() - 3, 3, "/v1") == 0) url.resize(url.size() - 3);
  return url;
}

bool is_chat(const LoadgenConfig& cfg) { return cfg.endpoint.find("chat") != std::string::npos; }

// Common short English words: with BPE tokenizers " word" is one token, so a text of N words is
// about N tokens. The exact count is read back from the server's usage.
constexpr const char* kWords[] = {
    "the", "of", "and", "to", "in", "is", "you", "that", "it", "he", "was", "for", "on", "are", "as", "with",
    "his", "they", "at", "be", "this", "have", "from", "or", "one", "had", "by", "word", "but", "not", "what",
    "all", "were", "we", "when", "your", "can", "said", "there", "use", "an", "each", "which", "she", "do",
    "how", "their", "if", "will", "up", "other", "about", "out", "many", "then", "them", "these", "so",
    "some", "her", "would", "make", "like", "him", "into", "time", "has", "look", "two", "more", "write",
    "go", "see", "number", "no", "way", "could", "people", "my", "than", "first", "water", "been", "call",
    "who", "oil", "its", "now", "find", "long", "down", "day", "did", "get", "come", "made", "may", "part"};
constexpr size_t kNumWords = sizeof(kWords) / sizeof(kWords[0]);

// Incremental SSE parsing and timing of one streamed response.
struct StreamState {
  bool chat = false;
  Clock::time_point t0;
  std::string buffer;        // bytes not yet forming a whole event
  std::string error_body;    // the body of a non-200 answer
  int status = 0;
  bool done = false;         // saw data: [DONE]
  bool have_first = false;
  double last_token = 0;
  int64_t chunks = 0;        // non-empty chunks
  std::optional<int64_t> usage_prompt, usage_completion;
  std::string stream_error;  // an {"error": ...} event
  RequestResult* out = nullptr;

  void on_data(std::string_view payload) {
    if (payload == "[DONE]") {
      done = true;
      return;
    }
    const Json j = Json::parse(payload, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return;
    if (j.contains("error")) {
      const Json& e = j["error"];
      stream_error = e.is_object() && e.contains("message") && e["message"].is_string()
                         ? e["message"].get<std::string>()
                         : e.dump();
      return;
    }
    if (const auto u = j.find("usage"); u != j.end() && u->is_object()) {
      if (const auto p = u->find("prompt_tokens"); p != u->end() && p->is_number_integer()) usage_prompt = p->get<int64_t>();
      if (const auto c = u->find("completion_tokens"); c != u->end() && c->is_number_integer())
        usage_completion = c->get<int64_t>();
    }
    const auto choices = j.find("choices");
    if (choices == j.end() || !choices->is_array() || choices->empty() || !(*choices)[0].is_object()) return;
    const Json& c = (*choices)[0];
    bool content = false;
    auto non_empty = [](const Json& o, const char* k) {
      const auto it = o.find(k);
      return it != o.end() && it->is_string() && !it->get_ref<const std::string&>().empty();
    };
    if (chat) {
      const auto d = c.find("delta");
      content = d != c.end() && d->is_object() && (non_empty(*d, "content") || non_empty(*d, "reasoning_content"));
    } else {
      content = non_empty(c, "text");
    }
    if (!content) return;
    const double t = seconds_since(t0);
    if (!have_first) {
      have_first = true;
      out->ttft = t;
    } else {
      out->itl.push_back(t - last_token);
    }
    last_token = t;
    ++chunks;
  }

  void feed(const char* data, size_t n) {
    if (status != 200) {
      if (error_body.size() < 2000) error_body.append(data, std::min<size_t>(n, 2000));
      return;
    }
    buffer.append(data, n);
    // Events end with a blank line; accept \r\n line ends too.
    for (;;) {
      size_t end = buffer.find("\n\n");
      size_t skip = 2;
      const size_t crlf = buffer.find("\r\n\r\n");
      if (crlf != std::string::npos && (end == std::string::npos || crlf < end)) {
        end = crlf;
        skip = 4;
      }
      if (end == std::string::npos) break;
      const std::string event = buffer.substr(0, end);
      buffer.erase(0, end + skip);
      size_t pos = 0;
      while (pos <= event.size()) {
        size_t eol = event.find('\n', pos);
        if (eol == std::string::npos) eol = event.size();
        std::string_view line(event.data() + pos, eol - pos);
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        if (line.rfind("data:", 0) == 0) {
          line.remove_prefix(5);
          if (!line.empty() && line.front() == ' ') line.remove_prefix(1);
          on_data(line);
        }
        pos = eol + 1;
      }
    }
  }
};

RequestResult send_with(httplib::Client& cli, const LoadgenConfig& cfg, const Prompt& p) {
  RequestResult r;
  r.prompt_len = p.ids.empty() ? cfg.input_len : int64_t(p.ids.size());
  StreamState st;
  st.chat = is_chat(cfg);
  st.out = &r;
  httplib::Request req;
  req.method = "POST";
  req.path = cfg.endpoint;
  req.body = request_body(cfg, p).dump();
  req.set_header("Content-Type", "application/json");
  req.set_header("Accept", "text/event-stream");
  if (!cfg.api_key.empty()) req.set_header("Authorization", "Bearer " + cfg.api_key);
  req.response_handler = [&st](const httplib::Response& res) {
    st.status = res.status;
    return true;
  };
  req.content_receiver = [&st](const char* data, size_t n, uint64_t, uint64_t) {
    st.feed(data, n);
    return true;
  };
  st.t0 = Clock::now();
  const httplib::Result res = cli.send(req);
  r.latency = seconds_since(st.t0);
  if (!res) {
    r.error = "request failed: " + httplib::to_string(res.error());
  } else if (st.status != 200) {
    r.error = fmt::format("HTTP {}: {}", st.status, st.error_body.substr(0, 500));
  } else if (!st.stream_error.empty()) {
    r.error = "stream error: " + st.stream_error;
  } else if (!st.have_first) {
    r.error = "the stream carried no output token";
  } else if (!st.done) {
    r.error = "the stream ended without data: [DONE] (cut off?)";
  } else {
    r.success = true;
    if (st.usage_prompt) r.prompt_len = *st.usage_prompt;
    r.output_len = st.usage_completion.value_or(st.chunks);
  }
  if (!r.success) {
    r.ttft = 0;
    r.itl.clear();
  }
  return r;
}

std::unique_ptr<httplib::Client> make_client(const LoadgenConfig& cfg) {
  auto cli = std::make_unique<httplib::Client>(base_url(cfg.url));
  cli->set_keep_alive(true);
  cli->set_tcp_nodelay(true);  // small SSE writes and our small requests: no Nagle delay in the timings
  cli->set_connection_timeout(10, 0);
  const auto t = std::chrono::duration<double>(cfg.timeout_s);
  cli->set_read_timeout(std::chrono::duration_cast<std::chrono::microseconds>(t));
  cli->set_write_timeout(60, 0);
  return cli;
}

// The server's counters from GET /metrics (with the API key), or nullopt (none, or not reachable).
std::optional<ServerCounters> scrape_counters(const LoadgenConfig& cfg) {
  auto cli = make_client(cfg);
  cli->set_read_timeout(10, 0);
  httplib::Headers h;
  if (!cfg.api_key.empty()) h.emplace("Authorization", "Bearer " + cfg.api_key);
  const httplib::Result r = cli->Get("/metrics", h);
  if (!r || r->status != 200) return std::nullopt;
  return parse_prometheus_counters(r->body);
}

// A point with the server's own figures for it when /metrics offers them.
PointSummary measured_point(const LoadgenConfig& cfg, std::optional<int> concurrency, int num_prompts, uint64_t seed,
                            const ProgressFn& progress) {
  const std::optional<ServerCounters> before = scrape_counters(cfg);
  PointSummary s = run_point(cfg, concurrency, num_prompts, seed, progress);
  if (before) {
    if (const std::optional<ServerCounters> after = scrape_counters(cfg)) {
      ServerPointStats st = server_point_stats(*before, *after, s.duration);
      if (st.has_engine || st.has_spec) s.server = st;
    }
  }
  return s;
}

}  // namespace

std::vector<Prompt> make_prompts(const LoadgenConfig& cfg, int count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> id(cfg.token_id_min, cfg.token_id_max - 1);
  std::uniform_int_distribution<size_t> word(0, kNumWords - 1);
  std::vector<Prompt> prompts(size_t(std::max(count, 0)));
  for (Prompt& p : prompts) {
    if (cfg.prompt_format == PromptFormat::Ids) {
      p.ids.resize(size_t(cfg.input_len));
      for (int32_t& t : p.ids) t = id(rng);
    } else {
      for (int64_t i = 0; i < cfg.input_len; ++i) {
        if (i) p.text += ' ';
        p.text += kWords[word(rng)];
      }
    }
  }
  return prompts;
}

std::vector<double> poisson_arrivals(int count, double rate, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> gap(rate);
  std::vector<double> t(size_t(std::max(count, 0)));
  double now = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    if (i) now += gap(rng);
    t[i] = now;
  }
  return t;
}

nlohmann::json request_body(const LoadgenConfig& cfg, const Prompt& p) {
  Json b{{"model", cfg.model},
         {"max_tokens", cfg.output_len},
         {"min_tokens", cfg.output_len},
         {"ignore_eos", true},
         {"temperature", 0},
         {"stream", true},
         {"stream_options", {{"include_usage", true}}}};
  if (is_chat(cfg)) {
    b["messages"] = Json::array({Json{{"role", "user"}, {"content", p.text}}});
  } else if (!p.ids.empty()) {
    b["prompt"] = p.ids;
  } else {
    b["prompt"] = p.text;
  }
  return b;
}

RequestResult send_request(const LoadgenConfig& cfg, const Prompt& p) {
  auto cli = make_client(cfg);
  return send_with(*cli, cfg, p);
}

int prompts_for_point(const LoadgenConfig& cfg, std::optional<int> concurrency) {
  if (cfg.num_prompts > 0) return cfg.num_prompts;
  return std::max(16, 8 * concurrency.value_or(2));
}

PointSummary run_point(const LoadgenConfig& cfg, std::optional<int> concurrency, int num_prompts, uint64_t seed,
                       const ProgressFn& progress) {
  const std::vector<Prompt> prompts = make_prompts(cfg, num_prompts, seed);
  std::vector<double> arrivals;
  if (cfg.request_rate) arrivals = poisson_arrivals(num_prompts, *cfg.request_rate, seed ^ 0x9e3779b97f4a7c15ull);
  const int workers =
      std::max(1, std::min(num_prompts, concurrency.value_or(cfg.request_rate ? cfg.max_rate_workers : 1)));
  std::vector<RequestResult> results(static_cast<size_t>(num_prompts));
  std::atomic<int> next{0};
  std::mutex progress_mu;
  int done = 0;
  std::vector<double> ends(static_cast<size_t>(num_prompts), 0.0);
  const Clock::time_point start = Clock::now();
  auto worker = [&] {
    auto cli = make_client(cfg);
    for (;;) {
      const int i = next.fetch_add(1);
      if (i >= num_prompts) return;
      if (!arrivals.empty())
        std::this_thread::sleep_until(start + std::chrono::duration_cast<Clock::duration>(
                                                  std::chrono::duration<double>(arrivals[size_t(i)])));
      const double sent = seconds_since(start);
      RequestResult r = send_with(*cli, cfg, prompts[size_t(i)]);
      r.start = sent;
      ends[size_t(i)] = seconds_since(start);
      results[size_t(i)] = std::move(r);
      std::lock_guard<std::mutex> lock(progress_mu);
      ++done;
      if (progress) progress(done, num_prompts);
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(size_t(workers));
  for (int w = 0; w < workers; ++w) threads.emplace_back(worker);
  for (std::thread& t : threads) t.join();
  const double duration = ends.empty() ? 0.0 : *std::max_element(ends.begin(), ends.end());
  return summarize_point(std::move(results), duration, concurrency,
                         cfg.request_rate ? std::optional<double>(*cfg.request_rate) : std::nullopt);
}

Status validate_config(const LoadgenConfig& cfg) {
  if (cfg.url.rfind("http://", 0) != 0 && cfg.url.rfind("https://", 0) != 0)
    return error("--url: \"{}\" must start with http:// or https://", cfg.url);
  if (cfg.model.empty()) return error("--model: the served model name is required");
  if (cfg.endpoint.empty() || cfg.endpoint[0] != '/') return error("--endpoint: \"{}\" must start with /", cfg.endpoint);
  if (cfg.input_len < 1) return error("--input-len: must be at least 1 (got {})", cfg.input_len);
  if (cfg.output_len < 1) return error("--output-len: must be at least 1 (got {})", cfg.output_len);
  if (cfg.num_prompts < 0) return error("--num-prompts: must not be negative (got {})", cfg.num_prompts);
  if (cfg.warmup < 0) return error("--warmup: must not be negative (got {})", cfg.warmup);
  for (int c : cfg.concurrency)
    if (c < 1 || c > 100000) return error("--concurrency: {} is outside [1, 100000]", c);
  if (cfg.request_rate) {
    if (!(*cfg.request_rate > 0)) return error("--request-rate: must be positive (got {})", *cfg.request_rate);
    if (cfg.concurrency.size() > 1) return error("--request-rate takes at most one --concurrency value (a cap)");
  } else if (cfg.concurrency.empty()) {
    return error("--concurrency: give at least one value");
  }
  if (is_chat(cfg) && cfg.prompt_format == PromptFormat::Ids)
    return error("--prompt-format ids needs a completions endpoint (token-id prompts); use --prompt-format text with {}",
                 cfg.endpoint);
  if (cfg.token_id_min < 0 || cfg.token_id_min >= cfg.token_id_max)
    return error("--token-ids: need 0 <= min < max (got {}:{})", cfg.token_id_min, cfg.token_id_max);
  if (!(cfg.timeout_s > 0)) return error("--timeout: must be positive");
  return Status::ok();
}

Result<std::vector<PointSummary>> run_benchmark(const LoadgenConfig& cfg,
                                                const std::function<ProgressFn(int point)>& progress) {
  MLA_RETURN_IF_ERROR(validate_config(cfg));
  if (cfg.warmup > 0) {
    // Warm-up prompts come from another seed so they never share a prefix with measured ones.
    LoadgenConfig w = cfg;
    w.request_rate.reset();
    const int c = std::min(cfg.warmup, cfg.concurrency.empty() ? 1 : cfg.concurrency.front());
    PointSummary s = run_point(w, c, cfg.warmup, cfg.seed ^ 0xabcdef1234567ull);
    if (s.completed == 0)
      return error("every warm-up request failed; first error: {}",
                   s.requests.empty() ? std::string("none") : s.requests.front().error);
  }
  std::vector<PointSummary> points;
  if (cfg.request_rate) {
    const std::optional<int> cap =
        cfg.concurrency.empty() ? std::nullopt : std::optional<int>(cfg.concurrency.front());
    points.push_back(
        measured_point(cfg, cap, prompts_for_point(cfg, cap), cfg.seed, progress ? progress(0) : ProgressFn{}));
    return points;
  }
  for (size_t i = 0; i < cfg.concurrency.size(); ++i) {
    const int c = cfg.concurrency[i];
    // Each point gets its own prompts (seed + i): no prefix-cache reuse across points.
    points.push_back(
        measured_point(cfg, c, prompts_for_point(cfg, c), cfg.seed + i, progress ? progress(int(i)) : ProgressFn{}));
  }
  return points;
}

}  // namespace mla::bench
