// Kimi K3 XTML renderer (see xtml_format.h for the layout and its unverified points).
#include "tokenizer/xtml_format.h"

namespace mla::tokenizer {
namespace {

std::string attr(const std::string& v) {
  std::string out;
  for (char c : v) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string message(const std::string& head, const std::string& body) {
  return "<|open|>message " + head + "<|sep|>" + body + "<|close|>message<|sep|><|end_of_msg|>";
}

std::string text_of(const nlohmann::ordered_json& j) {
  return j.is_string() ? j.get<std::string>() : std::string();
}

Result<std::string> tool_calls_block(const nlohmann::ordered_json& calls) {
  std::string out = "<|open|>tools<|sep|>";
  int index = 0;
  for (const auto& call : calls) {
    const nlohmann::ordered_json fn = call.is_object() ? call.value("function", call) : nlohmann::ordered_json();
    if (!fn.is_object() || !fn.contains("name") || !fn["name"].is_string())
      return error("xtml: tool call without function.name");
    nlohmann::ordered_json args = fn.value("arguments", nlohmann::ordered_json::object());
    if (args.is_string()) {
      args = nlohmann::ordered_json::parse(args.get<std::string>(), nullptr, false);
      if (args.is_discarded()) return error("xtml: tool call arguments are not valid JSON");
    }
    if (!args.is_object()) return error("xtml: tool call arguments must be a JSON object");
    out += "<|open|>call tool=\"" + attr(fn["name"].get<std::string>()) + "\" index=\"" + std::to_string(++index) +
           "\"<|sep|>";
    for (auto it = args.begin(); it != args.end(); ++it) {
      const bool is_str = it.value().is_string();
      out += "<|open|>argument key=\"" + attr(it.key()) + "\" type=\"" + (is_str ? "string" : "json") + "\"<|sep|>";
      out += is_str ? it.value().get<std::string>() : it.value().dump();
      out += "<|close|>argument<|sep|>";
    }
    out += "<|close|>call<|sep|>";
  }
  return out + "<|close|>tools<|sep|>";
}

}  // namespace

Result<std::string> render_xtml(const nlohmann::ordered_json& messages, const XtmlOptions& options) {
  if (!messages.is_array()) return error("xtml: messages must be a JSON array");
  std::string out;
  if (options.tools.is_array() && !options.tools.empty())
    out += message("role=\"system\" type=\"tool-declare\"", options.tools.dump());
  if (!options.thinking_effort.empty()) {
    const std::string& e = options.thinking_effort;
    if (e != "low" && e != "high" && e != "max") return error("xtml: thinking effort must be low, high or max, not '{}'", e);
    out += message("role=\"system\" type=\"thinking-effort\"", e);
  }
  for (const auto& m : messages) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) return error("xtml: message without a role");
    const std::string role = m["role"].get<std::string>();
    const std::string content = text_of(m.value("content", nlohmann::ordered_json()));
    if (role != "assistant") {
      if (role != "system" && role != "user" && role != "tool") return error("xtml: unknown role '{}'", role);
      out += message("role=\"" + role + "\"", content);
      continue;
    }
    std::string body = "<|open|>think<|sep|>" + text_of(m.value("reasoning_content", nlohmann::ordered_json())) +
                       "<|close|>think<|sep|><|open|>response<|sep|>" + content + "<|close|>response<|sep|>";
    const nlohmann::ordered_json calls = m.value("tool_calls", nlohmann::ordered_json());
    if (calls.is_array() && !calls.empty()) {
      MLA_ASSIGN_OR_RETURN(std::string block, tool_calls_block(calls));
      body += block;
    }
    out += message("role=\"assistant\"", body);
  }
  if (options.add_generation_prompt)
    out += std::string("<|open|>message role=\"assistant\"<|sep|>") + (options.thinking ? "<|open|>think<|sep|>" : "<|open|>response<|sep|>");
  return out;
}

}  // namespace mla::tokenizer
