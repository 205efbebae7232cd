// RoPE / YaRN constants of an MLA model: per-pair inverse frequencies, the cos/sin multiplier and
// the softmax scale, following transformers (`_compute_yarn_parameters`, DeepseekV3Attention)
// including its float32 rounding steps, so HF golden fixtures match without extra slack.
#pragma once

#include <vector>

#include "io/model_config.h"

namespace mla::model {

// YaRN correction range in rotary-pair units: pairs i <= low keep their frequency, pairs i >= high
// are divided by the factor, in between a linear ramp. These are the values *before* the lo == hi
// guard (hi += 0.001) that rope_inv_freq applies. Integers unless rope_scaling.truncate is false.
struct YarnCorrectionRange {
  double low = 0;   // max(floor(corr(beta_fast)), 0)
  double high = 0;  // min(ceil(corr(beta_slow)), dim - 1), dim = qk_rope_head_dim
};
// precondition: cfg.rope_scaling.type == Yarn (CHECKed).
YarnCorrectionRange yarn_correction_range(const io::ModelConfig& cfg);

// Inverse frequency (radians per position) of each rotated pair, length qk_rope_head_dim / 2.
// Angle of pair i at position p = float(p) * inv_freq[i], computed in fp32 by the caller.
std::vector<float> rope_inv_freq(const io::ModelConfig& cfg);

// Multiplier applied to cos and sin (HF `attention_scaling`). 1 without scaling; 1 for V3 and K2.
float rope_attention_factor(const io::ModelConfig& cfg);

// Softmax scale of MLA: qk_head_dim^-1/2, times m^2 with m = 0.1 * mscale_all_dim * ln(factor) + 1
// when YaRN is on, mscale_all_dim != 0 and factor > 1. 0.135234 for DeepSeek-V3.
float mla_softmax_scale(const io::ModelConfig& cfg);

}  // namespace mla::model
