// Engine output deltas -> OpenAI response JSON: one final body (non-streaming) or SSE chunks
// (streaming), for completions and chat (reasoning_content and tool_calls through the tokenizer's
// streaming parsers). Trade-off: tool calls stream whole when their end marker arrives (the parser
// validates the arguments as JSON), not as per-token argument fragments.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/request.h"
#include "server/openai_request.h"

namespace mla::server {

class ResponseAssembler {
 public:
  ResponseAssembler(const ParsedRequest& req, const ModelContext& ctx, std::string id, int64_t created);

  // Streaming: the SSE events ("data: {...}\n\n", several or none) for one delta. After the final
  // delta it also emits the usage chunk (when asked) and "data: [DONE]". An engine error after the
  // stream began becomes an error event, then [DONE].
  std::string stream(const runtime::RequestOutput& delta);
  // Non-streaming: folds one delta in.
  void add(const runtime::RequestOutput& delta);
  // Non-streaming: the response body once the final delta was added.
  nlohmann::json final_body() const;

  bool finished() const { return finished_; }
  bool failed() const { return finish_ == runtime::FinishReason::Error; }
  const std::string& error_message() const { return error_; }

 private:
  struct Pieces {  // one delta after the chat parsers
    std::string text;       // completions text / chat content
    std::string reasoning;  // chat reasoning_content
    std::vector<nlohmann::json> tool_calls;
  };
  Pieces split(const runtime::RequestOutput& d);
  nlohmann::json logprobs_json(const std::vector<runtime::TokenLogprob>& lps, size_t text_offset) const;
  nlohmann::json usage_json() const;
  nlohmann::json chunk(nlohmann::json choice) const;
  std::string finish_reason_text() const;
  void note_finish(const runtime::RequestOutput& d);

  const ParsedRequest& req_;
  const ModelContext& ctx_;
  const std::string id_;
  const int64_t created_;
  std::unique_ptr<tokenizer::ReasoningParser> reasoning_;
  std::unique_ptr<tokenizer::ToolCallParser> tools_;
  bool sent_role_ = false;
  bool finished_ = false;
  runtime::FinishReason finish_ = runtime::FinishReason::None;
  nlohmann::json stop_reason_;  // the matched stop string / token id, or null
  std::string error_;
  int prompt_tokens_ = 0, completion_tokens_ = 0, cached_tokens_ = 0;
  size_t tool_calls_sent_ = 0;
  size_t text_offset_ = 0;  // completions logprobs text_offset
  // Non-streaming accumulation.
  std::string text_, reasoning_text_;
  std::vector<nlohmann::json> tool_calls_;
  nlohmann::json logprobs_;  // chat: array of content entries; completions: {tokens,...}
};

}  // namespace mla::server
