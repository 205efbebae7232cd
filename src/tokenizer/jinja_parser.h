// Parser of the Jinja subset: tokens → statement tree. Expression precedence follows Jinja2's
// parser (ternary < or < and < not < compare < + - < ~ < * / // % < ** < unary < filters/tests
// < postfix). Nesting is bounded so that hostile input cannot exhaust the stack.
#pragma once

#include <memory>
#include <string>

#include "core/status.h"
#include "tokenizer/jinja_ast.h"

namespace mla::tokenizer::jinja {

struct Template {
  Body body;
};

// Errors name the unsupported or malformed construct with its line and column.
Result<std::shared_ptr<const Template>> parse_template(const std::string& source);

}  // namespace mla::tokenizer::jinja
