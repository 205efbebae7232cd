// The EAGLE-3 draft head end to end on the GPU backend against the CPU backend: a synthetic draft for
// the tiny target runs a mixed prefill step fed by target features, then a chained decode step fed
// by its own outputs, through the paged cache (F32 and BF16). Logits must be -inf on exactly the
// same columns (outside the d2t image) and close elsewhere.
// Tolerance: GemmPrecision::Fp32 (3-term bf16 split, ~1e-6 relative per GEMM) and fp32 attention:
// 2e-5 relative L2 per logits row, the golden fixtures' bar. A BF16 cache may round a value the other
// way when its fp32 input differs by an ulp: 1e-3.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <random>

#include <fmt/format.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/gpu/gpu_backend.h"
#include "io/presets.h"
#include "model/eagle3.h"
#include "model/eagle3_synthetic.h"

namespace mla::test {
namespace {

constexpr int kBlockSize = 4;

struct StepOutput {
  std::vector<float> logits, hidden;
};

// Runs the fixed two-step script on `be` and returns both steps' logits and hidden outputs.
std::vector<StepOutput> run_script(ops::Backend& be, const std::string& dir, const io::ModelConfig& target,
                                   DType cache_dtype) {
  model::ModelLimits limits;
  limits.max_tokens = 32;
  limits.max_seqs = 4;
  limits.max_block_entries = 64;
  auto loaded = model::Eagle3Draft::load(dir, target, be, limits);
  EXPECT_TRUE(loaded.is_ok()) << loaded.status().message();
  if (!loaded) return {};
  model::Eagle3Draft& d = *loaded.value();
  const int64_t V = target.vocab_size, H = d.hidden_width(), F = d.target_feature_width();
  const int num_blocks = 16;
  Buffer cache = be.alloc(size_t(num_blocks) * kBlockSize * size_t(d.cache_row_width()) * dtype_size(cache_dtype));
  const TensorView layer = cache.view(cache_dtype, {num_blocks, kBlockSize, d.cache_row_width()});
  const std::vector<int32_t> table0 = {5, 2, 9, 0}, table1 = {7, 1, 12};
  std::mt19937 rng(21);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<StepOutput> outs;
  // Step 1: prefill 7 and 5 rows from target features. Step 2: one chained row each.
  for (int step = 0; step < 2; ++step) {
    const bool from_target = step == 0;
    const int q0 = from_target ? 7 : 1, q1 = from_target ? 5 : 1, k0 = from_target ? 7 : 8, k1 = from_target ? 5 : 6;
    const int64_t T = q0 + q1, W = from_target ? F : H;
    std::vector<int32_t> ids, pos, rows;
    for (int i = 0; i < q0; ++i) pos.push_back(k0 - q0 + i);
    for (int i = 0; i < q1; ++i) pos.push_back(k1 - q1 + i);
    for (int64_t t = 0; t < T; ++t) {
      ids.push_back(int32_t(rng() % uint32_t(V)));
      rows.push_back(int32_t(t));
    }
    std::vector<float> hin(size_t(T * W));
    for (float& x : hin) x = u(rng);
    const model::SequenceSlice slices[2] = {{q0, k0, table0}, {q1, k1, table1}};
    Buffer hin_buf = be.alloc(hin.size() * sizeof(float));
    Buffer hout_buf = be.alloc(size_t(T * H) * sizeof(float));
    Buffer logits_buf = be.alloc(size_t(T * V) * sizeof(float));
    spec::DraftForwardInputs in;
    in.base = model::ForwardInputs{ids, pos, slices, rows, {&layer, 1}, kBlockSize};
    in.hidden_in = hin_buf.view(DType::F32, {T, W});
    be.copy_from_host(in.hidden_in, hin.data());
    in.hidden_from_target = from_target;
    in.hidden_out = hout_buf.view(DType::F32, {T, H});
    const TensorView logits = logits_buf.view(DType::F32, {T, V});
    d.forward(in, logits);
    StepOutput o;
    o.logits.resize(size_t(T * V));
    o.hidden.resize(size_t(T * H));
    be.copy_to_host(o.logits.data(), logits);
    be.copy_to_host(o.hidden.data(), in.hidden_out);
    outs.push_back(std::move(o));
  }
  return outs;
}

// Worst per-row relative L2 over the finite entries; -1 when the -inf patterns differ.
double worst_row_rel_l2(const std::vector<float>& got, const std::vector<float>& ref, size_t row_len) {
  double worst = 0;
  for (size_t r = 0; r * row_len < ref.size(); ++r) {
    double num = 0, den = 0;
    for (size_t i = r * row_len; i < (r + 1) * row_len; ++i) {
      if (std::isinf(ref[i]) || std::isinf(got[i])) {
        if (got[i] != ref[i]) return -1;
        continue;
      }
      num += (double(got[i]) - ref[i]) * (double(got[i]) - ref[i]);
      den += double(ref[i]) * ref[i];
    }
    worst = std::max(worst, std::sqrt(num / std::max(den, 1e-30)));
  }
  return worst;
}

TEST(GpuEagle3, DraftStepsMatchCpu) {
  auto target = io::preset_config("tiny");
  ASSERT_TRUE(target.is_ok());
  const std::string dir =
      (std::filesystem::temp_directory_path() / fmt::format("mlaserve_gpu_eagle3_{}", getpid())).string();
  model::Eagle3SyntheticOptions opt;
  opt.seed = 3;
  opt.draft_vocab = 200;
  opt.num_attention_heads = 8;
  opt.num_key_value_heads = 2;
  opt.head_dim = 64;
  ASSERT_TRUE(model::write_synthetic_eagle3(dir, target.value(), opt).is_ok());
  for (DType cache_dtype : {DType::F32, DType::BF16}) {
    auto cpu = cpu::make_cpu_backend();
    auto gpu = gpu::make_gpu_backend();
    ASSERT_TRUE(gpu.is_ok()) << gpu.status().message();
    const std::vector<StepOutput> ref = run_script(*cpu, dir, target.value(), cache_dtype);
    const std::vector<StepOutput> got = run_script(*gpu.value(), dir, target.value(), cache_dtype);
    ASSERT_EQ(ref.size(), 2u);
    ASSERT_EQ(got.size(), 2u);
    const double tol = cache_dtype == DType::F32 ? 2e-5 : 1e-3;
    for (size_t s = 0; s < 2; ++s) {
      const double l = worst_row_rel_l2(got[s].logits, ref[s].logits, size_t(target.value().vocab_size));
      EXPECT_GE(l, 0.0) << "step " << s << ": -inf columns differ";
      EXPECT_LE(l, tol) << "step " << s << " logits, cache " << dtype_name(cache_dtype);
      const double h = worst_row_rel_l2(got[s].hidden, ref[s].hidden, size_t(target.value().hidden_size));
      EXPECT_LE(h, tol) << "step " << s << " hidden, cache " << dtype_name(cache_dtype);
    }
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace mla::test
