// Marker scanning for the streaming output parsers (see marker_scan.h). Quadratic in the marker
// length only: the held-back tail is always shorter than the longest marker.
#include "tokenizer/marker_scan.h"

#include <algorithm>
#include <cstdint>

namespace mla::tokenizer {

MarkerHit find_first_marker(std::string_view text, std::initializer_list<std::string_view> markers) {
  MarkerHit best;
  size_t best_len = 0;
  size_t i = 0;
  for (std::string_view m : markers) {
    if (!m.empty()) {
      size_t pos = text.find(m);
      if (pos != std::string_view::npos &&
          (!best.found() || pos < best.pos || (pos == best.pos && m.size() > best_len))) {
        best.pos = pos;
        best.which = i;
        best_len = m.size();
      }
    }
    ++i;
  }
  return best;
}

size_t partial_marker_suffix(std::string_view text, std::initializer_list<std::string_view> markers) {
  size_t longest = 0;
  for (std::string_view m : markers) {
    if (m.size() < 2) continue;  // a 1-byte marker has no proper non-empty prefix
    size_t max_len = std::min(text.size(), m.size() - 1);
    for (size_t len = max_len; len > longest; --len) {
      if (text.substr(text.size() - len) == m.substr(0, len)) {
        longest = len;
        break;
      }
    }
  }
  return longest;
}

size_t incomplete_utf8_suffix(std::string_view text) {
  // Walk back over at most 3 continuation bytes to the lead byte, then compare the lead byte's
  // announced length with what is present.
  size_t n = text.size();
  size_t cont = 0;
  while (cont < 3 && cont < n && (static_cast<unsigned char>(text[n - 1 - cont]) & 0xC0) == 0x80) {
    ++cont;
  }
  if (cont == n) return 0;  // only continuation bytes (or nothing): invalid or empty, hold nothing
  unsigned char lead = static_cast<unsigned char>(text[n - 1 - cont]);
  size_t need = 0;
  if ((lead & 0xE0) == 0xC0) {
    need = 2;
  } else if ((lead & 0xF0) == 0xE0) {
    need = 3;
  } else if ((lead & 0xF8) == 0xF0) {
    need = 4;
  } else {
    return 0;  // ASCII or an invalid lead byte
  }
  return cont + 1 < need ? cont + 1 : 0;
}

bool is_valid_utf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    size_t len = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > text.size()) return false;
    for (size_t k = 1; k < len; ++k) {
      unsigned char cc = static_cast<unsigned char>(text[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

bool is_blank(std::string_view text) { return trim_ascii(text).empty(); }

std::string_view trim_ascii(std::string_view text) {
  constexpr std::string_view kSpace = " \t\r\n\f\v";
  size_t b = text.find_first_not_of(kSpace);
  if (b == std::string_view::npos) return {};
  size_t e = text.find_last_not_of(kSpace);
  return text.substr(b, e - b + 1);
}

}  // namespace mla::tokenizer
