// The lossless property of speculative_verify on the CPU backend (the checks: unit/spec_distribution.h,
// shared with the GPU suite), plus what only the host can show: the chi-square helper against
// tables, and negative controls proving the test can fail (plausible wrong verifiers are rejected
// on the same inputs).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "unit/spec_distribution.h"

namespace mla::test {
namespace {

using namespace spec_distribution;

TEST(CpuSpecDistribution, ChiSquareHelperMatchesTables) {
  // Upper 1e-4 points of chi-square: dof 1, 5 (standard tables); dof 10, 36 from the closed form of
  // even dof, P(chi2_2m > x) = e^(-x/2) sum_{i<m} (x/2)^i / i!; dof 35 by numerical integration.
  EXPECT_NEAR(chi2_critical(1, 1e-4), 15.137, 2e-3);
  EXPECT_NEAR(chi2_critical(5, 1e-4), 25.745, 2e-3);
  EXPECT_NEAR(chi2_critical(10, 1e-4), 35.564, 2e-3);
  EXPECT_NEAR(chi2_critical(35, 1e-4), 74.926, 2e-3);
  EXPECT_NEAR(chi2_critical(36, 1e-4), 76.365, 2e-3);
  EXPECT_NEAR(chi2_sf(3.841, 1), 0.05, 1e-4);
  EXPECT_NEAR(chi2_sf(18.307, 10), 0.05, 1e-4);
}

TEST(CpuSpecDistribution, EveryEmittedPositionIsDistributedAsTheTarget) {
  check_every_position_is_distributed_as_the_target(*cpu::make_cpu_backend());
}

TEST(CpuSpecDistribution, TheTokenStreamIsIid) { check_token_stream_is_iid(*cpu::make_cpu_backend()); }

// ---- negative controls: wrong verifiers must be rejected on the same inputs ---------------------------

// The inverse-CDF rule on the host (the test's own copy, for the wrong verifiers below).
int32_t host_pick(const std::vector<double>& w, float u) {
  const double total = std::accumulate(w.begin(), w.end(), 0.0);
  double cumsum = 0.0;
  int32_t last = -1;
  for (size_t i = 0; i < w.size(); ++i) {
    if (w[i] > 0.0) last = int32_t(i);
    cumsum += w[i];
    if (cumsum > double(u) * total) return int32_t(i);
  }
  return last;
}

enum class Bug {
  AcceptAlways,       // emits every draft (the draft's distribution leaks through)
  ResampleFromP,      // at a rejection, draws from p_i instead of the residual max(p_i - q_i, 0)
  ReuseRejectUniform  // draws the residual with the rejecting uniform u_i instead of the fresh u_K
};

// Overwrites t.ids / t.emitted with a wrong verifier's output.
void wrong_verify(Trials& t, Bug bug) {
  const int64_t k = t.k, vocab = t.vocab;
  for (int64_t r = 0; r < t.n_trials; ++r) {
    const float* u = &t.u[size_t(r * (k + 1))];
    int64_t i = 0;
    for (; i < t.n[size_t(r)]; ++i) {
      const int32_t d = t.drafts[size_t(r * k + i)];
      if (bug != Bug::AcceptAlways && !(u[i] * t.q[size_t(i * vocab + d)] < t.p[size_t(i * vocab + d)])) break;
    }
    std::vector<double> w(static_cast<size_t>(vocab));
    const bool rejected = i < t.n[size_t(r)];
    for (int64_t j = 0; j < vocab; ++j) {
      const double pj = t.p[size_t(i * vocab + j)];
      w[size_t(j)] = rejected && bug != Bug::ResampleFromP ? std::max(0.0, pj - t.q[size_t(i * vocab + j)]) : pj;
    }
    const float u_extra = rejected && bug == Bug::ReuseRejectUniform ? u[i] : u[k];
    int32_t extra = host_pick(w, u_extra);
    if (extra < 0) {
      const auto row = t.p.begin() + long(i * vocab);
      extra = host_pick(std::vector<double>(row, row + long(vocab)), u_extra);
    }
    for (int64_t j = 0; j <= k; ++j)
      t.ids[size_t(r * (k + 1) + j)] = j < i ? t.drafts[size_t(r * k + j)] : j == i ? extra : -1;
    t.emitted[size_t(r)] = int32_t(i + 1);
  }
}

TEST(CpuSpecDistribution, NegativeControlsAreRejected) {
  auto be = cpu::make_cpu_backend();
  std::mt19937 rng(8201);
  const Setting s = settings(rng)[0];  // T = 1, no filter, V = 8, K = 3, independent draft
  for (Bug bug : {Bug::AcceptAlways, Bug::ResampleFromP, Bug::ReuseRejectUniform}) {
    Trials t = make_trials(*be, s, 9101);
    t.verify(*be);
    int64_t reached = 0;
    ASSERT_TRUE(t.fit_position(0, &reached).ok()) << "the correct verifier on these inputs";
    wrong_verify(t, bug);
    ASSERT_TRUE(t.well_formed());
    const Fit fit = t.fit_position(0, &reached);
    EXPECT_FALSE(fit.ok()) << "wrong verifier " << int(bug) << " passed: " << fit.describe();
  }
}

}  // namespace
}  // namespace mla::test
