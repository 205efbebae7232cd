// GPU parity of the MLA ops: cache writes (F32 / BF16 cache), absorb_q / expand_v over packed
// weights, absorbed attention through every dispatch path (generic fp32 kernel, tensor-core kernel,
// Auto) and naive attention (chunked decompression; the fp32 chunk kernel, and on a GemmPrecision::Bf16
// backend the tensor-core one and its fallback). Batches mix decode rows and prefill chunks, use
// shuffled block ids, spare blocks and kv_lens off the block edges; the cache is written through
// kv_cache_write on both backends so both attend over identical bytes.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "backend/gpu/gpu_backend.h"
#include "backend/gpu/gpu_mla.h"
#include "backend/gpu/gpu_mla_decode_tc.h"
#include "backend/gpu/gpu_mla_naive_sm90a.h"
#include "gpu/parity.h"

namespace mla::test {
namespace {

// A random cache (every slot random, identical on both sides) whose new-token slots are then written
// by kv_cache_write on each backend from strided latent rows.
Twin make_cache(std::mt19937& rng, const TwinBatch& b, DType dtype, int64_t kv_dim) {
  Twin cache = twin_random(rng, dtype, {b.num_blocks, b.block_size, kv_dim});
  if (b.tokens == 0) return cache;
  Twin latent = twin_random(rng, DType::F32, {b.tokens, kv_dim + 5}).slice(1, 0, kv_dim);
  run_both([&](ops::Backend& be, bool g) { be.kv_cache_write(pick(latent, g), pick(b, g).slot_mapping, pick(cache, g)); });
  return cache;
}

// ---- kv_cache_write ------------------------------------------------------------------------------

TEST(GpuParityMla, KvCacheWrite) {
  std::mt19937 rng(301);
  for (DType dtype : {DType::F32, DType::BF16})
    for (int64_t kv_dim : {int64_t(40), int64_t(576)}) {
      auto b = make_twin_batch(rng, {{5, 21}, {1, 40}, {17, 17}, {1, 1}, {13, 301}}, 16);
      // Untouched slots keep their (shared) random bytes, so comparing the whole cache exactly also
      // catches a write to a wrong slot. BF16: both round with RNE from the same fp32: exact.
      Twin cache = make_cache(rng, *b, dtype, kv_dim);
      EXPECT_TRUE(check_parity("kv_cache_write", fmt::format("{} kv_dim {} T {}", dtype_name(dtype), kv_dim, b->tokens),
                               cache, Tolerance{0, 0, "a copy (bf16: the same RNE rounding)"}));
    }
}

// ---- absorb_q / expand_v -------------------------------------------------------------------------

// fp32 sums of K products (|w| <= 0.5, |x| < 1) in another association (FMA, lane-strided partial
// sums): error <= K eps sum|terms|, about 1e-6 relative in practice.
const Tolerance kGemmTol{2e-5, 1e-5, "fp32 accumulation of <= 512 products, other association"};

void absorb_expand_case(std::mt19937& rng, WeightKind kind, const ops::MlaDims& d, int64_t tokens) {
  const int64_t heads = d.num_heads, dn = d.qk_nope_head_dim, dr = d.qk_rope_head_dim, dv = d.v_head_dim;
  const int64_t r = d.kv_lora_rank;
  TwinWeight kv_b;
  make_twin_weight(kv_b, rng, kind, heads * (dn + dv), r);
  const std::string name = fmt::format("{} H {} T {} dn {} dv {} r {}", weight_kind_name(kind), heads, tokens, dn, dv, r);
  // q_nope: the first dn of [dn + dr] per head; out: the first r of [r + dr] per head (as the model).
  Twin q = twin_random(rng, DType::F32, {tokens, heads, dn + dr}).slice(2, 0, dn);
  Twin qa = twin_output(DType::F32, {tokens, heads, r + dr}).slice(2, 0, r);
  run_both([&](ops::Backend& be, bool g) { be.mla_absorb_q(pick(q, g), pick(kv_b, g), d, pick(qa, g)); });
  EXPECT_TRUE(check_parity("mla_absorb_q", name, qa, kGemmTol));

  Twin o = twin_random(rng, DType::F32, {tokens, heads, r + 3}).slice(2, 0, r);
  Twin ov = twin_output(DType::F32, {tokens, heads, dv + 2}).slice(2, 0, dv);
  run_both([&](ops::Backend& be, bool g) { be.mla_expand_v(pick(o, g), pick(kv_b, g), d, pick(ov, g)); });
  EXPECT_TRUE(check_parity("mla_expand_v", name, ov, kGemmTol));
}

TEST(GpuParityMla, AbsorbQAndExpandV) {
  std::mt19937 rng(302);
  for (WeightKind kind : {WeightKind::BF16, WeightKind::FP8, WeightKind::INT4_BF16})
    for (int heads : {1, 12, 20})
      for (int64_t tokens : {int64_t(1), int64_t(5), int64_t(37)})
        // r = 160: one full and one partial 128-column tile; d_n, d_v not multiples of 16.
        absorb_expand_case(rng, kind, mla_dims(heads, 24, 8, 40, 160), tokens);
  absorb_expand_case(rng, WeightKind::FP8, deepseek_mla_dims(16), 9);
  absorb_expand_case(rng, WeightKind::INT4_BF16, deepseek_mla_dims(16), 1);
}

// GemmPrecision::Bf16 with FP8 / INT4 kv_b: the tensor-core path (W_UK^T for absorb_q, FP8 only:
// rebuilt per call for these weights, which live on another backend, and kept for a placed one; W_UV's rows per head for expand_v). x is rounded once (f16 for FP8 with a
// power-of-two scale, bf16 for INT4), W exact, fp32 accumulation: within 2^-8 of sum|x w| <=
// 2^-8 (K / 4 + 1) for |x| < 1, |w| <= 0.5 (K = d_n for absorb_q, r for expand_v). Shapes the path
// refuses (d_n = 24) fall back to the exact kernels in the same mode.
TEST(GpuParityMla, AbsorbQAndExpandVTensorCoreBf16) {
  auto made = gpu::make_gpu_backend({.gemm_precision = gpu::GemmPrecision::Bf16});
  ASSERT_TRUE(made.is_ok()) << made.status().message();
  std::unique_ptr<ops::Backend> bf16 = std::move(made).value();
  std::mt19937 rng(303);
  const auto tol = [](int64_t k) {
    return Tolerance{std::ldexp(1.0, -8) * (0.25 * double(k) + 1.0), 0.0, "x rounded once: 2^-8 sum|xw|"};
  };
  struct Case {
    WeightKind kind;
    ops::MlaDims d;
    bool takes;  // the tensor-core path applies (else the exact kernels run: kGemmTol)
  };
  const Case cases[] = {{WeightKind::FP8, deepseek_mla_dims(16), true},
                        {WeightKind::FP8, deepseek_mla_dims(1), true},
                        {WeightKind::FP8, deepseek_mla_dims(128), true},
                        {WeightKind::INT4_BF16, deepseek_mla_dims(16), true},
                        {WeightKind::FP8, mla_dims(20, 128, 64, 128, 256), true},
                        {WeightKind::FP8, mla_dims(12, 24, 8, 40, 160), false}};
  for (const Case& c : cases)
    for (int64_t tokens : {int64_t(1), int64_t(3), int64_t(9), int64_t(16)}) {
      const int64_t heads = c.d.num_heads, dn = c.d.qk_nope_head_dim, dr = c.d.qk_rope_head_dim;
      const int64_t dv = c.d.v_head_dim, r = c.d.kv_lora_rank;
      TwinWeight kv_b;
      make_twin_weight(kv_b, rng, c.kind, heads * (dn + dv), r);
      const std::string name = fmt::format("{} H {} T {} dn {} dv {} r {} [bf16 {}]", weight_kind_name(c.kind), heads,
                                           tokens, dn, dv, r, c.takes ? "tc" : "fallback");
      Twin q = twin_random(rng, DType::F32, {tokens, heads, dn + dr}).slice(2, 0, dn);
      Twin qa = twin_output(DType::F32, {tokens, heads, r + dr}).slice(2, 0, r);
      cpu_backend().mla_absorb_q(q.cpu, kv_b.cpu, c.d, qa.cpu);
      bf16->mla_absorb_q(q.gpu, kv_b.gpu, c.d, qa.gpu);
      bf16->synchronize();
      // INT4 absorb_q keeps the exact kernel (its group scales do not transpose).
      const bool absorb_tc = c.takes && c.kind == WeightKind::FP8;
      EXPECT_TRUE(check_parity("mla_absorb_q", name, qa, absorb_tc ? tol(dn) : kGemmTol));

      Twin o = twin_random(rng, DType::F32, {tokens, heads, r + 3}).slice(2, 0, r);
      Twin ov = twin_output(DType::F32, {tokens, heads, dv + 2}).slice(2, 0, dv);
      cpu_backend().mla_expand_v(o.cpu, kv_b.cpu, c.d, ov.cpu);
      bf16->mla_expand_v(o.gpu, kv_b.gpu, c.d, ov.gpu);
      bf16->synchronize();
      EXPECT_TRUE(check_parity("mla_expand_v", name, ov, c.takes ? tol(r) : kGemmTol));
    }
  // A kv_b placed on this backend itself (as a loaded model's is): the first call builds W_UK^T and
  // keeps it, the later calls (fresh inputs, re-poisoned outputs) read the kept copy.
  const ops::MlaDims d = deepseek_mla_dims(16);
  const int64_t dn = d.qk_nope_head_dim, dr = d.qk_rope_head_dim, r = d.kv_lora_rank;
  TwinWeight kv_b;
  make_twin_weight(kv_b, rng, WeightKind::FP8, d.num_heads * (dn + d.v_head_dim), r);
  ops::Weight own = kv_b.gpu;
  own.data = bf16->place_weight(kv_b.host.w.data);
  own.scale = bf16->place_weight(kv_b.host.w.scale);
  for (int call = 0; call < 3; ++call) {
    Twin q = twin_random(rng, DType::F32, {5, d.num_heads, dn + dr}).slice(2, 0, dn);
    Twin qa = twin_output(DType::F32, {5, d.num_heads, r + dr}).slice(2, 0, r);
    cpu_backend().mla_absorb_q(q.cpu, kv_b.cpu, d, qa.cpu);
    bf16->mla_absorb_q(q.gpu, own, d, qa.gpu);
    bf16->synchronize();
    EXPECT_TRUE(check_parity("mla_absorb_q", fmt::format("FP8 H 16 T 5, placed kv_b, call {}", call), qa, tol(dn)));
  }
}

// ---- absorbed attention --------------------------------------------------------------------------

// fp32 end to end on both sides, over the same cache values (a BF16 cache is widened exactly by both):
// dots of kv_dim terms and an online softmax in another order, ~1e-6 relative.
const Tolerance kAttnTol{1e-5, 1e-5, "fp32 dots and online softmax, other order"};

// Runs absorbed attention on both backends (the GPU through `path`); returns the output twin.
Twin run_absorbed(std::mt19937& rng, const TwinBatch& b, const Twin& cache, const ops::MlaDims& d,
                  gpu::MlaAttnPath path) {
  const int64_t heads = d.num_heads, kv_dim = d.kv_dim(), r = d.kv_lora_rank;
  Twin q = twin_random(rng, DType::F32, {b.tokens, heads, kv_dim + 4}).slice(2, 0, kv_dim);
  Twin out = twin_output(DType::F32, {b.tokens, heads, r + 8}).slice(2, 0, r);
  run_both([&](ops::Backend& be, bool g) {
    if (g) gpu::mla_attention_absorbed_with_path(be, q.gpu, cache.gpu, b.gpu, d, out.gpu, path);
    else be.mla_attention_absorbed(q.cpu, cache.cpu, b.cpu, d, out.cpu);
  });
  return out;
}

// The tensor-core path rounds q and P to bf16 (8 significant bits) before the MMAs, fp32 accumulation:
// each output is a convex mix of cache values, so its error is ~2^-8 of the largest output.
Tolerance tc_tolerance(const Twin& out) {
  float big = 0.0f;
  for (float v : cpu_values(out)) big = std::max(big, std::fabs(v));
  return Tolerance{2e-2 * double(big), 0, "bf16 q and P in the tensor-core MMAs: 2e-2 of max|out|"};
}

TEST(GpuParityMla, AbsorbedGenericHeadSweepF32Cache) {
  std::mt19937 rng(303);
  const std::vector<SeqSpec> seqs = {{1, 2999}, {5, 37}, {1, 1}, {3, 16}, {0, 9}, {1, 700}, {11, 1034}};
  for (int heads : {1, 7, 8, 12, 16, 20, 64, 128}) {
    auto b = make_twin_batch(rng, seqs, 16);
    const ops::MlaDims d = deepseek_mla_dims(heads);
    Twin cache = make_cache(rng, *b, DType::F32, d.kv_dim());
    Twin out = run_absorbed(rng, *b, cache, d, gpu::MlaAttnPath::Generic);
    EXPECT_TRUE(check_parity("mla_absorbed generic", fmt::format("f32 cache H {} seqs {}", heads, seqs_name(seqs)), out,
                             kAttnTol));
  }
}

TEST(GpuParityMla, AbsorbedGenericOddDimsAndBf16Cache) {
  std::mt19937 rng(304);
  // Tiny odd geometry (r not a multiple of the 128 columns per pass, kv_dim 41) and a block size of 7.
  for (DType dtype : {DType::F32, DType::BF16})
    for (int heads : {1, 9, 20}) {
      const std::vector<SeqSpec> seqs = {{1, 50}, {19, 19}, {2, 130}, {1, 3}};
      auto b = make_twin_batch(rng, seqs, 7);
      const ops::MlaDims d = mla_dims(heads, 16, 9, 16, 32);
      Twin cache = make_cache(rng, *b, dtype, d.kv_dim());
      Twin out = run_absorbed(rng, *b, cache, d, gpu::MlaAttnPath::Generic);
      EXPECT_TRUE(check_parity("mla_absorbed generic", fmt::format("{} cache H {} r 32 d_r 9 bs 7", dtype_name(dtype),
                                                                   heads), out, kAttnTol));
    }
  // The real geometry over a BF16 cache through the generic path stays fp32-tight.
  const std::vector<SeqSpec> seqs = {{1, 2500}, {4, 100}, {1, 65}};
  auto b = make_twin_batch(rng, seqs, 64);
  const ops::MlaDims d = deepseek_mla_dims(128);
  Twin cache = make_cache(rng, *b, DType::BF16, d.kv_dim());
  Twin out = run_absorbed(rng, *b, cache, d, gpu::MlaAttnPath::Generic);
  EXPECT_TRUE(check_parity("mla_absorbed generic", "bf16 cache H 128 real dims bs 64", out, kAttnTol));
}

TEST(GpuParityMla, AbsorbedAutoEveryHeadCountBf16Cache) {
  std::mt19937 rng(305);
  const std::vector<SeqSpec> seqs = {{1, 40}, {1, 1}, {1, 129}, {1, 64}};
  for (int heads = 1; heads <= 128; ++heads) {
    auto b = make_twin_batch(rng, seqs, 64);
    const ops::MlaDims d = deepseek_mla_dims(heads);
    Twin cache = make_cache(rng, *b, DType::BF16, d.kv_dim());
    Twin out = run_absorbed(rng, *b, cache, d, gpu::MlaAttnPath::Auto);
    const bool tc = gpu::mla_attention_uses_tensor_cores(DType::BF16, d);
    EXPECT_TRUE(check_parity("mla_absorbed auto", fmt::format("{} H {} decode ctx<=129", tc ? "tc" : "generic", heads),
                             out, tc ? tc_tolerance(out) : kAttnTol));
  }
}

TEST(GpuParityMla, AbsorbedTensorCoreLongContextAndMixed) {
  if (!gpu::mla_attention_uses_tensor_cores(DType::BF16, deepseek_mla_dims(16))) GTEST_SKIP() << "no tensor-core MLA path";
  std::mt19937 rng(306);
  for (int heads : {16, 20, 128}) {
    for (const std::vector<SeqSpec>& seqs : std::vector<std::vector<SeqSpec>>{
             {{1, 2999}, {1, 1}, {1, 1025}, {1, 640}},  // decode only
             {{1, 3000}, {6, 70}, {1, 5}, {17, 17}}}) {  // decode rows and prefill chunks
      auto b = make_twin_batch(rng, seqs, 64);
      const ops::MlaDims d = deepseek_mla_dims(heads);
      Twin cache = make_cache(rng, *b, DType::BF16, d.kv_dim());
      Twin out = run_absorbed(rng, *b, cache, d, gpu::MlaAttnPath::TensorCore);
      EXPECT_TRUE(check_parity("mla_absorbed tc", fmt::format("H {} seqs {}", heads, seqs_name(seqs)), out,
                               tc_tolerance(out)));
    }
  }
}

// The mma.sync kernel's split bookkeeping: cache rows resolved from the block table incrementally
// (block sizes 1, 7, 16 and 100 against 32- and 64-key units: several blocks per unit, units across
// block edges) and the split merge where the grid has <= 4 splits: in a thread-block cluster (on
// sm_90), by the last CTA of each tile (tickets) or by the combine kernel. The geometries (split counts from num_splits_for on
// 132 SMs): 5 tokens x 12 / 16 / 20 / 128 heads (12 and 20: a partial head tile, taken by the kernel),
// ~14-23 splits (always the combine kernel), 2999 / 1100 keys leave empty splits and 1 / 65 keys run
// direct; 64 tokens x 16 or 12 heads, two 32-key CTAs per SM
// with 4 splits (ctx 560 = 9 tiles: split 3 is empty); 32 tokens x 16 heads, one 64-key CTA per SM
// with 4 splits; 40 tokens x 128 heads with the mma.sync kernel forced, 32-head CTAs with 3 splits.
struct MergeGuard {
  explicit MergeGuard(gpu::MlaDecodeMerge merge) { gpu::set_mla_decode_merge(gpu_backend(), merge); }
  ~MergeGuard() { gpu::set_mla_decode_merge(gpu_backend(), gpu::MlaDecodeMerge::Auto); }
};
// The merges a test runs: Cluster and ClusterTail (half the tokens in clusters, the rest in a ticket
// grid beside them) where the device has clusters (sm_90), Tickets, Kernel.
std::vector<std::pair<gpu::MlaDecodeMerge, std::string>> decode_merges() {
  std::vector<std::pair<gpu::MlaDecodeMerge, std::string>> m;
  if (gpu::mla_decode_cluster_merge_supported()) {
    m.emplace_back(gpu::MlaDecodeMerge::Cluster, "cluster merge");
    m.emplace_back(gpu::MlaDecodeMerge::ClusterTail, "clusters + tail grid");
  }
  m.emplace_back(gpu::MlaDecodeMerge::Tickets, "ticket merge");
  m.emplace_back(gpu::MlaDecodeMerge::Kernel, "combine kernel");
  return m;
}

TEST(GpuParityMla, AbsorbedTensorCoreSplitMergeAndBlockSizes) {
  if (!gpu::mla_attention_uses_tensor_cores(DType::BF16, deepseek_mla_dims(16))) GTEST_SKIP() << "no tensor-core MLA path";
  std::mt19937 rng(314);
  auto decode_rows = [&](int tokens, int max_ctx) {
    std::vector<SeqSpec> seqs;
    for (int i = 0; i < tokens; ++i) seqs.push_back({1, i == 5 ? 560 : 1 + int(rng() % unsigned(max_ctx))});
    return seqs;
  };
  auto run_case = [&](const std::vector<SeqSpec>& seqs, int heads, int block_size, const std::string& what) {
    auto b = make_twin_batch(rng, seqs, block_size);
    const ops::MlaDims d = deepseek_mla_dims(heads);
    Twin cache = make_cache(rng, *b, DType::BF16, d.kv_dim());
    Twin out = run_absorbed(rng, *b, cache, d, gpu::MlaAttnPath::TensorCore);
    EXPECT_TRUE(check_parity("mla_absorbed tc", fmt::format("{} H {} bs {}", what, heads, block_size), out,
                             tc_tolerance(out)));
  };
  const std::vector<SeqSpec> wide = decode_rows(64, 600), mid = decode_rows(32, 900), big = decode_rows(40, 700);
  for (const auto& [merge, tag] : decode_merges()) {
    MergeGuard guard(merge);
    for (int block_size : {1, 7, 16, 100}) {
      const std::vector<SeqSpec> few = {{1, 2999}, {1, 1}, {1, 1100}, {1, 65}, {1, 130}};
      for (int heads : {12, 16, 20, 128}) run_case(few, heads, block_size, tag + " seqs " + seqs_name(few));
      for (int heads : {16, 12}) run_case(wide, heads, block_size, tag + " 64 tokens ctx <= 600");
    }
    run_case(mid, 16, 16, tag + " 32 tokens ctx <= 900");
    gpu::set_mla_decode_kernel(gpu_backend(), gpu::MlaDecodeKernel::MmaSync);
    run_case(big, 128, 7, tag + " mma.sync 40 tokens ctx <= 700");
    gpu::set_mla_decode_kernel(gpu_backend(), gpu::MlaDecodeKernel::Auto);
  }
}

// Decode steps are graph-captured: the tensor-core kernel's grid depends on shapes only, while the
// splits each token uses follow kv_lens on the device. One capture, then replays at new contexts (same
// buffers, fresh kv_lens; the tables cover the first step's, longest, contexts). Two tokens: 2 and 3
// tiles (one split in use: the kernel writes out and the combine skips the row; two splits), 18
// tiles (9), and back. 64 tokens x 16 heads: the 4-split grid, with each merge (cluster, clusters +
// tail grid, tickets, combine kernel, and Auto), at contexts that use 4, 2-3, 1-2 and 1 splits. out
// is re-poisoned before each replay, so only the replay can pass.
TEST(GpuParityMla, AbsorbedTensorCoreGraphReplayContexts) {
  if (!gpu::mla_attention_uses_tensor_cores(DType::BF16, deepseek_mla_dims(16))) GTEST_SKIP() << "no tensor-core MLA path";
  std::mt19937 rng(307);
  ops::Backend& be = gpu_backend();
  auto run = [&](const std::vector<SeqSpec>& first, int heads, const std::vector<std::vector<int32_t>>& steps) {
    auto b = make_twin_batch(rng, first, 64);
    const ops::MlaDims d = deepseek_mla_dims(heads);
    Twin cache = make_cache(rng, *b, DType::BF16, d.kv_dim());
    const Twin q = twin_random(rng, DType::F32, {b->tokens, heads, d.kv_dim()});
    const Twin out = twin_output(DType::F32, {b->tokens, heads, d.kv_lora_rank});
    const Twin poison = twin_output(DType::F32, {b->tokens, heads, d.kv_lora_rank});
    be.synchronize();
    be.mla_attention_absorbed(q.gpu, cache.gpu, b->gpu, d, out.gpu);  // eager: sizes the scratch
    be.synchronize();
    std::unique_ptr<ops::OpGraph> graph =
        be.capture([&] { be.mla_attention_absorbed(q.gpu, cache.gpu, b->gpu, d, out.gpu); });
    for (const auto& lens : steps) {
      ASSERT_EQ(lens.size(), first.size());
      for (size_t i = 0; i < lens.size(); ++i) b->kv_lens[i] = lens[i];  // the host mirror the CPU reads
      std::memcpy(static_cast<char*>(b->kv_lens_t.host_buf->data()) + b->kv_lens_t.offset() * int64_t(sizeof(int32_t)),
                  b->kv_lens.data(), lens.size() * sizeof(int32_t));
      sync_to_device(b->kv_lens_t);
      be.synchronize();
      be.copy(poison.gpu, out.gpu);
      graph->replay();
      be.synchronize();
      cpu_backend().mla_attention_absorbed(q.cpu, cache.cpu, b->cpu, d, out.cpu);
      const std::string name = fmt::format("graph replay H {} T {} kv_lens {}/{}", heads, lens.size(), lens[0], lens[1]);
      EXPECT_TRUE(check_parity("mla_absorbed tc", name, out, tc_tolerance(out)));
    }
  };
  const std::vector<std::vector<int32_t>> two = {{100, 300}, {128, 2}, {129, 65}, {1100, 300}, {700, 1}};
  for (int heads : {12, 16, 20, 128}) run({{1, 1100}, {1, 300}}, heads, two);  // 12, 20: a partial head tile
  std::vector<SeqSpec> wide(64, SeqSpec{1, 600});
  std::vector<std::vector<int32_t>> wide_steps;
  for (int32_t base : {600, 300, 129, 64}) {  // ~10, 4-5, 2-3 and 1 tiles: 4, 2-3, 1-2 and 1 splits in use
    std::vector<int32_t> lens(64);
    for (int i = 0; i < 64; ++i) lens[i] = std::max(1, base - int32_t(rng() % 64u));
    wide_steps.push_back(lens);
  }
  // Auto merges this grid in clusters plus a ticket tail grid on an H100 / H200 (64 clusters of 4 do
  // not fit one wave: cluster_tokens_for); every merge is forced in turn so that each is captured.
  auto merges = decode_merges();
  merges.emplace_back(gpu::MlaDecodeMerge::Auto, "auto");  // on 132 SMs: 62 tokens in clusters, 2 in the tail grid
  for (const auto& [merge, tag] : merges) {
    MergeGuard guard(merge);
    SCOPED_TRACE(tag);
    run(wide, 16, wide_steps);
  }
}

// ---- naive attention -----------------------------------------------------------------------------

// Runs naive attention on the CPU and on `gpu_be` (the shared backend unless a test brings its own,
// e.g. one in GemmPrecision::Bf16); `tol` null = tc_tolerance of the output.
void naive_case_on(ops::Backend& gpu_be, std::mt19937& rng, const ops::MlaDims& d, const std::vector<SeqSpec>& seqs,
                   DType cache_dtype, int block_size, const Tolerance* tol, const std::string& tag,
                   WeightKind kv_kind = WeightKind::BF16) {
  auto b = make_twin_batch(rng, seqs, block_size);
  const int64_t heads = d.num_heads, dqk = d.qk_nope_head_dim + d.qk_rope_head_dim, dv = d.v_head_dim;
  Twin cache = make_cache(rng, *b, cache_dtype, d.kv_dim());
  TwinWeight kv_b;
  make_twin_weight(kv_b, rng, kv_kind, heads * (d.qk_nope_head_dim + dv), d.kv_lora_rank);
  Twin q = twin_random(rng, DType::F32, {b->tokens, heads, dqk + 3}).slice(2, 0, dqk);
  Twin out = twin_output(DType::F32, {b->tokens, heads, dv + 5}).slice(2, 0, dv);
  gpu_backend().synchronize();  // the inputs were uploaded on the shared backend's stream
  for (bool g : {false, true}) {
    ops::Backend& be = g ? gpu_be : cpu_backend();
    be.mla_attention_naive(pick(q, g), pick(cache, g), pick(kv_b, g), pick(*b, g), d, pick(out, g));
  }
  gpu_be.synchronize();
  EXPECT_TRUE(check_parity("mla_attention_naive" + tag,
                           fmt::format("{} cache {} kv_b H {} dn/dr/dv/r {}/{}/{}/{} seqs {}", dtype_name(cache_dtype),
                                       weight_kind_name(kv_kind), heads, d.qk_nope_head_dim, d.qk_rope_head_dim, dv,
                                       d.kv_lora_rank, seqs_name(seqs)),
                           out, tol ? *tol : tc_tolerance(out)));
}

void naive_case(std::mt19937& rng, const ops::MlaDims& d, const std::vector<SeqSpec>& seqs, DType cache_dtype,
                int block_size, const Tolerance& tol) {
  naive_case_on(gpu_backend(), rng, d, seqs, cache_dtype, block_size, &tol, "");
}

TEST(GpuParityMla, NaiveTinyDims) {
  std::mt19937 rng(307);
  // Key chunks are 1024 positions: 1100 and 2049 cross one and two chunk edges; prefill rows straddle.
  const std::vector<SeqSpec> seqs = {{37, 1100}, {1, 2049}, {5, 5}, {0, 4}, {19, 40}};
  for (DType dtype : {DType::F32, DType::BF16})
    for (int heads : {1, 12, 20})
      naive_case(rng, mla_dims(heads, 16, 8, 16, 32), seqs, dtype, 16, Tolerance{2e-5, 1e-5,
                 "fp32; keys from each backend's linear (GPU fp32 mode ~1e-6 relative)"});
}

TEST(GpuParityMla, NaiveRealDims) {
  std::mt19937 rng(308);
  // |k|, |v| ~ 4 (r = 512 products of |w| <= 0.5, |c| < 1): 1e-4 absolute is 2.5e-5 of the value scale.
  naive_case(rng, deepseek_mla_dims(16), {{111, 2500}, {1, 1030}, {7, 7}}, DType::BF16, 64,
             Tolerance{1e-4, 1e-5, "fp32; keys from each backend's linear (~1e-6 relative), |v| ~ 4"});
  naive_case(rng, deepseek_mla_dims(16), {{33, 2500}}, DType::F32, 16,
             Tolerance{1e-4, 1e-5, "fp32; keys from each backend's linear (~1e-6 relative), |v| ~ 4"});
}

// GemmPrecision::Bf16 (serving): the tensor-core chunk kernel when d_qk and d_v are multiples of 16.
// Error: the keys and values come from the Bf16 linear (latent rounded to bf16) and are rounded to
// bf16 again, as are q and P; fp32 accumulation and softmax. Each output is a convex mix of values,
// so its error is ~2^-8 of the largest output: tc_tolerance (2e-2 of max|out|).
std::unique_ptr<ops::Backend> make_bf16_backend() {
  auto made = gpu::make_gpu_backend({.gemm_precision = gpu::GemmPrecision::Bf16});
  EXPECT_TRUE(made.is_ok()) << made.status().message();
  return made.is_ok() ? std::move(made).value() : nullptr;
}

TEST(GpuParityMla, NaiveTensorCoreBf16) {
  std::unique_ptr<ops::Backend> be = make_bf16_backend();
  ASSERT_TRUE(be);
  std::mt19937 rng(309);
  // Contexts 1, 63, 1500 with q_len = context (whole prefill) and q_len < context (a later chunk):
  // row tiles are 128 rows, key tiles 64 keys; 63 and 1500 end mid-tile, 130 straddles a row tile.
  const std::vector<std::vector<SeqSpec>> batches = {{{1, 1}, {63, 63}, {1500, 1500}, {0, 5}},
                                                     {{5, 63}, {1, 1500}, {130, 1500}, {1, 1}, {17, 63}}};
  for (int heads : {1, 12, 16})
    for (const ops::MlaDims& d : {deepseek_mla_dims(heads), mla_dims(heads, 32, 16, 32, 64)})
      for (const auto& seqs : batches) naive_case_on(*be, rng, d, seqs, DType::BF16, 64, nullptr, " [bf16 tc]");
}

// Caps the tensor-core path's key chunk at 4096 (its default is 16384 below 32 heads) for a test's
// scope, so cases of a few thousand keys cross chunk edges.
struct NaiveChunkGuard {
  NaiveChunkGuard() { gpu::set_naive_tc_max_key_chunk(4096); }
  ~NaiveChunkGuard() { gpu::set_naive_tc_max_key_chunk(0); }
};

TEST(GpuParityMla, NaiveTensorCoreBf16ChunkEdges) {
  std::unique_ptr<ops::Backend> be = make_bf16_backend();
  ASSERT_TRUE(be);
  std::mt19937 rng(310);
  {
    // 4096-key chunks: 4097 and 8300 cross one and two chunk edges, so the running (max, sum, acc)
    // is carried through the scratch; an F32 cache and block 16.
    NaiveChunkGuard guard;
    naive_case_on(*be, rng, mla_dims(3, 32, 16, 32, 64), {{40, 4200}, {1, 4097}, {200, 8300}, {7, 7}}, DType::F32, 16,
                  nullptr, " [bf16 tc, 4096-key chunks]");
    naive_case_on(*be, rng, deepseek_mla_dims(16), {{33, 4500}, {1, 1}}, DType::BF16, 64, nullptr,
                  " [bf16 tc, 4096-key chunks]");
  }
  // The default 16384-key chunk: 16385 and 16500 cross its edge.
  naive_case_on(*be, rng, mla_dims(2, 32, 16, 32, 64), {{1, 16385}, {20, 16500}, {5, 5}}, DType::BF16, 64, nullptr,
                " [bf16 tc]");
}

// The chunk's bf16 keys come from per-head GEMMs with bf16 output (linear_heads_bf16) for Dense BF16,
// FP8 and INT4 kv_b_proj (the weight rounded to bf16 first), and from linear's F32 output plus
// naive_tc_pack for anything else (an F32 weight here). Each format at DeepSeek dims (the gather's
// 16-byte rope copies) and at small dims where d_r = 16 / d_n = 32 and where d_r = 12 (scalar rope
// copies), so both producers of the packed chunk meet the CPU reference.
TEST(GpuParityMla, NaiveTensorCoreBf16WeightFormats) {
  std::unique_ptr<ops::Backend> be = make_bf16_backend();
  ASSERT_TRUE(be);
  std::mt19937 rng(311);
  for (WeightKind kind : {WeightKind::BF16, WeightKind::FP8, WeightKind::INT4_BF16, WeightKind::INT4_F32,
                          WeightKind::F32}) {
    naive_case_on(*be, rng, deepseek_mla_dims(16), {{70, 4200}, {5, 5}}, DType::BF16, 64, nullptr, " [bf16 tc]",
                  kind);
    naive_case_on(*be, rng, mla_dims(3, 32, 16, 32, 64), {{40, 300}, {1, 1}}, DType::F32, 16, nullptr,
                  " [bf16 tc]", kind);
    naive_case_on(*be, rng, mla_dims(2, 36, 12, 32, 64), {{20, 100}}, DType::BF16, 16, nullptr, " [bf16 tc]", kind);
  }
}

// d_qk 192 / d_v 128 (DeepSeek-V3 / Kimi K2) run the fixed-dims kernel: 128-row CTAs of 4 warps x 32
// rows, 64-key tiles, masks only on diagonal tiles, row sums by a ones MMA. Cases straddle every edge:
// q_len 129 / 257 (one row past a CTA), 50 (ends inside warp 1's second m-tile), 65 (warp 2 holds one
// row), kv 64 (exact tile), 191 (partial tile), causal offsets (q_len < kv_len), and several 4096-key
// chunks: 600 / 4400 puts the diagonal across the chunk edge (row tile 0 sees no key of the second
// chunk and only normalizes), 33 / 8257 ends on a 65-key chunk, 1 / 4097 on a 1-key chunk. d_v 64 with
// d_qk 192 must take the runtime-dims kernel.
TEST(GpuParityMla, NaiveTensorCoreBf16FixedDims) {
  std::unique_ptr<ops::Backend> be = make_bf16_backend();
  ASSERT_TRUE(be);
  NaiveChunkGuard guard;  // the chunked cases below assume 4096-key chunks
  std::mt19937 rng(312);
  for (int heads : {1, 5})
    naive_case_on(*be, rng, deepseek_mla_dims(heads),
                  {{129, 129}, {50, 191}, {65, 130}, {1, 64}, {0, 3}, {127, 1000}, {257, 257}}, DType::BF16, 64,
                  nullptr, " [bf16 tc fixed]");
  naive_case_on(*be, rng, deepseek_mla_dims(2), {{600, 4400}, {33, 8257}, {1, 4097}}, DType::BF16, 64, nullptr,
                " [bf16 tc fixed, chunks]");
  naive_case_on(*be, rng, deepseek_mla_dims(3), {{200, 4200}, {7, 7}}, DType::F32, 16, nullptr, " [bf16 tc fixed, f32 cache]");
  naive_case_on(*be, rng, mla_dims(2, 128, 64, 64, 128), {{129, 300}, {1, 65}}, DType::BF16, 64, nullptr,
                " [bf16 tc generic dv 64]");
}

// d_qk 192 / d_v 128 through each forced tensor-core kernel (gpu_mla_naive_sm90a.h): the mma.sync
// fixed-dims kernel everywhere, the wgmma one where the device is compute capability 9.0 (else it is
// skipped). Wgmma tiles: 128-row CTAs of two 64-row warpgroups, 128-key tiles. Cases: q_len 64
// / 65 (warpgroup 1 empty / one row), 129 and 257 (one row past a CTA), 1 / 128 and 1 / 129 (exact key
// tile and one key past it), 50 / 191 (partial tiles, causal offset), 127 / 1000, 0 / 3, 16 heads at
// 300 / 2000; chunked: 600 / 4400 (diagonal across the 4096-key chunk edge), 33 / 8257 (65-key last
// chunk), 1 / 4097 (1-key chunk), and an F32 cache. Tolerance: tc_tolerance, as the other bf16 cases.
struct NaivePathGuard {
  explicit NaivePathGuard(gpu::NaivePrefillPath p) { gpu::set_naive_prefill_path(p); }
  ~NaivePathGuard() { gpu::set_naive_prefill_path(gpu::NaivePrefillPath::Auto); }
};

TEST(GpuParityMla, NaiveFixedDimsEachTensorCorePath) {
  std::unique_ptr<ops::Backend> be = make_bf16_backend();
  ASSERT_TRUE(be);
  for (gpu::NaivePrefillPath path :
       {gpu::NaivePrefillPath::MmaSync, gpu::NaivePrefillPath::Wgmma}) {
    const bool wgmma = path != gpu::NaivePrefillPath::MmaSync;
    if (wgmma && !gpu::naive_sm90a_supported(192, 128)) {
      std::printf("[ skip ] wgmma naive paths: device is not compute capability 9.0\n");
      continue;
    }
    NaivePathGuard guard(path);
    NaiveChunkGuard chunks;  // " chunks": 4096-key chunks
    const std::string tag = wgmma ? " [bf16 wgmma]" : " [bf16 mma.sync]";
    std::mt19937 rng(313);
    for (int heads : {1, 5})
      naive_case_on(*be, rng, deepseek_mla_dims(heads),
                    {{64, 64}, {65, 65}, {129, 129}, {1, 128}, {1, 129}, {50, 191}, {127, 1000}, {0, 3}, {257, 257}},
                    DType::BF16, 64, nullptr, tag);
    naive_case_on(*be, rng, deepseek_mla_dims(16), {{300, 2000}, {1, 77}}, DType::BF16, 64, nullptr, tag + " 16 heads");
    naive_case_on(*be, rng, deepseek_mla_dims(2), {{600, 4400}, {33, 8257}, {1, 4097}}, DType::BF16, 64, nullptr,
                  tag + " chunks");
    naive_case_on(*be, rng, deepseek_mla_dims(3), {{200, 4200}, {7, 7}}, DType::F32, 16, nullptr, tag + " f32 cache");
  }
}

TEST(GpuParityMla, NaiveBf16FallbackOddDims) {
  std::unique_ptr<ops::Backend> be = make_bf16_backend();
  ASSERT_TRUE(be);
  std::mt19937 rng(311);
  // d_qk = 25 is no multiple of 16: the fp32 chunk kernel runs, over keys from the Bf16 linear.
  for (int heads : {1, 12})
    naive_case_on(*be, rng, mla_dims(heads, 16, 9, 16, 32), {{37, 1100}, {1, 40}, {19, 19}}, DType::BF16, 16, nullptr,
                  " [bf16 fallback]");
}

}  // namespace
}  // namespace mla::test
