// CPU backend memory and row-wise ops (embedding, rms_norm, add_rms_norm, add, silu_mul, rope) against
// double-precision loops on random inputs at odd sizes, with strided and aliased views.
// Tolerance: |got - ref| <= 1e-5 * (1 + |ref|) (fp32 arithmetic of a few ops per element).
#include <gtest/gtest.h>

#include <memory>

#include "backend/cpu/cpu_backend.h"
#include "unit/cpu_test_util.h"

namespace mla::test {
namespace {

constexpr double kTol = 1e-5;

TEST(CpuMemory, AllocZeroedCopiesAndZeroCopyWeights) {
  auto be = cpu::make_cpu_backend();
  Buffer buf = be->alloc(37 * sizeof(float));
  ASSERT_NE(buf.data(), nullptr);
  const TensorView v = buf.view(DType::F32, {37});
  for (int64_t i = 0; i < 37; ++i) EXPECT_EQ(v.as<float>()[i], 0.0f);
  std::mt19937 rng(1);
  const std::vector<float> src = random_floats(rng, 37);
  be->copy_from_host(v, src.data());
  std::vector<float> back = nan_filled(37);
  be->copy_to_host(back.data(), v);
  be->synchronize();
  EXPECT_EQ(back, src);
  std::vector<float> weight = random_floats(rng, 12);
  const TensorView host = view_of(weight, {3, 4});
  const TensorView placed = be->place_weight(host);
  EXPECT_EQ(placed.data, host.data);
  EXPECT_TRUE(same_shape(placed, host));
  EXPECT_EQ(be->name(), "cpu");
}

TEST(CpuElementwise, EmbeddingF32AndBf16) {
  auto be = cpu::make_cpu_backend();
  std::mt19937 rng(2);
  const int64_t vocab = 50, d = 37, tokens = 7, out_stride = d + 4;
  const std::vector<float> table = random_floats(rng, size_t(vocab * d));
  std::vector<uint16_t> table_bf16(table.size());
  for (size_t i = 0; i < table.size(); ++i) table_bf16[i] = f32_to_bf16(table[i]);
  std::vector<int32_t> ids(tokens);
  std::uniform_int_distribution<int32_t> pick(0, int32_t(vocab - 1));
  for (auto& id : ids) id = pick(rng);
  ids[0] = 0;
  ids[1] = int32_t(vocab - 1);
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    std::vector<float> out = nan_filled(size_t(tokens * out_stride));
    const TensorView tv = dt == DType::F32
                              ? TensorView::contiguous(const_cast<float*>(table.data()), dt, {vocab, d})
                              : TensorView::contiguous(table_bf16.data(), dt, {vocab, d});
    be->embedding(view_of(ids, {tokens}), tv, strided_view(out.data(), DType::F32, {tokens, d}, {out_stride, 1}));
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t i = 0; i < d; ++i) {
        const float want = dt == DType::F32 ? table[size_t(ids[size_t(t)] * d + i)]
                                            : bf16_to_f32(table_bf16[size_t(ids[size_t(t)] * d + i)]);
        ASSERT_EQ(out[size_t(t * out_stride + i)], want) << t << "," << i;
      }
      for (int64_t i = d; i < out_stride; ++i) EXPECT_TRUE(std::isnan(out[size_t(t * out_stride + i)]));
    }
  }
}

// Reference RMSNorm of one row in double.
std::vector<double> rms_norm_ref(const float* x, const std::vector<double>& w, double eps) {
  const size_t d = w.size();
  double sum_sq = 0.0;
  for (size_t i = 0; i < d; ++i) sum_sq += double(x[i]) * x[i];
  const double inv = 1.0 / std::sqrt(sum_sq / double(d) + eps);
  std::vector<double> out(d);
  for (size_t i = 0; i < d; ++i) out[i] = w[i] * x[i] * inv;
  return out;
}

TEST(CpuElementwise, RmsNormStridedAndInPlace) {
  auto be = cpu::make_cpu_backend();
  std::mt19937 rng(3);
  const int64_t tokens = 7, d = 37, stride = 45;  // x is a column slice [T, 37] of a [T, 45] buffer
  const float eps = 1e-6f;
  for (DType wdt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(wdt));
    std::vector<float> wf = random_floats(rng, size_t(d), 0.5f, 1.5f);
    std::vector<uint16_t> wb(static_cast<size_t>(d));
    std::vector<double> wd(static_cast<size_t>(d));
    for (int64_t i = 0; i < d; ++i) {
      wb[size_t(i)] = f32_to_bf16(wf[size_t(i)]);
      wd[size_t(i)] = wdt == DType::F32 ? wf[size_t(i)] : bf16_to_f32(wb[size_t(i)]);
    }
    const TensorView wv = wdt == DType::F32 ? view_of(wf, {d}) : TensorView::contiguous(wb.data(), DType::BF16, {d});
    std::vector<float> xbuf = random_floats(rng, size_t(tokens * stride), -3.0f, 3.0f);
    const TensorView x = strided_view(xbuf.data() + 3, DType::F32, {tokens, d}, {stride, 1});
    std::vector<float> got;
    std::vector<double> ref;
    for (int64_t t = 0; t < tokens; ++t) {
      const auto r = rms_norm_ref(xbuf.data() + 3 + t * stride, wd, eps);
      ref.insert(ref.end(), r.begin(), r.end());
    }
    // Out of place into a poisoned buffer, then in place (out aliases x).
    std::vector<float> out = nan_filled(size_t(tokens * d));
    be->rms_norm(x, wv, eps, view_of(out, {tokens, d}));
    EXPECT_TRUE(all_close(out, ref, kTol));
    be->rms_norm(x, wv, eps, x);
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t i = 0; i < d; ++i) got.push_back(xbuf[size_t(3 + t * stride + i)]);
    EXPECT_TRUE(all_close(got, ref, kTol));
  }
}

TEST(CpuElementwise, AddRmsNormUpdatesResidualAndMayAliasX) {
  auto be = cpu::make_cpu_backend();
  std::mt19937 rng(4);
  const int64_t tokens = 7, d = 37;
  const float eps = 1e-5f;
  std::vector<float> w = random_floats(rng, size_t(d), 0.5f, 1.5f);
  const std::vector<double> wd(w.begin(), w.end());
  for (bool in_place : {false, true}) {
    SCOPED_TRACE(in_place ? "out aliases x" : "separate out");
    std::vector<float> residual = random_floats(rng, size_t(tokens * d), -2.0f, 2.0f);
    std::vector<float> x = random_floats(rng, size_t(tokens * d), -2.0f, 2.0f);
    std::vector<double> sum_ref, norm_ref;
    for (int64_t t = 0; t < tokens; ++t) {
      std::vector<float> row(static_cast<size_t>(d));
      for (int64_t i = 0; i < d; ++i) {
        // residual + x is one fp32 add; the reference takes the same rounded sum as its input.
        row[size_t(i)] = residual[size_t(t * d + i)] + x[size_t(t * d + i)];
        sum_ref.push_back(double(residual[size_t(t * d + i)]) + x[size_t(t * d + i)]);
      }
      const auto r = rms_norm_ref(row.data(), wd, eps);
      norm_ref.insert(norm_ref.end(), r.begin(), r.end());
    }
    std::vector<float> out = nan_filled(size_t(tokens * d));
    const TensorView xv = view_of(x, {tokens, d});
    be->add_rms_norm(view_of(residual, {tokens, d}), xv, view_of(w, {d}), eps, in_place ? xv : view_of(out, {tokens, d}));
    EXPECT_TRUE(all_close(residual, sum_ref, kTol));
    EXPECT_TRUE(all_close(in_place ? x : out, norm_ref, kTol));
  }
}

TEST(CpuElementwise, AddStridedAndAliased) {
  auto be = cpu::make_cpu_backend();
  std::mt19937 rng(5);
  // a: [7, 3, 5] column slice of a [7, 3, 8] buffer; b contiguous; out aliases a.
  std::vector<float> abuf = random_floats(rng, 7 * 3 * 8), b = random_floats(rng, 7 * 3 * 5);
  const std::vector<float> a0 = abuf;
  const TensorView a = strided_view(abuf.data() + 2, DType::F32, {7, 3, 5}, {24, 8, 1});
  std::vector<float> out = nan_filled(7 * 3 * 5);
  be->add(a, view_of(b, {7, 3, 5}), view_of(out, {7, 3, 5}));
  std::vector<double> ref;
  for (int i = 0; i < 7; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 5; ++k) ref.push_back(double(a0[size_t(i * 24 + j * 8 + 2 + k)]) + b[size_t((i * 3 + j) * 5 + k)]);
  EXPECT_TRUE(all_close(out, ref, kTol));
  be->add(a, view_of(b, {7, 3, 5}), a);
  std::vector<float> got;
  for (int i = 0; i < 7; ++i)
    for (int j = 0; j < 3; ++j) {
      for (int k = 0; k < 5; ++k) got.push_back(abuf[size_t(i * 24 + j * 8 + 2 + k)]);
      EXPECT_EQ(abuf[size_t(i * 24 + j * 8)], a0[size_t(i * 24 + j * 8)]);  // outside the view: untouched
    }
  EXPECT_TRUE(all_close(got, ref, kTol));
}

TEST(CpuElementwise, CopyStridedBothSides) {
  auto be = cpu::make_cpu_backend();
  std::mt19937 rng(8);
  // src: the last 8 of each [7, 3, 13] row (q_rope-like); dst: every other element of a [7, 3, 16]
  // buffer (inner dim strided too). Elements of dst outside the view must stay NaN.
  const std::vector<float> src = random_floats(rng, 7 * 3 * 13);
  std::vector<float> dst = nan_filled(7 * 3 * 16);
  be->copy(strided_view(const_cast<float*>(src.data()) + 5, DType::F32, {7, 3, 8}, {39, 13, 1}),
           strided_view(dst.data(), DType::F32, {7, 3, 8}, {48, 16, 2}));
  for (int i = 0; i < 7; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 16; ++k) {
        const float got = dst[size_t(i * 48 + j * 16 + k)];
        if (k % 2 == 0) ASSERT_EQ(got, src[size_t(i * 39 + j * 13 + 5 + k / 2)]) << i << "," << j << "," << k;
        else ASSERT_TRUE(std::isnan(got)) << i << "," << j << "," << k;
      }
}

// I32 copies every bit (token ids, including negatives and the extremes); mixed dtypes are refused.
TEST(CpuElementwise, CopyI32BitsAndRefusesMixedDtypes) {
  auto be = cpu::make_cpu_backend();
  std::vector<int32_t> src = {0, -1, 7, INT32_MIN, INT32_MAX, 129279, -42};
  std::vector<int32_t> dst(src.size() * 2, 0x5a5a5a5a);
  be->copy(strided_view(src.data(), DType::I32, {7}, {1}), strided_view(dst.data(), DType::I32, {7}, {2}));
  for (size_t i = 0; i < src.size(); ++i) {
    EXPECT_EQ(dst[2 * i], src[i]) << i;
    EXPECT_EQ(dst[2 * i + 1], 0x5a5a5a5a) << i;  // outside the view: untouched
  }
  std::vector<float> f(7, 0.0f);
  EXPECT_DEATH(be->copy(strided_view(src.data(), DType::I32, {7}, {1}), strided_view(f.data(), DType::F32, {7}, {1})),
               "copy");
}

TEST(CpuElementwise, SiluMul) {
  auto be = cpu::make_cpu_backend();
  std::mt19937 rng(6);
  const int64_t tokens = 7, inter = 37;
  std::vector<float> gate = random_floats(rng, size_t(tokens * inter), -6.0f, 6.0f);
  std::vector<float> up = random_floats(rng, size_t(tokens * inter), -2.0f, 2.0f);
  gate[0] = -100.0f;  // exp overflow side: silu -> -0
  gate[1] = 100.0f;
  std::vector<double> ref;
  for (size_t i = 0; i < gate.size(); ++i) ref.push_back(gate[i] / (1.0 + std::exp(-double(gate[i]))) * up[i]);
  std::vector<float> out = nan_filled(gate.size());
  be->silu_mul(view_of(gate, {tokens, inter}), view_of(up, {tokens, inter}), view_of(out, {tokens, inter}));
  EXPECT_TRUE(all_close(out, ref, kTol));
  be->silu_mul(view_of(gate, {tokens, inter}), view_of(up, {tokens, inter}), view_of(gate, {tokens, inter}));
  EXPECT_TRUE(all_close(gate, ref, kTol));
}

TEST(CpuElementwise, RopeInterleavedOnStridedHeads) {
  auto be = cpu::make_cpu_backend();
  std::mt19937 rng(7);
  // q-like buffer [T, H, d_n + d_r] = [7, 12, 24 + 8]; rope rotates the last 8 dims of every head.
  const int64_t tokens = 7, heads = 12, d_n = 24, d_r = 8, width = d_n + d_r;
  std::vector<float> q = random_floats(rng, size_t(tokens * heads * width));
  const std::vector<float> q0 = q;
  std::vector<float> inv_freq(d_r / 2);
  for (int64_t i = 0; i < d_r / 2; ++i) inv_freq[size_t(i)] = std::pow(10000.0f, -2.0f * float(i) / float(d_r)) * 0.7f;
  std::vector<int32_t> pos = {0, 1, 5, 17, 4095, 40000, 163839};
  const float factor = 1.25f;
  be->rope(strided_view(q.data() + d_n, DType::F32, {tokens, heads, d_r}, {heads * width, width, 1}), view_of(pos, {tokens}),
           ops::RopeTable{view_of(inv_freq, {d_r / 2}), factor});
  std::vector<float> got;
  std::vector<double> ref;
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      const size_t base = size_t((t * heads + h) * width);
      for (int64_t i = 0; i < d_n; ++i) ASSERT_EQ(q[base + size_t(i)], q0[base + size_t(i)]);  // nope dims untouched
      for (int64_t i = 0; i < d_r / 2; ++i) {
        // The angle is defined as an fp32 product; cos/sin of it in double.
        const float angle = float(pos[size_t(t)]) * inv_freq[size_t(i)];
        const double c = std::cos(double(angle)) * factor, s = std::sin(double(angle)) * factor;
        const double x0 = q0[base + size_t(d_n + 2 * i)], x1 = q0[base + size_t(d_n + 2 * i + 1)];
        got.push_back(q[base + size_t(d_n + 2 * i)]);
        got.push_back(q[base + size_t(d_n + 2 * i + 1)]);
        ref.push_back(x0 * c - x1 * s);
        ref.push_back(x1 * c + x0 * s);
      }
    }
  EXPECT_TRUE(all_close(got, ref, kTol));
}

TEST(CpuElementwiseDeathTest, RejectsOutOfRangeIds) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto be = cpu::make_cpu_backend();
  std::vector<float> table(4 * 3, 1.0f), out(2 * 3);
  std::vector<int32_t> ids = {1, 4};
  EXPECT_DEATH(be->embedding(view_of(ids, {2}), view_of(table, {4, 3}), view_of(out, {2, 3})), "embedding id 4");
  ids = {-1, 0};
  EXPECT_DEATH(be->embedding(view_of(ids, {2}), view_of(table, {4, 3}), view_of(out, {2, 3})), "embedding id -1");
}

}  // namespace
}  // namespace mla::test
