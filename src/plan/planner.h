// Capacity planner: from a model geometry, a weight format and a GPU pick, derive parameters and
// bytes per component, the KV/state cache cost, whether it fits, roofline throughput and $/Mtok.
// Trade-off: a closed-form roofline (datasheet peaks, perfect overlap) — an upper bound, not a forecast.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "io/model_config.h"
#include "plan/gpu_catalog.h"

namespace mla::plan {

enum class Component : uint8_t { Embedding, Attention, DenseFfn, RoutedExperts, SharedExperts, LmHead, Other };
inline constexpr int kNumComponents = 7;
std::string_view component_name(Component c);

// How weights are stored. Fp8: every Linear of attention/MLP/experts e4m3 with an f32 scale per
// 128x128 block. Int4: routed experts only, int4 with a bf16 scale per 32 inputs (K2 Thinking).
// Mxfp4: routed experts only, e2m1 with an e8m0 scale per 32 inputs (K3). Everything else bf16,
// except tensors the checkpoints keep in f32 (router bias, KDA conv/decay parameters).
enum class WeightFormat : uint8_t { Bf16, Fp8, Int4, Mxfp4 };
Result<WeightFormat> parse_weight_format(std::string_view s);
std::string_view weight_format_name(WeightFormat f);

// One kind of tensor, `count` copies of it in the model (e.g. one per layer, or per expert).
struct TensorGroup {
  std::string name;
  Component component = Component::Other;
  int64_t rows = 0, cols = 1;  // [out, in]; vectors have cols = 1
  int64_t count = 1;
  bool linear = false;         // a matmul weight the formats may quantize
  bool f32 = false;            // always stored f32 (never quantized)
};

struct ModelGeometry {
  std::string name;
  std::vector<TensorGroup> tensors;
  WeightFormat shipped = WeightFormat::Bf16;  // the format the official checkpoint uses
  int mla_layers = 0;                         // layers with an MLA latent cache
  int kv_lora_rank = 0, qk_rope_head_dim = 0; // MLA cache width = sum
  int attention_heads = 0;                    // MLA heads (for attention FLOPs)
  int kda_layers = 0, kda_heads = 0, kda_head_dim = 0, kda_conv_kernel = 0;
  int moe_layers = 0, routed_experts = 0, experts_per_token = 0;
};

// DeepSeek-V3 / Kimi K2 geometry from a parsed config; its tensor list mirrors MODELS.md 1.2.
ModelGeometry geometry_from_config(const io::ModelConfig& cfg, std::string name);
// Kimi K3 (MODELS.md 3): 93 layers (24 MLA, 69 KDA), latent MoE, 896 experts top-16, MXFP4 experts.
ModelGeometry kimi_k3_geometry();
// "deepseek-v3" (fp8) | "kimi-k2" (fp8) | "kimi-k2-thinking" (int4 experts) | "kimi-k3" (mxfp4 experts).
Result<ModelGeometry> plan_preset(std::string_view name);
std::vector<std::string> plan_preset_names();

struct PlanInput {
  WeightFormat weights = WeightFormat::Bf16;
  int gpus = 8;
  int tp = 0, ep = 0;            // 0: = gpus. Both must divide gpus.
  int64_t context = 8192;        // tokens per sequence (prompt + output)
  int concurrency = 1;           // sequences decoding together
  double usable_fraction = 0.90; // of HBM the engine may use (allocator slack, CUDA/HIP context)
  double workspace_gb = 4.0;     // per-GPU activations/communication buffers, subtracted up front
  int cache_dtype_bytes = 2;     // MLA latent cache dtype (bf16)
};

struct ComponentStat {
  int64_t params = 0;
  double bytes = 0;  // stored bytes including scale tensors
};

struct PlanResult {
  std::string model, gpu;
  int gpus = 0, tp = 0, ep = 0;
  ComponentStat by_component[kNumComponents];
  int64_t total_params = 0, active_params = 0;
  double weight_bytes = 0;        // whole model, stored
  double scale_bytes = 0;         // of which quantization scales
  double expert_bytes = 0;        // routed experts (sharded over ep), the rest over tp
  double weight_bytes_per_gpu = 0;
  double kv_bytes_per_token = 0;  // MLA latent, all MLA layers
  double state_bytes_per_seq = 0; // KDA recurrent state + conv tails, all KDA layers
  double usable_bytes_per_gpu = 0, kv_budget_bytes_per_gpu = 0, kv_budget_bytes = 0;
  bool weights_fit = false;       // weights + workspace <= usable, on every GPU
  bool fits = false;              // weights_fit and room for one sequence of `context`
  double kv_tokens = 0;           // latent-cache tokens the budget holds (state not counted)
  int64_t max_concurrency = 0;    // full-context sequences the budget holds (state counted)
  int64_t batch = 0;              // concurrency actually modelled: min(concurrency, max_concurrency)
  double decode_tok_s = 0, decode_tok_s_per_user = 0, prefill_tok_s = 0;
  bool decode_bandwidth_bound = true;
  double price_per_hour = 0, usd_per_mtok_output = 0, usd_per_mtok_input = 0;
  std::string fit_rule;           // the rule, in words
};

Result<PlanResult> plan(const ModelGeometry& model, const GpuSpec& gpu, const PlanInput& in);

nlohmann::json plan_to_json(const PlanResult& r);
std::string describe_plan(const PlanResult& r);

}  // namespace mla::plan
