// OpenAI request bodies -> engine requests: strict type and range checks that name the field at
// fault (400), prompt tokenization, chat-template rendering. Pure functions of the body and the
// model's context, so every bad-input case is unit-testable without HTTP or a model. Trade-off:
// fields mlaserve cannot honour (n > 1, logit_bias, penalties, echo, suffix, tool_choice "required")
// are rejected by name instead of silently ignored.
#pragma once

#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/request.h"
#include "server/api_error.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/reasoning_parser.h"
#include "tokenizer/tool_call_parser.h"
#include "tokenizer/tokenizer.h"

namespace mla::server {

// What the parser needs to know about the served model.
struct ModelContext {
  std::string served_model_name;
  const tokenizer::Tokenizer* tok = nullptr;                  // null: token-id prompts only, no chat
  const tokenizer::ChatTemplateConfig* chat_template = nullptr;  // null: /v1/chat/completions answers 400
  int max_model_len = 0;
  int vocab_size = 0;
  std::optional<tokenizer::ToolCallFormat> tool_call_format;  // nullopt: tool calls are left as text
  bool reasoning = false;                                     // split <think>...</think> into reasoning_content
};

struct ParsedRequest {
  bool chat = false;
  runtime::RequestParams params;
  bool stream = false;
  bool include_usage = false;       // stream_options.include_usage
  bool continuous_usage = false;    // stream_options.continuous_usage_stats (vLLM): usage in every chunk
  bool chat_logprobs = false;       // chat: logprobs=true (top_logprobs in params.logprobs)
  bool parse_tools = false;         // chat with tools and tool_choice != "none"
  bool starts_in_reasoning = false; // the rendered prompt ends inside a <think> block
  std::string prompt_text;          // completions: the text prompt ("" for token ids)
};

// Parses a /v1/completions (chat = false) or /v1/chat/completions body. Errors carry the status:
// 400 (naming the param, or code context_length_exceeded), 404 model_not_found.
std::variant<ParsedRequest, ApiError> parse_request(const std::string& body, bool chat, const ModelContext& ctx);

}  // namespace mla::server
