// The golden fixtures (tools/make_golden_fixtures.py: transformers in fp32 on the dequantized
// weights) and the two checks run against them, shared by the CPU golden test and the GPU one so
// both hold the model to the same reference the same way. Each check takes its limits as
// arguments: the caller states the tolerance and its basis.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "model/model_test_util.h"
#include "runtime/offline_engine.h"

namespace mla::test {

// The fixture cases: 12 heads + YaRN + n_group > 1; 20 heads without q_lora; FP8 block-scaled;
// Kimi-K2-style INT4.
inline const std::vector<std::string>& golden_case_names() {
  static const std::vector<std::string> names = {"ds_h12_yarn_group", "ds_h20_noqlora", "ds_fp8_block", "k2_int4"};
  return names;
}

// MLA_FIXTURE_DIR in the environment overrides the build-time path (a build carried to another host).
inline std::string golden_case_dir(const std::string& name) {
  const char* env = std::getenv("MLA_FIXTURE_DIR");
  return std::string(env ? env : MLA_FIXTURE_DIR) + "/golden/" + name;
}

// reference.safetensors (prompts, logits at every position, greedy tokens and margins) and
// reference.json (HF-side values and the prompt list).
struct GoldenReference {
  io::SafetensorsFile file;
  nlohmann::json meta;
  std::vector<int32_t> ints(const std::string& name) const {
    const io::TensorInfo* t = file.find(name);
    EXPECT_NE(t, nullptr) << name;
    if (!t) return {};
    const TensorView v = file.view(*t);
    return {v.as<const int32_t>(), v.as<const int32_t>() + v.numel()};
  }
  std::vector<float> floats(const std::string& name) const {
    const io::TensorInfo* t = file.find(name);
    EXPECT_NE(t, nullptr) << name;
    if (!t) return {};
    const TensorView v = file.view(*t);
    return {v.as<const float>(), v.as<const float>() + v.numel()};
  }
};

inline GoldenReference load_golden_reference(const std::string& dir) {
  auto f = io::SafetensorsFile::open(dir + "/reference.safetensors");
  EXPECT_TRUE(f.is_ok()) << f.status().message();
  std::ifstream in(dir + "/reference.json");
  return {std::move(f).value(), nlohmann::json::parse(in)};
}

// Every position of every reference prompt through naive, absorbed, chunked-16 and chunked-1
// prefill (the last two switch to the absorbed path for single-token chunks). Fails at the first
// position whose relative L2 error exceeds `limit`; returns the worst error seen.
inline double check_golden_prefill(LoadedModel& lm, const GoldenReference& ref, const std::string& label, double limit,
                                   DType cache_dtype = DType::F32) {
  const int V = lm.model->config().vocab_size;
  double worst = 0;
  for (const auto& p : ref.meta["prompts"]) {
    const int idx = p["index"].get<int>();
    const std::vector<int32_t> prompt = ref.ints(fmt::format("prompt_{}", idx));
    const std::vector<float> want = ref.floats(fmt::format("logits_{}", idx));
    if (want.size() != prompt.size() * size_t(V)) {
      ADD_FAILURE() << label << " prompt " << idx << ": " << want.size() << " reference logits";
      return worst;
    }
    struct Variant { const char* name; int chunk; model::MlaPath path; };
    for (const Variant& v : {Variant{"naive", 128, model::MlaPath::Naive}, Variant{"absorbed", 128, model::MlaPath::Absorbed},
                             Variant{"chunked-16-auto", 16, model::MlaPath::Auto}, Variant{"chunked-1-auto", 1, model::MlaPath::Auto}}) {
      const std::vector<float> got = prefill_logits(lm, prompt, v.chunk, v.path, 16, cache_dtype);
      for (size_t t = 0; t < prompt.size(); ++t) {
        const double e = rel_l2(got.data() + t * size_t(V), want.data() + t * size_t(V), size_t(V));
        worst = std::max(worst, e);
        if (!(e <= limit)) {
          ADD_FAILURE() << label << " prompt " << idx << " position " << t << " path " << v.name << ": relative L2 "
                        << e << " > " << limit;
          return worst;
        }
      }
    }
  }
  std::printf("[golden] %s: worst per-position relative L2 error %.3g (limit %.1g)\n", label.c_str(), worst, limit);
  return worst;
}

// Serving precision (bf16 activations in GEMMs, bf16 cache) against the fp32 reference. A tiny random
// MoE model routes on near-ties, and a bf16-sized perturbation of a router input flips an expert at
// some positions, which moves that position's logits by tens of percent; that is expected, not a bug
// (every op is held to its dtype's tolerance by the parity tests). So this check is on the
// distribution over all positions and paths: the median error must stay within `median_limit` and at
// most `max_outlier_fraction` of positions may exceed `limit`. Prints the distribution.
inline void check_golden_prefill_serving(LoadedModel& lm, const GoldenReference& ref, const std::string& label,
                                         double median_limit, double limit, double max_outlier_fraction,
                                         DType cache_dtype) {
  const int V = lm.model->config().vocab_size;
  std::vector<double> errors;
  for (const auto& p : ref.meta["prompts"]) {
    const int idx = p["index"].get<int>();
    const std::vector<int32_t> prompt = ref.ints(fmt::format("prompt_{}", idx));
    const std::vector<float> want = ref.floats(fmt::format("logits_{}", idx));
    ASSERT_EQ(want.size(), prompt.size() * size_t(V)) << label << " prompt " << idx;
    for (model::MlaPath path : {model::MlaPath::Naive, model::MlaPath::Absorbed, model::MlaPath::Auto}) {
      const std::vector<float> got = prefill_logits(lm, prompt, path == model::MlaPath::Auto ? 1 : 128, path, 16,
                                                    cache_dtype);
      for (size_t t = 0; t < prompt.size(); ++t)
        errors.push_back(rel_l2(got.data() + t * size_t(V), want.data() + t * size_t(V), size_t(V)));
    }
  }
  ASSERT_FALSE(errors.empty());
  std::sort(errors.begin(), errors.end());
  const double median = errors[errors.size() / 2], p90 = errors[errors.size() * 9 / 10], worst = errors.back();
  const size_t outliers = size_t(std::count_if(errors.begin(), errors.end(), [&](double e) { return !(e <= limit); }));
  std::printf("[golden] %s: relative L2 over %zu positions: median %.3g, p90 %.3g, worst %.3g; %zu above %.1g\n",
              label.c_str(), errors.size(), median, p90, worst, outliers, limit);
  EXPECT_LE(median, median_limit) << label;
  EXPECT_LE(double(outliers), max_outlier_fraction * double(errors.size())) << label << ": " << outliers << " of "
                                                                            << errors.size() << " positions above " << limit;
}

// Greedy generation through the engine (block size 4, so many blocks per sequence) must give the
// reference's tokens over the first `max_steps` steps, up to the first step whose reference top-1/top-2
// margin is <= `clear_margin` (after an unclear step the sequences may legitimately part). At least
// 4 steps must be checked for the comparison to mean something.
inline void check_golden_greedy(LoadedModel& lm, const GoldenReference& ref, const std::string& label,
                                runtime::EngineOptions opt, float clear_margin, size_t max_steps = SIZE_MAX) {
  runtime::GenerationRequest req;
  req.prompt = ref.ints("greedy_prompt");
  const std::vector<int32_t> want = ref.ints("greedy_tokens");
  const std::vector<float> margins = ref.floats("greedy_margins");
  req.max_tokens = int(want.size());
  req.sampling.temperature = 0;
  opt.block_size = 4;
  auto res = runtime::generate(*lm.model, *lm.backend, {req}, opt);
  ASSERT_TRUE(res.is_ok()) << label << ": " << res.status().message();
  const std::vector<int32_t>& got = res->front().tokens;
  ASSERT_EQ(got.size(), want.size()) << label;
  size_t checked = 0;
  for (size_t i = 0; i < want.size() && i < max_steps; ++i) {
    if (margins[i] <= clear_margin) break;
    EXPECT_EQ(got[i], want[i]) << label << " step " << i << " margin " << margins[i];
    ++checked;
  }
  EXPECT_GE(checked, 4u) << label << ": too few clear steps to be a meaningful check";
}

}  // namespace mla::test
