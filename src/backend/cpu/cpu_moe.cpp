// CPU reference for DeepSeek-V3 MoE: noaux_tc routing (sigmoid, bias for selection only, group limit)
// and the routed experts. Experts run on the tokens routed to them, grouped by a counting sort, so
// each expert is one batched GEMM chain (gate/up, SiLU-mul, down) rather than one GEMV per token.
#include <algorithm>
#include <cmath>
#include <limits>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_util.h"

namespace mla::cpu {

namespace {

// Orders expert (or group) indices by score, descending; equal scores keep the lower index first,
// so the selection is a pure function of the scores (the references leave tie order unspecified).
struct ByScoreDesc {
  const float* score;
  bool operator()(int32_t a, int32_t b) const {
    return score[a] > score[b] || (score[a] == score[b] && a < b);
  }
};

void check_expert_weight(const ops::Weight& w, int64_t out_features, int64_t in_features, size_t e, const char* name) {
  const Status st = ops::validate_weight(w);
  MLA_CHECK(st.is_ok(), "expert {} {}: {}", e, name, st.message());
  MLA_CHECK(w.out_features == out_features && w.in_features == in_features, "expert {} {} is [{}, {}], want [{}, {}]",
            e, name, w.out_features, w.in_features, out_features, in_features);
}

}  // namespace

void CpuBackend::moe_route(const TensorView& router_logits, const TensorView& bias, const ops::MoeRouting& routing,
                           const TensorView& topk_ids, const TensorView& topk_weights) {
  check_view(router_logits, DType::F32, 2, "moe_route router_logits");
  check_view(topk_ids, DType::I32, 2, "moe_route topk_ids");
  check_view(topk_weights, DType::F32, 2, "moe_route topk_weights");
  const int64_t num_tokens = router_logits.dim(0), num_experts = router_logits.dim(1);
  const int64_t top_k = routing.top_k, n_group = routing.n_group, topk_group = routing.topk_group;
  MLA_CHECK(topk_ids.dim(0) == num_tokens && topk_ids.dim(1) == top_k && topk_weights.dim(0) == num_tokens &&
                topk_weights.dim(1) == top_k,
            "moe_route: logits {} ids {} weights {} top_k {}", router_logits.describe(), topk_ids.describe(),
            topk_weights.describe(), top_k);
  const bool has_bias = bias.data != nullptr;
  if (has_bias) check_vector(bias, DType::F32, num_experts, "moe_route bias");
  MLA_CHECK(n_group >= 1 && num_experts % n_group == 0 && topk_group >= 1 && topk_group <= n_group,
            "moe_route: {} experts in {} groups, keep {}", num_experts, n_group, topk_group);
  const int64_t group_size = num_experts / n_group;
  MLA_CHECK(n_group == 1 || group_size >= 2, "moe_route: group score needs >= 2 experts per group, got {}",
            group_size);
  MLA_CHECK(top_k >= 1 && top_k <= topk_group * group_size, "moe_route: top_k {} of {} selectable experts", top_k,
            topk_group * group_size);

  float* s = grow(route_scores_, size_t(num_experts));
  float* b = grow(route_biased_, size_t(num_experts));
  float* group_score = grow(route_group_, size_t(n_group));
  int32_t* index = grow(route_index_, size_t(std::max(num_experts, n_group)));
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* logits = router_logits.at<const float>(t);
    for (int64_t e = 0; e < num_experts; ++e) {
      s[e] = 1.0f / (1.0f + std::exp(-logits[e]));
      b[e] = s[e] + (has_bias ? f32_at(bias, e) : 0.0f);
    }
    if (n_group > 1) {
      // Group score = sum of the group's two largest biased scores.
      for (int64_t g = 0; g < n_group; ++g) {
        const float* bg = b + g * group_size;
        float first = -std::numeric_limits<float>::infinity(), second = first;
        for (int64_t e = 0; e < group_size; ++e) {
          if (bg[e] > first) {
            second = first;
            first = bg[e];
          } else if (bg[e] > second) {
            second = bg[e];
          }
        }
        group_score[g] = first + second;
      }
      for (int32_t g = 0; g < n_group; ++g) index[g] = g;
      std::sort(index, index + n_group, ByScoreDesc{group_score});
      // Experts of the groups ranked topk_group and below can never be selected.
      for (int64_t rank = topk_group; rank < n_group; ++rank)
        std::fill_n(b + int64_t(index[rank]) * group_size, group_size, -std::numeric_limits<float>::infinity());
    }
    for (int32_t e = 0; e < num_experts; ++e) index[e] = e;
    std::partial_sort(index, index + top_k, index + num_experts, ByScoreDesc{b});

    // Weights come from the unbiased sigmoid scores of the chosen experts.
    int32_t* ids = topk_ids.at<int32_t>(t);
    float* w = topk_weights.at<float>(t);
    float sum = 0.0f;
    for (int64_t k = 0; k < top_k; ++k) {
      ids[k] = index[k];
      w[k] = s[index[k]];
      sum += w[k];
    }
    const float denom = routing.norm_topk_prob ? sum + 1e-20f : 1.0f;
    for (int64_t k = 0; k < top_k; ++k) w[k] = w[k] / denom * routing.routed_scaling_factor;
  }
}

void CpuBackend::moe_experts(const TensorView& x, const TensorView& topk_ids, const TensorView& topk_weights,
                             std::span<const ops::ExpertWeights> experts, const TensorView& out) {
  check_view(x, DType::F32, 2, "moe_experts x");
  check_view(out, DType::F32, 2, "moe_experts out");
  check_view(topk_ids, DType::I32, 2, "moe_experts topk_ids");
  check_view(topk_weights, DType::F32, 2, "moe_experts topk_weights");
  MLA_CHECK(same_shape(x, out), "moe_experts: x {} out {}", x.describe(), out.describe());
  MLA_CHECK(!views_alias(x, out), "moe_experts: out aliases x");
  const int64_t num_tokens = x.dim(0), hidden = x.dim(1), top_k = topk_ids.dim(1);
  MLA_CHECK(topk_ids.dim(0) == num_tokens && topk_weights.dim(0) == num_tokens && topk_weights.dim(1) == top_k,
            "moe_experts: x {} ids {} weights {}", x.describe(), topk_ids.describe(), topk_weights.describe());
  const int64_t num_experts = int64_t(experts.size());

  for (int64_t t = 0; t < num_tokens; ++t) std::fill_n(out.at<float>(t), hidden, 0.0f);

  // Counting sort of the (token, slot) pairs by expert: pairs of expert e are
  // order[offsets[e] .. offsets[e+1]), in token order. Ids outside [0, E) contribute 0 (the op's
  // contract, as on the GPU): they take no place in the sort.
  auto in_range = [&](int32_t e) { return e >= 0 && e < num_experts; };
  int32_t* offsets = grow(moe_offsets_, size_t(num_experts + 1));
  int32_t* order = grow(moe_order_, size_t(num_tokens * top_k));
  std::fill_n(offsets, num_experts + 1, 0);
  for (int64_t t = 0; t < num_tokens; ++t)
    for (int64_t k = 0; k < top_k; ++k) {
      const int32_t e = *topk_ids.at<const int32_t>(t, k);
      if (in_range(e)) ++offsets[e + 1];
    }
  for (int64_t e = 0; e < num_experts; ++e) offsets[e + 1] += offsets[e];
  for (int64_t t = 0; t < num_tokens; ++t)
    for (int64_t k = 0; k < top_k; ++k) {
      const int32_t e = *topk_ids.at<const int32_t>(t, k);
      if (in_range(e)) order[offsets[e]++] = int32_t(t * top_k + k);
    }
  // The fill loop advanced offsets[e] to the end of expert e, i.e. the start of e+1: shift back.
  for (int64_t e = num_experts; e > 0; --e) offsets[e] = offsets[e - 1];
  offsets[0] = 0;

  for (int64_t e = 0; e < num_experts; ++e) {
    const int64_t begin = offsets[e], rows = offsets[e + 1] - begin;
    const ops::ExpertWeights& ew = experts[size_t(e)];
    if (rows == 0 || ew.gate_proj.empty()) continue;  // not routed to, or not held by this rank
    const int64_t inter = ew.gate_proj.out_features;
    check_expert_weight(ew.gate_proj, inter, hidden, size_t(e), "gate_proj");
    check_expert_weight(ew.up_proj, inter, hidden, size_t(e), "up_proj");
    check_expert_weight(ew.down_proj, hidden, inter, size_t(e), "down_proj");

    float* xe = grow(moe_x_, size_t(rows * hidden));
    for (int64_t r = 0; r < rows; ++r) {
      const float* src = x.at<const float>(order[begin + r] / top_k);
      std::copy_n(src, hidden, xe + r * hidden);
    }
    const TensorView xv = TensorView::contiguous(xe, DType::F32, {rows, hidden});
    const TensorView gate = TensorView::contiguous(grow(moe_gate_, size_t(rows * inter)), DType::F32, {rows, inter});
    const TensorView up = TensorView::contiguous(grow(moe_up_, size_t(rows * inter)), DType::F32, {rows, inter});
    const TensorView down = TensorView::contiguous(grow(moe_down_, size_t(rows * hidden)), DType::F32, {rows, hidden});
    linear(xv, ew.gate_proj, gate);  // [rows, I]
    linear(xv, ew.up_proj, up);      // [rows, I]
    silu_mul(gate, up, gate);        // [rows, I]
    linear(gate, ew.down_proj, down);  // [rows, hidden]
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t = order[begin + r] / top_k, k = order[begin + r] % top_k;
      const float w = *topk_weights.at<const float>(t, k);
      const float* y = down.at<const float>(r);
      float* o = out.at<float>(t);
      for (int64_t d = 0; d < hidden; ++d) o[d] += w * y[d];
    }
  }
}

}  // namespace mla::cpu
