// The load generator behind `mlaserve bench`: random prompts of exact lengths, streamed requests to
// any OpenAI-compatible server (cpp-httplib client, SSE), a concurrency sweep (a fixed pool of
// workers per point) or Poisson arrivals. Trade-off: one OS thread per in-flight request (simple,
// exact timestamps, no event loop); fine up to a few hundred in flight, which is all a sweep needs.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/metrics.h"
#include "bench/server_metrics.h"
#include "core/status.h"

namespace mla::bench {

enum class PromptFormat : uint8_t {
  Ids,   // `prompt` as a list of token ids: exact input length (completions endpoint only)
  Text,  // random words, about one token each; the exact count comes back in usage.prompt_tokens
};

struct LoadgenConfig {
  std::string url;                          // "http://host:port" (a trailing /v1 is accepted)
  std::string endpoint = "/v1/completions"; // or /v1/chat/completions (text prompts only)
  std::string model;
  std::string api_key;                      // sent as "Authorization: Bearer ..." when set
  int64_t input_len = 1024, output_len = 400;
  int num_prompts = 0;                      // per point; 0: 8 x concurrency (at least 16) per point
  std::vector<int> concurrency = {1};       // sweep points; in rate mode, one cap (or empty: none)
  std::optional<double> request_rate;       // req/s, Poisson arrivals (rate mode); nullopt: sweep
  int warmup = 1;                           // requests before the first point, not measured
  uint64_t seed = 0;
  PromptFormat prompt_format = PromptFormat::Ids;
  int32_t token_id_min = 256, token_id_max = 4000;  // random ids drawn from [min, max)
  double timeout_s = 600;                   // per request read timeout
  int max_rate_workers = 256;               // in-flight cap of rate mode without --concurrency
};

// Seeded random prompts, one per request; each is a token-id list of exactly input_len ids or a
// text of input_len random words.
struct Prompt {
  std::vector<int32_t> ids;
  std::string text;
};
std::vector<Prompt> make_prompts(const LoadgenConfig& cfg, int count, uint64_t seed);

// Arrival times (s from the start) of `count` requests in a Poisson process of `rate` req/s:
// cumulative exponential gaps, seeded. The first arrives at 0.
std::vector<double> poisson_arrivals(int count, double rate, uint64_t seed);

// The JSON body of one streamed request: max_tokens = min_tokens = output_len, ignore_eos, stream
// with usage, temperature 0.
nlohmann::json request_body(const LoadgenConfig& cfg, const Prompt& p);

// Sends one streamed request and times it. Never throws; failures come back with success = false.
RequestResult send_request(const LoadgenConfig& cfg, const Prompt& p);

// Called after each finished request: (done, total) of the point.
using ProgressFn = std::function<void(int done, int total)>;

// One measured point. Concurrency mode: `concurrency` workers each send back-to-back requests until
// `num_prompts` are done. Rate mode: requests start at Poisson arrival times, at most `concurrency`
// (nullopt: cfg.max_rate_workers) in flight.
PointSummary run_point(const LoadgenConfig& cfg, std::optional<int> concurrency, int num_prompts,
                       uint64_t seed, const ProgressFn& progress = {});

// Every point of the config: warm-up, then the sweep (or the one rate point). Each point also reads
// the server's /metrics before and after (PointSummary::server). Errors: bad config.
Result<std::vector<PointSummary>> run_benchmark(const LoadgenConfig& cfg,
                                                const std::function<ProgressFn(int point)>& progress = {});

// Checks the config (lengths, URL, endpoint/prompt format pairing, concurrency values).
Status validate_config(const LoadgenConfig& cfg);

// Requests per point: cfg.num_prompts, or 8 x concurrency (at least 16).
int prompts_for_point(const LoadgenConfig& cfg, std::optional<int> concurrency);

}  // namespace mla::bench
