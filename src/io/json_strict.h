// Strict JSON parsing for untrusted files (safetensors headers, checkpoint indexes): duplicate keys
// and absurd nesting are errors instead of nlohmann's silent last-wins. Built on nlohmann's SAX
// interface so both checks stay O(log n) per key, without a second copy of the keys.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace mla::io {

// Parses `text` as exactly one JSON value followed only by whitespace (space, tab, CR, LF).
// Rejects duplicate keys in any object, nesting deeper than `max_depth` containers, and raw NUL
// bytes (which nlohmann would otherwise take as the end of input).
// Never throws. Error messages are one line, without a file name (the caller adds context).
Result<nlohmann::json> parse_json_strict(std::string_view text, int max_depth = 64);

// Offset of the first byte that is not part of well-formed UTF-8 (no overlongs, no surrogates,
// nothing above U+10FFFF), or text.size() when all of it is valid.
size_t utf8_valid_prefix(std::string_view text);

// A string made safe for a one-line error message: control bytes become \xNN and anything past
// `max_chars` bytes is cut and marked with "...".
std::string printable(std::string_view s, size_t max_chars = 200);

// Short description of a JSON value's type for messages ("a string", "an array", ...).
std::string_view json_type_phrase(const nlohmann::json& j);

// A JSON value rendered on one line and cut to `max_chars`; containers are only summarised, so
// this never recurses into untrusted nesting.
std::string json_brief(const nlohmann::json& j, size_t max_chars = 60);

}  // namespace mla::io
