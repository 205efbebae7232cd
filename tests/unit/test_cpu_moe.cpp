// CPU backend MoE: noaux_tc routing against an independent double-precision reimplementation (with a
// hand-checked case where the group limit changes the answer) and routed experts against a direct
// per-token computation. Tolerances: routing weights 1e-6 * (1 + |ref|) (a handful of fp32 ops);
// expert outputs 1e-5 * (1 + |ref|) (three chained fp32 GEMMs of <= 37 terms).
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <numeric>

#include "backend/cpu/cpu_backend.h"
#include "unit/cpu_test_util.h"

namespace mla::test {
namespace {

struct RouteResult {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

RouteResult run_route(ops::Backend& be, std::vector<float>& logits, std::vector<float>* bias, int64_t experts,
                      const ops::MoeRouting& routing) {
  const int64_t tokens = int64_t(logits.size()) / experts;
  RouteResult r{std::vector<int32_t>(size_t(tokens * routing.top_k), -7), nan_filled(size_t(tokens * routing.top_k))};
  be.moe_route(view_of(logits, {tokens, experts}), bias ? view_of(*bias, {experts}) : TensorView{}, routing,
               view_of(r.ids, {tokens, routing.top_k}), view_of(r.weights, {tokens, routing.top_k}));
  return r;
}

// DeepSeek-V3 routing in double: selection on sigmoid + bias, group limit by top-2 sums, lowest index
// first among equal scores; weights from the unbiased sigmoid.
void route_ref(const std::vector<float>& logits, const std::vector<float>* bias, int64_t experts,
               const ops::MoeRouting& routing, std::vector<int32_t>& ids, std::vector<double>& weights) {
  const int64_t tokens = int64_t(logits.size()) / experts, group_size = experts / routing.n_group;
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<double> s(static_cast<size_t>(experts)), b(static_cast<size_t>(experts));
    for (int64_t e = 0; e < experts; ++e) {
      s[size_t(e)] = 1.0 / (1.0 + std::exp(-double(logits[size_t(t * experts + e)])));
      b[size_t(e)] = s[size_t(e)] + (bias ? double((*bias)[size_t(e)]) : 0.0);
    }
    std::vector<bool> allowed(size_t(experts), true);
    if (routing.n_group > 1) {
      std::vector<std::pair<double, int>> groups;  // (-score, group): sorts best first, low index first
      for (int g = 0; g < routing.n_group; ++g) {
        std::vector<double> members(b.begin() + g * group_size, b.begin() + (g + 1) * group_size);
        std::sort(members.rbegin(), members.rend());
        groups.push_back({-(members[0] + members[1]), g});
      }
      std::sort(groups.begin(), groups.end());
      std::fill(allowed.begin(), allowed.end(), false);
      for (int k = 0; k < routing.topk_group; ++k)
        for (int64_t e = 0; e < group_size; ++e) allowed[size_t(groups[size_t(k)].second * group_size + e)] = true;
    }
    std::vector<std::pair<double, int32_t>> cand;
    for (int32_t e = 0; e < experts; ++e)
      if (allowed[size_t(e)]) cand.push_back({-b[size_t(e)], e});
    std::sort(cand.begin(), cand.end());
    double sum = 0.0;
    for (int k = 0; k < routing.top_k; ++k) sum += s[size_t(cand[size_t(k)].second)];
    for (int k = 0; k < routing.top_k; ++k) {
      const int32_t e = cand[size_t(k)].second;
      ids.push_back(e);
      weights.push_back(s[size_t(e)] / (routing.norm_topk_prob ? sum + 1e-20 : 1.0) * routing.routed_scaling_factor);
    }
  }
}

TEST(CpuMoeRoute, GroupLimitExcludesTheBestSingleExpert) {
  auto be = cpu::make_cpu_backend();
  // 8 experts in 4 groups of 2, keep 2 groups, pick 2 experts. Sigmoids (approx.):
  //   group 0: 0.993, 0.007 -> 1.000   group 1: 0.881, 0.731 -> 1.612
  //   group 2: 0.818, 0.769 -> 1.587   group 3: 0.500, 0.500 -> 1.000
  // Groups 1 and 2 survive, so expert 0 (the best single score) is excluded: ids = {2, 4}.
  std::vector<float> logits = {5.0f, -5.0f, 2.0f, 1.0f, 1.5f, 1.2f, 0.0f, 0.0f};
  ops::MoeRouting routing{2, 4, 2, true, 2.5f};
  const RouteResult r = run_route(*be, logits, nullptr, 8, routing);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{2, 4}));
  const double s2 = 1.0 / (1.0 + std::exp(-2.0)), s4 = 1.0 / (1.0 + std::exp(-1.5));
  EXPECT_NEAR(r.weights[0], 2.5 * s2 / (s2 + s4), 1e-6);
  EXPECT_NEAR(r.weights[1], 2.5 * s4 / (s2 + s4), 1e-6);
  // Without the group limit the best single expert wins.
  routing.n_group = 1;
  routing.topk_group = 1;
  EXPECT_EQ(run_route(*be, logits, nullptr, 8, routing).ids, (std::vector<int32_t>{0, 2}));
}

TEST(CpuMoeRoute, BiasSelectsButDoesNotWeigh) {
  auto be = cpu::make_cpu_backend();
  // Expert 3 has the lowest sigmoid but a bias that makes it the top choice; its weight is its
  // unbiased sigmoid (no renormalization, scaling 1).
  std::vector<float> logits = {1.0f, 0.5f, 0.2f, -1.0f};
  std::vector<float> bias = {0.0f, 0.0f, 0.0f, 1.0f};
  const RouteResult r = run_route(*be, logits, &bias, 4, ops::MoeRouting{2, 1, 1, false, 1.0f});
  EXPECT_EQ(r.ids, (std::vector<int32_t>{3, 0}));
  EXPECT_NEAR(r.weights[0], 1.0 / (1.0 + std::exp(1.0)), 1e-7);
  EXPECT_NEAR(r.weights[1], 1.0 / (1.0 + std::exp(-1.0)), 1e-7);
}

TEST(CpuMoeRoute, TiesPickTheLowerExpertIndex) {
  auto be = cpu::make_cpu_backend();
  std::vector<float> logits(12, 0.25f);
  logits[7] = 0.5f;
  EXPECT_EQ(run_route(*be, logits, nullptr, 12, ops::MoeRouting{3, 1, 1, true, 1.0f}).ids,
            (std::vector<int32_t>{7, 0, 1}));
  // Equal group scores too: of 3 tied groups, groups 0 and 1 are kept.
  std::vector<float> flat(12, 0.25f);
  EXPECT_EQ(run_route(*be, flat, nullptr, 12, ops::MoeRouting{4, 3, 2, true, 1.0f}).ids,
            (std::vector<int32_t>{0, 1, 2, 3}));
}

TEST(CpuMoeRoute, RandomMatchesReference) {
  auto be = cpu::make_cpu_backend();
  std::mt19937 rng(31);
  const int64_t tokens = 7, experts = 24;
  std::vector<float> logits = random_floats(rng, size_t(tokens * experts), -4.0f, 4.0f);
  std::vector<float> bias = random_floats(rng, size_t(experts), -0.3f, 0.3f);
  for (const ops::MoeRouting& routing :
       {ops::MoeRouting{4, 4, 2, true, 2.5f}, ops::MoeRouting{4, 4, 2, false, 2.5f}, ops::MoeRouting{5, 1, 1, true, 1.0f},
        ops::MoeRouting{3, 6, 1, false, 1.75f}}) {
    SCOPED_TRACE(fmt::format("k={} groups={} keep={} norm={}", routing.top_k, routing.n_group, routing.topk_group,
                             routing.norm_topk_prob));
    for (std::vector<float>* b : {&bias, static_cast<std::vector<float>*>(nullptr)}) {
      const RouteResult r = run_route(*be, logits, b, experts, routing);
      std::vector<int32_t> ids;
      std::vector<double> weights;
      route_ref(logits, b, experts, routing, ids, weights);
      EXPECT_EQ(r.ids, ids);
      EXPECT_TRUE(all_close(r.weights, weights, 1e-6));
    }
  }
}

// One expert's weights (gate, up, down) in one of five formats.
struct TestExpert {
  TestWeight gate, up, down;
  ops::ExpertWeights view() const { return {gate.w, up.w, down.w}; }
};

void build_expert(TestExpert& ex, std::mt19937& rng, int kind, int64_t hidden, int64_t inter) {
  auto one = [&](TestWeight& tw, int64_t out, int64_t in) {
    switch (kind) {
      case 0: make_dense(tw, rng, out, in, DType::F32); break;
      case 1: make_dense(tw, rng, out, in, DType::BF16); break;
      case 2: make_fp8(tw, rng, out, in); break;
      case 3: make_int4(tw, rng, out, in, DType::BF16); break;
      default: make_dense(tw, rng, out, in, DType::F16); break;
    }
  };
  one(ex.gate, inter, hidden);
  one(ex.up, inter, hidden);
  one(ex.down, hidden, inter);
}

TEST(CpuMoeExperts, MatchesPerTokenComputation) {
  auto be = cpu::make_cpu_backend();
  std::mt19937 rng(32);
  const int64_t hidden = 37, inter = 19, num_experts = 6, absent = 3;
  std::vector<TestExpert> storage(static_cast<size_t>(num_experts));
  std::vector<ops::ExpertWeights> experts(static_cast<size_t>(num_experts));
  for (int64_t e = 0; e < num_experts; ++e) {
    if (e == absent) continue;  // empty weights: another rank's expert
    build_expert(storage[size_t(e)], rng, int(e % 5), hidden, inter);
    experts[size_t(e)] = storage[size_t(e)].view();
  }
  // 9 tokens: every expert gets < 16 rows (GEMV regime); 40 tokens x 3: ~20 rows (sgemm regime).
  for (const auto& [tokens, top_k] : {std::pair<int64_t, int64_t>{9, 2}, {40, 3}}) {
    SCOPED_TRACE(fmt::format("T={} k={}", tokens, top_k));
    std::vector<float> x = random_floats(rng, size_t(tokens * hidden));
    std::vector<int32_t> ids;
    for (int64_t t = 0; t < tokens; ++t) {
      std::vector<int32_t> perm(static_cast<size_t>(num_experts));
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      ids.insert(ids.end(), perm.begin(), perm.begin() + top_k);
    }
    ids[0] = int32_t(absent);                     // at least one routing to the absent expert
    ids[1] = -1;                                  // ids outside [0, E) contribute 0 (the op's contract)
    ids[size_t(top_k)] = int32_t(num_experts);
    ids[size_t(2 * top_k + 1)] = ids[size_t(2 * top_k)];  // token 2 names one expert twice: counted twice
    std::vector<float> w = random_floats(rng, size_t(tokens * top_k), 0.1f, 1.5f);
    std::vector<float> out = nan_filled(size_t(tokens * hidden));
    be->moe_experts(view_of(x, {tokens, hidden}), view_of(ids, {tokens, top_k}), view_of(w, {tokens, top_k}), experts,
                    view_of(out, {tokens, hidden}));

    std::vector<double> ref(size_t(tokens * hidden), 0.0);
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t k = 0; k < top_k; ++k) {
        const int32_t e = ids[size_t(t * top_k + k)];
        if (e == absent || e < 0 || e >= num_experts) continue;
        const auto g = dequantized(experts[size_t(e)].gate_proj), u = dequantized(experts[size_t(e)].up_proj);
        const auto d = dequantized(experts[size_t(e)].down_proj);
        std::vector<double> act(static_cast<size_t>(inter));
        for (int64_t i = 0; i < inter; ++i) {
          double gi = 0.0, ui = 0.0;
          for (int64_t c = 0; c < hidden; ++c) {
            gi += g[size_t(i * hidden + c)] * x[size_t(t * hidden + c)];
            ui += u[size_t(i * hidden + c)] * x[size_t(t * hidden + c)];
          }
          act[size_t(i)] = gi / (1.0 + std::exp(-gi)) * ui;
        }
        for (int64_t c = 0; c < hidden; ++c) {
          double y = 0.0;
          for (int64_t i = 0; i < inter; ++i) y += d[size_t(c * inter + i)] * act[size_t(i)];
          ref[size_t(t * hidden + c)] += double(w[size_t(t * top_k + k)]) * y;
        }
      }
    EXPECT_TRUE(all_close(out, ref, 1e-5));
  }
}

}  // namespace
}  // namespace mla::test
