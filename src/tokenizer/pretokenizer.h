// Pre-tokenization: PCRE2 (UTF | UCP, JIT) regex splitting and UTF-8 helpers. Input is validated
// once per encode; every match runs with PCRE2_NO_UTF_CHECK (otherwise each call re-validates
// the rest of the subject and encoding is quadratic).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace mla::tokenizer {

// ---- UTF-8 ----
// Length of the maximal prefix of s[pos..] that is a valid UTF-8 character (1..4), or 0 with
// *invalid_len set to the length of the maximal invalid subpart (>= 1), or 0 with
// *invalid_len == 0 when s ends inside a sequence that could still become valid.
size_t utf8_char_len(std::string_view s, size_t pos, size_t* invalid_len);
bool utf8_is_valid(std::string_view s);
// Replaces each maximal invalid subpart (and an incomplete tail) with U+FFFD.
std::string utf8_make_valid(std::string_view s);
void utf8_append(std::string& out, uint32_t cp);

// ---- Regex ----
class Regex {
 public:
  static Result<std::unique_ptr<Regex>> compile(std::string_view pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  // Appends [begin, end) byte offsets of successive non-overlapping matches in `subject` (valid
  // UTF-8, matched as a whole string so lookarounds stop at its ends). An empty match advances
  // one character and is not reported.
  void find_all(std::string_view subject, std::vector<std::pair<uint32_t, uint32_t>>& out) const;
  // True when the whole of `subject` matches (anchored both ends). For tests of patterns.
  bool full_match(std::string_view subject) const;

 private:
  friend class PreTokenizer;
  Regex() = default;
  void* code_ = nullptr;  // pcre2_code_8*
};

// Built-in tiktoken patterns ("kimi", "o200k", "cl100k"); empty when unknown.
std::string_view builtin_pattern(std::string_view name);
// Kimi's `[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]` and `[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]`
// rewritten for PCRE2 (which has no class intersection); the equivalence test uses these.
extern const char* const kKimiUpperClass;
extern const char* const kKimiLowerClass;

class PreTokenizer {
 public:
  enum class Mode {
    FindAll,        // tiktoken: the pieces are the regex matches (the pattern covers all text)
    SplitIsolated,  // HF Split(behavior=Isolated, invert=false): matches and the gaps between
  };
  PreTokenizer() = default;
  PreTokenizer(PreTokenizer&&) = default;
  PreTokenizer& operator=(PreTokenizer&&) = default;
  void set(Mode mode, std::vector<std::unique_ptr<Regex>> stages) {
    mode_ = mode;
    stages_ = std::move(stages);
  }
  // Appends pieces of `text` (valid UTF-8) as [begin, end) offsets into text, in order; the
  // pieces tile `text` in SplitIsolated mode. HF Sequence: each stage re-splits the previous
  // stage's pieces, each piece matched as its own subject.
  void split(std::string_view text, std::vector<std::pair<uint32_t, uint32_t>>& out) const;

 private:
  Mode mode_ = Mode::FindAll;
  std::vector<std::unique_ptr<Regex>> stages_;
};

// Kimi's wrapper (tokenization_kimi.py): cut into <= 400,000-character chunks, then into runs of
// <= 25,000 consecutive Python-isspace / non-space characters; each run is encoded on its own.
void kimi_chunks(std::string_view text, std::vector<std::string_view>& out);

}  // namespace mla::tokenizer
