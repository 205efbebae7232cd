// Value semantics for the Jinja-subset interpreter: construction from JSON, truthiness, Python
// equality and printing, and the `tojson` serializer (json.dumps with ensure_ascii=False).
#include "tokenizer/jinja_value.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace mla::tokenizer::jinja {

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return none();
    case nlohmann::ordered_json::value_t::boolean: return boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      return u <= uint64_t(INT64_MAX) ? integer(int64_t(u)) : real(double(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return real(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      Array a;
      a.reserve(j.size());
      for (const auto& e : j) a.push_back(from_json(e));
      return array(std::move(a));
    }
    case nlohmann::ordered_json::value_t::object: {
      Object o;
      o.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) o.emplace_back(it.key(), from_json(it.value()));
      return object(std::move(o));
    }
    default: return none();  // binary / discarded: not produced by JSON parsing
  }
}

const Value* Value::find(const std::string& key) const {
  for (const auto& [k, v] : *o_)
    if (k == key) return &v;
  return nullptr;
}

void Value::set(const std::string& key, Value v) const {
  for (auto& [k, old] : *o_)
    if (k == key) { old = std::move(v); return; }
  o_->emplace_back(key, std::move(v));
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool: return b_;
    case Kind::kInt: return i_ != 0;
    case Kind::kFloat: return f_ != 0.0;
    case Kind::kString: return !s_->empty();
    case Kind::kArray: return !a_->empty();
    case Kind::kObject: return namespace_ || !o_->empty();
    case Kind::kCallable: return true;
  }
  return false;
}

const char* Value::type_name() const {
  switch (kind_) {
    case Kind::kUndefined: return "undefined";
    case Kind::kNone: return "none";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "string";
    case Kind::kArray: return "list";
    case Kind::kObject: return namespace_ ? "namespace" : "dict";
    case Kind::kCallable: return "callable";
  }
  return "?";
}

namespace {

// Shortest round-trip decimal, Python repr style ("1.0", "0.1", "1e+100", "inf").
std::string format_double(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  char buf[40];
  for (int prec = 1; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, f);
    if (std::strtod(buf, nullptr) == f) break;
  }
  std::string s = buf;
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

std::string python_quote(const std::string& s) {
  // Python picks double quotes only when the string holds a single quote and no double quote.
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (char c : s) {
    if (c == q || c == '\\') { out += '\\'; out += c; }
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else out += c;
  }
  out += q;
  return out;
}

void json_escape(const std::string& s, std::string& out) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) out += fmt::format("\\u{:04x}", unsigned(c));
        else out += char(c);
    }
  }
  out += '"';
}

Status json_write(const Value& v, const JsonFormat& f, int depth, std::string& out) {
  if (depth > 512) return error("tojson: nesting deeper than 512");
  const std::string item_sep = f.custom_item_separator ? f.item_separator : (f.indent >= 0 ? "," : ", ");
  auto newline = [&](int d) {
    if (f.indent < 0) return;
    out += '\n';
    out.append(size_t(f.indent) * size_t(d), ' ');
  };
  switch (v.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: out += "null"; return Status::ok();
    case Value::Kind::kBool: out += v.as_bool() ? "true" : "false"; return Status::ok();
    case Value::Kind::kInt: out += std::to_string(v.as_int()); return Status::ok();
    case Value::Kind::kFloat: {
      const double d = v.as_double();
      out += std::isfinite(d) ? format_double(d) : (std::isnan(d) ? "NaN" : (d > 0 ? "Infinity" : "-Infinity"));
      return Status::ok();
    }
    case Value::Kind::kString: json_escape(v.str(), out); return Status::ok();
    case Value::Kind::kArray: {
      out += '[';
      const Array& a = v.arr();
      for (size_t i = 0; i < a.size(); ++i) {
        if (i) out += item_sep;
        newline(depth + 1);
        MLA_RETURN_IF_ERROR(json_write(a[i], f, depth + 1, out));
      }
      if (!a.empty()) newline(depth);
      out += ']';
      return Status::ok();
    }
    case Value::Kind::kObject: {
      out += '{';
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.obj()) items.push_back(&kv);
      if (f.sort_keys)
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += item_sep;
        newline(depth + 1);
        json_escape(items[i]->first, out);
        out += f.key_separator;
        MLA_RETURN_IF_ERROR(json_write(items[i]->second, f, depth + 1, out));
      }
      if (!items.empty()) newline(depth);
      out += '}';
      return Status::ok();
    }
    case Value::Kind::kCallable: return error("tojson: cannot serialize a callable");
  }
  return Status::ok();
}

}  // namespace

std::string Value::repr(int depth) const {
  if (kind_ == Kind::kString) return python_quote(*s_);
  return to_output(depth);
}

std::string Value::to_output(int depth) const {
  if (depth > 64) return "...";
  switch (kind_) {
    case Kind::kUndefined: return "";
    case Kind::kNone: return "None";
    case Kind::kBool: return b_ ? "True" : "False";
    case Kind::kInt: return std::to_string(i_);
    case Kind::kFloat: return format_double(f_);
    case Kind::kString: return *s_;
    case Kind::kArray: {
      std::string out = "[";
      for (size_t i = 0; i < a_->size(); ++i) out += (i ? ", " : "") + (*a_)[i].repr(depth + 1);
      return out + "]";
    }
    case Kind::kObject: {
      std::string out = namespace_ ? "<Namespace {" : "{";
      for (size_t i = 0; i < o_->size(); ++i)
        out += (i ? ", " : "") + python_quote((*o_)[i].first) + ": " + (*o_)[i].second.repr(depth + 1);
      return out + (namespace_ ? "}>" : "}");
    }
    case Kind::kCallable: return "<function " + *s_ + ">";
  }
  return "";
}

bool values_equal(const Value& a, const Value& b, int depth) {
  if (depth > 64) return false;
  using K = Value::Kind;
  const bool an = a.is_number() || a.kind() == K::kBool, bn = b.is_number() || b.kind() == K::kBool;
  if (an && bn) {
    auto num = [](const Value& v) { return v.kind() == K::kBool ? double(v.as_bool()) : v.as_double(); };
    if (a.kind() == K::kInt && b.kind() == K::kInt) return a.as_int() == b.as_int();
    return num(a) == num(b);
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case K::kUndefined:
    case K::kNone: return true;
    case K::kString: return a.str() == b.str();
    case K::kArray: {
      if (a.arr().size() != b.arr().size()) return false;
      for (size_t i = 0; i < a.arr().size(); ++i)
        if (!values_equal(a.arr()[i], b.arr()[i], depth + 1)) return false;
      return true;
    }
    case K::kObject: {
      if (a.obj().size() != b.obj().size()) return false;
      for (const auto& [k, v] : a.obj()) {
        const Value* o = b.find(k);
        if (!o || !values_equal(v, *o, depth + 1)) return false;
      }
      return true;
    }
    case K::kCallable: return &a.fn() == &b.fn();
    default: return false;
  }
}

Result<std::string> to_json_string(const Value& v, const JsonFormat& format) {
  std::string out;
  MLA_RETURN_IF_ERROR(json_write(v, format, 0, out));
  return out;
}

std::vector<size_t> utf8_offsets(const std::string& s) {
  std::vector<size_t> offs;
  offs.reserve(s.size() + 1);
  for (size_t i = 0; i < s.size(); ++i)
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80 || offs.empty()) offs.push_back(i);
  offs.push_back(s.size());
  return offs;
}

size_t utf8_length(const std::string& s) { return utf8_offsets(s).size() - 1; }

}  // namespace mla::tokenizer::jinja
