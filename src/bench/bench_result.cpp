// The bench result document and its terminal rendering; the planner run per measured point.
#include "bench/bench_result.h"

#include <algorithm>
#include <cmath>
#include <ctime>

#include <fmt/format.h>

namespace mla::bench {

namespace {

using Json = nlohmann::json;

double ratio(double measured, double estimated) { return estimated > 0 ? measured / estimated : 0.0; }

std::string point_label(const PointSummary& p) {
  std::string s = p.request_rate ? fmt::format("request rate {:g} req/s", *p.request_rate) : "";
  if (p.max_concurrency) s += fmt::format("{}concurrency {}", s.empty() ? "" : ", max ", *p.max_concurrency);
  return s;
}

}  // namespace

int plan_concurrency(const PointSummary& p) {
  if (p.max_concurrency) return std::max(1, *p.max_concurrency);
  // Little's law: mean in flight = arrival (completion) rate x mean time in the system.
  return std::max(1, int(std::lround(p.request_throughput * p.e2el.mean / 1000.0)));
}

Result<std::vector<PlanComparison>> compare_with_plan(const std::vector<PointSummary>& points,
                                                      const plan::ModelGeometry& model, const plan::GpuSpec& gpu,
                                                      plan::PlanInput base) {
  std::vector<PlanComparison> out;
  for (const PointSummary& p : points) {
    PlanComparison c;
    c.concurrency = plan_concurrency(p);
    plan::PlanInput in = base;
    in.concurrency = c.concurrency;
    MLA_ASSIGN_OR_RETURN(c.estimate, plan::plan(model, gpu, in));
    c.measured_output_tok_s = p.output_throughput;
    c.measured_per_user_tok_s = p.per_user_tok_s;
    c.ratio_output = ratio(c.measured_output_tok_s, c.estimate.decode_tok_s);
    c.ratio_per_user = ratio(c.measured_per_user_tok_s, c.estimate.decode_tok_s_per_user);
    out.push_back(std::move(c));
  }
  return out;
}

nlohmann::json result_to_json(const LoadgenConfig& cfg, const std::vector<PointSummary>& points,
                              const std::optional<Cost>& cost, const std::vector<PlanComparison>& plan) {
  Json j{{"model", cfg.model},
         {"url", cfg.url},
         {"endpoint", cfg.endpoint},
         {"input_len", cfg.input_len},
         {"output_len", cfg.output_len},
         {"prompt_format", cfg.prompt_format == PromptFormat::Ids ? "ids" : "text"},
         {"seed", cfg.seed},
         {"warmup", cfg.warmup}};
  {
    // vLLM's "date" format: YYYYMMDD-HHMMSS (UTC here).
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    gmtime_r(&now, &tm);
    char date[32];
    std::strftime(date, sizeof(date), "%Y%m%d-%H%M%S", &tm);
    j["date"] = date;
  }
  j["single_stream_tok_s"] = nullptr;
  Json pts = Json::array();
  for (const PointSummary& p : points) {
    Json pj = point_to_json(p);
    if (cost) {
      const PointCost pc = point_cost(*cost, p);
      pj["usd_per_mtok_output"] = pc.usd_per_mtok_output;
      pj["usd_per_mtok_input"] = pc.usd_per_mtok_input;
      pj["usd_per_mtok_total"] = pc.usd_per_mtok_total;
    }
    if (p.max_concurrency == 1 && !p.request_rate && j["single_stream_tok_s"].is_null())
      j["single_stream_tok_s"] = p.per_user_tok_s;
    pts.push_back(std::move(pj));
  }
  j["points"] = std::move(pts);
  if (cost) {
    j["cost"] = Json{{"gpu", cost->gpu},
                     {"gpus", cost->gpus},
                     {"usd_per_gpu_hour", cost->usd_per_gpu_hour},
                     {"usd_per_hour", cost->usd_per_hour()},
                     {"price_source", cost->price_source},
                     {"price_date", cost->price_date},
                     {"formula", kCostFormula}};
  } else {
    j["cost"] = nullptr;
  }
  if (plan.empty()) {
    j["plan"] = nullptr;
  } else {
    const plan::PlanResult& e0 = plan.front().estimate;
    Json pp = Json::array();
    for (size_t i = 0; i < plan.size(); ++i) {
      const PlanComparison& c = plan[i];
      pp.push_back(Json{{"max_concurrency", i < points.size() && points[i].max_concurrency
                                                ? Json(*points[i].max_concurrency)
                                                : Json(nullptr)},
                        {"plan_concurrency", c.concurrency},
                        {"plan_batch", c.estimate.batch},
                        {"plan_decode_tok_s", c.estimate.decode_tok_s},
                        {"plan_decode_tok_s_per_user", c.estimate.decode_tok_s_per_user},
                        {"plan_usd_per_mtok_output", c.estimate.usd_per_mtok_output},
                        {"measured_output_tok_s", c.measured_output_tok_s},
                        {"measured_per_user_tok_s", c.measured_per_user_tok_s},
                        {"ratio_output", c.ratio_output},
                        {"ratio_per_user", c.ratio_per_user}});
    }
    j["plan"] = Json{{"model", e0.model},
                     {"gpu", e0.gpu},
                     {"gpus", e0.gpus},
                     {"context", cfg.input_len + cfg.output_len},
                     {"fits", e0.fits},
                     {"max_plan_concurrency", e0.max_concurrency},
                     {"weight_bytes", e0.weight_bytes},
                     {"kv_bytes_per_token", e0.kv_bytes_per_token},
                     {"note", "ratio = measured / planner roofline (an upper bound); measured output tok/s "
                              "includes prefill time, the planner's decode figure does not"},
                     {"points", std::move(pp)}};
  }
  return j;
}

std::string describe_result(const LoadgenConfig& cfg, const std::vector<PointSummary>& points,
                            const std::optional<Cost>& cost, const std::vector<PlanComparison>& plan) {
  std::string s;
  auto line = [&s](std::string_view name, auto value) { s += fmt::format("{:<40} {:<10.2f}\n", name, value); };
  for (size_t i = 0; i < points.size(); ++i) {
    const PointSummary& p = points[i];
    s += fmt::format("============ {} ({} in / {} out) ============\n", point_label(p), cfg.input_len, cfg.output_len);
    s += fmt::format("{:<40} {:<10}\n", "Successful requests:", p.completed);
    if (p.failed) s += fmt::format("{:<40} {:<10}\n", "Failed requests:", p.failed);
    line("Benchmark duration (s):", p.duration);
    s += fmt::format("{:<40} {:<10}\n", "Total input tokens:", p.total_input_tokens);
    s += fmt::format("{:<40} {:<10}\n", "Total generated tokens:", p.total_output_tokens);
    line("Request throughput (req/s):", p.request_throughput);
    line("Output token throughput (tok/s):", p.output_throughput);
    line("Total Token throughput (tok/s):", p.total_token_throughput);
    line("Per-user decode (tok/s, 1000/TPOT):", p.per_user_tok_s);
    const std::pair<const char*, const LatencyStats*> stats[] = {
        {"TTFT", &p.ttft}, {"TPOT", &p.tpot}, {"ITL", &p.itl}, {"E2EL", &p.e2el}};
    for (const auto& [name, st] : stats) {
      s += fmt::format("{:<40} mean {:.2f}  p50 {:.2f}  p90 {:.2f}  p99 {:.2f}\n", fmt::format("{} (ms):", name),
                       st->mean, st->median, st->p90, st->p99);
    }
    if (p.server && p.server->has_engine) {
      const ServerPointStats& v = *p.server;
      s += fmt::format("{:<40} forward {:.3f} ms/step, step {:.3f} ms/step over {:.0f} steps\n",
                       "Server engine (its /metrics):", v.forward_ms_per_step, v.step_ms_per_step, v.steps);
      s += fmt::format("{:<40} {:.1f}% of device time (duration / forward - 1); engine host {:.1f}%; "
                       "vs engine step {:.1f}%\n", "Server overhead per token:", 100 * v.server_overhead,
                       100 * v.engine_host_overhead, 100 * v.server_overhead_vs_step);
    }
    if (p.server && p.server->has_spec) {
      const ServerPointStats& v = *p.server;
      std::string per_pos;
      for (double r : v.spec_per_position_acceptance_rates) per_pos += fmt::format(" {:.2f}", r);
      s += fmt::format("{:<40} length {:.2f}, rate {:.2f}, per position{}\n", "Speculative acceptance:",
                       v.spec_acceptance_length, v.spec_acceptance_rate, per_pos);
    }
    if (cost) {
      const PointCost pc = point_cost(*cost, p);
      s += fmt::format("{:<40} ${:.4f} output, ${:.4f} input, ${:.4f} total\n", "Cost per M tokens:",
                       pc.usd_per_mtok_output, pc.usd_per_mtok_input, pc.usd_per_mtok_total);
    }
    if (i < plan.size()) {
      const PlanComparison& c = plan[i];
      s += fmt::format("{:<40} measured {:.1f} vs plan {:.1f} tok/s (x{:.3f})\n", "Aggregate output vs plan:",
                       c.measured_output_tok_s, c.estimate.decode_tok_s, c.ratio_output);
      s += fmt::format("{:<40} measured {:.1f} vs plan {:.1f} tok/s (x{:.3f})\n", "Per-user decode vs plan:",
                       c.measured_per_user_tok_s, c.estimate.decode_tok_s_per_user, c.ratio_per_user);
      if (!c.estimate.fits) s += "  (the planner says this model does not fit this GPU set: no estimate)\n";
    }
    int64_t off_length = 0;
    for (const RequestResult& r : p.requests) off_length += r.success && r.output_len != cfg.output_len;
    if (off_length)
      s += fmt::format("  warning: {} requests returned a number of output tokens other than {} (does the server "
                       "honour ignore_eos and min_tokens?)\n",
                       off_length, cfg.output_len);
    if (p.failed) {
      for (const RequestResult& r : p.requests)
        if (!r.success) {
          s += "  first error: " + r.error + "\n";
          break;
        }
    }
  }
  if (cost) {
    s += fmt::format("cost: {} x {} at ${:.2f}/GPU-hour = ${:.2f}/hour ({}{}{})\n",
                     cost->gpus, cost->gpu.empty() ? "GPU" : cost->gpu, cost->usd_per_gpu_hour, cost->usd_per_hour(),
                     cost->price_source.empty() ? "--price" : cost->price_source,
                     cost->price_date.empty() ? "" : ", ", cost->price_date);
    s += std::string("formula: ") + kCostFormula + "\n";
  }
  if (!plan.empty())
    s += fmt::format("plan: {} on {}x {}, context {} (planner roofline: an upper bound)\n", plan.front().estimate.model,
                     plan.front().estimate.gpus, plan.front().estimate.gpu, cfg.input_len + cfg.output_len);
  return s;
}

}  // namespace mla::bench
