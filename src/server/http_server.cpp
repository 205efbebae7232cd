// HTTP routes and lifecycle of the OpenAI-compatible server (see http_server.h). httplib gives one
// pool thread per connection; a generation route submits to the engine and then blocks on the
// request's stream, polling the client's socket between deltas so a vanished client aborts its
// request (and frees its KV blocks) within ~100 ms, streaming or not.
#include "server/http_server.h"

#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <random>
#include <thread>

#include <fmt/format.h>
#include <httplib.h>

#include "server/metrics_text.h"
#include "server/openai_response.h"

namespace mla::server {

namespace {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;
constexpr std::chrono::milliseconds kPoll{100};  // client-liveness check period while waiting for tokens

enum class State { Loading, Ready, Failed, Draining, Stopped };

// The server-side socket of the connection a request arrived on, found by its (local, peer) ports.
// httplib 0.11 does not expose it to handlers; the fd stays valid while the handler (and its
// content provider) runs, because httplib closes a connection only after its response is written.
class PeerWatch {
 public:
  static PeerWatch find(const httplib::Request& req) {
    PeerWatch w;
    DIR* d = opendir("/proc/self/fd");
    if (!d) return w;
    while (dirent* e = readdir(d)) {
      char* end = nullptr;
      const long fd = std::strtol(e->d_name, &end, 10);
      if (end == e->d_name || *end != '\0' || fd < 0 || fd == dirfd(d)) continue;
      sockaddr_storage local{}, peer{};
      socklen_t ll = sizeof(local), pl = sizeof(peer);
      if (getsockname(int(fd), reinterpret_cast<sockaddr*>(&local), &ll) != 0) continue;
      if (getpeername(int(fd), reinterpret_cast<sockaddr*>(&peer), &pl) != 0) continue;
      if (port_of(local) == req.local_port && port_of(peer) == req.remote_port) {
        w.fd_ = int(fd);
        break;
      }
    }
    closedir(d);
    return w;
  }
  // False once the peer closed or reset the connection. Unknown sockets count as alive.
  bool alive() const {
    if (fd_ < 0) return true;
    pollfd p{fd_, short(POLLIN | POLLRDHUP), 0};
    if (poll(&p, 1, 0) <= 0) return true;
    if (p.revents & (POLLERR | POLLHUP | POLLRDHUP | POLLNVAL)) return false;
    if (p.revents & POLLIN) {
      char c;
      const ssize_t n = recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
      return n != 0;  // 0: orderly shutdown; > 0: a pipelined request; < 0: nothing yet
    }
    return true;
  }

 private:
  static int port_of(const sockaddr_storage& a) {
    if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port);
    if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(a).sin6_port);
    return -1;
  }
  int fd_ = -1;
};

// Rate-limits PeerWatch::alive() to one poll per kPoll while tokens keep arriving.
class LivenessCheck {
 public:
  explicit LivenessCheck(PeerWatch w) : watch_(w), next_(Clock::now() + kPoll) {}
  bool alive() {
    const auto now = Clock::now();
    if (now < next_) return true;
    next_ = now + kPoll;
    return watch_.alive();
  }

 private:
  PeerWatch watch_;
  Clock::time_point next_;
};

// Constant-time comparison of the presented API key.
bool keys_equal(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i % (b.empty() ? 1 : b.size())]);
  return diff == 0 && !b.empty();
}

std::string random_hex(size_t n) {
  thread_local std::mt19937_64 gen{std::random_device{}()};
  static const char* const kHex = "0123456789abcdef";
  std::string s(n, '0');
  for (char& c : s) c = kHex[gen() & 15];
  return s;
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

struct Server::Impl {
  ServerOptions opt;
  httplib::Server http;
  std::thread listener;
  std::atomic<State> state{State::Loading};
  std::mutex mu;  // guards fail_reason, ctx publication, health probe state
  std::string fail_reason;
  std::atomic<runtime::Engine*> engine{nullptr};
  ModelContext ctx;
  std::atomic<int> inflight{0};
  std::atomic<uint64_t> client_disconnects{0}, rejected_queue_full{0}, errors_4xx{0}, errors_5xx{0};
  int bound_port = -1;
  // /health: the last proof that a generation worked.
  std::mutex health_mu;
  Clock::time_point last_healthy{};
  int64_t last_generated = -1;
  std::once_flag stop_once;

  explicit Impl(ServerOptions o) : opt(std::move(o)) {
    // SSE deltas are small writes: under Nagle each waits for the client's delayed ACK (up to ~40 ms).
    http.set_tcp_nodelay(true);
  }

  // ---- responses ----
  void send_error(httplib::Response& res, const ApiError& e) {
    res.status = e.status;
    if (e.retry_after_s > 0) res.set_header("Retry-After", std::to_string(e.retry_after_s));
    if (e.status == 429) ++rejected_queue_full;
    (e.status >= 500 ? errors_5xx : errors_4xx)++;
    res.set_content(e.body(), "application/json");
  }
  void send_json(httplib::Response& res, const Json& j) { res.set_content(dump_json(j), "application/json"); }

  std::optional<ApiError> not_ready() {
    switch (state.load()) {
      case State::Ready: return std::nullopt;
      case State::Loading: return ApiError{503, "the model is loading", "service_unavailable", "", "loading", 5};
      case State::Failed: {
        std::lock_guard<std::mutex> lk(mu);
        return ApiError{503, "the model failed to load: " + fail_reason, "service_unavailable", "", "load_failed"};
      }
      case State::Draining:
      case State::Stopped: return ApiError{503, "the server is shutting down", "service_unavailable", "", "shutting_down"};
    }
    return std::nullopt;
  }

  size_t header_bytes(const httplib::Request& req) const {
    size_t n = req.method.size() + req.target.size() + req.version.size() + 4;
    for (const auto& [k, v] : req.headers) n += k.size() + v.size() + 4;
    return n;
  }

  // Limits and auth, shared by every route. Returns false when it answered.
  bool admit(const httplib::Request& req, httplib::Response& res, bool need_auth) {
    if (header_bytes(req) > opt.max_header_bytes) {
      send_error(res, ApiError{431, fmt::format("request headers exceed {} bytes", opt.max_header_bytes),
                               "invalid_request_error", "", "headers_too_large"});
      return false;
    }
    if (need_auth && !opt.api_key.empty()) {
      const std::string auth = req.get_header_value("Authorization");
      const std::string prefix = "Bearer ";
      const bool ok = auth.size() > prefix.size() && auth.compare(0, prefix.size(), prefix) == 0 &&
                      keys_equal(auth.substr(prefix.size()), opt.api_key);
      if (!ok) {
        send_error(res, ApiError{401, "invalid or missing API key (Authorization: Bearer KEY)", "invalid_request_error",
                                 "", "invalid_api_key"});
        return false;
      }
    }
    return true;
  }

  // ---- /health ----
  // True when a real generation worked recently: the engine produced tokens since the last check,
  // or a one-token probe request completes now.
  bool probe_generation(runtime::Engine& eng, std::string* why) {
    std::lock_guard<std::mutex> lk(health_mu);
    if (!eng.healthy()) return *why = "the engine thread failed", false;
    const auto now = Clock::now();
    const runtime::EngineMetrics m = eng.metrics();
    if (last_generated >= 0 && m.generation_tokens > last_generated) {
      last_generated = m.generation_tokens;
      last_healthy = now;
      return true;
    }
    if (last_generated >= 0 && now - last_healthy < std::chrono::seconds(2)) return true;
    runtime::RequestParams p;
    p.prompt = {ctx.tok && ctx.tok->bos_id() ? *ctx.tok->bos_id() : 0};
    p.max_tokens = 1;
    p.sampling.temperature = 0;
    p.ignore_eos = true;
    runtime::SubmitResult sr = eng.submit(p);
    if (!sr.ok()) {
      if (sr.error.code == runtime::ErrorCode::QueueFull && m.steps > 0) return true;  // busy, and it has run
      return *why = sr.error.message, false;
    }
    const auto deadline = now + std::chrono::milliseconds(int64_t(opt.health_probe_timeout_s * 1000));
    while (Clock::now() < deadline) {
      std::optional<runtime::RequestOutput> d = sr.stream->next(kPoll);
      if (!d || !d->finished) continue;
      if (d->completion_tokens >= 1) {
        last_generated = eng.metrics().generation_tokens;
        last_healthy = Clock::now();
        return true;
      }
      return *why = "the probe generation ended without a token (" + std::string(runtime::finish_reason_name(d->finish_reason)) +
                    (d->error.empty() ? "" : ": " + d->error) + ")",
             false;
    }
    eng.abort(sr.stream->id());
    return *why = "the probe generation timed out", false;
  }

  void handle_health(const httplib::Request& req, httplib::Response& res) {
    if (!admit(req, res, /*need_auth=*/false)) return;
    if (auto e = not_ready()) return send_error(res, *e);
    std::string why;
    if (!probe_generation(*engine.load(), &why))
      return send_error(res, ApiError{503, "unhealthy: " + why, "service_unavailable", "", "unhealthy"});
    res.set_content("", "text/plain");
    res.status = 200;
  }

  // ---- generation ----
  void handle_generate(const httplib::Request& req, httplib::Response& res, bool chat) {
    if (!admit(req, res, true)) return;
    if (auto e = not_ready()) return send_error(res, *e);
    runtime::Engine* eng = engine.load();
    auto inflight_token = std::shared_ptr<void>(nullptr, [this](void*) { --inflight; });
    ++inflight;
    auto parsed = parse_request(req.body, chat, ctx);
    if (auto* e = std::get_if<ApiError>(&parsed)) return send_error(res, *e);
    auto pr = std::make_shared<ParsedRequest>(std::move(std::get<ParsedRequest>(parsed)));
    runtime::SubmitResult sr = eng->submit(pr->params);
    if (!sr.ok()) return send_error(res, from_engine_error(sr.error));
    std::shared_ptr<runtime::RequestStream> stream = sr.stream;
    auto asm_ = std::make_shared<ResponseAssembler>(*pr, ctx, (chat ? "chatcmpl-" : "cmpl-") + random_hex(24), unix_now());
    auto watch = std::make_shared<LivenessCheck>(PeerWatch::find(req));

    if (!pr->stream) {
      for (;;) {
        std::optional<runtime::RequestOutput> d = stream->next(kPoll);
        if (d) asm_->add(*d);
        if ((d && d->finished) || (!d && stream->done())) break;
        if (!watch->alive()) {
          eng->abort(stream->id());
          ++client_disconnects;
          return;  // nobody to answer
        }
      }
      if (asm_->failed())
        return send_error(res, ApiError{500, "generation failed: " + asm_->error_message(), "internal_error", "", "engine_error"});
      return send_json(res, asm_->final_body());
    }

    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider(
        "text/event-stream",
        [stream, asm_, watch, pr, inflight_token](size_t, httplib::DataSink& sink) {
          std::optional<runtime::RequestOutput> d = stream->next(kPoll);
          if (!d) {
            if (stream->done()) {
              sink.done();
              return true;
            }
            return watch->alive();  // false: httplib ends the response; the releaser aborts
          }
          // A write to a vanished peer can still succeed once; the poll catches it within kPoll.
          if (!d->finished && !watch->alive()) return false;
          const std::string events = asm_->stream(*d);
          if (!events.empty() && !sink.write(events.data(), events.size())) return false;
          if (d->finished) sink.done();
          return true;
        },
        [this, eng, stream](bool success) {
          if (!success || !stream->done()) {
            eng->abort(stream->id());
            ++client_disconnects;
          }
        });
  }

  // ---- other routes ----
  void handle_models(const httplib::Request& req, httplib::Response& res) {
    if (!admit(req, res, true)) return;
    if (state.load() == State::Loading || state.load() == State::Failed) return send_error(res, *not_ready());
    Json m{{"id", ctx.served_model_name}, {"object", "model"}, {"created", unix_now()}, {"owned_by", "mlaserve"},
           {"root", ctx.served_model_name}, {"max_model_len", ctx.max_model_len}};
    send_json(res, Json{{"object", "list"}, {"data", Json::array({m})}});
  }

  void handle_metrics(const httplib::Request& req, httplib::Response& res) {
    if (!admit(req, res, true)) return;
    runtime::EngineMetrics m;
    if (runtime::Engine* e = engine.load()) m = e->metrics();
    ServerCounters c{client_disconnects.load(), rejected_queue_full.load(), errors_4xx.load(), errors_5xx.load()};
    // ctx is published before the engine pointer: read the name only once the engine is attached.
    const std::string name = engine.load() ? ctx.served_model_name : std::string();
    res.set_content(prometheus_text(m, c, name), "text/plain; version=0.0.4");
  }

  // Errors httplib produced itself (malformed request, unknown route, body too large) get the
  // OpenAI error body. httplib 0.11 answers a header line over its 8 KiB limit with a bare 400 after
  // the request line parsed; that case is reported as 431.
  void on_error(const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    ApiError e{res.status, "", "invalid_request_error", "", ""};
    switch (res.status) {
      case 400:
        if (!req.path.empty() && !req.version.empty() &&
            req.get_header_value("Transfer-Encoding").find("chunked") == std::string::npos) {
          e.status = 431;
          e.message = "a request header line exceeds the server's limit";
          e.code = "headers_too_large";
        } else {
          e.message = "malformed HTTP request";
          e.code = "bad_request";
        }
        break;
      case 404: e.message = fmt::format("no route for {} {}", req.method, req.path); e.type = "NotFoundError"; break;
      case 413:
        // httplib caps form-encoded bodies at 8 KiB whatever the limit (curl -d sends that type).
        e.message = req.get_header_value("Content-Type").find("x-www-form-urlencoded") != std::string::npos
                        ? "form-encoded request body exceeds 8192 bytes: send Content-Type: application/json"
                        : fmt::format("request body exceeds {} bytes", opt.max_body_bytes);
        e.code = "body_too_large";
        break;
      case 414: e.message = "request URI too long"; break;
      default:
        e.message = fmt::format("HTTP {}", res.status);
        if (res.status >= 500) e.type = "internal_error";
    }
    res.status = e.status;
    (e.status >= 500 ? errors_5xx : errors_4xx)++;
    res.set_content(e.body(), "application/json");
  }

  void routes() {
    http.set_payload_max_length(opt.max_body_bytes);
    if (!opt.cors_origin.empty()) {
      http.set_default_headers({{"Access-Control-Allow-Origin", opt.cors_origin}, {"Vary", "Origin"}});
      http.Options(".*", [](const httplib::Request&, httplib::Response& res) {
        res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
        res.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type");
        res.set_header("Access-Control-Max-Age", "600");
        res.status = 204;
      });
    }
    http.Get("/health", [this](const httplib::Request& q, httplib::Response& r) { handle_health(q, r); });
    http.Get("/v1/models", [this](const httplib::Request& q, httplib::Response& r) { handle_models(q, r); });
    http.Get("/metrics", [this](const httplib::Request& q, httplib::Response& r) { handle_metrics(q, r); });
    http.Post("/v1/completions",
              [this](const httplib::Request& q, httplib::Response& r) { handle_generate(q, r, /*chat=*/false); });
    http.Post("/v1/chat/completions",
              [this](const httplib::Request& q, httplib::Response& r) { handle_generate(q, r, /*chat=*/true); });
    http.set_error_handler([this](const httplib::Request& q, httplib::Response& r) { on_error(q, r); });
    http.set_exception_handler([this](const httplib::Request&, httplib::Response& r, std::exception_ptr ep) {
      std::string what = "internal error";
      try {
        if (ep) std::rethrow_exception(ep);
      } catch (const std::exception& ex) {
        what = ex.what();
      } catch (...) {
      }
      send_error(r, ApiError{500, what, "internal_error", "", ""});
    });
  }
};

Server::Server(ServerOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}

Server::~Server() { stop(); }

Status Server::start(int expected_concurrency) {
  Impl& s = *impl_;
  s.routes();
  const int threads =
      s.opt.num_threads > 0 ? s.opt.num_threads : std::clamp(expected_concurrency + 8, 8, 1024);
  s.http.new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
  if (s.opt.port == 0) {
    s.bound_port = s.http.bind_to_any_port(s.opt.host);
    if (s.bound_port <= 0) return error("cannot bind {}: no free port", s.opt.host);
  } else {
    if (!s.http.bind_to_port(s.opt.host, s.opt.port)) return error("cannot bind {}:{} (in use, or no permission)", s.opt.host, s.opt.port);
    s.bound_port = s.opt.port;
  }
  s.listener = std::thread([&s] { s.http.listen_after_bind(); });
  return Status::ok();
}

int Server::port() const { return impl_->bound_port; }

Status Server::attach(runtime::Engine* engine, ModelContext ctx) {
  Impl& s = *impl_;
  {
    std::lock_guard<std::mutex> lk(s.mu);
    s.ctx = std::move(ctx);
  }
  s.engine.store(engine);
  std::string why;
  if (!s.probe_generation(*engine, &why)) {
    mark_failed("the startup probe generation failed: " + why);
    return error("the startup probe generation failed: {}", why);
  }
  State expected = State::Loading;
  s.state.compare_exchange_strong(expected, State::Ready);
  return Status::ok();
}

void Server::mark_failed(std::string why) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  impl_->fail_reason = std::move(why);
  State expected = State::Loading;
  impl_->state.compare_exchange_strong(expected, State::Failed);
}

void Server::drain_and_stop() {
  Impl& s = *impl_;
  const State prev = s.state.exchange(State::Draining);
  if (prev == State::Stopped) {
    s.state.store(State::Stopped);
    return;
  }
  if (runtime::Engine* e = s.engine.load()) e->shutdown(/*drain=*/true);
  // The engine finished every accepted request; let the handlers write their last bytes.
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (s.inflight.load() > 0 && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  stop();
}

void Server::stop() {
  Impl& s = *impl_;
  std::call_once(s.stop_once, [&s] {
    s.state.store(State::Stopped);
    s.http.stop();
    if (s.listener.joinable()) s.listener.join();
  });
}

bool Server::running() const { return impl_->state.load() != State::Stopped; }

}  // namespace mla::server
