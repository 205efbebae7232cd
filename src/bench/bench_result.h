// The whole `mlaserve bench` result: the points, their cost per token and the planner's estimate
// beside each measured figure, as one JSON document (the --result-json file, the report's input)
// and as text for the terminal.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/loadgen.h"
#include "bench/metrics.h"
#include "plan/planner.h"

namespace mla::bench {

// The planner's estimate for one measured point, and measured / estimated.
struct PlanComparison {
  int concurrency = 0;                 // sequences the planner was asked about
  plan::PlanResult estimate;
  double measured_output_tok_s = 0;    // point.output_throughput (aggregate)
  double measured_per_user_tok_s = 0;  // point.per_user_tok_s = 1000 / mean_tpot_ms
  // measured / estimated (0 when the planner gives no figure, e.g. the model does not fit).
  double ratio_output = 0, ratio_per_user = 0;
};

// The concurrency the planner is asked about for a point: max_concurrency, or in rate mode the mean
// number in flight by Little's law (request_throughput * mean E2E), at least 1.
int plan_concurrency(const PointSummary& p);

// Runs the planner for each point (context = input_len + output_len, batch = plan_concurrency).
Result<std::vector<PlanComparison>> compare_with_plan(const std::vector<PointSummary>& points,
                                                      const plan::ModelGeometry& model, const plan::GpuSpec& gpu,
                                                      plan::PlanInput base);

// {"model", "url", "endpoint", "input_len", "output_len", "prompt_format", "seed", "single_stream_tok_s",
//  "points": [point_to_json + usd_per_mtok_{output,input,total} when costed],
//  "cost": {gpu, gpus, usd_per_gpu_hour, usd_per_hour, price_source, price_date, formula} | null,
//  "plan": {model, gpu, gpus, weights, context, points: [{max_concurrency, plan_concurrency,
//           plan_decode_tok_s, plan_decode_tok_s_per_user, measured_output_tok_s,
//           measured_per_user_tok_s, ratio_output, ratio_per_user, fits, max_plan_concurrency}]} | null}
// single_stream_tok_s: per_user_tok_s of the concurrency-1 point (null without one).
nlohmann::json result_to_json(const LoadgenConfig& cfg, const std::vector<PointSummary>& points,
                              const std::optional<Cost>& cost, const std::vector<PlanComparison>& plan);

// The terminal summary: one block per point in vLLM's layout, then cost and plan lines.
std::string describe_result(const LoadgenConfig& cfg, const std::vector<PointSummary>& points,
                            const std::optional<Cost>& cost, const std::vector<PlanComparison>& plan);

}  // namespace mla::bench
