// Recursive-descent parser for the Jinja subset. Invariant: every parse_* function either
// consumes at least one token or returns an error, and depth_ never exceeds kMaxDepth.
#include "tokenizer/jinja_parser.h"

#include <algorithm>
#include <vector>

#include "tokenizer/jinja_lexer.h"

namespace mla::tokenizer::jinja {
namespace {

constexpr int kMaxDepth = 200;
constexpr int kMaxHeight = 400;
using T = Token::Type;

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : toks_(std::move(tokens)) {}

  Result<std::shared_ptr<const Template>> run() {
    auto tpl = std::make_shared<Template>();
    std::string end_tag;
    MLA_RETURN_IF_ERROR(parse_body(tpl->body, {}, end_tag));
    return std::shared_ptr<const Template>(std::move(tpl));
  }

 private:
  const Token& peek(size_t ahead = 0) const { return toks_[std::min(i_ + ahead, toks_.size() - 1)]; }
  const Token& next() { const Token& t = peek(); if (i_ < toks_.size() - 1) ++i_; return t; }
  bool is_op(const char* op, size_t ahead = 0) const { return peek(ahead).type == T::kOp && peek(ahead).text == op; }
  bool is_name(const char* n, size_t ahead = 0) const { return peek(ahead).type == T::kName && peek(ahead).text == n; }

  Status err_at(const Token& t, const std::string& what) const {
    return error("template error at line {}, column {}: {}", t.pos.line, t.pos.col, what);
  }
  Status expect_op(const char* op) {
    if (!is_op(op)) return err_at(peek(), fmt::format("expected '{}'", op));
    next();
    return Status::ok();
  }
  Status expect_block_end() {
    if (peek().type != T::kBlockEnd) return err_at(peek(), "expected end of block tag '%}'");
    next();
    return Status::ok();
  }
  Result<std::string> expect_name() {
    if (peek().type != T::kName) return err_at(peek(), "expected a name");
    return next().text;
  }

  // Parses statements until a block tag whose keyword is in `ends` (left unconsumed except for
  // the keyword, which is returned in end_tag) or EOF (an error when `ends` is non-empty).
  Status parse_body(Body& body, const std::vector<std::string>& ends, std::string& end_tag) {
    if (++depth_ > kMaxDepth) return err_at(peek(), "blocks nested too deeply");
    struct Guard { int& d; ~Guard() { --d; } } guard{depth_};
    while (true) {
      const Token& t = peek();
      if (t.type == T::kEof) {
        if (ends.empty()) return Status::ok();
        return err_at(t, fmt::format("missing '{{% {} %}}'", ends.front()));
      }
      if (t.type == T::kText) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kText;
        s->pos = t.pos;
        s->text = t.text;
        body.push_back(std::move(s));
        next();
      } else if (t.type == T::kVarBegin) {
        next();
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kOutput;
        s->pos = t.pos;
        MLA_ASSIGN_OR_RETURN(s->expr, parse_expr());
        if (peek().type != T::kVarEnd) return err_at(peek(), "expected '}}'");
        next();
        body.push_back(std::move(s));
      } else if (t.type == T::kBlockBegin) {
        const Token& kw = peek(1);
        if (kw.type != T::kName) return err_at(kw, "expected a statement keyword");
        for (const std::string& e : ends)
          if (kw.text == e) {
            next();
            next();
            end_tag = e;
            return Status::ok();
          }
        next();
        MLA_RETURN_IF_ERROR(parse_statement(body));
      } else {
        return err_at(t, "unexpected token");
      }
    }
  }

  Status parse_statement(Body& body) {
    const Token kw = next();
    auto s = std::make_unique<Stmt>();
    s->pos = kw.pos;
    std::string end;
    if (kw.text == "if") {
      s->kind = Stmt::Kind::kIf;
      MLA_ASSIGN_OR_RETURN(ExprPtr c, parse_expr());
      s->conds.push_back(std::move(c));
      MLA_RETURN_IF_ERROR(expect_block_end());
      while (true) {
        s->bodies.emplace_back();
        MLA_RETURN_IF_ERROR(parse_body(s->bodies.back(), {"elif", "else", "endif"}, end));
        if (end == "elif") {
          MLA_ASSIGN_OR_RETURN(ExprPtr c2, parse_expr());
          s->conds.push_back(std::move(c2));
          MLA_RETURN_IF_ERROR(expect_block_end());
        } else if (end == "else") {
          MLA_RETURN_IF_ERROR(expect_block_end());
          s->bodies.emplace_back();
          MLA_RETURN_IF_ERROR(parse_body(s->bodies.back(), {"endif"}, end));
          break;
        } else {
          break;
        }
      }
    } else if (kw.text == "for") {
      s->kind = Stmt::Kind::kFor;
      do {
        MLA_ASSIGN_OR_RETURN(std::string n, expect_name());
        s->targets.push_back(n);
      } while (is_op(",") && (next(), true));
      if (!is_name("in")) return err_at(peek(), "expected 'in' in for loop");
      next();
      MLA_ASSIGN_OR_RETURN(s->expr, parse_or(/*no ternary: `if` filters the loop*/));
      if (is_name("if")) {
        next();
        MLA_ASSIGN_OR_RETURN(s->cond, parse_or());
      }
      if (is_name("recursive")) return err_at(peek(), "unsupported construct 'recursive' loop");
      MLA_RETURN_IF_ERROR(expect_block_end());
      s->bodies.emplace_back();
      MLA_RETURN_IF_ERROR(parse_body(s->bodies.back(), {"else", "endfor"}, end));
      if (end == "else") {
        MLA_RETURN_IF_ERROR(expect_block_end());
        s->bodies.emplace_back();
        MLA_RETURN_IF_ERROR(parse_body(s->bodies.back(), {"endfor"}, end));
      }
    } else if (kw.text == "set") {
      MLA_ASSIGN_OR_RETURN(std::string n, expect_name());
      s->targets.push_back(n);
      if (is_op(".")) {
        next();
        MLA_ASSIGN_OR_RETURN(s->attr, expect_name());
      }
      while (is_op(",") && s->attr.empty()) {
        next();
        MLA_ASSIGN_OR_RETURN(std::string n2, expect_name());
        s->targets.push_back(n2);
      }
      if (is_op("=")) {
        next();
        s->kind = Stmt::Kind::kSet;
        MLA_ASSIGN_OR_RETURN(s->expr, parse_tuple_or_expr());
      } else {
        if (s->targets.size() != 1 || !s->attr.empty()) return err_at(kw, "unsupported block 'set' target");
        s->kind = Stmt::Kind::kSetBlock;
        MLA_RETURN_IF_ERROR(expect_block_end());
        s->bodies.emplace_back();
        MLA_RETURN_IF_ERROR(parse_body(s->bodies.back(), {"endset"}, end));
      }
    } else if (kw.text == "macro") {
      s->kind = Stmt::Kind::kMacro;
      MLA_ASSIGN_OR_RETURN(s->name, expect_name());
      MLA_RETURN_IF_ERROR(expect_op("("));
      while (!is_op(")")) {
        MLA_ASSIGN_OR_RETURN(std::string p, expect_name());
        s->targets.push_back(p);
        ExprPtr def;
        if (is_op("=")) {
          next();
          MLA_ASSIGN_OR_RETURN(def, parse_expr());
        }
        s->defaults.push_back(std::move(def));
        if (!is_op(",")) break;
        next();
      }
      MLA_RETURN_IF_ERROR(expect_op(")"));
      MLA_RETURN_IF_ERROR(expect_block_end());
      s->bodies.emplace_back();
      MLA_RETURN_IF_ERROR(parse_body(s->bodies.back(), {"endmacro"}, end));
    } else if (kw.text == "generation") {
      // HF marks assistant spans for masking; rendering is unaffected, so inline the body.
      MLA_RETURN_IF_ERROR(expect_block_end());
      MLA_RETURN_IF_ERROR(parse_body(body, {"endgeneration"}, end));
      return expect_block_end();
    } else if (kw.text == "break" || kw.text == "continue") {
      s->kind = kw.text == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue;
    } else {
      return err_at(kw, fmt::format("unsupported construct '{{% {} %}}'", kw.text));
    }
    MLA_RETURN_IF_ERROR(expect_block_end());
    body.push_back(std::move(s));
    return Status::ok();
  }

  ExprPtr node(Expr::Kind k, SourcePos p, std::string name = {}) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->pos = p;
    e->name = std::move(name);
    return e;
  }

  struct DepthGuard {
    int& d;
    ~DepthGuard() { --d; }
  };
#define MLA_JINJA_DEPTH()                                                       \
  if (++depth_ > kMaxDepth) { --depth_; return err_at(peek(), "expression nested too deeply"); } \
  DepthGuard depth_guard_{depth_}

  // `a, b` without brackets (set x = 1, 2) becomes a tuple.
  Result<ExprPtr> parse_tuple_or_expr() {
    MLA_ASSIGN_OR_RETURN(ExprPtr first, parse_expr());
    if (!is_op(",")) return first;
    ExprPtr t = node(Expr::Kind::kTuple, first->pos);
    t->args.push_back(std::move(first));
    while (is_op(",")) {
      next();
      MLA_ASSIGN_OR_RETURN(ExprPtr e, parse_expr());
      t->args.push_back(std::move(e));
    }
    return t;
  }

  Result<ExprPtr> parse_expr() {
    MLA_JINJA_DEPTH();
    MLA_ASSIGN_OR_RETURN(ExprPtr value, parse_or());
    while (is_name("if")) {
      const SourcePos p = next().pos;
      ExprPtr t = node(Expr::Kind::kTernary, p);
      MLA_ASSIGN_OR_RETURN(ExprPtr c, parse_or());
      ExprPtr otherwise;
      if (is_name("else")) {
        next();
        MLA_ASSIGN_OR_RETURN(otherwise, parse_expr());
      }
      t->args.push_back(std::move(value));
      t->args.push_back(std::move(c));
      t->args.push_back(std::move(otherwise));
      MLA_ASSIGN_OR_RETURN(value, finish(std::move(t)));
    }
    return value;
  }

  // Sets e.height from its children; long operator/postfix/filter chains are built by loops, not
  // recursion, so this is what bounds the tree height the interpreter recurses over.
  Result<ExprPtr> finish(ExprPtr e) {
    for (const ExprPtr& a : e->args)
      if (a) e->height = std::max(e->height, a->height + 1);
    if (e->height > kMaxHeight) return err_at(peek(), "expression too long or nested too deeply");
    return e;
  }

  Result<ExprPtr> binary(ExprPtr l, ExprPtr r, const std::string& op, SourcePos p) {
    ExprPtr b = node(Expr::Kind::kBinary, p, op);
    b->args.push_back(std::move(l));
    b->args.push_back(std::move(r));
    return finish(std::move(b));
  }

  Result<ExprPtr> parse_or() {
    MLA_JINJA_DEPTH();
    MLA_ASSIGN_OR_RETURN(ExprPtr l, parse_and());
    while (is_name("or")) {
      const SourcePos p = next().pos;
      MLA_ASSIGN_OR_RETURN(ExprPtr r, parse_and());
      MLA_ASSIGN_OR_RETURN(l, binary(std::move(l), std::move(r), "or", p));
    }
    return l;
  }
  Result<ExprPtr> parse_and() {
    MLA_ASSIGN_OR_RETURN(ExprPtr l, parse_not());
    while (is_name("and")) {
      const SourcePos p = next().pos;
      MLA_ASSIGN_OR_RETURN(ExprPtr r, parse_not());
      MLA_ASSIGN_OR_RETURN(l, binary(std::move(l), std::move(r), "and", p));
    }
    return l;
  }
  Result<ExprPtr> parse_not() {
    MLA_JINJA_DEPTH();
    if (is_name("not")) {
      const SourcePos p = next().pos;
      ExprPtr u = node(Expr::Kind::kUnary, p, "not");
      MLA_ASSIGN_OR_RETURN(ExprPtr a, parse_not());
      u->args.push_back(std::move(a));
      return finish(std::move(u));
    }
    return parse_compare();
  }
  Result<ExprPtr> parse_compare() {
    MLA_ASSIGN_OR_RETURN(ExprPtr l, parse_math1());
    while (true) {
      std::string op;
      if (peek().type == T::kOp && (peek().text == "==" || peek().text == "!=" || peek().text == "<" ||
                                    peek().text == "<=" || peek().text == ">" || peek().text == ">="))
        op = peek().text;
      else if (is_name("in")) op = "in";
      else if (is_name("not") && is_name("in", 1)) op = "notin";
      else break;
      const SourcePos p = next().pos;
      if (op == "notin") next();
      MLA_ASSIGN_OR_RETURN(ExprPtr r, parse_math1());
      MLA_ASSIGN_OR_RETURN(l, binary(std::move(l), std::move(r), op, p));
    }
    return l;
  }
  Result<ExprPtr> parse_math1() {
    MLA_ASSIGN_OR_RETURN(ExprPtr l, parse_concat());
    while (is_op("+") || is_op("-")) {
      const Token& t = next();
      std::string op = t.text;
      MLA_ASSIGN_OR_RETURN(ExprPtr r, parse_concat());
      MLA_ASSIGN_OR_RETURN(l, binary(std::move(l), std::move(r), op, t.pos));
    }
    return l;
  }
  Result<ExprPtr> parse_concat() {
    MLA_ASSIGN_OR_RETURN(ExprPtr l, parse_math2());
    while (is_op("~")) {
      const SourcePos p = next().pos;
      MLA_ASSIGN_OR_RETURN(ExprPtr r, parse_math2());
      MLA_ASSIGN_OR_RETURN(l, binary(std::move(l), std::move(r), "~", p));
    }
    return l;
  }
  Result<ExprPtr> parse_math2() {
    MLA_ASSIGN_OR_RETURN(ExprPtr l, parse_pow());
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& t = next();
      std::string op = t.text;
      MLA_ASSIGN_OR_RETURN(ExprPtr r, parse_pow());
      MLA_ASSIGN_OR_RETURN(l, binary(std::move(l), std::move(r), op, t.pos));
    }
    return l;
  }
  Result<ExprPtr> parse_pow() {
    MLA_ASSIGN_OR_RETURN(ExprPtr l, parse_unary());
    while (is_op("**")) {
      const SourcePos p = next().pos;
      MLA_ASSIGN_OR_RETURN(ExprPtr r, parse_unary());
      MLA_ASSIGN_OR_RETURN(l, binary(std::move(l), std::move(r), "**", p));
    }
    return l;
  }
  Result<ExprPtr> parse_unary() {
    MLA_JINJA_DEPTH();
    if (is_op("-") || is_op("+")) {
      const Token& t = next();
      ExprPtr u = node(Expr::Kind::kUnary, t.pos, t.text);
      MLA_ASSIGN_OR_RETURN(ExprPtr a, parse_unary());
      u->args.push_back(std::move(a));
      MLA_ASSIGN_OR_RETURN(u, finish(std::move(u)));
      return parse_filters(std::move(u));
    }
    MLA_ASSIGN_OR_RETURN(ExprPtr p, parse_primary());
    MLA_ASSIGN_OR_RETURN(p, parse_postfix(std::move(p)));
    return parse_filters(std::move(p));
  }

  // Parses `(args, name=value)` after the opening parenthesis was seen (not consumed).
  Status parse_call_args(Expr& e) {
    MLA_RETURN_IF_ERROR(expect_op("("));
    while (!is_op(")")) {
      std::string kw;
      if (peek().type == T::kName && is_op("=", 1)) {
        kw = next().text;
        next();
      }
      MLA_ASSIGN_OR_RETURN(ExprPtr a, parse_expr());
      e.args.push_back(std::move(a));
      e.arg_names.push_back(kw);
      if (!is_op(",")) break;
      next();
    }
    return expect_op(")");
  }

  Result<ExprPtr> parse_filters(ExprPtr e) {
    while (true) {
      if (is_op("|")) {
        next();
        const Token& t = peek();
        MLA_ASSIGN_OR_RETURN(std::string name, expect_name());
        ExprPtr f = node(Expr::Kind::kFilter, t.pos, name);
        f->args.push_back(std::move(e));
        f->arg_names.push_back("");
        if (is_op("(")) MLA_RETURN_IF_ERROR(parse_call_args(*f));
        MLA_ASSIGN_OR_RETURN(e, finish(std::move(f)));
      } else if (is_name("is")) {
        const SourcePos p = next().pos;
        ExprPtr t = node(Expr::Kind::kTest, p);
        if (is_name("not")) { next(); t->negated = true; }
        MLA_ASSIGN_OR_RETURN(t->name, expect_name());
        t->args.push_back(std::move(e));
        t->arg_names.push_back("");
        if (is_op("(")) {
          MLA_RETURN_IF_ERROR(parse_call_args(*t));
        } else if (peek().type == T::kString || peek().type == T::kInt || peek().type == T::kFloat ||
                   (peek().type == T::kName && !is_name("and") && !is_name("or") && !is_name("if") &&
                    !is_name("else") && !is_name("is") && !is_name("in") && !is_name("not"))) {
          MLA_ASSIGN_OR_RETURN(ExprPtr a, parse_primary());  // `is sameas false`, `is equalto 3`
          t->args.push_back(std::move(a));
          t->arg_names.push_back("");
        }
        MLA_ASSIGN_OR_RETURN(e, finish(std::move(t)));
      } else {
        return e;
      }
    }
  }

  Result<ExprPtr> parse_postfix(ExprPtr e) {
    while (true) {
      MLA_ASSIGN_OR_RETURN(e, finish(std::move(e)));
      if (is_op(".")) {
        next();
        const Token& t = peek();
        if (t.type == T::kInt) {  // `x.0` is item access in Jinja
          ExprPtr g = node(Expr::Kind::kGetItem, t.pos);
          g->args.push_back(std::move(e));
          ExprPtr lit = node(Expr::Kind::kLiteral, t.pos);
          lit->literal = Value::integer(next().int_value);
          g->args.push_back(std::move(lit));
          e = std::move(g);
          continue;
        }
        MLA_ASSIGN_OR_RETURN(std::string n, expect_name());
        ExprPtr g = node(Expr::Kind::kGetAttr, t.pos, n);
        g->args.push_back(std::move(e));
        e = std::move(g);
      } else if (is_op("[")) {
        const SourcePos p = next().pos;
        ExprPtr parts[3];
        int colons = 0;
        while (!is_op("]")) {
          if (is_op(":")) {
            if (++colons > 2) return err_at(peek(), "too many ':' in slice");
            next();
            continue;
          }
          if (parts[colons]) return err_at(peek(), "expected ']'");
          MLA_ASSIGN_OR_RETURN(parts[colons], parse_expr());
        }
        next();
        if (colons == 0) {
          if (!parts[0]) return err_at(peek(), "empty subscript");
          ExprPtr g = node(Expr::Kind::kGetItem, p);
          g->args.push_back(std::move(e));
          g->args.push_back(std::move(parts[0]));
          e = std::move(g);
        } else {
          ExprPtr s = node(Expr::Kind::kSlice, p);
          s->args.push_back(std::move(e));
          for (auto& part : parts) s->args.push_back(std::move(part));
          e = std::move(s);
        }
      } else if (is_op("(")) {
        ExprPtr c = node(Expr::Kind::kCall, peek().pos);
        c->args.push_back(std::move(e));
        c->arg_names.push_back("");
        MLA_RETURN_IF_ERROR(parse_call_args(*c));
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  Result<ExprPtr> parse_primary() {
    MLA_JINJA_DEPTH();
    const Token& t = peek();
    switch (t.type) {
      case T::kString: {
        ExprPtr e = node(Expr::Kind::kLiteral, t.pos);
        std::string s = next().text;
        while (peek().type == T::kString) s += next().text;  // adjacent literals concatenate
        e->literal = Value::string(std::move(s));
        return e;
      }
      case T::kInt: {
        ExprPtr e = node(Expr::Kind::kLiteral, t.pos);
        e->literal = Value::integer(next().int_value);
        return e;
      }
      case T::kFloat: {
        ExprPtr e = node(Expr::Kind::kLiteral, t.pos);
        e->literal = Value::real(next().float_value);
        return e;
      }
      case T::kName: {
        ExprPtr e = node(Expr::Kind::kLiteral, t.pos);
        const std::string& n = t.text;
        if (n == "true" || n == "True") e->literal = Value::boolean(true);
        else if (n == "false" || n == "False") e->literal = Value::boolean(false);
        else if (n == "none" || n == "None") e->literal = Value::none();
        else e = node(Expr::Kind::kName, t.pos, n);
        next();
        return e;
      }
      case T::kOp: {
        const SourcePos p = t.pos;
        if (is_op("(")) {
          next();
          if (is_op(")")) { next(); return node(Expr::Kind::kTuple, p); }
          MLA_ASSIGN_OR_RETURN(ExprPtr e, parse_tuple_or_expr());
          MLA_RETURN_IF_ERROR(expect_op(")"));
          return finish(std::move(e));
        }
        if (is_op("[")) {
          next();
          ExprPtr l = node(Expr::Kind::kList, p);
          while (!is_op("]")) {
            MLA_ASSIGN_OR_RETURN(ExprPtr e, parse_expr());
            l->args.push_back(std::move(e));
            if (!is_op(",")) break;
            next();
          }
          MLA_RETURN_IF_ERROR(expect_op("]"));
          return finish(std::move(l));
        }
        if (is_op("{")) {
          next();
          ExprPtr d = node(Expr::Kind::kDict, p);
          while (!is_op("}")) {
            MLA_ASSIGN_OR_RETURN(ExprPtr k, parse_expr());
            MLA_RETURN_IF_ERROR(expect_op(":"));
            MLA_ASSIGN_OR_RETURN(ExprPtr v, parse_expr());
            d->args.push_back(std::move(k));
            d->args.push_back(std::move(v));
            if (!is_op(",")) break;
            next();
          }
          MLA_RETURN_IF_ERROR(expect_op("}"));
          return finish(std::move(d));
        }
        return err_at(t, fmt::format("unexpected '{}'", t.text));
      }
      default: return err_at(t, "expected an expression");
    }
  }
#undef MLA_JINJA_DEPTH

  std::vector<Token> toks_;
  size_t i_ = 0;
  int depth_ = 0;
};

}  // namespace

Result<std::shared_ptr<const Template>> parse_template(const std::string& source) {
  MLA_ASSIGN_OR_RETURN(std::vector<Token> tokens, lex_template(source));
  return Parser(std::move(tokens)).run();
}

}  // namespace mla::tokenizer::jinja
