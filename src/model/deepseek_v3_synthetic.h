// Random-weight DeepSeek-V3 / Kimi K2 checkpoints in the exact HF layout (config.json, sharded
// safetensors + index), for tests, benchmarks and the interim default model. Streaming: each tensor
// is generated as it is written, so any geometry up to full size can be produced. Values are a
// deterministic function of (seed, tensor name, element index), independent of sharding.
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
  io::WriteProgress progress;
};

// Writes config.json and the weights of `cfg` (stored per its quantization_config) into `dir`,
// including the num_nextn_predict_layers MTP blocks (deepseek_v3_mtp_tensor_specs).
// Weight scale ~ N(0, 1/in) per linear, so activations stay O(1) through any depth; norms ~1.
Status write_synthetic_checkpoint(const io::ModelConfig& cfg, const std::string& dir, const SyntheticOptions& opt);

}  // namespace mla::model
