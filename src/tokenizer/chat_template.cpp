// Chat-template rendering through the Jinja-subset engine, plus tokenizer_config.json reading.
// Trade-off: templates are parsed on every call (cheap next to model work); callers that render
// often can keep a parsed jinja::Template themselves.
#include "tokenizer/chat_template.h"

#include <fstream>
#include <sstream>

#include "tokenizer/jinja.h"

namespace mla::tokenizer {

nlohmann::ordered_json chat_messages_to_json(const std::vector<ChatMessage>& messages) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const ChatMessage& m : messages) {
    nlohmann::ordered_json j;
    j["role"] = m.role;
    j["content"] = m.content ? nlohmann::ordered_json(*m.content) : nlohmann::ordered_json(nullptr);
    if (m.reasoning_content) j["reasoning_content"] = *m.reasoning_content;
    if (!m.tool_calls.is_null()) j["tool_calls"] = m.tool_calls;
    if (m.tool_call_id) j["tool_call_id"] = *m.tool_call_id;
    if (m.name) j["name"] = *m.name;
    out.push_back(std::move(j));
  }
  return out;
}

nlohmann::ordered_json build_chat_context(const nlohmann::ordered_json& messages, const RenderOptions& options) {
  nlohmann::ordered_json ctx = nlohmann::ordered_json::object();
  ctx["messages"] = messages;
  ctx["tools"] = options.tools;
  ctx["add_generation_prompt"] = options.add_generation_prompt;
  ctx["bos_token"] = options.bos_token;
  ctx["eos_token"] = options.eos_token;
  if (options.extra.is_object())
    for (auto it = options.extra.begin(); it != options.extra.end(); ++it) ctx[it.key()] = it.value();
  return ctx;
}

Result<std::string> render_chat_template(const std::string& template_text, const nlohmann::ordered_json& messages,
                                         const RenderOptions& options) {
  if (!messages.is_array()) return error("chat template: messages must be a JSON array");
  if (!options.tools.is_null() && !options.tools.is_array()) return error("chat template: tools must be an array or null");
  const jinja::Value ctx = jinja::Value::from_json(build_chat_context(messages, options));
  Result<std::string> r = jinja::render_string(template_text, ctx);
  if (!r) return r.status().with_context("chat template");
  return r;
}

namespace {

std::string token_string(const nlohmann::ordered_json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string()) return j["content"].get<std::string>();
  return "";
}

}  // namespace

Result<ChatTemplateConfig> load_chat_template_config(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return error("{}: cannot open", path);
  std::stringstream ss;
  ss << f.rdbuf();
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return error("{}: not a JSON object", path);
  ChatTemplateConfig cfg;
  cfg.bos_token = token_string(j.value("bos_token", nlohmann::ordered_json()));
  cfg.eos_token = token_string(j.value("eos_token", nlohmann::ordered_json()));
  const nlohmann::ordered_json tpl = j.value("chat_template", nlohmann::ordered_json());
  if (tpl.is_string()) {
    cfg.chat_template = tpl.get<std::string>();
  } else if (tpl.is_array()) {
    for (const auto& t : tpl)
      if (t.is_object() && t.value("name", "") == "default" && t.contains("template") && t["template"].is_string())
        cfg.chat_template = t["template"].get<std::string>();
    if (cfg.chat_template.empty()) return error("{}: chat_template list has no \"default\" entry", path);
  } else {
    return error("{}: no chat_template", path);
  }
  return cfg;
}

}  // namespace mla::tokenizer
