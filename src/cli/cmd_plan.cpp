// `mlaserve plan`: does a model fit on N GPUs of a kind, what KV budget is left, and what roofline
// throughput and $/Mtok to expect. Pure arithmetic over the GPU catalog; nothing is loaded but config.json.
#include <cstdio>
#include <memory>
#include <optional>

#include <fmt/ranges.h>

#include "cli/commands.h"
#include "plan/planner.h"

namespace mla::cli {

namespace {

struct PlanOptions {
  std::string model_dir, preset, gpu, weights, catalog;
  int gpus = 8, tp = 0, ep = 0, concurrency = 1;
  int64_t context = 8192;
  bool json = false;
};

Result<plan::PlanResult> run_plan(const PlanOptions& o) {
  if (o.model_dir.empty() == o.preset.empty()) return error("pass exactly one of --model DIR and --preset NAME");
  plan::ModelGeometry geometry;
  if (!o.preset.empty()) {
    MLA_ASSIGN_OR_RETURN(geometry, plan::plan_preset(o.preset));
  } else {
    MLA_ASSIGN_OR_RETURN(io::ModelConfig cfg, io::load_model_config(o.model_dir));
    geometry = plan::geometry_from_config(cfg, o.model_dir);
  }
  MLA_ASSIGN_OR_RETURN(plan::GpuCatalog catalog, plan::load_default_gpu_catalog());
  if (!o.catalog.empty()) {
    MLA_RETURN_IF_ERROR(plan::apply_catalog_override(catalog, o.catalog));
  }
  const plan::GpuSpec* gpu = catalog.find(o.gpu);
  if (!gpu) return error("--gpu: unknown \"{}\" (catalog has {})", o.gpu, fmt::join(catalog.keys(), ", "));
  plan::PlanInput in;
  in.weights = geometry.shipped;
  if (!o.weights.empty()) {
    MLA_ASSIGN_OR_RETURN(in.weights, plan::parse_weight_format(o.weights));
  }
  in.gpus = o.gpus;
  in.tp = o.tp;
  in.ep = o.ep;
  in.context = o.context;
  in.concurrency = o.concurrency;
  return plan::plan(geometry, *gpu, in);
}

}  // namespace

Command add_plan_command(CLI::App& app) {
  auto o = std::make_shared<PlanOptions>();
  CLI::App* sub = app.add_subcommand("plan", "Estimate whether a model fits on GPUs, its throughput and $/Mtok");
  sub->add_option("--model", o->model_dir, "Model directory (reads config.json)");
  sub->add_option("--preset", o->preset, "deepseek-v3 | kimi-k2 | kimi-k2-thinking | kimi-k3");
  sub->add_option("--gpu", o->gpu, "GPU kind from the catalog (h100, h200, b200, b300, mi300x, mi325x, mi355x)")
      ->required();
  sub->add_option("--gpus", o->gpus, "Number of GPUs")->required();
  sub->add_option("--tp", o->tp, "Tensor-parallel size for attention/dense weights (default: --gpus)");
  sub->add_option("--ep", o->ep, "Expert-parallel size for routed experts (default: --gpus)");
  sub->add_option("--weights", o->weights, "bf16 | fp8 | int4 | mxfp4 (default: the checkpoint's format)");
  sub->add_option("--context", o->context, "Tokens per sequence")->capture_default_str();
  sub->add_option("--concurrency", o->concurrency, "Sequences decoding together")->capture_default_str();
  sub->add_option("--catalog", o->catalog, "JSON file overriding/adding GPU catalog entries");
  sub->add_flag("--json", o->json, "Print JSON");
  return {sub, [o] {
            auto r = run_plan(*o);
            if (!r) {
              std::fprintf(stderr, "mlaserve plan: %s\n", r.status().message().c_str());
              return 1;
            }
            const std::string out = o->json ? plan::plan_to_json(*r).dump(2) + "\n" : plan::describe_plan(*r);
            std::fputs(out.c_str(), stdout);
            return 0;
          }};
}

}  // namespace mla::cli
