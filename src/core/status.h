// Two-tier errors (ARCHITECTURE rule 9): Status/Result cross every boundary where input is
// untrusted (files, HTTP, templates); CHECK guards broken invariants and fires in release builds.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <variant>

#include <fmt/format.h>

namespace mla {

// A success or a one-line, human-readable error message. Cheap to return by value.
class [[nodiscard]] Status {
 public:
  Status() = default;
  static Status ok() { return Status(); }
  static Status error(std::string message) { return Status(std::move(message), true); }

  bool is_ok() const { return !failed_; }
  explicit operator bool() const { return !failed_; }
  const std::string& message() const { return message_; }

  // Prefixes context ("file.safetensors: ") to an error; no-op on success.
  Status with_context(const std::string& context) const {
    return failed_ ? Status(context + ": " + message_, true) : *this;
  }

 private:
  Status(std::string message, bool failed) : message_(std::move(message)), failed_(failed) {}
  std::string message_;
  bool failed_ = false;
};

template <typename... Args>
Status error(fmt::format_string<Args...> f, Args&&... args) {
  return Status::error(fmt::format(f, std::forward<Args>(args)...));
}

// A value or an error. `value()` on an error is an invariant violation (aborts).
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}          // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {    // NOLINT: implicit by design
    if (std::get<Status>(v_).is_ok()) {
      std::fprintf(stderr, "Result constructed from an OK status\n");
      std::abort();
    }
  }
  bool is_ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return is_ok(); }
  Status status() const { return is_ok() ? Status::ok() : std::get<Status>(v_); }
  T& value() & { check(); return std::get<T>(v_); }
  const T& value() const& { check(); return std::get<T>(v_); }
  T&& value() && { check(); return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }

 private:
  void check() const {
    if (!is_ok()) {
      std::fprintf(stderr, "Result::value() on error: %s\n", std::get<Status>(v_).message().c_str());
      std::abort();
    }
  }
  std::variant<T, Status> v_;
};

[[noreturn]] void check_failed(const char* file, int line, const char* cond, const std::string& msg);

}  // namespace mla

// Invariant check, active in every build type. Message arguments use fmt syntax.
#define MLA_CHECK(cond, ...)                                                         \
  do {                                                                               \
    if (!(cond)) [[unlikely]]                                                        \
      ::mla::check_failed(__FILE__, __LINE__, #cond, ::fmt::format("" __VA_ARGS__)); \
  } while (0)

// Propagates an error Status from an expression returning Status.
#define MLA_RETURN_IF_ERROR(expr)           \
  do {                                      \
    ::mla::Status _st = (expr);             \
    if (!_st.is_ok()) [[unlikely]] return _st; \
  } while (0)

#define MLA_CONCAT_INNER(a, b) a##b
#define MLA_CONCAT(a, b) MLA_CONCAT_INNER(a, b)
// `MLA_ASSIGN_OR_RETURN(auto x, f());` unwraps a Result or returns its error.
#define MLA_ASSIGN_OR_RETURN(lhs, expr) MLA_ASSIGN_OR_RETURN_IMPL(MLA_CONCAT(_res_, __LINE__), lhs, expr)
#define MLA_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.is_ok()) [[unlikely]] return tmp.status(); \
  lhs = std::move(tmp).value()
