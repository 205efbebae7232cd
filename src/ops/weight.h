// A linear layer's weight exactly as the checkpoint stores it (ARCHITECTURE rule 6): quantized
// formats stay packed and every backend dequantizes inside its ops, never at load.
#pragma once

#include <cstdint>
#include <string_view>

#include "core/tensor.h"

namespace mla::ops {

enum class WeightFormat : uint8_t {
  Dense,        // data: BF16/F16/F32 [out, in]; no scale
  Fp8Block128,  // DeepSeek FP8: data F8_E4M3 [out, in]; scale F32 [ceil(out/128), ceil(in/128)];
                // W[o,i] = fp8(data[o,i]) * scale[o/128, i/128]
  Int4Group32,  // compressed-tensors pack-quantized W4A16, symmetric: data I32 [out, ceil(in/8)],
                // element 8c+j of a row = bits [4j,4j+4) of word c, q = nibble - 8;
                // scale BF16/F16/F32 [out, ceil(in/32)]; W[o,i] = round_scale_dtype(q * scale[o, i/32])
};

std::string_view weight_format_name(WeightFormat f);

constexpr int64_t kFp8BlockSize = 128;
constexpr int64_t kInt4GroupSize = 32;

// W [out_features, in_features]; y = x W^T.
struct Weight {
  WeightFormat format = WeightFormat::Dense;
  int64_t out_features = 0;
  int64_t in_features = 0;
  TensorView data;   // layout per `format`
  TensorView scale;  // empty (data == nullptr) for Dense

  bool empty() const { return data.data == nullptr; }
};

// Checks that data/scale shapes and dtypes agree with `format` and the logical [out, in].
Status validate_weight(const Weight& w);

// Reference dequantization of rows [row0, row0 + rows) into fp32 `out` ([rows, in_features],
// contiguous). Defines the value of every format; all backends must match it.
void dequantize_rows(const Weight& w, int64_t row0, int64_t rows, float* out);

}  // namespace mla::ops
