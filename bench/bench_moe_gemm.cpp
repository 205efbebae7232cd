// Weight-streaming benchmarks through the Backend interface: MoE decode (routed experts of
// DeepSeek-V3's geometry, FP8 and INT4, bandwidth-bound), dense FP8 linear at decode sizes (per
// kernel path, against copy bandwidth) and dense linear at prefill sizes (compute-bound, against the
// cuBLASLt ceiling).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <string>

#include <fmt/format.h>

#include "backend/gpu/gpu_linear.h"
#include "backend/gpu/gpu_moe.h"
#include "backend/gpu/gpu_moe_grouped_sm90a.h"
#include "bench_gpu.h"
#include "core/status.h"

namespace mla::bench {

// Napkin math, one decode step of B tokens, top-8 of 256 experts of 7168 x 2048:
//   bytes = (unique experts hit) x (gate + up + down, data + scales); FP8: 3 x 14.68 MB + 3 x 3.5 KB
//   scales = 44.05 MB per expert; INT4 (group 32, BF16 scales): 3 x (7.34 + 0.92) MB = 24.8 MB.
//   The backend runs GemmPrecision::Bf16, so batch <= 16 takes the tensor-core decode kernel
//   (gpu_decode_tc.h) for both formats; Fp32 mode would run the exact fp32 decode kernel.
//   FLOPs = B x 8 x 3 x 2 x 7168 x 2048 (negligible: ~0.35 FLOP/B at B=1).
// Batch 1 FP8: 8 experts = 354 MB -> ~82 us at 4.3 TB/s. Each call's routing is one of 32
// pre-drawn random sets, so consecutive calls read different experts (no L2 reuse beyond chance).
namespace {
// One --moe-variants entry: "auto" | "fused" | "2grid", optionally "+nosplit" (no gate/up K split)
// and "+noring" (INT4 weights through register bursts, not the shared-memory rings). A
// default-constructed one (empty name, untagged rows) is the backend's defaults (fused unset:
// moe_tc_fused_auto picks the grid per call).
struct MoeVariant {
  std::string name;
  bool k_split = true, ring = true;
  std::optional<bool> fused;
};
MoeVariant parse_moe_variant(const std::string& spec) {
  MoeVariant v;
  v.name = spec;
  if (spec.empty()) return v;
  size_t at = 0;
  bool path_given = false;
  while (at <= spec.size()) {
    const size_t plus = std::min(spec.find('+', at), spec.size());
    const std::string part = spec.substr(at, plus - at);
    if (part == "auto" || part == "fused" || part == "2grid") {
      if (part != "auto") v.fused = part == "fused";
      path_given = true;
    } else if (part == "nosplit") {
      v.k_split = false;
    } else if (part == "noring") {
      v.ring = false;
    } else {
      MLA_CHECK(false, "--moe-variants: '{}' in '{}' is not auto, fused, 2grid, nosplit or noring", part, spec);
    }
    at = plus + 1;
  }
  MLA_CHECK(path_given, "--moe-variants: '{}' names none of auto, fused, 2grid", spec);
  return v;
}
}  // namespace

void bench_moe_decode(Report& report, const Ceilings& c, const BenchOptions& o) {
  const int num_experts = o.quick ? 32 : 256, hidden = 7168, inter = 2048, top_k = 8, sets = 32;
  std::vector<MoeVariant> variants;
  for (const std::string& spec : o.moe_variants) variants.push_back(parse_moe_variant(spec));
  if (variants.empty()) variants.emplace_back();
  for (const BenchWeight kind : {BenchWeight::FP8, BenchWeight::INT4}) {
    auto be = make_bench_backend(true);
    const gpu::Stream s = backend_stream(*be);
    std::vector<ops::ExpertWeights> experts(static_cast<size_t>(num_experts));
    HostWeight hw;
    for (int e = 0; e < num_experts; ++e) {
      make_host_weight(hw, kind, inter, hidden, uint64_t(e) * 3 + 0);
      experts[size_t(e)].gate_proj = place(*be, hw);
      make_host_weight(hw, kind, inter, hidden, uint64_t(e) * 3 + 1);
      experts[size_t(e)].up_proj = place(*be, hw);
      make_host_weight(hw, kind, hidden, inter, uint64_t(e) * 3 + 2);
      experts[size_t(e)].down_proj = place(*be, hw);
    }
    const ops::ExpertWeights& e0 = experts.front();
    const double expert_bytes = double(weight_bytes(e0.gate_proj) + weight_bytes(e0.up_proj) + weight_bytes(e0.down_proj));
    std::mt19937 rng(17);
    for (const int batch : {1, 2, 4, 8}) {
      std::vector<DevTensor> ids(sets), weights(sets);
      std::vector<int> unique(sets);
      for (int r = 0; r < sets; ++r) {
        std::vector<int32_t> h_ids;
        std::vector<float> h_w;
        std::set<int32_t> hit;
        for (int t = 0; t < batch; ++t) {
          std::vector<int32_t> all(static_cast<size_t>(num_experts));
          std::iota(all.begin(), all.end(), 0);
          for (int k = 0; k < top_k; ++k) {  // partial Fisher-Yates: k distinct experts per token
            std::swap(all[size_t(k)], all[size_t(k) + rng() % size_t(num_experts - k)]);
            h_ids.push_back(all[size_t(k)]);
            hit.insert(all[size_t(k)]);
          }
          float sum = 0;
          for (int k = 0; k < top_k; ++k) sum += h_w.emplace_back(0.1f + float(rng() % 1000) / 1000.0f);
          for (int k = 0; k < top_k; ++k) h_w[h_w.size() - size_t(top_k) + size_t(k)] *= 2.5f / sum;
        }
        unique[size_t(r)] = int(hit.size());
        ids[size_t(r)] = dev_tensor(*be, DType::I32, {batch, top_k});
        weights[size_t(r)] = dev_tensor(*be, DType::F32, {batch, top_k});
        be->copy_from_host(ids[size_t(r)].view, h_ids.data());
        be->copy_from_host(weights[size_t(r)].view, h_w.data());
      }
      DevTensor x = dev_tensor(*be, DType::F32, {batch, hidden});
      DevTensor out = dev_tensor(*be, DType::F32, {batch, hidden});
      fill_random(x.view, 300 + uint64_t(batch), -1, 1, s);
      be->synchronize();
      // Times `calls` back-to-back calls per event pair (routing sets rotated, call i of the whole run
      // on set i % sets); returns the median per-call time and the median per-call rate over the
      // pairs (bytes differ per call: the number of distinct experts hit).
      struct Measured {
        double ms, gbps;
      };
      auto measure = [&](int calls) {
        TimingPlan plan;
        plan.max_reps = calls > 1 ? (o.quick ? 4 : 24) : (o.quick ? 20 : 200);
        plan.budget_ms = o.quick ? 100 : 1000;
        const Timing t = time_on_stream(s, plan, [&](int rep) {
          for (int i = 0; i < calls; ++i) {
            const size_t r = size_t(rep * calls + i) % sets;
            be->moe_experts(x.view, ids[r].view, weights[r].view, experts, out.view);
          }
        });
        std::vector<double> gbps;
        for (size_t i = 0; i < t.per_rep_ms.size(); ++i) {
          double bytes = 0;
          for (int j = 0; j < calls; ++j)
            bytes += unique[size_t(int(plan.warmup + i) * calls + j) % sets] * expert_bytes;
          gbps.push_back(bytes / (t.per_rep_ms[i] * 1e-3) / 1e9);
        }
        std::sort(gbps.begin(), gbps.end());
        return Measured{t.median_ms / calls, gbps[gbps.size() / 2]};
      };
      // --moe-variants: each in turn (e.g. A B A B); else the backend's default.
      for (const MoeVariant& v : variants) {
        gpu::set_moe_tc_fused(*be, v.fused);
        gpu::set_moe_tc_k_split(*be, v.k_split);
        gpu::set_moe_tc_ring(*be, v.ring);
        const Measured m = measure(1);
        if (o.profile_calls)
          profile_once(*be, [&] { be->moe_experts(x.view, ids[0].view, weights[0].view, experts, out.view); });
        const double mean_unique = std::accumulate(unique.begin(), unique.end(), 0.0) / sets;
        const std::string tag = v.name.empty() ? "" : fmt::format(" [{}]", v.name);
        report.add({"moe_decode",
                    fmt::format("{} experts {} top-{}, batch {}, {}{}", num_experts, bench_weight_name(kind), top_k,
                                batch, "7168x2048", tag),
                    m.ms, m.gbps, "GB/s", c.copy_gbps, "copy BW", 0.7,
                    fmt::format("{:.1f} unique experts/call avg, {:.1f} MB each", mean_unique, expert_bytes / 1e6),
                    fmt::format("{} b{}{}{}", bench_weight_name(kind), batch, v.name.empty() ? "" : " ", v.name)});
      }
      const MoeVariant def;  // the backend's defaults again
      gpu::set_moe_tc_fused(*be, def.fused);
      gpu::set_moe_tc_k_split(*be, def.k_split);
      gpu::set_moe_tc_ring(*be, def.ring);
      // The defaults once more with 16 calls (16 routing sets) between one pair of events: calls
      // back to back, as consecutive MoE layers of a decode step run, where each call's plan kernel
      // waits behind the previous call's combine (programmatic dependent launch) instead of behind
      // an event. The difference to the per-call row is what the event pair and the drained
      // kernel boundary cost each call. No target: the per-call row is the one of record.
      {
        constexpr int kCalls = 16;
        const Measured m = measure(kCalls);
        report.add({"moe_decode",
                    fmt::format("{} experts {} top-{}, batch {}, 7168x2048 [{} calls per event pair]", num_experts,
                                bench_weight_name(kind), top_k, batch, kCalls),
                    m.ms, m.gbps, "GB/s", c.copy_gbps, "copy BW", 0.0, "per-call average of back-to-back calls",
                    fmt::format("{} b{} x{}", bench_weight_name(kind), batch, kCalls)});
      }
      // The structure's ceiling (set_moe_tc_probe): the default INT4 path, the fused ring grid, with
      // its arithmetic skipped; timed per call like the row of record. What the row of record lacks
      // of it is the arithmetic's cost; what this row lacks of 100% is the kernels', the item
      // boundaries' and the tail's. Then the gate/up items' and the down items' math skipped alone:
      // where that cost sits. Last the converse, the math with no weight copied: the arithmetic's and the
      // structure's time alone (the same SMs and clocks on every Hopper card, so on a card with more
      // bandwidth it weighs more). Only where the defaults ran the rings.
      if (kind == BenchWeight::INT4 && gpu::moe_tc_last_ring(*be)) {
        struct Probe {
          gpu::MoeTcProbe mode;
          const char* label;
          const char* key;
        };
        for (const Probe p : {Probe{gpu::MoeTcProbe::All, "no arithmetic: the structure's ceiling", "probe"},
                              Probe{gpu::MoeTcProbe::GateUp, "gate/up math skipped", "probe gu"},
                              Probe{gpu::MoeTcProbe::Down, "down math skipped", "probe down"},
                              Probe{gpu::MoeTcProbe::MathOnly, "math only: no weight copied", "probe math"}}) {
          gpu::set_moe_tc_fused(*be, true);
          gpu::set_moe_tc_probe(*be, p.mode);
          const Measured m = measure(1);
          gpu::set_moe_tc_probe(*be, gpu::MoeTcProbe::Off);
          gpu::set_moe_tc_fused(*be, def.fused);
          report.add({"moe_decode",
                      fmt::format("{} experts {} top-{}, batch {}, 7168x2048 [{}]", num_experts,
                                  bench_weight_name(kind), top_k, batch, p.label),
                      m.ms, m.gbps, "GB/s", c.copy_gbps, "copy BW", 0.0,
                      p.mode == gpu::MoeTcProbe::MathOnly
                          ? "fused ring grid, no weight copied (outputs garbage); GB/s as if it were"
                          : "fused ring grid, weights streamed, math skipped (outputs garbage)",
                      fmt::format("{} b{} {}", bench_weight_name(kind), batch, p.key)});
        }
      }
    }
  }
  report.print("moe_decode");
}

// MoE prefill (moe_experts' grouped path): T tokens x top-8 of 256 DeepSeek-V3-shaped experts (7168 x
// 2048) in FP8 and in INT4 (Kimi K2 Thinking's format: group 32, bf16 scales), Bf16 precision (the
// tensor-core grouped kernel, gpu_moe_grouped_tc.h; on Hopper also the mma.sync kernel forced) and,
// FP8 at 1024 tokens, the exact fp32 grouped kernel (Fp32 mode) for reference. FLOPs = 2 x T x 8 x 3
// x 7168 x 2048 (the routed pairs only; padding of partial 64-pair tiles is not counted). Napkin (FP8):
// T 4096 = 2.89 TFLOP (9.6 ms at 300 TFLOP/s) over 11.3 GB of weights (2.6 ms at 4.3 TB/s):
// compute-bound; T 1024 (~32 pairs per expert) reads the same 11.3 GB for a quarter of the FLOPs:
// weight-bound near 280 TFLOP/s. INT4 reads half the bytes and converts with ~2.3 instructions a code.
// Includes routing plan, x -> bf16 prep and combine (the whole op as the model calls it).
void bench_moe_prefill(Report& report, const Ceilings& c, const BenchOptions& o) {
  const int num_experts = o.quick ? 32 : 256, hidden = 7168, inter = 2048, top_k = 8;
  struct Case {
    BenchWeight kind;
    int tokens;
    bool bf16;
  };
  std::vector<Case> cases = {{BenchWeight::FP8, 1024, true},
                             {BenchWeight::FP8, 4096, true},
                             {BenchWeight::FP8, 1024, false},
                             {BenchWeight::INT4, 1024, true},
                             {BenchWeight::INT4, 4096, true}};
  if (o.quick) cases = {{BenchWeight::FP8, 1024, true}};
  // One expert set (and backend) alive at a time: FP8 is 11.3 GB, INT4 5.7 GB.
  for (const auto& [kind, bf16] : {std::pair{BenchWeight::FP8, true}, std::pair{BenchWeight::FP8, false},
                                   std::pair{BenchWeight::INT4, true}}) {
    bool any = false;
    for (const Case& k : cases) any = any || (k.kind == kind && k.bf16 == bf16);
    if (!any) continue;
    auto be = make_bench_backend(bf16);
    const gpu::Stream s = backend_stream(*be);
    std::vector<ops::ExpertWeights> experts(static_cast<size_t>(num_experts));
    HostWeight hw;
    for (int e = 0; e < num_experts; ++e) {
      make_host_weight(hw, kind, inter, hidden, 9000 + uint64_t(e) * 3 + 0);
      experts[size_t(e)].gate_proj = place(*be, hw);
      make_host_weight(hw, kind, inter, hidden, 9000 + uint64_t(e) * 3 + 1);
      experts[size_t(e)].up_proj = place(*be, hw);
      make_host_weight(hw, kind, hidden, inter, 9000 + uint64_t(e) * 3 + 2);
      experts[size_t(e)].down_proj = place(*be, hw);
    }
    std::mt19937 rng(23);
    for (const Case& k : cases) {
      if (k.kind != kind || k.bf16 != bf16) continue;
      std::vector<int32_t> h_ids;
      std::vector<float> h_w;
      std::vector<int32_t> all(static_cast<size_t>(num_experts));
      for (int t = 0; t < k.tokens; ++t) {
        std::iota(all.begin(), all.end(), 0);
        float sum = 0;
        for (int j = 0; j < top_k; ++j) {  // partial Fisher-Yates: top_k distinct experts per token
          std::swap(all[size_t(j)], all[size_t(j) + rng() % size_t(num_experts - j)]);
          h_ids.push_back(all[size_t(j)]);
          sum += h_w.emplace_back(0.1f + float(rng() % 1000) / 1000.0f);
        }
        for (int j = 0; j < top_k; ++j) h_w[h_w.size() - size_t(top_k) + size_t(j)] *= 2.5f / sum;
      }
      DevTensor ids = dev_tensor(*be, DType::I32, {k.tokens, top_k});
      DevTensor weights = dev_tensor(*be, DType::F32, {k.tokens, top_k});
      be->copy_from_host(ids.view, h_ids.data());
      be->copy_from_host(weights.view, h_w.data());
      DevTensor x = dev_tensor(*be, DType::F32, {k.tokens, hidden});
      DevTensor out = dev_tensor(*be, DType::F32, {k.tokens, hidden});
      fill_random(x.view, 700 + uint64_t(k.tokens), -1, 1, s);
      be->synchronize();
      TimingPlan plan;
      plan.min_reps = o.quick ? 3 : 5;
      plan.max_reps = o.quick ? 5 : 50;
      plan.budget_ms = o.quick ? 100 : 1000;
      // Bf16 on a wgmma device: Auto (the wgmma kernel) and the portable mma.sync kernel, same inputs.
      std::vector<gpu::MoeGroupedPath> paths = {gpu::MoeGroupedPath::Auto};
      if (k.bf16 && gpu::moe_grouped_sm90a_supported()) paths.push_back(gpu::MoeGroupedPath::MmaSync);
      for (const gpu::MoeGroupedPath path : paths) {
        gpu::set_moe_grouped_path(path);
        const Timing tm = time_on_stream(s, plan, [&](int) {
          be->moe_experts(x.view, ids.view, weights.view, experts, out.view);
        });
        gpu::set_moe_grouped_path(gpu::MoeGroupedPath::Auto);
        const bool forced = path == gpu::MoeGroupedPath::MmaSync;
        const bool wgmma = k.bf16 && !forced && gpu::moe_grouped_sm90a_supported();
        const char* kernel = !k.bf16 ? "fp32 grouped" : wgmma ? "wgmma" : "mma.sync";
        const double flops = 2.0 * k.tokens * top_k * 3.0 * double(hidden) * double(inter);
        report.add({"moe_prefill",
                    fmt::format("{} experts {} top-{}, {} tokens, 7168x2048, GemmPrecision::{} [{}]", num_experts,
                                kind == BenchWeight::FP8 ? "FP8" : "INT4", top_k, k.tokens, bf16 ? "Bf16" : "Fp32",
                                kernel),
                    tm.median_ms, flops / (tm.median_ms * 1e-3) / 1e12, "TFLOP/s", c.bf16_tflops, "bf16 GEMM",
                    kind == BenchWeight::FP8 && bf16 && k.tokens >= 4096 && !forced ? 0.38 : 0,
                    fmt::format("{:.0f} pairs/expert avg; plan + prep + combine included",
                                double(k.tokens) * top_k / num_experts),
                    fmt::format("{} t{} {}{}", bench_weight_name(kind), k.tokens, bf16 ? "bf16" : "fp32",
                                forced ? " mma.sync" : "")});
      }
    }
  }
  report.print("moe_prefill");
}

// GemvTc split counts forced for tuning dense_tc_split (0: the rule's): at T = 1 the rule's pick,
// then 1-8 splits; otherwise the rule's only.
std::vector<int64_t> forced_splits(int T, bool quick) {
  if (T != 1 || quick) return {0};
  return {0, 1, 2, 3, 4, 6, 8};
}
std::string forced_label(int64_t splits) { return splits == 0 ? "" : fmt::format(", {} splits forced", splits); }
// Repetitions of one decode matvec case (tens of microseconds a call).
TimingPlan matvec_plan(bool quick) {
  TimingPlan plan;
  plan.max_reps = quick ? 20 : 200;
  plan.budget_ms = quick ? 50 : 400;
  return plan;
}

// Dense FP8 linear layers of DeepSeek-V3 at decode sizes (T = 1, 4), GemmPrecision::Bf16, through
// the tensor-core matvec (LinearPath::GemvTc, Auto's pick). (A shared-memory-ring variant fed by bulk
// copies, one CTA per SM with 160 KB in flight, passed parity on the H200 but reached 25-33% where
// this reaches 42-53%, 2026-11-30; not kept.) Bytes = weight data + scales, read once
// per call; ideal at 4.2 TB/s: o_proj 16384 -> 7168 (117 MB) 28 us, gate/up 7168 -> 18432 (132 MB)
// 31 us, down 18432 -> 7168 (132 MB) 31 us, q_b 1536 -> 24576 (37.7 MB) 9 us, shared-expert down
// 2048 -> 7168 (14.7 MB) 3.5 us. Each shape cycles through enough copies of its weight (>= 200 MB
// together) that no call finds its weight in the 50 MB L2. Each call is one launch (x rounded to 16
// bits and split-K summed inside it); back-to-back calls overlap through programmatic dependent
// launch, as consecutive layers of a decode step do.
void bench_dense_decode(Report& report, const Ceilings& c, const BenchOptions& o) {
  struct Shape {
    const char* name;
    int64_t in, out;
    BenchWeight kind = BenchWeight::FP8;
  };
  // Every dense matvec of a DeepSeek-V3 decode step (the lm_head is BF16 in make-model checkpoints).
  std::vector<Shape> shapes = {{"o_proj", 16384, 7168},
                               {"mlp gate/up", 7168, 18432},
                               {"mlp down", 18432, 7168},
                               {"q_b_proj", 1536, 24576},
                               {"q_a_proj", 7168, 1536},
                               {"kv_a_proj", 7168, 576},
                               {"shared expert gate/up", 7168, 2048},
                               {"shared expert down", 2048, 7168},
                               {"lm_head", 7168, 129280, BenchWeight::BF16}};
  if (o.quick) shapes = {{"o_proj", 16384, 7168}, {"shared expert down", 2048, 7168}};
  auto be = make_bench_backend(true);
  const gpu::Stream s = backend_stream(*be);
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Shape& sh = shapes[i];
    HostWeight hw;
    make_host_weight(hw, sh.kind, sh.out, sh.in, 80 + i);
    std::vector<ops::Weight> copies;
    copies.push_back(place(*be, hw));
    const double bytes = double(weight_bytes(copies.front()));
    const int n_copies = int(std::clamp<double>(std::ceil(200e6 / bytes), 1, 16));
    while (int(copies.size()) < n_copies) copies.push_back(place(*be, hw));
    for (const int T : {1, 4}) {
      DevTensor x = dev_tensor(*be, DType::F32, {T, sh.in});
      DevTensor out = dev_tensor(*be, DType::F32, {T, sh.out});
      fill_random(x.view, 900 + uint64_t(T), -1, 1, s);
      be->synchronize();
      if (!gpu::linear_gemv_tc_supports(*be, copies.front())) continue;
      for (const int64_t f : forced_splits(T, o.quick)) {
        gpu::linear_set_gemv_tc_splits(*be, f);
        const TimingPlan plan = matvec_plan(o.quick);
        const Timing tm = time_on_stream(s, plan, [&](int rep) {
          gpu::linear_with_path(*be, x.view, copies[size_t(rep) % copies.size()], out.view, gpu::LinearPath::GemvTc);
        });
        report.add({"dense_decode", fmt::format("{} {} {} -> {}, T {}, GemvTc{}", sh.name, bench_weight_name(sh.kind),
                                                sh.in, sh.out, T, forced_label(f)),
                    tm.median_ms, bytes / (tm.median_ms * 1e-3) / 1e9, "GB/s", c.copy_gbps, "copy BW",
                    f == 0 ? 0.7 : 0.0, fmt::format("{:.1f} MB, {} copies rotated", bytes / 1e6, n_copies),
                    fmt::format("tc {}x{} t{} s{}", sh.in, sh.out, T, f)});
      }
      gpu::linear_set_gemv_tc_splits(*be, 0);
    }
  }
  // The layers of one input as linear_group runs them (one launch over every part's rows), beside
  // the separate calls above: q_a + kv_a, the shared expert's and the dense MLP's gate + up.
  struct Group {
    const char* name;
    int64_t in, out0, out1;
  };
  std::vector<Group> groups = {{"q_a + kv_a", 7168, 1536, 576},
                               {"shared expert gate + up", 7168, 2048, 2048},
                               {"mlp gate + up", 7168, 18432, 18432}};
  if (o.quick) groups.resize(1);
  for (size_t i = 0; i < groups.size(); ++i) {
    const Group& g = groups[i];
    HostWeight h0, h1;
    make_host_weight(h0, BenchWeight::FP8, g.out0, g.in, 120 + i);
    make_host_weight(h1, BenchWeight::FP8, g.out1, g.in, 130 + i);
    std::vector<std::array<ops::Weight, 2>> copies;
    copies.push_back({place(*be, h0), place(*be, h1)});
    const double bytes = double(weight_bytes(copies.front()[0]) + weight_bytes(copies.front()[1]));
    const int n_copies = int(std::clamp<double>(std::ceil(200e6 / bytes), 1, 16));
    while (int(copies.size()) < n_copies) copies.push_back({place(*be, h0), place(*be, h1)});
    for (const int T : {1, 4}) {
      DevTensor x = dev_tensor(*be, DType::F32, {T, g.in});
      DevTensor y0 = dev_tensor(*be, DType::F32, {T, g.out0});
      DevTensor y1 = dev_tensor(*be, DType::F32, {T, g.out1});
      fill_random(x.view, 910 + uint64_t(T), -1, 1, s);
      be->synchronize();
      const TensorView outs[] = {y0.view, y1.view};
      const ops::Weight* first[] = {&copies.front()[0], &copies.front()[1]};
      if (!gpu::linear_group_one_launch(*be, T, first)) continue;
      for (const int64_t f : forced_splits(T, o.quick)) {
        gpu::linear_set_gemv_tc_splits(*be, f);
        const TimingPlan plan = matvec_plan(o.quick);
        const Timing tm = time_on_stream(s, plan, [&](int rep) {
          const auto& pair = copies[size_t(rep) % copies.size()];
          const ops::Weight* ws[] = {&pair[0], &pair[1]};
          be->linear_group(x.view, ws, outs);
        });
        report.add({"dense_decode",
                    fmt::format("{} FP8 {} -> {} + {}, T {}, linear_group{}", g.name, g.in, g.out0, g.out1, T,
                                forced_label(f)),
                    tm.median_ms, bytes / (tm.median_ms * 1e-3) / 1e9, "GB/s", c.copy_gbps, "copy BW", 0.0,
                    fmt::format("{:.1f} MB, {} copies rotated, one launch", bytes / 1e6, n_copies),
                    fmt::format("group {}x{}+{} t{} s{}", g.in, g.out0, g.out1, T, f)});
      }
      gpu::linear_set_gemv_tc_splits(*be, 0);
    }
  }
  // MLA's per-head matvecs at the end-to-end shape (128 heads, FP8 kv_b [128 x 256, 512], T = 1, 4):
  // absorb_q reads W_UK^T (8.4 MB), expand_v W_UV (8.4 MB), one head per CTA.
  {
    constexpr int kHeads = 128, kNope = 128, kRope = 64, kV = 128, kRank = 512;
    const ops::MlaDims dims{kHeads, kNope, kRope, kV, kRank, 1.0f / std::sqrt(float(kNope + kRope))};
    HostWeight hkv;
    make_host_weight(hkv, BenchWeight::FP8, int64_t(kHeads) * (kNope + kV), kRank, 140);
    std::vector<ops::Weight> kv_b;
    for (int i = 0; i < 8; ++i) kv_b.push_back(place(*be, hkv));  // 134 MB: no call finds its weight in L2
    const double half = double(weight_bytes(kv_b.front())) / 2;   // W_UK or W_UV (+ their scales)
    for (const int T : {1, 4}) {
      DevTensor q = dev_tensor(*be, DType::F32, {T, kHeads, kNope + kRope});
      DevTensor qa = dev_tensor(*be, DType::F32, {T, kHeads, kRank + kRope});
      DevTensor ol = dev_tensor(*be, DType::F32, {T, kHeads, kRank});
      DevTensor ov = dev_tensor(*be, DType::F32, {T, kHeads, kV});
      fill_random(q.view, 950 + uint64_t(T), -1, 1, s);
      fill_random(ol.view, 960 + uint64_t(T), -1, 1, s);
      for (const ops::Weight& w : kv_b)
        be->mla_absorb_q(q.view.slice(2, 0, kNope), w, dims, qa.view.slice(2, 0, kRank));
      be->synchronize();  // every W_UK^T built and kept before timing
      for (const bool absorb : {true, false}) {
        TimingPlan plan;
        plan.max_reps = o.quick ? 20 : 200;
        plan.budget_ms = o.quick ? 50 : 300;
        const Timing tm = time_on_stream(s, plan, [&](int rep) {
          const ops::Weight& w = kv_b[size_t(rep) % kv_b.size()];
          if (absorb) be->mla_absorb_q(q.view.slice(2, 0, kNope), w, dims, qa.view.slice(2, 0, kRank));
          else be->mla_expand_v(ol.view, w, dims, ov.view);
        });
        report.add({"dense_decode", fmt::format("{} FP8, 128 heads, T {}", absorb ? "mla_absorb_q" : "mla_expand_v", T),
                    tm.median_ms, half / (tm.median_ms * 1e-3) / 1e9, "GB/s", c.copy_gbps, "copy BW", 0.0,
                    fmt::format("{:.1f} MB, 8 copies rotated", half / 1e6),
                    fmt::format("{} t{}", absorb ? "absorb" : "expand", T)});
      }
    }
  }
  // The read-pattern probe on the gate/up shape (18432 rows of 7168 bytes, two copies rotated): how
  // much of copy bandwidth the matvec's grid and loads in flight reach with no arithmetic, for 64,
  // 128 and 512 bytes of a row per load instruction and for a cp.async ring, at 1, 2 and 3 K splits.
  {
    constexpr int64_t kRows = 18432, kRowBytes = 7168;
    DevTensor m0 = dev_tensor(*be, DType::U8, {kRows, kRowBytes});
    DevTensor m1 = dev_tensor(*be, DType::U8, {kRows, kRowBytes});
    DevTensor sink = dev_tensor(*be, DType::I32, {1});
    fill_random(m0.view, 71, 0, 1, s);
    fill_random(m1.view, 72, 0, 1, s);
    be->synchronize();
    const double bytes = double(kRows * kRowBytes);
    for (const int lpr : {4, 8, 32, -2, -3})
      for (const int splits : {1, 2, 3}) {
        TimingPlan plan;
        plan.max_reps = o.quick ? 20 : 100;
        plan.budget_ms = o.quick ? 30 : 150;
        const Timing tm = time_on_stream(s, plan, [&](int rep) {
          row_read_probe(s, (rep % 2 ? m1 : m0).view.data, kRows, kRowBytes, lpr, splits,
                         static_cast<unsigned*>(sink.view.data));
        });
        const std::string how = lpr > 0 ? fmt::format("{} B per row per load", 16 * lpr)
                                        : fmt::format("cp.async ring of {} x 8 KB per warp", -lpr);
        report.add({"dense_decode", fmt::format("read probe 18432 x 7168 B, {}, {} splits", how, splits),
                    tm.median_ms, bytes / (tm.median_ms * 1e-3) / 1e9, "GB/s", c.copy_gbps, "copy BW", 0.0,
                    "no arithmetic: the matvec's loads only", fmt::format("probe lpr{} s{}", lpr, splits)});
      }
  }
  report.print("dense_decode");
}

// Napkin math: FLOPs = 2 T in out; T 4096 x 7168 -> 18432 is 1.08e12 FLOP (~1.4 ms at 790
// TFLOP/s) against 264 MB of bf16 weight: compute-bound by ~50x, so no input rotation. The Fp32
// precision mode feeds three bf16 terms of x (3x the tensor-core FLOPs): its ideal is ~33%.
void bench_gemm(Report& report, const Ceilings& c, const BenchOptions& o) {
  struct Shape {
    int t, in, out;
  };
  std::vector<Shape> shapes = {{4096, 7168, 18432}, {4096, 18432, 7168}, {8192, 7168, 7168}};
  if (o.quick) shapes = {{1024, 7168, 18432}};
  std::vector<HostWeight> host(shapes.size());
  for (size_t i = 0; i < shapes.size(); ++i)
    make_host_weight(host[i], BenchWeight::BF16, shapes[i].out, shapes[i].in, 40 + i);
  auto run = [&](ops::Backend& be, const ops::Weight& w, int t_rows, const std::string& name, double target,
                 const std::string& note, const std::string& key) {
    const gpu::Stream s = backend_stream(be);
    DevTensor x = dev_tensor(be, DType::F32, {t_rows, w.in_features});
    DevTensor out = dev_tensor(be, DType::F32, {t_rows, w.out_features});
    fill_random(x.view, 500 + uint64_t(t_rows), -1, 1, s);
    TimingPlan plan;
    plan.min_reps = o.quick ? 3 : 10;
    plan.max_reps = o.quick ? 5 : 100;
    plan.budget_ms = o.quick ? 100 : 800;
    const Timing tm = time_on_stream(s, plan, [&](int) { be.linear(x.view, w, out.view); });
    if (o.profile_calls) profile_once(be, [&] { be.linear(x.view, w, out.view); });
    const double flops = 2.0 * t_rows * double(w.in_features) * double(w.out_features);
    report.add({"gemm", name, tm.median_ms, flops / (tm.median_ms * 1e-3) / 1e12, "TFLOP/s", c.bf16_tflops,
                "bf16 GEMM", target, note, key});
  };
  // cuBLASLt alone at each shape (bf16 x, fp32 out like the op), against the same ceiling: how much
  // of a shortfall is the shape's and how much the op's own (the fp32 -> bf16 pass over x).
  {
    auto be = make_bench_backend(true);
    const gpu::Stream s = backend_stream(*be);
    for (const Shape& sh : shapes) {
      const double ms = cublas_bf16_gemm_ms(s, sh.out, sh.t, sh.in, true, o.quick);
      if (ms <= 0) continue;
      const double flops = 2.0 * sh.t * double(sh.in) * double(sh.out);
      report.add({"gemm",
                  fmt::format("cuBLASLt alone, bf16 x [{} x {}] -> {} fp32 out (reference for this shape)", sh.t,
                              sh.in, sh.out),
                  ms, flops / (ms * 1e-3) / 1e12, "TFLOP/s", c.bf16_tflops, "bf16 GEMM", 0,
                  "best of 4 heuristic algos; no fp32 -> bf16 pass", fmt::format("blas {}x{}->{}", sh.t, sh.in, sh.out)});
    }
  }
  for (const bool bf16 : {true, false}) {
    auto be = make_bench_backend(bf16);
    for (size_t i = 0; i < shapes.size(); ++i) {
      const ops::Weight w = place(*be, host[i]);
      run(*be, w, shapes[i].t,
          fmt::format("linear bf16 W, T {} x {} -> {}, GemmPrecision::{}", shapes[i].t, shapes[i].in, shapes[i].out,
                      bf16 ? "Bf16" : "Fp32"),
          bf16 ? 0.85 : 0, bf16 ? "" : "3 bf16 terms of x: ideal ~33%",
          fmt::format("bf16 {}x{}->{} {}", shapes[i].t, shapes[i].in, shapes[i].out, bf16 ? "Bf16" : "Fp32"));
    }
  }
  // Quantized weights at prefill size, serving precision (reported against the same bf16 ceiling).
  auto be = make_bench_backend(true);
  const int t_rows = o.quick ? 1024 : 4096;
  for (const BenchWeight kind : {BenchWeight::FP8, BenchWeight::INT4}) {
    for (const Shape& sh : {Shape{t_rows, 7168, 18432}, Shape{t_rows, 18432, 7168}}) {
      HostWeight hw;
      make_host_weight(hw, kind, sh.out, sh.in, 60 + uint64_t(kind));
      const ops::Weight w = place(*be, hw);
      run(*be, w, sh.t,
          fmt::format("linear {} W, T {} x {} -> {}, GemmPrecision::Bf16", bench_weight_name(kind), sh.t, sh.in,
                      sh.out),
          0, "", fmt::format("{} {}x{}->{}", bench_weight_name(kind), sh.t, sh.in, sh.out));
    }
  }
  report.print("gemm");
}

}  // namespace mla::bench
