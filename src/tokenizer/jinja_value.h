// The dynamic value type of the Jinja-subset interpreter (jinja_*.{h,cpp}): Python-like semantics
// for truthiness, equality, printing and `tojson`. Trade-off: containers are shared_ptr-backed so
// copies are cheap and `namespace()` attribute assignment mutates in place, at the cost of aliasing
// (which Jinja templates cannot observe except through `.append`).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace mla::tokenizer::jinja {

class Value;
struct CallArgs;
class Interpreter;

using Array = std::vector<Value>;
// Insertion-ordered (Python dicts and JSON objects as parsed by json.loads keep order).
using Object = std::vector<std::pair<std::string, Value>>;
// A builtin function or bound method; macros are wrapped in one too.
using Callable = std::function<Result<Value>(Interpreter&, CallArgs&)>;

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kArray, kObject, kCallable };

  Value() = default;  // undefined
  static Value none() { Value v; v.kind_ = Kind::kNone; return v; }
  static Value boolean(bool b) { Value v; v.kind_ = Kind::kBool; v.b_ = b; return v; }
  static Value integer(int64_t i) { Value v; v.kind_ = Kind::kInt; v.i_ = i; return v; }
  static Value real(double f) { Value v; v.kind_ = Kind::kFloat; v.f_ = f; return v; }
  static Value string(std::string s) {
    Value v; v.kind_ = Kind::kString; v.s_ = std::make_shared<std::string>(std::move(s)); return v;
  }
  static Value array(Array a = {}) {
    Value v; v.kind_ = Kind::kArray; v.a_ = std::make_shared<Array>(std::move(a)); return v;
  }
  // `is_namespace`: attributes may be assigned with `{% set ns.x = ... %}`.
  static Value object(Object o = {}, bool is_namespace = false) {
    Value v; v.kind_ = Kind::kObject; v.o_ = std::make_shared<Object>(std::move(o));
    v.namespace_ = is_namespace; return v;
  }
  static Value callable(Callable c, std::string name) {
    Value v; v.kind_ = Kind::kCallable; v.c_ = std::make_shared<Callable>(std::move(c));
    v.s_ = std::make_shared<std::string>(std::move(name)); return v;
  }
  // Integers stay integers; floats stay floats (an integral float prints as "1.0", like Python).
  static Value from_json(const nlohmann::ordered_json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat; }
  bool is_array() const { return kind_ == Kind::kArray; }
  bool is_object() const { return kind_ == Kind::kObject; }
  bool is_namespace() const { return kind_ == Kind::kObject && namespace_; }
  bool is_callable() const { return kind_ == Kind::kCallable; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return i_; }
  double as_double() const { return kind_ == Kind::kInt ? double(i_) : f_; }
  const std::string& str() const { return *s_; }  // precondition: string or callable
  Array& arr() const { return *a_; }              // precondition: array
  Object& obj() const { return *o_; }             // precondition: object
  const Callable& fn() const { return *c_; }      // precondition: callable

  // Object lookup; nullptr when absent. Precondition: object.
  const Value* find(const std::string& key) const;
  void set(const std::string& key, Value v) const;  // precondition: object

  // Identity of the shared container (nullptr for scalars), for cycle checks.
  const void* identity() const {
    return kind_ == Kind::kArray ? static_cast<const void*>(a_.get())
                                 : kind_ == Kind::kObject ? static_cast<const void*>(o_.get()) : nullptr;
  }
  bool truthy() const;
  const char* type_name() const;
  // What `{{ v }}` prints: strings raw, None "None", bools "True"/"False", containers as Python repr.
  // Containers nested deeper than 64 print as "...".
  std::string to_output(int depth = 0) const;
  // Python repr (strings quoted), used inside container printing.
  std::string repr(int depth = 0) const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool b_ = false;
  bool namespace_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  std::shared_ptr<std::string> s_;
  std::shared_ptr<Array> a_;
  std::shared_ptr<Object> o_;
  std::shared_ptr<Callable> c_;
};

// Python `==` (1 == 1.0; containers compare element-wise; True == 1 as in Python).
bool values_equal(const Value& a, const Value& b, int depth = 0);

struct JsonFormat {
  int indent = -1;               // < 0: one line
  std::string item_separator;    // default ", " (one line) or "," (indented), as json.dumps
  std::string key_separator = ": ";
  bool custom_item_separator = false;
  bool sort_keys = false;
};
// json.dumps(v, ensure_ascii=False, ...) as transformers' `tojson` filter. Error on callables.
Result<std::string> to_json_string(const Value& v, const JsonFormat& format);

// Number of Unicode code points in valid UTF-8 (bytes that start no sequence are counted singly).
size_t utf8_length(const std::string& s);
// Byte offsets of each code point start, plus s.size() at the end.
std::vector<size_t> utf8_offsets(const std::string& s);

}  // namespace mla::tokenizer::jinja
