// CPU reference of speculative_verify (issue #8, MODELS.md section 6): chain verification of up to K
// drafts per sequence by rejection sampling. It is the specification the GPU kernel is held to: the
// accept test in fp32 exactly as written (u * q(d) < p(d)), the residual max(p - q, 0) in fp32, and the
// extra token by sample_from_probs' inverse-CDF rule (cpu_util.h). The residual is never materialized
// (computed per index on both passes), so the op needs no scratch; its cost is noise next to a forward.
#include <cmath>
#include <initializer_list>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_util.h"

namespace mla::cpu {

namespace {

// A rank-`ndim` view of `dtype` whose leading dims are `dims` (rows may be strided, last dim contiguous).
void check_dims(const TensorView& v, DType dtype, std::initializer_list<int64_t> dims, const char* what) {
  check_view(v, dtype, int(dims.size()), what);
  int d = 0;
  for (int64_t want : dims) {
    MLA_CHECK(v.dim(d) == want, "{}: {} (dim {} should be {})", what, v.describe(), d, want);
    ++d;
  }
}

}  // namespace

void CpuBackend::speculative_verify(const TensorView& draft_probs, const TensorView& draft_ids,
                                    const TensorView& num_drafts, const TensorView& target_probs,
                                    const TensorView& uniforms, const TensorView& out_ids,
                                    const TensorView& out_num_emitted) {
  check_view(target_probs, DType::F32, 3, "speculative_verify target_probs");
  const int64_t rows = target_probs.dim(0), slots = target_probs.dim(1), vocab = target_probs.dim(2);
  MLA_CHECK(slots >= 1 && vocab >= 1, "speculative_verify: target_probs {} needs K + 1 >= 1 slots of V >= 1",
            target_probs.describe());
  const int64_t max_drafts = slots - 1;  // K
  check_dims(draft_probs, DType::F32, {rows, max_drafts, vocab}, "speculative_verify draft_probs");
  check_dims(draft_ids, DType::I32, {rows, max_drafts}, "speculative_verify draft_ids");
  check_vector(num_drafts, DType::I32, rows, "speculative_verify num_drafts");
  check_dims(uniforms, DType::F32, {rows, slots}, "speculative_verify uniforms");
  check_dims(out_ids, DType::I32, {rows, slots}, "speculative_verify out_ids");
  check_vector(out_num_emitted, DType::I32, rows, "speculative_verify out_num_emitted");
  for (const TensorView* in : {&draft_probs, &draft_ids, &num_drafts, &target_probs, &uniforms})
    MLA_CHECK(!views_alias(out_ids, *in) && !views_alias(out_num_emitted, *in),
              "speculative_verify: an output aliases input {}", in->describe());
  MLA_CHECK(!views_alias(out_ids, out_num_emitted), "speculative_verify: out_ids aliases out_num_emitted");

  for (int64_t b = 0; b < rows; ++b) {
    const int32_t n = i32_at(num_drafts, b);
    MLA_CHECK(n >= 0 && n <= max_drafts, "speculative_verify: num_drafts {} of row {} outside [0, {}]", n, b,
              max_drafts);
    // Every uniform and draft id the row may use is checked, not only those reached before a rejection.
    for (int64_t i = 0; i <= max_drafts; ++i) {
      if (i < n || i == max_drafts) {
        const float u = *uniforms.at<const float>(b, i);
        MLA_CHECK(u >= 0.0f && u < 1.0f, "speculative_verify: uniform {} at [{}, {}] outside [0, 1)", u, b, i);
      }
      if (i < n) {
        const int32_t d = *draft_ids.at<const int32_t>(b, i);
        MLA_CHECK(d >= 0 && d < vocab, "speculative_verify: draft id {} at [{}, {}] outside [0, {})", d, b, i, vocab);
      }
    }
    // Accept draft i iff u_i * q_i(d_i) < p_i(d_i): u_i < min(1, p/q) without the division, so q(d) = 0
    // with p(d) > 0 accepts and p(d) = 0 always rejects. NaN compares false, i.e. rejects.
    int64_t accepted = 0;
    for (; accepted < n; ++accepted) {
      const int32_t d = *draft_ids.at<const int32_t>(b, accepted);
      const float u = *uniforms.at<const float>(b, accepted);
      const float q = *draft_probs.at<const float>(b, accepted, d);
      const float p = *target_probs.at<const float>(b, accepted, d);
      if (!(u * q < p)) break;
    }
    const float u_extra = *uniforms.at<const float>(b, max_drafts);
    const float* p = target_probs.at<const float>(b, accepted);
    int64_t extra = -1;
    if (accepted < n) {  // rejected at `accepted`: the residual max(p - q, 0), normalized by the pick
      const float* q = draft_probs.at<const float>(b, accepted);
      extra = inverse_cdf_pick(vocab, u_extra, [&](int64_t j) { return std::fmax(p[j] - q[j], 0.0f); },
                               "speculative_verify residual");
    }
    // The bonus token (all n accepted), or a rejection whose residual is all zero (p <= q everywhere,
    // e.g. p == q and a draft outside their support): draw from p itself.
    if (extra < 0) extra = inverse_cdf_pick(vocab, u_extra, [&](int64_t j) { return p[j]; }, "speculative_verify");
    MLA_CHECK(extra >= 0, "speculative_verify: target row [{}, {}] has no positive probability", b, accepted);
    for (int64_t i = 0; i <= max_drafts; ++i) {
      const int32_t id = i < accepted ? *draft_ids.at<const int32_t>(b, i) : i == accepted ? int32_t(extra) : -1;
      *out_ids.at<int32_t>(b, i) = id;
    }
    *out_num_emitted.at<int32_t>(b) = int32_t(accepted + 1);
  }
}

}  // namespace mla::cpu
