// Parity of the GPU speculative_verify (gpu_spec_verify.cu) with the CPU reference: B in {1, 3, 17},
// K in {1, 2, 4, 7}, V in {7, 1000, 32768 + 17} (straddling the 1024-thread chunking), mixed num_drafts
// including 0 and K, drafts that are argmax-of-p (mostly accepted), drawn from q (mostly rejected at
// V >= 1000) or outside both supports, rows with zeros (filtered distributions), an all-zero residual,
// and strided views. Token ids must match exactly: the accept test is the same fp32 expression on both
// sides, and the inverse-CDF draws sum in double (a uniform landing within ~1e-16 of a cumsum boundary,
// where the two summation orders could disagree, does not occur with these seeds).
#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "gpu/parity.h"

namespace mla::test {
namespace {

// Writes row-major `values` into the 3-D view of `t` (host side) and copies the whole buffer to the
// device; bytes outside the view keep their poison.
void fill3(const Twin& t, const std::vector<float>& values) {
  const TensorView& v = t.cpu;
  MLA_CHECK(int64_t(values.size()) == v.numel(), "fill3: {} values for {}", values.size(), v.describe());
  size_t n = 0;
  for (int64_t a = 0; a < v.dim(0); ++a)
    for (int64_t b = 0; b < v.dim(1); ++b)
      for (int64_t c = 0; c < v.dim(2); ++c) *v.at<float>(a, b, c) = values[n++];
  sync_to_device(t);
}

template <typename T> void fill2(const Twin& t, const std::vector<T>& values) {
  const TensorView& v = t.cpu;
  MLA_CHECK(int64_t(values.size()) == v.numel(), "fill2: {} values for {}", values.size(), v.describe());
  size_t n = 0;
  for (int64_t a = 0; a < v.dim(0); ++a)
    for (int64_t b = 0; b < v.dim(1); ++b) *v.at<T>(a, b) = values[n++];
  sync_to_device(t);
}

// A probability row: softmax of logits uniform in [-4, 4]; when `filtered`, about half the entries
// (never the maximum) are zeroed first, like a top-k / top-p survivor set. Normalized in double.
std::vector<float> prob_row(std::mt19937& rng, int64_t vocab, bool filtered) {
  std::uniform_real_distribution<float> logit(-4.0f, 4.0f);
  std::vector<double> e(static_cast<size_t>(vocab));
  for (double& x : e) x = std::exp(double(logit(rng)));
  if (filtered) {
    const size_t top = size_t(std::max_element(e.begin(), e.end()) - e.begin());
    for (size_t i = 0; i < e.size(); ++i)
      if (i != top && (rng() & 1u)) e[i] = 0.0;
  }
  double sum = 0.0;
  for (double x : e) sum += x;
  std::vector<float> out;
  for (double x : e) out.push_back(float(x / sum));
  return out;
}

int32_t host_sample(const float* w, int64_t vocab, float u) {
  double sum = 0.0;
  for (int64_t i = 0; i < vocab; ++i) sum += w[i];
  double cumsum = 0.0;
  for (int64_t i = 0; i < vocab; ++i)
    if ((cumsum += w[i]) > double(u) * sum) return int32_t(i);
  return int32_t(vocab - 1);
}

struct PathCounts {
  int64_t rejected = 0, bonus = 0, no_drafts = 0, zero_residual = 0;
};

void run_case(std::mt19937& rng, int64_t rows, int64_t k, int64_t vocab, bool strided, PathCounts& paths) {
  // Inputs, row-major.
  std::vector<float> p, q;
  for (int64_t b = 0; b < rows; ++b)
    for (int64_t i = 0; i <= k; ++i) {
      const std::vector<float> r = prob_row(rng, vocab, (b + i) % 2 == 1);
      p.insert(p.end(), r.begin(), r.end());
    }
  for (int64_t b = 0; b < rows; ++b)
    for (int64_t i = 0; i < k; ++i) {
      const std::vector<float> r = prob_row(rng, vocab, (b + i) % 3 == 0);
      q.insert(q.end(), r.begin(), r.end());
    }
  auto p_row = [&](int64_t b, int64_t i) { return p.data() + (b * (k + 1) + i) * vocab; };
  auto q_row = [&](int64_t b, int64_t i) { return q.data() + (b * k + i) * vocab; };
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::vector<int32_t> drafts(static_cast<size_t>(rows * k)), n(static_cast<size_t>(rows));
  for (int64_t b = 0; b < rows; ++b) {
    n[size_t(b)] = b == 0 ? int32_t(k) : b == 1 ? 0 : int32_t(rng() % uint32_t(k + 1));
    for (int64_t i = 0; i < k; ++i) {
      const float* pr = p_row(b, i);
      int32_t d;
      switch ((b + i) % 4) {
        case 0:
        case 1: d = int32_t(std::max_element(pr, pr + vocab) - pr); break;  // argmax of p: p/q usually > 1
        case 2: d = host_sample(q_row(b, i), vocab, unit(rng)); break;    // a real draft from q
        default: {  // any token, possibly with q = 0 or p = 0 (both rows may hold zeros)
          d = int32_t(rng() % uint32_t(vocab));
        }
      }
      drafts[size_t(b * k + i)] = d;
    }
  }
  if (rows >= 3) {  // row 2: draft 0 outside p_0 == q_0's support -> rejected, residual all zero
    n[2] = std::max<int32_t>(n[2], 1);
    float* pr = p_row(2, 0);
    const int32_t d = int32_t(std::max_element(pr, pr + vocab) - pr);
    const float lost = pr[d];
    pr[d] = 0.0f;
    for (int64_t j = 0; j < vocab; ++j) pr[j] /= 1.0f - lost;
    if (vocab == 1 || std::all_of(pr, pr + vocab, [](float x) { return x == 0.0f; })) pr[(d + 1) % vocab] = 1.0f;
    std::copy(pr, pr + vocab, q_row(2, 0));
    drafts[2 * size_t(k)] = d;
  }
  std::vector<float> u(size_t(rows * (k + 1)));
  for (float& x : u) x = unit(rng);

  // Views: contiguous, or column slices of wider buffers.
  const int64_t pad = strided ? 3 : 0;
  Twin target = twin_output(DType::F32, {rows, k + 1, vocab + pad}).slice(2, pad ? 1 : 0, vocab);
  Twin draft = twin_output(DType::F32, {rows, k, vocab + pad}).slice(2, pad ? 2 : 0, vocab);
  Twin draft_ids = twin_output(DType::I32, {rows, k + pad}).slice(1, pad ? 1 : 0, k);
  Twin uniforms = twin_output(DType::F32, {rows, k + 1 + pad}).slice(1, pad, k + 1);
  Twin num_drafts = twin_from_ints(n, {rows});
  Twin ids = twin_output(DType::I32, {rows, k + 1 + pad}).slice(1, pad ? 2 : 0, k + 1);
  Twin emitted = twin_output(DType::I32, {rows});
  fill3(target, p);
  fill3(draft, q);
  fill2(draft_ids, drafts);
  fill2(uniforms, u);
  run_both([&](ops::Backend& be, bool g) {
    be.speculative_verify(pick(draft, g), pick(draft_ids, g), pick(num_drafts, g), pick(target, g), pick(uniforms, g),
                          pick(ids, g), pick(emitted, g));
  });
  const std::string name =
      fmt::format("B={} K={} V={}{}", rows, k, vocab, strided ? " strided" : "");
  // The -1 padding of out_ids is a value like any other: the I32 poison is not -1, so an unwritten
  // pad slot still fails.
  EXPECT_TRUE(check_parity("speculative_verify", name + " out_ids", ids, {0, 0, "token ids: exact"}));
  EXPECT_TRUE(check_parity("speculative_verify", name + " num_emitted", emitted, {0, 0, "counts: exact"}));

  for (int64_t b = 0; b < rows; ++b) {
    const int32_t e = *emitted.cpu.at<const int32_t>(b);
    if (n[size_t(b)] == 0) ++paths.no_drafts;
    else if (e == n[size_t(b)] + 1) ++paths.bonus;
    else ++paths.rejected;
  }
  if (rows >= 3 && *emitted.cpu.at<const int32_t>(2) == 1) ++paths.zero_residual;
}

TEST(GpuParitySpecVerify, AllShapes) {
  std::mt19937 rng(301);
  PathCounts paths;
  int c = 0;
  for (int64_t vocab : {int64_t(7), int64_t(1000), int64_t(32768 + 17)})
    for (int64_t rows : {int64_t(1), int64_t(3), int64_t(17)})
      for (int64_t k : {int64_t(1), int64_t(2), int64_t(4), int64_t(7)})
        run_case(rng, rows, k, vocab, (c++ % 2) == 1, paths);
  // Every path of the op was exercised (and so compared).
  EXPECT_GT(paths.rejected, 20);
  EXPECT_GT(paths.bonus, 20);
  EXPECT_GT(paths.no_drafts, 20);
  EXPECT_GT(paths.zero_residual, 10);
}

}  // namespace
}  // namespace mla::test
