// GPU parity of the draft-head ops: gqa_cache_write (F32 / BF16 cache, strided k and v), gqa_attention
// over head layouts H/KVH in {1/1, 8/2, 12/4, 32/8} and D in {64, 128} with ragged batches (prefill
// chunks beside decode rows, contexts crossing block edges, shuffled block ids, spare blocks),
// scatter_columns, and RoPE in the rotate_half layout. Both backends attend over identical cache
// bytes: the cache starts random on both sides and the step's rows are written by each backend.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>

#include "gpu/parity.h"

namespace mla::test {
namespace {

ops::GqaDims gqa_dims(int heads, int kv_heads, int head_dim) {
  return ops::GqaDims{heads, kv_heads, head_dim, float(1.0 / std::sqrt(double(head_dim)))};
}

// A random cache whose step slots are then written by gqa_cache_write on each backend from k and v,
// column slices of one wider row (strided rows).
Twin make_cache(std::mt19937& rng, const TwinBatch& b, DType dtype, const ops::GqaDims& d) {
  const int64_t width = int64_t(d.num_kv_heads) * d.head_dim;
  Twin cache = twin_random(rng, dtype, {b.num_blocks, b.block_size, 2 * width});
  Twin kv = twin_random(rng, DType::F32, {b.tokens, 2 * width + 3});
  Twin k = kv.slice(1, 0, width), v = kv.slice(1, width + 3, width);
  run_both([&](ops::Backend& be, bool g) {
    be.gqa_cache_write(pick(k, g), pick(v, g), pick(b, g).slot_mapping, pick(cache, g));
  });
  return cache;
}

TEST(GpuParityGqa, CacheWrite) {
  std::mt19937 rng(801);
  for (DType dtype : {DType::F32, DType::BF16})
    for (const ops::GqaDims& d : {gqa_dims(1, 1, 64), gqa_dims(8, 2, 128), gqa_dims(12, 3, 70)}) {
      auto b = make_twin_batch(rng, {{5, 21}, {1, 40}, {17, 17}, {1, 1}, {13, 301}}, 16);
      // Untouched slots keep their shared random bytes, so an exact compare of the whole cache also
      // catches a write to a wrong slot or half.
      Twin cache = make_cache(rng, *b, dtype, d);
      EXPECT_TRUE(check_parity("gqa_cache_write", fmt::format("{} KVH {} D {} T {}", dtype_name(dtype), d.num_kv_heads,
                                                              d.head_dim, b->tokens),
                               cache, Tolerance{0, 0, "a copy (bf16: the same RNE rounding)"}));
    }
}

// fp32 on both sides over the same cache values: D-term dots and an online softmax in another
// order (tiles of 32 vs chunks of 64 keys, expf vs std::exp), ~1e-6 relative.
const Tolerance kAttnTol{1e-5, 1e-5, "fp32 dots and online softmax, other order"};

TEST(GpuParityGqa, AttentionHeadLayoutsAndRaggedBatches) {
  std::mt19937 rng(802);
  // Decode rows beside prefill chunks; a one-token sequence; an empty one; kv_lens on and off the
  // 16-token block edges; one context long enough for many key tiles.
  const std::vector<SeqSpec> seqs = {{1, 999}, {7, 37}, {1, 1}, {3, 16}, {0, 9}, {1, 33}, {19, 111}};
  const std::array<std::array<int, 2>, 4> layouts = {{{1, 1}, {8, 2}, {12, 4}, {32, 8}}};
  for (DType dtype : {DType::F32, DType::BF16})
    for (const auto& hk : layouts)
      for (int head_dim : {64, 128}) {
        const ops::GqaDims d = gqa_dims(hk[0], hk[1], head_dim);
        auto b = make_twin_batch(rng, seqs, 16);
        Twin cache = make_cache(rng, *b, dtype, d);
        const int64_t width = int64_t(d.num_heads) * head_dim;
        Twin q = twin_random(rng, DType::F32, {b->tokens, width + 5}).slice(1, 0, width);
        Twin out = twin_output(DType::F32, {b->tokens, width + 7}).slice(1, 3, width);
        run_both([&](ops::Backend& be, bool g) {
          be.gqa_attention(pick(q, g), pick(cache, g), pick(*b, g), d, pick(out, g));
        });
        EXPECT_TRUE(check_parity("gqa_attention", fmt::format("{} cache H {} KVH {} D {} seqs {}", dtype_name(dtype),
                                                              hk[0], hk[1], head_dim, seqs_name(seqs)),
                                 out, kAttnTol));
      }
}

TEST(GpuParityGqa, AttentionOddHeadDimAndBlockSize) {
  std::mt19937 rng(803);
  // D = 70 (not a multiple of the warp or of 32), block size 7, T = 1 decode of a single sequence.
  for (const std::vector<SeqSpec>& seqs : {std::vector<SeqSpec>{{1, 50}}, std::vector<SeqSpec>{{1, 3}, {5, 12}}}) {
    const ops::GqaDims d = gqa_dims(6, 3, 70);
    auto b = make_twin_batch(rng, seqs, 7);
    Twin cache = make_cache(rng, *b, DType::BF16, d);
    Twin q = twin_random(rng, DType::F32, {b->tokens, 6 * 70});
    Twin out = twin_output(DType::F32, {b->tokens, 6 * 70});
    run_both([&](ops::Backend& be, bool g) {
      be.gqa_attention(pick(q, g), pick(cache, g), pick(*b, g), d, pick(out, g));
    });
    EXPECT_TRUE(check_parity("gqa_attention", fmt::format("D 70 block 7 seqs {}", seqs_name(seqs)), out, kAttnTol));
  }
}

TEST(GpuParityGqa, ScatterColumns) {
  std::mt19937 rng(804);
  using Dims3 = std::array<int64_t, 3>;  // rows, draft width, vocabulary
  for (const Dims3& c : {Dims3{1, 64, 129}, Dims3{7, 150, 512}, Dims3{19, 989, 32000}}) {
    const int64_t rows = c[0], width = c[1], vocab = c[2];
    std::vector<int32_t> perm(static_cast<size_t>(vocab));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    perm.resize(size_t(width));
    Twin index = twin_from_ints(perm, {width});
    Twin src = twin_random(rng, DType::F32, {rows, width + 2}).slice(1, 1, width);
    // A finite fill here (check_parity wants finite values); the -inf case is checked below.
    Twin out = twin_output(DType::F32, {rows, vocab + 4}).slice(1, 0, vocab);
    run_both([&](ops::Backend& be, bool g) { be.scatter_columns(pick(src, g), pick(index, g), -7.5f, pick(out, g)); });
    EXPECT_TRUE(check_parity("scatter_columns", fmt::format("N {} Dv {} V {}", rows, width, vocab), out,
                             Tolerance{0, 0, "a copy"}));
    Twin out_inf = twin_output(DType::F32, {rows, vocab});
    run_both([&](ops::Backend& be, bool g) {
      be.scatter_columns(pick(src, g), pick(index, g), -std::numeric_limits<float>::infinity(), pick(out_inf, g));
    });
    const std::vector<float> got = gpu_values(out_inf), ref = cpu_values(out_inf);
    ASSERT_EQ(got.size(), ref.size());
    size_t bad = 0;
    for (size_t i = 0; i < got.size(); ++i) bad += !(got[i] == ref[i]);
    EXPECT_EQ(bad, 0u) << "scatter_columns with -inf fill, V " << vocab;
  }
}

TEST(GpuParityGqa, RopeRotateHalf) {
  std::mt19937 rng(805);
  const Tolerance tol{2e-6, 2e-6, "precise cosf/sinf (<= 2 ulp) of the identical fp32 angle"};
  struct Case {
    int64_t tokens, heads, dim, head_stride;
  };
  for (const Case c : {Case{1, 1, 2, 2}, Case{19, 8, 128, 128}, Case{7, 32, 64, 70}, Case{111, 3, 66, 66}}) {
    const int64_t pairs = c.dim / 2;
    std::vector<float> inv(static_cast<size_t>(pairs));
    for (int64_t i = 0; i < pairs; ++i) inv[size_t(i)] = float(std::pow(10000.0, -2.0 * double(i) / double(c.dim)));
    Twin inv_freq = twin_from_floats(inv, {pairs});
    Twin positions = twin_random(rng, DType::I32, {c.tokens}, 0.0f, 131072.0f);
    // The rotated view inside a poisoned buffer: random values written into it on both sides.
    Twin x = twin_output(DType::F32, {c.tokens, c.heads, c.head_stride}).slice(2, 0, c.dim);
    const std::vector<float> values = random_floats(rng, size_t(x.cpu.numel()));
    size_t k = 0;
    for (int64_t t = 0; t < c.tokens; ++t)
      for (int64_t h = 0; h < c.heads; ++h)
        for (int64_t i = 0; i < c.dim; ++i) *x.cpu.at<float>(t, h, i) = values[k++];
    sync_to_device(x);
    ops::RopeTable cpu_table{inv_freq.cpu, 1.0f, false}, gpu_table{inv_freq.gpu, 1.0f, false};
    run_both([&](ops::Backend& be, bool g) { be.rope(pick(x, g), pick(positions, g), g ? gpu_table : cpu_table); });
    EXPECT_TRUE(check_parity("rope rotate_half", fmt::format("T={} H={} D={} head stride {}", c.tokens, c.heads,
                                                             c.dim, c.head_stride),
                             x, tol));
  }
}

}  // namespace
}  // namespace mla::test
