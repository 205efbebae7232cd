// Shared scaffolding of the CPU backend tests (and, through tests/gpu/parity.h, the GPU parity tests):
// random inputs, NaN poisoning, element-wise comparison against double-precision references, quantized
// weight builders that follow the packing rules of ops/weight.h independently (only dequantize_rows and
// the scalar dtype conversions are shared), and the paged block tables of an attention step.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "ops/backend.h"
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

// ---- paged attention steps ----------------------------------------------------------------------

// One sequence of an attention step: q_len new tokens at the end of kv_len cached ones (q_len <= kv_len).
struct SeqSpec {
  int32_t q_len, kv_len;
};

// The block tables of one attention step, on the host: query rows in sequence order; block ids
// shuffled over num_blocks, so no table is contiguous; every other sequence owns one spare block past
// its need (tables may be longer than kv_len); `unowned_blocks` blocks belong to nobody; slot_mapping
// holds the new tokens' slots.
struct PagedLayout {
  std::vector<SeqSpec> seqs;
  int32_t block_size = 0;
  int64_t tokens = 0, num_blocks = 0;
  std::vector<int32_t> q_indptr{0}, kv_lens, block_indptr{0}, block_ids, slot_mapping;

  int64_t slot_of(size_t s, int64_t pos) const {
    return int64_t(block_ids[size_t(block_indptr[s] + pos / block_size)]) * block_size + pos % block_size;
  }
};

// Draws only the shuffle from `rng`.
inline PagedLayout make_paged_layout(std::mt19937& rng, std::vector<SeqSpec> seqs, int32_t block_size,
                                     int32_t unowned_blocks) {
  PagedLayout l;
  l.seqs = std::move(seqs);
  l.block_size = block_size;
  for (size_t s = 0; s < l.seqs.size(); ++s) {
    l.q_indptr.push_back(l.q_indptr.back() + l.seqs[s].q_len);
    l.kv_lens.push_back(l.seqs[s].kv_len);
    l.block_indptr.push_back(l.block_indptr.back() + (l.seqs[s].kv_len + block_size - 1) / block_size +
                             int32_t(s % 2));
  }
  l.tokens = l.q_indptr.back();
  l.num_blocks = l.block_indptr.back() + unowned_blocks;
  std::vector<int32_t> perm(static_cast<size_t>(l.num_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  l.block_ids.assign(perm.begin(), perm.begin() + l.block_indptr.back());
  for (size_t s = 0; s < l.seqs.size(); ++s)
    for (int64_t p = l.seqs[s].kv_len - l.seqs[s].q_len; p < l.seqs[s].kv_len; ++p)
      l.slot_mapping.push_back(int32_t(l.slot_of(s, p)));
  return l;
}

// Views of a layout's arrays on the backend that reads them.
struct LayoutViews {
  TensorView q_indptr, kv_lens, block_indptr, block_ids, slot_mapping;
};

// The AttentionBatch of `l` over `v`. Its host mirrors are spans of l's vectors: `l` may be moved
// (vectors keep their storage) but not copied or changed in size while the batch is in use.
inline ops::AttentionBatch attention_batch(const PagedLayout& l, const LayoutViews& v) {
  return ops::AttentionBatch{.num_seqs = int(l.seqs.size()), .block_size = l.block_size, .q_indptr = v.q_indptr,
                             .kv_lens = v.kv_lens, .block_indptr = v.block_indptr, .block_ids = v.block_ids,
                             .slot_mapping = v.slot_mapping, .host_q_indptr = l.q_indptr, .host_kv_lens = l.kv_lens,
                             .host_block_indptr = l.block_indptr, .host_block_ids = l.block_ids};
}

// A host F32 paged cache of `row_width` floats per slot over a layout, and the batch that views the
// layout's own vectors (what the CPU backend reads). Each sequence's first kv_len - q_len positions
// hold random rows in [-1, 1); every other slot is NaN, so a read past kv_len or into another
// sequence's blocks shows. Move-only: `batch` points into this object's vectors.
struct PagedCache : PagedLayout {
  int64_t row_width = 0;
  std::vector<float> cache;  // [num_blocks, block_size, row_width]
  ops::AttentionBatch batch;

  PagedCache() = default;
  PagedCache(PagedCache&&) = default;
  PagedCache& operator=(PagedCache&&) = default;

  const float* row(size_t s, int64_t pos) const { return cache.data() + slot_of(s, pos) * row_width; }
  TensorView cache_view() { return view_of(cache, {num_blocks, block_size, row_width}); }
};

inline PagedCache make_paged_cache(std::mt19937& rng, int64_t row_width, std::vector<SeqSpec> seqs,
                                   int32_t block_size, int32_t unowned_blocks) {
  PagedCache c;
  static_cast<PagedLayout&>(c) = make_paged_layout(rng, std::move(seqs), block_size, unowned_blocks);
  c.row_width = row_width;
  c.cache = nan_filled(size_t(c.num_blocks * block_size * row_width));
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (size_t s = 0; s < c.seqs.size(); ++s)
    for (int64_t p = 0; p < c.seqs[s].kv_len - c.seqs[s].q_len; ++p)
      for (int64_t i = 0; i < row_width; ++i) c.cache[size_t(c.slot_of(s, p) * row_width + i)] = dist(rng);
  const int64_t n = int64_t(c.seqs.size());
  c.batch = attention_batch(c, {view_of(c.q_indptr, {n + 1}), view_of(c.kv_lens, {n}), view_of(c.block_indptr, {n + 1}),
                                view_of(c.block_ids, {int64_t(c.block_ids.size())}),
                                view_of(c.slot_mapping, {c.tokens})});
  return c;
}

}  // namespace mla::test
