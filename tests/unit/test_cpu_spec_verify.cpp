// CPU speculative_verify (issue #8, MODELS.md section 6) on hand-made rows whose outcome is worked
// out in the comments: every draft accepted (bonus from p_n), a rejection with a residual draw, the
// accept boundary u * q == p (rejects), num_drafts 0 (a plain sample from p_0), an all-zero residual
// (falls back to p_i), -1 padding across a batch of mixed rows, strided views, and the argument checks.
// The values are powers of two or short decimals, so the fp32 products and residuals are as written.
#include <gtest/gtest.h>

#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "unit/cpu_test_util.h"

namespace mla::test {
namespace {

constexpr int64_t kV = 4;

// One batch of verify inputs (row-major, contiguous) and its outputs, poisoned before the run.
struct Verify {
  int64_t rows, k;
  std::vector<float> q, p, u;  // [B, K, V], [B, K + 1, V], [B, K + 1]
  std::vector<int32_t> drafts, n, ids, emitted;

  Verify(int64_t rows_, int64_t k_)
      : rows(rows_), k(k_), q(size_t(rows_ * k_ * kV), 0.0f), p(size_t(rows_ * (k_ + 1) * kV), 0.0f),
        u(size_t(rows_ * (k_ + 1)), 0.5f), drafts(size_t(rows_ * k_), 0), n(size_t(rows_), 0) {}
  void set_q(int64_t b, int64_t i, std::vector<float> row) {
    std::copy(row.begin(), row.end(), q.begin() + (b * k + i) * kV);
  }
  void set_p(int64_t b, int64_t i, std::vector<float> row) {
    std::copy(row.begin(), row.end(), p.begin() + (b * (k + 1) + i) * kV);
  }
  void run(ops::Backend& be) {
    ids.assign(size_t(rows * (k + 1)), -7);
    emitted.assign(size_t(rows), -7);
    be.speculative_verify(view_of(q, {rows, k, kV}), view_of(drafts, {rows, k}), view_of(n, {rows}),
                          view_of(p, {rows, k + 1, kV}), view_of(u, {rows, k + 1}), view_of(ids, {rows, k + 1}),
                          view_of(emitted, {rows}));
  }
  std::vector<int32_t> row_ids(int64_t b) const {
    return std::vector<int32_t>(ids.begin() + b * (k + 1), ids.begin() + (b + 1) * (k + 1));
  }
};

TEST(CpuSpecVerify, AllAcceptedThenBonusFromPn) {
  auto be = cpu::make_cpu_backend();
  Verify v(1, 2);
  v.n = {2};
  // Draft 0 = 1: p/q = 0.5 / 0.25 > 1, accepted for any u. Draft 1 = 2: p = q = 0.25, and u * q < q
  // for every u < 1 (also in fp32: u * q rounds below q), so accepted.
  v.drafts = {1, 2};
  v.set_q(0, 0, {0.25f, 0.25f, 0.25f, 0.25f});
  v.set_p(0, 0, {0.125f, 0.5f, 0.25f, 0.125f});
  v.set_q(0, 1, {0.5f, 0.125f, 0.25f, 0.125f});
  v.set_p(0, 1, {0.25f, 0.25f, 0.25f, 0.25f});
  // Bonus from p_2 with u_2 = 0.6: cumsum 0.125, 0.25, 0.75 > 0.6 -> token 2.
  v.set_p(0, 2, {0.125f, 0.125f, 0.5f, 0.25f});
  v.u = {0.9999999f, 0.9999999f, 0.6f};
  v.run(*be);
  EXPECT_EQ(v.row_ids(0), (std::vector<int32_t>{1, 2, 2}));
  EXPECT_EQ(v.emitted, (std::vector<int32_t>{3}));
}

TEST(CpuSpecVerify, RejectionDrawsFromTheResidual) {
  auto be = cpu::make_cpu_backend();
  Verify v(2, 3);
  v.n = {3, 3};
  for (int64_t b = 0; b < 2; ++b) {
    // Draft 0 = 3 with p = q: accepted. Draft 1 = 1: q = 0.5, p = 0.125; u_1 = 0.5 -> 0.25 >= 0.125, rejected.
    v.drafts[size_t(b * 3)] = 3;
    v.drafts[size_t(b * 3 + 1)] = 1;
    v.drafts[size_t(b * 3 + 2)] = 0;  // never reached
    v.set_q(b, 0, {0.25f, 0.25f, 0.25f, 0.25f});
    v.set_p(b, 0, {0.25f, 0.25f, 0.25f, 0.25f});
    v.set_q(b, 1, {0.125f, 0.5f, 0.25f, 0.125f});
    v.set_p(b, 1, {0.5f, 0.125f, 0.25f, 0.125f});
    // Draft 2 and p_2, p_3 would pick token 1 or 2 if (wrongly) used.
    v.set_q(b, 2, {0.25f, 0.25f, 0.25f, 0.25f});
    v.set_p(b, 2, {0.0f, 1.0f, 0.0f, 0.0f});
    v.set_p(b, 3, {0.0f, 0.0f, 1.0f, 0.0f});
  }
  // Residual max(p_1 - q_1, 0) = {0.375, 0, 0, 0}: only token 0, whatever u_3. Make it less trivial in
  // row 1: p_1 = {0.5, 0.125, 0.375, 0}, q_1 = {0.125, 0.5, 0.25, 0.125} -> residual {0.375, 0, 0.125, 0},
  // sum 0.5; u_3 = 0.8 -> target 0.4: cumsum 0.375, 0.375, 0.5 > 0.4 -> token 2 (u_3 = 0.7 would give 0).
  v.set_p(1, 1, {0.5f, 0.125f, 0.375f, 0.0f});
  v.u = {0.3f, 0.5f, 0.3f, 0.8f, 0.3f, 0.5f, 0.3f, 0.8f};
  v.run(*be);
  EXPECT_EQ(v.row_ids(0), (std::vector<int32_t>{3, 0, -1, -1}));
  EXPECT_EQ(v.row_ids(1), (std::vector<int32_t>{3, 2, -1, -1}));
  EXPECT_EQ(v.emitted, (std::vector<int32_t>{2, 2}));
  v.u[7] = 0.7f;  // row 1 target 0.35 < 0.375 -> token 0
  v.run(*be);
  EXPECT_EQ(v.row_ids(1), (std::vector<int32_t>{3, 0, -1, -1}));
}

TEST(CpuSpecVerify, AcceptBoundaryIsStrict) {
  auto be = cpu::make_cpu_backend();
  Verify v(1, 1);
  v.n = {1};
  v.drafts = {2};
  v.set_q(0, 0, {0.25f, 0.25f, 0.5f, 0.0f});
  v.set_p(0, 0, {0.5f, 0.25f, 0.25f, 0.0f});  // residual {0.25, 0, 0, 0}
  v.set_p(0, 1, {0.0f, 0.0f, 0.0f, 1.0f});
  v.u = {0.5f, 0.9f};  // u * q = 0.25 == p: rejected -> the residual's only token, 0
  v.run(*be);
  EXPECT_EQ(v.row_ids(0), (std::vector<int32_t>{0, -1}));
  v.u = {0.4999999f, 0.9f};  // u * q < p: accepted -> bonus from p_1 = token 3
  v.run(*be);
  EXPECT_EQ(v.row_ids(0), (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(v.emitted, (std::vector<int32_t>{2}));
}

TEST(CpuSpecVerify, NoDraftsIsAPlainSampleFromP0) {
  auto be = cpu::make_cpu_backend();
  std::mt19937 rng(81);
  Verify v(1, 2);
  v.n = {0};
  v.drafts = {-5, 99};  // unused slots are not read (nor checked)
  v.u = {7.0f, -1.0f, 0.0f};
  std::vector<float> p0 = random_floats(rng, size_t(kV), 0.1f, 1.0f);
  v.set_p(0, 0, p0);
  v.set_p(0, 1, {1.0f, 0.0f, 0.0f, 0.0f});
  for (float u : {0.0f, 0.3f, 0.55f, 0.9999999f}) {
    v.u[2] = u;
    v.run(*be);
    std::vector<float> uu = {u};
    std::vector<int32_t> want = {-1};
    be->sample_from_probs(view_of(p0, {1, kV}), view_of(uu, {1}), view_of(want, {1}));
    EXPECT_EQ(v.row_ids(0), (std::vector<int32_t>{want[0], -1, -1})) << "u=" << u;
    EXPECT_EQ(v.emitted, (std::vector<int32_t>{1}));
  }
  // K = 0: draft_probs [B, 0, V] and draft_ids [B, 0] are empty.
  Verify k0(1, 0);
  k0.set_p(0, 0, {0.0f, 0.0f, 0.0f, 2.0f});  // unnormalized rows are fine
  k0.run(*be);
  EXPECT_EQ(k0.row_ids(0), (std::vector<int32_t>{3}));
}

TEST(CpuSpecVerify, AllZeroResidualFallsBackToP) {
  auto be = cpu::make_cpu_backend();
  Verify v(1, 2);
  v.n = {2};
  // p_0 == q_0 and the draft is outside their support: u * 0 < 0 is false, rejected; the residual is
  // all zero, so the extra token comes from p_0 with u_2 = 0.75: cumsum 0.5, 1.0 > 0.75 -> token 1.
  v.drafts = {3, 0};
  v.set_q(0, 0, {0.5f, 0.5f, 0.0f, 0.0f});
  v.set_p(0, 0, {0.5f, 0.5f, 0.0f, 0.0f});
  v.set_p(0, 2, {0.0f, 0.0f, 1.0f, 0.0f});
  v.u = {0.0f, 0.0f, 0.75f};
  v.run(*be);
  EXPECT_EQ(v.row_ids(0), (std::vector<int32_t>{1, -1, -1}));
  EXPECT_EQ(v.emitted, (std::vector<int32_t>{1}));
}

TEST(CpuSpecVerify, MixedBatchPadsWithMinusOne) {
  auto be = cpu::make_cpu_backend();
  Verify v(4, 3);
  // Every q row uniform, every p row puts 0.5 on token 1 and 0.5 on token 2: drafts of 1 or 2 always
  // accepted, of 0 or 3 always rejected with residual {0, 0.25, 0.25, 0} (u_3 = 0.6 -> token 2).
  for (int64_t b = 0; b < 4; ++b)
    for (int64_t i = 0; i < 4; ++i) {
      if (i < 3) v.set_q(b, i, {0.25f, 0.25f, 0.25f, 0.25f});
      v.set_p(b, i, {0.0f, 0.5f, 0.5f, 0.0f});
    }
  for (int64_t b = 0; b < 4; ++b) v.u[size_t(b * 4 + 3)] = 0.6f;
  v.n = {3, 1, 2, 0};
  v.drafts = {1, 2, 1,   // row 0: all accepted, bonus from p_3 -> 2
              2, 0, 0,   // row 1: n = 1, accepted, bonus -> 2 (slot 1's 0 would be rejected)
              1, 3, 1,   // row 2: rejected at 1 -> residual -> 2
              0, 0, 0};  // row 3: n = 0 -> sample p_0 -> 2
  v.run(*be);
  EXPECT_EQ(v.row_ids(0), (std::vector<int32_t>{1, 2, 1, 2}));
  EXPECT_EQ(v.row_ids(1), (std::vector<int32_t>{2, 2, -1, -1}));
  EXPECT_EQ(v.row_ids(2), (std::vector<int32_t>{1, 2, -1, -1}));
  EXPECT_EQ(v.row_ids(3), (std::vector<int32_t>{2, -1, -1, -1}));
  EXPECT_EQ(v.emitted, (std::vector<int32_t>{4, 2, 2, 1}));
}

TEST(CpuSpecVerify, StridedViews) {
  auto be = cpu::make_cpu_backend();
  // Row 1 of RejectionDrawsFromTheResidual (K = 2) laid out in wider buffers: column slices of
  // [B, K, V + 3], [B, K + 1, V + 2], [B, K + 2] and an out_ids slice whose padding must stay untouched.
  const int64_t B = 1, K = 2, V = kV;
  std::vector<float> q(size_t(B * K * (V + 3)), 9.0f), p(size_t(B * (K + 1) * (V + 2)), 9.0f);
  std::vector<float> u(size_t(B * (K + 2)), 0.5f);
  std::vector<int32_t> drafts(size_t(B * (K + 1)), 0), n = {2}, ids(size_t(B * (K + 3)), -7), emitted = {-7, -7};
  const float qr[2][4] = {{0.25f, 0.25f, 0.25f, 0.25f}, {0.125f, 0.5f, 0.25f, 0.125f}};
  const float pr[3][4] = {{0.25f, 0.25f, 0.25f, 0.25f}, {0.5f, 0.125f, 0.375f, 0.0f}, {0.0f, 1.0f, 0.0f, 0.0f}};
  for (int64_t i = 0; i < K; ++i)
    for (int64_t j = 0; j < V; ++j) q[size_t(i * (V + 3) + 1 + j)] = qr[i][j];
  for (int64_t i = 0; i <= K; ++i)
    for (int64_t j = 0; j < V; ++j) p[size_t(i * (V + 2) + 2 + j)] = pr[i][j];
  drafts = {9, 3, 1};  // the view starts at column 1
  u = {0.3f, 0.5f, 0.8f, 0.1f};
  be->speculative_verify(strided_view(q.data() + 1, DType::F32, {B, K, V}, {K * (V + 3), V + 3, 1}),
                         strided_view(drafts.data() + 1, DType::I32, {B, K}, {K + 1, 1}),
                         strided_view(n.data(), DType::I32, {B}, {1}),
                         strided_view(p.data() + 2, DType::F32, {B, K + 1, V}, {(K + 1) * (V + 2), V + 2, 1}),
                         strided_view(u.data(), DType::F32, {B, K + 1}, {K + 2, 1}),
                         strided_view(ids.data() + 1, DType::I32, {B, K + 1}, {K + 3, 1}),
                         strided_view(emitted.data() + 1, DType::I32, {B}, {1}));
  EXPECT_EQ(ids, (std::vector<int32_t>{-7, 3, 2, -1, -7}));
  EXPECT_EQ(emitted, (std::vector<int32_t>{-7, 2}));
}

TEST(CpuSpecVerifyDeathTest, RejectsBadArguments) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto be = cpu::make_cpu_backend();
  auto make = [] {
    Verify v(1, 2);
    v.n = {2};
    v.drafts = {1, 1};
    for (int64_t i = 0; i < 3; ++i) {
      if (i < 2) v.set_q(0, i, {0.25f, 0.25f, 0.25f, 0.25f});
      v.set_p(0, i, {0.25f, 0.25f, 0.25f, 0.25f});
    }
    return v;
  };
  {
    Verify v = make();
    v.n = {3};
    EXPECT_DEATH(v.run(*be), "num_drafts 3");
  }
  {
    Verify v = make();
    v.drafts = {1, 4};  // slot 1 is checked even though it might not be reached
    EXPECT_DEATH(v.run(*be), "draft id 4");
  }
  {
    Verify v = make();
    v.u[2] = 1.0f;
    EXPECT_DEATH(v.run(*be), "uniform 1");
  }
  {
    Verify v = make();
    for (int64_t j = 0; j < kV; ++j) v.p[size_t(2 * kV + j)] = 0.0f;  // bonus row p_2 all zero
    EXPECT_DEATH(v.run(*be), "no positive probability");
  }
  {
    Verify v = make();
    v.p[size_t(2 * kV + 1)] = -0.25f;
    EXPECT_DEATH(v.run(*be), "negative probability");
  }
  Verify v = make();
  std::vector<int32_t> ids(3), emitted(1);
  // target_probs with K + 1 = 2 slots for draft_probs of K = 2.
  EXPECT_DEATH(be->speculative_verify(view_of(v.q, {1, 2, kV}), view_of(v.drafts, {1, 2}), view_of(v.n, {1}),
                                      view_of(v.p, {1, 2, kV}), view_of(v.u, {1, 3}), view_of(ids, {1, 3}),
                                      view_of(emitted, {1})),
               "draft_probs");
  // draft_ids as F32.
  EXPECT_DEATH(be->speculative_verify(view_of(v.q, {1, 2, kV}), view_of(v.q, {1, 2}), view_of(v.n, {1}),
                                      view_of(v.p, {1, 3, kV}), view_of(v.u, {1, 3}), view_of(ids, {1, 3}),
                                      view_of(emitted, {1})),
               "draft_ids");
  // out_ids of the wrong width.
  EXPECT_DEATH(be->speculative_verify(view_of(v.q, {1, 2, kV}), view_of(v.drafts, {1, 2}), view_of(v.n, {1}),
                                      view_of(v.p, {1, 3, kV}), view_of(v.u, {1, 3}), view_of(ids, {1, 2}),
                                      view_of(emitted, {1})),
               "out_ids");
  // out_ids aliasing draft_ids.
  std::vector<int32_t> shared(3, 1);
  const TensorView shared_drafts = TensorView::contiguous(shared.data(), DType::I32, {1, 2});
  EXPECT_DEATH(be->speculative_verify(view_of(v.q, {1, 2, kV}), shared_drafts, view_of(v.n, {1}),
                                      view_of(v.p, {1, 3, kV}), view_of(v.u, {1, 3}), view_of(shared, {1, 3}),
                                      view_of(emitted, {1})),
               "alias");
}

}  // namespace
}  // namespace mla::test
