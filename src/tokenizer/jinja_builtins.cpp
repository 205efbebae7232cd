// Filters, tests and methods of the Jinja subset: the ones real chat templates use (see
// chat_template.h). Anything else is an error naming it, never a silent empty string.
#include <algorithm>
#include <unordered_set>

#include "tokenizer/jinja_interp.h"

namespace mla::tokenizer::jinja {
namespace {

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::string strip_chars(const std::string& s, const Value* chars, bool left, bool right) {
  auto strip_it = [&](char c) {
    if (!chars || chars->is_none() || chars->is_undefined()) return is_ws(c);
    return chars->str().find(c) != std::string::npos;
  };
  size_t b = 0, e = s.size();
  if (left) while (b < e && strip_it(s[b])) ++b;
  if (right) while (e > b && strip_it(s[e - 1])) --e;
  return s.substr(b, e - b);
}

Result<Value> split(Interpreter& in, const std::string& s, const Value* sep, const Value* maxsplit, SourcePos p) {
  int64_t limit = -1;
  if (maxsplit && maxsplit->kind() == Value::Kind::kInt) limit = maxsplit->as_int();
  Array out;
  if (!sep || sep->is_none() || sep->is_undefined()) {  // whitespace runs, no empty pieces
    size_t i = 0;
    while (true) {
      while (i < s.size() && is_ws(s[i])) ++i;
      if (i >= s.size()) break;
      if (limit >= 0 && int64_t(out.size()) == limit) {
        std::string rest = s.substr(i);
        while (!rest.empty() && is_ws(rest.back())) rest.pop_back();
        out.push_back(Value::string(rest));
        break;
      }
      size_t j = i;
      while (j < s.size() && !is_ws(s[j])) ++j;
      out.push_back(Value::string(s.substr(i, j - i)));
      i = j;
    }
    return Value::array(std::move(out));
  }
  if (!sep->is_string() || sep->str().empty()) return in.error_at(p, "split() separator must be a non-empty string");
  const std::string& d = sep->str();
  size_t i = 0;
  while (true) {
    MLA_RETURN_IF_ERROR(in.step(p));
    size_t j = s.find(d, i);
    if (j == std::string::npos || (limit >= 0 && int64_t(out.size()) == limit)) {
      out.push_back(Value::string(s.substr(i)));
      break;
    }
    out.push_back(Value::string(s.substr(i, j - i)));
    i = j + d.size();
  }
  return Value::array(std::move(out));
}

Result<Value> replace(Interpreter& in, const std::string& s, const Value* from, const Value* to, const Value* count,
                      SourcePos p) {
  if (!from || !to || !from->is_string() || !to->is_string()) return in.error_at(p, "replace() needs two strings");
  int64_t limit = count && count->kind() == Value::Kind::kInt ? count->as_int() : -1;
  const std::string& a = from->str();
  const std::string& b = to->str();
  std::string out;
  size_t i = 0;
  int64_t n = 0;
  if (a.empty()) {  // Python inserts `b` between characters and at both ends
    const std::vector<size_t> offs = utf8_offsets(s);
    for (size_t k = 0; k + 1 < offs.size(); ++k) {
      if (limit < 0 || n < limit) { out += b; ++n; }
      out.append(s, offs[k], offs[k + 1] - offs[k]);
      MLA_RETURN_IF_ERROR(in.check_size(out.size(), p));
    }
    if (limit < 0 || n < limit) out += b;
    return Value::string(std::move(out));
  }
  while (true) {
    size_t j = s.find(a, i);
    if (j == std::string::npos || (limit >= 0 && n >= limit)) break;
    out.append(s, i, j - i);
    out += b;
    MLA_RETURN_IF_ERROR(in.check_size(out.size(), p));
    i = j + a.size();
    ++n;
  }
  out.append(s, i, std::string::npos);
  return Value::string(std::move(out));
}

Value items_of(const Value& d) {
  Array out;
  for (const auto& [k, v] : d.obj()) out.push_back(Value::array({Value::string(k), v}));
  return Value::array(std::move(out));
}

Result<Value> require_string(Interpreter& in, const Value& v, const char* what, SourcePos p) {
  if (!v.is_string()) return in.error_at(p, fmt::format("{} expects a string, got {}", what, v.type_name()));
  return v;
}

std::string case_map(std::string s, bool upper) {
  for (char& c : s)
    if (upper && c >= 'a' && c <= 'z') c = char(c - 32);
    else if (!upper && c >= 'A' && c <= 'Z') c = char(c + 32);
  return s;
}

Result<bool> run_test(Interpreter& in, const std::string& name, const Value& v, const CallArgs& a);

// Resolves `attribute` dotted paths for selectattr/map ("function.name").
Value attr_path(const Value& v, const std::string& path) {
  Value cur = v;
  size_t i = 0;
  while (i <= path.size()) {
    size_t j = path.find('.', i);
    if (j == std::string::npos) j = path.size();
    if (!cur.is_object()) return Value();
    const Value* next = cur.find(path.substr(i, j - i));
    if (!next) return Value();
    cur = *next;
    i = j + 1;
  }
  return cur;
}

}  // namespace

Result<Array> iterate(Interpreter& in, const Value& v, SourcePos p) {
  if (v.is_array()) return v.arr();
  if (v.is_object()) {
    Array keys;
    for (const auto& kv : v.obj()) keys.push_back(Value::string(kv.first));
    return keys;
  }
  if (v.is_string()) {
    Array chars;
    const std::vector<size_t> offs = utf8_offsets(v.str());
    for (size_t k = 0; k + 1 < offs.size(); ++k) chars.push_back(Value::string(v.str().substr(offs[k], offs[k + 1] - offs[k])));
    return chars;
  }
  return in.error_at(p, fmt::format("{} is not iterable", v.type_name()));
}

Result<Value> get_item(Interpreter& in, const Value& v, const Value& key, SourcePos p) {
  if (v.is_object()) {
    if (key.is_string()) {
      if (const Value* f = v.find(key.str())) return *f;
      if (has_method(v, key.str())) return in.get_attr(v, key.str(), p);
    }
    return Value();
  }
  if ((v.is_array() || v.is_string()) && key.kind() == Value::Kind::kInt) {
    int64_t i = key.as_int();
    if (v.is_array()) {
      const int64_t n = int64_t(v.arr().size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value();
      return v.arr()[size_t(i)];
    }
    const std::vector<size_t> offs = utf8_offsets(v.str());
    const int64_t n = int64_t(offs.size()) - 1;
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value();
    return Value::string(v.str().substr(offs[size_t(i)], offs[size_t(i) + 1] - offs[size_t(i)]));
  }
  if (key.is_string()) return in.get_attr(v, key.str(), p);
  if (v.is_undefined()) return in.error_at(p, "subscript of an undefined value");
  return Value();
}

Status check_storable(const Value& v, const Value& container, SourcePos p, const Interpreter& in) {
  // Depth-first walk; containers are acyclic by this very invariant, so the walk terminates.
  std::vector<std::pair<const Value*, int>> stack = {{&v, 0}};
  while (!stack.empty()) {
    auto [cur, depth] = stack.back();
    stack.pop_back();
    if (cur->is_callable()) return in.error_at(p, "cannot store a function inside a list or namespace");
    if (cur->identity() && cur->identity() == container.identity())
      return in.error_at(p, "cannot store a container inside itself");
    if (depth > 64) return in.error_at(p, "value nested too deeply");
    if (cur->is_array())
      for (const Value& x : cur->arr()) stack.push_back({&x, depth + 1});
    if (cur->is_object())
      for (const auto& kv : cur->obj()) stack.push_back({&kv.second, depth + 1});
  }
  return Status::ok();
}

bool has_method(const Value& self, const std::string& name) {
  static const std::unordered_set<std::string> kString = {
      "startswith", "endswith", "strip", "lstrip", "rstrip", "split", "replace", "upper", "lower",
      "title", "capitalize", "find", "count", "join", "isdigit", "isspace"};
  static const std::unordered_set<std::string> kDict = {"items", "keys", "values", "get"};
  if (self.is_string()) return kString.count(name) > 0;
  if (self.is_object() && !self.is_namespace()) return kDict.count(name) > 0;
  if (self.is_array()) return name == "append" || name == "index";
  return false;
}

Result<Value> call_method(Interpreter& in, const Value& self, const std::string& name, CallArgs& a) {
  const SourcePos p = a.pos;
  if (self.is_string()) {
    const std::string& s = self.str();
    if (name == "startswith" || name == "endswith") {
      const Value* x = a.get(0, "prefix");
      if (!x) return in.error_at(p, name + "() needs an argument");
      std::vector<Value> cands = x->is_array() ? x->arr() : std::vector<Value>{*x};
      for (const Value& c : cands) {
        if (!c.is_string()) return in.error_at(p, name + "() needs a string");
        const std::string& t = c.str();
        const bool hit = t.size() <= s.size() &&
                         (name == "startswith" ? s.compare(0, t.size(), t) == 0 : s.compare(s.size() - t.size(), t.size(), t) == 0);
        if (hit) return Value::boolean(true);
      }
      return Value::boolean(false);
    }
    if (name == "strip") return Value::string(strip_chars(s, a.get(0, "chars"), true, true));
    if (name == "lstrip") return Value::string(strip_chars(s, a.get(0, "chars"), true, false));
    if (name == "rstrip") return Value::string(strip_chars(s, a.get(0, "chars"), false, true));
    if (name == "split") return split(in, s, a.get(0, "sep"), a.get(1, "maxsplit"), p);
    if (name == "replace") return replace(in, s, a.get(0, "old"), a.get(1, "new"), a.get(2, "count"), p);
    if (name == "upper") return Value::string(case_map(s, true));
    if (name == "lower") return Value::string(case_map(s, false));
    if (name == "title" || name == "capitalize") {
      std::string out = case_map(s, false);
      bool start = true;
      for (char& c : out) {
        if (start && c >= 'a' && c <= 'z') c = char(c - 32);
        start = name == "title" ? !((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) : false;
      }
      return Value::string(std::move(out));
    }
    if (name == "find" || name == "count") {
      const Value* x = a.get(0, "sub");
      if (!x || !x->is_string()) return in.error_at(p, name + "() needs a string");
      if (name == "find") {
        size_t at = s.find(x->str());
        return Value::integer(at == std::string::npos ? -1 : int64_t(utf8_length(s.substr(0, at))));
      }
      if (x->str().empty()) return Value::integer(int64_t(utf8_length(s)) + 1);
      int64_t n = 0;
      for (size_t at = s.find(x->str()); at != std::string::npos; at = s.find(x->str(), at + x->str().size())) ++n;
      return Value::integer(n);
    }
    if (name == "join") {
      const Value* x = a.get(0, "iterable");
      if (!x) return in.error_at(p, "join() needs an argument");
      MLA_ASSIGN_OR_RETURN(Array items, iterate(in, *x, p));
      std::string out;
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += s;
        out += items[i].to_output();
        MLA_RETURN_IF_ERROR(in.check_size(out.size(), p));
      }
      return Value::string(std::move(out));
    }
    if (name == "isdigit" || name == "isspace") {
      if (s.empty()) return Value::boolean(false);
      for (char c : s)
        if (name == "isdigit" ? !(c >= '0' && c <= '9') : !is_ws(c)) return Value::boolean(false);
      return Value::boolean(true);
    }
  } else if (self.is_object()) {
    if (name == "items") return items_of(self);
    if (name == "keys" || name == "values") {
      Array out;
      for (const auto& [k, v] : self.obj()) out.push_back(name == "keys" ? Value::string(k) : v);
      return Value::array(std::move(out));
    }
    if (name == "get") {
      const Value* k = a.get(0, "key");
      const Value* d = a.get(1, "default");
      if (k && k->is_string())
        if (const Value* f = self.find(k->str())) return *f;
      return d ? *d : Value::none();
    }
  } else if (self.is_array()) {
    if (name == "append") {
      const Value* x = a.get(0, "object");
      if (!x) return in.error_at(p, "append() needs an argument");
      MLA_RETURN_IF_ERROR(check_storable(*x, self, p, in));
      MLA_RETURN_IF_ERROR(in.check_size(self.arr().size() + 1, p));
      self.arr().push_back(*x);
      return Value::none();
    }
    if (name == "index") {
      const Value* x = a.get(0, "value");
      for (size_t i = 0; x && i < self.arr().size(); ++i)
        if (values_equal(self.arr()[i], *x)) return Value::integer(int64_t(i));
      return in.error_at(p, "index(): value not in list");
    }
  }
  return in.error_at(p, fmt::format("unsupported method '{}' of {}", name, self.type_name()));
}

Result<Value> Interpreter::apply_filter(const std::string& name, CallArgs& a) {
  const SourcePos p = a.pos;
  const Value v = a.positional.empty() ? Value() : a.positional[0];
  auto arg = [&](size_t i, const char* kw) { return a.get(i, kw); };
  if (name == "trim") {
    MLA_ASSIGN_OR_RETURN(Value s, require_string(*this, v, "trim", p));
    return Value::string(strip_chars(s.str(), arg(1, "chars"), true, true));
  }
  if (name == "length" || name == "count") {
    if (v.is_string()) return Value::integer(int64_t(utf8_length(v.str())));
    if (v.is_array()) return Value::integer(int64_t(v.arr().size()));
    if (v.is_object()) return Value::integer(int64_t(v.obj().size()));
    return error_at(p, fmt::format("length of a {}", v.type_name()));
  }
  if (name == "tojson") {
    JsonFormat f;
    if (const Value* ind = arg(1, "indent"); ind && ind->kind() == Value::Kind::kInt) f.indent = int(std::clamp<int64_t>(ind->as_int(), 0, 64));
    if (const Value* sep = arg(2, "separators"); sep && sep->is_array() && sep->arr().size() == 2 &&
                                                  sep->arr()[0].is_string() && sep->arr()[1].is_string()) {
      f.custom_item_separator = true;
      f.item_separator = sep->arr()[0].str();
      f.key_separator = sep->arr()[1].str();
    }
    if (const Value* sk = a.get(99, "sort_keys")) f.sort_keys = sk->truthy();
    MLA_ASSIGN_OR_RETURN(std::string s, to_json_string(v, f));
    MLA_RETURN_IF_ERROR(check_size(s.size(), p));
    return Value::string(std::move(s));
  }
  if (name == "string") return v.is_string() ? v : Value::string(v.to_output());
  if (name == "safe" || name == "e" || name == "escape") {
    if (name == "safe") return v;
    return error_at(p, "unsupported filter 'escape' (autoescape is off in chat templates)");
  }
  if (name == "items") {
    if (v.is_object()) return items_of(v);
    if (v.is_undefined() || v.is_none()) return Value::array();
    return error_at(p, fmt::format("items of a {}", v.type_name()));
  }
  if (name == "list") {
    MLA_ASSIGN_OR_RETURN(Array items, iterate(*this, v, p));
    return Value::array(std::move(items));
  }
  if (name == "default" || name == "d") {
    const Value* dflt = arg(1, "default_value");
    const Value* boolean = arg(2, "boolean");
    const bool use_default = v.is_undefined() || (boolean && boolean->truthy() && !v.truthy());
    if (use_default) return dflt ? *dflt : Value::string("");
    return v;
  }
  if (name == "upper" || name == "lower") {
    MLA_ASSIGN_OR_RETURN(Value s, require_string(*this, v, name.c_str(), p));
    return Value::string(case_map(s.str(), name == "upper"));
  }
  if (name == "capitalize" || name == "title") return call_method(*this, v, name, a);
  if (name == "join") {
    const Value* sep = arg(1, "d");
    const Value* attribute = arg(2, "attribute");
    MLA_ASSIGN_OR_RETURN(Array items, iterate(*this, v, p));
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      if (i && sep) out += sep->to_output();
      out += (attribute ? attr_path(items[i], attribute->to_output()) : items[i]).to_output();
      MLA_RETURN_IF_ERROR(check_size(out.size(), p));
    }
    return Value::string(std::move(out));
  }
  if (name == "first" || name == "last") {
    MLA_ASSIGN_OR_RETURN(Array items, iterate(*this, v, p));
    if (items.empty()) return Value();
    return name == "first" ? items.front() : items.back();
  }
  if (name == "reverse") {
    if (v.is_string()) {
      MLA_ASSIGN_OR_RETURN(Array chars, iterate(*this, v, p));
      std::string out;
      for (auto it = chars.rbegin(); it != chars.rend(); ++it) out += it->str();
      return Value::string(std::move(out));
    }
    MLA_ASSIGN_OR_RETURN(Array items, iterate(*this, v, p));
    std::reverse(items.begin(), items.end());
    return Value::array(std::move(items));
  }
  if (name == "replace") {
    MLA_ASSIGN_OR_RETURN(Value s, require_string(*this, v, "replace", p));
    return replace(*this, s.str(), arg(1, "old"), arg(2, "new"), arg(3, "count"), p);
  }
  if (name == "int") {
    if (v.kind() == Value::Kind::kInt) return v;
    if (v.kind() == Value::Kind::kFloat) return Value::integer(int64_t(std::clamp(v.as_double(), -9e18, 9e18)));
    if (v.is_string()) return Value::integer(std::strtoll(v.str().c_str(), nullptr, 10));
    return Value::integer(0);
  }
  if (name == "abs" && v.is_number())
    return v.kind() == Value::Kind::kInt ? Value::integer(v.as_int() < 0 ? int64_t(0 - uint64_t(v.as_int())) : v.as_int())
                                         : Value::real(v.as_double() < 0 ? -v.as_double() : v.as_double());
  if (name == "selectattr" || name == "rejectattr" || name == "select" || name == "reject") {
    const bool by_attr = name == "selectattr" || name == "rejectattr";
    const bool keep_if = name == "selectattr" || name == "select";
    MLA_ASSIGN_OR_RETURN(Array items, iterate(*this, v, p));
    const size_t first_test_arg = by_attr ? 2 : 1;
    const Value* attribute = by_attr ? arg(1, "attribute") : nullptr;
    if (by_attr && (!attribute || !attribute->is_string())) return error_at(p, name + " needs an attribute name");
    const Value* test = first_test_arg < a.positional.size() ? &a.positional[first_test_arg] : nullptr;
    Array out;
    for (const Value& item : items) {
      MLA_RETURN_IF_ERROR(step(p));
      Value subject = by_attr ? attr_path(item, attribute->str()) : item;
      bool r;
      if (!test) {
        r = subject.truthy();
      } else {
        CallArgs ta;
        ta.pos = p;
        ta.positional.push_back(subject);
        for (size_t k = first_test_arg + 1; k < a.positional.size(); ++k) ta.positional.push_back(a.positional[k]);
        MLA_ASSIGN_OR_RETURN(r, apply_test(test->to_output(), ta));
      }
      if (r == keep_if) out.push_back(item);
    }
    return Value::array(std::move(out));
  }
  if (name == "map") {
    MLA_ASSIGN_OR_RETURN(Array items, iterate(*this, v, p));
    Array out;
    const Value* attribute = a.get(99, "attribute");
    for (const Value& item : items) {
      MLA_RETURN_IF_ERROR(step(p));
      if (attribute) {
        Value r = attr_path(item, attribute->to_output());
        if (r.is_undefined())
          if (const Value* d = a.get(99, "default")) r = *d;
        out.push_back(r);
      } else if (a.positional.size() >= 2) {
        CallArgs fa;
        fa.pos = p;
        fa.positional.push_back(item);
        for (size_t k = 2; k < a.positional.size(); ++k) fa.positional.push_back(a.positional[k]);
        MLA_ASSIGN_OR_RETURN(Value r, apply_filter(a.positional[1].to_output(), fa));
        out.push_back(r);
      } else {
        return error_at(p, "map needs a filter name or attribute=");
      }
    }
    return Value::array(std::move(out));
  }
  if (name == "unique") {
    MLA_ASSIGN_OR_RETURN(Array items, iterate(*this, v, p));
    Array out;
    for (const Value& item : items) {
      MLA_RETURN_IF_ERROR(step(p));
      bool seen = false;
      for (const Value& o : out) seen = seen || values_equal(o, item);
      if (!seen) out.push_back(item);
    }
    return Value::array(std::move(out));
  }
  if (name == "indent") {
    MLA_ASSIGN_OR_RETURN(Value s, require_string(*this, v, "indent", p));
    const Value* w = arg(1, "width");
    const Value* first = arg(2, "first");
    const std::string pad(size_t(w && w->kind() == Value::Kind::kInt ? std::clamp<int64_t>(w->as_int(), 0, 256) : 4), ' ');
    std::string out = first && first->truthy() ? pad : "";
    for (char c : s.str()) {
      out += c;
      if (c == '\n') out += pad;
    }
    // Jinja does not indent empty lines: drop the padding that follows a newline directly.
    std::string cleaned;
    for (size_t i = 0; i < out.size(); ++i) {
      cleaned += out[i];
      if (out[i] == '\n' && out.compare(i + 1, pad.size(), pad) == 0 &&
          (i + 1 + pad.size() >= out.size() || out[i + 1 + pad.size()] == '\n'))
        i += pad.size();
    }
    MLA_RETURN_IF_ERROR(check_size(cleaned.size(), p));
    return Value::string(std::move(cleaned));
  }
  if (name == "dictsort") {
    if (!v.is_object()) return error_at(p, "dictsort needs a dict");
    Value items = items_of(v);
    std::stable_sort(items.arr().begin(), items.arr().end(),
                     [](const Value& x, const Value& y) { return x.arr()[0].str() < y.arr()[0].str(); });
    return items;
  }
  return error_at(p, fmt::format("unsupported filter '{}'", name));
}

namespace {

Result<bool> run_test(Interpreter& in, const std::string& name, const Value& v, const CallArgs& a) {
  using K = Value::Kind;
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.kind() == K::kInt;
  if (name == "float") return v.kind() == K::kFloat;
  if (name == "boolean") return v.kind() == K::kBool;
  if (name == "true") return v.kind() == K::kBool && v.as_bool();
  if (name == "false") return v.kind() == K::kBool && !v.as_bool();
  if (name == "mapping") return v.is_object();
  if (name == "iterable") return v.is_array() || v.is_object() || v.is_string();
  if (name == "sequence") return v.is_array() || v.is_object() || v.is_string();
  if (name == "callable") return v.is_callable();
  if (name == "odd" || name == "even") {
    if (v.kind() != K::kInt) return in.error_at(a.pos, "odd/even test needs an integer");
    return (v.as_int() % 2 != 0) == (name == "odd");
  }
  if (name == "lower" || name == "upper") {
    if (!v.is_string()) return false;
    for (char c : v.str())
      if (name == "lower" ? (c >= 'A' && c <= 'Z') : (c >= 'a' && c <= 'z')) return false;
    return true;
  }
  const Value* other = a.positional.size() > 1 ? &a.positional[1] : nullptr;
  if (name == "eq" || name == "equalto" || name == "==" || name == "sameas") return other && values_equal(v, *other);
  if (name == "ne" || name == "!=") return !other || !values_equal(v, *other);
  if (name == "in") {
    if (!other) return in.error_at(a.pos, "'in' test needs an argument");
    if (other->is_array()) {
      for (const Value& x : other->arr())
        if (values_equal(x, v)) return true;
      return false;
    }
    if (other->is_string() && v.is_string()) return other->str().find(v.str()) != std::string::npos;
    if (other->is_object() && v.is_string()) return other->find(v.str()) != nullptr;
    return false;
  }
  return in.error_at(a.pos, fmt::format("unsupported test '{}'", name));
}

}  // namespace

Result<bool> Interpreter::apply_test(const std::string& name, CallArgs& a) {
  const Value v = a.positional.empty() ? Value() : a.positional[0];
  return run_test(*this, name, v, a);
}

}  // namespace mla::tokenizer::jinja
