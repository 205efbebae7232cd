// `mlaserve bench`: load-test any OpenAI-compatible server with exact input/output lengths, report
// vLLM-style latency and throughput per concurrency (or request-rate) point, the cost per token, and
// optionally the planner's estimate beside each measured figure.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>

#include <fmt/ranges.h>

#include "bench/bench_result.h"
#include "bench/loadgen.h"
#include "bench/report.h"
#include "cli/commands.h"
#include "io/model_config.h"
#include "plan/planner.h"

namespace mla::cli {

namespace {

struct BenchOptions {
  bench::LoadgenConfig cfg;
  std::vector<int> concurrency;
  double request_rate = 0;
  std::string prompt_format = "ids", token_ids = "256:4000";
  std::string gpu, catalog, result_json, report, report_png;
  int gpus = 0;
  double price = 0;
  bool plan = false;
  std::string plan_model, plan_preset, plan_weights;
};

// A request counter on stderr (only on a terminal); one line per point.
class RequestProgress {
 public:
  explicit RequestProgress(std::string label)
      : label_(std::move(label)), enabled_(isatty(STDERR_FILENO)), start_(std::chrono::steady_clock::now()) {}
  void update(int done, int total) {
    if (!enabled_) return;
    const auto now = std::chrono::steady_clock::now();
    const bool final = done >= total;
    if (!final && now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    constexpr int kWidth = 30;
    std::string bar(size_t(total ? kWidth * done / total : kWidth), '#');
    bar.resize(kWidth, '.');
    std::fprintf(stderr, "\r%s [%s] %d/%d requests %6.1fs%s", label_.c_str(), bar.c_str(), done, total,
                 std::chrono::duration<double>(now - start_).count(), final ? "\n" : "");
    std::fflush(stderr);
  }

 private:
  std::string label_;
  bool enabled_;
  std::chrono::steady_clock::time_point start_, last_{};
};

Result<std::pair<int32_t, int32_t>> parse_id_range(const std::string& s) {
  const size_t colon = s.find(':');
  try {
    if (colon == std::string::npos) throw std::invalid_argument(s);
    return std::pair<int32_t, int32_t>{std::stoi(s.substr(0, colon)), std::stoi(s.substr(colon + 1))};
  } catch (const std::exception&) {
    return error("--token-ids: \"{}\" is not MIN:MAX", s);
  }
}

Result<plan::GpuCatalog> catalog_for(const BenchOptions& o) {
  MLA_ASSIGN_OR_RETURN(plan::GpuCatalog catalog, plan::load_default_gpu_catalog());
  if (!o.catalog.empty()) {
    MLA_RETURN_IF_ERROR(plan::apply_catalog_override(catalog, o.catalog));
  }
  return catalog;
}

// The price: --gpu's catalog entry (x --gpus), with --price replacing its $/GPU-hour; or --price alone.
Result<std::optional<bench::Cost>> cost_for(const BenchOptions& o, const plan::GpuCatalog* catalog) {
  if (o.gpu.empty() && o.price <= 0) return std::optional<bench::Cost>();
  bench::Cost c;
  c.gpus = o.gpus > 0 ? o.gpus : 1;
  if (!o.gpu.empty()) {
    const plan::GpuSpec* g = catalog->find(o.gpu);
    if (!g) return error("--gpu: unknown \"{}\" (catalog has {})", o.gpu, fmt::join(catalog->keys(), ", "));
    c.gpu = g->key;
    c.usd_per_gpu_hour = g->price_per_gpu_hour;
    c.price_source = g->price_source;
    c.price_date = g->price_date;
  }
  if (o.price > 0) {
    c.usd_per_gpu_hour = o.price;
    c.price_source = "--price";
    c.price_date.clear();
  }
  return std::optional<bench::Cost>(c);
}

// --plan-preset, else --plan-model, else --model when it names a preset or a model directory.
Result<plan::ModelGeometry> plan_geometry(const BenchOptions& o) {
  if (!o.plan_preset.empty()) return plan::plan_preset(o.plan_preset);
  const std::string dir = !o.plan_model.empty() ? o.plan_model : o.cfg.model;
  if (o.plan_model.empty()) {
    for (const std::string& p : plan::plan_preset_names())
      if (p == o.cfg.model) return plan::plan_preset(p);
  }
  auto cfg = io::load_model_config(dir);
  if (!cfg)
    return error("--plan: give --plan-preset NAME ({}) or --plan-model DIR ({})", fmt::join(plan::plan_preset_names(), ", "),
                 cfg.status().message());
  return plan::geometry_from_config(*cfg, dir);
}

int run_bench(BenchOptions& o) {
  auto fail = [](const std::string& msg) {
    std::fprintf(stderr, "mlaserve bench: %s\n", msg.c_str());
    return 1;
  };
  bench::LoadgenConfig& cfg = o.cfg;
  if (o.prompt_format == "ids") {
    cfg.prompt_format = bench::PromptFormat::Ids;
  } else if (o.prompt_format == "text") {
    cfg.prompt_format = bench::PromptFormat::Text;
  } else {
    return fail(fmt::format("--prompt-format: \"{}\" is not ids or text", o.prompt_format));
  }
  auto range = parse_id_range(o.token_ids);
  if (!range) return fail(range.status().message());
  cfg.token_id_min = range->first;
  cfg.token_id_max = range->second;
  if (o.request_rate > 0) {
    cfg.request_rate = o.request_rate;
    cfg.concurrency = o.concurrency;  // empty: no cap
  } else {
    cfg.concurrency = o.concurrency.empty() ? std::vector<int>{1} : o.concurrency;
  }
  if (Status s = bench::validate_config(cfg); !s.is_ok()) return fail(s.message());

  // Everything that can fail on the user's flags fails before the first request is sent.
  std::optional<plan::GpuCatalog> catalog;
  if (!o.gpu.empty() || o.plan) {
    auto c = catalog_for(o);
    if (!c) return fail(c.status().message());
    catalog = std::move(c).value();
  }
  auto cost = cost_for(o, catalog ? &*catalog : nullptr);
  if (!cost) return fail(cost.status().message());
  std::optional<plan::ModelGeometry> geometry;
  plan::PlanInput plan_in;
  const plan::GpuSpec* plan_gpu = nullptr;
  if (o.plan) {
    if (o.gpu.empty()) return fail("--plan needs --gpu KIND (and --gpus N) to know what to estimate");
    plan_gpu = catalog->find(o.gpu);
    auto g = plan_geometry(o);
    if (!g) return fail(g.status().message());
    geometry = std::move(g).value();
    plan_in.weights = geometry->shipped;
    if (!o.plan_weights.empty()) {
      auto w = plan::parse_weight_format(o.plan_weights);
      if (!w) return fail(w.status().message());
      plan_in.weights = *w;
    }
    plan_in.gpus = o.gpus > 0 ? o.gpus : 1;
    plan_in.context = cfg.input_len + cfg.output_len;
  }

  std::vector<std::unique_ptr<RequestProgress>> bars;
  auto progress = [&](int point) -> bench::ProgressFn {
    std::string label = cfg.request_rate ? fmt::format("bench rate {:g}", *cfg.request_rate)
                                         : fmt::format("bench c={}", cfg.concurrency[size_t(point)]);
    bars.push_back(std::make_unique<RequestProgress>(label));
    RequestProgress* bar = bars.back().get();
    return [bar](int done, int total) { bar->update(done, total); };
  };
  auto points = bench::run_benchmark(cfg, progress);
  if (!points) return fail(points.status().message());

  std::vector<bench::PlanComparison> comparisons;
  if (o.plan) {
    auto c = bench::compare_with_plan(*points, *geometry, *plan_gpu, plan_in);
    if (!c) return fail(c.status().message());
    comparisons = std::move(c).value();
  }
  std::fputs(bench::describe_result(cfg, *points, *cost, comparisons).c_str(), stdout);
  const nlohmann::json result = bench::result_to_json(cfg, *points, *cost, comparisons);
  if (!o.result_json.empty()) {
    std::ofstream f(o.result_json);
    f << result.dump(2) << "\n";
    if (!f) return fail(fmt::format("--result-json: cannot write {}", o.result_json));
  }
  if (!o.report.empty()) {
    bench::ReportOptions ro;
    ro.title = fmt::format("mlaserve bench: {} ({} in / {} out)", cfg.model, cfg.input_len, cfg.output_len);
    if (Status s = bench::write_report(result, o.report, ro); !s.is_ok()) return fail(s.message());
    std::fprintf(stderr, "mlaserve bench: wrote %s\n", o.report.c_str());
    if (!o.report_png.empty()) {  // a screenshot of the report for READMEs (needs Chromium)
      if (Status s = bench::render_report_png(o.report, o.report_png); !s.is_ok()) return fail(s.message());
      std::fprintf(stderr, "mlaserve bench: wrote %s\n", o.report_png.c_str());
    }
  }
  int64_t completed = 0;
  for (const bench::PointSummary& p : *points) completed += p.completed;
  return completed > 0 ? 0 : fail("no request succeeded");
}

}  // namespace

Command add_bench_command(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  CLI::App* sub = app.add_subcommand("bench", "Load-test an OpenAI-compatible server: latency, throughput, $/Mtok");
  bench::LoadgenConfig& c = o->cfg;
  sub->add_option("--url", c.url, "Server base URL, e.g. http://127.0.0.1:8000")->required();
  sub->add_option("--model", c.model, "Model name the server serves")->required();
  sub->add_option("--endpoint", c.endpoint, "/v1/completions or /v1/chat/completions")->capture_default_str();
  sub->add_option("--api-key", c.api_key, "Bearer token (default: $OPENAI_API_KEY)")->envname("OPENAI_API_KEY");
  sub->add_option("--input-len", c.input_len, "Prompt tokens per request")->capture_default_str();
  sub->add_option("--output-len", c.output_len, "Output tokens per request (forced: ignore_eos, min_tokens)")
      ->capture_default_str();
  sub->add_option("--num-prompts", c.num_prompts, "Requests per point (default: 8 x concurrency, at least 16)");
  sub->add_option("--concurrency", o->concurrency, "Concurrency sweep, e.g. 1,8,32,64 (with --request-rate: a cap)")
      ->delimiter(',');
  sub->add_option("--request-rate", o->request_rate, "Poisson arrivals at R req/s instead of a sweep");
  sub->add_option("--warmup", c.warmup, "Unmeasured requests before the first point")->capture_default_str();
  sub->add_option("--seed", c.seed, "Seed of prompts and arrivals")->capture_default_str();
  sub->add_option("--prompt-format", o->prompt_format, "ids (token-id arrays, exact length) | text")
      ->capture_default_str();
  sub->add_option("--token-ids", o->token_ids, "Range MIN:MAX of random prompt token ids")->capture_default_str();
  sub->add_option("--timeout", c.timeout_s, "Per-request read timeout, seconds")->capture_default_str();
  sub->add_option("--gpu", o->gpu, "GPU kind the server runs on (catalog key), for cost and --plan");
  sub->add_option("--gpus", o->gpus, "Number of GPUs the server uses (default 1)");
  sub->add_option("--price", o->price, "USD per GPU-hour (overrides the catalog's price)");
  sub->add_option("--catalog", o->catalog, "JSON file overriding/adding GPU catalog entries");
  sub->add_flag("--plan", o->plan, "Print the planner's estimate beside each measured figure");
  sub->add_option("--plan-model", o->plan_model, "Model directory for --plan (reads config.json)");
  sub->add_option("--plan-preset", o->plan_preset, "Planner preset for --plan (deepseek-v3, kimi-k2, ...)");
  sub->add_option("--plan-weights", o->plan_weights, "Weight format for --plan (default: the checkpoint's)");
  sub->add_option("--result-json", o->result_json, "Write the full result (vLLM field names) to this file");
  sub->add_option("--report", o->report, "Write a self-contained HTML report to this file");
  sub->add_option("--report-png", o->report_png, "Also render the report to a PNG (headless Chromium)")
      ->needs(sub->get_option("--report"));
  return {sub, [o] { return run_bench(*o); }};
}

}  // namespace mla::cli
