// The `mlaserve bench` load generator: its arithmetic on exact inputs (percentiles, TPOT, throughput,
// cost), its timings against a fake streaming server with known delays (TTFT, ITL, TPOT, E2E), the
// concurrency sweep and Poisson modes, the JSON field names, the planner comparison, and one run of
// the binary against the real `mlaserve serve` on the embedded model.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <numeric>

#include <nlohmann/json.hpp>

#include "bench/bench_result.h"
#include "bench/loadgen.h"
#include "bench/metrics.h"
#include "e2e/fake_openai_server.h"
#include "e2e/test_server_util.h"

namespace mla::bench {
namespace {

using Json = nlohmann::json;

// Timer tolerance: sleeps only overshoot, so measured delays are >= the fake server's (minus clock
// granularity) and at most this much longer on a loaded CI machine (or under ASan).
constexpr double kSlackMs = 100;

LoadgenConfig fake_config(const test::FakeOpenAiServer& s) {
  LoadgenConfig c;
  c.url = s.url();
  c.model = "fake";
  c.input_len = 16;
  c.output_len = 20;
  c.warmup = 0;
  c.seed = 7;
  return c;
}

TEST(BenchMetrics, PercentileMatchesNumpyLinear) {
  // numpy.percentile([4, 1, 3, 2], p) = 1 + 3 * p / 100.
  EXPECT_DOUBLE_EQ(percentile({4, 1, 3, 2}, 0), 1.0);
  EXPECT_DOUBLE_EQ(percentile({4, 1, 3, 2}, 50), 2.5);
  EXPECT_DOUBLE_EQ(percentile({4, 1, 3, 2}, 90), 3.7);
  EXPECT_DOUBLE_EQ(percentile({4, 1, 3, 2}, 99), 3.97);
  EXPECT_DOUBLE_EQ(percentile({4, 1, 3, 2}, 100), 4.0);
  EXPECT_DOUBLE_EQ(percentile({5}, 99), 5.0);
}

TEST(BenchMetrics, SummaryArithmeticIsExact) {
  std::vector<RequestResult> rs(3);
  rs[0] = {true, "", 10, 5, 0.1, {0.01, 0.02, 0.03, 0.04}, 0.5, 0};
  rs[1] = {true, "", 12, 3, 0.2, {0.05, 0.05}, 0.4, 0};
  rs[2] = {false, "HTTP 500: boom", 11, 0, 0, {}, 0.1, 0};
  const PointSummary s = summarize_point(rs, 2.0, 4, std::nullopt);
  EXPECT_EQ(s.completed, 2);
  EXPECT_EQ(s.failed, 1);
  EXPECT_EQ(s.total_input_tokens, 22);  // failed requests do not count
  EXPECT_EQ(s.total_output_tokens, 8);
  EXPECT_DOUBLE_EQ(s.request_throughput, 1.0);
  EXPECT_DOUBLE_EQ(s.output_throughput, 4.0);
  EXPECT_DOUBLE_EQ(s.input_throughput, 11.0);
  EXPECT_DOUBLE_EQ(s.total_token_throughput, 15.0);
  // TPOT = (latency - ttft) / (output_len - 1): 0.4/4 = 0.1 and 0.2/2 = 0.1.
  EXPECT_NEAR(s.tpot.mean, 100.0, 1e-9);
  EXPECT_NEAR(s.per_user_tok_s, 10.0, 1e-9);
  EXPECT_NEAR(s.ttft.mean, 150.0, 1e-9);
  EXPECT_NEAR(s.ttft.median, 150.0, 1e-9);
  EXPECT_NEAR(s.ttft.stdev, 50.0, 1e-9);
  EXPECT_NEAR(s.e2el.mean, 450.0, 1e-9);
  // ITL pools all gaps: {10, 20, 30, 40, 50, 50} ms.
  EXPECT_NEAR(s.itl.mean, 200.0 / 6, 1e-9);
  EXPECT_NEAR(s.itl.median, 35.0, 1e-9);
  EXPECT_NEAR(s.itl.p99, 50.0, 1e-9);
}

TEST(BenchMetrics, CostPerMillionTokens) {
  // The article's point: 8 GPUs at $2.10 = $16.80/hour at 952 output tok/s.
  Cost c;
  c.gpus = 8;
  c.usd_per_gpu_hour = 2.1;
  EXPECT_DOUBLE_EQ(c.usd_per_hour(), 16.8);
  EXPECT_DOUBLE_EQ(usd_per_mtok(16.8, 952), 16.8 / (952.0 * 3600.0) * 1e6);
  EXPECT_NEAR(usd_per_mtok(16.8, 952), 4.9020, 1e-4);
  EXPECT_EQ(usd_per_mtok(16.8, 0), 0.0);
  PointSummary s;
  s.output_throughput = 1000;
  s.input_throughput = 4000;
  s.total_token_throughput = 5000;
  const PointCost pc = point_cost(c, s);
  EXPECT_DOUBLE_EQ(pc.usd_per_mtok_output, 16.8 / 3.6);
  EXPECT_DOUBLE_EQ(pc.usd_per_mtok_input, 16.8 / 3.6 / 4);
  EXPECT_DOUBLE_EQ(pc.usd_per_mtok_total, 16.8 / 3.6 / 5);
}

TEST(BenchLoadgen, PoissonArrivalsAreSeededWithTheRightMean) {
  const std::vector<double> a = poisson_arrivals(20000, 5.0, 3);
  EXPECT_EQ(a.front(), 0.0);
  EXPECT_TRUE(std::is_sorted(a.begin(), a.end()));
  EXPECT_NEAR(a.back() / double(a.size() - 1), 0.2, 0.2 * 0.03);
  EXPECT_EQ(a, poisson_arrivals(20000, 5.0, 3));
  EXPECT_NE(a, poisson_arrivals(20000, 5.0, 4));
}

TEST(BenchLoadgen, PromptsHaveExactLengthsAndBodiesForceTheOutput) {
  LoadgenConfig c;
  c.model = "m";
  c.input_len = 33;
  c.output_len = 9;
  c.token_id_min = 300;
  c.token_id_max = 310;
  const std::vector<Prompt> ps = make_prompts(c, 5, 1);
  ASSERT_EQ(ps.size(), 5u);
  for (const Prompt& p : ps) {
    ASSERT_EQ(p.ids.size(), 33u);
    for (int32_t id : p.ids) EXPECT_TRUE(id >= 300 && id < 310) << id;
  }
  EXPECT_NE(ps[0].ids, ps[1].ids);
  EXPECT_EQ(make_prompts(c, 5, 1)[3].ids, ps[3].ids);
  const Json b = request_body(c, ps[0]);
  EXPECT_EQ(b["prompt"].size(), 33u);
  EXPECT_EQ(b["max_tokens"], 9);
  EXPECT_EQ(b["min_tokens"], 9);
  EXPECT_EQ(b["ignore_eos"], true);
  EXPECT_EQ(b["stream"], true);
  EXPECT_EQ(b["stream_options"]["include_usage"], true);

  c.prompt_format = PromptFormat::Text;
  const Prompt t = make_prompts(c, 1, 1)[0];
  EXPECT_EQ(std::count(t.text.begin(), t.text.end(), ' '), 32);  // 33 words
  c.endpoint = "/v1/chat/completions";
  const Json chat = request_body(c, t);
  EXPECT_EQ(chat["messages"][0]["content"], t.text);
  EXPECT_FALSE(chat.contains("prompt"));
}

TEST(BenchLoadgen, ConfigErrorsAreMessages) {
  LoadgenConfig c;
  c.url = "http://127.0.0.1:1";
  c.model = "m";
  EXPECT_TRUE(validate_config(c).is_ok());
  LoadgenConfig bad = c;
  bad.url = "127.0.0.1:8000";
  EXPECT_NE(validate_config(bad).message().find("--url"), std::string::npos);
  bad = c;
  bad.endpoint = "/v1/chat/completions";
  EXPECT_NE(validate_config(bad).message().find("--prompt-format"), std::string::npos);
  bad = c;
  bad.concurrency = {1, 0};
  EXPECT_NE(validate_config(bad).message().find("--concurrency"), std::string::npos);
  bad = c;
  bad.request_rate = 2.0;
  bad.concurrency = {1, 2};
  EXPECT_NE(validate_config(bad).message().find("--request-rate"), std::string::npos);
}

TEST(BenchLoadgen, TimingsMatchAFakeServersKnownDelays) {
  test::FakeOpenAiServer server({.ttft_s = 0.05, .itl_s = 0.01});
  const LoadgenConfig c = fake_config(server);
  const PointSummary s = run_point(c, 1, 3, c.seed);
  ASSERT_EQ(s.completed, 3) << (s.requests.empty() ? "" : s.requests[0].error);
  EXPECT_EQ(s.total_input_tokens, 3 * 16);  // the server's usage.prompt_tokens
  EXPECT_EQ(s.total_output_tokens, 3 * 20);
  // TTFT 50 ms; 19 gaps of 10 ms; TPOT = (E2E - TTFT) / 19 = 10 ms; E2E = 50 + 19 * 10 = 240 ms.
  EXPECT_GE(s.ttft.mean, 49.0);
  EXPECT_LE(s.ttft.mean, 50.0 + kSlackMs);
  EXPECT_GE(s.itl.median, 9.0);
  EXPECT_LE(s.itl.median, 10.0 + kSlackMs / 10);
  // Mean ITL = (last token - first token) / 19, and the fake server's deadlines are absolute, so only
  // the overshoot of the first and the last token can move it.
  EXPECT_NEAR(s.itl.mean, 10.0, 5.0);
  EXPECT_NEAR(s.tpot.mean, 10.0, 5.0);
  EXPECT_GE(s.e2el.mean, 239.0);
  EXPECT_LE(s.e2el.mean, 240.0 + kSlackMs);
  for (const RequestResult& r : s.requests) {
    EXPECT_EQ(r.itl.size(), 19u);
    // ttft + sum(itl) = time of the last token <= E2E.
    EXPECT_LE(r.ttft + std::accumulate(r.itl.begin(), r.itl.end(), 0.0), r.latency + 1e-9);
  }
  // Throughput is exactly tokens / duration; duration covers three back-to-back requests.
  EXPECT_GE(s.duration, 3 * 0.239);
  EXPECT_DOUBLE_EQ(s.output_throughput, 60.0 / s.duration);
  EXPECT_DOUBLE_EQ(s.request_throughput, 3.0 / s.duration);
  EXPECT_DOUBLE_EQ(s.total_token_throughput, (60.0 + 48.0) / s.duration);
  EXPECT_DOUBLE_EQ(s.per_user_tok_s, 1000.0 / s.tpot.mean);
  // What the server received: exact-length id prompts, forced output length.
  const std::vector<Json> bodies = server.bodies();
  ASSERT_EQ(bodies.size(), 3u);
  for (const Json& b : bodies) {
    EXPECT_EQ(b["model"], "fake");
    EXPECT_EQ(b["prompt"].size(), 16u);
    EXPECT_EQ(b["max_tokens"], 20);
    EXPECT_EQ(b["min_tokens"], 20);
    EXPECT_EQ(b["ignore_eos"], true);
  }
}

TEST(BenchLoadgen, WithoutUsageOutputTokensAreStreamedChunks) {
  test::FakeOpenAiServer server({.ttft_s = 0.005, .itl_s = 0.001, .tokens = 6, .send_usage = false});
  LoadgenConfig c = fake_config(server);
  const RequestResult r = send_request(c, make_prompts(c, 1, 1)[0]);
  ASSERT_TRUE(r.success) << r.error;
  EXPECT_EQ(r.output_len, 6);
  EXPECT_EQ(r.prompt_len, 16);  // what we sent
  EXPECT_EQ(r.itl.size(), 5u);
  // Fewer tokens than --output-len (a server ignoring ignore_eos/min_tokens) is flagged in the text.
  const PointSummary s = summarize_point({r}, 1.0, 1, std::nullopt);
  EXPECT_NE(describe_result(c, {s}, std::nullopt, {}).find("1 requests returned a number of output tokens other than 20"),
            std::string::npos);
}

TEST(BenchLoadgen, StreamCutBeforeDoneIsAFailure) {
  test::FakeOpenAiServer server({.ttft_s = 0.001, .itl_s = 0.001, .tokens = 3, .send_done = false});
  const LoadgenConfig c = fake_config(server);
  const RequestResult r = send_request(c, make_prompts(c, 1, 1)[0]);
  EXPECT_FALSE(r.success);
  EXPECT_NE(r.error.find("[DONE]"), std::string::npos) << r.error;
}

TEST(BenchLoadgen, ConcurrencySweepRunsAFixedPoolPerPoint) {
  test::FakeOpenAiServer server({.ttft_s = 0.02, .itl_s = 0.005, .tokens = 9});
  LoadgenConfig c = fake_config(server);
  c.concurrency = {1, 4};
  c.num_prompts = 8;
  c.warmup = 2;
  auto points = run_benchmark(c);
  ASSERT_TRUE(points.is_ok()) << points.status().message();
  ASSERT_EQ(points->size(), 2u);
  EXPECT_EQ(server.bodies().size(), 2u + 8u + 8u);  // warm-up + both points
  EXPECT_EQ(server.max_in_flight(), 4);
  const PointSummary& p1 = (*points)[0];
  const PointSummary& p4 = (*points)[1];
  EXPECT_EQ(p1.completed, 8);
  EXPECT_EQ(p4.completed, 8);
  EXPECT_EQ(p1.max_concurrency, 1);
  EXPECT_EQ(p4.max_concurrency, 4);
  // E2E = 20 + 8 * 5 = 60 ms: 8 in a row take >= 480 ms; 4 at a time take ~2 E2E.
  EXPECT_GE(p1.duration, 8 * 0.059);
  EXPECT_GE(p4.duration, 2 * 0.059);
  EXPECT_GT(p4.request_throughput, 2.0 * p1.request_throughput);
  // Each point sent fresh prompts (no prefix shared across points).
  const std::vector<Json> bodies = server.bodies();
  EXPECT_NE(bodies[2]["prompt"], bodies[10]["prompt"]);
}

TEST(BenchLoadgen, RequestRateStartsRequestsAtPoissonArrivals) {
  test::FakeOpenAiServer server({.ttft_s = 0.01, .itl_s = 0.002, .tokens = 4});
  LoadgenConfig c = fake_config(server);
  c.request_rate = 40.0;
  c.concurrency.clear();
  c.num_prompts = 12;
  auto points = run_benchmark(c);
  ASSERT_TRUE(points.is_ok()) << points.status().message();
  ASSERT_EQ(points->size(), 1u);
  const PointSummary& p = points->front();
  EXPECT_EQ(p.completed, 12);
  EXPECT_FALSE(p.max_concurrency.has_value());
  const std::vector<double> arrivals = poisson_arrivals(12, 40.0, c.seed ^ 0x9e3779b97f4a7c15ull);
  for (size_t i = 0; i < p.requests.size(); ++i) {
    EXPECT_GE(p.requests[i].start, arrivals[i] - 1e-6) << i;
    EXPECT_LE(p.requests[i].start, arrivals[i] + kSlackMs / 1000) << i;
  }
  const Json j = point_to_json(p);
  EXPECT_TRUE(j["max_concurrency"].is_null());
  EXPECT_EQ(j["request_rate"], 40.0);
}

TEST(BenchLoadgen, FailuresAreCountedAndListed) {
  test::FakeOpenAiServer server({.ttft_s = 0.001, .itl_s = 0.001, .tokens = 3, .fail_every = 2});
  LoadgenConfig c = fake_config(server);
  const PointSummary s = run_point(c, 1, 4, 1);
  EXPECT_EQ(s.completed, 2);
  EXPECT_EQ(s.failed, 2);
  EXPECT_NE(s.requests[1].error.find("HTTP 400"), std::string::npos) << s.requests[1].error;
  EXPECT_NE(s.requests[1].error.find("fake failure"), std::string::npos);
  const Json j = point_to_json(s);
  EXPECT_EQ(j["errors"][1], s.requests[1].error);
  EXPECT_EQ(j["errors"][0], "");
  EXPECT_EQ(j["output_lens"][1], 0);

  c.url = "http://127.0.0.1:1";  // nothing listens there
  c.timeout_s = 5;
  const RequestResult r = send_request(c, make_prompts(c, 1, 1)[0]);
  EXPECT_FALSE(r.success);
  EXPECT_NE(r.error.find("request failed"), std::string::npos) << r.error;
}

TEST(BenchServerMetrics, PrometheusParsingAndDeltas) {
  const std::string before =
      "# HELP x\nmlaserve:engine_steps_total{model_name=\"m\"} 100\nmlaserve:engine_forward_seconds_total{model_name=\"m\"} 1.0\n"
      "mlaserve:engine_step_seconds_total{model_name=\"m\"} 1.2\ngarbage line without value x\n"
      "vllm:spec_decode_num_drafts_total{a=\"1\"} 10\nvllm:spec_decode_num_draft_tokens_total 40\n"
      "vllm:spec_decode_num_accepted_tokens_total 20\n"
      "vllm:spec_decode_num_accepted_tokens_per_pos_total{position=\"0\"} 9\n"
      "vllm:spec_decode_num_accepted_tokens_per_pos_total{position=\"1\"} 6\n";
  const std::string after =
      "mlaserve:engine_steps_total{model_name=\"m\"} 300\nmlaserve:engine_forward_seconds_total{model_name=\"m\"} 3.0\n"
      "mlaserve:engine_step_seconds_total{model_name=\"m\"} 3.5\n"
      "vllm:spec_decode_num_drafts_total{a=\"1\"} 30\nvllm:spec_decode_num_draft_tokens_total 120\n"
      "vllm:spec_decode_num_accepted_tokens_total 70\n"
      "vllm:spec_decode_num_accepted_tokens_per_pos_total{position=\"0\"} 29\n"
      "vllm:spec_decode_num_accepted_tokens_per_pos_total{position=\"1\"} 16\n";
  const bench::ServerCounters b = bench::parse_prometheus_counters(before), a = bench::parse_prometheus_counters(after);
  EXPECT_DOUBLE_EQ(b.get("engine_steps"), 100);
  EXPECT_FALSE(b.has("garbage"));
  const bench::ServerPointStats s = bench::server_point_stats(b, a, /*duration_s=*/2.4);
  ASSERT_TRUE(s.has_engine && s.has_spec);
  EXPECT_DOUBLE_EQ(s.steps, 200);
  EXPECT_DOUBLE_EQ(s.forward_ms_per_step, 10.0);       // 2 s / 200 steps
  EXPECT_DOUBLE_EQ(s.step_ms_per_step, 11.5);          // 2.3 s / 200
  EXPECT_NEAR(s.engine_host_overhead, 0.15, 1e-12);    // (2.3 - 2) / 2
  EXPECT_NEAR(s.server_overhead, 0.2, 1e-12);          // 2.4 s / 2 s of forward - 1
  EXPECT_NEAR(s.server_overhead_vs_step, 2.4 / 2.3 - 1, 1e-12);
  EXPECT_DOUBLE_EQ(s.spec_acceptance_rate, 50.0 / 80.0);
  EXPECT_DOUBLE_EQ(s.spec_acceptance_length, 1.0 + 50.0 / 20.0);
  ASSERT_EQ(s.spec_per_position_acceptance_rates.size(), 2u);
  EXPECT_DOUBLE_EQ(s.spec_per_position_acceptance_rates[0], 1.0);
  EXPECT_DOUBLE_EQ(s.spec_per_position_acceptance_rates[1], 0.5);
  const bench::ServerPointStats none = bench::server_point_stats({}, {}, 5.0);
  EXPECT_FALSE(none.has_engine || none.has_spec);
}

TEST(BenchServerMetrics, PointsCarryTheServersCountersForThatPoint) {
  test::FakeServerOptions o;
  o.ttft_s = 0.01;
  o.itl_s = 0.01;
  o.metrics = true;
  test::FakeOpenAiServer server(o);
  bench::LoadgenConfig cfg;
  cfg.url = server.url();
  cfg.model = "fake";
  cfg.input_len = 4;
  cfg.output_len = 5;
  cfg.num_prompts = 4;
  cfg.concurrency = {2};
  cfg.warmup = 1;
  auto points = bench::run_benchmark(cfg);
  ASSERT_TRUE(points.is_ok()) << points.status().message();
  ASSERT_EQ(points->size(), 1u);
  const bench::PointSummary& p = points->front();
  ASSERT_TRUE(p.server.has_value());
  EXPECT_DOUBLE_EQ(p.server->steps, 4 * 5);  // the warm-up's steps are not in the point
  EXPECT_NEAR(p.server->forward_ms_per_step, 8.0, 1e-9);
  EXPECT_NEAR(p.server->engine_host_overhead, 0.125, 1e-9);
  EXPECT_DOUBLE_EQ(p.server->spec_num_drafts, 4);
  EXPECT_NEAR(p.server->spec_acceptance_length, 3.0, 1e-12);
  const nlohmann::json j = bench::point_to_json(p);
  EXPECT_NEAR(j["server"]["spec_decode_acceptance_length"].get<double>(), 3.0, 1e-12);
  // The point's own duration against the fake's 20 steps x 8 ms of "forward" (not physical here).
  EXPECT_NEAR(j["server"]["server_overhead"].get<double>(), p.duration / (20 * 0.008) - 1.0, 1e-9);
}

TEST(BenchResult, JsonHasVllmFieldNamesCostAndPlan) {
  std::vector<RequestResult> rs(2);
  rs[0] = {true, "", 1024, 400, 0.1, {0.01, 0.01}, 4.1, 0};
  rs[1] = {true, "", 1024, 400, 0.2, {0.02}, 4.2, 0};
  const std::vector<PointSummary> points = {summarize_point(rs, 5.0, 1, std::nullopt)};
  LoadgenConfig cfg;
  cfg.model = "deepseek-v3";
  cfg.url = "http://x";
  cfg.input_len = 1024;
  cfg.output_len = 400;
  Cost cost;
  cost.gpu = "h200";
  cost.gpus = 8;
  cost.usd_per_gpu_hour = 3.0;
  auto geometry = plan::plan_preset("deepseek-v3");
  ASSERT_TRUE(geometry.is_ok());
  auto catalog = plan::load_default_gpu_catalog();
  ASSERT_TRUE(catalog.is_ok()) << catalog.status().message();
  const plan::GpuSpec* gpu = catalog->find("h200");
  ASSERT_NE(gpu, nullptr);
  plan::PlanInput in;
  in.gpus = 8;
  in.weights = geometry->shipped;
  in.context = 1424;
  auto cmp = compare_with_plan(points, *geometry, *gpu, in);
  ASSERT_TRUE(cmp.is_ok()) << cmp.status().message();
  ASSERT_EQ(cmp->size(), 1u);
  const PlanComparison& pc = cmp->front();
  EXPECT_EQ(pc.concurrency, 1);
  ASSERT_GT(pc.estimate.decode_tok_s, 0);
  EXPECT_DOUBLE_EQ(pc.ratio_output, points[0].output_throughput / pc.estimate.decode_tok_s);
  EXPECT_DOUBLE_EQ(pc.ratio_per_user, points[0].per_user_tok_s / pc.estimate.decode_tok_s_per_user);

  const Json j = result_to_json(cfg, points, cost, *cmp);
  ASSERT_EQ(j["points"].size(), 1u);
  const Json& p = j["points"][0];
  for (const char* k : {"completed", "duration", "total_input_tokens", "total_output_tokens", "request_throughput",
                        "output_throughput", "total_token_throughput", "max_concurrency", "request_rate", "ttfts",
                        "itls", "input_lens", "output_lens", "errors", "usd_per_mtok_output", "usd_per_mtok_input"})
    EXPECT_TRUE(p.contains(k)) << k;
  for (const char* m : {"ttft", "tpot", "itl", "e2el"})
    for (const char* s : {"mean", "median", "std", "p90", "p99"})
      EXPECT_TRUE(p.contains(fmt::format("{}_{}_ms", s, m))) << s << "_" << m;
  EXPECT_EQ(p["request_rate"], "inf");
  EXPECT_EQ(p["max_concurrency"], 1);
  EXPECT_EQ(p["total_output_tokens"], 800);
  EXPECT_DOUBLE_EQ(p["output_throughput"].get<double>(), 160.0);
  EXPECT_DOUBLE_EQ(p["usd_per_mtok_output"].get<double>(), 24.0 / (160.0 * 3600) * 1e6);
  EXPECT_EQ(p["ttfts"][1], 0.2);
  EXPECT_EQ(p["itls"][0].size(), 2u);
  EXPECT_EQ(j["single_stream_tok_s"], points[0].per_user_tok_s);
  EXPECT_EQ(j["date"].get<std::string>().size(), 15u);  // vLLM's YYYYMMDD-HHMMSS
  EXPECT_EQ(j["cost"]["usd_per_hour"], 24.0);
  EXPECT_EQ(j["cost"]["gpu"], "h200");
  EXPECT_TRUE(j["cost"]["formula"].is_string());
  EXPECT_EQ(j["plan"]["gpu"], "h200");
  EXPECT_EQ(j["plan"]["context"], 1424);
  EXPECT_EQ(j["plan"]["points"][0]["ratio_output"], pc.ratio_output);
  EXPECT_EQ(j["plan"]["points"][0]["plan_decode_tok_s"], pc.estimate.decode_tok_s);
  const std::string text = describe_result(cfg, points, cost, *cmp);
  EXPECT_NE(text.find("TTFT (ms):"), std::string::npos) << text;
  EXPECT_NE(text.find("vs plan"), std::string::npos) << text;
  EXPECT_NE(text.find("Cost per M tokens"), std::string::npos) << text;

  // Without cost and plan the keys are null, and rate-mode points use Little's law for the planner.
  const Json bare = result_to_json(cfg, points, std::nullopt, {});
  EXPECT_TRUE(bare["cost"].is_null());
  EXPECT_TRUE(bare["plan"].is_null());
  EXPECT_FALSE(bare["points"][0].contains("usd_per_mtok_output"));
  PointSummary rate = points[0];
  rate.max_concurrency.reset();
  rate.request_throughput = 2.0;
  rate.e2el.mean = 4000;
  EXPECT_EQ(plan_concurrency(rate), 8);
}

std::string run_capture(const std::string& cmd, int* status) {
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while (p && (n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  *status = p ? pclose(p) : -1;
  return out;
}

TEST(BenchCli, BadFlagsFailBeforeSendingAnything) {
  int st = 0;
  std::string out = run_capture(fmt::format("{} bench --url nope --model m 2>&1", MLA_BINARY), &st);
  EXPECT_NE(st, 0);
  EXPECT_NE(out.find("--url"), std::string::npos) << out;
  out = run_capture(fmt::format("{} bench --url http://127.0.0.1:1 --model m --gpu nosuch 2>&1", MLA_BINARY), &st);
  EXPECT_NE(st, 0);
  EXPECT_NE(out.find("--gpu"), std::string::npos) << out;
  out = run_capture(fmt::format("{} bench --url http://127.0.0.1:1 --model m --plan 2>&1", MLA_BINARY), &st);
  EXPECT_NE(st, 0);
  EXPECT_NE(out.find("--plan"), std::string::npos) << out;
}

// The binary against the real server on the embedded CPU model, tiny lengths: ids prompts are
// accepted, ignore_eos/min_tokens force the output length, usage gives exact token counts.
TEST(BenchCli, AgainstRealServer) {
  test::ServerProcess server("--served-model-name mla-test --max-num-seqs 4 --num-kv-blocks 128 --max-model-len 256");
  ASSERT_GT(server.port(), 0) << server.log();
  const std::string json_path = ::testing::TempDir() + "/bench_result.json";
  int st = 0;
  const std::string out = run_capture(
      fmt::format("{} bench --url http://127.0.0.1:{} --model mla-test --input-len 8 --output-len 4 --num-prompts 4 "
                  "--concurrency 1,2 --warmup 1 --gpu h200 --gpus 1 --plan --plan-model {} --result-json {} 2>&1",
                  MLA_BINARY, server.port(), test::default_model_dir(), json_path),
      &st);
  ASSERT_EQ(st, 0) << out;
  std::ifstream f(json_path);
  const Json j = Json::parse(f, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << out;
  ASSERT_EQ(j["points"].size(), 2u);
  for (const Json& p : j["points"]) {
    EXPECT_EQ(p["completed"], 4) << p["errors"];
    EXPECT_EQ(p["total_input_tokens"], 4 * 8);
    EXPECT_EQ(p["total_output_tokens"], 4 * 4);
    EXPECT_GT(p["output_throughput"].get<double>(), 0);
    EXPECT_GT(p["usd_per_mtok_output"].get<double>(), 0);
  }
  EXPECT_EQ(j["cost"]["gpu"], "h200");
  EXPECT_FALSE(j["plan"].is_null());
  EXPECT_GT(j["single_stream_tok_s"].get<double>(), 0);
  EXPECT_NE(out.find("vs plan"), std::string::npos) << out;
  std::remove(json_path.c_str());
}

}  // namespace
}  // namespace mla::bench
