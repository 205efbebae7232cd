// Chat-template layer: renders a conversation with a model's Jinja chat template (as transformers'
// apply_chat_template does) or with the built-in Kimi K3 XTML format (xtml_format.h). Messages are
// insertion-ordered JSON so that `tojson` prints keys in the order the client sent them.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace mla::tokenizer {

struct ChatMessage {
  std::string role;
  std::optional<std::string> content;            // nullopt: JSON null (assistant turns with tool calls)
  std::optional<std::string> reasoning_content;  // omitted when nullopt
  nlohmann::ordered_json tool_calls;             // OpenAI-shaped array; omitted when null
  std::optional<std::string> tool_call_id;
  std::optional<std::string> name;
};

nlohmann::ordered_json chat_messages_to_json(const std::vector<ChatMessage>& messages);

struct RenderOptions {
  bool add_generation_prompt = false;
  nlohmann::ordered_json tools;  // array of tool schemas, or null (passed to the template as none)
  std::string bos_token;
  std::string eos_token;
  nlohmann::ordered_json extra;  // object of extra template kwargs (e.g. enable_thinking), or null
};

// The variables a template sees: messages, tools, add_generation_prompt, bos_token, eos_token,
// then `extra`'s entries (which may override the others, like **template_kwargs).
nlohmann::ordered_json build_chat_context(const nlohmann::ordered_json& messages, const RenderOptions& options);

// Errors: template syntax errors or runtime errors with line/column, raise_exception messages,
// limits exceeded (16 MB output, bounded steps and depth).
Result<std::string> render_chat_template(const std::string& template_text, const nlohmann::ordered_json& messages,
                                         const RenderOptions& options);

// What a model directory's tokenizer_config.json says about chat formatting.
struct ChatTemplateConfig {
  std::string chat_template;  // the "default" one when the file lists several
  std::string bos_token;      // "" when absent or null
  std::string eos_token;
};
// Reads `path` (tokenizer_config.json). Error if it has no usable chat_template.
Result<ChatTemplateConfig> load_chat_template_config(const std::string& path);

}  // namespace mla::tokenizer
