// YaRN math per transformers main (`modeling_rope_utils._compute_yarn_parameters`, DeepseekV3Attention;
// the v5 `rope_parameters` version, read October 2026). Trade-off: we mirror HF's float32 rounding
// step by step instead of computing in double, because golden fixtures come from HF.
#include "model/rope_yarn.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace mla::model {

namespace {

using io::ModelConfig;
using io::RopeScalingType;

// YaRN's m(s, a) (HF `get_mscale` / `yarn_get_mscale`): 1 when there is no extension.
double yarn_mscale(double s, double a) { return s <= 1.0 ? 1.0 : 0.1 * a * std::log(s) + 1.0; }

// HF `find_correction_dim`, in double and in the same operation order as the Python: the pair
// index whose wavelength fits `rotations` times into the original context L0.
double correction_dim(double rotations, int dim, double base, int original_max_positions) {
  return (double(dim) * std::log(double(original_max_positions) / (rotations * 2.0 * std::numbers::pi))) /
         (2.0 * std::log(base));
}

// Unscaled frequencies f_i = 1 / base^(2i/dim), rounded like HF:
//   exponent: float32(2i) / dim in float32 (torch.arange(0, dim, 2).float() / dim);
//   pow:      base ** exponent with both in float32 (torch.pow(Scalar, Tensor) promotes to float);
//   inverse:  `1.0 / t` is t.reciprocal() * 1.0, i.e. the float32 quotient 1.0f / t.
// torch's float pow is within 1 ulp (Sleef / powf); we round the double pow once, which is the
// correctly rounded value, so an individual pos_freq may differ from a given torch build by 1 ulp.
std::vector<float> pos_freqs(const ModelConfig& cfg) {
  const int dim = cfg.qk_rope_head_dim;
  const float base = float(cfg.rope_theta);
  std::vector<float> p(size_t(dim / 2));
  for (int i = 0; i < dim / 2; ++i) {
    const float exponent = float(2 * i) / float(dim);
    p[size_t(i)] = float(std::pow(double(base), double(exponent)));
  }
  return p;
}

}  // namespace

YarnCorrectionRange yarn_correction_range(const ModelConfig& cfg) {
  const io::RopeScaling& y = cfg.rope_scaling;
  MLA_CHECK(y.type == RopeScalingType::Yarn, "yarn_correction_range on a config without YaRN");
  const int dim = cfg.qk_rope_head_dim;
  double low = correction_dim(y.beta_fast, dim, cfg.rope_theta, y.original_max_position_embeddings);
  double high = correction_dim(y.beta_slow, dim, cfg.rope_theta, y.original_max_position_embeddings);
  // transformers >= 4.5x: `truncate` (default True) floors/ceils; False keeps the real bounds.
  if (y.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  return {std::max(low, 0.0), std::min(high, double(dim - 1))};
}

std::vector<float> rope_inv_freq(const ModelConfig& cfg) {
  const std::vector<float> pos = pos_freqs(cfg);
  std::vector<float> inv(pos.size());
  if (cfg.rope_scaling.type != RopeScalingType::Yarn) {
    for (size_t i = 0; i < pos.size(); ++i) inv[i] = 1.0f / pos[i];
    return inv;
  }
  // Direction of the blend (checked against HF, which names things the other way round):
  //   ramp_i = clamp((i - low) / (high - low), 0, 1)          0 for fast pairs, 1 for slow pairs
  //   extrapolation_factor_i = 1 - ramp_i                      HF `inv_freq_extrapolation_factor`
  //   inv_i = (f_i / s) * (1 - extrapolation_factor_i) + f_i * extrapolation_factor_i
  // so high-frequency pairs (i <= low) keep f_i ("extrapolate") and low-frequency pairs
  // (i >= high) become f_i / s ("interpolate"). This equals MODELS.md 1.7's
  // (f/s)·ramp + f·(1−ramp), except that HF rounds 1 - (1 - ramp) in float32; we do the same.
  const YarnCorrectionRange range = yarn_correction_range(cfg);
  const double low = range.low;
  double high = range.high;
  if (low == high) high += 0.001;  // HF: "Prevent singularity"
  // torch evaluates (arange_f32 - low) / (high - low) with both Python scalars cast to float32.
  const float low_f = float(low);
  const float span_f = float(high - low);
  const float factor_f = float(cfg.rope_scaling.factor);
  for (size_t i = 0; i < pos.size(); ++i) {
    const float ramp = std::clamp((float(i) - low_f) / span_f, 0.0f, 1.0f);
    const float extrapolation_factor = 1.0f - ramp;
    const float inv_extrapolation = 1.0f / pos[i];
    const float inv_interpolation = 1.0f / (factor_f * pos[i]);
    const float interp_part = inv_interpolation * (1.0f - extrapolation_factor);
    const float extrap_part = inv_extrapolation * extrapolation_factor;
    inv[i] = interp_part + extrap_part;
  }
  return inv;
}

float rope_attention_factor(const ModelConfig& cfg) {
  const io::RopeScaling& y = cfg.rope_scaling;
  if (y.type != RopeScalingType::Yarn) return 1.0f;
  if (y.attention_factor) return float(*y.attention_factor);
  // HF main: `if mscale and mscale_all_dim:` ratio, else get_mscale(factor) with the default
  // exponent 1. Python truthiness: an absent (None) or zero value takes the else branch, which is
  // why the config keeps these optional. V3/K2 (mscale = mscale_all_dim = 1) give exactly 1.
  const double mscale = y.mscale.value_or(0.0);
  const double mscale_all_dim = y.mscale_all_dim.value_or(0.0);
  if (mscale != 0.0 && mscale_all_dim != 0.0) {
    return float(yarn_mscale(y.factor, mscale) / yarn_mscale(y.factor, mscale_all_dim));
  }
  return float(yarn_mscale(y.factor, 1.0));
}

float mla_softmax_scale(const ModelConfig& cfg) {
  // HF DeepseekV3Attention: scaling = qk_head_dim ** -0.5; if rope_type != "default" and
  // mscale_all_dim (default 0) is truthy: scaling *= m^2, m = yarn_get_mscale(factor, mscale_all_dim)
  // (which is 1 for factor <= 1). Computed in double, rounded once.
  double scale = std::pow(double(cfg.qk_head_dim()), -0.5);
  const io::RopeScaling& y = cfg.rope_scaling;
  const double mscale_all_dim = y.mscale_all_dim.value_or(0.0);
  if (y.type == RopeScalingType::Yarn && mscale_all_dim != 0.0) {
    const double m = yarn_mscale(y.factor, mscale_all_dim);
    scale = scale * m * m;
  }
  return float(scale);
}

}  // namespace mla::model
