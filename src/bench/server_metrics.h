// What the server itself reports about a benchmark point, read from its Prometheus `/metrics`
// before and after the point: engine steps and where their time went (mlaserve), and speculative
// decoding acceptance (mlaserve's and vLLM's `spec_decode_*` counters). Servers without those
// counters (or without /metrics) simply give no figures.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mla::bench {

// Counter values by name without the "mlaserve:" / "vllm:" prefix and without a "_total" suffix;
// samples of one name with different labels are summed, except spec_decode_num_accepted_tokens_per_pos
// which is kept per `position` label.
struct ServerCounters {
  std::map<std::string, double> values;
  std::vector<double> accepted_per_pos;
  bool has(const std::string& name) const { return values.count(name) > 0; }
  double get(const std::string& name) const;
};

// Parses Prometheus text exposition (comments skipped, malformed lines ignored).
ServerCounters parse_prometheus_counters(const std::string& text);

// Deltas of one point and what follows from them (0 when a counter is missing).
struct ServerPointStats {
  double steps = 0;                  // decode-only steps when decode_steps_only, else all steps
  bool decode_steps_only = false;
  double forward_ms_per_step = 0;    // engine_forward_seconds / steps: the device's share of a step
  double step_ms_per_step = 0;       // engine_step_seconds / steps: whole engine steps
  // Server overhead relative to the device's share of the work (forward seconds):
  //   engine_host_overhead = (step - forward) / forward over the steps above: the engine thread's
  //                          own host work per step (scheduling, bookkeeping, detokenizing);
  //   server_overhead      = point duration / forward seconds of ALL steps in the point - 1:
  //                          everything the client waited for that was not device work (engine host
  //                          work, HTTP, JSON, SSE, idle gaps between requests), per unit of device
  //                          work, so per generated token too.
  // (TPOT is not used: a stream's first non-empty chunk can come many tokens after the first token,
  // e.g. special tokens with no text, which shrinks TPOT below the step time.)
  //   server_overhead_vs_step = point duration / step seconds of ALL steps - 1: the same without
  //                          the engine thread's host work, i.e. the HTTP server's share against
  //                          the engine's step time.
  double engine_host_overhead = 0;
  double server_overhead = 0;
  double server_overhead_vs_step = 0;
  bool has_engine = false;
  // Speculative decoding (vLLM bench names): acceptance_length = 1 + accepted / drafts.
  bool has_spec = false;
  double spec_num_drafts = 0, spec_draft_tokens = 0, spec_accepted_tokens = 0;
  double spec_acceptance_rate = 0, spec_acceptance_length = 0;
  std::vector<double> spec_per_position_acceptance_rates;
};

ServerPointStats server_point_stats(const ServerCounters& before, const ServerCounters& after, double duration_s);

nlohmann::json server_stats_to_json(const ServerPointStats& s);

}  // namespace mla::bench
