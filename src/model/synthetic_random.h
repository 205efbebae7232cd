// Counter-based random numbers for synthetic checkpoints (make-model, test drafts): element i of a
// tensor is a pure function of (key, i), so a tensor can be written in any order or chunking and a
// checkpoint is reproducible from its seed alone.
#pragma once

#include <cmath>
#include <cstdint>
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

}  // namespace mla::model::synthetic
