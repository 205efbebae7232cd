// PCRE2 wrapper, built-in tiktoken patterns, HF Split sequences and Kimi's run chunking.
// Matching state (match data, JIT stack) is per call, so one compiled tokenizer serves many
// threads; the JIT stack is allocated lazily by PCRE2 up to 16 MB for long letter runs.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/pretokenizer.h"

#include <pcre2.h>

#include <algorithm>
#include <cstring>

namespace mla::tokenizer {

// ---------------------------------------------------------------- UTF-8

size_t utf8_char_len(std::string_view s, size_t pos, size_t* invalid_len) {
  const auto b = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
  const uint8_t c = b(pos);
  *invalid_len = 1;
  if (c < 0x80) return 1;
  size_t need;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte (excludes overlongs/surrogates)
  if (c >= 0xC2 && c <= 0xDF) {
    need = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;  // continuation byte or invalid lead: a 1-byte invalid subpart
  }
  for (size_t k = 1; k < need; ++k) {
    if (pos + k >= s.size()) {
      *invalid_len = 0;  // truncated: may complete later
      return 0;
    }
    const uint8_t x = b(pos + k);
    const bool ok = k == 1 ? (x >= lo && x <= hi) : (x >= 0x80 && x <= 0xBF);
    if (!ok) {
      *invalid_len = k;
      return 0;
    }
  }
  return need;
}

bool utf8_is_valid(std::string_view s) {
  size_t pos = 0, bad;
  while (pos < s.size()) {
    // ASCII fast path: 8 bytes at a time.
    while (pos + 8 <= s.size()) {
      uint64_t w;
      std::memcpy(&w, s.data() + pos, 8);
      if (w & 0x8080808080808080ULL) break;
      pos += 8;
    }
    if (pos >= s.size()) break;
    const size_t n = utf8_char_len(s, pos, &bad);
    if (n == 0) return false;
    pos += n;
  }
  return true;
}

void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string utf8_make_valid(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0, bad;
  while (pos < s.size()) {
    const size_t n = utf8_char_len(s, pos, &bad);
    if (n > 0) {
      out.append(s.substr(pos, n));
      pos += n;
    } else {
      utf8_append(out, 0xFFFD);
      pos += bad == 0 ? s.size() - pos : bad;  // truncated tail: one U+FFFD for all of it
    }
  }
  return out;
}

// ---------------------------------------------------------------- Regex

namespace {

// Per-call matching state; PCRE2 objects are not shareable across threads while matching.
struct MatchScratch {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_match_context* ctx = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 16 * 1024 * 1024, nullptr);
  MatchScratch() { pcre2_jit_stack_assign(ctx, nullptr, stack); }
  ~MatchScratch() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(ctx);
    pcre2_match_data_free(data);
  }
  MatchScratch(const MatchScratch&) = delete;
  MatchScratch& operator=(const MatchScratch&) = delete;
};

// One match at or after `start`; returns false when there is none. On a JIT resource error falls
// back to the interpreter; if that fails too the rest of the subject is reported as one match
// (pathological input only; never a crash).
bool match_at(const pcre2_code* code, std::string_view subject, size_t start, MatchScratch& m, size_t* begin,
              size_t* end) {
  const auto* p = reinterpret_cast<PCRE2_SPTR>(subject.data());
  int rc = pcre2_match(code, p, subject.size(), start, PCRE2_NO_UTF_CHECK, m.data, m.ctx);
  if (rc < 0 && rc != PCRE2_ERROR_NOMATCH)
    rc = pcre2_match(code, p, subject.size(), start, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, m.data, m.ctx);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) {
    *begin = start;
    *end = subject.size();
    return start < subject.size();
  }
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(m.data);
  *begin = ov[0];
  *end = ov[1];
  return true;
}

void find_all_impl(const pcre2_code* code, std::string_view subject, MatchScratch& m,
                   std::vector<std::pair<uint32_t, uint32_t>>& out) {
  size_t pos = 0, b, e, bad;
  while (pos < subject.size() && match_at(code, subject, pos, m, &b, &e)) {
    if (e > b) {
      out.emplace_back(static_cast<uint32_t>(b), static_cast<uint32_t>(e));
      pos = e;
    } else {
      const size_t n = b < subject.size() ? utf8_char_len(subject, b, &bad) : 1;
      pos = b + std::max<size_t>(n, 1);
    }
  }
}

}  // namespace

Result<std::unique_ptr<Regex>> Regex::compile(std::string_view pattern) {
  int err = 0;
  PCRE2_SIZE off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(err, buf, sizeof(buf));
    return error("regex error at offset {}: {}", off, reinterpret_cast<const char*>(buf));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // failure is fine: the interpreter still works
  std::unique_ptr<Regex> re(new Regex());
  re->code_ = code;
  return re;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

void Regex::find_all(std::string_view subject, std::vector<std::pair<uint32_t, uint32_t>>& out) const {
  MatchScratch m;
  find_all_impl(static_cast<const pcre2_code*>(code_), subject, m, out);
}

bool Regex::full_match(std::string_view subject) const {
  MatchScratch m;
  const int rc = pcre2_match(static_cast<const pcre2_code*>(code_), reinterpret_cast<PCRE2_SPTR>(subject.data()),
                             subject.size(), 0, PCRE2_ANCHORED | PCRE2_ENDANCHORED, m.data, m.ctx);
  return rc >= 0;
}

// ---------------------------------------------------------------- patterns

const char* const kKimiUpperClass = R"((?:(?!\p{Han})[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]))";
const char* const kKimiLowerClass = R"((?:(?!\p{Han})[\p{Ll}\p{Lm}\p{Lo}\p{M}]))";

namespace {

// tiktoken's openai_public.py patterns, verbatim.
constexpr std::string_view kO200k =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kCl100k =
    R"('(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s)";

const std::string& kimi_pattern() {
  static const std::string p = std::string(R"([\p{Han}]+)") + R"(|[^\r\n\p{L}\p{N}]?)" + kKimiUpperClass + "*" +
                               kKimiLowerClass + R"(+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)" + R"(|[^\r\n\p{L}\p{N}]?)" +
                               kKimiUpperClass + "+" + kKimiLowerClass + R"(*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)" +
                               R"(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  return p;
}

}  // namespace

std::string_view builtin_pattern(std::string_view name) {
  if (name == "o200k") return kO200k;
  if (name == "cl100k") return kCl100k;
  if (name == "kimi") return kimi_pattern();
  return {};
}

// ---------------------------------------------------------------- PreTokenizer

void PreTokenizer::split(std::string_view text, std::vector<std::pair<uint32_t, uint32_t>>& out) const {
  if (text.empty()) return;
  MatchScratch m;
  if (mode_ == Mode::FindAll) {
    if (!stages_.empty()) find_all_impl(static_cast<const pcre2_code*>(stages_[0]->code_), text, m, out);
    return;
  }
  std::vector<std::pair<uint32_t, uint32_t>> cur{{0u, static_cast<uint32_t>(text.size())}}, next, hits;
  for (const auto& re : stages_) {
    next.clear();
    for (const auto& [pb, pe] : cur) {
      hits.clear();
      find_all_impl(static_cast<const pcre2_code*>(re->code_), text.substr(pb, pe - pb), m, hits);
      uint32_t pos = pb;
      for (const auto& [hb, he] : hits) {
        if (pb + hb > pos) next.emplace_back(pos, pb + hb);  // the gap before the match
        next.emplace_back(pb + hb, pb + he);
        pos = pb + he;
      }
      if (pos < pe) next.emplace_back(pos, pe);
    }
    cur.swap(next);
  }
  out.insert(out.end(), cur.begin(), cur.end());
}

namespace {

// Python's str.isspace() (Unicode White_Space plus the ASCII separators 0x1C-0x1F).
bool py_isspace(uint32_t cp) {
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x1F);
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
         cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

uint32_t decode_cp(std::string_view s, size_t pos, size_t n) {
  const auto b = [&](size_t i) { return static_cast<uint32_t>(static_cast<uint8_t>(s[pos + i])); };
  switch (n) {
    case 1: return b(0);
    case 2: return ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
    case 3: return ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
    default: return ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
  }
}

}  // namespace

void kimi_chunks(std::string_view text, std::vector<std::string_view>& out) {
  constexpr size_t kMaxChunkChars = 400'000, kMaxRunChars = 25'000;
  size_t pos = 0, bad;
  while (pos < text.size()) {
    // One 400k-character chunk, then the run splitter of the wrapper on it.
    size_t slice_start = pos, run_len = 0, chars = 0;
    bool run_is_space = false;
    while (pos < text.size() && chars < kMaxChunkChars) {
      const size_t n = std::max<size_t>(utf8_char_len(text, pos, &bad), 1);  // precondition: valid UTF-8
      const bool space = py_isspace(decode_cp(text, pos, std::min(n, text.size() - pos)));
      if (chars == 0) run_is_space = space;
      if (space != run_is_space) {
        run_len = 1;
        run_is_space = space;
      } else if (++run_len > kMaxRunChars) {
        out.push_back(text.substr(slice_start, pos - slice_start));
        slice_start = pos;
        run_len = 1;
      }
      pos += n;
      ++chars;
    }
    out.push_back(text.substr(slice_start, pos - slice_start));
  }
}

}  // namespace mla::tokenizer
