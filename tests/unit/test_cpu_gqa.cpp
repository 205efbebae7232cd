// CPU backend GQA ops (gqa_cache_write, gqa_attention), scatter_columns and rotate_half RoPE against
// double-precision formulas: attention is held to a naive dense softmax over each row's visible
// keys. Batches mix prefill chunks and decode rows over shuffled block ids (block size 16), and every
// slot no sequence owns stays NaN, so reading past kv_len or another sequence's blocks fails.
// Tolerance: 5e-6 * (1 + |ref|) (fp32 dots of <= 128 terms, fp32 online softmax).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "backend/cpu/cpu_backend.h"
#include "unit/cpu_test_util.h"

namespace mla::test {
namespace {

constexpr double kTol = 5e-6;
constexpr int32_t kBlockSize = 16;

// A paged K/V cache (two blocks nobody owns) whose old positions hold random rows; the step's rows
// are written by the op.
PagedCache make_case(std::mt19937& rng, const ops::GqaDims& dims, std::vector<SeqSpec> seqs) {
  return make_paged_cache(rng, dims.cache_row_width(), std::move(seqs), kBlockSize, 2);
}

ops::GqaDims gqa_dims(int heads, int kv_heads, int head_dim) {
  return ops::GqaDims{heads, kv_heads, head_dim, float(1.0 / std::sqrt(double(head_dim)))};
}

// Writes the step's k, v through gqa_cache_write, then runs gqa_attention and compares with a dense
// softmax in double over each query row's visible cache positions.
void run_attention_case(const ops::GqaDims& dims, std::vector<SeqSpec> seqs, uint32_t seed) {
  auto be = cpu::make_cpu_backend();
  std::mt19937 rng(seed);
  PagedCache c = make_case(rng, dims, std::move(seqs));
  const int64_t T = c.tokens, H = dims.num_heads, KVH = dims.num_kv_heads, D = dims.head_dim, W = KVH * D;
  // k and v as column slices of one wider buffer (strided rows), as a fused projection would give.
  std::vector<float> kv = random_floats(rng, size_t(T * (2 * W + 3)));
  const TensorView k = strided_view(kv.data(), DType::F32, {T, W}, {2 * W + 3, 1});
  const TensorView v = strided_view(kv.data() + W, DType::F32, {T, W}, {2 * W + 3, 1});
  const TensorView cache = c.cache_view();
  be->gqa_cache_write(k, v, c.batch.slot_mapping, cache);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < W; ++i) {
      ASSERT_EQ(c.cache[size_t(c.slot_mapping[size_t(t)] * c.row_width + i)], kv[size_t(t * (2 * W + 3) + i)]);
      ASSERT_EQ(c.cache[size_t(c.slot_mapping[size_t(t)] * c.row_width + W + i)], kv[size_t(t * (2 * W + 3) + W + i)]);
    }
  std::vector<float> q = random_floats(rng, size_t(T * (H * D + 5)));
  std::vector<float> out = nan_filled(size_t(T * H * D));
  be->gqa_attention(strided_view(q.data(), DType::F32, {T, H * D}, {H * D + 5, 1}), cache, c.batch, dims,
                    view_of(out, {T, H * D}));

  std::vector<double> ref(out.size());
  const int64_t group = H / KVH;
  for (size_t s = 0; s < c.seqs.size(); ++s)
    for (int64_t i = 0; i < c.seqs[s].q_len; ++i) {
      const int64_t t = c.q_indptr[s] + i, visible = c.seqs[s].kv_len - c.seqs[s].q_len + i + 1;
      for (int64_t h = 0; h < H; ++h) {
        const float* qh = q.data() + t * (H * D + 5) + h * D;
        std::vector<double> score(static_cast<size_t>(visible));
        double mx = -1e300;
        for (int64_t j = 0; j < visible; ++j) {
          const float* key = c.cache.data() + c.slot_of(s, j) * c.row_width + (h / group) * D;
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += double(qh[d]) * double(key[d]);
          score[size_t(j)] = double(dims.softmax_scale) * dot;
          mx = std::max(mx, score[size_t(j)]);
        }
        double sum = 0;
        for (double& p : score) sum += (p = std::exp(p - mx));
        for (int64_t d = 0; d < D; ++d) {
          double acc = 0;
          for (int64_t j = 0; j < visible; ++j)
            acc += score[size_t(j)] * c.cache[size_t(c.slot_of(s, j) * c.row_width + W + (h / group) * D + d)];
          ref[size_t(t * H * D + h * D + d)] = acc / sum;
        }
      }
    }
  EXPECT_TRUE(all_close(out, ref, kTol)) << "H " << H << " KVH " << KVH << " D " << D;
}

TEST(CpuGqa, AttentionMatchesDenseSoftmax) {
  // Prefill chunks, decode rows, a sequence of one token and contexts crossing block edges (and one
  // long enough for several 64-key chunks).
  const std::vector<SeqSpec> seqs = {{5, 21}, {1, 40}, {17, 17}, {1, 1}, {3, 150}};
  run_attention_case(gqa_dims(1, 1, 64), seqs, 1);
  run_attention_case(gqa_dims(8, 2, 64), seqs, 2);
  run_attention_case(gqa_dims(12, 4, 128), seqs, 3);
  run_attention_case(gqa_dims(32, 8, 128), {{1, 33}, {2, 70}}, 4);
}

TEST(CpuGqa, Bf16CacheRoundsOnWriteAndAttendsExactly) {
  auto be = cpu::make_cpu_backend();
  std::mt19937 rng(5);
  const ops::GqaDims dims = gqa_dims(4, 2, 16);
  PagedCache c = make_case(rng, dims, {{3, 19}, {1, 5}});
  const int64_t T = c.tokens, W = 2 * 16, HD = 4 * 16;
  // The same cache stored as BF16 and as the F32 of those BF16 values: results must be identical.
  std::vector<uint16_t> cache16(c.cache.size());
  for (size_t i = 0; i < c.cache.size(); ++i) {
    cache16[i] = f32_to_bf16(c.cache[i]);
    c.cache[i] = bf16_to_f32(cache16[i]);
  }
  std::vector<float> k = random_floats(rng, size_t(T * W)), v = random_floats(rng, size_t(T * W));
  const TensorView c16 = TensorView::contiguous(cache16.data(), DType::BF16, {c.num_blocks, kBlockSize, 2 * W});
  const TensorView c32 = view_of(c.cache, {c.num_blocks, kBlockSize, 2 * W});
  be->gqa_cache_write(view_of(k, {T, W}), view_of(v, {T, W}), c.batch.slot_mapping, c16);
  for (float& x : k) x = bf16_to_f32(f32_to_bf16(x));
  for (float& x : v) x = bf16_to_f32(f32_to_bf16(x));
  be->gqa_cache_write(view_of(k, {T, W}), view_of(v, {T, W}), c.batch.slot_mapping, c32);
  std::vector<float> q = random_floats(rng, size_t(T * HD));
  std::vector<float> o16 = nan_filled(size_t(T * HD)), o32 = nan_filled(size_t(T * HD));
  be->gqa_attention(view_of(q, {T, HD}), c16, c.batch, dims, view_of(o16, {T, HD}));
  be->gqa_attention(view_of(q, {T, HD}), c32, c.batch, dims, view_of(o32, {T, HD}));
  for (size_t i = 0; i < o16.size(); ++i) ASSERT_EQ(o16[i], o32[i]) << i;
}

TEST(CpuGqa, ScatterColumns) {
  auto be = cpu::make_cpu_backend();
  std::mt19937 rng(6);
  const int64_t rows = 3, width = 5, vocab = 11;
  std::vector<float> src = random_floats(rng, size_t(rows * (width + 2)));
  std::vector<int32_t> index = {0, 7, 3, 10, 4};
  std::vector<float> out = nan_filled(size_t(rows * vocab));
  const float ninf = -std::numeric_limits<float>::infinity();
  be->scatter_columns(strided_view(src.data(), DType::F32, {rows, width}, {width + 2, 1}), view_of(index, {width}),
                      ninf, view_of(out, {rows, vocab}));
  for (int64_t n = 0; n < rows; ++n)
    for (int64_t col = 0; col < vocab; ++col) {
      const auto it = std::find(index.begin(), index.end(), int32_t(col));
      const float want = it == index.end() ? ninf : src[size_t(n * (width + 2) + (it - index.begin()))];
      EXPECT_EQ(out[size_t(n * vocab + col)], want) << n << "," << col;
    }
}

TEST(CpuGqaDeathTest, ScatterColumnsRejectsOutOfRangeIndex) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto be = cpu::make_cpu_backend();
  std::vector<float> src(4, 1.0f), out(8);
  std::vector<int32_t> index = {0, 1, 2, 4};
  EXPECT_DEATH(be->scatter_columns(view_of(src, {1, 4}), view_of(index, {4}), 0.0f, view_of(out, {2, 4})),
               "scatter_columns");
  index[3] = 8;
  std::vector<float> out8(8);
  EXPECT_DEATH(be->scatter_columns(view_of(src, {1, 4}), view_of(index, {4}), 0.0f, view_of(out8, {1, 8})),
               "outside");
}

TEST(CpuElementwise, RopeRotateHalfOnStridedHeads) {
  auto be = cpu::make_cpu_backend();
  std::mt19937 rng(8);
  // [T, H, D + 4] buffer, rope over the first D of each head (heads strided by D + 4).
  const int64_t tokens = 5, heads = 3, dim = 16, width = dim + 4, half = dim / 2;
  std::vector<float> x = random_floats(rng, size_t(tokens * heads * width));
  const std::vector<float> x0 = x;
  std::vector<float> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) inv_freq[size_t(i)] = std::pow(10000.0f, -2.0f * float(i) / float(dim));
  std::vector<int32_t> pos = {0, 3, 17, 4095, 163839};
  ops::RopeTable table{view_of(inv_freq, {half}), 1.0f};
  table.interleaved = false;
  be->rope(strided_view(x.data(), DType::F32, {tokens, heads, dim}, {heads * width, width, 1}), view_of(pos, {tokens}),
           table);
  std::vector<float> got;
  std::vector<double> ref;
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      const size_t base = size_t((t * heads + h) * width);
      for (int64_t i = dim; i < width; ++i) ASSERT_EQ(x[base + size_t(i)], x0[base + size_t(i)]);
      for (int64_t i = 0; i < half; ++i) {
        const float angle = float(pos[size_t(t)]) * inv_freq[size_t(i)];
        const double c = std::cos(double(angle)), s = std::sin(double(angle));
        const double a = x0[base + size_t(i)], b = x0[base + size_t(i + half)];
        got.push_back(x[base + size_t(i)]);
        got.push_back(x[base + size_t(i + half)]);
        ref.push_back(a * c - b * s);  // HF: x * cos + rotate_half(x) * sin, rotate_half = [-x2, x1]
        ref.push_back(b * c + a * s);
      }
    }
  EXPECT_TRUE(all_close(got, ref, kTol));
}

}  // namespace
}  // namespace mla::test
