// RoPE / YaRN constants against MODELS.md's published numbers and against an independent double
// re-derivation (written from the YaRN formulas with exp/log, not by calling the code under test).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "io/model_config.h"
#include "io/presets.h"
#include "model/rope_yarn.h"

namespace mla::model {
namespace {

using io::ModelConfig;
using io::RopeScalingType;

constexpr double kPi = 3.14159265358979323846;

ModelConfig preset(const char* name) {
  auto c = io::preset_config(name);
  EXPECT_TRUE(c.is_ok()) << c.status().message();
  return c.value();
}

// f_i = theta^(-2i/d), via exp/log in double.
double base_freq(int i, int d, double theta) { return std::exp(-(2.0 * i / d) * std::log(theta)); }

// Pair index where the wavelength 2*pi/f fits `rotations` times into L0: solve
// L0 * f / (2*pi) = rotations for i, i.e. i = d/2 * log(L0 / (2*pi*rotations)) / log(theta).
double pair_for_rotations(double rotations, int d, double theta, double l0) {
  return 0.5 * d * std::log(l0 / (2.0 * kPi * rotations)) / std::log(theta);
}

// Expected YaRN inverse frequencies: blend f (kept) and f/s (interpolated) by a ramp that is 0 at
// the fast end and 1 at the slow end.
std::vector<double> expected_inv_freq(int d, double theta, double s, double lo, double hi) {
  if (lo == hi) hi += 0.001;
  std::vector<double> out;
  for (int i = 0; i < d / 2; ++i) {
    const double t = std::min(1.0, std::max(0.0, (i - lo) / (hi - lo)));
    const double f = base_freq(i, d, theta);
    out.push_back((1.0 - t) * f + t * (f / s));
  }
  return out;
}

void expect_close(const std::vector<float>& got, const std::vector<double>& want, double rel = 2e-6) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(double(got[i]), want[i], rel * want[i]) << "pair " << i;
  }
}

TEST(RopeYarn, DeepSeekV3CorrectionRangeIs10To23) {
  const ModelConfig c = preset("deepseek-v3");
  const YarnCorrectionRange r = yarn_correction_range(c);
  EXPECT_EQ(r.low, 10.0);   // MODELS.md 1.7
  EXPECT_EQ(r.high, 23.0);
  EXPECT_EQ(r.low, std::floor(pair_for_rotations(32, 64, 10000, 4096)));
  EXPECT_EQ(r.high, std::ceil(pair_for_rotations(1, 64, 10000, 4096)));
}

TEST(RopeYarn, DeepSeekV3InvFreq) {
  const ModelConfig c = preset("deepseek-v3");
  const std::vector<float> inv = rope_inv_freq(c);
  ASSERT_EQ(inv.size(), 32u);
  expect_close(inv, expected_inv_freq(64, 10000, 40, 10, 23));
  // Direction: the fastest pair is untouched, the slowest is divided by the factor.
  EXPECT_EQ(inv[0], 1.0f);
  EXPECT_NEAR(inv[31], base_freq(31, 64, 10000) / 40, 1e-6 * inv[31]);
  for (size_t i = 1; i < inv.size(); ++i) EXPECT_LT(inv[i], inv[i - 1]);
}

TEST(RopeYarn, KimiK2SplitsAtPair20) {
  const ModelConfig c = preset("kimi-k2");
  const YarnCorrectionRange r = yarn_correction_range(c);
  EXPECT_EQ(r.low, 19.0);
  EXPECT_EQ(r.high, 20.0);
  const std::vector<float> inv = rope_inv_freq(c);
  for (int i = 0; i < 32; ++i) {
    const double f = base_freq(i, 64, 50000);
    const double want = i <= 19 ? f : f / 32;  // i <= 19 unscaled, i >= 20 divided by s
    EXPECT_NEAR(double(inv[size_t(i)]), want, 2e-6 * want) << i;
  }
}

TEST(RopeYarn, TinyPresetHasARealRamp) {
  const ModelConfig c = preset("tiny");
  const YarnCorrectionRange r = yarn_correction_range(c);
  const double lo = std::max(0.0, std::floor(pair_for_rotations(32, 16, 10000, 256)));
  const double hi = std::min(15.0, std::ceil(pair_for_rotations(1, 16, 10000, 256)));
  EXPECT_EQ(r.low, lo);
  EXPECT_EQ(r.high, hi);
  EXPECT_LT(lo + 1, hi);  // at least one pair strictly inside the ramp
  expect_close(rope_inv_freq(c), expected_inv_freq(16, 10000, 4, lo, hi));
}

TEST(RopeYarn, UntruncatedRangeAndDegenerateRange) {
  ModelConfig c = preset("deepseek-v3");
  c.rope_scaling.truncate = false;
  const double lo = pair_for_rotations(32, 64, 10000, 4096);
  const double hi = pair_for_rotations(1, 64, 10000, 4096);
  EXPECT_NEAR(yarn_correction_range(c).low, lo, 1e-12);
  EXPECT_NEAR(yarn_correction_range(c).high, hi, 1e-12);
  expect_close(rope_inv_freq(c), expected_inv_freq(64, 10000, 40, lo, hi), 4e-6);

  // beta_fast == beta_slow untruncated: lo == hi, HF widens hi by 0.001 => a step function.
  c.rope_scaling.beta_fast = 8;
  c.rope_scaling.beta_slow = 8;
  const double edge = pair_for_rotations(8, 64, 10000, 4096);  // ~15.3
  const std::vector<float> inv = rope_inv_freq(c);
  for (int i = 0; i < 32; ++i) {
    const double f = base_freq(i, 64, 10000);
    const double want = i < edge ? f : f / 40;
    EXPECT_NEAR(double(inv[size_t(i)]), want, 2e-6 * want) << i;
  }
}

TEST(RopeYarn, NoScaling) {
  ModelConfig c = preset("deepseek-v3");
  c.rope_scaling = io::RopeScaling{};
  const std::vector<float> inv = rope_inv_freq(c);
  for (int i = 0; i < 32; ++i) {
    const double f = base_freq(i, 64, 10000);
    EXPECT_NEAR(double(inv[size_t(i)]), f, 2e-6 * f) << i;
  }
  EXPECT_EQ(rope_attention_factor(c), 1.0f);
  EXPECT_NEAR(mla_softmax_scale(c), 1.0 / std::sqrt(192.0), 1e-8);
}

TEST(RopeYarn, SoftmaxScaleMatchesModelsMd) {
  EXPECT_NEAR(mla_softmax_scale(preset("deepseek-v3")), 0.135234, 1e-6);
  EXPECT_NEAR(mla_softmax_scale(preset("kimi-k2")), 0.130861, 1e-6);
  ModelConfig k2 = preset("kimi-k2");
  k2.rope_scaling.factor = 64;  // K2-0905 / K2-Thinking
  EXPECT_NEAR(mla_softmax_scale(k2), 0.144680, 1e-6);
  // Independent form: (1 + ln(s)/10)^2 / sqrt(192).
  const double m = 1.0 + std::log(40.0) / 10.0;
  EXPECT_NEAR(mla_softmax_scale(preset("deepseek-v3")), m * m / std::sqrt(192.0), 1e-7);
}

TEST(RopeYarn, SoftmaxScaleWithoutMscaleAllDim) {
  ModelConfig c = preset("deepseek-v3");
  c.rope_scaling.mscale_all_dim.reset();  // HF default 0: no m^2
  EXPECT_NEAR(mla_softmax_scale(c), 1.0 / std::sqrt(192.0), 1e-8);
  c.rope_scaling.mscale_all_dim = 0.5;
  const double m = 1.0 + 0.05 * std::log(40.0);
  EXPECT_NEAR(mla_softmax_scale(c), m * m / std::sqrt(192.0), 1e-7);
  c.rope_scaling.factor = 1.0;  // no extension: m = 1
  EXPECT_NEAR(mla_softmax_scale(c), 1.0 / std::sqrt(192.0), 1e-8);
}

TEST(RopeYarn, AttentionFactorFollowsHfRules) {
  ModelConfig c = preset("deepseek-v3");
  EXPECT_FLOAT_EQ(rope_attention_factor(c), 1.0f);  // mscale == mscale_all_dim
  c.rope_scaling.mscale = 2.0;
  EXPECT_NEAR(rope_attention_factor(c), (1.0 + 0.2 * std::log(40.0)) / (1.0 + 0.1 * std::log(40.0)), 1e-6);
  c.rope_scaling.mscale.reset();  // None is falsy: HF falls back to m(s, 1)
  EXPECT_NEAR(rope_attention_factor(c), 1.0 + 0.1 * std::log(40.0), 1e-6);
  c.rope_scaling.mscale = 1.0;
  c.rope_scaling.mscale_all_dim = 0.0;  // 0 is falsy too
  EXPECT_NEAR(rope_attention_factor(c), 1.0 + 0.1 * std::log(40.0), 1e-6);
  c.rope_scaling.attention_factor = 0.75;  // explicit value wins
  EXPECT_EQ(rope_attention_factor(c), 0.75f);
}

TEST(RopeYarn, RopeParametersFormGivesSameFrequencies) {
  const char* v5 = R"json({
    "model_type": "deepseek_v3", "vocab_size": 512, "hidden_size": 128, "intermediate_size": 256,
    "moe_intermediate_size": 64, "num_hidden_layers": 4, "num_attention_heads": 12, "q_lora_rank": 64,
    "kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32,
    "n_routed_experts": 16, "n_shared_experts": 1, "num_experts_per_tok": 4, "n_group": 4, "topk_group": 2,
    "norm_topk_prob": true, "routed_scaling_factor": 2.5, "first_k_dense_replace": 1, "rms_norm_eps": 1e-6,
    "max_position_embeddings": 1024, "bos_token_id": 0, "eos_token_id": 1,
    "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                        "original_max_position_embeddings": 256, "beta_fast": 32.0, "beta_slow": 1.0,
                        "mscale": 1.0, "mscale_all_dim": 1.0}
  })json";
  auto c = io::parse_model_config(v5, "v5");
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  EXPECT_EQ(rope_inv_freq(c.value()), rope_inv_freq(preset("tiny")));
  EXPECT_EQ(mla_softmax_scale(c.value()), mla_softmax_scale(preset("tiny")));
}

}  // namespace
}  // namespace mla::model
