// Parity of the GPU MoE ops against the CPU reference: moe_route (ids exact, weights to expf ulps)
// over expert counts, top-k, group limits, bias and normalization; moe_experts over weight formats x
// both expert paths (decode GEMV, grouped GEMM) x token counts x odd shapes, with experts missing
// from this rank, experts shared by many tokens, and strided x / out rows; in GemmPrecision::Bf16 the
// tensor-core decode kernel (FP8, INT4), the tensor-core grouped kernel (BF16, FP8, INT4) and the
// shapes that must fall back to the exact ones.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "backend/gpu/gpu_backend.h"
#include "backend/gpu/gpu_moe.h"
#include "backend/gpu/gpu_moe_grouped_sm90a.h"
#include "gpu/parity.h"

namespace mla::test {
namespace {

// ---- moe_route ------------------------------------------------------------------------------------
struct RouteCase {
  int64_t tokens, experts;
  int top_k, n_group, topk_group;
  bool bias, norm;
};

// Built with += (operator+ on a literal trips gcc 12's -Wrestrict false positive).
std::string route_name(const RouteCase& c) {
  std::string s = "T";
  s += std::to_string(c.tokens);
  s += " E";
  s += std::to_string(c.experts);
  s += " k";
  s += std::to_string(c.top_k);
  s += " g";
  s += std::to_string(c.n_group);
  s += "/";
  s += std::to_string(c.topk_group);
  if (c.bias) s += " bias";
  if (c.norm) s += " norm";
  return s;
}

void check_route(const RouteCase& c, uint32_t seed) {
  std::mt19937 rng(seed);
  // Random logits over a wide range: exact score ties (which the CPU breaks by lower id) are
  // measure-zero, and near-ties within expf's 2-ulp difference are rare enough to ignore.
  const Twin logits = twin_random(rng, DType::F32, {c.tokens, c.experts}, -4.0f, 4.0f);
  const Twin bias = c.bias ? twin_random(rng, DType::F32, {c.experts}, -0.3f, 0.3f) : Twin{};
  const Twin ids = twin_output(DType::I32, {c.tokens, c.top_k});
  const Twin weights = twin_output(DType::F32, {c.tokens, c.top_k});
  const ops::MoeRouting routing{c.top_k, c.n_group, c.topk_group, c.norm, 2.5f};
  run_both([&](ops::Backend& b, bool g) {
    b.moe_route(pick(logits, g), c.bias ? pick(bias, g) : TensorView{}, routing, pick(ids, g), pick(weights, g));
  });
  const std::string name = route_name(c);
  EXPECT_TRUE(check_parity("moe_route ids", name, ids, Tolerance{0, 0, "selection must match exactly"}));
  // CUDA expf is within 2 ulp of glibc's; the sigmoid, sum and divide add a few ulps more.
  EXPECT_TRUE(check_parity("moe_route weights", name, weights,
                           Tolerance{1e-7, 1e-6, "expf 2-ulp + renormalization, fp32"}));
}

TEST(GpuParityMoe, RouteGrid) {
  const int64_t expert_counts[] = {8, 64, 256, 384};
  const int top_ks[] = {1, 2, 6, 8};
  const int groups[][2] = {{1, 1}, {4, 2}, {8, 4}};
  const int64_t token_counts[] = {1, 7, 300};
  uint32_t seed = 100;
  int variant = 0;
  for (int64_t e : expert_counts)
    for (int k : top_ks)
      for (const auto& g : groups) {
        const int64_t group_size = e / g[0];
        if (g[0] > 1 && group_size < 2) continue;      // group score needs two experts
        if (k > g[1] * group_size) continue;           // not enough selectable experts
        const bool bias = (variant & 1) != 0, norm = (variant & 2) == 0;
        ++variant;
        for (int64_t t : token_counts) check_route(RouteCase{t, e, k, g[0], g[1], bias, norm}, seed++);
      }
}

// DeepSeek-V3 and Kimi K2 router shapes exactly (bias on, norm on, 2.5 scaling).
TEST(GpuParityMoe, RouteModelShapes) {
  check_route(RouteCase{33, 256, 8, 8, 4, true, true}, 7);
  check_route(RouteCase{300, 384, 8, 1, 1, true, true}, 8);
  check_route(RouteCase{5, 384, 16, 8, 4, true, false}, 9);
}

// Exact ties everywhere: logits and bias take a handful of values, so many experts (and groups) share
// a score bit for bit on each backend; the selection must then follow the CPU's lower-id-first order.
TEST(GpuParityMoe, RouteTies) {
  std::mt19937 rng(31);
  const int64_t tokens = 37, experts = 64;
  std::vector<float> logits(static_cast<size_t>(tokens * experts));
  std::vector<float> bias(static_cast<size_t>(experts));
  // Non-negative logits only: sigmoid(x) + sigmoid(-x) == 1 would make distinct group top-2 sums
  // equal in exact arithmetic, and their fp roundings may then order differently on the two backends.
  for (float& v : logits) v = float(rng() % 4) * 0.75f;
  for (float& v : bias) v = float(rng() % 2) * 0.125f;
  const Twin l = twin_from_floats(logits, {tokens, experts});
  const Twin b = twin_from_floats(bias, {experts});
  for (int variant = 0; variant < 2; ++variant) {
    const ops::MoeRouting routing{6, variant == 0 ? 1 : 8, variant == 0 ? 1 : 3, true, 2.5f};
    const Twin ids = twin_output(DType::I32, {tokens, 6});
    const Twin w = twin_output(DType::F32, {tokens, 6});
    // Bias only without groups: s_i + b_j sums of group scores could tie in exact arithmetic too.
    run_both([&](ops::Backend& be, bool g) {
      be.moe_route(pick(l, g), variant == 0 ? pick(b, g) : TensorView{}, routing, pick(ids, g), pick(w, g));
    });
    const std::string name = variant == 0 ? "ties T37 E64 k6 bias" : "ties T37 E64 k6 g8/3";
    EXPECT_TRUE(check_parity("moe_route ids", name, ids, Tolerance{0, 0, "tie order: lower id first, exact"}));
    EXPECT_TRUE(check_parity("moe_route weights", name, w, Tolerance{1e-7, 1e-6, "expf 2-ulp + renormalization"}));
  }
}

// ---- moe_experts ----------------------------------------------------------------------------------
// A set of experts on both backends; every `hole`-th expert (offset 1) is not held by this rank.
struct ExpertSet {
  std::vector<std::unique_ptr<TwinWeight>> weights;
  std::vector<ops::ExpertWeights> cpu, gpu;
  int64_t hidden = 0, inter = 0;
};

// tweak (optional) edits each held expert's host weights (matrix 0 gate, 1 up, 2 down) before the GPU
// copies are placed.
using WeightTweak = std::function<void(TestWeight&, int)>;
std::unique_ptr<ExpertSet> make_experts(std::mt19937& rng, WeightKind kind, int64_t num_experts, int64_t hidden,
                                        int64_t inter, int hole, const WeightTweak& tweak = {}) {
  auto set = std::make_unique<ExpertSet>();
  set->hidden = hidden;
  set->inter = inter;
  set->cpu.resize(size_t(num_experts));
  set->gpu.resize(size_t(num_experts));
  // Amplitudes ~ 1/sqrt(fan-in) keep every stage O(1), so the tolerance speaks about rounding only.
  const float amp_in = 1.7f / std::sqrt(float(hidden)), amp_down = 1.7f / std::sqrt(float(inter));
  for (int64_t e = 0; e < num_experts; ++e) {
    if (hole > 0 && e % hole == 1) continue;
    TwinWeight* w[3];
    for (auto*& p : w) {
      set->weights.push_back(std::make_unique<TwinWeight>());
      p = set->weights.back().get();
    }
    make_twin_weight(*w[0], rng, kind, inter, hidden, amp_in);
    make_twin_weight(*w[1], rng, kind, inter, hidden, amp_in);
    make_twin_weight(*w[2], rng, kind, hidden, inter, amp_down);
    if (tweak)
      for (int m = 0; m < 3; ++m) {
        tweak(w[m]->host, m);  // the CPU views point at these host bytes
        w[m]->gpu.data = gpu_backend().place_weight(w[m]->host.w.data);
        if (w[m]->host.w.scale.data) w[m]->gpu.scale = gpu_backend().place_weight(w[m]->host.w.scale);
      }
    set->cpu[size_t(e)] = ops::ExpertWeights{w[0]->cpu, w[1]->cpu, w[2]->cpu};
    set->gpu[size_t(e)] = ops::ExpertWeights{w[0]->gpu, w[1]->gpu, w[2]->gpu};
  }
  return set;
}

// Distinct experts per token (like the router), drawn at random, so small E repeats experts across
// tokens and large T puts many tokens on one expert.
std::vector<int32_t> draw_ids(std::mt19937& rng, int64_t tokens, int64_t num_experts, int top_k) {
  std::vector<int32_t> ids;
  std::vector<int32_t> perm(static_cast<size_t>(num_experts));
  for (int64_t t = 0; t < tokens; ++t) {
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    ids.insert(ids.end(), perm.begin(), perm.begin() + top_k);
  }
  return ids;
}
Twin random_ids(std::mt19937& rng, int64_t tokens, int64_t num_experts, int top_k) {
  return twin_from_ints(draw_ids(rng, tokens, num_experts, top_k), {tokens, top_k});
}

// draw_ids plus ids the routing never produces but a caller may pass, which the op's contract
// (ops::Backend::moe_experts) covers: -1, E and 2^30 in every fifth slot (they contribute 0), and
// token 0 naming one expert in its first two slots (that expert counts twice). top_k >= 2.
Twin odd_ids(std::mt19937& rng, int64_t tokens, int64_t num_experts, int top_k) {
  std::vector<int32_t> ids = draw_ids(rng, tokens, num_experts, top_k);
  const int32_t odd[] = {-1, int32_t(num_experts), 1 << 30};
  for (size_t i = 2; i < ids.size(); i += 5) ids[i] = odd[(i / 5) % 3];
  ids[1] = ids[0];
  return twin_from_ints(ids, {tokens, top_k});
}

// fp32 decode / grouped kernels: exact dequantized weights, fp32 sums in another order.
Tolerance exact_tol(const ExpertSet& set) {
  return Tolerance{1e-5 * std::sqrt(double(set.hidden + set.inter)), 1e-5, "fp32 reassociation of two chained dots, K=H+I"};
}

// Runs moe_experts on the CPU and on `gpu` (a GPU backend) with the MoE path forced to `path`.
// odd: the ids of odd_ids instead of random_ids.
void check_experts_on(ops::Backend& gpu, const ExpertSet& set, WeightKind kind, gpu::MoePath path, int64_t tokens,
                      int top_k, bool strided, uint32_t seed, const Tolerance& tol, const char* tag,
                      bool odd = false) {
  std::mt19937 rng(seed);
  const int64_t h = set.hidden, num_experts = int64_t(set.cpu.size());
  // Strided cases: x and out are column slices of wider buffers (rows not 16-byte aligned).
  const Twin x_buf = twin_random(rng, DType::F32, {tokens, h + (strided ? 3 : 0)});
  const Twin x = strided ? x_buf.slice(1, 1, h) : x_buf;
  const Twin ids = odd ? odd_ids(rng, tokens, num_experts, top_k) : random_ids(rng, tokens, num_experts, top_k);
  const Twin weights = twin_random(rng, DType::F32, {tokens, top_k}, 0.05f, 1.0f);
  const Twin out_buf = twin_output(DType::F32, {tokens, h + (strided ? 5 : 0)});
  const Twin out = strided ? out_buf.slice(1, 2, h) : out_buf;
  gpu::set_moe_path(gpu, path);
  cpu_backend().moe_experts(x.cpu, ids.cpu, weights.cpu, set.cpu, out.cpu);
  gpu.moe_experts(x.gpu, ids.gpu, weights.gpu, set.gpu, out.gpu);
  gpu.synchronize();
  gpu::set_moe_path(gpu, gpu::MoePath::Auto);
  std::string name = weight_kind_name(kind);
  name += path == gpu::MoePath::Decode ? " decode" : path == gpu::MoePath::Grouped ? " grouped" : " auto";
  name += " T";
  name += std::to_string(tokens);
  name += " H";
  name += std::to_string(h);
  name += " I";
  name += std::to_string(set.inter);
  name += " E";
  name += std::to_string(num_experts);
  name += " k";
  name += std::to_string(top_k);
  if (strided) name += " strided";
  name += tag;
  EXPECT_TRUE(check_parity("moe_experts", name, out, tol));
}

void check_experts(const ExpertSet& set, WeightKind kind, gpu::MoePath path, int64_t tokens, int top_k,
                   bool strided, uint32_t seed) {
  check_experts_on(gpu_backend(), set, kind, path, tokens, top_k, strided, seed, exact_tol(set), "");
}

const WeightKind kKinds[] = {WeightKind::BF16, WeightKind::FP8, WeightKind::INT4_BF16};
const gpu::MoePath kPaths[] = {gpu::MoePath::Decode, gpu::MoePath::Grouped};

// Odd shapes: H=200 (16-byte rows for BF16 only) with I=129 (down rows unaligned: scalar path),
// H=203 (tails on every gate/up row), and H=352 / I=96 (16-byte rows for every kind: the decode
// path's vector loads with partial warp steps, 11-22 chunks per gate/up row, 3-12 per down row).
TEST(GpuParityMoe, ExpertsSmallShapes) {
  const int64_t shapes[][2] = {{200, 129}, {203, 64}, {352, 96}};
  const int64_t token_counts[] = {1, 3, 8, 33, 200};
  uint32_t seed = 1000;
  for (WeightKind kind : kKinds)
    for (const auto& s : shapes) {
      std::mt19937 rng(seed++);
      const auto set = make_experts(rng, kind, 12, s[0], s[1], 4);
      for (gpu::MoePath path : kPaths)
        for (int64_t t : token_counts) check_experts(*set, kind, path, t, 4, t == 33, seed++);
    }
}

// Many tokens on few experts (segments longer than one grouped tile and one decode token group),
// top-1 and top-6, plus the Auto path choice at both ends.
TEST(GpuParityMoe, ExpertsCrowded) {
  std::mt19937 rng(77);
  const auto set = make_experts(rng, WeightKind::BF16, 7, 96, 40, 0);
  check_experts(*set, WeightKind::BF16, gpu::MoePath::Decode, 111, 6, false, 1);
  check_experts(*set, WeightKind::BF16, gpu::MoePath::Grouped, 111, 6, true, 2);
  check_experts(*set, WeightKind::BF16, gpu::MoePath::Decode, 19, 1, false, 3);
  check_experts(*set, WeightKind::BF16, gpu::MoePath::Grouped, 19, 1, false, 4);
  check_experts(*set, WeightKind::BF16, gpu::MoePath::Auto, 5, 3, false, 5);
  check_experts(*set, WeightKind::BF16, gpu::MoePath::Auto, 300, 3, false, 6);
}

// The DeepSeek-V3 expert shape (hidden 7168, moe_intermediate 2048) with a few experts, one missing.
TEST(GpuParityMoe, ExpertsDeepSeekShape) {
  uint32_t seed = 5000;
  for (WeightKind kind : kKinds) {
    std::mt19937 rng(seed++);
    const auto set = make_experts(rng, kind, 5, 7168, 2048, 4);
    for (gpu::MoePath path : kPaths)
      for (int64_t t : {int64_t(1), int64_t(8), int64_t(33)}) check_experts(*set, kind, path, t, 2, false, seed++);
  }
}

// ---- GemmPrecision::Bf16: the tensor-core decode path (gpu_decode_tc.h) ------------------------
// Error basis: FP8 weights are exact (fp8 -> f16); INT4 weights enter as the exact q s, where the
// reference rounds bf16(q s) (weight_at: <= 2^-9 relative per weight). Each GEMM's activations (x
// for gate/up, h = silu(g) u for down) are rounded once to f16 under a power-of-two scale (FP8: per
// 64-k chunk; INT4: x per row, h per 64-k chunk), relative error <= 2^-11 near the scale's max.
// With |x| < 1 and |W| <= 1.7 / sqrt(fan-in) (make_experts), g, u, h and y are O(1) and independent
// roundings give a dot error of ~u / sqrt(3) x sqrt(sum (W x)^2) ~ 0.2 u; a host emulation of
// bf16-sized roundings (u = 2^-8) on these distributions measured max |err y| ~ 0.5 u (H 7168, I
// 2048), so <= 4 slots with weights < 1 stay under ~2 u. atol 8 u + rtol 2 u: 4x margin (INT4 keeps
// bf16's u for the reference's weight rounding); fp32 accumulation error is far below.
Tolerance tc_tol(WeightKind kind) {
  const double u = kind == WeightKind::FP8 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
  return Tolerance{8 * u, 2 * u,
                   kind == WeightKind::FP8 ? "tc: f16 x and h (u = 2^-11, pow2-scaled), exact fp8 W; 8u + 2u rel"
                                           : "tc: f16 x and h (pow2-scaled), W as exact q s (the reference rounds "
                                             "bf16(q s): <= 2^-9 per weight); u = 2^-8, 8u + 2u rel"};
}

// The tensor-core grouped (prefill) path (gpu_moe_grouped_tc.h): weights exact in bf16 (BF16; FP8
// e4m3 -> bf16 with the block scale on the fp32 partial sums; INT4 bf16(q s), weight_at's value), x
// and h rounded once to bf16 (u = 2^-8). The decode-path basis above applies with bf16's u: ~0.5 u
// measured on these distributions, <= ~2 u over <= 4 slots with weights < 1; 8u + 2u rel: 4x margin.
Tolerance grouped_tc_tol() {
  const double u = std::ldexp(1.0, -8);
  return Tolerance{8 * u, 2 * u, "grouped tc: bf16 x and h (u = 2^-8), exact W in bf16; 8u + 2u rel"};
}

std::unique_ptr<ops::Backend> make_bf16_backend() {
  auto made = gpu::make_gpu_backend({.gemm_precision = gpu::GemmPrecision::Bf16});
  EXPECT_TRUE(made.is_ok()) << made.status().message();
  return made.is_ok() ? std::move(made).value() : nullptr;
}

// The op's contract on odd ids (ops::Backend::moe_experts: ids outside [0, E) contribute 0, a token
// naming one expert twice gets it twice) on every GPU path, against the CPU under the same
// contract: the fp32 decode and grouped kernels for every format, and in Bf16 precision the
// tensor-core decode (FP8 and INT4; FP8 takes the fused grid from T = 2) and grouped kernels (every
// format); 4 of 12 experts not held.
TEST(GpuParityMoe, ExpertsOddIdsEveryPath) {
  std::unique_ptr<ops::Backend> bf16 = make_bf16_backend();
  ASSERT_TRUE(bf16);
  uint32_t seed = 9100;
  for (WeightKind kind : kKinds) {
    std::mt19937 rng(seed++);
    const auto set = make_experts(rng, kind, 12, 256, 128, 4);
    for (int64_t t : {int64_t(3), int64_t(9)}) {
      for (gpu::MoePath path : kPaths)
        check_experts_on(gpu_backend(), *set, kind, path, t, 4, false, seed++, exact_tol(*set), " odd ids", true);
      if (kind != WeightKind::BF16)
        check_experts_on(*bf16, *set, kind, gpu::MoePath::Decode, t, 4, false, seed++, tc_tol(kind),
                         " odd ids [bf16 tc]", true);
      check_experts_on(*bf16, *set, kind, gpu::MoePath::Grouped, t, 4, false, seed++, grouped_tc_tol(),
                       " odd ids [bf16 grouped tc]", true);
    }
  }
}

// Shapes the kernel takes (FP8: H, I % 64; INT4: % 128): a single 64-row CTA and K chunks fewer than
// one weight burst (192 x 64), partial 128 x 128 scale blocks in both dims (FP8 320 x 576: 2.5 k
// blocks, 4.5 row blocks), several chunks and CTAs (INT4 384 x 256, 640 x 384), a last burst that is
// short (FP8 H 704: 11 chunks, INT4 H 1152: 9), one-chunk shapes (FP8 H 64, INT4 H 128); T = 1, 2,
// 3, 8, 16 with experts missing from the rank, strided x / out at T = 3, and Auto T = 17 (grouped
// GEMM).
TEST(GpuParityMoe, TensorCoreDecodeBf16) {
  std::unique_ptr<ops::Backend> be = make_bf16_backend();
  ASSERT_TRUE(be);
  struct Shape {
    WeightKind kind;
    int64_t hidden, inter;
  };
  const Shape shapes[] = {{WeightKind::FP8, 192, 64},
                          {WeightKind::FP8, 320, 576},
                          {WeightKind::FP8, 64, 128},
                          {WeightKind::FP8, 704, 192},
                          {WeightKind::INT4_BF16, 384, 256},
                          {WeightKind::INT4_BF16, 640, 384},
                          {WeightKind::INT4_BF16, 128, 256},
                          {WeightKind::INT4_BF16, 1152, 128}};
  uint32_t seed = 7000;
  for (const Shape& sh : shapes) {
    std::mt19937 rng(seed++);
    const auto set = make_experts(rng, sh.kind, 12, sh.hidden, sh.inter, 4);
    for (int64_t t : {1, 2, 3, 8, 16})
      check_experts_on(*be, *set, sh.kind, gpu::MoePath::Decode, t, 4, t == 3, seed++, tc_tol(sh.kind),
                       " [bf16 tc]");
    // Auto: T = 16 takes the tensor-core decode path, T = 17 the tensor-core grouped GEMM.
    check_experts_on(*be, *set, sh.kind, gpu::MoePath::Auto, 16, 4, false, seed++, tc_tol(sh.kind), " [bf16 tc]");
    check_experts_on(*be, *set, sh.kind, gpu::MoePath::Auto, 17, 4, false, seed++, grouped_tc_tol(),
                     " [bf16 grouped tc]");
  }
}

// More than 8 pairs per expert (several 8-column passes, a partial last one; T = 16 and 13) and the
// decode path forced at T = 111 (up to ~75 pairs on one of 3 experts, 222 pairs), top-1 and top-2.
TEST(GpuParityMoe, TensorCoreDecodeBf16Crowded) {
  std::unique_ptr<ops::Backend> be = make_bf16_backend();
  ASSERT_TRUE(be);
  uint32_t seed = 7100;
  for (WeightKind kind : {WeightKind::FP8, WeightKind::INT4_BF16}) {
    std::mt19937 rng(seed++);
    const auto set = make_experts(rng, kind, 3, 256, 128, 0);
    check_experts_on(*be, *set, kind, gpu::MoePath::Decode, 16, 2, false, seed++, tc_tol(kind), " [bf16 tc]");
    check_experts_on(*be, *set, kind, gpu::MoePath::Decode, 13, 1, true, seed++, tc_tol(kind), " [bf16 tc]");
    check_experts_on(*be, *set, kind, gpu::MoePath::Decode, 111, 2, false, seed++, tc_tol(kind), " [bf16 tc]");
  }
}

// The DeepSeek-V3 expert shape on the tensor-core path (the bench's shape), one expert missing:
// T = 1, 2 stage the whole K of their columns in shared memory; T = 8, 16, 40 (8 columns) stage it a
// window at a time (FP8 gate/up 28 of 112 chunks, down 24 of 32; INT4 12 of 56, 8 of 16).
TEST(GpuParityMoe, TensorCoreDecodeBf16DeepSeekShape) {
  std::unique_ptr<ops::Backend> be = make_bf16_backend();
  ASSERT_TRUE(be);
  uint32_t seed = 7200;
  for (WeightKind kind : {WeightKind::FP8, WeightKind::INT4_BF16}) {
    std::mt19937 rng(seed++);
    const auto set = make_experts(rng, kind, 5, 7168, 2048, 4);
    for (int64_t t : {1, 2, 8, 16})
      check_experts_on(*be, *set, kind, gpu::MoePath::Auto, t, 2, false, seed++, tc_tol(kind), " [bf16 tc]");
    check_experts_on(*be, *set, kind, gpu::MoePath::Decode, 40, 2, false, seed++, tc_tol(kind), " [bf16 tc]");
  }
}

// The gate/up pass sums K in two fixed halves, over two CTAs per tile (the INT4 K split of grids
// of <= 512 tiles, such as DeepSeek-V3 batch 1 and 2; inter 4096 here: 512 tiles at batch 1) or in
// one CTA: both must give the same bits, and so must a token's row at batch 1 and inside a batch of
// 3 (INT4: two passes of columns, never split; FP8 is never split, so its case checks the batch
// invariance alone). Also against the CPU.
TEST(GpuParityMoe, TensorCoreDecodeBf16KSplitBitIdentical) {
  std::unique_ptr<ops::Backend> be = make_bf16_backend();
  ASSERT_TRUE(be);
  std::mt19937 rng(7600);
  for (const auto& [kind, inter] : {std::pair{WeightKind::FP8, int64_t(2048)}, std::pair{WeightKind::INT4_BF16, int64_t(2048)},
                                    std::pair{WeightKind::INT4_BF16, int64_t(4096)}}) {
    const int64_t hidden = 7168, num_experts = 8, tokens = 3;
    const int top_k = 8;
    const auto set = make_experts(rng, kind, num_experts, hidden, inter, 4);
    const Twin x = twin_random(rng, DType::F32, {tokens, hidden});
    const Twin ids = random_ids(rng, tokens, num_experts, top_k);
    const Twin weights = twin_random(rng, DType::F32, {tokens, top_k}, 0.05f, 1.0f);
    const Twin x1 = x.slice(0, 0, 1), ids1 = ids.slice(0, 0, 1), w1 = weights.slice(0, 0, 1);
    auto run = [&](const Twin& xs, const Twin& is, const Twin& ws, bool split) {
      const Twin out = twin_output(DType::F32, {xs.gpu.shape[0], hidden});
      gpu::set_moe_tc_k_split(*be, split);
      be->moe_experts(xs.gpu, is.gpu, ws.gpu, set->gpu, out.gpu);
      be->synchronize();
      gpu::set_moe_tc_k_split(*be, true);
      return out;
    };
    const Twin split1 = run(x1, ids1, w1, true), whole1 = run(x1, ids1, w1, false), batch3 = run(x, ids, weights, true);
    const std::vector<float> a = gpu_values(split1), b = gpu_values(whole1), c = gpu_values(batch3);
    const std::string name = fmt::format("{} I{}", weight_kind_name(kind), inter);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << name << ": K split on / off differ";
    EXPECT_EQ(std::memcmp(a.data(), c.data(), a.size() * sizeof(float)), 0) << name << ": batch 1 / row 0 of batch 3 differ";
    cpu_backend().moe_experts(x1.cpu, ids1.cpu, w1.cpu, set->cpu, split1.cpu);
    EXPECT_TRUE(check_parity("moe_experts", fmt::format("{} decode T1 H7168 E8 k8 [bf16 tc, K split]", name), split1,
                             tc_tol(kind)));
  }
}

// The fused persistent grid and the two-grid path (default) compute every tile the same way, so they
// must give the same bits: small shapes where most CTAs of the fused grid find the queue empty (one
// 64-row tile), K split or not (FP8 T <= 8 and INT4 T <= 2 split while the gate/up tiles are fewer
// than two per CTA), several passes per expert (T = 16 on 3 experts, top-2: ~11 pairs each; INT4
// T = 8 on 9 held experts of 12), the DeepSeek-V3 shape at batch 1 / 2 / 8 (<= 8 x 32 gate/up and
// <= 8 x 112 down tiles in one queue at batch 1), and the fused call three times in a row (the queue
// counters must be left zero by every call). Also against the CPU.
TEST(GpuParityMoe, TensorCoreDecodeBf16FusedBitIdentical) {
  std::unique_ptr<ops::Backend> be = make_bf16_backend();
  ASSERT_TRUE(be);
  struct Case {
    WeightKind kind;
    int64_t hidden, inter, experts;
    int top_k;
    std::vector<int64_t> tokens;
  };
  const Case cases[] = {{WeightKind::FP8, 192, 64, 12, 4, {1, 3}},
                        {WeightKind::FP8, 704, 192, 12, 4, {2, 9}},
                        {WeightKind::FP8, 256, 128, 3, 2, {16}},
                        {WeightKind::INT4_BF16, 1152, 128, 12, 4, {1, 2}},
                        {WeightKind::INT4_BF16, 640, 384, 12, 4, {5}},
                        {WeightKind::INT4_BF16, 256, 128, 3, 2, {16}},
                        {WeightKind::FP8, 7168, 2048, 12, 8, {1, 8}},
                        {WeightKind::INT4_BF16, 7168, 2048, 12, 8, {1, 2, 8}}};
  std::mt19937 rng(7700);
  for (const Case& c : cases) {
    const auto set = make_experts(rng, c.kind, c.experts, c.hidden, c.inter, 4);
    for (const int64_t tokens : c.tokens) {
      const Twin x = twin_random(rng, DType::F32, {tokens, c.hidden});
      const Twin ids = random_ids(rng, tokens, c.experts, c.top_k);
      const Twin weights = twin_random(rng, DType::F32, {tokens, c.top_k}, 0.05f, 1.0f);
      auto run = [&](bool fused) {
        const Twin out = twin_output(DType::F32, {tokens, c.hidden});
        gpu::set_moe_tc_fused(*be, fused);
        be->moe_experts(x.gpu, ids.gpu, weights.gpu, set->gpu, out.gpu);
        be->synchronize();
        gpu::set_moe_tc_fused(*be, std::nullopt);  // the backend's default
        return out;
      };
      const std::vector<float> want = gpu_values(run(false));
      const std::string name = fmt::format("{} T{} H{} I{} E{} k{}", weight_kind_name(c.kind), tokens, c.hidden,
                                           c.inter, c.experts, c.top_k);
      for (int rep = 0; rep < 3; ++rep) {
        const Twin fused = run(true);
        const std::vector<float> got = gpu_values(fused);
        EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
            << name << ": fused grid (call " << rep << ") and two grids differ";
        if (rep == 0) {
          cpu_backend().moe_experts(x.cpu, ids.cpu, weights.cpu, set->cpu, fused.cpu);
          EXPECT_TRUE(check_parity("moe_experts", name + " [bf16 tc, fused grid]", fused, tc_tol(c.kind)));
        }
      }
    }
  }
}

// The fused grid builds its own routing plan in shared memory from the ids where a call has at most
// gpu::kGridPlanMaxPairs pairs (no plan kernel runs); the two-grid path runs the plan kernel. Both
// must give the same bits on ids the routing never produces but a caller may pass: ids outside
// [0, E) (-1, E, 2^30) and experts not held by this rank, which contribute nothing; one expert
// repeated in a token's top-k (summed twice, as on the CPU: the expert then has more pairs than
// there are tokens, more passes than the host planned, and its tile no K split) and shared by every
// token. Sizes: 16 and 32 pairs (the grid's plan; T = 2 and 4 take the K split), 33 and 72 (the
// plan kernel's, in the fused grid too). The fused result is also checked against the CPU
// reference, which follows the same contract (ops::Backend::moe_experts).
TEST(GpuParityMoe, TensorCoreDecodeFusedOwnPlanOddIds) {
  std::unique_ptr<ops::Backend> be = make_bf16_backend();
  ASSERT_TRUE(be);
  std::mt19937 rng(7750);
  for (const WeightKind kind : {WeightKind::FP8, WeightKind::INT4_BF16}) {
    const int64_t hidden = 256, inter = 128, experts = 12;
    const auto set = make_experts(rng, kind, experts, hidden, inter, 4);  // 4 experts not held
    struct Case {
      int64_t tokens;
      int top_k;
    };
    for (const Case c : {Case{2, 8}, Case{4, 8}, Case{11, 3}, Case{9, 8}}) {  // 16, 32, 33, 72 pairs
      std::vector<int32_t> id_values(size_t(c.tokens * c.top_k));
      std::uniform_int_distribution<int32_t> pick(0, int32_t(experts) - 1);
      for (size_t i = 0; i < id_values.size(); ++i) id_values[i] = pick(rng);
      const int32_t odd[] = {-1, int32_t(experts), 1 << 30};
      for (size_t i = 0; i < id_values.size(); i += 7) id_values[i] = odd[(i / 7) % 3];
      for (int64_t t = 0; t < c.tokens; ++t) id_values[size_t(t * c.top_k + 1)] = 3;  // every token: expert 3
      id_values[0] = id_values[1];                                                     // token 0: expert 3 twice
      const Twin ids = twin_from_ints(id_values, {c.tokens, int64_t(c.top_k)});
      const Twin x = twin_random(rng, DType::F32, {c.tokens, hidden});
      const Twin weights = twin_random(rng, DType::F32, {c.tokens, int64_t(c.top_k)}, 0.05f, 1.0f);
      auto run = [&](bool fused) {
        const Twin out = twin_output(DType::F32, {c.tokens, hidden});
        gpu::set_moe_tc_fused(*be, fused);
        be->moe_experts(x.gpu, ids.gpu, weights.gpu, set->gpu, out.gpu);
        be->synchronize();
        gpu::set_moe_tc_fused(*be, std::nullopt);
        return out;
      };
      const Twin fused_out = run(true);
      const std::vector<float> two = gpu_values(run(false)), fused = gpu_values(fused_out), again = gpu_values(run(true));
      const std::string name = fmt::format("{} T{} k{}", weight_kind_name(kind), c.tokens, c.top_k);
      // The CPU reference under the same contract: odd ids contribute 0, a repeated id counts twice.
      cpu_backend().moe_experts(x.cpu, ids.cpu, weights.cpu, set->cpu, fused_out.cpu);
      EXPECT_TRUE(check_parity("moe_experts", name + " [fused grid, odd ids]", fused_out, tc_tol(kind)));
      EXPECT_EQ(std::memcmp(fused.data(), two.data(), fused.size() * sizeof(float)), 0)
          << name << ": fused grid (own plan) and two grids differ";
      EXPECT_EQ(std::memcmp(again.data(), two.data(), again.size() * sizeof(float)), 0) << name << ": second call";
      float peak = 0.0f;
      for (float v : two) peak = std::max(peak, std::abs(v));
      EXPECT_GT(peak, 0.0f) << name << ": every output zero (nothing was computed)";
    }
  }
}

// The INT4 weight rings (per-warp shared-memory stages filled by the copy engine) read the same
// fragments in the same chunk order as the register bursts, so both must give the same bits, in
// the two grids and in the fused grid. Narrow stages: 8 gate/up and 4 down tiles and one stage per
// gate/up K half (256 x 512, T <= 2: K split), several passes of columns per expert (T = 16 on 3
// experts, top-2), a shape whose down pass is longer than its gate/up pass (256 x 1024). Wide
// stages: one stage per gate/up K half and per down tile (1024 x 1024, T <= 2: K split), the
// DeepSeek-V3 shape at batch 1 / 2 / 8. Each ring call runs twice (the barriers' phases restart
// with every launch). In the fused grid a CTA's items of both kinds follow each other through its
// rings (each slot's phase carries over).
// The test checks that the ring path ran (the test GPU is sm_90), and the ring result against the
// CPU.
TEST(GpuParityMoe, TensorCoreDecodeBf16RingBitIdentical) {
  std::unique_ptr<ops::Backend> be = make_bf16_backend();
  ASSERT_TRUE(be);
  struct Case {
    int64_t hidden, inter, experts;
    int top_k;
    std::vector<int64_t> tokens;
  };
  const Case cases[] = {{256, 512, 12, 4, {1, 2, 5}},
                        {1280, 512, 3, 2, {16}},
                        {256, 1024, 12, 4, {3}},
                        {1024, 1024, 12, 4, {1, 2}},
                        {7168, 2048, 12, 8, {1, 2, 8}}};
  std::mt19937 rng(7800);
  for (const Case& c : cases) {
    const auto set = make_experts(rng, WeightKind::INT4_BF16, c.experts, c.hidden, c.inter, 4);
    for (const int64_t tokens : c.tokens) {
      const Twin x = twin_random(rng, DType::F32, {tokens, c.hidden});
      const Twin ids = random_ids(rng, tokens, c.experts, c.top_k);
      const Twin weights = twin_random(rng, DType::F32, {tokens, c.top_k}, 0.05f, 1.0f);
      auto run = [&](bool ring, bool fused) {
        const Twin out = twin_output(DType::F32, {tokens, c.hidden});
        gpu::set_moe_tc_ring(*be, ring);
        gpu::set_moe_tc_fused(*be, fused);
        be->moe_experts(x.gpu, ids.gpu, weights.gpu, set->gpu, out.gpu);
        be->synchronize();
        EXPECT_EQ(gpu::moe_tc_last_ring(*be), ring) << "the ring path did not run as asked";
        gpu::set_moe_tc_ring(*be, true);  // the backend's defaults
        gpu::set_moe_tc_fused(*be, std::nullopt);
        return out;
      };
      const std::vector<float> want = gpu_values(run(false, false));
      const std::string name =
          fmt::format("INT4 T{} H{} I{} E{} k{}", tokens, c.hidden, c.inter, c.experts, c.top_k);
      for (const bool fused : {false, true})
        for (int rep = 0; rep < 2; ++rep) {
          const Twin ringed = run(true, fused);
          const std::vector<float> got = gpu_values(ringed);
          EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
              << name << ": rings (" << (fused ? "fused grid" : "two grids") << ", call " << rep
              << ") and register bursts differ";
          if (rep == 0 && !fused) {
            cpu_backend().moe_experts(x.cpu, ids.cpu, weights.cpu, set->cpu, ringed.cpu);
            EXPECT_TRUE(check_parity("moe_experts", name + " [bf16 tc, rings]", ringed, tc_tol(WeightKind::INT4_BF16)));
          }
        }
    }
  }
}

// INT4 h reaches the down items as f16 under a power-of-two scale per token and 64-k chunk (each
// gate/up tile's own max), not one per row: a chunk 2^40 below its neighbours keeps its precision.
// Each expert's up rows [0, 64) have their group scales x 2^-40 (h there ~1e-12, the other 448 rows
// O(1)) and the down weights' groups past k = 64 scale 0, so y is the tiny chunk's contribution
// alone (one scale per row would flush it to f16 zero). Fused ring grid (T = 1 takes the K split),
// two grids, and register bursts; against the CPU with tc_tol scaled by the same 2^-40.
TEST(GpuParityMoe, TensorCoreDecodeBf16HChunkScale) {
  std::unique_ptr<ops::Backend> be = make_bf16_backend();
  ASSERT_TRUE(be);
  const int64_t hidden = 256, inter = 512;  // the smallest shape with the rings (moe_tc_ring_ok)
  const WeightTweak tweak = [&](TestWeight& w, int m) {
    auto* scale = static_cast<uint16_t*>(w.w.scale.data);
    const int64_t groups = w.w.scale.shape[1];
    if (m == 1)
      for (int64_t o = 0; o < 64; ++o)
        for (int64_t g = 0; g < groups; ++g) scale[o * groups + g] = uint16_t(scale[o * groups + g] - (40 << 7));
    if (m == 2)
      for (int64_t o = 0; o < hidden; ++o)
        for (int64_t g = 2; g < groups; ++g) scale[o * groups + g] = 0;
  };
  std::mt19937 rng(7900);
  const auto set = make_experts(rng, WeightKind::INT4_BF16, 12, hidden, inter, 4, tweak);
  const Tolerance base = tc_tol(WeightKind::INT4_BF16);
  const Tolerance tol{std::ldexp(base.atol, -40), base.rtol, base.basis + "; atol x 2^-40 (the chunk's scale)"};
  struct Mode {
    bool ring;
    std::optional<bool> fused;
    const char* tag;
  };
  uint32_t seed = 7901;
  for (const Mode& mode : {Mode{true, std::nullopt, " h chunk 2^-40 [bf16 tc]"},
                           Mode{true, false, " h chunk 2^-40 [bf16 tc, two grids]"},
                           Mode{false, false, " h chunk 2^-40 [bf16 tc, bursts]"}})
    for (int64_t t : {1, 3}) {
      gpu::set_moe_tc_ring(*be, mode.ring);
      gpu::set_moe_tc_fused(*be, mode.fused);
      check_experts_on(*be, *set, WeightKind::INT4_BF16, gpu::MoePath::Decode, t, 4, false, seed++, tol, mode.tag);
      EXPECT_EQ(gpu::moe_tc_last_ring(*be), mode.ring) << mode.tag;
      gpu::set_moe_tc_ring(*be, true);
      gpu::set_moe_tc_fused(*be, std::nullopt);
    }
}

// The bench's probes (set_moe_tc_probe: the fused ring grid with its arithmetic skipped, or with no
// weight copied) take the same items from the same queue, so they must leave the queue counters and
// K-split tickets zero as a real call does: real calls right after two probe calls match the CPU,
// with the K split (batch 1) and without (batch 8), on the DeepSeek-V3 shape.
TEST(GpuParityMoe, TensorCoreDecodeProbeLeavesQueueClean) {
  std::unique_ptr<ops::Backend> be = make_bf16_backend();
  ASSERT_TRUE(be);
  std::mt19937 rng(7900);
  const int64_t hidden = 7168, inter = 2048, num_experts = 12;
  const int top_k = 8;
  const auto set = make_experts(rng, WeightKind::INT4_BF16, num_experts, hidden, inter, 4);
  for (const auto probe : {gpu::MoeTcProbe::All, gpu::MoeTcProbe::MathOnly}) {
    for (const int64_t tokens : {1, 8}) {
      const Twin x = twin_random(rng, DType::F32, {tokens, hidden});
      const Twin ids = random_ids(rng, tokens, num_experts, top_k);
      const Twin weights = twin_random(rng, DType::F32, {tokens, top_k}, 0.05f, 1.0f);
      gpu::set_moe_tc_fused(*be, true);
      gpu::set_moe_tc_probe(*be, probe);
      for (int rep = 0; rep < 2; ++rep) {
        const Twin garbage = twin_output(DType::F32, {tokens, hidden});
        be->moe_experts(x.gpu, ids.gpu, weights.gpu, set->gpu, garbage.gpu);
        be->synchronize();
        EXPECT_TRUE(gpu::moe_tc_last_ring(*be)) << "the probe ran without the rings";
      }
      gpu::set_moe_tc_probe(*be, gpu::MoeTcProbe::Off);
      const Twin out = twin_output(DType::F32, {tokens, hidden});
      be->moe_experts(x.gpu, ids.gpu, weights.gpu, set->gpu, out.gpu);
      be->synchronize();
      gpu::set_moe_tc_fused(*be, std::nullopt);
      cpu_backend().moe_experts(x.cpu, ids.cpu, weights.cpu, set->cpu, out.cpu);
      EXPECT_TRUE(check_parity("moe_experts", fmt::format("INT4 T{} H{} I{} E{} k{} [fused grid after probe {} calls]",
                                                          tokens, hidden, inter, num_experts, top_k, int(probe)),
                               out, tc_tol(WeightKind::INT4_BF16)));
    }
  }
}

// Decode steps are graph-captured: the tensor-core path's launches depend on shapes only, so a
// replay after new routing ids (same buffers, fresh values) computes the new step. The output is
// re-poisoned before each replay so that only the replay can pass. Both the two grids and the fused
// grid (whose queue counters each replay must find zero and leave zero); INT4 runs the weight rings.
TEST(GpuParityMoe, TensorCoreDecodeBf16GraphReplay) {
  std::unique_ptr<ops::Backend> be = make_bf16_backend();
  ASSERT_TRUE(be);
  std::mt19937 rng(7400);
  for (const bool fused : {false, true}) {
    for (WeightKind kind : {WeightKind::FP8, WeightKind::INT4_BF16}) {
      gpu::set_moe_tc_fused(*be, fused);
      const int64_t tokens = 5, hidden = 256, inter = 512, num_experts = 16;  // INT4: the rings
      const int top_k = 4;
      const auto set = make_experts(rng, kind, num_experts, hidden, inter, 4);
      const Twin x = twin_random(rng, DType::F32, {tokens, hidden});
      const Twin ids = random_ids(rng, tokens, num_experts, top_k);
      const Twin weights = twin_random(rng, DType::F32, {tokens, top_k}, 0.05f, 1.0f);
      const Twin out = twin_output(DType::F32, {tokens, hidden});
      const Twin poison = twin_output(DType::F32, {tokens, hidden});
      be->moe_experts(x.gpu, ids.gpu, weights.gpu, set->gpu, out.gpu);  // eager: builds the table, grows scratch
      be->synchronize();
      EXPECT_EQ(gpu::moe_tc_last_ring(*be), kind == WeightKind::INT4_BF16);
      std::unique_ptr<ops::OpGraph> graph =
          be->capture([&] { be->moe_experts(x.gpu, ids.gpu, weights.gpu, set->gpu, out.gpu); });
      for (int step = 0; step < 3; ++step) {
        const Twin next = random_ids(rng, tokens, num_experts, top_k);
        std::memcpy(ids.host_buf->data(), next.host_buf->data(), ids.host_buf->size());
        sync_to_device(ids);
        gpu_backend().synchronize();  // the copy ran on the default test backend's stream
        be->copy(poison.gpu, out.gpu);
        graph->replay();
        be->synchronize();
        cpu_backend().moe_experts(x.cpu, ids.cpu, weights.cpu, set->cpu, out.cpu);
        std::string name = weight_kind_name(kind);
        name += " graph replay step ";
        name += std::to_string(step);
        name += fused ? " T5 H256 I512 E16 k4 [bf16 tc, fused grid]" : " T5 H256 I512 E16 k4 [bf16 tc]";
        EXPECT_TRUE(check_parity("moe_experts", name, out, tc_tol(kind)));
      }
      gpu::set_moe_tc_fused(*be, std::nullopt);  // the backend's default
    }
  }
}

// Bf16 mode, shapes or formats the tensor-core kernel does not take: the exact decode kernel runs
// (exact tolerance proves it): FP8 352 x 96 and INT4 192 x 64 (not multiples of 64 / 128), INT4 with
// F32 scales and BF16 weights (other formats), H = 203 (unaligned rows).
TEST(GpuParityMoe, TensorCoreDecodeBf16Fallback) {
  std::unique_ptr<ops::Backend> be = make_bf16_backend();
  ASSERT_TRUE(be);
  struct Shape {
    WeightKind kind;
    int64_t hidden, inter;
  };
  const Shape shapes[] = {{WeightKind::FP8, 352, 96},
                          {WeightKind::INT4_BF16, 192, 64},
                          {WeightKind::INT4_F32, 256, 128},
                          {WeightKind::BF16, 256, 128},
                          {WeightKind::FP8, 203, 64}};
  uint32_t seed = 7300;
  for (const Shape& sh : shapes) {
    std::mt19937 rng(seed++);
    const auto set = make_experts(rng, sh.kind, 12, sh.hidden, sh.inter, 4);
    for (int64_t t : {1, 8})
      check_experts_on(*be, *set, sh.kind, gpu::MoePath::Decode, t, 4, t == 1, seed++, exact_tol(*set),
                       " [bf16 fallback]");
  }
}

// ---- GemmPrecision::Bf16: the tensor-core grouped GEMM (gpu_moe_grouped_tc.h) --------------------
// Shapes it takes (hidden, inter % 32, formats BF16 / FP8 / INT4 bf16-scale) that straddle its tiles:
// 64-row gate/up column tiles and 128-row down tiles with partial last ones (I 96, 160, 576; H 224,
// 320), FP8 partial 128 x 128 scale blocks in k and n (H 320 = 2.5 blocks, I 576 = 4.5) and a
// single 32-k step (I 32). T = 17, 64, 333 at top-4 over 12 experts (3 not held): ~8, ~28 and ~148
// pairs per expert, i.e. one partial 64-pair tile up to three with a ragged tail; strided x / out.
TEST(GpuParityMoe, TensorCoreGroupedBf16) {
  std::unique_ptr<ops::Backend> be = make_bf16_backend();
  ASSERT_TRUE(be);
  struct Shape {
    WeightKind kind;
    int64_t hidden, inter;
  };
  const Shape shapes[] = {{WeightKind::BF16, 224, 96},
                          {WeightKind::FP8, 320, 576},
                          {WeightKind::FP8, 160, 32},
                          {WeightKind::INT4_BF16, 384, 160}};
  uint32_t seed = 7500;
  for (const Shape& sh : shapes) {
    std::mt19937 rng(seed++);
    const auto set = make_experts(rng, sh.kind, 12, sh.hidden, sh.inter, 4);
    for (int64_t t : {17, 64, 333})
      check_experts_on(*be, *set, sh.kind, gpu::MoePath::Grouped, t, 4, t == 17, seed++, grouped_tc_tol(),
                       " [bf16 grouped tc]");
  }
}

// Few experts, many pairs each: T 333 top-2 over 3 experts (~222 pairs: 4 tiles, the last partial)
// and T 200 top-1 (~67: one full tile + a 3-pair tail), every format the kernel takes.
TEST(GpuParityMoe, TensorCoreGroupedBf16Crowded) {
  std::unique_ptr<ops::Backend> be = make_bf16_backend();
  ASSERT_TRUE(be);
  uint32_t seed = 7600;
  for (WeightKind kind : {WeightKind::BF16, WeightKind::FP8, WeightKind::INT4_BF16}) {
    std::mt19937 rng(seed++);
    const auto set = make_experts(rng, kind, 3, 256, 128, 0);
    check_experts_on(*be, *set, kind, gpu::MoePath::Grouped, 333, 2, false, seed++, grouped_tc_tol(),
                     " [bf16 grouped tc]");
    check_experts_on(*be, *set, kind, gpu::MoePath::Grouped, 200, 1, true, seed++, grouped_tc_tol(),
                     " [bf16 grouped tc]");
  }
}

// The DeepSeek-V3 expert shape (K 7168 for gate/up: 56 FP8 scale blocks, 224 INT4 groups), Auto at
// T = 64 (the grouped path), one expert missing.
TEST(GpuParityMoe, TensorCoreGroupedBf16DeepSeekShape) {
  std::unique_ptr<ops::Backend> be = make_bf16_backend();
  ASSERT_TRUE(be);
  uint32_t seed = 7700;
  for (WeightKind kind : {WeightKind::FP8, WeightKind::INT4_BF16}) {
    std::mt19937 rng(seed++);
    const auto set = make_experts(rng, kind, 5, 7168, 2048, 4);
    check_experts_on(*be, *set, kind, gpu::MoePath::Auto, 64, 2, false, seed++, grouped_tc_tol(),
                     " [bf16 grouped tc]");
  }
}

// Each grouped tensor-core kernel on every format it takes: mma.sync everywhere, wgmma
// (gpu_moe_grouped_sm90a.h; what Auto takes there) where the device is compute capability 9.0, else
// it is skipped and says so. Shapes as above: partial column tiles and FP8 scale blocks (H 320,
// I 576), a half-live last 64-k step (H 160, I 32: one 32-k step of down; INT4 H 224: 3.5 steps),
// crowded segments (T 333 top-2 over 3 experts: 4 row tiles, the last partial), and the DeepSeek-V3
// expert (K 7168 = 112 steps of 64).
struct GroupedPathGuard {
  explicit GroupedPathGuard(gpu::MoeGroupedPath p) { gpu::set_moe_grouped_path(p); }
  ~GroupedPathGuard() { gpu::set_moe_grouped_path(gpu::MoeGroupedPath::Auto); }
};

TEST(GpuParityMoe, TensorCoreGroupedEachPath) {
  std::unique_ptr<ops::Backend> be = make_bf16_backend();
  ASSERT_TRUE(be);
  for (gpu::MoeGroupedPath path : {gpu::MoeGroupedPath::MmaSync, gpu::MoeGroupedPath::Wgmma}) {
    const bool wgmma = path == gpu::MoeGroupedPath::Wgmma;
    if (wgmma && !gpu::moe_grouped_sm90a_supported()) {
      std::printf("[ skip ] wgmma grouped MoE: device is not compute capability 9.0\n");
      continue;
    }
    GroupedPathGuard guard(path);
    const char* tag = wgmma ? " [bf16 grouped wgmma]" : " [bf16 grouped mma.sync]";
    uint32_t seed = 7900;
    struct Case {
      WeightKind kind;
      int64_t experts, hidden, inter;
      int top_k;
      std::vector<int64_t> tokens;
    };
    const Case cases[] = {{WeightKind::FP8, 12, 320, 576, 4, {17, 64, 333}},
                          {WeightKind::FP8, 12, 160, 32, 4, {17, 333}},
                          {WeightKind::FP8, 3, 256, 128, 2, {333}},
                          {WeightKind::FP8, 5, 7168, 2048, 2, {64}},
                          {WeightKind::BF16, 12, 224, 96, 4, {17, 333}},
                          {WeightKind::BF16, 3, 256, 128, 2, {333}},
                          {WeightKind::INT4_BF16, 12, 224, 160, 4, {17, 333}},
                          {WeightKind::INT4_BF16, 3, 256, 128, 2, {333}},
                          {WeightKind::INT4_BF16, 5, 7168, 2048, 2, {64}}};
    for (const Case& c : cases) {
      std::mt19937 rng(seed++);
      const auto set = make_experts(rng, c.kind, c.experts, c.hidden, c.inter, c.experts > 3 ? 3 : 0);
      for (int64_t t : c.tokens)
        check_experts_on(*be, *set, c.kind, gpu::MoePath::Grouped, t, c.top_k, t == 17, seed++, grouped_tc_tol(),
                         tag);
    }
  }
}

// Bf16 mode, grouped path, what the tensor-core kernel does not take: the exact fp32 grouped kernel
// runs (the exact tolerance proves it). H 200 and I 80 (not multiples of 32), H 203 (unaligned rows),
// INT4 with F32 scales and F16 dense weights (not exact in bf16).
TEST(GpuParityMoe, TensorCoreGroupedBf16Fallback) {
  std::unique_ptr<ops::Backend> be = make_bf16_backend();
  ASSERT_TRUE(be);
  struct Shape {
    WeightKind kind;
    int64_t hidden, inter;
  };
  const Shape shapes[] = {{WeightKind::FP8, 200, 96},
                          {WeightKind::INT4_BF16, 256, 80},
                          {WeightKind::BF16, 203, 64},
                          {WeightKind::INT4_F32, 256, 128},
                          {WeightKind::F16, 256, 128}};
  uint32_t seed = 7800;
  for (const Shape& sh : shapes) {
    std::mt19937 rng(seed++);
    const auto set = make_experts(rng, sh.kind, 12, sh.hidden, sh.inter, 4);
    for (int64_t t : {17, 40})
      check_experts_on(*be, *set, sh.kind, gpu::MoePath::Grouped, t, 4, t == 17, seed++, exact_tol(*set),
                       " [bf16 grouped fallback]");
  }
}

// ---- moe_route at decode batch sizes (one warp per token) ---------------------------------------------
// DeepSeek-V3 / Kimi K2 shapes at T = 1, 3, 7 (several tokens share a block), top_k above the warp
// width, and the largest expert counts (one warp per block: 4 * (E + n_group + top_k) bytes each).
TEST(GpuParityMoe, RouteDecodeBatches) {
  uint32_t seed = 500;
  for (int64_t t : {int64_t(1), int64_t(3), int64_t(7)}) {
    check_route(RouteCase{t, 256, 8, 8, 4, true, true}, seed++);
    check_route(RouteCase{t, 384, 8, 1, 1, true, true}, seed++);
    check_route(RouteCase{t, 256, 40, 8, 4, false, true}, seed++);
    check_route(RouteCase{t, 160, 6, 8, 3, true, false}, seed++);
  }
  check_route(RouteCase{5, 4096, 64, 1, 1, true, true}, seed++);
  check_route(RouteCase{3, 4096, 8, 2048, 1024, true, true}, seed++);
  check_route(RouteCase{2, 2, 2, 1, 1, false, true}, seed++);
}

// Exact ties at decode shapes: E = 256 in 8 groups of 32 (DeepSeek-V3) and E = 384 ungrouped, logits
// from four values, so whole groups tie and the top-k boundary falls inside a run of equal scores.
TEST(GpuParityMoe, RouteTiesDecode) {
  std::mt19937 rng(37);
  for (int64_t experts : {int64_t(256), int64_t(384)}) {
    for (int64_t tokens : {int64_t(1), int64_t(3)}) {
      std::vector<float> logits(static_cast<size_t>(tokens * experts));
      for (float& v : logits) v = float(rng() % 4) * 0.75f;  // non-negative: see RouteTies
      const Twin l = twin_from_floats(logits, {tokens, experts});
      const ops::MoeRouting routing{8, experts == 256 ? 8 : 1, experts == 256 ? 4 : 1, true, 2.5f};
      const Twin ids = twin_output(DType::I32, {tokens, 8});
      const Twin w = twin_output(DType::F32, {tokens, 8});
      run_both([&](ops::Backend& be, bool g) {
        be.moe_route(pick(l, g), TensorView{}, routing, pick(ids, g), pick(w, g));
      });
      const std::string name = fmt::format("ties T{} E{} k8 g{}/{}", tokens, experts, routing.n_group,
                                           routing.topk_group);
      EXPECT_TRUE(check_parity("moe_route ids", name, ids, Tolerance{0, 0, "tie order: lower id first, exact"}));
      EXPECT_TRUE(check_parity("moe_route weights", name, w, Tolerance{1e-7, 1e-6, "expf 2-ulp + renormalization"}));
    }
  }
}

// moe_plan's block size follows the shapes: one warp (E = 256, T = 1), a few warps (E = 384, T = 16;
// E = 40, T = 5), 1024 threads (T = 300). Outputs must not depend on it; every 5th expert is not held.
TEST(GpuParityMoe, ExpertsPlanBlockSizes) {
  std::mt19937 rng(41);
  uint32_t seed = 600;
  for (const auto& [experts, tokens] : {std::pair<int64_t, int64_t>{256, 1}, {384, 16}, {40, 5}, {256, 300}}) {
    auto set = make_experts(rng, WeightKind::BF16, experts, 64, 32, 5);
    for (gpu::MoePath path : kPaths)
      if (tokens <= 16 || path == gpu::MoePath::Grouped)
        check_experts(*set, WeightKind::BF16, path, tokens, 8, false, seed++);
  }
}

}  // namespace
}  // namespace mla::test
