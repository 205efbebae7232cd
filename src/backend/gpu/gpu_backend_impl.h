// The GPU backend class (internal: included by the kernel files, never by host code). One stream per
// backend, all ops enqueue on it; nothing here synchronizes except copy_to_host and synchronize().
// Each op group keeps its grow-once scratch in its own state struct (gpu_<group>_state.h), so the
// groups' files stay independent.
#pragma once

#include <memory>
#include <vector>

#include "backend/gpu/gpu.h"
#include "backend/gpu/gpu_backend.h"
#include "backend/gpu/gpu_device.cuh"
#include "backend/gpu/gpu_scratch.h"

namespace mla::gpu {

struct LinearState;    // gpu_linear_state.h
struct MlaState;       // gpu_mla_state.h
struct MoeState;       // gpu_moe_state.h
struct SamplingState;  // gpu_sampling_state.h

class GpuBackend final : public ops::Backend {
 public:
  explicit GpuBackend(const GpuBackendOptions& options);
  ~GpuBackend() override;
  GpuBackend(const GpuBackend&) = delete;
  GpuBackend& operator=(const GpuBackend&) = delete;

  std::string_view name() const override { return "gpu"; }
  Stream stream() const { return stream_; }
  const GpuBackendOptions& options() const { return options_; }
  // True while a graph is being recorded: scratch must not grow, nothing may synchronize.
  bool capturing() const { return capturing_; }
  // Whether `p` lies in memory place_weight allocated (never freed while this backend lives).
  bool is_placed(const void* p) const;

  // memory and graphs (gpu_backend.cu)
  Buffer alloc(size_t bytes) override;
  TensorView place_weight(const TensorView& host) override;
  void copy_from_host(const TensorView& dst, const void* src) override;
  void copy_to_host(void* dst, const TensorView& src) override;
  void synchronize() override;
  std::unique_ptr<ops::OpGraph> capture(const std::function<void()>& record) override;

  // elementwise and normalization (gpu_elementwise.cu)
  void embedding(const TensorView& ids, const TensorView& table, const TensorView& out) override;
  void rms_norm(const TensorView& x, const TensorView& weight, float eps, const TensorView& out) override;
  void add_rms_norm(const TensorView& residual, const TensorView& x, const TensorView& weight, float eps,
                    const TensorView& out) override;
  void copy(const TensorView& src, const TensorView& dst) override;
  void add(const TensorView& a, const TensorView& b, const TensorView& out) override;
  void silu_mul(const TensorView& gate, const TensorView& up, const TensorView& out) override;
  void rope(const TensorView& x, const TensorView& positions, const ops::RopeTable& rope) override;

  // GEMM (gpu_linear.cu)
  void linear(const TensorView& x, const ops::Weight& w, const TensorView& out) override;
  void linear_group(const TensorView& x, std::span<const ops::Weight* const> w,
                    std::span<const TensorView> out) override;

  // MLA (gpu_mla.cu)
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

  // GQA attention over a paged K/V cache, draft vocabulary scatter (gpu_gqa.cu)
  void gqa_cache_write(const TensorView& k, const TensorView& v, const TensorView& slot_mapping,
                       const TensorView& cache) override;
  void gqa_attention(const TensorView& q, const TensorView& cache, const ops::AttentionBatch& batch,
                     const ops::GqaDims& dims, const TensorView& out) override;
  void scatter_columns(const TensorView& src, const TensorView& index, float fill, const TensorView& out) override;

  // MoE (gpu_moe.cu)
  void moe_route(const TensorView& router_logits, const TensorView& bias, const ops::MoeRouting& routing,
                 const TensorView& topk_ids, const TensorView& topk_weights) override;
  void moe_experts(const TensorView& x, const TensorView& topk_ids, const TensorView& topk_weights,
                   std::span<const ops::ExpertWeights> experts, const TensorView& out) override;

  // sampling (gpu_sampling.cu)
  void softmax(const TensorView& logits, const TensorView& temperature, const TensorView& probs) override;
  void top_k_renorm_prob(const TensorView& probs, const TensorView& top_k, const TensorView& out) override;
  void top_p_renorm_prob(const TensorView& probs, const TensorView& top_p, const TensorView& out) override;
  void min_p_renorm_prob(const TensorView& probs, const TensorView& min_p, const TensorView& out) override;
  void sample_from_probs(const TensorView& probs, const TensorView& uniforms, const TensorView& out_ids) override;
  void argmax(const TensorView& logits, const TensorView& out_ids) override;
  void speculative_verify(const TensorView& draft_probs, const TensorView& draft_ids, const TensorView& num_drafts,
                          const TensorView& target_probs, const TensorView& uniforms, const TensorView& out_ids,
                          const TensorView& out_num_emitted) override;

  // Per-group state, created in the constructor and owned here (definitions in gpu_<group>_state.h).
  LinearState& linear_state() { return *linear_; }
  MlaState& mla_state() { return *mla_; }
  MoeState& moe_state() { return *moe_; }
  SamplingState& sampling_state() { return *sampling_; }

 private:
  GpuBackendOptions options_;
  Stream stream_ = nullptr;
  bool capturing_ = false;
  std::vector<Buffer> placed_;  // weights copied to the device by place_weight
  std::unique_ptr<LinearState> linear_;
  std::unique_ptr<MlaState> mla_;
  std::unique_ptr<MoeState> moe_;
  std::unique_ptr<SamplingState> sampling_;
};

// Checks that a non-empty `v` has data (a cheap guard on the host, per call). It does not prove the
// pointer is device memory: that would cost a runtime query per op; the parity tests pass device
// views only, and a host pointer faults at the next checked sync.
void check_device_view(const TensorView& v, const char* op, const char* name);

}  // namespace mla::gpu
