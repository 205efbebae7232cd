// Named model geometries (the tiny demo/test model, DeepSeek-V3, Kimi K2), the overrides that
// shrink them for synthetic checkpoints, and the quantization choice of make-model. Presets are
// unquantized; `with_quantization` adds the checkpoint format so one geometry serves all three.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "io/model_config.h"

namespace mla::io {

// "tiny" | "deepseek-v3" | "kimi-k2". Every preset passes validate_model_config.
Result<ModelConfig> preset_config(std::string_view name);

// The accepted preset names, in a stable order (for --help and error messages).
std::vector<std::string> preset_names();

// Shrinks a geometry in place, keeping it valid:
//  - layers: num_hidden_layers = layers; first_k_dense_replace clamped to <= layers.
//  - experts: n_routed_experts = experts; num_experts_per_tok clamped to <= experts; if the
//    grouping no longer works (n_group does not divide experts, a group would hold < 2 experts,
//    or topk_group groups could not supply top-k candidates) then n_group = topk_group = 1.
//  - dense_layers (applied after layers): first_k_dense_replace = dense_layers, which must lie in
//    [0, num_hidden_layers]; equal to the layer count gives an all-dense model (MTP blocks stay MoE).
// Returns an error (config untouched) for values out of range or a result that fails validation.
Status apply_overrides(ModelConfig& cfg, std::optional<int> layers, std::optional<int> experts,
                       std::optional<int> dense_layers = std::nullopt);

// "bf16": no quantization_config; "fp8": DeepSeek fp8 e4m3 128x128 blocks, dynamic activations;
// "int4": compressed-tensors pack-quantized W4A16 group 32 with Kimi K2 Thinking's ignore list
// (only routed experts are int4). Any other name is an error listing these three.
Result<ModelConfig> with_quantization(ModelConfig cfg, std::string_view weights);

}  // namespace mla::io
