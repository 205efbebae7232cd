// Strided copy of 4-byte elements (F32 activations, I32 token ids): the one data-movement op the
// model needs besides gathers (assembling the absorbed query [W_UK^T q_nope | q_rope] from two
// strided halves; a speculative draft feeding its drawn ids into its next step).
#include "backend/cpu/cpu_backend.h"

namespace mla::cpu {

void CpuBackend::copy(const TensorView& src, const TensorView& dst) {
  MLA_CHECK((src.dtype == DType::F32 || src.dtype == DType::I32) && dst.dtype == src.dtype && src.ndim == dst.ndim,
            "copy {} -> {}",
            src.describe(), dst.describe());
  for (int d = 0; d < src.ndim; ++d) MLA_CHECK(src.dim(d) == dst.dim(d), "copy {} -> {}", src.describe(), dst.describe());
  // Pad to 4 dims so one loop nest covers every rank.
  std::array<int64_t, kMaxDims> n{1, 1, 1, 1}, ss{0, 0, 0, 0}, ds{0, 0, 0, 0};
  const int off = kMaxDims - src.ndim;
  for (int d = 0; d < src.ndim; ++d) {
    n[size_t(off + d)] = src.dim(d);
    ss[size_t(off + d)] = src.stride[size_t(d)];
    ds[size_t(off + d)] = dst.stride[size_t(d)];
  }
  const uint32_t* s = static_cast<const uint32_t*>(src.data);  // bit copy: F32 and I32 alike
  uint32_t* o = static_cast<uint32_t*>(dst.data);
  for (int64_t a = 0; a < n[0]; ++a)
    for (int64_t b = 0; b < n[1]; ++b)
      for (int64_t c = 0; c < n[2]; ++c)
        for (int64_t e = 0; e < n[3]; ++e)
          o[a * ds[0] + b * ds[1] + c * ds[2] + e * ds[3]] = s[a * ss[0] + b * ss[1] + c * ss[2] + e * ss[3]];
}

}  // namespace mla::cpu
