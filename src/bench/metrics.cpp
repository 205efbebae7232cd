// Benchmark arithmetic: percentiles, one point's summary and cost per token (see metrics.h for the
// definitions, which follow vLLM's `bench serve`).
#include "bench/metrics.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace mla::bench {

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  // numpy "linear": rank = p/100 * (n-1), interpolate between the two neighbours.
  const double rank = std::clamp(p, 0.0, 100.0) / 100.0 * double(v.size() - 1);
  const size_t lo = size_t(std::floor(rank));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  const double frac = rank - double(lo);
  return v[lo] + (v[hi] - v[lo]) * frac;
}

LatencyStats latency_stats_ms(const std::vector<double>& seconds) {
  LatencyStats s;
  if (seconds.empty()) return s;
  const double n = double(seconds.size());
  const double mean = std::accumulate(seconds.begin(), seconds.end(), 0.0) / n;
  double var = 0;
  for (double x : seconds) var += (x - mean) * (x - mean);
  s.mean = mean * 1000;
  s.stdev = std::sqrt(var / n) * 1000;  // population std, as np.std
  s.median = percentile(seconds, 50) * 1000;
  s.p90 = percentile(seconds, 90) * 1000;
  s.p99 = percentile(seconds, 99) * 1000;
  return s;
}

PointSummary summarize_point(std::vector<RequestResult> requests, double duration,
                             std::optional<int> max_concurrency, std::optional<double> request_rate) {
  PointSummary s;
  s.max_concurrency = max_concurrency;
  s.request_rate = request_rate;
  s.duration = duration;
  std::vector<double> ttfts, tpots, itls, e2els;
  for (const RequestResult& r : requests) {
    if (!r.success) {
      ++s.failed;
      continue;
    }
    ++s.completed;
    s.total_input_tokens += r.prompt_len;
    s.total_output_tokens += r.output_len;
    ttfts.push_back(r.ttft);
    e2els.push_back(r.latency);
    if (r.output_len > 1) tpots.push_back((r.latency - r.ttft) / double(r.output_len - 1));
    itls.insert(itls.end(), r.itl.begin(), r.itl.end());
  }
  if (duration > 0) {
    s.request_throughput = double(s.completed) / duration;
    s.output_throughput = double(s.total_output_tokens) / duration;
    s.input_throughput = double(s.total_input_tokens) / duration;
    s.total_token_throughput = double(s.total_input_tokens + s.total_output_tokens) / duration;
  }
  s.ttft = latency_stats_ms(ttfts);
  s.tpot = latency_stats_ms(tpots);
  s.itl = latency_stats_ms(itls);
  s.e2el = latency_stats_ms(e2els);
  s.per_user_tok_s = s.tpot.mean > 0 ? 1000.0 / s.tpot.mean : 0;
  s.requests = std::move(requests);
  return s;
}

nlohmann::json point_to_json(const PointSummary& s) {
  using Json = nlohmann::json;
  Json j{{"duration", s.duration},
         {"completed", s.completed},
         {"failed", s.failed},
         {"total_input_tokens", s.total_input_tokens},
         {"total_output_tokens", s.total_output_tokens},
         {"request_throughput", s.request_throughput},
         {"output_throughput", s.output_throughput},
         {"total_token_throughput", s.total_token_throughput},
         {"input_throughput", s.input_throughput},
         {"per_user_tok_s", s.per_user_tok_s}};
  if (s.server) j["server"] = server_stats_to_json(*s.server);
  j["max_concurrency"] = s.max_concurrency ? Json(*s.max_concurrency) : Json(nullptr);
  j["request_rate"] = s.request_rate ? Json(*s.request_rate) : Json("inf");
  const std::pair<const char*, const LatencyStats*> stats[] = {
      {"ttft", &s.ttft}, {"tpot", &s.tpot}, {"itl", &s.itl}, {"e2el", &s.e2el}};
  for (const auto& [name, st] : stats) {
    const std::string n = name;
    j["mean_" + n + "_ms"] = st->mean;
    j["median_" + n + "_ms"] = st->median;
    j["std_" + n + "_ms"] = st->stdev;
    j["p90_" + n + "_ms"] = st->p90;
    j["p99_" + n + "_ms"] = st->p99;
  }
  Json input_lens = Json::array(), output_lens = Json::array(), ttfts = Json::array(), itls = Json::array(),
       errors = Json::array();
  for (const RequestResult& r : s.requests) {
    // Failed requests appear with zeros, as vLLM lists every request in these arrays.
    input_lens.push_back(r.prompt_len);
    output_lens.push_back(r.success ? r.output_len : 0);
    ttfts.push_back(r.success ? r.ttft : 0.0);
    itls.push_back(r.success ? r.itl : std::vector<double>{});
    errors.push_back(r.error);
  }
  j["input_lens"] = std::move(input_lens);
  j["output_lens"] = std::move(output_lens);
  j["ttfts"] = std::move(ttfts);
  j["itls"] = std::move(itls);
  j["errors"] = std::move(errors);
  return j;
}

double usd_per_mtok(double usd_per_hour, double tok_per_s) {
  return tok_per_s > 0 ? usd_per_hour / (tok_per_s * 3600.0) * 1e6 : 0.0;
}

PointCost point_cost(const Cost& cost, const PointSummary& s) {
  const double h = cost.usd_per_hour();
  return {usd_per_mtok(h, s.output_throughput), usd_per_mtok(h, s.input_throughput),
          usd_per_mtok(h, s.total_token_throughput)};
}

}  // namespace mla::bench
