// Strict JSON parsing: a SAX handler builds the DOM itself so that duplicate keys are reported
// (nlohmann's DOM parser keeps the last one silently) and nesting depth is capped.
#include "io/json_strict.h"

#include <exception>
#include <new>
#include <string>
#include <vector>

namespace mla::io {

namespace {

std::string one_line(std::string s, size_t max_chars) {
  for (char& c : s) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  if (s.size() > max_chars) {
    s.resize(max_chars);
    s += "...";
  }
  return s;
}

// nlohmann's messages start with an id ("[json.exception.parse_error.101] ") that helps nobody
// reading a load error; the rest is kept on one line and cut to a readable length.
std::string clean_json_error(std::string msg) {
  if (const auto pos = msg.find("] "); msg.rfind("[json.exception", 0) == 0 && pos != std::string::npos) {
    msg.erase(0, pos + 2);
  }
  return one_line(printable(msg, 300), 303);
}

// SAX handler building a DOM while enforcing unique keys and a depth cap. Written instead of
// json::parse's parser_callback because that path rescans the parent object for discarded
// values after every nested object closes: quadratic, 450 s for a 100k-tensor header.
// Invariant: stack_ holds the open containers, each the most recently added child of the one
// below it, so the pointers stay valid until popped.
class StrictDomBuilder {
 public:
  using json = nlohmann::json;
  StrictDomBuilder(json& root, int max_depth) : root_(root), max_depth_(max_depth) {}

  bool null() { return add(json(nullptr)); }
  bool boolean(bool v) { return add(json(v)); }
  bool number_integer(json::number_integer_t v) { return add(json(v)); }
  bool number_unsigned(json::number_unsigned_t v) { return add(json(v)); }
  bool number_float(json::number_float_t v, const json::string_t& /*literal*/) { return add(json(v)); }
  bool string(json::string_t& v) { return add(json(std::move(v))); }
  bool binary(json::binary_t& v) { return add(json::binary(std::move(v))); }
  bool start_object(std::size_t /*elements*/) { return open(json::object()); }
  bool start_array(std::size_t /*elements*/) { return open(json::array()); }
  bool key(json::string_t& k) {
    const auto& obj = stack_.back()->get_ref<const json::object_t&>();
    if (obj.find(k) != obj.end()) {
      error_ = fmt::format("duplicate key '{}'", printable(k));
      return false;
    }
    key_ = std::move(k);
    return true;
  }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool parse_error(std::size_t /*position*/, const std::string& /*last_token*/, const json::exception& ex) {
    error_ = clean_json_error(ex.what());
    return false;
  }

  const std::string& error() const { return error_; }

 private:
  json* place(json&& v) {
    if (stack_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    json* top = stack_.back();
    if (top->is_array()) {
      top->push_back(std::move(v));
      return &top->back();
    }
    auto& obj = top->get_ref<json::object_t&>();
    return &obj.insert_or_assign(std::move(key_), std::move(v)).first->second;
  }
  bool add(json&& v) {
    place(std::move(v));
    return true;
  }
  bool open(json&& v) {
    if (int(stack_.size()) >= max_depth_) {
      error_ = fmt::format("JSON nested deeper than {} levels", max_depth_);
      return false;
    }
    stack_.push_back(place(std::move(v)));
    return true;
  }
  bool close() {
    stack_.pop_back();
    return true;
  }

  json& root_;
  int max_depth_;
  std::vector<json*> stack_;
  std::string key_;  // key of the next value added to the innermost object
  std::string error_;
};

}  // namespace

size_t utf8_valid_prefix(std::string_view text) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const unsigned c = p[i];
    if (c < 0x80) { ++i; continue; }
    size_t len;
    uint32_t cp;
    uint32_t min_cp;
    if ((c & 0xe0) == 0xc0) { len = 2; cp = c & 0x1f; min_cp = 0x80; }
    else if ((c & 0xf0) == 0xe0) { len = 3; cp = c & 0x0f; min_cp = 0x800; }
    else if ((c & 0xf8) == 0xf0) { len = 4; cp = c & 0x07; min_cp = 0x10000; }
    else return i;  // stray continuation byte or 0xf8..0xff
    if (n - i < len) return i;
    for (size_t k = 1; k < len; ++k) {
      const unsigned cc = p[i + k];
      if ((cc & 0xc0) != 0x80) return i;
      cp = (cp << 6) | (cc & 0x3f);
    }
    if (cp < min_cp || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return i;
    i += len;
  }
  return n;
}

std::string printable(std::string_view s, size_t max_chars) {
  std::string out;
  out.reserve(std::min(s.size(), max_chars) + 4);
  for (size_t i = 0; i < s.size(); ++i) {
    if (out.size() >= max_chars) {
      out += "...";
      break;
    }
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) out += fmt::format("\\x{:02x}", c);
    else out += char(c);
  }
  return out;
}

std::string_view json_type_phrase(const nlohmann::json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null: return "null";
    case nlohmann::json::value_t::object: return "an object";
    case nlohmann::json::value_t::array: return "an array";
    case nlohmann::json::value_t::string: return "a string";
    case nlohmann::json::value_t::boolean: return "a boolean";
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned: return "an integer";
    case nlohmann::json::value_t::number_float: return "a float";
    case nlohmann::json::value_t::binary: return "binary";
    case nlohmann::json::value_t::discarded: return "discarded";
  }
  return "unknown";
}

std::string json_brief(const nlohmann::json& j, size_t max_chars) {
  auto scalar = [](const nlohmann::json& v) {
    // Strings are dumped with invalid UTF-8 replaced so dump() cannot throw.
    return v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  };
  if (j.is_object()) return fmt::format("an object with {} keys", j.size());
  if (j.is_array()) {
    std::string s = "[";
    for (size_t i = 0; i < j.size(); ++i) {
      if (s.size() > max_chars) {
        s += "...";
        break;
      }
      if (i) s += ", ";
      const auto& e = j[i];
      s += e.is_structured() ? std::string(e.is_array() ? "[...]" : "{...}") : scalar(e);
    }
    s += "]";
    return one_line(printable(s, max_chars), max_chars + 3);
  }
  return one_line(printable(scalar(j), max_chars), max_chars + 3);
}

Result<nlohmann::json> parse_json_strict(std::string_view text, int max_depth) {
  using nlohmann::json;
  // nlohmann's lexer treats a NUL byte as end of input, so "{}\0garbage" would parse as "{}".
  // Valid JSON text never contains a raw NUL (strings must escape it), so reject it up front.
  if (const size_t nul = text.find('\0'); nul != std::string_view::npos) {
    return Status::error(fmt::format("NUL byte at offset {}", nul));
  }
  json root;
  StrictDomBuilder builder(root, max_depth);
  try {
    if (!json::sax_parse(text.begin(), text.end(), &builder, json::input_format_t::json, /*strict=*/true,
                         /*ignore_comments=*/false)) {
      return Status::error(builder.error().empty() ? std::string("invalid JSON") : builder.error());
    }
    return root;
  } catch (const std::bad_alloc&) {
    return Status::error("out of memory while parsing JSON");
  } catch (const std::exception& e) {
    return Status::error(clean_json_error(e.what()));
  }
}

}  // namespace mla::io
