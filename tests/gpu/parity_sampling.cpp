// Parity of the GPU sampling ops (gpu_sampling.cu) with the CPU reference: softmax, top-k / top-p /
// min-p renormalization, inverse-CDF sampling and argmax, for V = 1, 5, 1000 and the Kimi vocabulary
// 163840, several rows with different parameters each (including the "disabled" settings), ties at
// the pivot, strided rows and out == probs. Kept sets must match exactly; values within fp32 rounding.
#include <algorithm>
#include <array>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "gpu/parity.h"

namespace mla::test {
namespace {

const int64_t kVocabs[] = {1, 5, 1000, 163840};

// Writes row-major `values` into the view of `t` (host side) and copies the whole buffer to the
// device; bytes outside the view keep their poison.
void fill_view(const Twin& t, const std::vector<float>& values) {
  const TensorView& v = t.cpu;
  MLA_CHECK(int64_t(values.size()) == v.numel(), "fill_view: {} values for {}", values.size(), v.describe());
  size_t k = 0;
  for (int64_t r = 0; r < v.dim(0); ++r)
    for (int64_t i = 0; i < v.dim(1); ++i) *v.at<float>(r, i) = values[k++];
  sync_to_device(t);
}

// `rows` probability rows of length `vocab`: softmax of logits uniform in [-spread, spread] (so values
// span many binades, like real distributions), normalized in double.
std::vector<float> prob_rows(std::mt19937& rng, int64_t rows, int64_t vocab, float spread = 8.0f) {
  std::vector<float> out;
  std::uniform_real_distribution<float> dist(-spread, spread);
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<double> e(static_cast<size_t>(vocab));
    double sum = 0;
    for (double& x : e) sum += (x = std::exp(double(dist(rng))));
    for (double x : e) out.push_back(float(x / sum));
  }
  return out;
}

// Rows with many exact ties: values from {1, 2, 3, 4} / sum.
std::vector<float> tied_rows(std::mt19937& rng, int64_t rows, int64_t vocab) {
  std::vector<float> out;
  std::uniform_int_distribution<int> dist(1, 4);
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<int> v(static_cast<size_t>(vocab));
    double sum = 0;
    for (int& x : v) sum += (x = dist(rng));
    for (int x : v) out.push_back(float(double(x) / sum));
  }
  return out;
}

// Probability rows in three layouts: contiguous input with a separate output, strided rows (column
// slices of wider buffers), and out == probs.
enum class Layout { Separate, Strided, InPlace };
const char* layout_name(Layout l) {
  return l == Layout::Separate ? "" : l == Layout::Strided ? " strided" : " out==probs";
}
struct RowsIo {
  Twin in, out;
};
RowsIo make_rows(const std::vector<float>& values, int64_t rows, int64_t vocab, Layout layout) {
  RowsIo io;
  if (layout == Layout::Strided) {
    io.in = twin_output(DType::F32, {rows, vocab + 5}).slice(1, 3, vocab);
    io.out = twin_output(DType::F32, {rows, vocab + 2}).slice(1, 1, vocab);
  } else {
    io.in = twin_output(DType::F32, {rows, vocab});
    io.out = layout == Layout::InPlace ? io.in : twin_output(DType::F32, {rows, vocab});
  }
  fill_view(io.in, values);
  return io;
}

// Renormalized outputs: the kept set must match exactly (a missing or extra entry is off by the
// entry itself, >> atol); kept values differ by fp32 rounding of p / kept (double) plus the order of
// the double kept-sum.
const Tolerance kRenorm{1e-12, 1e-5, "exact kept set; p/kept in double, rounded to fp32"};

TEST(GpuParitySampling, Softmax) {
  std::mt19937 rng(201);
  const Tolerance tol{1e-12, 2e-6, "CUDA expf <= 2 ulp vs glibc; sum in double"};
  for (int64_t vocab : kVocabs) {
    for (Layout layout : {Layout::Separate, Layout::Strided, Layout::InPlace}) {
      const int64_t rows = 3;
      RowsIo io = make_rows(random_floats(rng, size_t(rows * vocab), -10.0f, 10.0f), rows, vocab, layout);
      Twin temp = twin_from_floats({0.5f, 1.0f, 1.7f}, {rows});
      run_both([&](ops::Backend& be, bool g) { be.softmax(pick(io.in, g), pick(temp, g), pick(io.out, g)); });
      EXPECT_TRUE(check_parity("softmax", fmt::format("B=3 V={}{}", vocab, layout_name(layout)), io.out, tol));
    }
  }
}

TEST(GpuParitySampling, TopK) {
  std::mt19937 rng(202);
  for (int64_t vocab : kVocabs) {
    const int32_t v = int32_t(vocab);
    const std::vector<int32_t> ks = {0, 1, 7, v, v + 3, -2};
    const int64_t rows = int64_t(ks.size());
    Twin top_k = twin_from_ints(ks, {rows});
    for (Layout layout : {Layout::Separate, Layout::Strided, Layout::InPlace}) {
      RowsIo io = make_rows(prob_rows(rng, rows, vocab), rows, vocab, layout);
      run_both([&](ops::Backend& be, bool g) { be.top_k_renorm_prob(pick(io.in, g), pick(top_k, g), pick(io.out, g)); });
      EXPECT_TRUE(check_parity("top_k_renorm_prob", fmt::format("k=0,1,7,V,V+3,-2 V={}{}", vocab, layout_name(layout)),
                               io.out, kRenorm));
    }
  }
}

TEST(GpuParitySampling, TopKTiesAtPivot) {
  std::mt19937 rng(203);
  for (int64_t vocab : {int64_t(5), int64_t(1000), int64_t(163840)}) {
    const std::vector<int32_t> ks = {1, 2, 7, int32_t(vocab / 3), int32_t(vocab) - 1};
    const int64_t rows = int64_t(ks.size());
    Twin top_k = twin_from_ints(ks, {rows});
    RowsIo io = make_rows(tied_rows(rng, rows, vocab), rows, vocab, Layout::InPlace);
    run_both([&](ops::Backend& be, bool g) { be.top_k_renorm_prob(pick(io.in, g), pick(top_k, g), pick(io.out, g)); });
    EXPECT_TRUE(check_parity("top_k_renorm_prob", fmt::format("values in {{1,2,3,4}}/sum V={}", vocab), io.out,
                             kRenorm));
  }
}

TEST(GpuParitySampling, TopP) {
  std::mt19937 rng(204);
  const std::vector<float> ps = {1.0f, 0.9f, 0.5f, 1e-6f, 0.999f};
  const int64_t rows = int64_t(ps.size());
  Twin top_p = twin_from_floats(ps, {rows});
  for (int64_t vocab : kVocabs) {
    for (Layout layout : {Layout::Separate, Layout::Strided, Layout::InPlace}) {
      RowsIo io = make_rows(prob_rows(rng, rows, vocab), rows, vocab, layout);
      run_both([&](ops::Backend& be, bool g) { be.top_p_renorm_prob(pick(io.in, g), pick(top_p, g), pick(io.out, g)); });
      EXPECT_TRUE(check_parity("top_p_renorm_prob",
                               fmt::format("p=1,.9,.5,1e-6,.999 V={}{}", vocab, layout_name(layout)), io.out, kRenorm));
    }
  }
  for (int64_t vocab : {int64_t(5), int64_t(1000), int64_t(163840)}) {  // ties at the boundary
    RowsIo io = make_rows(tied_rows(rng, rows, vocab), rows, vocab, Layout::Separate);
    run_both([&](ops::Backend& be, bool g) { be.top_p_renorm_prob(pick(io.in, g), pick(top_p, g), pick(io.out, g)); });
    EXPECT_TRUE(check_parity("top_p_renorm_prob", fmt::format("values in {{1,2,3,4}}/sum V={}", vocab), io.out,
                             kRenorm));
  }
}

TEST(GpuParitySampling, MinP) {
  std::mt19937 rng(205);
  const std::vector<float> mps = {0.0f, 0.1f, 0.9f, 1.0f};
  const int64_t rows = int64_t(mps.size());
  Twin min_p = twin_from_floats(mps, {rows});
  for (int64_t vocab : kVocabs) {
    for (Layout layout : {Layout::Separate, Layout::Strided, Layout::InPlace}) {
      RowsIo io = make_rows(prob_rows(rng, rows, vocab, 4.0f), rows, vocab, layout);
      run_both([&](ops::Backend& be, bool g) { be.min_p_renorm_prob(pick(io.in, g), pick(min_p, g), pick(io.out, g)); });
      EXPECT_TRUE(check_parity("min_p_renorm_prob", fmt::format("min_p=0,.1,.9,1 V={}{}", vocab, layout_name(layout)),
                               io.out, kRenorm));
    }
  }
}

TEST(GpuParitySampling, SampleFromProbs) {
  std::mt19937 rng(206);
  const Tolerance exact{0, 0, "token ids: exact"};
  for (int64_t vocab : kVocabs) {
    // Rows: plain; every third entry zero (from index 1, so V = 1 keeps a nonzero); zeros except the last entry; zeros except the first;
    // unnormalized (sum 3.7); the same plain row sampled at u = 0.
    const int64_t rows = 7;
    std::vector<float> values = prob_rows(rng, rows, vocab);
    auto row = [&](int64_t r) { return values.begin() + r * vocab; };
    for (int64_t i = 1; i < vocab; i += 3) row(1)[i] = 0.0f;
    if (vocab > 1) row(1)[vocab - 1] = 0.0f;                // trailing zero: u near 1 must skip it
    for (int64_t i = 0; i + 1 < vocab; ++i) row(2)[i] = 0.0f;  // only the last entry is nonzero
    for (int64_t i = 1; i < vocab; ++i) row(3)[i] = 0.0f;      // only the first entry is nonzero
    for (int64_t i = 0; i < vocab; ++i) row(4)[i] *= 3.7f;
    for (int64_t i = 0; i < vocab / 2; ++i) row(5)[i] = 0.0f;  // leading zeros, u = 0
    std::vector<float> u = {0.999999f, 0.999999f, 0.3f, 0.999999f, 0.61803f, 0.0f, 0.0f};
    for (float& x : u)
      if (x != 0.0f && x != 0.999999f) x = std::uniform_real_distribution<float>(0.0f, 1.0f)(rng);
    for (bool strided : {false, true}) {
      Twin probs = strided ? twin_output(DType::F32, {rows, vocab + 3}).slice(1, 2, vocab)
                           : twin_output(DType::F32, {rows, vocab});
      fill_view(probs, values);
      Twin uniforms = twin_from_floats(u, {rows});
      Twin ids = twin_output(DType::I32, {rows});
      run_both([&](ops::Backend& be, bool g) { be.sample_from_probs(pick(probs, g), pick(uniforms, g), pick(ids, g)); });
      EXPECT_TRUE(check_parity("sample_from_probs", fmt::format("zeros/u=0/u=.999999 V={}{}", vocab,
                                                                strided ? " strided" : ""),
                               ids, exact));
    }
  }
  {  // many uniforms over one distribution: 256 rows, V = 1000
    const int64_t rows = 256, vocab = 1000;
    Twin probs = twin_output(DType::F32, {rows, vocab});
    fill_view(probs, prob_rows(rng, rows, vocab, 3.0f));
    Twin uniforms = twin_random(rng, DType::F32, {rows}, 0.0f, 1.0f);
    Twin ids = twin_output(DType::I32, {rows});
    run_both([&](ops::Backend& be, bool g) { be.sample_from_probs(pick(probs, g), pick(uniforms, g), pick(ids, g)); });
    EXPECT_TRUE(check_parity("sample_from_probs", "B=256 V=1000 random u", ids, exact));
  }
}

TEST(GpuParitySampling, Argmax) {
  std::mt19937 rng(207);
  const Tolerance exact{0, 0, "token ids: exact"};
  for (int64_t vocab : kVocabs) {
    const int64_t rows = 4;
    std::vector<float> values = random_floats(rng, size_t(rows * vocab), -5.0f, 5.0f);
    auto row = [&](int64_t r) { return values.begin() + r * vocab; };
    // row 1: the max appears three times (lowest index wins); row 2: all equal; row 3: all -inf.
    if (vocab >= 5) {
      const int64_t a = vocab / 2, b = vocab - 1, c = vocab / 5 + 1;
      row(1)[a] = row(1)[b] = row(1)[c] = 9.0f;
    }
    for (int64_t i = 0; i < vocab; ++i) row(2)[i] = 0.25f;
    for (int64_t i = 0; i < vocab; ++i) row(3)[i] = -INFINITY;
    for (bool strided : {false, true}) {
      Twin logits = strided ? twin_output(DType::F32, {rows, vocab + 7}).slice(1, 7, vocab)
                            : twin_output(DType::F32, {rows, vocab});
      fill_view(logits, values);
      Twin ids = twin_output(DType::I32, {rows});
      run_both([&](ops::Backend& be, bool g) { be.argmax(pick(logits, g), pick(ids, g)); });
      EXPECT_TRUE(check_parity("argmax", fmt::format("ties/all equal/-inf V={}{}", vocab, strided ? " strided" : ""),
                               ids, exact));
    }
  }
}

// argmax splits a row over blocks of 2048 entries and merges them with atomics (the last block of a
// row writes the id and resets the row's slot and ticket). The DeepSeek-V3 vocabulary at B = 1 and 3,
// ties across block boundaries (lowest index wins), a lone max in the last entry, -0 == +0 ties, NaN
// (index 0: the CPU keeps it; elsewhere: never chosen), V straddling one block, misaligned rows (the
// scalar path), and back-to-back calls (the reset must leave the next call correct).
TEST(GpuParitySampling, ArgmaxSplitRows) {
  std::mt19937 rng(208);
  const Tolerance exact{0, 0, "token ids: exact"};
  for (int64_t vocab : {int64_t(2047), int64_t(2049), int64_t(129280)}) {
    const int64_t rows = 7;
    for (int repeat = 0; repeat < 2; ++repeat) {
      std::vector<float> values = random_floats(rng, size_t(rows * vocab), -5.0f, 5.0f);
      auto row = [&](int64_t r) { return values.begin() + r * vocab; };
      const int64_t last = vocab - 1, edge = std::min<int64_t>(2048, last);
      row(1)[last] = row(1)[edge] = row(1)[edge - 1] = 7.0f;   // tie across the block boundary
      row(2)[last] = 9.0f;                                     // lone max in the last entry
      for (int64_t i = 0; i < vocab; ++i) row(3)[i] = -1.0f;   // -0 / +0 tie: the first one wins
      row(3)[last] = 0.0f;
      row(3)[edge] = -0.0f;
      row(4)[0] = NAN;                                         // NaN at 0: the CPU returns 0
      row(5)[3] = NAN;                                         // NaN elsewhere is never the max
      row(5)[last] = 8.0f;
      if (repeat == 1) row(6)[0] = 6.0f;                       // the max at index 0
      for (bool strided : {false, true}) {
        Twin logits = strided ? twin_output(DType::F32, {rows, vocab + 7}).slice(1, 7, vocab)
                              : twin_output(DType::F32, {rows, vocab});
        fill_view(logits, values);
        Twin ids = twin_output(DType::I32, {rows});
        run_both([&](ops::Backend& be, bool g) { be.argmax(pick(logits, g), pick(ids, g)); });
        EXPECT_TRUE(check_parity("argmax", fmt::format("split rows V={} call {}{}", vocab, repeat,
                                                       strided ? " strided" : ""),
                                 ids, exact));
      }
    }
  }
  // B = 1 at the DeepSeek-V3 vocabulary, three calls in a row with different winners.
  for (int64_t winner : {int64_t(0), int64_t(129279), int64_t(64000)}) {
    std::vector<float> values = random_floats(rng, 129280, -5.0f, 5.0f);
    values[size_t(winner)] = 5.5f;
    Twin logits = twin_output(DType::F32, {1, 129280});
    fill_view(logits, values);
    Twin ids = twin_output(DType::I32, {1});
    run_both([&](ops::Backend& be, bool g) { be.argmax(pick(logits, g), pick(ids, g)); });
    EXPECT_TRUE(check_parity("argmax", fmt::format("B=1 V=129280 winner {}", winner), ids, exact));
  }
}

}  // namespace
}  // namespace mla::test
