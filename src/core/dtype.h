// Element types of checkpoints and tensors, with exact scalar conversions to and from fp32.
// The conversions here are the reference semantics every backend must reproduce bit for bit
// (round-to-nearest-even on narrowing), so they live in one place.
#pragma once

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace mla {

// Names match the safetensors header spelling (`dtype_name`).
enum class DType : uint8_t { BF16, F16, F32, F8_E4M3, U8, I8, I32, I64, BOOL };

// Size of one element in bytes.
constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::BF16: case DType::F16: return 2;
    case DType::F32: case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::F8_E4M3: case DType::U8: case DType::I8: case DType::BOOL: return 1;
  }
  return 0;
}

std::string_view dtype_name(DType t);
// Parses a safetensors dtype string ("BF16", "F8_E4M3", ...). nullopt for unsupported types.
std::optional<DType> dtype_from_name(std::string_view name);

// ---- scalar conversions -------------------------------------------------------------------------

inline uint32_t f32_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float f32_from_bits(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

// bf16 is the top half of an fp32.
inline float bf16_to_f32(uint16_t h) { return f32_from_bits(uint32_t(h) << 16); }
// Round to nearest even; NaN stays a (quiet) NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

// IEEE half.
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// float8_e4m3fn (OCP "FN"): bias 7, no infinities, S.1111.111 is NaN, max finite ±448.
constexpr float fp8e4m3_decode(uint8_t v) {
  const uint32_t sign = uint32_t(v >> 7) << 31, exp = (v >> 3) & 0xfu, man = v & 7u;
  if (exp == 0xf && man == 7) return std::bit_cast<float>(sign | 0x7fc00000u);  // NaN
  if (exp == 0) {                                                               // subnormal: man * 2^-9
    const float mag = float(man) * (1.0f / 512.0f);
    return sign ? -mag : mag;
  }
  return std::bit_cast<float>(sign | ((exp + 120u) << 23) | (man << 20));  // rebias 7 -> 127
}
// Decoding is a table lookup, inline because dequantization loops call it per element.
inline constexpr std::array<float, 256> kFp8E4M3ToF32 = [] {
  std::array<float, 256> t{};
  for (int v = 0; v < 256; ++v) t[size_t(v)] = fp8e4m3_decode(uint8_t(v));
  return t;
}();
inline float fp8e4m3_to_f32(uint8_t v) { return kFp8E4M3ToF32[v]; }
// Round to nearest even, saturating to ±448 (as torch's cast after clamp). NaN -> 0x7f.
uint8_t f32_to_fp8e4m3(float f);

}  // namespace mla
