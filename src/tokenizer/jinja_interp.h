// Interpreter of the Jinja subset (internal header shared with jinja_builtins.cpp). Scoping: one
// frame per for-loop body and macro call; `set` writes the innermost frame, as Jinja's scoping
// rules make loop-local assignments invisible after the loop (hence `namespace()`).
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "tokenizer/jinja.h"

namespace mla::tokenizer::jinja {

// Evaluated call arguments: positional then keyword.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  SourcePos pos;

  // Positional `index` or keyword `name`, else nullptr.
  const Value* get(size_t index, const char* name) const;
};

class Interpreter {
 public:
  Interpreter(const Value& context, const RenderLimits& limits);

  Status run(const Body& body, std::string& out);
  Status error_at(SourcePos p, const std::string& what) const;
  // Counts one evaluation step; errors once the budget is spent.
  Status step(SourcePos p);
  Status check_size(size_t bytes, SourcePos p) const;
  const RenderLimits& limits() const { return limits_; }

  Result<Value> eval(const Expr& e);
  // Calls a filter / test / attribute-method by name (jinja_builtins.cpp).
  Result<Value> apply_filter(const std::string& name, CallArgs& args);
  Result<bool> apply_test(const std::string& name, CallArgs& args);
  // Attribute access: dict keys, then methods of strings/dicts/lists bound to `self`.
  Result<Value> get_attr(const Value& self, const std::string& name, SourcePos p);

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  Status exec_body(const Body& body, std::string& out, Flow& flow);
  Status exec(const Stmt& s, std::string& out, Flow& flow);
  Status exec_for(const Stmt& s, std::string& out);
  Result<Value> eval_binary(const Expr& e);
  Result<Value> eval_call(const Expr& e);
  Result<Value> call_macro(const Stmt& macro, CallArgs& args);
  Status assign(const std::vector<std::string>& targets, const Value& v, SourcePos p);
  const Value* lookup(const std::string& name) const;

  std::vector<std::unordered_map<std::string, Value>> frames_;
  RenderLimits limits_;
  uint64_t steps_ = 0;
  int depth_ = 0;
};

// Python-style item access (negative indexes, code-point string indexing); undefined if absent.
Result<Value> get_item(Interpreter& in, const Value& v, const Value& key, SourcePos p);
// Methods of strings (`startswith`, `split`, ...), dicts (`items`, `get`, ...) and lists (`append`).
bool has_method(const Value& self, const std::string& name);
Result<Value> call_method(Interpreter& in, const Value& self, const std::string& name, CallArgs& args);
// Refuses to store `v` inside `container` when that would create a reference cycle or store a
// function (a cycle would leak and make printing recurse forever).
Status check_storable(const Value& v, const Value& container, SourcePos p, const Interpreter& in);
// Iteration as Jinja does it: lists, dict keys, string characters.
Result<Array> iterate(Interpreter& in, const Value& v, SourcePos p);

}  // namespace mla::tokenizer::jinja
