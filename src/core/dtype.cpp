#include "core/dtype.h"

#include <array>

namespace mla {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::F32: return "F32";
    case DType::F8_E4M3: return "F8_E4M3";
    case DType::U8: return "U8";
    case DType::I8: return "I8";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::BOOL: return "BOOL";
  }
  return "?";
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (DType t : {DType::BF16, DType::F16, DType::F32, DType::F8_E4M3, DType::U8, DType::I8, DType::I32,
                  DType::I64, DType::BOOL}) {
    if (dtype_name(t) == name) return t;
  }
  return std::nullopt;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t man = h & 0x3ff;
  if (exp == 0) {  // zero or subnormal: man * 2^-24
    const float v = std::ldexp(float(man), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return f32_from_bits(sign | 0x7f800000u | (man << 13));
  return f32_from_bits(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t f32_to_f16(float f) {
  const uint32_t u = f32_bits(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const float a = std::fabs(f);
  if (std::isnan(f)) return uint16_t(sign | 0x7e00u);
  if (a >= 65520.0f) return uint16_t(sign | 0x7c00u);  // rounds to inf
  if (a < 6.103515625e-05f) {                           // subnormal range: quantum 2^-24
    const float q = std::nearbyint(a * 16777216.0f);    // default rounding mode is nearest-even
    return uint16_t(sign | uint16_t(q));
  }
  uint32_t v = u & 0x7fffffffu;
  v += 0x0fffu + ((v >> 13) & 1u);  // round mantissa to 10 bits, nearest even
  const uint32_t exp = (v >> 23) - 112;
  return uint16_t(sign | (exp << 10) | ((v >> 13) & 0x3ffu));
}

uint8_t f32_to_fp8e4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  float a = std::fabs(f);
  if (a >= 448.0f) return uint8_t(sign | 0x7e);  // saturate to max finite
  // Find the nearest representable magnitude, ties to even mantissa. Values are monotone in the
  // low 7 bits, so a binary search over codes 0..0x7e is exact.
  int lo = 0, hi = 0x7e;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (kFp8E4M3ToF32[size_t(mid)] <= a) lo = mid; else hi = mid;
  }
  const float dlo = a - kFp8E4M3ToF32[size_t(lo)], dhi = kFp8E4M3ToF32[size_t(hi)] - a;
  int code;
  if (dlo < dhi) code = lo;
  else if (dhi < dlo) code = hi;
  else code = (lo & 1) ? hi : lo;
  return uint8_t(sign | code);
}

}  // namespace mla
