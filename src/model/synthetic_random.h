// Counter-based random numbers for synthetic checkpoints (make-model, test drafts): element i of a
// tensor is a pure function of (key, i), so a tensor can be written in any order or chunking and a
// checkpoint is reproducible from its seed alone.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

namespace mla::model::synthetic {

// splitmix64 finalizer.
inline uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline uint64_t name_hash(const std::string& s) {  // FNV-1a
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Standard normal of element `i` (Box-Muller from two counter-based uniforms).
inline float normal(uint64_t key, uint64_t i) {
  const uint64_t a = mix(key ^ (2 * i)), b = mix(key ^ (2 * i + 1));
  const double u1 = (double(a >> 11) + 1.0) * (1.0 / 9007199254740993.0);
  const double u2 = double(b >> 11) * (1.0 / 9007199254740992.0);
  return float(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

// Uniform in [0, 1) of element `i`.
inline float uniform01(uint64_t key, uint64_t i) { return float(double(mix(key ^ i) >> 11) * (1.0 / 9007199254740992.0)); }

// fp8 e4m3 code of `f`: nearest, ties to even, saturating at +-448, NaN -> 0x7f. Bit-identical to
// core's f32_to_fp8e4m3 (tested over every exponent, tie and boundary) but ~10x cheaper: a rounding
// add on the float bits instead of a table search, which was half of make-model's fp8 fill time.
inline uint8_t fp8e4m3_rne(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const uint8_t sign = uint8_t((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7f;                       // NaN
  if (a >= 0x43e00000u) return uint8_t(sign | 0x7eu);     // |f| >= 448 (and inf): max finite
  if (a < 0x3c800000u) {                                  // |f| < 2^-6: subnormal codes 0..8
    float m;
    std::memcpy(&m, &a, sizeof m);
    return uint8_t(sign | uint8_t(std::nearbyint(m * 512.0f)));  // exact scaling; RNE (default mode)
  }
  // Normal: keep 3 mantissa bits, nearest even; a carry moves into the exponent as it should, and
  // |f| < 448 rounds to at most 448 (code 0x7e), never to the NaN code.
  const uint32_t r = a + 0x7ffffu + ((a >> 20) & 1u);
  return uint8_t(sign | (((r >> 23) - 120u) << 3) | ((r >> 20) & 7u));
}

}  // namespace mla::model::synthetic
