// The three tool-call formats share one section/call state machine (SectionToolCallParser); each
// format only supplies its four markers and a parser for one complete call body. Parsing a body
// only once it is complete keeps the per-format code simple and chunking-independent.
#include "tokenizer/tool_call_parser.h"

#include <optional>
#include <utility>

#include "tokenizer/marker_scan.h"

namespace mla::tokenizer {
namespace {

using nlohmann::json;

struct SectionMarkers {
  std::string_view section_begin;
  std::string_view section_end;
  std::string_view call_begin;
  std::string_view call_end;
};

// Returns nullopt when the id or name is not valid UTF-8 (it could not be serialized as JSON).
std::optional<json> make_call(std::string id, std::string name, std::string arguments) {
  if (!is_valid_utf8(id) || !is_valid_utf8(name)) return std::nullopt;
  return json{{"id", std::move(id)},
              {"type", "function"},
              {"function", {{"name", std::move(name)}, {"arguments", std::move(arguments)}}}};
}

// Arguments text kept as written when it is valid JSON; empty means "no arguments".
std::optional<std::string> checked_arguments(std::string_view text) {
  std::string_view args = trim_ascii(text);
  if (args.empty()) return std::string("{}");
  // nlohmann's lexer stops at a NUL byte as if the input ended, so "1\0junk" would pass; JSON
  // text never contains a raw NUL, and the kept text must be valid UTF-8 to be serialized.
  if (args.find('\0') != std::string_view::npos || !is_valid_utf8(args)) return std::nullopt;
  if (json::parse(args, nullptr, /*allow_exceptions=*/false).is_discarded()) return std::nullopt;
  return std::string(args);
}

// States: kContent (outside a section), kGap (inside a section, between calls), kCall (inside a
// call body). Invariant between calls: buf_ holds only a possible marker prefix or an incomplete
// UTF-8 tail; gap_ and body_ hold text that is not yet decided.
class SectionToolCallParser : public ToolCallParser {
 public:
  explicit SectionToolCallParser(SectionMarkers markers) : m_(markers) {}

  ToolCallDelta push(std::string_view chunk) override {
    buf_.append(chunk);
    ToolCallDelta out;
    drain(out, /*final=*/false);
    return out;
  }

  ToolCallDelta finish() override {
    ToolCallDelta out;
    drain(out, /*final=*/true);
    // Whatever is still undecided is returned as content, in the order it was written.
    if (state_ != State::kContent) {
      if (calls_in_section_ == 0) out.content_text.append(m_.section_begin);
      out.content_text.append(gap_);
      if (state_ == State::kCall) {
        out.content_text.append(m_.call_begin);
        out.content_text.append(body_);
      }
    }
    out.content_text.append(buf_);
    buf_.clear();
    gap_.clear();
    body_.clear();
    state_ = State::kContent;
    return out;
  }

  size_t tool_call_count() const override { return count_; }

 protected:
  // Parses one complete call body (the text between call_begin and call_end) into an OpenAI
  // tool call, or nullopt if it is malformed. `ordinal` is the number of calls reported before.
  virtual std::optional<json> parse_body(std::string_view body, size_t ordinal) const = 0;

 private:
  enum class State { kContent, kGap, kCall };

  void flush_gap(ToolCallDelta& out) {
    if (!is_blank(gap_)) out.content_text.append(gap_);
    gap_.clear();
  }

  void drain(ToolCallDelta& out, bool final) {
    for (;;) {
      std::string_view buf = buf_;
      if (state_ == State::kContent) {
        MarkerHit hit = find_first_marker(buf, {m_.section_begin});
        if (hit.found()) {
          out.content_text.append(buf.substr(0, hit.pos));
          buf_.erase(0, hit.pos + m_.section_begin.size());
          state_ = State::kGap;
          calls_in_section_ = 0;
          continue;
        }
        size_t keep = 0;
        if (!final) {
          keep = partial_marker_suffix(buf, {m_.section_begin});
          keep += incomplete_utf8_suffix(buf.substr(0, buf.size() - keep));
        }
        out.content_text.append(buf.substr(0, buf.size() - keep));
        buf_.erase(0, buf.size() - keep);
        return;
      }
      if (state_ == State::kGap) {
        MarkerHit hit = find_first_marker(buf, {m_.call_begin, m_.section_end});
        if (hit.found()) {
          gap_.append(buf.substr(0, hit.pos));
          if (hit.which == 0) {
            buf_.erase(0, hit.pos + m_.call_begin.size());
            body_.clear();
            state_ = State::kCall;
          } else {
            buf_.erase(0, hit.pos + m_.section_end.size());
            flush_gap(out);
            state_ = State::kContent;
          }
          continue;
        }
        size_t keep = final ? 0 : partial_marker_suffix(buf, {m_.call_begin, m_.section_end});
        gap_.append(buf.substr(0, buf.size() - keep));
        buf_.erase(0, buf.size() - keep);
        return;
      }
      // kCall
      MarkerHit hit = find_first_marker(buf, {m_.call_end});
      if (hit.found()) {
        body_.append(buf.substr(0, hit.pos));
        buf_.erase(0, hit.pos + m_.call_end.size());
        std::optional<json> call = parse_body(body_, count_);
        flush_gap(out);
        if (call) {
          out.tool_calls.push_back(std::move(*call));
          ++count_;
        } else {
          out.content_text.append(m_.call_begin);
          out.content_text.append(body_);
          out.content_text.append(m_.call_end);
        }
        ++calls_in_section_;
        body_.clear();
        state_ = State::kGap;
        continue;
      }
      size_t keep = final ? 0 : partial_marker_suffix(buf, {m_.call_end});
      body_.append(buf.substr(0, buf.size() - keep));
      buf_.erase(0, buf.size() - keep);
      return;
    }
  }

  SectionMarkers m_;
  State state_ = State::kContent;
  std::string buf_;   // received, not yet scanned past
  std::string gap_;   // section text since the section start or the last call
  std::string body_;  // the open call's body
  size_t count_ = 0;  // calls reported
  size_t calls_in_section_ = 0;  // calls completed (valid or not) in the open section
};

// ---- Kimi K2 ---------------------------------------------------------------------------------

class KimiK2Parser final : public SectionToolCallParser {
 public:
  KimiK2Parser()
      : SectionToolCallParser({"<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
                               "<|tool_call_begin|>", "<|tool_call_end|>"}) {}

 protected:
  std::optional<json> parse_body(std::string_view body, size_t /*ordinal*/) const override {
    constexpr std::string_view kArgBegin = "<|tool_call_argument_begin|>";
    size_t sep = body.find(kArgBegin);
    if (sep == std::string_view::npos) return std::nullopt;
    std::string_view id = trim_ascii(body.substr(0, sep));
    std::string_view name = id;
    if (name.starts_with("functions.")) name.remove_prefix(std::string_view("functions.").size());
    size_t colon = name.rfind(':');
    if (colon != std::string_view::npos && colon + 1 < name.size() &&
        name.find_first_not_of("0123456789", colon + 1) == std::string_view::npos) {
      name = name.substr(0, colon);
    }
    if (name.empty()) return std::nullopt;
    std::optional<std::string> args = checked_arguments(body.substr(sep + kArgBegin.size()));
    if (!args) return std::nullopt;
    return make_call(std::string(id), std::string(name), std::move(*args));
  }
};

// ---- DeepSeek-V3 -----------------------------------------------------------------------------

class DeepSeekV3Parser final : public SectionToolCallParser {
 public:
  DeepSeekV3Parser()
      : SectionToolCallParser({"<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
                               "<｜tool▁call▁end｜>"}) {}

 protected:
  std::optional<json> parse_body(std::string_view body, size_t ordinal) const override {
    constexpr std::string_view kSep = "<｜tool▁sep｜>";
    size_t sep = body.find(kSep);
    if (sep == std::string_view::npos) return std::nullopt;
    std::string_view left = trim_ascii(body.substr(0, sep));
    std::string_view right = body.substr(sep + kSep.size());
    std::string_view name;
    std::string_view rest;
    if (left == "function") {  // V3: type, sep, name on its own line, fenced arguments
      size_t nl = right.find('\n');
      name = trim_ascii(right.substr(0, nl));
      rest = nl == std::string_view::npos ? std::string_view() : right.substr(nl + 1);
    } else {  // V3.1: name, sep, bare arguments
      name = left;
      rest = right;
    }
    if (name.empty()) return std::nullopt;
    rest = trim_ascii(rest);
    if (rest.starts_with("```")) {
      size_t nl = rest.find('\n');  // drops the info string ("json")
      if (nl == std::string_view::npos) return std::nullopt;
      rest = trim_ascii(rest.substr(nl + 1));
      if (rest.ends_with("```")) rest.remove_suffix(3);
    }
    std::optional<std::string> args = checked_arguments(rest);
    if (!args) return std::nullopt;
    return make_call("call_" + std::to_string(ordinal), std::string(name), std::move(*args));
  }
};

// ---- Kimi K3 XTML ----------------------------------------------------------------------------

std::string unescape_attribute(std::string_view v) {
  static constexpr std::pair<std::string_view, char> kEntities[] = {
      {"&quot;", '"'}, {"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'}, {"&apos;", '\''}};
  std::string out;
  out.reserve(v.size());
  size_t i = 0;
  while (i < v.size()) {
    bool replaced = false;
    if (v[i] == '&') {
      for (const auto& [entity, ch] : kEntities) {
        if (v.substr(i).starts_with(entity)) {
          out.push_back(ch);
          i += entity.size();
          replaced = true;
          break;
        }
      }
    }
    if (!replaced) out.push_back(v[i++]);  // an unknown entity stays verbatim
  }
  return out;
}

// Parses `name="value" name2="value2"` (any ASCII whitespace between); nullopt on bad syntax.
std::optional<std::vector<std::pair<std::string, std::string>>> parse_attributes(std::string_view s) {
  std::vector<std::pair<std::string, std::string>> attrs;
  size_t i = 0;
  auto skip_space = [&] {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) ++i;
  };
  for (;;) {
    skip_space();
    if (i == s.size()) return attrs;
    size_t name_begin = i;
    while (i < s.size() && s[i] != '=' && s[i] != ' ' && s[i] != '"') ++i;
    std::string_view name = s.substr(name_begin, i - name_begin);
    if (name.empty() || i + 1 >= s.size() || s[i] != '=' || s[i + 1] != '"') return std::nullopt;
    i += 2;
    size_t close = s.find('"', i);
    if (close == std::string_view::npos) return std::nullopt;
    attrs.emplace_back(std::string(name), unescape_attribute(s.substr(i, close - i)));
    i = close + 1;
  }
}

const std::string* find_attribute(const std::vector<std::pair<std::string, std::string>>& attrs,
                                  std::string_view name) {
  for (const auto& [k, v] : attrs) {
    if (k == name) return &v;
  }
  return nullptr;
}

class KimiK3XtmlParser final : public SectionToolCallParser {
 public:
  KimiK3XtmlParser()
      : SectionToolCallParser({"<|open|>tools<|sep|>", "<|close|>tools<|sep|>", "<|open|>call",
                               "<|close|>call<|sep|>"}) {}

 protected:
  std::optional<json> parse_body(std::string_view body, size_t ordinal) const override {
    constexpr std::string_view kSep = "<|sep|>";
    constexpr std::string_view kArgOpen = "<|open|>argument";
    constexpr std::string_view kArgClose = "<|close|>argument<|sep|>";
    size_t sep = body.find(kSep);
    if (sep == std::string_view::npos) return std::nullopt;
    auto call_attrs = parse_attributes(body.substr(0, sep));
    if (!call_attrs) return std::nullopt;
    const std::string* tool = find_attribute(*call_attrs, "tool");
    if (tool == nullptr || tool->empty()) return std::nullopt;

    json args = json::object();
    std::string_view rest = body.substr(sep + kSep.size());
    for (;;) {
      rest = rest.substr(std::min(rest.size(), rest.find_first_not_of(" \t\r\n")));
      if (rest.empty()) break;
      if (!rest.starts_with(kArgOpen)) return std::nullopt;
      rest.remove_prefix(kArgOpen.size());
      size_t head_end = rest.find(kSep);
      if (head_end == std::string_view::npos) return std::nullopt;
      auto arg_attrs = parse_attributes(rest.substr(0, head_end));
      if (!arg_attrs) return std::nullopt;
      const std::string* key = find_attribute(*arg_attrs, "key");
      if (key == nullptr) return std::nullopt;
      const std::string* type = find_attribute(*arg_attrs, "type");
      rest.remove_prefix(head_end + kSep.size());
      size_t raw_end = rest.find(kArgClose);
      if (raw_end == std::string_view::npos) return std::nullopt;
      std::string_view raw = rest.substr(0, raw_end);
      rest.remove_prefix(raw_end + kArgClose.size());
      json value;
      // (A raw NUL would end nlohmann's parse early: such text stays a string.)
      if (type != nullptr && *type != "string" && raw.find('\0') == std::string_view::npos) value = json::parse(raw, nullptr, /*allow_exceptions=*/false);
      if (type == nullptr || *type == "string" || value.is_discarded()) value = std::string(raw);
      args[*key] = std::move(value);
    }
    // Invalid UTF-8 in a raw string argument becomes U+FFFD rather than failing the call.
    std::string arguments = args.dump(-1, ' ', false, json::error_handler_t::replace);
    return make_call("call_" + std::to_string(ordinal), *tool, std::move(arguments));
  }
};

}  // namespace

std::unique_ptr<ToolCallParser> make_tool_call_parser(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::KimiK2:
      return std::make_unique<KimiK2Parser>();
    case ToolCallFormat::KimiK3Xtml:
      return std::make_unique<KimiK3XtmlParser>();
    case ToolCallFormat::DeepSeekV3:
      return std::make_unique<DeepSeekV3Parser>();
  }
  return nullptr;
}

bool parse_tool_call_format(std::string_view name, ToolCallFormat* out) {
  if (name == "kimi_k2") {
    *out = ToolCallFormat::KimiK2;
  } else if (name == "kimi_k3_xtml") {
    *out = ToolCallFormat::KimiK3Xtml;
  } else if (name == "deepseek_v3") {
    *out = ToolCallFormat::DeepSeekV3;
  } else {
    return false;
  }
  return true;
}

}  // namespace mla::tokenizer
