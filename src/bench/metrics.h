// Benchmark arithmetic, separate from the HTTP so it can be tested exactly: per-request timings in,
// one point's summary (vLLM `bench serve` field names) and the cost per token out.
// Trade-off: we follow vLLM's definitions (ITL per streamed chunk, TPOT excludes the first token,
// numpy's linear-interpolation percentiles) so numbers compare with theirs, not the "purest" ones.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/server_metrics.h"

namespace mla::bench {

// What one request measured. Times are seconds from the request's send.
struct RequestResult {
  bool success = false;
  std::string error;          // why it failed (HTTP status + body, or the transport error)
  int64_t prompt_len = 0;     // input tokens (the server's usage.prompt_tokens, else what we sent)
  int64_t output_len = 0;     // output tokens (usage.completion_tokens, else streamed chunks)
  double ttft = 0;            // first non-empty chunk
  std::vector<double> itl;    // gaps between consecutive non-empty chunks
  double latency = 0;         // end-to-end: send to end of stream
  double start = 0;           // send time, seconds from the point's start (for arrival checks)
};

// One percentile of `v` the way numpy.percentile (method "linear") computes it; p in [0, 100].
// Precondition: v is not empty.
double percentile(std::vector<double> v, double p);

struct LatencyStats {
  double mean = 0, median = 0, stdev = 0, p90 = 0, p99 = 0;  // ms
};
// Stats of `seconds`, in ms (all zero for an empty input, like vLLM's `np.mean(x or 0)`).
LatencyStats latency_stats_ms(const std::vector<double>& seconds);

struct PointSummary {
  std::optional<int> max_concurrency;  // nullopt: request-rate mode without a cap
  std::optional<double> request_rate;  // req/s; nullopt: all at once ("inf")
  double duration = 0;                 // s, first send to last completion
  int64_t completed = 0, failed = 0;
  int64_t total_input_tokens = 0, total_output_tokens = 0;
  double request_throughput = 0;       // completed / duration
  double output_throughput = 0;        // total_output_tokens / duration
  double total_token_throughput = 0;   // (total_input_tokens + total_output_tokens) / duration
  double input_throughput = 0;         // total_input_tokens / duration (for $/M input tokens)
  LatencyStats ttft, tpot, itl, e2el;  // ms
  double per_user_tok_s = 0;           // 1000 / mean_tpot_ms: decode speed one user sees (0 if no TPOT)
  std::vector<RequestResult> requests;
  std::optional<ServerPointStats> server;  // the server's own counters for the point, when it has them
};

// Summarizes one point. TPOT of a request = (latency - ttft) / (output_len - 1), only for requests
// with output_len > 1; ITL pools every request's gaps; TTFT and E2E cover the successful requests.
PointSummary summarize_point(std::vector<RequestResult> requests, double duration,
                             std::optional<int> max_concurrency, std::optional<double> request_rate);

// The point as JSON with vLLM `bench serve` names: completed, duration, total_input_tokens,
// total_output_tokens, request_throughput, output_throughput, total_token_throughput,
// {mean,median,std,p90,p99}_{ttft,tpot,itl,e2el}_ms, max_concurrency (null in rate mode),
// request_rate ("inf" when unpaced), input_lens, output_lens, ttfts (s), itls (s), errors;
// plus ours: failed, input_throughput, per_user_tok_s, and "server" (server_stats_to_json) when the
// server reported its counters.
nlohmann::json point_to_json(const PointSummary& s);

// Cost per token from measured throughput.
//   usd_per_hour          = usd_per_gpu_hour * gpus
//   usd_per_mtok_output   = usd_per_hour / (output_throughput * 3600) * 1e6
//   usd_per_mtok_input    = usd_per_hour / (input_throughput * 3600) * 1e6
//   usd_per_mtok_total    = usd_per_hour / (total_token_throughput * 3600) * 1e6
// Each charges the whole hour to that kind of token alone (as per-token price lists are quoted); the
// three are not additive. A throughput of 0 gives 0 (no figure).
struct Cost {
  std::string gpu;                 // catalog key, or "" for --price
  int gpus = 1;
  double usd_per_gpu_hour = 0;
  std::string price_source, price_date;
  double usd_per_hour() const { return usd_per_gpu_hour * gpus; }
};
struct PointCost {
  double usd_per_mtok_output = 0, usd_per_mtok_input = 0, usd_per_mtok_total = 0;
};
double usd_per_mtok(double usd_per_hour, double tok_per_s);
PointCost point_cost(const Cost& cost, const PointSummary& s);
inline constexpr const char* kCostFormula =
    "usd_per_mtok_X = usd_per_gpu_hour * gpus / (X_throughput_tok_s * 3600) * 1e6; "
    "each charges the whole hour to that token kind alone (not additive)";

}  // namespace mla::bench
