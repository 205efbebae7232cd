// Prometheus exposition of EngineMetrics (see metrics_text.h). Histogram buckets are emitted in the
// cumulative form Prometheus expects (the engine counts per bucket).
#include "server/metrics_text.h"

#include <fmt/format.h>

namespace mla::server {

namespace {

std::string label_escape(const std::string& s) {
  std::string o;
  for (char ch : s) {
    if (ch == '\\' || ch == '"') o += '\\';
    if (ch == '\n') { o += "\\n"; continue; }
    o += ch;
  }
  return o;
}

struct Writer {
  std::string out;
  std::string labels;  // model_name="..."
  void head(const char* name, const char* type, const char* help) {
    out += fmt::format("# HELP mlaserve:{} {}\n# TYPE mlaserve:{} {}\n", name, help, name, type);
  }
  void gauge(const char* name, const char* help, double v) {
    head(name, "gauge", help);
    out += fmt::format("mlaserve:{}{{{}}} {}\n", name, labels, v);
  }
  void counter(const char* name, const char* help, double v) {
    head(name, "counter", help);
    out += fmt::format("mlaserve:{}{{{}}} {}\n", name, labels, v);
  }
  void histogram(const char* name, const char* help, const runtime::LatencyHistogram& h) {
    head(name, "histogram", help);
    uint64_t cum = 0;
    for (size_t i = 0; i < h.bounds.size(); ++i) {
      cum += i < h.counts.size() ? h.counts[i] : 0;
      out += fmt::format("mlaserve:{}_bucket{{{},le=\"{}\"}} {}\n", name, labels, h.bounds[i], cum);
    }
    out += fmt::format("mlaserve:{}_bucket{{{},le=\"+Inf\"}} {}\n", name, labels, h.count);
    out += fmt::format("mlaserve:{}_sum{{{}}} {}\n", name, labels, h.sum);
    out += fmt::format("mlaserve:{}_count{{{}}} {}\n", name, labels, h.count);
  }
};

}  // namespace

std::string prometheus_text(const runtime::EngineMetrics& m, const ServerCounters& c, const std::string& model_name) {
  Writer w;
  w.labels = fmt::format("model_name=\"{}\"", label_escape(model_name));
  w.gauge("num_requests_running", "Requests holding KV blocks and scheduled each step.", m.num_running);
  w.gauge("num_requests_waiting", "Requests queued, including preempted ones waiting to recompute.", m.num_waiting);
  w.gauge("kv_cache_usage_perc", "Fraction of KV blocks held by requests (1 = full).", m.kv_usage);
  w.gauge("kv_cache_blocks_used", "KV blocks held by requests.", m.num_blocks_used);
  w.gauge("kv_cache_blocks_cached", "KV blocks held only by the prefix cache (reusable on demand).",
          m.num_blocks_cached_evictable);
  w.gauge("kv_cache_blocks_total", "KV blocks in the pool.", m.num_blocks);
  w.counter("prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.", double(m.prefix_queried_tokens));
  w.counter("prefix_cache_hits_total", "Prompt tokens served from the prefix cache.", double(m.prefix_hit_tokens));
  w.gauge("prefix_cache_hit_rate", "prefix_cache_hits_total / prefix_cache_queries_total.", m.prefix_hit_rate);
  w.counter("prompt_tokens_total", "Prompt tokens of admitted requests.", double(m.prompt_tokens));
  w.counter("generation_tokens_total", "Generated tokens.", double(m.generation_tokens));
  w.counter("num_preemptions_total", "Sequences preempted (recomputed later) for lack of KV blocks.", double(m.preemptions));
  w.counter("engine_steps_total", "Engine steps (one forward each).", double(m.steps));
  w.counter("engine_forward_seconds_total", "Engine time from staging a step to its sampled ids on the host.",
            m.forward_seconds);
  w.counter("engine_step_seconds_total", "Engine time in whole steps (forward plus host bookkeeping).", m.step_seconds);
  w.counter("engine_decode_steps_total", "Engine steps in which every scheduled sequence decodes.", double(m.decode_steps));
  w.counter("engine_decode_forward_seconds_total", "engine_forward_seconds over decode-only steps.",
            m.decode_forward_seconds);
  w.counter("engine_decode_step_seconds_total", "engine_step_seconds over decode-only steps.", m.decode_step_seconds);
  w.head("request_success_total", "counter", "Finished requests by finish reason.");
  static const char* const kReasons[5] = {"none", "stop", "length", "abort", "error"};
  for (int i = 1; i < 5; ++i)
    w.out += fmt::format("mlaserve:request_success_total{{{},finished_reason=\"{}\"}} {}\n", w.labels, kReasons[i],
                         m.requests_finished[i]);
  w.histogram("time_to_first_token_seconds", "Time from submission to the first generated token.", m.ttft);
  w.histogram("inter_token_latency_seconds", "Time between consecutive generated tokens of a request.", m.itl);
  w.histogram("e2e_request_latency_seconds", "Time from submission to the end of a request.", m.e2e);
  if (m.speculative) {  // vLLM's spec_decode_* counters; mean accepted length = 1 + accepted / drafts
    w.counter("spec_decode_num_drafts_total", "Verification rounds with at least one draft token.",
              double(m.spec.num_drafts));
    w.counter("spec_decode_num_draft_tokens_total", "Draft tokens verified.", double(m.spec.num_draft_tokens));
    w.counter("spec_decode_num_accepted_tokens_total", "Draft tokens accepted.", double(m.spec.num_accepted_tokens));
    w.head("spec_decode_num_accepted_tokens_per_pos_total", "counter", "Rounds whose draft at position i was accepted.");
    for (size_t i = 0; i < m.spec.accepted_per_pos.size(); ++i)
      w.out += fmt::format("mlaserve:spec_decode_num_accepted_tokens_per_pos_total{{{},position=\"{}\"}} {}\n", w.labels,
                           i, m.spec.accepted_per_pos[i]);
  }
  w.gauge("engine_healthy", "1 while the engine thread runs, 0 after it failed.", m.healthy ? 1 : 0);
  w.counter("http_client_disconnects_total", "Requests aborted because their client disconnected.",
            double(c.client_disconnects));
  w.counter("http_rejected_queue_full_total", "Requests answered 429 (queue full).", double(c.rejected_queue_full));
  w.counter("http_errors_4xx_total", "Requests answered with a 4xx status.", double(c.errors_4xx));
  w.counter("http_errors_5xx_total", "Requests answered with a 5xx status.", double(c.errors_5xx));
  return w.out;
}

}  // namespace mla::server
