// CPU reference for the sampling ops (flashinfer semantics, MODELS.md section 6): softmax with
// temperature, top-k / top-p / min-p renormalization, inverse-CDF sampling and argmax. Sums that decide
// which tokens survive are taken in double, so the kept set is exact for hand-checkable inputs; the
// cost (a sort or selection per row) is irrelevant next to the lm_head GEMM.
#include <algorithm>
#include <cmath>
#include <functional>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_util.h"

namespace mla::cpu {

namespace {

// probs/out F32 [B, V] and a per-row parameter vector [B] of `param_dtype`.
void check_renorm(const TensorView& probs, const TensorView& param, DType param_dtype, const TensorView& out,
                  const char* what) {
  check_view(probs, DType::F32, 2, what);
  check_view(out, DType::F32, 2, what);
  MLA_CHECK(same_shape(probs, out), "{}: probs {} out {}", what, probs.describe(), out.describe());
  check_vector(param, param_dtype, probs.dim(0), what);
}

// out = in where in >= threshold, else 0, then divided by the kept sum (in may alias out).
void keep_at_least(const float* in, int64_t vocab, float threshold, float* out) {
  double kept = 0.0;
  for (int64_t i = 0; i < vocab; ++i)
    if (in[i] >= threshold) kept += in[i];
  MLA_CHECK(kept > 0.0, "renorm: nothing left to keep (threshold {})", threshold);
  for (int64_t i = 0; i < vocab; ++i) out[i] = in[i] >= threshold ? float(double(in[i]) / kept) : 0.0f;
}

// Copies a row unchanged (the "disabled" setting of each filter).
void copy_row(const float* in, int64_t vocab, float* out) {
  if (in != out) std::copy_n(in, vocab, out);
}

}  // namespace

void CpuBackend::softmax(const TensorView& logits, const TensorView& temperature, const TensorView& probs) {
  check_view(logits, DType::F32, 2, "softmax logits");
  check_view(probs, DType::F32, 2, "softmax probs");
  MLA_CHECK(same_shape(logits, probs), "softmax: logits {} probs {}", logits.describe(), probs.describe());
  const int64_t rows = logits.dim(0), vocab = logits.dim(1);
  check_vector(temperature, DType::F32, rows, "softmax temperature");
  for (int64_t b = 0; b < rows; ++b) {
    const float temp = f32_at(temperature, b);
    MLA_CHECK(temp > 0.0f, "softmax: temperature {} of row {} is not > 0", temp, b);
    const float* z = logits.at<const float>(b);
    float* p = probs.at<float>(b);
    float max_z = -INFINITY;
    for (int64_t i = 0; i < vocab; ++i) max_z = std::max(max_z, z[i] / temp);
    double sum = 0.0;
    for (int64_t i = 0; i < vocab; ++i) {  // elementwise, so probs may alias logits
      p[i] = std::exp(z[i] / temp - max_z);
      sum += p[i];
    }
    for (int64_t i = 0; i < vocab; ++i) p[i] = float(double(p[i]) / sum);
  }
}

void CpuBackend::top_k_renorm_prob(const TensorView& probs, const TensorView& top_k, const TensorView& out) {
  check_renorm(probs, top_k, DType::I32, out, "top_k_renorm_prob");
  const int64_t rows = probs.dim(0), vocab = probs.dim(1);
  float* sorted = grow(sort_scratch_, size_t(vocab));
  for (int64_t b = 0; b < rows; ++b) {
    const float* p = probs.at<const float>(b);
    const int32_t k = i32_at(top_k, b);
    if (k <= 0 || k >= vocab) {
      copy_row(p, vocab, out.at<float>(b));
      continue;
    }
    // pivot = the k-th largest value; every p >= pivot is kept, so ties at the pivot all survive.
    std::copy_n(p, vocab, sorted);
    std::nth_element(sorted, sorted + (k - 1), sorted + vocab, std::greater<float>());
    keep_at_least(p, vocab, sorted[k - 1], out.at<float>(b));
  }
}

void CpuBackend::top_p_renorm_prob(const TensorView& probs, const TensorView& top_p, const TensorView& out) {
  check_renorm(probs, top_p, DType::F32, out, "top_p_renorm_prob");
  const int64_t rows = probs.dim(0), vocab = probs.dim(1);
  float* sorted = grow(sort_scratch_, size_t(vocab));
  for (int64_t b = 0; b < rows; ++b) {
    const float* p = probs.at<const float>(b);
    const float top = f32_at(top_p, b);
    MLA_CHECK(top > 0.0f && top <= 1.0f, "top_p_renorm_prob: top_p {} of row {} outside (0, 1]", top, b);
    if (top >= 1.0f) {
      copy_row(p, vocab, out.at<float>(b));
      continue;
    }
    // Smallest descending prefix whose sum reaches top_p; its last value is the boundary, and every
    // token with a value >= the boundary is kept (ties at the boundary stay together). If the whole
    // row sums to less than top_p (rounding), every token is kept.
    std::copy_n(p, vocab, sorted);
    std::sort(sorted, sorted + vocab, std::greater<float>());
    double cumsum = 0.0;
    float boundary = sorted[vocab - 1];
    for (int64_t i = 0; i < vocab; ++i) {
      cumsum += sorted[i];
      if (cumsum >= double(top)) {
        boundary = sorted[i];
        break;
      }
    }
    keep_at_least(p, vocab, boundary, out.at<float>(b));
  }
}

void CpuBackend::min_p_renorm_prob(const TensorView& probs, const TensorView& min_p, const TensorView& out) {
  check_renorm(probs, min_p, DType::F32, out, "min_p_renorm_prob");
  const int64_t rows = probs.dim(0), vocab = probs.dim(1);
  for (int64_t b = 0; b < rows; ++b) {
    const float* p = probs.at<const float>(b);
    const float mp = f32_at(min_p, b);
    MLA_CHECK(mp >= 0.0f && mp <= 1.0f, "min_p_renorm_prob: min_p {} of row {} outside [0, 1]", mp, b);
    if (mp == 0.0f) {
      copy_row(p, vocab, out.at<float>(b));
      continue;
    }
    const float max_p = *std::max_element(p, p + vocab);
    keep_at_least(p, vocab, mp * max_p, out.at<float>(b));
  }
}

void CpuBackend::sample_from_probs(const TensorView& probs, const TensorView& uniforms, const TensorView& out_ids) {
  check_view(probs, DType::F32, 2, "sample_from_probs probs");
  const int64_t rows = probs.dim(0), vocab = probs.dim(1);
  check_vector(uniforms, DType::F32, rows, "sample_from_probs uniforms");
  check_vector(out_ids, DType::I32, rows, "sample_from_probs out_ids");
  for (int64_t b = 0; b < rows; ++b) {
    const float* p = probs.at<const float>(b);
    const float u = f32_at(uniforms, b);
    MLA_CHECK(u >= 0.0f && u < 1.0f, "sample_from_probs: uniform {} of row {} outside [0, 1)", u, b);
    // The rule shared with speculative_verify (cpu_util.h): lowest i whose cumsum exceeds u * sum.
    const int64_t chosen = inverse_cdf_pick(vocab, u, [&](int64_t i) { return p[i]; }, "sample_from_probs");
    MLA_CHECK(chosen >= 0, "sample_from_probs: row {} has no positive probability", b);
    *out_ids.at<int32_t>(b) = int32_t(chosen);
  }
}

void CpuBackend::argmax(const TensorView& logits, const TensorView& out_ids) {
  check_view(logits, DType::F32, 2, "argmax logits");
  const int64_t rows = logits.dim(0), vocab = logits.dim(1);
  MLA_CHECK(vocab > 0, "argmax: empty rows");
  check_vector(out_ids, DType::I32, rows, "argmax out_ids");
  for (int64_t b = 0; b < rows; ++b) {
    const float* z = logits.at<const float>(b);
    int64_t best = 0;
    for (int64_t i = 1; i < vocab; ++i)
      if (z[i] > z[best]) best = i;  // strict '>': the lowest index wins ties
    *out_ids.at<int32_t>(b) = int32_t(best);
  }
}

}  // namespace mla::cpu
