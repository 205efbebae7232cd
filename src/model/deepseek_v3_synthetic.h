// Random-weight DeepSeek-V3 / Kimi K2 checkpoints in the exact HF layout (config.json, sharded
// safetensors + index), for tests, benchmarks and the interim default model. Streaming: each tensor
// is generated as it is written, so any geometry up to full size can be produced. Values are a
// deterministic function of (seed, tensor name, element index), independent of sharding and of the
// thread count (each tensor is filled by OpenMP threads over disjoint rows/element ranges).
#pragma once

#include <cstdint>
#include <string>

#include "io/model_config.h"
#include "io/safetensors_writer.h"

namespace mla::model {

struct SyntheticOptions {
  uint64_t seed = 0;
  uint64_t max_shard_bytes = uint64_t(4) << 30;  // HF's usual ~4-5 GB shards
  bool force_sharding = false;
  int threads = 0;  // OpenMP threads per tensor fill; 0: omp_get_max_threads() (all cores unless OMP_NUM_THREADS)
  // Multiplies the standard deviation of the weights that write into the residual stream (every
  // self_attn.o_proj and every down_proj: dense, routed and shared experts); FP8/INT4 keep their
  // codes and scale the stored scale instead. 1 leaves every byte unchanged; any other value is
  // recorded as "branch_gain" in the safetensors metadata. Must be finite and > 0.
  float branch_gain = 1.0f;
  io::WriteProgress progress;
};

// Writes config.json and the weights of `cfg` (stored per its quantization_config) into `dir`,
// including the num_nextn_predict_layers MTP blocks (deepseek_v3_mtp_tensor_specs).
// Weight scale ~ N(0, 1/in) per linear, so activations stay O(1) through any depth; norms ~1.
Status write_synthetic_checkpoint(const io::ModelConfig& cfg, const std::string& dir, const SyntheticOptions& opt);

// True for the linears whose output is added to the residual stream (what branch_gain scales).
bool writes_residual(const std::string& weight_name);

}  // namespace mla::model
