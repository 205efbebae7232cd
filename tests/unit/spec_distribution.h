// The lossless property of speculative_verify, by statistics, for any backend (issue #8: the CPU
// suite runs it on the reference backend, the GPU suite on the GPU): drafts drawn from q, verified
// against p, must emit tokens distributed exactly as sampling from p would. Both p and q come out of
// the backend's own filter pipeline in runtime::Sampler's order (softmax with temperature -> top-k ->
// top-p -> min-p), over tiny vocabularies so a chi-square goodness-of-fit test has power with modest
// trial counts (runtime matters: CI also runs this under ASan).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ops/backend.h"
#include "unit/cpu_test_util.h"

namespace mla::test::spec_distribution {

// ---- running ops on host vectors -------------------------------------------------------------------

// Runs backend ops on host vectors on any backend: in() uploads a copy, out() / inout() give a backend
// buffer that finish() downloads into the vector (inout() uploads it first, e.g. a poison).
class Staging {
 public:
  explicit Staging(ops::Backend& be) : be_(be) {}
  template <typename T> TensorView in(const std::vector<T>& v, std::initializer_list<int64_t> dims) {
    const TensorView t = make<T>(v.size(), dims);
    be_.copy_from_host(t, v.data());
    return t;
  }
  template <typename T> TensorView out(std::vector<T>& v, std::initializer_list<int64_t> dims) {
    const TensorView t = make<T>(v.size(), dims);
    downloads_.push_back({t, v.data()});
    return t;
  }
  template <typename T> TensorView inout(std::vector<T>& v, std::initializer_list<int64_t> dims) {
    const TensorView t = in(v, dims);
    downloads_.push_back({t, v.data()});
    return t;
  }
  void finish() {
    be_.synchronize();
    for (const auto& [view, host] : downloads_) be_.copy_to_host(host, view);
    downloads_.clear();
  }

 private:
  template <typename T> TensorView make(size_t n, std::initializer_list<int64_t> dims) {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, int32_t>);
    buffers_.push_back(be_.alloc(std::max<size_t>(n, 1) * sizeof(T)));
    return buffers_.back().view(std::is_same_v<T, float> ? DType::F32 : DType::I32, dims);
  }
  ops::Backend& be_;
  std::vector<Buffer> buffers_;
  std::vector<std::pair<TensorView, void*>> downloads_;
};

// ---- chi-square goodness of fit ---------------------------------------------------------------------

// Regularized upper incomplete gamma Q(a, x): the power series of P below x = a + 1, Lentz's continued
// fraction of Q above (the textbook split: each converges fast on its side).
inline double gamma_q(double a, double x) {
  if (x <= 0.0) return 1.0;
  const double prefactor = std::exp(-x + a * std::log(x) - std::lgamma(a));
  if (x < a + 1.0) {
    double term = 1.0 / a, sum = term;
    for (int n = 1; n < 10000 && term > sum * 1e-16; ++n) sum += (term *= x / (a + n));
    return std::max(0.0, 1.0 - prefactor * sum);
  }
  constexpr double kTiny = 1e-300;
  double b = x + 1.0 - a, c = 1.0 / kTiny, d = 1.0 / b, h = d;
  for (int i = 1; i < 10000; ++i) {
    const double an = -i * (i - a);
    b += 2.0;
    d = an * d + b;
    if (std::fabs(d) < kTiny) d = kTiny;
    c = b + an / c;
    if (std::fabs(c) < kTiny) c = kTiny;
    d = 1.0 / d;
    h *= d * c;
    if (std::fabs(d * c - 1.0) < 1e-16) break;
  }
  return prefactor * h;
}

// P(chi2_dof > x).
inline double chi2_sf(double x, int dof) { return dof > 0 ? gamma_q(0.5 * dof, 0.5 * x) : 1.0; }

// The statistic a test must stay below: P(chi2_dof > critical) = alpha, by bisection.
inline double chi2_critical(int dof, double alpha) {
  double lo = 0.0, hi = 1000.0 + 100.0 * dof;
  for (int it = 0; it < 200; ++it) {
    const double mid = 0.5 * (lo + hi);
    (chi2_sf(mid, dof) > alpha ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

// Every goodness-of-fit test here rejects at p-value < 1e-4. Seeds are fixed, so each verdict is
// deterministic; with ~50 tests in the file, a correct verifier would fail somewhere by chance with
// probability ~0.5% per choice of seeds, and a verifier off by a few percent of probability in one
// bin fails with certainty at these trial counts (the negative controls show by how much).
constexpr double kAlpha = 1e-4;

struct Fit {
  double stat = 0.0, p_value = 1.0, critical = 0.0;
  int dof = 0;
  int64_t outside_support = 0;  // observations of tokens whose expected probability is exactly 0
  bool ok() const { return outside_support == 0 && p_value >= kAlpha; }
  std::string describe() const {
    return "chi2 " + std::to_string(stat) + " dof " + std::to_string(dof) + " (critical " + std::to_string(critical) +
           " at p=1e-4) p-value " + std::to_string(p_value) + ", tokens outside the support " +
           std::to_string(outside_support);
  }
};

// Pearson's test of `counts` against `probs` (same length, probs summing to ~1). Bins of expected
// count < 5 are pooled, smallest first, until each pooled bin expects >= 5 (the usual validity rule of
// the chi-square approximation); zero-probability bins are not tested statistically but must be empty.
inline Fit chi_square(const std::vector<int64_t>& counts, const std::vector<double>& probs) {
  Fit fit;
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t(0));
  std::vector<size_t> order;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] > 0.0) order.push_back(i);
    else fit.outside_support += counts[i];
  }
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return probs[a] < probs[b]; });
  std::vector<std::pair<double, double>> bins;  // (expected, observed)
  double pool_e = 0.0, pool_o = 0.0;
  for (size_t i : order) {
    pool_e += double(total) * probs[i];
    pool_o += double(counts[i]);
    if (pool_e >= 5.0) {
      bins.emplace_back(pool_e, pool_o);
      pool_e = pool_o = 0.0;
    }
  }
  if (pool_e > 0.0 || pool_o > 0.0) {
    if (bins.empty()) {
      bins.emplace_back(pool_e, pool_o);
    } else {  // a leftover below 5 (only when the whole sample is tiny) joins the last bin
      bins.back().first += pool_e;
      bins.back().second += pool_o;
    }
  }
  for (const auto& [e, o] : bins) fit.stat += (o - e) * (o - e) / e;
  fit.dof = int(bins.size()) - 1;
  fit.p_value = chi2_sf(fit.stat, fit.dof);
  fit.critical = fit.dof > 0 ? chi2_critical(fit.dof, kAlpha) : 0.0;
  return fit;
}

// ---- the filter pipeline and the trials -------------------------------------------------------------

struct Filter {
  float temperature = 1.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
};

// Rows of logits [rows, V] -> filtered, renormalized probabilities, by the backend's ops in the order
// runtime::Sampler applies them (each "disabled" setting is the identity).
inline std::vector<float> filtered_probs(ops::Backend& be, std::vector<float> logits, int64_t vocab, const Filter& f) {
  const int64_t rows = int64_t(logits.size()) / vocab;
  std::vector<float> probs(logits.size()), temp(size_t(rows), f.temperature), top_p(size_t(rows), f.top_p),
      min_p(size_t(rows), f.min_p);
  std::vector<int32_t> top_k(size_t(rows), f.top_k);
  Staging st(be);
  const TensorView pv = st.out(probs, {rows, vocab});
  be.softmax(st.in(logits, {rows, vocab}), st.in(temp, {rows}), pv);
  be.top_k_renorm_prob(pv, st.in(top_k, {rows}), pv);
  be.top_p_renorm_prob(pv, st.in(top_p, {rows}), pv);
  be.min_p_renorm_prob(pv, st.in(min_p, {rows}), pv);
  st.finish();
  return probs;
}

// A uniform in [0, 1) with 24 random bits, as runtime::RequestRng draws them.
inline float uniform01(std::mt19937& rng) { return float(rng() >> 8) * (1.0f / 16777216.0f); }

// One batch of `trials` independent verifications sharing per-position distributions: q[i] (i < K)
// and p[i] (i <= K), each [V]. Draft i of a trial is drawn from q[i] by the backend's
// sample_from_probs; num_drafts is K for half the trials and uniform in [0, K) for the rest.
struct Trials {
  int64_t n_trials, k, vocab;
  std::vector<float> q, p;                    // [K, V], [K + 1, V]
  std::vector<float> draft_probs, target_probs, u;  // [N, K, V], [N, K + 1, V], [N, K + 1]
  std::vector<int32_t> drafts, n, ids, emitted;    // [N, K], [N], [N, K + 1], [N]

  Trials(ops::Backend& be, std::mt19937& rng, int64_t trials, std::vector<float> q_rows, std::vector<float> p_rows,
         int64_t vocab_)
      : n_trials(trials), k(int64_t(p_rows.size()) / vocab_ - 1), vocab(vocab_), q(std::move(q_rows)),
        p(std::move(p_rows)) {
    const size_t qn = size_t(k * vocab), pn = size_t((k + 1) * vocab);
    for (int64_t t = 0; t < trials; ++t) {
      draft_probs.insert(draft_probs.end(), q.begin(), q.begin() + long(qn));
      target_probs.insert(target_probs.end(), p.begin(), p.begin() + long(pn));
    }
    std::vector<float> draft_u(size_t(trials * k));
    for (float& x : draft_u) x = uniform01(rng);
    drafts.assign(size_t(trials * k), -1);
    if (k > 0) {
      Staging st(be);
      be.sample_from_probs(st.in(draft_probs, {trials * k, vocab}), st.in(draft_u, {trials * k}),
                           st.inout(drafts, {trials * k}));
      st.finish();
    }
    n.resize(size_t(trials));
    for (int32_t& x : n) x = (rng() & 1u) || k == 0 ? int32_t(k) : int32_t(rng() % uint32_t(k));
    u.resize(size_t(trials * (k + 1)));
    for (float& x : u) x = uniform01(rng);
  }

  void verify(ops::Backend& be) {
    ids.assign(size_t(n_trials * (k + 1)), -7);
    emitted.assign(size_t(n_trials), -7);
    Staging st(be);
    be.speculative_verify(st.in(draft_probs, {n_trials, k, vocab}), st.in(drafts, {n_trials, k}),
                          st.in(n, {n_trials}), st.in(target_probs, {n_trials, k + 1, vocab}),
                          st.in(u, {n_trials, k + 1}), st.inout(ids, {n_trials, k + 1}), st.inout(emitted, {n_trials}));
    st.finish();
  }

  int32_t id(int64_t t, int64_t j) const { return ids[size_t(t * (k + 1) + j)]; }

  // Goodness of fit of the tokens emitted at position j (over the trials that reach j) to p[j].
  // Reaching j depends only on the randomness of positions < j and on num_drafts, so given that j is
  // reached, its token is one speculative step: distributed as p[j] exactly.
  Fit fit_position(int64_t j, int64_t* reached) const {
    std::vector<int64_t> counts(size_t(vocab), 0);
    *reached = 0;
    for (int64_t t = 0; t < n_trials; ++t) {
      if (emitted[size_t(t)] <= j) continue;
      const int32_t x = id(t, j);
      if (x < 0 || x >= vocab) return Fit{0, 0, 0, 0, 1};  // a non-token where a token is due
      ++counts[size_t(x)];
      ++*reached;
    }
    return chi_square(counts, std::vector<double>(p.begin() + long(j * vocab), p.begin() + long((j + 1) * vocab)));
  }

  // Structural invariants every verifier output must satisfy.
  ::testing::AssertionResult well_formed() const {
    for (int64_t t = 0; t < n_trials; ++t) {
      const int32_t e = emitted[size_t(t)];
      if (e < 1 || e > n[size_t(t)] + 1) return ::testing::AssertionFailure() << "trial " << t << " emitted " << e;
      for (int64_t j = 0; j <= k; ++j) {
        const int32_t x = id(t, j);
        const bool ok = j + 1 < e ? x == drafts[size_t(t * k + j)] : j + 1 == e ? x >= 0 && x < vocab : x == -1;
        if (!ok) return ::testing::AssertionFailure() << "trial " << t << " slot " << j << " holds " << x;
      }
    }
    return ::testing::AssertionSuccess();
  }
};

// Per-position logits: `rows` rows of V values uniform in [-spread, spread].
inline std::vector<float> random_logits(std::mt19937& rng, int64_t rows, int64_t vocab, float spread = 2.0f) {
  return random_floats(rng, size_t(rows * vocab), -spread, spread);
}

struct Setting {
  std::string name;
  int64_t vocab, k;
  Filter filter;
  std::vector<float> target_logits, draft_logits;  // [K + 1, V], [K, V]
};

// The settings of the sweep: temperatures, top_k in {1, 3, V, V + 5}, top_p in {1, 0.5, 0.9}, min_p,
// ties at the top-k pivot and the top-p boundary, a draft that prefers tokens the target filters out,
// and a draft equal to the target. p and q differ at every position, and between positions.
inline std::vector<Setting> settings(std::mt19937& rng) {
  std::vector<Setting> s;
  // A draft that approximates the target (its logits plus noise in [-1.5, 1.5]), as real drafts do, so
  // that later positions are reached often enough to be tested.
  auto add = [&](std::string name, int64_t vocab, int64_t k, Filter f) {
    Setting t{std::move(name), vocab, k, f, random_logits(rng, k + 1, vocab), random_logits(rng, k, vocab, 1.5f)};
    for (size_t i = 0; i < t.draft_logits.size(); ++i) t.draft_logits[i] += t.target_logits[i];
    s.push_back(std::move(t));
  };
  // First (the negative controls use it): a draft independent of the target.
  s.push_back(
      {"T=1, independent draft", 8, 3, {1.0f, 0, 1.0f, 0.0f}, random_logits(rng, 4, 8), random_logits(rng, 3, 8)});
  add("T=1", 8, 3, {1.0f, 0, 1.0f, 0.0f});
  add("T=0.5 top_k=3", 10, 4, {0.5f, 3, 1.0f, 0.0f});
  add("T=1.7 top_k=V top_p=0.9", 7, 2, {1.7f, 7, 0.9f, 0.0f});
  add("top_k=V+5 top_p=0.5", 9, 3, {1.0f, 14, 0.5f, 0.0f});
  add("top_k=1", 6, 3, {1.0f, 1, 1.0f, 0.0f});
  add("T=0.8 top_p=0.9 min_p=0.1", 12, 4, {0.8f, 0, 0.9f, 0.1f});
  add("T=1.3 min_p=0.3", 8, 2, {1.3f, 0, 1.0f, 0.3f});
  add("T=0.7 top_k=3 top_p=0.9 min_p=0.05", 11, 1, {0.7f, 3, 0.9f, 0.05f});
  {
    // Ties at the top-k pivot: per position one max, then three equal logits (top_k = 2 keeps all
    // three), placed at different tokens per position.
    Setting t{"ties at the top_k=2 pivot", 8, 3, {1.0f, 2, 1.0f, 0.0f}, {}, random_logits(rng, 3, 8)};
    for (int64_t i = 0; i <= t.k; ++i) {
      std::vector<float> row = {2.0f, 1.0f, 1.0f, 1.0f, -1.0f, 0.0f, -0.5f, 0.5f};
      std::rotate(row.begin(), row.begin() + i, row.end());
      t.target_logits.insert(t.target_logits.end(), row.begin(), row.end());
    }
    s.push_back(std::move(t));
  }
  {
    // Ties at the top-p boundary: softmax = {4, 2, 2, 2, 1, 1} / 12; top_p = 0.45 is first reached at
    // a 2/12 value (cumsum 0.5), so all three 2/12 tokens are kept (0.05 clear of the boundary).
    Setting t{"ties at the top_p=0.45 boundary", 6, 2, {1.0f, 0, 0.45f, 0.0f}, {}, random_logits(rng, 2, 6)};
    for (int64_t i = 0; i <= t.k; ++i) {
      std::vector<float> row = {std::log(4.0f), std::log(2.0f), std::log(2.0f), std::log(2.0f), 0.0f, 0.0f};
      std::rotate(row.begin(), row.begin() + 2 * i, row.end());
      t.target_logits.insert(t.target_logits.end(), row.begin(), row.end());
    }
    s.push_back(std::move(t));
  }
  {
    // The draft peaks on tokens the target's top_k = 2 removes: mostly rejections, residual ~ p.
    Setting t{"draft outside the target's top_k=2", 8, 3, {1.0f, 2, 1.0f, 0.0f}, random_logits(rng, 4, 8), {}};
    t.draft_logits = t.target_logits;
    t.draft_logits.resize(size_t(3 * 8));
    for (float& x : t.draft_logits) x = -x * 3.0f;
    s.push_back(std::move(t));
  }
  {
    // Draft == target at every position: u * q < q for every u < 1, so every draft is accepted.
    Setting t{"draft == target, top_p=0.9", 7, 3, {0.9f, 0, 0.9f, 0.0f}, random_logits(rng, 4, 7), {}};
    t.draft_logits.assign(t.target_logits.begin(), t.target_logits.begin() + 3 * 7);
    s.push_back(std::move(t));
  }
  return s;
}

constexpr int64_t kTrials = 20000;
constexpr int64_t kMinReached = 400;  // positions reached by fewer trials are not tested

inline Trials make_trials(ops::Backend& be, const Setting& s, uint32_t seed) {
  std::mt19937 rng(seed);
  return Trials(be, rng, kTrials, filtered_probs(be, s.draft_logits, s.vocab, s.filter),
                filtered_probs(be, s.target_logits, s.vocab, s.filter), s.vocab);
}

// Every setting's emitted tokens, position by position, fit the target's filtered distribution.
inline void check_every_position_is_distributed_as_the_target(ops::Backend& be) {
  std::mt19937 rng(8001);
  uint32_t seed = 9001;
  for (const Setting& s : settings(rng)) {
    Trials t = make_trials(be, s, seed++);
    t.verify(be);
    ASSERT_TRUE(t.well_formed()) << s.name;
    int tested = 0;
    for (int64_t j = 0; j <= s.k; ++j) {
      int64_t reached = 0;
      const Fit fit = t.fit_position(j, &reached);
      if (reached < kMinReached) continue;
      ++tested;
      EXPECT_TRUE(fit.ok()) << s.name << ", position " << j << " (" << reached << " trials): " << fit.describe();
    }
    EXPECT_GE(tested, 1) << s.name;  // position 0 is reached by every trial
    if (s.name.rfind("draft == target", 0) == 0) {  // every draft accepted, exactly
      for (int64_t i = 0; i < kTrials; ++i) ASSERT_EQ(t.emitted[size_t(i)], t.n[size_t(i)] + 1) << "trial " << i;
    }
  }
}

// The stream view: with the same p and q at every position, consecutive verify rounds concatenated
// must be an iid sample of p. Non-overlapping pairs of the stream (independent under the null) are

inline void check_token_stream_is_iid(ops::Backend& be) {
  std::mt19937 rng(8101);
  const int64_t vocab = 6, k = 3;
  const Filter f{1.0f, 0, 0.9f, 0.0f};
  std::vector<float> p1 = filtered_probs(be, random_logits(rng, 1, vocab), vocab, f);
  std::vector<float> q1 = filtered_probs(be, random_logits(rng, 1, vocab), vocab, f);
  std::vector<float> p, q;
  for (int64_t i = 0; i <= k; ++i) p.insert(p.end(), p1.begin(), p1.end());
  for (int64_t i = 0; i < k; ++i) q.insert(q.end(), q1.begin(), q1.end());
  Trials t(be, rng, kTrials, q, p, vocab);
  t.verify(be);
  ASSERT_TRUE(t.well_formed());
  std::vector<int32_t> stream;
  for (int64_t i = 0; i < kTrials; ++i)
    for (int64_t j = 0; j < t.emitted[size_t(i)]; ++j) stream.push_back(t.id(i, j));
  std::vector<int64_t> singles(size_t(vocab), 0), pairs(size_t(vocab * vocab), 0);
  for (int32_t x : stream) ++singles[size_t(x)];
  for (size_t i = 0; i + 1 < stream.size(); i += 2) ++pairs[size_t(stream[i] * vocab + stream[i + 1])];
  std::vector<double> p_single(p1.begin(), p1.end()), p_pair;
  for (int64_t a = 0; a < vocab; ++a)
    for (int64_t b = 0; b < vocab; ++b) p_pair.push_back(double(p1[size_t(a)]) * p1[size_t(b)]);
  const Fit single = chi_square(singles, p_single), pair = chi_square(pairs, p_pair);
  EXPECT_TRUE(single.ok()) << stream.size() << " tokens: " << single.describe();
  EXPECT_TRUE(pair.ok()) << stream.size() / 2 << " pairs: " << pair.describe();
  EXPECT_GE(pair.dof, 8);  // the pair test really tests something
}

}  // namespace mla::test::spec_distribution
