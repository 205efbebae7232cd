// Tree-walking interpreter of the Jinja subset: statements, expressions, scoping and limits.
// Invariant: every exec/eval call charges one step, so total work is bounded by max_steps.
#include "tokenizer/jinja_interp.h"

#include <cmath>
#include <ctime>

namespace mla::tokenizer::jinja {

const Value* CallArgs::get(size_t index, const char* name) const {
  if (index < positional.size()) return &positional[index];
  for (const auto& [k, v] : keyword)
    if (k == name) return &v;
  return nullptr;
}

Interpreter::Interpreter(const Value& context, const RenderLimits& limits) : limits_(limits) {
  frames_.emplace_back();
  auto& g = frames_.back();
  g["range"] = Value::callable(
      [](Interpreter& in, CallArgs& a) -> Result<Value> {
        int64_t start = 0, stop = 0, stepv = 1;
        for (const Value& v : a.positional)
          if (v.kind() != Value::Kind::kInt) return in.error_at(a.pos, "range() takes integers");
        if (a.positional.size() == 1) stop = a.positional[0].as_int();
        else if (a.positional.size() >= 2) {
          start = a.positional[0].as_int();
          stop = a.positional[1].as_int();
          if (a.positional.size() >= 3) stepv = a.positional[2].as_int();
        } else {
          return in.error_at(a.pos, "range() needs arguments");
        }
        if (stepv == 0) return in.error_at(a.pos, "range() step must not be zero");
        Array out;
        for (int64_t i = start; stepv > 0 ? i < stop : i > stop; i += stepv) {
          MLA_RETURN_IF_ERROR(in.step(a.pos));
          out.push_back(Value::integer(i));
        }
        return Value::array(std::move(out));
      },
      "range");
  g["namespace"] = Value::callable(
      [](Interpreter&, CallArgs& a) -> Result<Value> {
        Value ns = Value::object({}, /*is_namespace=*/true);
        for (const Value& p : a.positional)
          if (p.is_object())
            for (const auto& [k, v] : p.obj()) ns.set(k, v);
        for (const auto& [k, v] : a.keyword) ns.set(k, v);
        return ns;
      },
      "namespace");
  g["dict"] = Value::callable(
      [](Interpreter&, CallArgs& a) -> Result<Value> {
        Value d = Value::object();
        for (const auto& [k, v] : a.keyword) d.set(k, v);
        return d;
      },
      "dict");
  g["raise_exception"] = Value::callable(
      [](Interpreter& in, CallArgs& a) -> Result<Value> {
        const Value* m = a.get(0, "message");
        return in.error_at(a.pos, "raise_exception: " + (m ? m->to_output() : std::string()));
      },
      "raise_exception");
  g["strftime_now"] = Value::callable(
      [](Interpreter& in, CallArgs& a) -> Result<Value> {
        const Value* f = a.get(0, "format");
        if (!f || !f->is_string()) return in.error_at(a.pos, "strftime_now(format) needs a string");
        std::time_t now = std::time(nullptr);
        std::tm tm{};
        localtime_r(&now, &tm);
        char buf[256];
        const size_t n = std::strftime(buf, sizeof buf, f->str().c_str(), &tm);
        return Value::string(std::string(buf, n));
      },
      "strftime_now");
  frames_.emplace_back();
  if (context.is_object())
    for (const auto& [k, v] : context.obj()) frames_.back()[k] = v;
  frames_.emplace_back();  // template-level `set`s
}

Status Interpreter::error_at(SourcePos p, const std::string& what) const {
  return error("template error at line {}, column {}: {}", p.line, p.col, what);
}

Status Interpreter::step(SourcePos p) {
  if (++steps_ > limits_.max_steps)
    return error_at(p, fmt::format("evaluation budget of {} steps exceeded", limits_.max_steps));
  return Status::ok();
}

Status Interpreter::check_size(size_t bytes, SourcePos p) const {
  if (bytes > limits_.max_output_bytes)
    return error_at(p, fmt::format("output larger than {} bytes", limits_.max_output_bytes));
  return Status::ok();
}

const Value* Interpreter::lookup(const std::string& name) const {
  for (auto it = frames_.rbegin(); it != frames_.rend(); ++it) {
    auto f = it->find(name);
    if (f != it->end()) return &f->second;
  }
  return nullptr;
}

Status Interpreter::run(const Body& body, std::string& out) {
  Flow flow = Flow::kNormal;
  return exec_body(body, out, flow);
}

Status Interpreter::exec_body(const Body& body, std::string& out, Flow& flow) {
  for (const StmtPtr& s : body) {
    MLA_RETURN_IF_ERROR(exec(*s, out, flow));
    if (flow != Flow::kNormal) return Status::ok();
  }
  return Status::ok();
}

Status Interpreter::assign(const std::vector<std::string>& targets, const Value& v, SourcePos p) {
  if (targets.size() == 1) {
    frames_.back()[targets[0]] = v;
    return Status::ok();
  }
  MLA_ASSIGN_OR_RETURN(Array items, iterate(*this, v, p));
  if (items.size() != targets.size())
    return error_at(p, fmt::format("cannot unpack {} values into {} names", items.size(), targets.size()));
  for (size_t i = 0; i < targets.size(); ++i) frames_.back()[targets[i]] = items[i];
  return Status::ok();
}

Status Interpreter::exec(const Stmt& s, std::string& out, Flow& flow) {
  MLA_RETURN_IF_ERROR(step(s.pos));
  switch (s.kind) {
    case Stmt::Kind::kText:
      out += s.text;
      return check_size(out.size(), s.pos);
    case Stmt::Kind::kOutput: {
      MLA_ASSIGN_OR_RETURN(Value v, eval(*s.expr));
      out += v.to_output();
      return check_size(out.size(), s.pos);
    }
    case Stmt::Kind::kIf:
      for (size_t i = 0; i < s.bodies.size(); ++i) {
        if (i < s.conds.size()) {
          MLA_ASSIGN_OR_RETURN(Value c, eval(*s.conds[i]));
          if (!c.truthy()) continue;
        }
        return exec_body(s.bodies[i], out, flow);
      }
      return Status::ok();
    case Stmt::Kind::kFor: return exec_for(s, out);
    case Stmt::Kind::kSet: {
      MLA_ASSIGN_OR_RETURN(Value v, eval(*s.expr));
      if (s.attr.empty()) return assign(s.targets, v, s.pos);
      const Value* ns = lookup(s.targets[0]);
      if (!ns || !ns->is_namespace())
        return error_at(s.pos, fmt::format("cannot assign attribute '{}' of '{}': not a namespace", s.attr, s.targets[0]));
      MLA_RETURN_IF_ERROR(check_storable(v, *ns, s.pos, *this));
      ns->set(s.attr, v);
      return Status::ok();
    }
    case Stmt::Kind::kSetBlock: {
      std::string captured;
      Flow inner = Flow::kNormal;
      MLA_RETURN_IF_ERROR(exec_body(s.bodies[0], captured, inner));
      return assign(s.targets, Value::string(std::move(captured)), s.pos);
    }
    case Stmt::Kind::kMacro: {
      const Stmt* macro = &s;
      frames_.back()[s.name] = Value::callable(
          [macro](Interpreter& in, CallArgs& a) { return in.call_macro(*macro, a); }, s.name);
      return Status::ok();
    }
    case Stmt::Kind::kBreak: flow = Flow::kBreak; return Status::ok();
    case Stmt::Kind::kContinue: flow = Flow::kContinue; return Status::ok();
  }
  return Status::ok();
}

Status Interpreter::exec_for(const Stmt& s, std::string& out) {
  MLA_ASSIGN_OR_RETURN(Value seq, eval(*s.expr));
  MLA_ASSIGN_OR_RETURN(Array items, iterate(*this, seq, s.expr->pos));
  if (s.cond) {  // `for x in xs if c`: filtering happens before loop.length is known
    Array kept;
    for (const Value& item : items) {
      MLA_RETURN_IF_ERROR(step(s.pos));
      frames_.emplace_back();
      Status st = assign(s.targets, item, s.pos);
      Result<Value> c = st.is_ok() ? eval(*s.cond) : Result<Value>(st);
      frames_.pop_back();
      if (!c) return c.status();
      if (c->truthy()) kept.push_back(item);
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    if (s.bodies.size() > 1) {
      Flow flow = Flow::kNormal;
      return exec_body(s.bodies[1], out, flow);
    }
    return Status::ok();
  }
  const int64_t n = int64_t(items.size());
  for (int64_t i = 0; i < n; ++i) {
    MLA_RETURN_IF_ERROR(step(s.pos));
    frames_.emplace_back();
    Status st = assign(s.targets, items[size_t(i)], s.pos);
    Object loop = {
        {"index", Value::integer(i + 1)},         {"index0", Value::integer(i)},
        {"revindex", Value::integer(n - i)},      {"revindex0", Value::integer(n - i - 1)},
        {"first", Value::boolean(i == 0)},        {"last", Value::boolean(i == n - 1)},
        {"length", Value::integer(n)},
        {"previtem", i > 0 ? items[size_t(i - 1)] : Value()},
        {"nextitem", i + 1 < n ? items[size_t(i + 1)] : Value()},
    };
    frames_.back()["loop"] = Value::object(std::move(loop));
    Flow flow = Flow::kNormal;
    if (st.is_ok()) st = exec_body(s.bodies[0], out, flow);
    frames_.pop_back();
    MLA_RETURN_IF_ERROR(st);
    if (flow == Flow::kBreak) break;
  }
  return Status::ok();
}

Result<Value> Interpreter::call_macro(const Stmt& macro, CallArgs& args) {
  if (depth_ >= limits_.max_depth) return error_at(args.pos, "macro calls nested too deeply");
  if (args.positional.size() > macro.targets.size())
    return error_at(args.pos, fmt::format("macro '{}' takes {} arguments", macro.name, macro.targets.size()));
  std::unordered_map<std::string, Value> frame;
  for (size_t i = 0; i < macro.targets.size(); ++i) {
    const Value* v = args.get(i, macro.targets[i].c_str());
    if (v) {
      frame[macro.targets[i]] = *v;
    } else if (macro.defaults[i]) {
      MLA_ASSIGN_OR_RETURN(Value d, eval(*macro.defaults[i]));
      frame[macro.targets[i]] = d;
    } else {
      frame[macro.targets[i]] = Value();
    }
  }
  ++depth_;
  frames_.push_back(std::move(frame));
  std::string out;
  Flow flow = Flow::kNormal;
  Status st = exec_body(macro.bodies[0], out, flow);
  frames_.pop_back();
  --depth_;
  MLA_RETURN_IF_ERROR(st);
  return Value::string(std::move(out));
}

Result<Value> Interpreter::get_attr(const Value& self, const std::string& name, SourcePos p) {
  if (self.is_object()) {
    if (const Value* v = self.find(name)) return *v;
  }
  if (has_method(self, name)) {
    Value bound = self;
    return Value::callable(
        [bound, name](Interpreter& in, CallArgs& a) { return call_method(in, bound, name, a); }, name);
  }
  if (self.is_undefined()) return error_at(p, fmt::format("'{}' of an undefined value", name));
  return Value();
}

namespace {

Result<Value> slice(Interpreter& in, const Value& v, const Value* start, const Value* stop, const Value* stepv,
                    SourcePos p) {
  auto as_int = [&](const Value* x, int64_t dflt) -> Result<int64_t> {
    if (!x || x->is_none() || x->is_undefined()) return dflt;
    if (x->kind() != Value::Kind::kInt) return in.error_at(p, "slice indices must be integers");
    return x->as_int();
  };
  std::vector<size_t> offs;
  int64_t n;
  if (v.is_string()) {
    offs = utf8_offsets(v.str());
    n = int64_t(offs.size()) - 1;
  } else if (v.is_array()) {
    n = int64_t(v.arr().size());
  } else {
    return in.error_at(p, fmt::format("cannot slice a {}", v.type_name()));
  }
  MLA_ASSIGN_OR_RETURN(int64_t st, as_int(stepv, 1));
  if (st == 0) return in.error_at(p, "slice step cannot be zero");
  auto norm = [&](const Value* x, int64_t dflt) -> Result<int64_t> {
    MLA_ASSIGN_OR_RETURN(int64_t i, as_int(x, dflt));
    if (!x || x->is_none() || x->is_undefined()) return i;
    if (i < 0) i += n;
    if (st > 0) return std::clamp<int64_t>(i, 0, n);
    return std::clamp<int64_t>(i, -1, n - 1);
  };
  MLA_ASSIGN_OR_RETURN(int64_t b, norm(start, st > 0 ? 0 : n - 1));
  MLA_ASSIGN_OR_RETURN(int64_t e, norm(stop, st > 0 ? n : -1));
  std::vector<int64_t> idx;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) idx.push_back(i);
  if (v.is_string()) {
    std::string out;
    for (int64_t i : idx) out.append(v.str(), offs[size_t(i)], offs[size_t(i) + 1] - offs[size_t(i)]);
    return Value::string(std::move(out));
  }
  Array out;
  for (int64_t i : idx) out.push_back(v.arr()[size_t(i)]);
  return Value::array(std::move(out));
}

Result<Value> arith(Interpreter& in, const std::string& op, const Value& a, const Value& b, SourcePos p) {
  const bool ints = a.kind() == Value::Kind::kInt && b.kind() == Value::Kind::kInt;
  if (!a.is_number() || !b.is_number()) {
    if (op == "*" && ((a.is_string() && b.kind() == Value::Kind::kInt) || (b.is_string() && a.kind() == Value::Kind::kInt))) {
      const std::string& s = a.is_string() ? a.str() : b.str();
      const int64_t k = a.is_string() ? b.as_int() : a.as_int();
      if (k > 0 && s.size() * uint64_t(k) > in.limits().max_output_bytes) MLA_RETURN_IF_ERROR(in.check_size(SIZE_MAX, p));
      std::string out;
      for (int64_t i = 0; i < k; ++i) out += s;
      return Value::string(std::move(out));
    }
    return in.error_at(p, fmt::format("unsupported operand types for {}: {} and {}", op, a.type_name(), b.type_name()));
  }
  const double x = a.as_double(), y = b.as_double();
  if (op == "+") return ints ? Value::integer(int64_t(uint64_t(a.as_int()) + uint64_t(b.as_int()))) : Value::real(x + y);
  if (op == "-") return ints ? Value::integer(int64_t(uint64_t(a.as_int()) - uint64_t(b.as_int()))) : Value::real(x - y);
  if (op == "*") return ints ? Value::integer(int64_t(uint64_t(a.as_int()) * uint64_t(b.as_int()))) : Value::real(x * y);
  if (op == "/") {
    if (y == 0) return in.error_at(p, "division by zero");
    return Value::real(x / y);
  }
  if (op == "//" || op == "%") {
    if (y == 0) return in.error_at(p, "division by zero");
    if (ints) {
      const int64_t i = a.as_int(), j = b.as_int();
      if (i == INT64_MIN && j == -1) return in.error_at(p, "integer overflow");
      int64_t q = i / j, r = i % j;
      if (r != 0 && ((r < 0) != (j < 0))) { --q; r += j; }  // Python floors
      return Value::integer(op == "//" ? q : r);
    }
    const double q = std::floor(x / y);
    return op == "//" ? Value::real(q) : Value::real(x - q * y);
  }
  if (op == "**") {
    if (ints && b.as_int() >= 0) {
      int64_t r = 1;
      for (int64_t i = 0; i < b.as_int() && i < 64; ++i) r = int64_t(uint64_t(r) * uint64_t(a.as_int()));
      return Value::integer(r);
    }
    return Value::real(std::pow(x, y));
  }
  return in.error_at(p, fmt::format("unknown operator '{}'", op));
}

Result<int> compare(Interpreter& in, const Value& a, const Value& b, SourcePos p) {
  if (a.is_number() && b.is_number()) {
    if (a.kind() == Value::Kind::kInt && b.kind() == Value::Kind::kInt)
      return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int() ? 1 : 0;
    return a.as_double() < b.as_double() ? -1 : a.as_double() > b.as_double() ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) return a.str().compare(b.str()) < 0 ? -1 : a.str() == b.str() ? 0 : 1;
  return in.error_at(p, fmt::format("cannot order {} and {}", a.type_name(), b.type_name()));
}

Result<bool> contains(Interpreter& in, const Value& hay, const Value& needle, SourcePos p) {
  if (hay.is_string()) {
    if (!needle.is_string()) return in.error_at(p, "'in <string>' requires a string");
    return hay.str().find(needle.str()) != std::string::npos;
  }
  if (hay.is_array()) {
    for (const Value& v : hay.arr())
      if (values_equal(v, needle)) return true;
    return false;
  }
  if (hay.is_object()) return needle.is_string() && hay.find(needle.str()) != nullptr;
  return in.error_at(p, fmt::format("'in' needs a string, list or dict, not {}", hay.type_name()));
}

}  // namespace

Result<Value> Interpreter::eval_binary(const Expr& e) {
  const std::string& op = e.name;
  MLA_ASSIGN_OR_RETURN(Value a, eval(*e.args[0]));
  if (op == "and") {
    if (!a.truthy()) return a;
    return eval(*e.args[1]);
  }
  if (op == "or") {
    if (a.truthy()) return a;
    return eval(*e.args[1]);
  }
  MLA_ASSIGN_OR_RETURN(Value b, eval(*e.args[1]));
  if (op == "==") return Value::boolean(values_equal(a, b));
  if (op == "!=") return Value::boolean(!values_equal(a, b));
  if (op == "<" || op == "<=" || op == ">" || op == ">=") {
    MLA_ASSIGN_OR_RETURN(int c, compare(*this, a, b, e.pos));
    const bool r = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
    return Value::boolean(r);
  }
  if (op == "in" || op == "notin") {
    MLA_ASSIGN_OR_RETURN(bool r, contains(*this, b, a, e.pos));
    return Value::boolean(op == "in" ? r : !r);
  }
  if (op == "~") {
    std::string s = a.to_output() + b.to_output();
    MLA_RETURN_IF_ERROR(check_size(s.size(), e.pos));
    return Value::string(std::move(s));
  }
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      MLA_RETURN_IF_ERROR(check_size(a.str().size() + b.str().size(), e.pos));
      return Value::string(a.str() + b.str());
    }
    if (a.is_array() && b.is_array()) {
      Array r = a.arr();
      r.insert(r.end(), b.arr().begin(), b.arr().end());
      MLA_RETURN_IF_ERROR(check_size(r.size(), e.pos));
      return Value::array(std::move(r));
    }
  }
  return arith(*this, op, a, b, e.pos);
}

Result<Value> Interpreter::eval_call(const Expr& e) {
  CallArgs args;
  args.pos = e.pos;
  for (size_t i = 1; i < e.args.size(); ++i) {
    MLA_ASSIGN_OR_RETURN(Value v, eval(*e.args[i]));
    if (e.arg_names[i].empty()) args.positional.push_back(std::move(v));
    else args.keyword.emplace_back(e.arg_names[i], std::move(v));
  }
  const Expr& callee = *e.args[0];
  if (callee.kind == Expr::Kind::kGetAttr) {  // method call without materializing a bound method
    MLA_ASSIGN_OR_RETURN(Value self, eval(*callee.args[0]));
    if (!(self.is_object() && self.find(callee.name)) && has_method(self, callee.name))
      return call_method(*this, self, callee.name, args);
  }
  MLA_ASSIGN_OR_RETURN(Value f, eval(callee));
  if (!f.is_callable()) {
    std::string what = callee.kind == Expr::Kind::kName ? "'" + callee.name + "'" : std::string("value");
    return error_at(e.pos, fmt::format("{} is not callable (unknown function?)", what));
  }
  return f.fn()(*this, args);
}

Result<Value> Interpreter::eval(const Expr& e) {
  MLA_RETURN_IF_ERROR(step(e.pos));
  switch (e.kind) {
    case Expr::Kind::kLiteral: return e.literal;
    case Expr::Kind::kName: {
      const Value* v = lookup(e.name);
      return v ? *v : Value();
    }
    case Expr::Kind::kList:
    case Expr::Kind::kTuple: {
      Array a;
      for (const ExprPtr& x : e.args) {
        MLA_ASSIGN_OR_RETURN(Value v, eval(*x));
        a.push_back(std::move(v));
      }
      return Value::array(std::move(a));
    }
    case Expr::Kind::kDict: {
      Value d = Value::object();
      for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
        MLA_ASSIGN_OR_RETURN(Value k, eval(*e.args[i]));
        MLA_ASSIGN_OR_RETURN(Value v, eval(*e.args[i + 1]));
        d.set(k.to_output(), std::move(v));
      }
      return d;
    }
    case Expr::Kind::kGetAttr: {
      MLA_ASSIGN_OR_RETURN(Value base, eval(*e.args[0]));
      return get_attr(base, e.name, e.pos);
    }
    case Expr::Kind::kGetItem: {
      MLA_ASSIGN_OR_RETURN(Value base, eval(*e.args[0]));
      MLA_ASSIGN_OR_RETURN(Value key, eval(*e.args[1]));
      return get_item(*this, base, key, e.pos);
    }
    case Expr::Kind::kSlice: {
      MLA_ASSIGN_OR_RETURN(Value base, eval(*e.args[0]));
      Value parts[3];
      for (int i = 0; i < 3; ++i)
        if (e.args[size_t(i) + 1]) {
          MLA_ASSIGN_OR_RETURN(parts[i], eval(*e.args[size_t(i) + 1]));
        }
      return slice(*this, base, e.args[1] ? &parts[0] : nullptr, e.args[2] ? &parts[1] : nullptr,
                   e.args[3] ? &parts[2] : nullptr, e.pos);
    }
    case Expr::Kind::kCall: return eval_call(e);
    case Expr::Kind::kFilter:
    case Expr::Kind::kTest: {
      CallArgs args;
      args.pos = e.pos;
      for (size_t i = 0; i < e.args.size(); ++i) {
        MLA_ASSIGN_OR_RETURN(Value v, eval(*e.args[i]));
        if (e.arg_names[i].empty()) args.positional.push_back(std::move(v));
        else args.keyword.emplace_back(e.arg_names[i], std::move(v));
      }
      if (e.kind == Expr::Kind::kFilter) return apply_filter(e.name, args);
      MLA_ASSIGN_OR_RETURN(bool r, apply_test(e.name, args));
      return Value::boolean(e.negated ? !r : r);
    }
    case Expr::Kind::kUnary: {
      MLA_ASSIGN_OR_RETURN(Value v, eval(*e.args[0]));
      if (e.name == "not") return Value::boolean(!v.truthy());
      if (v.kind() == Value::Kind::kInt)
        return Value::integer(e.name == "-" ? int64_t(0 - uint64_t(v.as_int())) : v.as_int());
      if (v.kind() == Value::Kind::kFloat) return Value::real(e.name == "-" ? -v.as_double() : v.as_double());
      return error_at(e.pos, fmt::format("bad operand type for unary {}: {}", e.name, v.type_name()));
    }
    case Expr::Kind::kBinary: return eval_binary(e);
    case Expr::Kind::kTernary: {
      MLA_ASSIGN_OR_RETURN(Value c, eval(*e.args[1]));
      if (c.truthy()) return eval(*e.args[0]);
      if (e.args[2]) return eval(*e.args[2]);
      return Value();
    }
  }
  return Value();
}

Result<std::string> render(const Template& tpl, const Value& context, const RenderLimits& limits) {
  Interpreter in(context, limits);
  std::string out;
  MLA_RETURN_IF_ERROR(in.run(tpl.body, out));
  return out;
}

Result<std::string> render_string(const std::string& source, const Value& context, const RenderLimits& limits) {
  MLA_ASSIGN_OR_RETURN(std::shared_ptr<const Template> tpl, parse_template(source));
  return render(*tpl, context, limits);
}

}  // namespace mla::tokenizer::jinja
