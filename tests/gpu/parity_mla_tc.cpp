// Direct parity of the tensor-core MLA decode kernel (gpu_mla_decode_tc) against the CPU absorbed
// attention over the same BF16 paged cache, bypassing the dispatcher: head counts 16/32/128, q_len 1
// and 3 (causal rows), contexts on both sides of the 64-key tile edge, block sizes 16 and 64, strided
// q/out views, and both the split-KV (workspace + combine) and the single-split launch.
#include <algorithm>
#include <cmath>

#include "backend/gpu/gpu_mla_decode_sm90a.h"
#include "backend/gpu/gpu_mla_decode_tc.h"
#include "gpu/parity.h"

namespace mla::test {
namespace {

// One call: batch arrays on both sides, a random BF16 cache (NaN past each context), random q, poisoned
// out. q_pad >= 0 overrides q's and out's row padding (an odd pad leaves rows 4-byte aligned only:
// the kernels' scalar q staging and output stores). live > 0: q and out hold only the first `live` of
// the `heads` the kernel computes (MlaDecodeTcArgs::heads_live), so a store past them lands in the
// next row's heads (or past the buffer) and fails the comparison or the stray-write check.
void tc_case(std::mt19937& rng, int heads, const std::vector<SeqSpec>& seqs, int block_size, bool strided,
             int q_pad = -1, gpu::MlaDecodeKernel kernel = gpu::MlaDecodeKernel::Auto, int live = 0) {
  auto b = make_twin_batch(rng, seqs, block_size);
  const int64_t n = int64_t(seqs.size()), tokens = b->tokens, num_blocks = b->num_blocks;

  const int present = live > 0 ? live : heads;
  const ops::MlaDims d = deepseek_mla_dims(present);
  const int64_t kv_dim = d.kv_dim(), r = d.kv_lora_rank, pad = strided ? 8 : 0;
  Twin cache = twin_random(rng, DType::BF16, {num_blocks, block_size, kv_dim});
  // The rows past each sequence's context (the tail of its last block) hold NaN: a kernel may load
  // them only as zeros (P is 0 there, and 0 x NaN would poison P V).
  uint16_t* rows = cache.cpu.as<uint16_t>();
  for (size_t s = 0; s < seqs.size(); ++s) {
    const int64_t owned = int64_t(b->block_indptr[s + 1] - b->block_indptr[s]) * block_size;
    for (int64_t pos = seqs[s].kv_len; pos < owned; ++pos)
      std::fill_n(rows + b->slot_of(s, pos) * kv_dim, kv_dim, uint16_t(0x7FC0));
  }
  sync_to_device(cache);
  Twin q = twin_random(rng, DType::F32, {tokens, present, kv_dim + (q_pad >= 0 ? q_pad : pad)}).slice(2, 0, kv_dim);
  Twin out = twin_output(DType::F32, {tokens, present, r + (q_pad >= 0 ? q_pad : pad)}).slice(2, 0, r);

  cpu_backend().mla_attention_absorbed(q.cpu, cache.cpu, b->cpu, d, out.cpu);

  gpu::MlaDecodeTcArgs a;
  a.q = q.gpu.as<const float>();
  a.q_row_stride = q.gpu.stride[0];
  a.q_head_stride = q.gpu.stride[1];
  a.cache = cache.gpu.as<const uint16_t>();
  a.block_size = block_size;
  a.q_indptr = b->q_indptr_t.gpu.as<const int32_t>();
  a.kv_lens = b->kv_lens_t.gpu.as<const int32_t>();
  a.block_indptr = b->block_indptr_t.gpu.as<const int32_t>();
  a.block_ids = b->block_ids_t.gpu.as<const int32_t>();
  a.num_seqs = int(n);
  a.num_tokens = int(tokens);
  a.num_heads = heads;
  a.heads_live = live;
  a.kv_lora_rank = int(r);
  a.rope_dim = d.qk_rope_head_dim;
  a.softmax_scale = d.softmax_scale;
  a.out = out.gpu.as<float>();
  a.out_row_stride = out.gpu.stride[0];
  a.out_head_stride = out.gpu.stride[1];
  a.kernel = kernel;
  const size_t ws_bytes = gpu::mla_decode_tc_workspace_bytes(a);
  void* ws = nullptr;
  if (ws_bytes > 0) MLA_GPU_CHECK(gpu::malloc(&ws, ws_bytes));
  a.workspace = ws;
  gpu_backend().synchronize();  // inputs uploaded
  gpu::mla_decode_tc(a, nullptr);
  MLA_GPU_CHECK(gpu::stream_sync(nullptr));
  if (ws) MLA_GPU_CHECK(gpu::free(ws));

  // q and P are rounded to bf16 (rel. 2^-9 each) before fp32-accumulating MMAs; every output is a
  // convex mix of cache values, so its error is a few 2^-9 of max|out| (measured <= 2e-3 at max 1).
  float big = 0.0f;
  for (float v : cpu_values(out)) big = std::max(big, std::fabs(v));
  std::string name = fmt::format("H {} live {} bs {} {} q_pad {} kernel {} ws {} seqs", heads, live, block_size,
                                 strided ? "strided" : "dense", q_pad, int(kernel), ws_bytes);
  for (const SeqSpec& s : seqs) name += fmt::format(" {}/{}", s.q_len, s.kv_len);
  EXPECT_TRUE(check_parity("mla_decode_tc", name, out,
                           Tolerance{8e-3 * double(big), 0, "bf16 q and P in fp32-accumulating MMAs: 2^-7 of max|out|"}));
}

bool tc_available() { return gpu::mla_decode_tc_supported(16, 512, 64); }

TEST(GpuParityMlaTc, HeadsQLensContexts) {
  if (!tc_available()) GTEST_SKIP() << "no tensor-core MLA decode on this device";
  std::mt19937 rng(401);
  for (int heads : {16, 32, 128})
    for (int q_len : {1, 3})
      for (int block_size : {16, 64}) {
        // Contexts 1 (or q_len), 63, 64, 65 straddle the 64-key tile; 4097 is 64 tiles plus one key.
        std::vector<SeqSpec> seqs;
        for (int ctx : {q_len, 63, 64, 65, 4097}) seqs.push_back({q_len, ctx});
        tc_case(rng, heads, seqs, block_size, block_size == 16);
      }
}

TEST(GpuParityMlaTc, SingleTokenManySplits) {
  if (!tc_available()) GTEST_SKIP() << "no tensor-core MLA decode on this device";
  std::mt19937 rng(402);
  // One token: the most splits; ctx 1 leaves all but one split empty.
  for (int heads : {16, 128})
    for (int ctx : {1, 65, 4097}) tc_case(rng, heads, {{1, ctx}}, 64, false);
}

TEST(GpuParityMlaTc, WideBatchAndEmptySequences) {
  if (!tc_available()) GTEST_SKIP() << "no tensor-core MLA decode on this device";
  std::mt19937 rng(403);
  // 60 tokens x 8 head tiles fill the GPU: one split, the kernel writes out directly (ws 0 on H200).
  std::vector<SeqSpec> wide;
  for (int i = 0; i < 40; ++i) wide.push_back({1 + i % 2, 2 + (i * 97) % 700});
  tc_case(rng, 128, wide, 64, true);
  // Sequences with no query rows sit between the ones that have them.
  tc_case(rng, 16, {{0, 5}, {2, 70}, {0, 1}, {1, 129}, {3, 3}}, 16, true);
}

// The splits a token uses follow its context on the device (>= 2 tiles each, at most the grid's):
// batch 1 at ctx 2 / 128 (one split in use: the kernel writes out, the combine skips the token), 129
// (3 tiles: 2 splits), 575 / 1100 (9 tiles: 5 splits; 18: 9) and 4033 (64 tiles over all the grid's
// splits, some of them empty). Spec-verify rows of one sequence straddle those edges: {4, 130}
// has rows of 2 and 3 tiles (1 and 2 splits), {3, 1100} and {5, 4100} rows of 18 and 64-65 tiles.
// The mma.sync kernel streams 32-key units: ctx 32 / 96 end exactly on a unit, 33 / 97 one key into
// the next (a unit with one visible row, the rest zero-filled), and a row's last tile may hold a unit
// wholly past its limit (1100 = 17 tiles + 12 keys), which is not loaded.
TEST(GpuParityMlaTc, AdaptiveSplitsShortAndLongContexts) {
  if (!tc_available()) GTEST_SKIP() << "no tensor-core MLA decode on this device";
  std::mt19937 rng(404);
  for (int heads : {16, 128}) {
    for (int ctx : {2, 32, 33, 96, 97, 128, 129, 575, 1100, 4033}) tc_case(rng, heads, {{1, ctx}}, 64, false);
    for (const SeqSpec& s : {SeqSpec{4, 130}, SeqSpec{3, 1100}, SeqSpec{5, 4100}}) tc_case(rng, heads, {s}, 16, true);
    // Two sequences of different lengths: each token picks its own split count in the same grid.
    tc_case(rng, heads, {{1, 1100}, {2, 127}}, 64, true);
  }
}

// Each geometry of the mma.sync kernel's plan (plan_for in gpu_mla_decode_tc.cu; the mma.sync kernel
// forced, since Auto takes wgmma for some of these shapes on sm_90). On a 132-SM H200:
//   - 40 tokens x 128 heads: 32-head CTAs (40 x 4 = 160 head tiles fill the GPU unsplit), 64-key tiles;
//   - 2 tokens x 128 heads: 16-head CTAs, 64-key tiles, one CTA per SM (16 tiles < a quarter wave);
//   - 48 tokens x 16 heads: 16-head CTAs on 32-key units, two CTAs per SM (48 >= a quarter wave).
// Contexts cross the 32- and 64-key edges and leave some rows with a unit wholly past their limit.
TEST(GpuParityMlaTc, EveryMmaSyncGeometry) {
  if (!tc_available()) GTEST_SKIP() << "no tensor-core MLA decode on this device";
  std::mt19937 rng(405);
  auto rows = [](int n) {
    std::vector<SeqSpec> v;
    for (int i = 0; i < n; ++i) v.push_back({1, 1 + (i * 97) % 700});
    return v;
  };
  const gpu::MlaDecodeKernel mma = gpu::MlaDecodeKernel::MmaSync;
  tc_case(rng, 128, rows(40), 64, false, -1, mma);
  tc_case(rng, 128, {{1, 1100}, {1, 97}}, 16, true, -1, mma);
  tc_case(rng, 16, rows(48), 16, true, -1, mma);
}

// A partial last head tile taken by the mma.sync kernel itself (heads_live; the dispatcher's path for
// 12 or 8 heads per rank): 12, 8 and 1 of 16 heads with one split (direct stores) and many (the
// combine kernel), dense and unaligned rows (the scalar q staging); 20 of 32 heads on 32-head CTAs
// (mma.sync forced; 140 tokens x 1 tile of 32 >= the SMs of an H100 / H200, so plan_for takes that
// geometry: the CTA's second m16 tile is partial) and on 16-head CTAs (the second tile partial);
// 120 of 128 at a batch where Auto would take wgmma with every head present (never with a partial
// tile). The cluster and ticket merges meet a partial tile in the dispatcher tests (12 heads,
// GpuParityMla).
TEST(GpuParityMlaTc, PartialHeadTile) {
  if (!tc_available()) GTEST_SKIP() << "no tensor-core MLA decode on this device";
  std::mt19937 rng(408);
  const gpu::MlaDecodeKernel automatic = gpu::MlaDecodeKernel::Auto, mma = gpu::MlaDecodeKernel::MmaSync;
  for (int live : {12, 8, 1}) {
    tc_case(rng, 16, {{1, 65}}, 64, false, -1, automatic, live);
    tc_case(rng, 16, {{1, 1100}, {3, 130}, {0, 9}, {1, 1}}, 16, true, -1, automatic, live);
    tc_case(rng, 16, {{1, 4097}}, 64, false, 3, automatic, live);
  }
  std::vector<SeqSpec> many;
  for (int i = 0; i < 140; ++i) many.push_back({1, 1 + (i * 97) % 700});
  tc_case(rng, 32, many, 64, true, -1, mma, 20);
  tc_case(rng, 32, {{1, 1100}, {2, 127}}, 64, true, -1, automatic, 20);
  // 70 tokens x 2 tiles of 64 heads would take the wgmma kernel with all 128 heads present.
  std::vector<SeqSpec> seventy;
  for (int i = 0; i < 70; ++i) seventy.push_back({1, 1 + (i * 131) % 600});
  tc_case(rng, 128, seventy, 16, true, -1, automatic, 120);
}

// q and out rows that are not 16- / 8-byte aligned (row pad 3 floats) take the scalar q staging loop and
// output stores; same values.
TEST(GpuParityMlaTc, UnalignedQRows) {
  if (!tc_available()) GTEST_SKIP() << "no tensor-core MLA decode on this device";
  std::mt19937 rng(405);
  for (int heads : {16, 32}) tc_case(rng, heads, {{1, 1100}, {3, 65}, {1, 1}}, 64, true, 3);
}

}  // namespace
}  // namespace mla::test

// ---- the sm_90a wgmma kernel (gpu_mla_decode_sm90a), forced, and the mma.sync kernel forced beside it --
namespace mla::test {
namespace {

bool wgmma_available() { return gpu::mla_decode_sm90a_supported(64, 512, 64); }

// 64 and 128 heads (1 and 2 head tiles per token), batch 1 (the most splits: partials + combine) and
// 7 (one wave: mostly direct writes), contexts on both sides of the 64-key tile edge, a long one
// with one key past a tile, spec-verify rows (q_len 3 at kv_len 130: rows of 3 tiles, the last one
// partly masked per row), shuffled block tables of 16- and 64-position blocks, strided q/out views;
// 192 and 256 heads (3 and 4 head tiles per token) on a few of those shapes.
void wgmma_cases(std::mt19937& rng, gpu::MlaDecodeKernel wg) {
  for (int heads : {64, 128}) {
    for (int ctx : {1, 63, 64, 65, 1100, 4097}) tc_case(rng, heads, {{1, ctx}}, 64, false, -1, wg);
    std::vector<SeqSpec> seven;
    for (int ctx : {1, 63, 64, 65, 1100, 4097, 130}) seven.push_back({1, ctx});
    tc_case(rng, heads, seven, 16, true, -1, wg);
    tc_case(rng, heads, {{3, 130}}, 16, true, -1, wg);
    tc_case(rng, heads, {{3, 130}, {1, 4097}, {2, 65}, {0, 9}, {1, 1}}, 64, true, -1, wg);
    // Unaligned q and out rows: the scalar q staging loop and output stores.
    tc_case(rng, heads, {{1, 1100}, {3, 65}}, 64, true, 3, wg);
  }
  for (int heads : {192, 256}) {
    tc_case(rng, heads, {{1, 4097}}, 64, false, -1, wg);
    tc_case(rng, heads, {{3, 130}, {1, 1100}, {2, 65}, {0, 9}, {1, 1}}, 16, true, -1, wg);
  }
  // Batch 64 x 128 heads: one split, direct writes (the benchmark's shape, shorter contexts).
  std::vector<SeqSpec> wide;
  for (int i = 0; i < 64; ++i) wide.push_back({1, 1 + (i * 131) % 600});
  tc_case(rng, 128, wide, 64, false, -1, wg);
  // 66 x 128 heads = 132 CTAs: one split, 16-21 tiles per CTA (many reuses of each barrier/buffer).
  std::vector<SeqSpec> long_rows;
  for (int i = 0; i < 66; ++i) long_rows.push_back({1, 1000 + (i * 53) % 300});
  tc_case(rng, 128, long_rows, 64, false, -1, wg);
}

TEST(GpuParityMlaTc, WgmmaKernel) {
  if (!wgmma_available()) GTEST_SKIP() << "no sm_90a wgmma MLA decode on this device";
  std::mt19937 rng(406);
  wgmma_cases(rng, gpu::MlaDecodeKernel::Wgmma);
  // The same shapes through the mma.sync kernel, forced (Auto picks wgmma on sm_90).
  for (int ctx : {1, 65, 4097}) tc_case(rng, 128, {{1, ctx}}, 64, false, -1, gpu::MlaDecodeKernel::MmaSync);
  tc_case(rng, 64, {{3, 130}, {1, 1100}}, 16, true, -1, gpu::MlaDecodeKernel::MmaSync);
}

// Through the dispatcher (GpuBackend::mla_attention_absorbed) with the wgmma kernel forced: head
// counts that are not a multiple of 64 are zero-padded to it (16 -> 64, 100 -> 128) and sliced back.
TEST(GpuParityMlaTc, WgmmaThroughDispatcher) {
  if (!wgmma_available()) GTEST_SKIP() << "no sm_90a wgmma MLA decode on this device";
  std::mt19937 rng(407);
  gpu::set_mla_decode_kernel(gpu_backend(), gpu::MlaDecodeKernel::Wgmma);
  for (int heads : {16, 100, 128}) {
    const std::vector<SeqSpec> seqs = {{1, 1100}, {3, 130}, {1, 64}};
    auto b = make_twin_batch(rng, seqs, 16);
    const ops::MlaDims d = deepseek_mla_dims(heads);
    const int64_t kv_dim = d.kv_dim(), r = d.kv_lora_rank;
    Twin cache = twin_random(rng, DType::BF16, {b->num_blocks, 16, kv_dim});
    Twin q = twin_random(rng, DType::F32, {b->tokens, heads, kv_dim});
    Twin out = twin_output(DType::F32, {b->tokens, heads, r + 8}).slice(2, 0, r);
    run_both([&](ops::Backend& be, bool on_gpu) {
      be.mla_attention_absorbed(pick(q, on_gpu), pick(cache, on_gpu), pick(*b, on_gpu), d, pick(out, on_gpu));
    });
    float big = 0.0f;
    for (float v : cpu_values(out)) big = std::max(big, std::fabs(v));
    EXPECT_TRUE(check_parity("mla_attention_absorbed (wgmma forced)",
                             fmt::format("H {} seqs {}", heads, seqs_name(seqs)), out,
                             Tolerance{8e-3 * double(big), 0, "bf16 q and P in fp32-accumulating MMAs: 2^-7 of max|out|"}));
  }
  gpu::set_mla_decode_kernel(gpu_backend(), gpu::MlaDecodeKernel::Auto);
}

}  // namespace
}  // namespace mla::test
