// Byte-level helpers shared by the streaming output parsers: find the first complete marker in a
// buffer and measure how much of its tail must be held back because it could still grow into a
// marker (or finish a UTF-8 character). Plain linear scans: markers are few and short.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <string>
#include <string_view>

namespace mla::tokenizer {

struct MarkerHit {
  size_t pos = std::string_view::npos;  // byte offset of the marker in the scanned text
  size_t which = 0;                     // index into the marker list
  bool found() const { return pos != std::string_view::npos; }
};

// The leftmost complete occurrence of any marker; on a tie the longest marker wins. Empty markers
// are ignored.
MarkerHit find_first_marker(std::string_view text, std::initializer_list<std::string_view> markers);

// Length of the longest suffix of `text` that is a proper, non-empty prefix of some marker, i.e.
// the bytes that must not be released yet because the next chunk may complete a marker.
size_t partial_marker_suffix(std::string_view text, std::initializer_list<std::string_view> markers);

// Number of trailing bytes that form the start of a UTF-8 character whose continuation bytes have
// not arrived yet (0..3). Invalid bytes are not held: they can never become valid by waiting.
size_t incomplete_utf8_suffix(std::string_view text);

// True when `text` is well-formed UTF-8 (no overlongs, surrogates or code points > U+10FFFF).
bool is_valid_utf8(std::string_view text);

// True when `text` is empty or made only of ASCII whitespace.
bool is_blank(std::string_view text);

// `text` without leading and trailing ASCII whitespace.
std::string_view trim_ascii(std::string_view text);

}  // namespace mla::tokenizer
