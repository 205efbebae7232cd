// CPU backend MLA ops against double-precision formulas: cache writes, naive (decompressed) attention,
// absorbed (MQA over the latent) attention, absorb_q / expand_v, and the identity absorbed == naive.
// Batches mix prefill chunks and decode rows, use shuffled (non-contiguous) block ids with block size
// 16, and leave every unused cache slot NaN, so reading past kv_len or another sequence's block fails.
// Tolerance: |got - ref| <= 5e-6 * (1 + |ref|) (fp32 dots of <= 44 terms, fp32 online softmax).
#include <gtest/gtest.h>

#include <algorithm>

#include "backend/cpu/cpu_backend.h"
#include "unit/cpu_test_util.h"

namespace mla::test {
namespace {

constexpr double kTol = 5e-6;
constexpr int32_t kBlockSize = 16;

// A step's attention inputs: a paged latent cache (three blocks nobody owns) in which each sequence's
// first kv_len - q_len positions hold random latents (the new positions are written by the test
// through kv_cache_write), and the geometry it was made for.
struct PagedBatch : PagedCache {
  ops::MlaDims dims;
};

PagedBatch make_batch(std::mt19937& rng, const ops::MlaDims& dims, std::vector<SeqSpec> seqs) {
  PagedBatch pb;
  static_cast<PagedCache&>(pb) = make_paged_cache(rng, dims.kv_dim(), std::move(seqs), kBlockSize, 3);
  pb.dims = dims;
  return pb;
}

// Writes random latents for the step's new tokens through the op under test.
void write_new_tokens(ops::Backend& be, PagedBatch& pb, std::mt19937& rng) {
  std::vector<float> latent = random_floats(rng, size_t(pb.tokens * pb.dims.kv_dim()));
  be.kv_cache_write(view_of(latent, {pb.tokens, pb.dims.kv_dim()}), pb.batch.slot_mapping, pb.cache_view());
}

// softmax(scores) . values in double; values[j] has `dv` entries.
std::vector<double> softmax_mix(const std::vector<double>& scores, const std::vector<std::vector<double>>& values,
                                size_t dv) {
  const double m = *std::max_element(scores.begin(), scores.end());
  double l = 0.0;
  std::vector<double> out(dv, 0.0);
  for (size_t j = 0; j < scores.size(); ++j) {
    const double p = std::exp(scores[j] - m);
    l += p;
    for (size_t d = 0; d < dv; ++d) out[d] += p * values[j][d];
  }
  for (double& o : out) o /= l;
  return out;
}

// Naive MLA in double: keys and values decompressed from each cached latent with W = kv_b_proj.
std::vector<double> naive_ref(const PagedBatch& pb, const std::vector<float>& q, const std::vector<double>& w) {
  const auto& d = pb.dims;
  const size_t heads = size_t(d.num_heads), dn = size_t(d.qk_nope_head_dim), dr = size_t(d.qk_rope_head_dim);
  const size_t dv = size_t(d.v_head_dim), r = size_t(d.kv_lora_rank), per_head = dn + dv;
  std::vector<double> out(size_t(pb.tokens) * heads * dv);
  for (size_t s = 0; s < pb.seqs.size(); ++s) {
    const int64_t kv_len = pb.seqs[s].kv_len, q_len = pb.seqs[s].q_len;
    // kv[j][h] = W[h] c_j: [k_nope (dn) | v (dv)]
    std::vector<std::vector<double>> kv(size_t(kv_len) * heads, std::vector<double>(per_head));
    for (int64_t j = 0; j < kv_len; ++j)
      for (size_t h = 0; h < heads; ++h)
        for (size_t e = 0; e < per_head; ++e) {
          double acc = 0.0;
          for (size_t c = 0; c < r; ++c) acc += w[(h * per_head + e) * r + c] * pb.row(s, j)[c];
          kv[size_t(j) * heads + h][e] = acc;
        }
    for (int64_t i = 0; i < q_len; ++i) {
      const size_t t = size_t(pb.q_indptr[s] + i);
      const int64_t pos = kv_len - q_len + i;
      for (size_t h = 0; h < heads; ++h) {
        const float* qh = q.data() + (t * heads + h) * (dn + dr);
        std::vector<double> scores;
        std::vector<std::vector<double>> values;
        for (int64_t j = 0; j <= pos; ++j) {
          const auto& k = kv[size_t(j) * heads + h];
          double dot = 0.0;
          for (size_t e = 0; e < dn; ++e) dot += qh[e] * k[e];
          for (size_t e = 0; e < dr; ++e) dot += qh[dn + e] * double(pb.row(s, j)[r + e]);
          scores.push_back(d.softmax_scale * dot);
          values.emplace_back(k.begin() + long(dn), k.end());
        }
        const auto o = softmax_mix(scores, values, dv);
        std::copy(o.begin(), o.end(), out.begin() + long((t * heads + h) * dv));
      }
    }
  }
  return out;
}

// Absorbed MLA in double: MQA with key = cache row (kv_dim), value = its first r entries.
std::vector<double> absorbed_ref(const PagedBatch& pb, const std::vector<float>& q) {
  const size_t heads = size_t(pb.dims.num_heads), kv_dim = size_t(pb.dims.kv_dim()), r = size_t(pb.dims.kv_lora_rank);
  std::vector<double> out(size_t(pb.tokens) * heads * r);
  for (size_t s = 0; s < pb.seqs.size(); ++s) {
    for (int64_t i = 0; i < pb.seqs[s].q_len; ++i) {
      const size_t t = size_t(pb.q_indptr[s] + i);
      const int64_t pos = pb.seqs[s].kv_len - pb.seqs[s].q_len + i;
      for (size_t h = 0; h < heads; ++h) {
        std::vector<double> scores;
        std::vector<std::vector<double>> values;
        for (int64_t j = 0; j <= pos; ++j) {
          const float* row = pb.row(s, j);
          double dot = 0.0;
          for (size_t e = 0; e < kv_dim; ++e) dot += double(q[(t * heads + h) * kv_dim + e]) * row[e];
          scores.push_back(pb.dims.softmax_scale * dot);
          values.emplace_back(row, row + r);
        }
        const auto o = softmax_mix(scores, values, r);
        std::copy(o.begin(), o.end(), out.begin() + long((t * heads + h) * r));
      }
    }
  }
  return out;
}

ops::MlaDims small_dims(int heads) {
  ops::MlaDims d;
  d.num_heads = heads;
  d.qk_nope_head_dim = 20;
  d.qk_rope_head_dim = 8;
  d.v_head_dim = 12;
  d.kv_lora_rank = 36;
  d.softmax_scale = 0.6f / std::sqrt(28.0f);
  return d;
}

// kv_b_proj rows: per head, d_nope key rows then d_v value rows.
int64_t kv_b_rows(const ops::MlaDims& d) { return int64_t(d.num_heads) * (d.qk_nope_head_dim + d.v_head_dim); }

// A random q for the naive op: [T, H, d_nope + d_rope].
std::vector<float> random_q(std::mt19937& rng, const PagedBatch& pb) {
  const ops::MlaDims& d = pb.dims;
  return random_floats(rng, size_t(pb.tokens * d.num_heads * (d.qk_nope_head_dim + d.qk_rope_head_dim)));
}

// The naive op over pb's cache: out [T, H, d_v].
std::vector<float> naive_path(ops::Backend& be, PagedBatch& pb, std::vector<float>& q, const ops::Weight& kv_b) {
  const auto& d = pb.dims;
  const int64_t heads = d.num_heads, qd = d.qk_nope_head_dim + d.qk_rope_head_dim;
  std::vector<float> out = nan_filled(size_t(pb.tokens * heads * d.v_head_dim));
  be.mla_attention_naive(view_of(q, {pb.tokens, heads, qd}), pb.cache_view(), kv_b, pb.batch, d,
                         view_of(out, {pb.tokens, heads, d.v_head_dim}));
  return out;
}

TEST(CpuMla, KvCacheWriteTouchesOnlyMappedSlots) {
  auto be = cpu::make_cpu_backend();
  std::mt19937 rng(21);
  const ops::MlaDims dims = small_dims(12);
  PagedBatch pb = make_batch(rng, dims, {{5, 21}, {1, 40}, {17, 17}});
  const std::vector<float> before = pb.cache;
  // latent rows strided: a [T, kv_dim] slice of a [T, kv_dim + 6] buffer.
  const int64_t kv_dim = dims.kv_dim(), stride = kv_dim + 6;
  std::vector<float> latent = random_floats(rng, size_t(pb.tokens * stride));
  be->kv_cache_write(strided_view(latent.data(), DType::F32, {pb.tokens, kv_dim}, {stride, 1}), pb.batch.slot_mapping,
                     pb.cache_view());
  std::vector<bool> written(pb.cache.size() / size_t(kv_dim), false);
  for (int64_t t = 0; t < pb.tokens; ++t) {
    const int64_t slot = pb.slot_mapping[size_t(t)];
    written[size_t(slot)] = true;
    for (int64_t c = 0; c < kv_dim; ++c)
      ASSERT_EQ(pb.cache[size_t(slot * kv_dim + c)], latent[size_t(t * stride + c)]) << t << "," << c;
  }
  for (size_t slot = 0; slot < written.size(); ++slot)
    if (!written[slot])
      for (int64_t c = 0; c < kv_dim; ++c) {
        const float a = pb.cache[slot * size_t(kv_dim) + size_t(c)], b = before[slot * size_t(kv_dim) + size_t(c)];
        ASSERT_TRUE(a == b || (std::isnan(a) && std::isnan(b))) << "slot " << slot << " changed";
      }
}

TEST(CpuMla, NaiveMatchesReference) {
  auto be = cpu::make_cpu_backend();
  std::mt19937 rng(22);
  const ops::MlaDims dims = small_dims(12);
  // Prefill chunks straddling block edges, decode rows (one exactly at a block edge), an idle sequence.
  PagedBatch pb = make_batch(rng, dims, {{5, 21}, {1, 40}, {17, 17}, {0, 9}, {1, 16}, {3, 35}});
  write_new_tokens(*be, pb, rng);
  TestWeight kv_b;
  make_dense(kv_b, rng, kv_b_rows(dims), dims.kv_lora_rank, DType::BF16);
  std::vector<float> q = random_q(rng, pb);
  EXPECT_TRUE(all_close(naive_path(*be, pb, q, kv_b.w), naive_ref(pb, q, dequantized(kv_b.w)), kTol));
}

TEST(CpuMla, AbsorbedMatchesReference) {
  auto be = cpu::make_cpu_backend();
  std::mt19937 rng(23);
  const ops::MlaDims dims = small_dims(20);
  PagedBatch pb = make_batch(rng, dims, {{1, 300}, {7, 7}, {2, 33}, {1, 1}});
  write_new_tokens(*be, pb, rng);
  // q rows strided: [T, H, kv_dim] view of a [T, H, kv_dim + 4] buffer.
  const int64_t kv_dim = dims.kv_dim(), width = kv_dim + 4, heads = dims.num_heads;
  std::vector<float> qbuf = random_floats(rng, size_t(pb.tokens * heads * width));
  std::vector<float> q(size_t(pb.tokens * heads * kv_dim));
  for (int64_t th = 0; th < pb.tokens * heads; ++th)
    std::copy_n(qbuf.begin() + th * width, kv_dim, q.begin() + th * kv_dim);
  std::vector<float> out = nan_filled(size_t(pb.tokens * heads * dims.kv_lora_rank));
  be->mla_attention_absorbed(strided_view(qbuf.data(), DType::F32, {pb.tokens, heads, kv_dim}, {heads * width, width, 1}),
                             pb.cache_view(), pb.batch, dims, view_of(out, {pb.tokens, heads, dims.kv_lora_rank}));
  EXPECT_TRUE(all_close(out, absorbed_ref(pb, q), kTol));
}

TEST(CpuMla, AbsorbQAndExpandVMatchFormula) {
  auto be = cpu::make_cpu_backend();
  std::mt19937 rng(24);
  const ops::MlaDims dims = small_dims(12);
  const int64_t tokens = 7, heads = 12, dn = 20, dr = 8, dv = 12, r = 36, per_head = dn + dv;
  TestWeight kv_b;
  make_fp8(kv_b, rng, heads * per_head, r);
  const std::vector<double> w = dequantized(kv_b.w);
  for (int64_t t_count : {int64_t(1), tokens}) {
    SCOPED_TRACE(t_count);
    // q_nope: the first dn of each [dn + dr] head; out: the first r of each [r + dr] head (absorbed q).
    std::vector<float> q = random_floats(rng, size_t(t_count * heads * (dn + dr)));
    std::vector<float> qa = nan_filled(size_t(t_count * heads * (r + dr)));
    be->mla_absorb_q(strided_view(q.data(), DType::F32, {t_count, heads, dn}, {heads * (dn + dr), dn + dr, 1}), kv_b.w,
                     dims, strided_view(qa.data(), DType::F32, {t_count, heads, r}, {heads * (r + dr), r + dr, 1}));
    std::vector<float> got;
    std::vector<double> ref;
    for (int64_t t = 0; t < t_count; ++t)
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t c = 0; c < r; ++c) {
          double acc = 0.0;  // (W_UK[h]^T q)[c] = sum_k W[h*per_head + k, c] q[k]
          for (int64_t k = 0; k < dn; ++k) acc += w[size_t((h * per_head + k) * r + c)] * q[size_t((t * heads + h) * (dn + dr) + k)];
          ref.push_back(acc);
          got.push_back(qa[size_t((t * heads + h) * (r + dr) + c)]);
        }
        for (int64_t e = 0; e < dr; ++e) EXPECT_TRUE(std::isnan(qa[size_t((t * heads + h) * (r + dr) + r + e)]));
      }
    EXPECT_TRUE(all_close(got, ref, kTol));

    std::vector<float> o = random_floats(rng, size_t(t_count * heads * r));
    std::vector<float> ov = nan_filled(size_t(t_count * heads * dv));
    be->mla_expand_v(view_of(o, {t_count, heads, r}), kv_b.w, dims, view_of(ov, {t_count, heads, dv}));
    ref.clear();
    for (int64_t t = 0; t < t_count; ++t)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t e = 0; e < dv; ++e) {
          double acc = 0.0;  // (W_UV[h] o)[e] = sum_c W[h*per_head + dn + e, c] o[c]
          for (int64_t c = 0; c < r; ++c) acc += w[size_t((h * per_head + dn + e) * r + c)] * o[size_t((t * heads + h) * r + c)];
          ref.push_back(acc);
        }
    EXPECT_TRUE(all_close(ov, ref, kTol));
  }
}

// Runs the absorbed path the way the model does: absorb q_nope into a wider q buffer, copy q_rope
// beside it, attend over the latent, expand the latent output with W_UV.
std::vector<float> absorbed_path(ops::Backend& be, PagedBatch& pb, std::vector<float>& q, const ops::Weight& kv_b) {
  const auto& d = pb.dims;
  const int64_t heads = d.num_heads, dn = d.qk_nope_head_dim, dr = d.qk_rope_head_dim, r = d.kv_lora_rank;
  const int64_t kv_dim = d.kv_dim(), tokens = pb.tokens;
  const TensorView qv = view_of(q, {tokens, heads, dn + dr});
  std::vector<float> q_abs = nan_filled(size_t(tokens * heads * kv_dim));
  const TensorView qa = view_of(q_abs, {tokens, heads, kv_dim});
  be.mla_absorb_q(qv.slice(2, 0, dn), kv_b, d, qa.slice(2, 0, r));
  for (int64_t th = 0; th < tokens * heads; ++th)
    std::copy_n(q.begin() + th * (dn + dr) + dn, dr, q_abs.begin() + th * kv_dim + r);
  std::vector<float> o_lat = nan_filled(size_t(tokens * heads * r));
  be.mla_attention_absorbed(qa, pb.cache_view(), pb.batch, d, view_of(o_lat, {tokens, heads, r}));
  std::vector<float> out = nan_filled(size_t(tokens * heads * d.v_head_dim));
  be.mla_expand_v(view_of(o_lat, {tokens, heads, r}), kv_b, d, view_of(out, {tokens, heads, d.v_head_dim}));
  return out;
}

TEST(CpuMla, AbsorbedEqualsNaive) {
  auto be = cpu::make_cpu_backend();
  std::mt19937 rng(25);
  const ops::MlaDims dims = small_dims(20);
  // kv_len up to 300: past the 256-position key chunk; a prefill chunk straddling it.
  PagedBatch pb = make_batch(rng, dims, {{9, 260}, {1, 300}, {4, 4}, {1, 1}, {16, 48}, {1, 17}});
  write_new_tokens(*be, pb, rng);
  TestWeight kv_b;
  make_fp8(kv_b, rng, kv_b_rows(dims), dims.kv_lora_rank);
  std::vector<float> q = random_q(rng, pb);
  const std::vector<float> naive = naive_path(*be, pb, q, kv_b.w);
  const std::vector<float> absorbed = absorbed_path(*be, pb, q, kv_b.w);
  EXPECT_TRUE(all_close(absorbed, std::vector<double>(naive.begin(), naive.end()), kTol));
  EXPECT_TRUE(all_close(absorbed, naive_ref(pb, q, dequantized(kv_b.w)), kTol));
}

TEST(CpuMla, LongContextCrossesKeyChunks) {
  auto be = cpu::make_cpu_backend();
  std::mt19937 rng(26);
  const ops::MlaDims dims = small_dims(12);
  // 600 keys = three 256-position chunks; queries at positions 255..265 straddle a chunk edge.
  PagedBatch pb = make_batch(rng, dims, {{20, 600}, {1, 513}, {11, 266}});
  write_new_tokens(*be, pb, rng);
  TestWeight kv_b;
  make_dense(kv_b, rng, kv_b_rows(dims), dims.kv_lora_rank, DType::F32);
  std::vector<float> q = random_q(rng, pb);
  const std::vector<double> ref = naive_ref(pb, q, dequantized(kv_b.w));
  EXPECT_TRUE(all_close(naive_path(*be, pb, q, kv_b.w), ref, kTol));
  EXPECT_TRUE(all_close(absorbed_path(*be, pb, q, kv_b.w), ref, kTol));
}

// A BF16 cache holds f32_to_bf16 (RNE) of each written latent and is read back exactly, so attention
// over it equals attention over an F32 cache holding the bf16-rounded latents: the same fp32 values
// in the same order, hence ~0 difference (1e-6 allows for nothing but a future reordering).
TEST(CpuMla, Bf16CacheEqualsRoundedF32Cache) {
  auto be = cpu::make_cpu_backend();
  std::mt19937 rng(28);
  const ops::MlaDims dims = small_dims(12);
  PagedBatch pb = make_batch(rng, dims, {{9, 260}, {1, 300}, {4, 4}, {0, 7}, {1, 17}});
  const int64_t kv_dim = dims.kv_dim(), heads = dims.num_heads;
  std::vector<uint16_t> cache16(pb.cache.size());
  for (size_t i = 0; i < pb.cache.size(); ++i) cache16[i] = f32_to_bf16(pb.cache[i]);
  // Strided latent rows (a [T, kv_dim] slice of [T, kv_dim + 3]) written to both caches by the op.
  const int64_t stride = kv_dim + 3;
  std::vector<float> latent = random_floats(rng, size_t(pb.tokens * stride));
  const TensorView lv = strided_view(latent.data(), DType::F32, {pb.tokens, kv_dim}, {stride, 1});
  be->kv_cache_write(lv, pb.batch.slot_mapping, pb.cache_view());
  const TensorView cache16_view = strided_view(cache16.data(), DType::BF16, {pb.num_blocks, kBlockSize, kv_dim},
                                               {kBlockSize * kv_dim, kv_dim, 1});
  be->kv_cache_write(lv, pb.batch.slot_mapping, cache16_view);
  for (size_t i = 0; i < pb.cache.size(); ++i) ASSERT_EQ(cache16[i], f32_to_bf16(pb.cache[i])) << i;
  for (float& v : pb.cache) v = round_bf16(v);  // the F32 twin now holds exactly the BF16 values

  TestWeight kv_b;
  make_dense(kv_b, rng, kv_b_rows(dims), dims.kv_lora_rank, DType::BF16);
  const int64_t qd = dims.qk_nope_head_dim + dims.qk_rope_head_dim;
  std::vector<float> q = random_q(rng, pb);
  std::vector<float> ref = nan_filled(size_t(pb.tokens * heads * dims.v_head_dim)), got = ref;
  be->mla_attention_naive(view_of(q, {pb.tokens, heads, qd}), pb.cache_view(), kv_b.w, pb.batch, dims,
                          view_of(ref, {pb.tokens, heads, dims.v_head_dim}));
  be->mla_attention_naive(view_of(q, {pb.tokens, heads, qd}), cache16_view, kv_b.w, pb.batch, dims,
                          view_of(got, {pb.tokens, heads, dims.v_head_dim}));
  EXPECT_TRUE(all_close(got, std::vector<double>(ref.begin(), ref.end()), 1e-6));
  EXPECT_TRUE(all_close(got, naive_ref(pb, q, dequantized(kv_b.w)), kTol));

  std::vector<float> qa = random_floats(rng, size_t(pb.tokens * heads * kv_dim));
  std::vector<float> ref_a = nan_filled(size_t(pb.tokens * heads * dims.kv_lora_rank)), got_a = ref_a;
  be->mla_attention_absorbed(view_of(qa, {pb.tokens, heads, kv_dim}), pb.cache_view(), pb.batch, dims,
                             view_of(ref_a, {pb.tokens, heads, dims.kv_lora_rank}));
  be->mla_attention_absorbed(view_of(qa, {pb.tokens, heads, kv_dim}), cache16_view, pb.batch, dims,
                             view_of(got_a, {pb.tokens, heads, dims.kv_lora_rank}));
  EXPECT_TRUE(all_close(got_a, std::vector<double>(ref_a.begin(), ref_a.end()), 1e-6));
  EXPECT_TRUE(all_close(got_a, absorbed_ref(pb, qa), kTol));
}

TEST(CpuMlaDeathTest, RejectsBadSlotsAndBatches) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto be = cpu::make_cpu_backend();
  std::mt19937 rng(27);
  const ops::MlaDims dims = small_dims(2);
  PagedBatch pb = make_batch(rng, dims, {{2, 5}});
  std::vector<float> latent = random_floats(rng, size_t(2 * dims.kv_dim()));
  std::vector<int32_t> slots = {0, int32_t(pb.num_blocks * kBlockSize)};
  EXPECT_DEATH(be->kv_cache_write(view_of(latent, {2, dims.kv_dim()}), view_of(slots, {2}), pb.cache_view()), "slot");
  pb.kv_lens[0] = 1;  // fewer cached tokens than new ones
  std::vector<float> q = random_floats(rng, size_t(2 * 2 * dims.kv_dim())), out(size_t(2 * 2 * dims.kv_lora_rank));
  EXPECT_DEATH(be->mla_attention_absorbed(view_of(q, {2, 2, dims.kv_dim()}), pb.cache_view(), pb.batch, dims,
                                          view_of(out, {2, 2, dims.kv_lora_rank})),
               "kv_len");
}

}  // namespace
}  // namespace mla::test
