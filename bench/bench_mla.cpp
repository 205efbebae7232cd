// MLA attention benchmarks through the Backend interface: absorbed decode over a BF16 paged cache
// (memory-bound at 16 heads, compute-bound at 128) and naive prefill (decompress the latents, then
// causal attention over per-head K/V). Geometry: DeepSeek-V3 (r 512, rope 64, d_n 128, d_v 128).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "backend/gpu/gpu_backend.h"
#include "backend/gpu/gpu_mla_decode_sm90a.h"
#include "backend/gpu/gpu_mla_decode_tc.h"
#include "backend/gpu/gpu_mla_naive_sm90a.h"
#include "bench_gpu.h"

namespace mla::bench {

namespace {

constexpr int kRank = 512, kRope = 64, kNope = 128, kV = 128, kKvDim = kRank + kRope, kBlock = 64;

ops::MlaDims dsv3_dims(int heads) {
  return ops::MlaDims{heads, kNope, kRope, kV, kRank, 1.0f / std::sqrt(float(kNope + kRope))};
}

// Sequences of `q_len` new tokens each with `ctx` cached tokens, blocks scattered over the cache
// (a shuffled permutation, as a block pool hands them out after some churn). pool_blocks > 0: every
// block id is taken modulo pool_blocks, so the sequences share a cache of that many blocks (a probe
// whose cache stays in L2; its contents are read-only here).
struct PagedBatch {
  std::vector<int32_t> q_indptr, kv_lens, block_indptr, block_ids, slots;
  DevTensor d_q_indptr, d_kv_lens, d_block_indptr, d_block_ids, d_slots, cache;
  ops::AttentionBatch batch;
};
void make_paged_batch(PagedBatch& p, ops::Backend& be, int seqs, int ctx, int q_len, uint64_t seed,
                      int pool_blocks = 0) {
  const int bps = (ctx + kBlock - 1) / kBlock;
  p.block_ids.resize(size_t(seqs) * size_t(bps));
  std::iota(p.block_ids.begin(), p.block_ids.end(), 0);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::shuffle(p.block_ids.begin(), p.block_ids.end(), rng);
  const int64_t cache_blocks = pool_blocks > 0 ? pool_blocks : int64_t(seqs) * bps;
  for (int32_t& id : p.block_ids) id = int32_t(id % cache_blocks);
  p.q_indptr.clear(), p.kv_lens.clear(), p.block_indptr.clear(), p.slots.clear();
  for (int s = 0; s <= seqs; ++s) {
    p.q_indptr.push_back(s * q_len);
    p.block_indptr.push_back(s * bps);
  }
  for (int s = 0; s < seqs; ++s) {
    p.kv_lens.push_back(ctx);
    for (int pos = ctx - q_len; pos < ctx; ++pos)
      p.slots.push_back(p.block_ids[size_t(s * bps + pos / kBlock)] * kBlock + pos % kBlock);
  }
  p.d_q_indptr = dev_from_host(be, p.q_indptr);
  p.d_kv_lens = dev_from_host(be, p.kv_lens);
  p.d_block_indptr = dev_from_host(be, p.block_indptr);
  p.d_block_ids = dev_from_host(be, p.block_ids);
  p.d_slots = dev_from_host(be, p.slots);
  // Random latents in [-1, 1): the values a normalized c_kv and rotated k_rope take.
  p.cache = dev_tensor(be, DType::BF16, {cache_blocks, kBlock, kKvDim});
  fill_random(p.cache.view, seed, -1, 1, backend_stream(be));
  ops::AttentionBatch& b = p.batch;
  b.num_seqs = seqs;
  b.block_size = kBlock;
  b.q_indptr = p.d_q_indptr.view;
  b.kv_lens = p.d_kv_lens.view;
  b.block_indptr = p.d_block_indptr.view;
  b.block_ids = p.d_block_ids.view;
  b.slot_mapping = p.d_slots.view;
  b.host_q_indptr = p.q_indptr;
  b.host_kv_lens = p.kv_lens;
  b.host_block_indptr = p.block_indptr;
  b.host_block_ids = p.block_ids;
}

// Times backend.mla_attention_absorbed over `pb` (`tokens` query rows, DeepSeek dims with `heads`
// heads) on fresh random q (seed `seed`); `warm_runs` more untimed runs of the whole plan first. Each
// timed rep makes `calls_per_rep` back-to-back calls (the caller divides). profile_call: one more
// call after the timing, inside a profiler range (--profile-calls).
Timing time_absorbed(ops::Backend& be, gpu::Stream s, const PagedBatch& pb, int tokens, int heads, uint64_t seed,
                     const TimingPlan& plan, int warm_runs = 0, int calls_per_rep = 1, bool profile_call = false) {
  const ops::MlaDims dims = dsv3_dims(heads);
  DevTensor q = dev_tensor(be, DType::F32, {tokens, heads, kKvDim});
  DevTensor out = dev_tensor(be, DType::F32, {tokens, heads, kRank});
  fill_random(q.view, seed, -1, 1, s);
  auto call = [&](int) {
    for (int i = 0; i < calls_per_rep; ++i) be.mla_attention_absorbed(q.view, pb.cache.view, pb.batch, dims, out.view);
  };
  for (int i = 0; i < warm_runs; ++i) time_on_stream(s, plan, call);
  const Timing t = time_on_stream(s, plan, call);
  if (profile_call)
    profile_once(be, [&] { be.mla_attention_absorbed(q.view, pb.cache.view, pb.batch, dims, out.view); });
  return t;
}

}  // namespace

// Napkin math, per decode token and head count H over ctx cached tokens:
//   cache bytes  = ctx * 576 * 2 (BF16), shared by all H heads (MQA over the latent);
//   FLOPs        = 2 * H * ctx * (576 + 512)  (q.k over 576, p.v over 512).
// Batch 64 x ctx 4096: 302 MB of cache per call (> L2, no rotation needed); at 4.3 TB/s ~70 us.
// Arithmetic intensity = H * 1088 / 576 FLOP/B: 16 heads ~30 (memory-bound), 128 heads ~242
// (compute-bound on H200: ~790 TFLOP/s / 4.3 TB/s ~ 184).
void bench_mla_decode(Report& report, const Ceilings& c, const BenchOptions& o) {
  auto be = make_bench_backend(true);
  const gpu::Stream s = backend_stream(*be);
  const int seqs = o.decode_batch, ctx = o.quick ? 1024 : 4096;
  PagedBatch pb;
  make_paged_batch(pb, *be, seqs, ctx, 1, 11);
  const double cache_bytes = double(seqs) * ctx * kKvDim * 2.0;
  // 128 heads twice more with the attention kernel forced: the sm_90a wgmma kernel (what Auto runs on
  // an H200) and the mma.sync kernel it replaced (0 = Auto, 1 = MmaSync, 2 = Wgmma).
  // 16 heads also with the split partials merged in clusters for every token (at batch 64 on 132 SMs a
  // second wave: 64 clusters of 4, 62 resident), by the last CTA per tile (tickets) and by the
  // separate combine kernel (the baselines of what Auto takes on an H200: clusters, with a tail grid
  // on tickets for the tokens whose clusters are not resident at once).
  using Merge = gpu::MlaDecodeMerge;
  struct Run {
    int heads, forced;
    Merge merge;
  };
  const Run runs[] = {{16, 0, Merge::Auto},  {16, 0, Merge::Cluster}, {16, 0, Merge::Tickets}, {16, 0, Merge::Kernel},
                      {16, 2, Merge::Auto},  {128, 0, Merge::Auto},   {128, 1, Merge::Auto},    {128, 2, Merge::Auto},
                      {12, 0, Merge::Auto},  {8, 0, Merge::Auto}};
  // Indexed by MlaDecodeMerge.
  constexpr const char* kMergeTag[] = {"", " [cluster merge]", " [clusters + tail grid]", " [ticket merge]",
                                       " [combine kernel]"};
  constexpr const char* kMergeKey[] = {"", " cluster", " cluster+tail", " tickets", " combine"};
  constexpr gpu::MlaDecodeKernel kForced[] = {gpu::MlaDecodeKernel::Auto, gpu::MlaDecodeKernel::MmaSync,
                                              gpu::MlaDecodeKernel::Wgmma};
  constexpr const char* kForcedTag[] = {"", " mma.sync", " wgmma"};
  TimingPlan plan;
  plan.max_reps = o.quick ? 20 : 200;
  plan.budget_ms = o.quick ? 100 : 1000;
  bool first_case = true;
  for (const auto& [heads, forced, merge] : runs) {
    const bool auto_merge = merge == Merge::Auto;  // the row the target applies to
    const auto kernel = kForced[forced];
    // Forced wgmma pads the heads to its 64-head tile.
    if (forced >= 2 && !gpu::mla_decode_sm90a_supported((heads + 63) / 64 * 64, kRank, kRope)) continue;
    if (merge == Merge::Cluster && !gpu::mla_decode_cluster_merge_supported()) continue;
    gpu::set_mla_decode_kernel(*be, kernel);
    gpu::set_mla_decode_merge(*be, merge);
    // The first case once more, unreported, before its timed run: its first run after the ceilings
    // read 56-71% in four processes on the same build (2026-12-01) while later rows moved by ~1%.
    const Timing t =
        time_absorbed(*be, s, pb, seqs, heads, 100 + uint64_t(heads), plan, first_case ? 1 : 0, 1, o.profile_calls);
    first_case = false;
    const double sec = t.median_ms * 1e-3;
    const double gbps = cache_bytes / sec / 1e9;
    const double tflops = double(seqs) * 2.0 * heads * ctx * (kKvDim + kRank) / sec / 1e12;
    gpu::set_mla_decode_kernel(*be, gpu::MlaDecodeKernel::Auto);
    gpu::set_mla_decode_merge(*be, Merge::Auto);
    const std::string name = fmt::format("absorbed decode, batch {} x ctx {}, {} heads{}{}{}", seqs, ctx, heads,
                                         heads % 16 ? " (a partial 16-head tile)" : "",
                                         forced ? fmt::format(" [{} forced]", kForcedTag[forced] + 1) : "",
                                         kMergeTag[int(merge)]);
    if (heads == 128)
      report.add({"mla_decode", name, t.median_ms, tflops, "TFLOP/s", c.bf16_tflops, "bf16 GEMM", forced ? 0 : 0.6,
                  fmt::format("cache {:.0f} GB/s", gbps),
                  fmt::format("{}h{}", heads, kForcedTag[forced])});
    else
      report.add({"mla_decode", name, t.median_ms, gbps, "GB/s", c.copy_gbps, "copy BW",
                  heads == 16 && !forced && auto_merge ? 0.8 : 0, fmt::format("{:.1f} TFLOP/s; cache bytes only", tflops),
                  fmt::format("{}h{}{}", heads, kForcedTag[forced], kMergeKey[int(merge)])});
  }
  // The 16-head row once more with 16 calls between one pair of events (per-call average): the
  // difference to the per-call row is what one event pair and its kernel boundary cost.
  {
    constexpr int kCalls = 16;
    TimingPlan many = plan;
    many.max_reps = o.quick ? 4 : 24;
    const Timing t = time_absorbed(*be, s, pb, seqs, 16, 116, many, 0, kCalls);
    const double ms = t.median_ms / kCalls;
    report.add({"mla_decode",
                fmt::format("absorbed decode, batch {} x ctx {}, 16 heads [{} calls per event pair]", seqs, ctx, kCalls),
                ms, cache_bytes / (ms * 1e-3) / 1e9, "GB/s", c.copy_gbps, "copy BW", 0,
                "per-call average; no event between calls", fmt::format("16h x{}", kCalls)});
  }
  // The 16-head row with every token's blocks drawn from one pool of a context's worth (4.7 MB at ctx
  // 4096): the cache is read from L2, not DRAM, so this is what the kernel's own work (copies issued,
  // math, barriers, merge) allows; GB/s as if the bytes came from DRAM. Where it reads near the DRAM
  // row, the kernel and not the memory sets the pace.
  {
    PagedBatch shared;
    make_paged_batch(shared, *be, seqs, ctx, 1, 11, (ctx + kBlock - 1) / kBlock);
    const Timing t = time_absorbed(*be, s, shared, seqs, 16, 116, plan);
    report.add({"mla_decode",
                fmt::format("absorbed decode, batch {} x ctx {}, 16 heads [cache L2-resident: one shared context]", seqs,
                            ctx),
                t.median_ms, cache_bytes / (t.median_ms * 1e-3) / 1e9, "GB/s", c.copy_gbps, "copy BW", 0,
                "the kernel's own ceiling; GB/s as if from DRAM", "16h l2"});
  }
  // The 16-head row at other contexts (--decode-contexts): per call the op adds fixed costs (its
  // launch, the first loads, the tail) to a bytes / bandwidth term; longer contexts show the rate the
  // kernel streams at.
  for (const int dctx : o.decode_contexts) {
    PagedBatch pd;
    make_paged_batch(pd, *be, seqs, dctx, 1, 21);
    const Timing t = time_absorbed(*be, s, pd, seqs, 16, 116, plan);
    const double bytes = double(seqs) * dctx * kKvDim * 2.0;
    report.add({"mla_decode", fmt::format("absorbed decode, batch {} x ctx {}, 16 heads", seqs, dctx), t.median_ms,
                bytes / (t.median_ms * 1e-3) / 1e9, "GB/s", c.copy_gbps, "copy BW", 0, "cache bytes only",
                fmt::format("16h ctx {}", dctx)});
  }
  // Batch 1 at ctx 1100, 128 heads: the end-to-end single-stream decode's attention call (latency-
  // bound: 1.3 MB of cache, 0.3 GFLOP), per kernel. Rows in us per call, no ceiling; the cache of one
  // sequence stays in L2 across repetitions, as it does not between the layers of a real step, so
  // these are lower bounds.
  PagedBatch one;
  make_paged_batch(one, *be, 1, 1100, 1, 12);
  for (const int forced : {0, 1, 2, 3}) {  // 3: Auto with the combine kernel
    if (forced == 2 && !gpu::mla_decode_sm90a_supported(128, kRank, kRope)) continue;
    gpu::set_mla_decode_kernel(*be, kForced[forced % 3]);
    gpu::set_mla_decode_merge(*be, forced == 3 ? Merge::Kernel : Merge::Auto);
    TimingPlan b1_plan;
    b1_plan.max_reps = o.quick ? 20 : 400;
    b1_plan.budget_ms = o.quick ? 50 : 200;
    const Timing t = time_absorbed(*be, s, one, 1, 128, 300, b1_plan);
    gpu::set_mla_decode_kernel(*be, gpu::MlaDecodeKernel::Auto);
    gpu::set_mla_decode_merge(*be, Merge::Auto);
    const std::string tag = forced == 3 ? " [combine kernel]"
                            : forced    ? fmt::format(" [{} forced]", kForcedTag[forced] + 1)
                                        : std::string();
    report.add({"mla_decode", fmt::format("absorbed decode, batch 1 x ctx 1100, 128 heads{}", tag), t.median_ms,
                t.median_ms * 1e3, "us", 0, "", 0, "latency-bound (e2e decode shape)",
                fmt::format("b1 128h{}", forced == 3 ? " combine" : kForcedTag[forced])});
  }
  report.print("mla_decode");
}

// Napkin math, one sequence, Q queries at the end of a ctx-token context (query i at position
// ctx - Q + i sees ctx - Q + i + 1 keys), H heads, d_qk = 192, d_v = 128:
//   attention FLOPs     = 2 * H * (d_qk + d_v) * pairs, pairs = Q (ctx - Q) + Q (Q + 1) / 2;
//   decompression FLOPs = 2 * ctx * r * H * (d_n + d_v)  (kv_b_proj over every cached latent).
// 128K context, Q 4096, H 128: 4.4e13 attention FLOPs + 4.4e12 decompression FLOPs per call.
void bench_mla_prefill(Report& report, const Ceilings& c, const BenchOptions& o) {
  auto be = make_bench_backend(true);
  const gpu::Stream s = backend_stream(*be);
  std::vector<int> contexts = o.prefill_contexts;
  if (o.quick) contexts = {std::min(4096, contexts.empty() ? 4096 : contexts.front())};
  for (const int heads : {16, 128}) {
    const ops::MlaDims dims = dsv3_dims(heads);
    HostWeight hw;
    make_host_weight(hw, BenchWeight::BF16, int64_t(heads) * (kNope + kV), kRank, 7);
    const ops::Weight kv_b = place(*be, hw);
    for (const int ctx : contexts) {
      const int q_len = o.prefill_query_chunk > 0 ? std::min(o.prefill_query_chunk, ctx) : ctx;
      PagedBatch pb;
      make_paged_batch(pb, *be, 1, ctx, q_len, 13 + uint64_t(ctx));
      DevTensor q = dev_tensor(*be, DType::F32, {q_len, heads, kNope + kRope});
      DevTensor out = dev_tensor(*be, DType::F32, {q_len, heads, kV});
      fill_random(q.view, 200 + uint64_t(heads), -1, 1, s);
      // Auto (the sm_90a wgmma kernel on an H200) at every context; at the first context the mma.sync
      // kernel forced beside it (the baseline it replaced).
      std::vector<gpu::NaivePrefillPath> paths = {gpu::NaivePrefillPath::Auto};
      if (ctx == contexts.front() && gpu::naive_sm90a_supported(kNope + kRope, kV))
        paths.push_back(gpu::NaivePrefillPath::MmaSync);
      for (const gpu::NaivePrefillPath path : paths) {
        gpu::set_naive_prefill_path(path);
        const bool forced = path != gpu::NaivePrefillPath::Auto;
        TimingPlan plan;
        plan.warmup = 1;
        plan.min_reps = o.quick ? 1 : 2;  // a 128K x 128-head call may take seconds
        plan.max_reps = o.quick ? 2 : 20;
        plan.budget_ms = o.quick ? 200 : 2000;
        const Timing t = time_on_stream(s, plan, [&](int) {
          be->mla_attention_naive(q.view, pb.cache.view, kv_b, pb.batch, dims, out.view);
        });
        gpu::set_naive_prefill_path(gpu::NaivePrefillPath::Auto);
        const double pairs = double(q_len) * (ctx - q_len) + double(q_len) * (q_len + 1) / 2.0;
        const double attn = 2.0 * heads * (kNope + kRope + kV) * pairs;
        const double decomp = 2.0 * double(ctx) * kRank * heads * (kNope + kV);
        const double sec = t.median_ms * 1e-3;
        report.add({"mla_prefill",
                    fmt::format("naive, ctx {}, {} queries at the end, {} heads{}", ctx, q_len, heads,
                                forced ? " [mma.sync forced]" : ""),
                    t.median_ms, attn / sec / 1e12, "TFLOP/s", c.bf16_tflops, "bf16 GEMM", forced ? 0 : 0.5,
                    fmt::format("attention FLOPs only; with decompression ({:.2g} FLOP) {:.1f} TFLOP/s; {:.0f} tok/s",
                                decomp, (attn + decomp) / sec / 1e12, q_len / sec),
                    fmt::format("{}K {}h{}", ctx / 1024, heads, forced ? " mma.sync" : "")});
      }
    }
  }
  report.print("mla_prefill");
}

}  // namespace mla::bench
