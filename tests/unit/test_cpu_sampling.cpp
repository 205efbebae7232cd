// CPU backend sampling ops (flashinfer semantics, MODELS.md section 6) on hand-made rows whose
// answers are worked out in the comments (ties at the top-k pivot and the top-p boundary, disabled
// settings, zero-probability entries, uniforms at 0 and just below 1), plus random rows against a
// double-precision reimplementation. Tolerance for probabilities: 1e-6 * (1 + |ref|).
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <memory>

#include "backend/cpu/cpu_backend.h"
#include "unit/cpu_test_util.h"

namespace mla::test {
namespace {

constexpr double kTol = 1e-6;

std::vector<double> as_double(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

// Normalized random probability rows [rows, vocab].
std::vector<float> random_probs(std::mt19937& rng, int64_t rows, int64_t vocab) {
  std::vector<float> p = random_floats(rng, size_t(rows * vocab), 0.0f, 1.0f);
  for (int64_t b = 0; b < rows; ++b) {
    for (int64_t i = 0; i < vocab; ++i) p[size_t(b * vocab + i)] = std::pow(p[size_t(b * vocab + i)], 4.0f);
    double sum = 0.0;
    for (int64_t i = 0; i < vocab; ++i) sum += p[size_t(b * vocab + i)];
    for (int64_t i = 0; i < vocab; ++i) p[size_t(b * vocab + i)] = float(p[size_t(b * vocab + i)] / sum);
  }
  return p;
}

// Keeps row entries >= threshold and renormalizes, in double.
std::vector<double> keep_ref(const float* row, int64_t vocab, double threshold) {
  double kept = 0.0;
  for (int64_t i = 0; i < vocab; ++i)
    if (row[i] >= threshold) kept += row[i];
  std::vector<double> out(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i) out[size_t(i)] = row[i] >= threshold ? row[i] / kept : 0.0;
  return out;
}

std::vector<float> run_top_k(ops::Backend& be, std::vector<float> probs, std::vector<int32_t> k) {
  const int64_t rows = int64_t(k.size()), vocab = int64_t(probs.size()) / rows;
  std::vector<float> out = nan_filled(probs.size());
  be.top_k_renorm_prob(view_of(probs, {rows, vocab}), view_of(k, {rows}), view_of(out, {rows, vocab}));
  return out;
}

std::vector<float> run_top_p(ops::Backend& be, std::vector<float> probs, std::vector<float> p) {
  const int64_t rows = int64_t(p.size()), vocab = int64_t(probs.size()) / rows;
  std::vector<float> out = nan_filled(probs.size());
  be.top_p_renorm_prob(view_of(probs, {rows, vocab}), view_of(p, {rows}), view_of(out, {rows, vocab}));
  return out;
}

std::vector<float> run_min_p(ops::Backend& be, std::vector<float> probs, std::vector<float> p) {
  const int64_t rows = int64_t(p.size()), vocab = int64_t(probs.size()) / rows;
  std::vector<float> out = nan_filled(probs.size());
  be.min_p_renorm_prob(view_of(probs, {rows, vocab}), view_of(p, {rows}), view_of(out, {rows, vocab}));
  return out;
}

int32_t sample_one(ops::Backend& be, std::vector<float> row, float u) {
  std::vector<float> uniforms = {u};
  std::vector<int32_t> id = {-1};
  be.sample_from_probs(view_of(row, {1, int64_t(row.size())}), view_of(uniforms, {1}), view_of(id, {1}));
  return id[0];
}

TEST(CpuSampling, SoftmaxWithTemperature) {
  auto be = cpu::make_cpu_backend();
  std::mt19937 rng(41);
  const int64_t rows = 3, vocab = 37;
  std::vector<float> logits = random_floats(rng, size_t(rows * vocab), -8.0f, 8.0f);
  std::vector<float> temp = {0.7f, 1.0f, 2.5f};
  std::vector<double> ref;
  for (int64_t b = 0; b < rows; ++b) {
    double m = -1e300, sum = 0.0;
    for (int64_t i = 0; i < vocab; ++i) m = std::max(m, double(logits[size_t(b * vocab + i)]) / temp[size_t(b)]);
    for (int64_t i = 0; i < vocab; ++i) sum += std::exp(double(logits[size_t(b * vocab + i)]) / temp[size_t(b)] - m);
    for (int64_t i = 0; i < vocab; ++i)
      ref.push_back(std::exp(double(logits[size_t(b * vocab + i)]) / temp[size_t(b)] - m) / sum);
  }
  std::vector<float> probs = nan_filled(logits.size());
  be->softmax(view_of(logits, {rows, vocab}), view_of(temp, {rows}), view_of(probs, {rows, vocab}));
  EXPECT_TRUE(all_close(probs, ref, kTol));
  be->softmax(view_of(logits, {rows, vocab}), view_of(temp, {rows}), view_of(logits, {rows, vocab}));  // in place
  EXPECT_TRUE(all_close(logits, ref, kTol));
}

TEST(CpuSampling, TopKKeepsTiesAtThePivot) {
  auto be = cpu::make_cpu_backend();
  const std::vector<float> row = {0.1f, 0.3f, 0.2f, 0.3f, 0.1f};
  // k=1 and k=2: pivot 0.3, both 0.3s survive -> 0.5 each.
  for (int32_t k : {1, 2})
    EXPECT_TRUE(all_close(run_top_k(*be, row, {k}), {0.0, 0.5, 0.0, 0.5, 0.0}, kTol)) << "k=" << k;
  // k=3: pivot 0.2, kept sum 0.8.
  EXPECT_TRUE(all_close(run_top_k(*be, row, {3}), {0.0, 0.375, 0.25, 0.375, 0.0}, kTol));
  // k=4: pivot 0.1 ties with the 5th entry, so all five survive (sum 1).
  EXPECT_TRUE(all_close(run_top_k(*be, row, {4}), as_double(row), kTol));
  // k <= 0 and k >= V leave the row exactly as it was, even when it is not normalized.
  const std::vector<float> unnorm = {0.5f, 1.5f, 0.25f, 0.0f, 2.0f};
  for (int32_t k : {0, -3, 5, 9}) EXPECT_EQ(run_top_k(*be, unnorm, {k}), unnorm) << "k=" << k;
}

TEST(CpuSampling, TopKRandomRowsAndAliasing) {
  auto be = cpu::make_cpu_backend();
  std::mt19937 rng(42);
  const int64_t rows = 4, vocab = 50;
  std::vector<float> probs = random_probs(rng, rows, vocab);
  std::vector<int32_t> k = {1, 5, 17, 49};
  std::vector<double> ref;
  for (int64_t b = 0; b < rows; ++b) {
    std::vector<float> sorted(probs.begin() + b * vocab, probs.begin() + (b + 1) * vocab);
    std::sort(sorted.begin(), sorted.end(), std::greater<float>());
    const auto r = keep_ref(probs.data() + b * vocab, vocab, sorted[size_t(k[size_t(b)] - 1)]);
    ref.insert(ref.end(), r.begin(), r.end());
  }
  be->top_k_renorm_prob(view_of(probs, {rows, vocab}), view_of(k, {rows}), view_of(probs, {rows, vocab}));
  EXPECT_TRUE(all_close(probs, ref, kTol));
  for (int64_t b = 0; b < rows; ++b)
    EXPECT_EQ(std::count_if(probs.begin() + b * vocab, probs.begin() + (b + 1) * vocab, [](float p) { return p > 0; }),
              k[size_t(b)]);
}

TEST(CpuSampling, TopPKeepsTheBoundaryTokenAndItsTies) {
  auto be = cpu::make_cpu_backend();
  // Exact binary fractions, so every cumulative sum is exact.
  const std::vector<float> tied = {0.125f, 0.25f, 0.25f, 0.125f, 0.25f};
  // top_p 0.5: 0.25 + 0.25 reaches 0.5; the boundary value 0.25 has a third holder, kept too.
  EXPECT_TRUE(all_close(run_top_p(*be, tied, {0.5f}), {0.0, 1.0 / 3, 1.0 / 3, 0.0, 1.0 / 3}, kTol));
  // top_p 0.2: the first 0.25 alone reaches it, its ties come along.
  EXPECT_TRUE(all_close(run_top_p(*be, tied, {0.2f}), {0.0, 1.0 / 3, 1.0 / 3, 0.0, 1.0 / 3}, kTol));
  // top_p 0.8: 0.75 falls short, the boundary is 0.125 and everything is kept.
  EXPECT_TRUE(all_close(run_top_p(*be, tied, {0.8f}), as_double(tied), kTol));
  const std::vector<float> distinct = {0.15f, 0.5f, 0.05f, 0.3f};
  // top_p 0.5: 0.5 alone reaches it exactly.
  EXPECT_TRUE(all_close(run_top_p(*be, distinct, {0.5f}), {0.0, 1.0, 0.0, 0.0}, kTol));
  // top_p 0.79: 0.5 + 0.3 = 0.8 is the smallest prefix reaching it.
  EXPECT_TRUE(all_close(run_top_p(*be, distinct, {0.79f}), {0.0, 0.625, 0.0, 0.375}, kTol));
  // top_p 1 leaves the row untouched (no renormalization either).
  const std::vector<float> unnorm = {0.5f, 1.5f, 0.0f, 2.0f};
  EXPECT_EQ(run_top_p(*be, unnorm, {1.0f}), unnorm);
  // Several rows with different settings in one call.
  const std::vector<float> both = run_top_p(*be, {0.15f, 0.5f, 0.05f, 0.3f, 0.15f, 0.5f, 0.05f, 0.3f}, {0.5f, 0.79f});
  EXPECT_TRUE(all_close(both, {0.0, 1.0, 0.0, 0.0, 0.0, 0.625, 0.0, 0.375}, kTol));
}

TEST(CpuSampling, TopPRandomRows) {
  auto be = cpu::make_cpu_backend();
  std::mt19937 rng(43);
  const int64_t rows = 4, vocab = 64;
  const std::vector<float> probs = random_probs(rng, rows, vocab);
  const std::vector<float> top_p = {0.1f, 0.5f, 0.9f, 0.999f};
  std::vector<double> ref;
  for (int64_t b = 0; b < rows; ++b) {
    std::vector<float> sorted(probs.begin() + b * vocab, probs.begin() + (b + 1) * vocab);
    std::sort(sorted.begin(), sorted.end(), std::greater<float>());
    double cum = 0.0;
    size_t n = 0;
    while (n < sorted.size() && cum < top_p[size_t(b)]) cum += sorted[n++];
    const auto r = keep_ref(probs.data() + b * vocab, vocab, sorted[n - 1]);
    ref.insert(ref.end(), r.begin(), r.end());
  }
  EXPECT_TRUE(all_close(run_top_p(*be, probs, top_p), ref, kTol));
}

TEST(CpuSampling, MinP) {
  auto be = cpu::make_cpu_backend();
  const std::vector<float> row = {0.2f, 0.4f, 0.1f, 0.3f};
  // min_p 0.5: threshold 0.5 * 0.4 = 0.2 exactly, so 0.2 is kept; kept sum 0.9.
  EXPECT_TRUE(all_close(run_min_p(*be, row, {0.5f}), {0.2 / 0.9, 0.4 / 0.9, 0.0, 0.3 / 0.9}, kTol));
  // min_p 1: only the maximum (and its ties) survive.
  EXPECT_TRUE(all_close(run_min_p(*be, row, {1.0f}), {0.0, 1.0, 0.0, 0.0}, kTol));
  EXPECT_TRUE(all_close(run_min_p(*be, {0.4f, 0.2f, 0.4f}, {1.0f}), {0.5, 0.0, 0.5}, kTol));
  // min_p 0: unchanged.
  const std::vector<float> unnorm = {0.5f, 1.5f, 0.0f};
  EXPECT_EQ(run_min_p(*be, unnorm, {0.0f}), unnorm);
}

TEST(CpuSampling, SampleFromProbsInverseCdf) {
  auto be = cpu::make_cpu_backend();
  const float below_one = std::nextafter(1.0f, 0.0f);
  const std::vector<float> row = {0.0f, 0.25f, 0.0f, 0.5f, 0.25f, 0.0f};  // cumsum 0 .25 .25 .75 1 1
  EXPECT_EQ(sample_one(*be, row, 0.0f), 1);    // first nonzero, never index 0
  EXPECT_EQ(sample_one(*be, row, 0.2f), 1);
  EXPECT_EQ(sample_one(*be, row, 0.25f), 3);   // on a boundary: strict '>' skips the zero at index 2
  EXPECT_EQ(sample_one(*be, row, 0.5f), 3);
  EXPECT_EQ(sample_one(*be, row, 0.75f), 4);
  EXPECT_EQ(sample_one(*be, row, below_one), 4);  // never the trailing zero
  // Unnormalized: the target is u * sum.
  EXPECT_EQ(sample_one(*be, {0.0f, 2.0f, 0.0f, 6.0f}, 0.25f), 3);
  EXPECT_EQ(sample_one(*be, {0.0f, 2.0f, 0.0f, 6.0f}, 0.2499f), 1);
  EXPECT_EQ(sample_one(*be, {0.0f, 0.0f, 0.0f, 1.0f}, 0.0f), 3);
  // Many small entries (fp32 sum != 1) followed by zeros: u just below 1 picks the last nonzero.
  std::vector<float> many(1000, 0.001f);
  many.resize(1010, 0.0f);
  EXPECT_EQ(sample_one(*be, many, below_one), 999);
  EXPECT_EQ(sample_one(*be, many, 0.0f), 0);
}

TEST(CpuSampling, SampleFromProbsRandomRows) {
  auto be = cpu::make_cpu_backend();
  std::mt19937 rng(44);
  const int64_t rows = 16, vocab = 29;
  std::vector<float> probs = random_probs(rng, rows, vocab);
  for (int64_t i = 0; i < rows * vocab; i += 3) probs[size_t(i)] = 0.0f;  // zero entries, unnormalized rows
  std::vector<float> u = random_floats(rng, size_t(rows), 0.0f, 1.0f);
  std::vector<int32_t> ids(size_t(rows), -1);
  be->sample_from_probs(view_of(probs, {rows, vocab}), view_of(u, {rows}), view_of(ids, {rows}));
  for (int64_t b = 0; b < rows; ++b) {
    const float* p = probs.data() + b * vocab;
    double sum = 0.0;
    for (int64_t i = 0; i < vocab; ++i) sum += p[i];
    double cum = 0.0;
    int32_t want = -1;
    for (int32_t i = 0; i < vocab && want < 0; ++i)
      if ((cum += p[i]) > double(u[size_t(b)]) * sum) want = i;
    EXPECT_EQ(ids[size_t(b)], want) << "row " << b;
    EXPECT_GT(p[ids[size_t(b)]], 0.0f);
  }
}

TEST(CpuSampling, ArgmaxLowestIndexOnTies) {
  auto be = cpu::make_cpu_backend();
  std::vector<float> logits = {1.0f, 3.0f, 3.0f, 2.0f,        //
                               -5.0f, -5.0f, -7.0f, -6.0f,     //
                               0.0f, 0.0f, 0.0f, 0.0f,         //
                               -INFINITY, -1.0f, 7.0f, 7.0f};
  std::vector<int32_t> ids(4, -1);
  be->argmax(view_of(logits, {4, 4}), view_of(ids, {4}));
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 0, 0, 2}));
}

TEST(CpuSamplingDeathTest, RejectsOutOfRangeParameters) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto be = cpu::make_cpu_backend();
  EXPECT_DEATH(run_top_p(*be, {0.5f, 0.5f}, {0.0f}), "top_p");
  EXPECT_DEATH(sample_one(*be, {0.5f, 0.5f}, 1.0f), "uniform");
  EXPECT_DEATH(sample_one(*be, {0.0f, 0.0f}, 0.5f), "no positive probability");
}

}  // namespace
}  // namespace mla::test
