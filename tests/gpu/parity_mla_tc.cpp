// Direct parity of the tensor-core MLA decode kernel (gpu_mla_decode_tc) against the CPU absorbed
// attention over the same BF16 paged cache, bypassing the dispatcher: head counts 16/32/128, q_len 1
// and 3 (causal rows), contexts on both sides of the 64-key tile edge, block sizes 16 and 64, strided
// q/out views, and both the split-KV (workspace + combine) and the single-split launch.
#include <algorithm>
#include <cmath>

#include "backend/gpu/gpu_mla_decode_tc.h"
#include "gpu/parity.h"

namespace mla::test {
namespace {

// One call: batch arrays on both sides, a random BF16 cache, random q, poisoned out.
void tc_case(std::mt19937& rng, int heads, const std::vector<SeqSpec>& seqs, int block_size, bool strided) {
  auto b = make_twin_batch(rng, seqs, block_size);
  const int64_t n = int64_t(seqs.size()), tokens = b->tokens, num_blocks = b->num_blocks;

  ops::MlaDims d;
  d.num_heads = heads;
  d.qk_nope_head_dim = 128;
  d.qk_rope_head_dim = 64;
  d.v_head_dim = 128;
  d.kv_lora_rank = 512;
  d.softmax_scale = 1.0f / std::sqrt(192.0f);
  const int64_t kv_dim = d.kv_dim(), r = d.kv_lora_rank, pad = strided ? 8 : 0;
  Twin cache = twin_random(rng, DType::BF16, {num_blocks, block_size, kv_dim});
  Twin q = twin_random(rng, DType::F32, {tokens, heads, kv_dim + pad}).slice(2, 0, kv_dim);
  Twin out = twin_output(DType::F32, {tokens, heads, r + pad}).slice(2, 0, r);

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
  a.kv_lora_rank = int(r);
  a.rope_dim = d.qk_rope_head_dim;
  a.softmax_scale = d.softmax_scale;
  a.out = out.gpu.as<float>();
  a.out_row_stride = out.gpu.stride[0];
  a.out_head_stride = out.gpu.stride[1];
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
  std::string name = fmt::format("H {} bs {} {} ws {} seqs", heads, block_size, strided ? "strided" : "dense", ws_bytes);
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

}  // namespace
}  // namespace mla::test
