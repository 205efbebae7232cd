// CPU reference for the row-wise ops: embedding, RMSNorm (HF semantics: fp32 statistic, weight applied
// after normalizing), residual add, SiLU-gating and RoPE (interleaved or rotate_half pairs). Rows are
// independent, so large inputs are split over OpenMP threads; each row is computed in a fixed order
// (deterministic).
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_util.h"

namespace mla::cpu {

namespace {

// Below this many elements an OpenMP region costs more than it saves.
constexpr int64_t kParallelMinElements = 1 << 15;

void check_norm_weight(const TensorView& weight, int64_t d) {
  MLA_CHECK(weight.dtype == DType::F32 || weight.dtype == DType::BF16, "rms_norm weight {} is not F32/BF16",
            weight.describe());
  MLA_CHECK(weight.ndim == 1 && weight.dim(0) == d, "rms_norm weight {} does not match D={}", weight.describe(), d);
}

// out[i] = w[i] * (x[i] / sqrt(mean(x^2) + eps)) for one row. The mean of squares is accumulated in
// double and rounded once to fp32, i.e. the exact fp32 statistic HF's reduction approximates.
// Reads all of x before writing out, so out may alias x.
void rms_norm_row(const float* x, const TensorView& weight, float eps, int64_t d, float* out) {
  double sum_sq = 0.0;
  for (int64_t i = 0; i < d; ++i) sum_sq += double(x[i]) * double(x[i]);
  const float variance = float(sum_sq / double(d));
  const float inv_rms = 1.0f / std::sqrt(variance + eps);
  for (int64_t i = 0; i < d; ++i) out[i] = load_bf16_or_f32(weight, i) * (x[i] * inv_rms);
}

}  // namespace

void CpuBackend::embedding(const TensorView& ids, const TensorView& table, const TensorView& out) {
  check_view(out, DType::F32, 2, "embedding out");
  const int64_t num_tokens = out.dim(0), d = out.dim(1);
  check_vector(ids, DType::I32, num_tokens, "embedding ids");
  MLA_CHECK(table.dtype == DType::F32 || table.dtype == DType::BF16, "embedding table {} is not F32/BF16",
            table.describe());
  MLA_CHECK(table.ndim == 2 && table.dim(1) == d && table.inner_contiguous(), "embedding table {} vs out {}",
            table.describe(), out.describe());
  const int64_t vocab = table.dim(0);
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int32_t id = i32_at(ids, t);
    MLA_CHECK(id >= 0 && id < vocab, "embedding id {} at row {} outside [0, {})", id, t, vocab);
    float* o = out.at<float>(t);
    if (table.dtype == DType::F32) {
      std::memcpy(o, table.at<const float>(id), size_t(d) * sizeof(float));
    } else {
      const uint16_t* row = table.at<const uint16_t>(id);
      for (int64_t i = 0; i < d; ++i) o[i] = bf16_to_f32(row[i]);
    }
  }
}

void CpuBackend::rms_norm(const TensorView& x, const TensorView& weight, float eps, const TensorView& out) {
  check_view(x, DType::F32, 2, "rms_norm x");
  check_view(out, DType::F32, 2, "rms_norm out");
  MLA_CHECK(same_shape(x, out), "rms_norm x {} vs out {}", x.describe(), out.describe());
  const int64_t rows = x.dim(0), d = x.dim(1);
  check_norm_weight(weight, d);
#pragma omp parallel for schedule(static) if (rows * d >= kParallelMinElements)
  for (int64_t t = 0; t < rows; ++t) rms_norm_row(x.at<const float>(t), weight, eps, d, out.at<float>(t));
}

void CpuBackend::add_rms_norm(const TensorView& residual, const TensorView& x, const TensorView& weight, float eps,
                              const TensorView& out) {
  check_view(residual, DType::F32, 2, "add_rms_norm residual");
  check_view(x, DType::F32, 2, "add_rms_norm x");
  check_view(out, DType::F32, 2, "add_rms_norm out");
  MLA_CHECK(same_shape(residual, x) && same_shape(x, out), "add_rms_norm residual {} x {} out {}",
            residual.describe(), x.describe(), out.describe());
  const int64_t rows = x.dim(0), d = x.dim(1);
  check_norm_weight(weight, d);
#pragma omp parallel for schedule(static) if (rows * d >= kParallelMinElements)
  for (int64_t t = 0; t < rows; ++t) {
    float* res = residual.at<float>(t);
    const float* xr = x.at<const float>(t);
    for (int64_t i = 0; i < d; ++i) res[i] += xr[i];
    // x is fully consumed before out (which may alias x) is written.
    rms_norm_row(res, weight, eps, d, out.at<float>(t));
  }
}

void CpuBackend::add(const TensorView& a, const TensorView& b, const TensorView& out) {
  MLA_CHECK(a.dtype == DType::F32 && same_shape(a, b) && same_shape(a, out), "add: a {} b {} out {}",
            a.describe(), b.describe(), out.describe());
  MLA_CHECK(a.ndim >= 1 && a.ndim <= kMaxDims, "add: rank {}", a.ndim);
  // View every operand as 4-D (missing leading dims have extent 1), so any strides work.
  std::array<int64_t, kMaxDims> n{1, 1, 1, 1}, sa{}, sb{}, so{};
  const int pad = kMaxDims - a.ndim;
  for (int i = 0; i < a.ndim; ++i) {
    n[size_t(pad + i)] = a.dim(i);
    sa[size_t(pad + i)] = a.stride[size_t(i)];
    sb[size_t(pad + i)] = b.stride[size_t(i)];
    so[size_t(pad + i)] = out.stride[size_t(i)];
  }
  const float* pa = a.as<const float>();
  const float* pb = b.as<const float>();
  float* po = out.as<float>();
  for (int64_t i0 = 0; i0 < n[0]; ++i0)
    for (int64_t i1 = 0; i1 < n[1]; ++i1)
      for (int64_t i2 = 0; i2 < n[2]; ++i2)
        for (int64_t i3 = 0; i3 < n[3]; ++i3) {
          const int64_t oa = i0 * sa[0] + i1 * sa[1] + i2 * sa[2] + i3 * sa[3];
          const int64_t ob = i0 * sb[0] + i1 * sb[1] + i2 * sb[2] + i3 * sb[3];
          const int64_t oo = i0 * so[0] + i1 * so[1] + i2 * so[2] + i3 * so[3];
          po[oo] = pa[oa] + pb[ob];
        }
}

void CpuBackend::silu_mul(const TensorView& gate, const TensorView& up, const TensorView& out) {
  check_view(gate, DType::F32, 2, "silu_mul gate");
  check_view(up, DType::F32, 2, "silu_mul up");
  check_view(out, DType::F32, 2, "silu_mul out");
  MLA_CHECK(same_shape(gate, up) && same_shape(gate, out), "silu_mul gate {} up {} out {}", gate.describe(),
            up.describe(), out.describe());
  const int64_t rows = gate.dim(0), d = gate.dim(1);
#pragma omp parallel for schedule(static) if (rows * d >= kParallelMinElements)
  for (int64_t t = 0; t < rows; ++t) {
    const float* g = gate.at<const float>(t);
    const float* u = up.at<const float>(t);
    float* o = out.at<float>(t);
    // silu(g) = g * sigmoid(g); for g -> -inf, exp(-g) = inf and the quotient is -0, as in torch.
    for (int64_t i = 0; i < d; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  }
}

void CpuBackend::rope(const TensorView& x, const TensorView& positions, const ops::RopeTable& rope) {
  check_view(x, DType::F32, 3, "rope x");
  const int64_t num_tokens = x.dim(0), heads = x.dim(1), rope_dim = x.dim(2);
  MLA_CHECK(rope_dim % 2 == 0, "rope: odd rope_dim {}", rope_dim);
  const int64_t pairs = rope_dim / 2;
  check_vector(positions, DType::I32, num_tokens, "rope positions");
  check_vector(rope.inv_freq, DType::F32, pairs, "rope inv_freq");
  const float factor = rope.attention_factor;
#pragma omp parallel for schedule(static) if (num_tokens * heads * rope_dim >= kParallelMinElements)
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int32_t pos = i32_at(positions, t);
    MLA_CHECK(pos >= 0, "rope: negative position {} at row {}", pos, t);
    for (int64_t i = 0; i < pairs; ++i) {
      // HF: freqs = inv_freq (fp32) * position (fp32), then cos/sin in fp32, times attention factor.
      const float angle = float(pos) * f32_at(rope.inv_freq, i);
      const float c = std::cos(angle) * factor;
      const float s = std::sin(angle) * factor;
      // Pair i: (2i, 2i+1) interleaved, (i, i + rope_dim/2) in Llama's rotate_half layout.
      const int64_t first = rope.interleaved ? 2 * i : i, partner = rope.interleaved ? 1 : pairs;
      for (int64_t h = 0; h < heads; ++h) {
        float* a = x.at<float>(t, h, first);
        float* b = a + partner;
        const float x0 = *a, x1 = *b;
        *a = x0 * c - x1 * s;
        *b = x1 * c + x0 * s;
      }
    }
  }
}

}  // namespace mla::cpu
