#include "ops/weight.h"

namespace mla::ops {

std::string_view weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::Dense: return "dense";
    case WeightFormat::Fp8Block128: return "fp8-block128";
    case WeightFormat::Int4Group32: return "int4-group32";
  }
  return "?";
}

namespace {
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
bool is_float(DType t) { return t == DType::BF16 || t == DType::F16 || t == DType::F32; }
float load_float(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::F16: return f16_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::F32: return static_cast<const float*>(base)[i];
    default: MLA_CHECK(false, "not a float dtype: {}", dtype_name(t));
  }
  return 0.0f;
}
// Rounds a product to the scale's dtype, as the reference dequantizer multiplies in that dtype.
float round_to(float v, DType t) {
  switch (t) {
    case DType::BF16: return round_bf16(v);
    case DType::F16: return f16_to_f32(f32_to_f16(v));
    default: return v;
  }
}
}  // namespace

Status validate_weight(const Weight& w) {
  const int64_t out = w.out_features, in = w.in_features;
  if (out <= 0 || in <= 0) return error("weight has non-positive shape [{}, {}]", out, in);
  if (w.data.ndim != 2 || !w.data.is_contiguous())
    return error("weight data must be a contiguous 2-D tensor, got {}", w.data.describe());
  switch (w.format) {
    case WeightFormat::Dense:
      if (!is_float(w.data.dtype)) return error("dense weight dtype {} is not BF16/F16/F32", dtype_name(w.data.dtype));
      if (w.data.dim(0) != out || w.data.dim(1) != in) return error("dense weight shape {} != [{}, {}]", w.data.describe(), out, in);
      return Status::ok();
    case WeightFormat::Fp8Block128:
      if (w.data.dtype != DType::F8_E4M3 || w.data.dim(0) != out || w.data.dim(1) != in)
        return error("fp8 weight must be F8_E4M3[{},{}], got {}", out, in, w.data.describe());
      if (w.scale.dtype != DType::F32 || w.scale.ndim != 2 || w.scale.dim(0) != ceil_div(out, kFp8BlockSize) ||
          w.scale.dim(1) != ceil_div(in, kFp8BlockSize))
        return error("fp8 weight_scale_inv must be F32[{},{}], got {}", ceil_div(out, kFp8BlockSize),
                     ceil_div(in, kFp8BlockSize), w.scale.describe());
      return Status::ok();
    case WeightFormat::Int4Group32:
      if (w.data.dtype != DType::I32 || w.data.dim(0) != out || w.data.dim(1) != ceil_div(in, 8))
        return error("int4 weight_packed must be I32[{},{}], got {}", out, ceil_div(in, 8), w.data.describe());
      if (!is_float(w.scale.dtype) || w.scale.ndim != 2 || w.scale.dim(0) != out ||
          w.scale.dim(1) != ceil_div(in, kInt4GroupSize))
        return error("int4 weight_scale must be float[{},{}], got {}", out, ceil_div(in, kInt4GroupSize),
                     w.scale.describe());
      return Status::ok();
  }
  return error("unknown weight format");
}

void dequantize_rows(const Weight& w, int64_t row0, int64_t rows, float* out) {
  const int64_t in = w.in_features;
  MLA_CHECK(row0 >= 0 && rows >= 0 && row0 + rows <= w.out_features, "rows [{}, +{}) of {}", row0, rows,
            w.out_features);
  switch (w.format) {
    case WeightFormat::Dense:
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t base = (row0 + r) * in;
        float* o = out + r * in;
        if (w.data.dtype == DType::F32) {
          const float* src = w.data.as<const float>() + base;
          for (int64_t i = 0; i < in; ++i) o[i] = src[i];
        } else if (w.data.dtype == DType::BF16) {
          const uint16_t* src = w.data.as<const uint16_t>() + base;
          for (int64_t i = 0; i < in; ++i) o[i] = bf16_to_f32(src[i]);
        } else {
          for (int64_t i = 0; i < in; ++i) o[i] = load_float(w.data.data, w.data.dtype, base + i);
        }
      }
      return;
    case WeightFormat::Fp8Block128: {
      const uint8_t* q = w.data.as<const uint8_t>();
      const float* s = w.scale.as<const float>();
      const int64_t scale_cols = w.scale.dim(1);
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t row = row0 + r;
        const float* srow = s + (row / kFp8BlockSize) * scale_cols;
        float* o = out + r * in;
        for (int64_t i = 0; i < in; ++i) o[i] = fp8e4m3_to_f32(q[row * in + i]) * srow[i / kFp8BlockSize];
      }
      return;
    }
    case WeightFormat::Int4Group32: {
      const uint32_t* packed = w.data.as<const uint32_t>();
      const int64_t words = w.data.dim(1), groups = w.scale.dim(1);
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t row = row0 + r;
        float* o = out + r * in;
        for (int64_t i = 0; i < in; ++i) {
          const uint32_t word = packed[row * words + i / 8];
          const int q = int((word >> (4 * (i % 8))) & 0xfu) - 8;
          const float scale = load_float(w.scale.data, w.scale.dtype, row * groups + i / kInt4GroupSize);
          o[i] = round_to(float(q) * scale, w.scale.dtype);
        }
      }
      return;
    }
  }
}

}  // namespace mla::ops
