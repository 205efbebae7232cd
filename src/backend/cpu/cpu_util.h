// Internal helpers of the CPU backend: argument checks shared by every op and the grow-once scratch
// rule. Checks are MLA_CHECK (a bad shape or id is a caller bug, never untrusted input).
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace mla::ops {
struct AttentionBatch;
}

namespace mla::cpu {

// The AttentionBatch rules every paged-attention op checks (host mirrors are authoritative): mirror
// sizes, q_indptr covering num_tokens rows, kv_len >= q_len, block tables covering kv_len with ids
// inside the cache's [num_blocks, block_size, *]. Errors start with `op`. (cpu_mla.cpp)
void check_attention_batch(const TensorView& cache, const ops::AttentionBatch& batch, int64_t num_tokens,
                           const char* op);

// Grows `v` to at least `n` elements and never shrinks it: after the first call at the largest size,
// no op allocates again (STYLE 5).
template <typename T> T* grow(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

// A view of `dtype` and rank `ndim` whose last dim is contiguous (rows may be strided).
inline void check_view(const TensorView& v, DType dtype, int ndim, const char* what) {
  MLA_CHECK(v.data != nullptr || v.numel() == 0, "{}: null data", what);
  MLA_CHECK(v.dtype == dtype, "{}: dtype {} (want {})", what, v.describe(), dtype_name(dtype));
  MLA_CHECK(v.ndim == ndim, "{}: {} has rank {} (want {})", what, v.describe(), v.ndim, ndim);
  MLA_CHECK(v.inner_contiguous(), "{}: last dim of {} is strided", what, v.describe());
}

// An I32 or F32 vector [n] (contiguous or not).
inline void check_vector(const TensorView& v, DType dtype, int64_t n, const char* what) {
  MLA_CHECK(v.dtype == dtype && v.ndim == 1 && v.dim(0) == n, "{}: {} (want {}[{}])", what, v.describe(),
            dtype_name(dtype), n);
  MLA_CHECK(v.data != nullptr || n == 0, "{}: null data", what);
}

// Element i of a 1-D I32 view.
inline int32_t i32_at(const TensorView& v, int64_t i) { return *v.at<const int32_t>(i); }
// Element i of a 1-D F32 view.
inline float f32_at(const TensorView& v, int64_t i) { return *v.at<const float>(i); }

// Element i of a 1-D BF16 or F32 view (norm weights, embedding rows).
inline float load_bf16_or_f32(const TensorView& v, int64_t i) {
  return v.dtype == DType::F32 ? *v.at<const float>(i) : bf16_to_f32(*v.at<const uint16_t>(i));
}

// fp32 dot product with 16 interleaved partial sums (lane k sums the terms i = k mod 16), added
// pairwise at the end. The independent sums let the compiler use several vector accumulators, so
// the loop is not bound by one add's latency; the summation order is fixed, hence deterministic.
inline float dot(const float* a, const float* b, int64_t n) {
  constexpr int kLanes = 16;
  float lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int k = 0; k < kLanes; ++k) lane[k] += a[i + k] * b[i + k];
  for (int k = 0; i + k < n; ++k) lane[k] += a[i + k] * b[i + k];
  for (int width = kLanes / 2; width > 0; width /= 2)
    for (int k = 0; k < width; ++k) lane[k] += lane[k + width];
  return lane[0];
}

// The inverse-CDF rule shared by sample_from_probs and speculative_verify's extra token (the GPU
// kernels mirror it): over the non-negative weights w(0..vocab) (need not sum to 1), the lowest i whose
// running sum (double, ascending i) exceeds u * total. Strict '>' means the sum must step past the
// target at i, so w(i) > 0: a target on a boundary goes to the next positive weight, a rounding
// shortfall at the end to the last positive one. Returns -1 when no weight is positive.
// Precondition: u in [0, 1). `what` names the op in the negative-weight check.
template <typename WeightAt> int64_t inverse_cdf_pick(int64_t vocab, float u, WeightAt&& w, const char* what) {
  double sum = 0.0;
  int64_t last_positive = -1;
  for (int64_t i = 0; i < vocab; ++i) {
    const float v = w(i);
    MLA_CHECK(v >= 0.0f, "{}: negative probability {} at index {}", what, v, i);
    sum += v;
    if (v > 0.0f) last_positive = i;
  }
  if (last_positive < 0) return -1;
  const double target = double(u) * sum;
  double cumsum = 0.0;
  for (int64_t i = 0; i < vocab; ++i) {
    cumsum += w(i);
    if (cumsum > target) return i;
  }
  return last_positive;
}

// y[i] += a * x[i] (no reduction, so any vectorization the compiler does is bit-identical).
inline void axpy(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

}  // namespace mla::cpu
