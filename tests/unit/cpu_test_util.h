// Shared scaffolding of the CPU backend tests: random inputs, NaN poisoning, element-wise comparison
// against double-precision references, and quantized weight builders that follow the packing rules of
// ops/weight.h independently (only dequantize_rows and the scalar dtype conversions are shared).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "ops/weight.h"

namespace mla::test {

inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// n floats uniform in [lo, hi).
inline std::vector<float> random_floats(std::mt19937& rng, size_t n, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

inline std::vector<float> nan_filled(size_t n) { return std::vector<float>(n, kNaN); }

// Checks every element: finite, and |got - ref| <= tol * (1 + scale) where scale = |ref| unless a
// per-element scale (e.g. sum |x_i w_i| of a dot product, its condition) is given.
inline ::testing::AssertionResult all_close(const std::vector<float>& got, const std::vector<double>& ref, double tol,
                                            const std::vector<double>* scale = nullptr) {
  if (got.size() != ref.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << ref.size();
  size_t bad = 0, first = 0;
  double worst = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double s = scale ? (*scale)[i] : std::fabs(ref[i]);
    const double err = std::fabs(double(got[i]) - ref[i]);
    const bool ok = std::isfinite(got[i]) && err <= tol * (1.0 + s);
    if (!ok && bad++ == 0) first = i;
    if (std::isfinite(got[i])) worst = std::max(worst, err / (1.0 + s));
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << got.size() << " elements off; first at " << first
                                       << ": got " << got[first] << " want " << ref[first] << " (tol " << tol
                                       << ", worst scaled error " << worst << ")";
}

// A weight with the storage it views.
struct TestWeight {
  std::vector<uint32_t> data;   // raw bytes of `w.data`, 4-byte aligned
  std::vector<uint32_t> scale;  // raw bytes of `w.scale`
  ops::Weight w;

  TestWeight() = default;
  TestWeight(const TestWeight&) = delete;
  TestWeight& operator=(const TestWeight&) = delete;
};

inline void* alloc_words(std::vector<uint32_t>& v, size_t bytes) {
  v.assign((bytes + 3) / 4, 0u);
  return v.data();
}

// Dense [out, in] weight of `dtype` (F32, BF16 or F16) from random floats in [-amp, amp).
inline void make_dense(TestWeight& tw, std::mt19937& rng, int64_t out, int64_t in, DType dtype, float amp = 0.5f) {
  const std::vector<float> w = random_floats(rng, size_t(out * in), -amp, amp);
  void* p = alloc_words(tw.data, size_t(out * in) * dtype_size(dtype));
  for (size_t i = 0; i < w.size(); ++i) {
    if (dtype == DType::F32) static_cast<float*>(p)[i] = w[i];
    else if (dtype == DType::BF16) static_cast<uint16_t*>(p)[i] = f32_to_bf16(w[i]);
    else static_cast<uint16_t*>(p)[i] = f32_to_f16(w[i]);
  }
  tw.w = ops::Weight{ops::WeightFormat::Dense, out, in, TensorView::contiguous(p, dtype, {out, in}), {}};
}

// DeepSeek FP8 block quantization of random floats: per 128x128 block, scale = amax / 448 and
// q = fp8(w / scale). Returns the original floats (for a round-trip sanity check).
inline std::vector<float> make_fp8(TestWeight& tw, std::mt19937& rng, int64_t out, int64_t in, float amp = 0.5f) {
  const std::vector<float> w = random_floats(rng, size_t(out * in), -amp, amp);
  const int64_t sr = (out + 127) / 128, sc = (in + 127) / 128;
  auto* q = static_cast<uint8_t*>(alloc_words(tw.data, size_t(out * in)));
  auto* s = static_cast<float*>(alloc_words(tw.scale, size_t(sr * sc) * 4));
  for (int64_t br = 0; br < sr; ++br)
    for (int64_t bc = 0; bc < sc; ++bc) {
      float amax = 0.0f;
      for (int64_t o = br * 128; o < std::min(out, br * 128 + 128); ++o)
        for (int64_t i = bc * 128; i < std::min(in, bc * 128 + 128); ++i) amax = std::max(amax, std::fabs(w[size_t(o * in + i)]));
      const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
      s[br * sc + bc] = scale;
      for (int64_t o = br * 128; o < std::min(out, br * 128 + 128); ++o)
        for (int64_t i = bc * 128; i < std::min(in, bc * 128 + 128); ++i)
          q[o * in + i] = f32_to_fp8e4m3(w[size_t(o * in + i)] / scale);
    }
  tw.w = ops::Weight{ops::WeightFormat::Fp8Block128, out, in, TensorView::contiguous(q, DType::F8_E4M3, {out, in}),
                     TensorView::contiguous(s, DType::F32, {sr, sc})};
  return w;
}

// compressed-tensors int4 group-32 symmetric quantization of random floats: per row and 32-column
// group, scale = amax / 7, q = clamp(round(w / scale), -8, 7); element 8c+j of a row is nibble
// (q + 8) at bits [4j, 4j+4) of word c. Scales stored as `scale_dtype` (BF16 or F32).
inline std::vector<float> make_int4(TestWeight& tw, std::mt19937& rng, int64_t out, int64_t in, DType scale_dtype,
                                    float amp = 0.5f) {
  const std::vector<float> w = random_floats(rng, size_t(out * in), -amp, amp);
  const int64_t words = (in + 7) / 8, groups = (in + 31) / 32;
  uint32_t* packed = static_cast<uint32_t*>(alloc_words(tw.data, size_t(out * words) * 4));
  void* s = alloc_words(tw.scale, size_t(out * groups) * dtype_size(scale_dtype));
  for (int64_t o = 0; o < out; ++o)
    for (int64_t g = 0; g < groups; ++g) {
      float amax = 0.0f;
      for (int64_t i = g * 32; i < std::min(in, g * 32 + 32); ++i) amax = std::max(amax, std::fabs(w[size_t(o * in + i)]));
      float scale = amax > 0.0f ? amax / 7.0f : 1.0f;
      if (scale_dtype == DType::BF16) {
        static_cast<uint16_t*>(s)[o * groups + g] = f32_to_bf16(scale);
        scale = bf16_to_f32(f32_to_bf16(scale));
      } else {
        static_cast<float*>(s)[o * groups + g] = scale;
      }
      for (int64_t i = g * 32; i < std::min(in, g * 32 + 32); ++i) {
        const int q = std::clamp(int(std::lround(w[size_t(o * in + i)] / scale)), -8, 7);
        packed[o * words + i / 8] |= uint32_t(q + 8) << (4 * (i % 8));
      }
    }
  tw.w = ops::Weight{ops::WeightFormat::Int4Group32, out, in, TensorView::contiguous(packed, DType::I32, {out, words}),
                     TensorView::contiguous(s, scale_dtype, {out, groups})};
  return w;
}

// The whole weight in double, through the reference dequantizer.
inline std::vector<double> dequantized(const ops::Weight& w) {
  std::vector<float> f(size_t(w.out_features * w.in_features));
  ops::dequantize_rows(w, 0, w.out_features, f.data());
  return std::vector<double>(f.begin(), f.end());
}

// A view with explicit strides (in elements), for strided-input cases.
inline TensorView strided_view(void* p, DType dtype, std::initializer_list<int64_t> dims,
                               std::initializer_list<int64_t> strides) {
  TensorView v;
  v.data = p;
  v.dtype = dtype;
  v.ndim = int(dims.size());
  std::copy(dims.begin(), dims.end(), v.shape.begin());
  std::copy(strides.begin(), strides.end(), v.stride.begin());
  return v;
}

inline TensorView view_of(std::vector<float>& v, std::initializer_list<int64_t> dims) {
  return TensorView::contiguous(v.data(), DType::F32, dims);
}
inline TensorView view_of(std::vector<int32_t>& v, std::initializer_list<int64_t> dims) {
  return TensorView::contiguous(v.data(), DType::I32, dims);
}

}  // namespace mla::test
