// Lexer of the Jinja subset: splits template text into text runs and tag tokens, applying
// whitespace control (`-`), trim_blocks and lstrip_blocks as transformers configures Jinja, and
// drops one trailing newline (keep_trailing_newline=False). Comments are dropped here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "tokenizer/jinja_ast.h"

namespace mla::tokenizer::jinja {

struct Token {
  enum class Type { kText, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kString, kInt, kFloat, kOp, kEof };
  Type type = Type::kEof;
  std::string text;  // text run, name, decoded string literal or operator
  int64_t int_value = 0;
  double float_value = 0;
  SourcePos pos;
};

Result<std::vector<Token>> lex_template(const std::string& source);

}  // namespace mla::tokenizer::jinja
