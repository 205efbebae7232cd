// Jinja-subset lexer. Invariant: the token list always ends with kEof, and every tag opener
// (kVarBegin/kBlockBegin) is matched by its closer before the next text token.
#include "tokenizer/jinja_lexer.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>

namespace mla::tokenizer::jinja {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool is_ident_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

class Lexer {
 public:
  explicit Lexer(std::string src) : src_(std::move(src)) {
    for (size_t i = 0; i < src_.size(); ++i)
      if (src_[i] == '\n') newlines_.push_back(i);
  }

  Result<std::vector<Token>> run() {
    size_t pos = 0;
    bool strip_next = false;  // the previous tag ended with `-`
    while (pos < src_.size()) {
      size_t open = find_open(pos);
      std::string text = src_.substr(pos, open - pos);
      if (strip_next) {
        size_t k = 0;
        while (k < text.size() && is_space(text[k])) ++k;
        text.erase(0, k);
      }
      strip_next = false;
      if (open == src_.size()) {
        push_text(std::move(text), pos);
        break;
      }
      const char kind = src_[open + 1];  // '{', '%' or '#'
      const char mod = open + 2 < src_.size() ? src_[open + 2] : '\0';
      if (mod == '-') {
        while (!text.empty() && is_space(text.back())) text.pop_back();
      } else if (mod != '+' && kind != '{') {
        lstrip_block(text, pos);
      }
      push_text(std::move(text), pos);
      size_t p = open + 2 + ((mod == '-' || mod == '+') ? 1 : 0);
      bool trim_after = false;
      if (kind == '#') {
        size_t close = src_.find("#}", p);
        if (close == std::string::npos) return err(open, "unterminated comment");
        strip_next = close > p && src_[close - 1] == '-';
        pos = close + 2;
        trim_after = !strip_next;
      } else {
        const char closer = kind == '{' ? '}' : '%';
        push(kind == '{' ? Token::Type::kVarBegin : Token::Type::kBlockBegin, "", open);
        MLA_ASSIGN_OR_RETURN(size_t end, lex_tag(p, closer, strip_next));
        push(kind == '{' ? Token::Type::kVarEnd : Token::Type::kBlockEnd, "", end);
        pos = end + 2;  // end points at the closer proper (after any `-`)
        trim_after = kind == '%' && !strip_next;
      }
      if (trim_after && pos < src_.size() && src_[pos] == '\n') ++pos;
    }
    push(Token::Type::kEof, "", src_.size());
    return std::move(tokens_);
  }

 private:
  size_t find_open(size_t from) const {
    for (size_t i = from; i + 1 < src_.size(); ++i)
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    return src_.size();
  }

  // lstrip_blocks: remove spaces/tabs between the start of the line and a block or comment tag.
  void lstrip_block(std::string& text, size_t text_start) const {
    size_t nl = text.rfind('\n');
    size_t line_begin;
    if (nl != std::string::npos) line_begin = nl + 1;
    else if (text_start == 0 || src_[text_start - 1] == '\n') line_begin = 0;
    else return;
    for (size_t k = line_begin; k < text.size(); ++k)
      if (text[k] != ' ' && text[k] != '\t') return;
    text.resize(line_begin);
  }

  void push_text(std::string text, size_t at) {
    if (!text.empty()) push(Token::Type::kText, std::move(text), at);
  }

  SourcePos pos_of(size_t offset) const {
    auto it = std::lower_bound(newlines_.begin(), newlines_.end(), offset);
    const int line = int(it - newlines_.begin()) + 1;
    const size_t line_start = it == newlines_.begin() ? 0 : *(it - 1) + 1;
    return {line, int(offset - line_start) + 1};
  }

  void push(Token::Type type, std::string text, size_t at) {
    Token t;
    t.type = type;
    t.text = std::move(text);
    t.pos = pos_of(at);
    tokens_.push_back(std::move(t));
  }

  Status err(size_t at, const std::string& what) const {
    SourcePos p = pos_of(at);
    return error("template syntax error at line {}, column {}: {}", p.line, p.col, what);
  }

  // Lexes expression tokens from `p` until the closer (`}}` or `%}`, optionally preceded by `-`)
  // at bracket depth 0. Returns the offset of the closer's first brace/percent character.
  Result<size_t> lex_tag(size_t p, char closer, bool& strip_after) {
    int depth = 0;
    while (true) {
      while (p < src_.size() && is_space(src_[p])) ++p;
      if (p >= src_.size()) return err(p, "unterminated tag");
      if (depth == 0) {
        if (src_[p] == '-' && p + 2 < src_.size() + 0 && src_[p + 1] == closer && src_[p + 2] == '}') {
          strip_after = true;
          return p + 1;
        }
        if (src_[p] == closer && p + 1 < src_.size() && src_[p + 1] == '}') {
          strip_after = false;
          return p;
        }
      }
      const char c = src_[p];
      if (is_ident_start(c)) {
        size_t q = p;
        while (q < src_.size() && (is_ident_start(src_[q]) || is_digit(src_[q]))) ++q;
        push(Token::Type::kName, src_.substr(p, q - p), p);
        p = q;
      } else if (is_digit(c)) {
        size_t q = p;
        while (q < src_.size() && (is_digit(src_[q]) || src_[q] == '_')) ++q;
        bool is_float = false;
        if (q + 1 < src_.size() && src_[q] == '.' && is_digit(src_[q + 1])) {
          is_float = true;
          ++q;
          while (q < src_.size() && is_digit(src_[q])) ++q;
        }
        std::string num;
        for (size_t k = p; k < q; ++k)
          if (src_[k] != '_') num += src_[k];
        push(is_float ? Token::Type::kFloat : Token::Type::kInt, num, p);
        errno = 0;
        if (is_float) tokens_.back().float_value = std::strtod(num.c_str(), nullptr);
        else tokens_.back().int_value = std::strtoll(num.c_str(), nullptr, 10);
        if (errno == ERANGE) return err(p, "number literal out of range");
        p = q;
      } else if (c == '\'' || c == '"') {
        MLA_ASSIGN_OR_RETURN(std::string s, lex_string(p));
        push(Token::Type::kString, std::move(s), p);
      } else {
        static const char* kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<",
                                     ">", "=", "(", ")", "[", "]", "{", "}", ",", ".", ":", "|"};
        const char* found = nullptr;
        for (const char* op : kOps)
          if (src_.compare(p, std::char_traits<char>::length(op), op) == 0) { found = op; break; }
        if (!found) return err(p, fmt::format("unexpected character '{}'", c));
        std::string op = found;
        if (op == "(" || op == "[" || op == "{") ++depth;
        if (op == ")" || op == "]" || op == "}") {
          if (depth == 0) return err(p, fmt::format("unbalanced '{}'", op));
          --depth;
        }
        push(Token::Type::kOp, op, p);
        p += op.size();
      }
    }
  }

  // Decodes a quoted literal at p (Python escapes \n \t \r \\ \' \" \xHH \uHHHH); advances p.
  Result<std::string> lex_string(size_t& p) {
    const char quote = src_[p];
    const size_t start = p++;
    std::string out;
    while (p < src_.size() && src_[p] != quote) {
      char c = src_[p++];
      if (c != '\\') { out += c; continue; }
      if (p >= src_.size()) break;
      char e = src_[p++];
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'v': out += '\v'; break;
        case '0': out += '\0'; break;
        case '\\': case '\'': case '"': out += e; break;
        case '\n': break;
        case 'x': case 'u': {
          const size_t n = e == 'x' ? 2 : 4;
          if (p + n > src_.size()) return err(p, "bad escape");
          uint32_t cp = 0;
          for (size_t k = 0; k < n; ++k) {
            char h = src_[p + k];
            int d = is_digit(h) ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10 : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
            if (d < 0) return err(p, "bad hex escape");
            cp = cp * 16 + uint32_t(d);
          }
          p += n;
          if (cp < 0x80) out += char(cp);
          else if (cp < 0x800) { out += char(0xC0 | (cp >> 6)); out += char(0x80 | (cp & 0x3F)); }
          else {
            out += char(0xE0 | (cp >> 12)); out += char(0x80 | ((cp >> 6) & 0x3F)); out += char(0x80 | (cp & 0x3F));
          }
          break;
        }
        default: out += '\\'; out += e;  // Python keeps unknown escapes verbatim
      }
    }
    if (p >= src_.size()) return err(start, "unterminated string literal");
    ++p;
    return out;
  }

  std::string src_;
  std::vector<size_t> newlines_;
  std::vector<Token> tokens_;
};

}  // namespace

Result<std::vector<Token>> lex_template(const std::string& source) {
  std::string src = source;
  if (!src.empty() && src.back() == '\n') src.pop_back();
  return Lexer(std::move(src)).run();
}

}  // namespace mla::tokenizer::jinja
