// `mlaserve serve`: the OpenAI-compatible HTTP server. It listens before the model loads (so
// /health can say 503 "loading"), proves one real generation before it says ready, and on SIGTERM
// or SIGINT drains: in-flight requests finish, new ones get 503, then the process exits 0.
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <memory>
#include <thread>

#include "cli/commands.h"
#include "cli/serving_setup.h"
#include "server/http_server.h"

namespace mla::cli {

namespace {

struct ServeArgs {
  EngineArgs engine;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;
  std::string served_model_name;
  std::string cors_origin;
  size_t max_body_bytes = size_t(8) << 20;
  size_t max_header_bytes = size_t(16) << 10;
  std::string tool_call_parser = "auto";
  std::string reasoning_parser = "auto";
};

// The tool-call format the chat template implies (markers it writes), unless named on the command line.
std::optional<tokenizer::ToolCallFormat> tool_format(const ServeArgs& a, const std::string& tmpl) {
  tokenizer::ToolCallFormat f;
  if (a.tool_call_parser == "none") return std::nullopt;
  if (a.tool_call_parser != "auto") {
    if (parse_tool_call_format(a.tool_call_parser, &f)) return f;
    return std::nullopt;
  }
  if (tmpl.find("<|tool_calls_section_begin|>") != std::string::npos) return tokenizer::ToolCallFormat::KimiK2;
  if (tmpl.find("tool\xE2\x96\x81" "calls\xE2\x96\x81" "begin") != std::string::npos) return tokenizer::ToolCallFormat::DeepSeekV3;
  return std::nullopt;
}

int run_serve(const ServeArgs& a) {
  // Signals go to one waiting thread; every thread started from here on inherits the mask.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::signal(SIGPIPE, SIG_IGN);  // a vanished client must not kill the server

  const std::string name = a.served_model_name.empty() ? a.engine.model : a.served_model_name;
  server::ServerOptions so;
  so.host = a.host;
  so.port = a.port;
  so.api_key = a.api_key;
  so.cors_origin = a.cors_origin;
  so.max_body_bytes = a.max_body_bytes;
  so.max_header_bytes = a.max_header_bytes;
  server::Server srv(so);
  if (Status st = srv.start(a.engine.max_num_seqs + a.engine.max_queue); !st.is_ok()) {
    std::fprintf(stderr, "mlaserve serve: %s\n", st.message().c_str());
    return 1;
  }
  std::printf("mlaserve: listening on http://%s:%d (model %s loading)\n", a.host.c_str(), srv.port(), name.c_str());
  std::fflush(stdout);

  std::atomic<bool> self_stop{false};  // the stop signal came from a failed start, not a user
  std::thread waiter([&srv, &self_stop, set] {
    int sig = 0;
    sigwait(&set, &sig);
    if (!self_stop.load()) std::printf("mlaserve: signal %d: draining (new requests get 503)\n", sig);
    std::fflush(stdout);
    srv.drain_and_stop();
  });

  Result<std::unique_ptr<LoadedServing>> loaded = load_serving(a.engine, /*show_progress=*/isatty(2));
  int rc = 0;
  std::unique_ptr<LoadedServing> s;
  if (!loaded) {
    std::fprintf(stderr, "mlaserve serve: %s\n", loaded.status().message().c_str());
    srv.mark_failed(loaded.status().message());
    rc = 1;
    self_stop = true;
    kill(getpid(), SIGTERM);  // wakes the waiter, which stops the listener
  } else {
    s = std::move(loaded).value();
    server::ModelContext ctx;
    ctx.served_model_name = name;
    ctx.tok = s->tok.get();
    ctx.chat_template = s->chat ? &*s->chat : nullptr;
    ctx.max_model_len = s->engine->max_model_len();
    ctx.vocab_size = s->model->config().vocab_size;
    ctx.tool_call_format = tool_format(a, s->chat ? s->chat->chat_template : std::string());
    ctx.reasoning = a.reasoning_parser == "think" ||
                    (a.reasoning_parser == "auto" && s->chat && s->chat->chat_template.find("<think>") != std::string::npos);
    if (Status st = srv.attach(s->engine.get(), ctx); !st.is_ok()) {
      std::fprintf(stderr, "mlaserve serve: %s\n", st.message().c_str());
      rc = 1;
      self_stop = true;
      kill(getpid(), SIGTERM);
    } else {
      std::printf("mlaserve: ready (max_model_len %d, max_num_seqs %d, backend %s)\n", ctx.max_model_len,
                  a.engine.max_num_seqs, std::string(s->backend->name()).c_str());
      std::fflush(stdout);
    }
  }
  waiter.join();
  std::printf("mlaserve: stopped\n");
  std::fflush(stdout);
  return rc;
}

}  // namespace

Command add_serve_command(CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  CLI::App* sub = app.add_subcommand("serve", "OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions)");
  add_engine_options(sub, a->engine);
  add_speculative_options(sub, a->engine);
  sub->add_option("--host", a->host, "Address to bind (0.0.0.0 exposes the server to the network)")->capture_default_str();
  sub->add_option("--port", a->port, "Port (0: any free port, printed at start)")->capture_default_str();
  sub->add_option("--api-key", a->api_key, "Require 'Authorization: Bearer KEY' on every route but /health");
  sub->add_option("--served-model-name", a->served_model_name, "The model id clients send (default: --model)");
  sub->add_option("--cors-origin", a->cors_origin, "Allow browser requests from this origin (\"*\" for any); off by default");
  sub->add_option("--max-body-bytes", a->max_body_bytes, "Larger request bodies get 413")->capture_default_str();
  sub->add_option("--max-header-bytes", a->max_header_bytes, "Larger request headers get 431")->capture_default_str();
  sub->add_option("--tool-call-parser", a->tool_call_parser, "auto (from the chat template), none, kimi_k2, kimi_k3_xtml, deepseek_v3")
      ->check(CLI::IsMember({"auto", "none", "kimi_k2", "kimi_k3_xtml", "deepseek_v3"}))
      ->capture_default_str();
  sub->add_option("--reasoning-parser", a->reasoning_parser, "auto (on when the template uses <think>), think, none")
      ->check(CLI::IsMember({"auto", "think", "none"}))
      ->capture_default_str();
  return {sub, [a] { return run_serve(*a); }};
}

}  // namespace mla::cli
