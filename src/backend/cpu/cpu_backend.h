// The CPU reference backend: every op of ops::Backend in plain fp32 loops, the executable
// specification that each GPU kernel is compared against. Readability first; the only speed work is
// OpenBLAS for large GEMMs, OpenMP over independent rows/heads, and bounded, grow-once scratch.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "ops/backend.h"

namespace mla::cpu {

struct CpuBackendOptions {
  // Every output row independent of the other rows in the call (fixed-order dot products), so a
  // sequence's results do not depend on its batch companions. Off: OpenBLAS sgemm for T > 16.
  bool batch_invariant = true;
};

class CpuBackend final : public ops::Backend {
 public:
  // Sets OpenBLAS to one thread (cpu_linear.cpp explains why).
  explicit CpuBackend(const CpuBackendOptions& options = {});
  CpuBackend(const CpuBackend&) = delete;
  CpuBackend& operator=(const CpuBackend&) = delete;

  std::string_view name() const override { return "cpu"; }

  // memory (cpu_memory.cpp)
  Buffer alloc(size_t bytes) override;
  TensorView place_weight(const TensorView& host) override;
  void copy_from_host(const TensorView& dst, const void* src) override;
  void copy_to_host(void* dst, const TensorView& src) override;
  void synchronize() override {}
  std::unique_ptr<ops::OpGraph> capture(const std::function<void()>& record) override;

  // elementwise and normalization (cpu_elementwise.cpp)
  void embedding(const TensorView& ids, const TensorView& table, const TensorView& out) override;
  void rms_norm(const TensorView& x, const TensorView& weight, float eps, const TensorView& out) override;
  void add_rms_norm(const TensorView& residual, const TensorView& x, const TensorView& weight, float eps,
                    const TensorView& out) override;
  void add(const TensorView& a, const TensorView& b, const TensorView& out) override;
  void copy(const TensorView& src, const TensorView& dst) override;  // cpu_copy.cpp
  void silu_mul(const TensorView& gate, const TensorView& up, const TensorView& out) override;
  void rope(const TensorView& x, const TensorView& positions, const ops::RopeTable& rope) override;

  // GEMM (cpu_linear.cpp)
  void linear(const TensorView& x, const ops::Weight& w, const TensorView& out) override;
  void linear_group(const TensorView& x, std::span<const ops::Weight* const> w,
                    std::span<const TensorView> out) override;

  // MLA (cpu_mla.cpp)
  void kv_cache_write(const TensorView& latent, const TensorView& slot_mapping, const TensorView& cache) override;
  void mla_attention_naive(const TensorView& q, const TensorView& cache, const ops::Weight& kv_b_proj,
                           const ops::AttentionBatch& batch, const ops::MlaDims& dims,
                           const TensorView& out) override;
  void mla_absorb_q(const TensorView& q_nope, const ops::Weight& kv_b_proj, const ops::MlaDims& dims,
                    const TensorView& out) override;
  void mla_attention_absorbed(const TensorView& q, const TensorView& cache, const ops::AttentionBatch& batch,
                              const ops::MlaDims& dims, const TensorView& out) override;
  void mla_expand_v(const TensorView& o_latent, const ops::Weight& kv_b_proj, const ops::MlaDims& dims,
                    const TensorView& out) override;

  // GQA attention over a paged K/V cache, draft vocabulary scatter (cpu_gqa.cpp)
  void gqa_cache_write(const TensorView& k, const TensorView& v, const TensorView& slot_mapping,
                       const TensorView& cache) override;
  void gqa_attention(const TensorView& q, const TensorView& cache, const ops::AttentionBatch& batch,
                     const ops::GqaDims& dims, const TensorView& out) override;
  void scatter_columns(const TensorView& src, const TensorView& index, float fill, const TensorView& out) override;

  // MoE (cpu_moe.cpp)
  void moe_route(const TensorView& router_logits, const TensorView& bias, const ops::MoeRouting& routing,
                 const TensorView& topk_ids, const TensorView& topk_weights) override;
  void moe_experts(const TensorView& x, const TensorView& topk_ids, const TensorView& topk_weights,
                   std::span<const ops::ExpertWeights> experts, const TensorView& out) override;

  // sampling (cpu_sampling.cpp)
  void softmax(const TensorView& logits, const TensorView& temperature, const TensorView& probs) override;
  void top_k_renorm_prob(const TensorView& probs, const TensorView& top_k, const TensorView& out) override;
  void top_p_renorm_prob(const TensorView& probs, const TensorView& top_p, const TensorView& out) override;
  void min_p_renorm_prob(const TensorView& probs, const TensorView& min_p, const TensorView& out) override;
  void sample_from_probs(const TensorView& probs, const TensorView& uniforms, const TensorView& out_ids) override;
  void argmax(const TensorView& logits, const TensorView& out_ids) override;
  void speculative_verify(const TensorView& draft_probs, const TensorView& draft_ids, const TensorView& num_drafts,
                          const TensorView& target_probs, const TensorView& uniforms, const TensorView& out_ids,
                          const TensorView& out_num_emitted) override;

 private:
  CpuBackendOptions options_;
  // Scratch, grown on first use and then reused, so a warm backend does not allocate per call
  // (STYLE 5). The backend is driven by one engine thread; ops are not re-entrant.
  std::vector<float> linear_scratch_;      // dequantized chunk of weight rows, one per OpenMP thread
  std::vector<float> attn_keys_;           // naive: one key chunk decompressed, [n, H * (k_nope | v)]
  std::vector<float> attn_latent_;         // naive: gathered latent rows of one key chunk [n, r]
  std::vector<const float*> attn_rows_;    // cache row pointer of each key position in the chunk
  std::vector<float> attn_max_, attn_sum_;  // online softmax state per (query row, head)
  std::vector<float> head_weight_;         // W_UK[h] or W_UV[h] dequantized, one per OpenMP thread
  std::vector<int32_t> moe_order_;         // (token, slot) pairs sorted by expert
  std::vector<int32_t> moe_offsets_;       // start of each expert in moe_order_
  std::vector<float> moe_x_, moe_gate_, moe_up_, moe_down_;  // one expert's gathered activations
  std::vector<float> route_scores_, route_biased_, route_group_;  // sigmoid, +bias, group scores of a token
  std::vector<int32_t> route_index_;       // experts (or groups) being ranked
  std::vector<float> sort_scratch_;        // a copy of one probability row (top-k / top-p pivots)
};

// The reference backend behind the op interface.
std::unique_ptr<ops::Backend> make_cpu_backend(const CpuBackendOptions& options = {});

}  // namespace mla::cpu
