// The OpenAI-compatible HTTP front end (cpp-httplib): routes, API-key auth, CORS, body/header
// limits, SSE streaming, /health backed by a real one-token generation, Prometheus /metrics and the
// lifecycle (listening while the model loads, drain on SIGTERM). Each connection is served by one
// pool thread that blocks on its request's output stream; the engine thread never waits on HTTP.
// Trade-off: one thread per in-flight connection is simple and costs nothing at the concurrency an
// inference server sees (hundreds), at the price of a thread stack per waiting client.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "core/status.h"
#include "runtime/engine.h"
#include "server/openai_request.h"

namespace mla::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                        // 0: any free port (see Server::port())
  std::string api_key;                    // non-empty: "Authorization: Bearer KEY" on every route but /health
  std::string cors_origin;                // non-empty: CORS headers for this origin ("*" allowed)
  size_t max_body_bytes = size_t(8) << 20;    // larger bodies: 413
  size_t max_header_bytes = size_t(16) << 10; // request line + headers, summed: 431
  int num_threads = 0;                    // HTTP worker threads; 0: derived from the engine's queue sizes
  double health_probe_timeout_s = 60;     // /health's probe generation must finish within this
};

class Server {
 public:
  explicit Server(ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds the listening socket and starts serving on a background thread. Until attach(), /health
  // and the OpenAI routes answer 503 ("loading").
  Status start(int expected_concurrency);
  int port() const;

  // The model is loaded. Runs one probe generation; then the routes open (or, when the probe
  // fails, the server stays unhealthy and the error is returned). `engine` and what `ctx` points
  // to must outlive the server.
  Status attach(runtime::Engine* engine, ModelContext ctx);
  // Loading failed: /health answers 503 with `why` until the process exits.
  void mark_failed(std::string why);

  // Graceful stop (SIGTERM): new requests get 503, accepted ones finish and their responses are
  // written, then the listener closes. Blocks until then. Idempotent.
  void drain_and_stop();
  // Immediate stop: aborts in-flight requests.
  void stop();
  bool running() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mla::server
