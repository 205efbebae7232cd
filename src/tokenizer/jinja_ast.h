// Syntax tree of the Jinja subset: one generic node type for expressions and one for statements,
// with the source position of each node so that runtime errors can name line and column.
// Trade-off: a generic node (kind + children) instead of one class per construct keeps the parser
// and interpreter small; each kind documents which fields it uses.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tokenizer/jinja_value.h"

namespace mla::tokenizer::jinja {

struct SourcePos {
  int line = 1;
  int col = 1;
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,  // literal
    kName,     // name
    kList,     // args = elements
    kTuple,    // args = elements
    kDict,     // args = k0, v0, k1, v1, ...
    kGetAttr,  // args[0].name
    kGetItem,  // args[0][args[1]]
    kSlice,    // args[0][args[1]:args[2]:args[3]]; absent bounds are nullptr
    kCall,     // args[0](args[1..]) with arg_names (parallel to args, "" = positional, [0] unused)
    kFilter,   // args[0] | name(args[1..]) with arg_names
    kTest,     // args[0] is [not] name(args[1..]); negated
    kUnary,    // op args[0]: "not", "-", "+"
    kBinary,   // args[0] op args[1]: and or == != < <= > >= in notin + - * / // % ** ~
    kTernary,  // args[0] if args[1] else args[2] (args[2] may be nullptr: undefined)
  };
  Kind kind = Kind::kLiteral;
  SourcePos pos;
  std::string name;  // name, attribute, filter, test or operator
  bool negated = false;
  Value literal;
  std::vector<ExprPtr> args;
  std::vector<std::string> arg_names;
  int height = 1;  // 1 + tallest child, bounded by the parser (deep chains would overflow the stack)
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  enum class Kind {
    kText,      // text
    kOutput,    // {{ expr }}
    kIf,        // conds[i] guards bodies[i]; bodies.back() is the else branch when size > conds
    kFor,       // for targets in expr [if cond]: bodies[0]; else: bodies[1] (optional)
    kSet,       // set targets = expr; or set targets[0].attr = expr when attr is non-empty
    kSetBlock,  // {% set targets[0] %}bodies[0]{% endset %}
    kMacro,     // macro name(targets) with defaults (parallel, nullptr = required): bodies[0]
    kBreak,
    kContinue,
  };
  Kind kind = Kind::kText;
  SourcePos pos;
  std::string text;
  std::string name;
  std::string attr;
  std::vector<std::string> targets;
  ExprPtr expr;
  ExprPtr cond;
  std::vector<ExprPtr> conds;
  std::vector<ExprPtr> defaults;
  std::vector<Body> bodies;
};

}  // namespace mla::tokenizer::jinja
