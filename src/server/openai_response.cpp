// Response assembly for the OpenAI routes (see openai_response.h). Shapes follow OpenAI's API and
// vLLM's extensions (stop_reason, reasoning_content, prompt_tokens_details.cached_tokens).
#include "server/openai_response.h"

#include <algorithm>

namespace mla::server {

namespace {
using Json = nlohmann::json;
// OpenAI cannot carry -inf; vLLM clamps to this.
float clamp_lp(float lp) { return std::max(lp, -9999.0f); }
}  // namespace

ResponseAssembler::ResponseAssembler(const ParsedRequest& req, const ModelContext& ctx, std::string id, int64_t created)
    : req_(req), ctx_(ctx), id_(std::move(id)), created_(created) {
  if (req.chat && ctx.reasoning) {
    tokenizer::ReasoningOptions o;
    o.starts_in_reasoning = req.starts_in_reasoning;
    reasoning_ = std::make_unique<tokenizer::ReasoningParser>(o);
  }
  if (req.chat && req.parse_tools && ctx.tool_call_format) tools_ = tokenizer::make_tool_call_parser(*ctx.tool_call_format);
  if (req.chat) logprobs_ = Json::array();
  else logprobs_ = Json{{"tokens", Json::array()}, {"token_logprobs", Json::array()}, {"top_logprobs", Json::array()},
                        {"text_offset", Json::array()}};
}

ResponseAssembler::Pieces ResponseAssembler::split(const runtime::RequestOutput& d) {
  Pieces p;
  if (!req_.chat) {
    p.text = d.text;
    return p;
  }
  std::string content;
  auto feed_content = [&](const std::string& c, bool last) {
    if (!tools_) {
      p.text += c;
      return;
    }
    tokenizer::ToolCallDelta td = tools_->push(c);
    if (last) {
      tokenizer::ToolCallDelta tf = tools_->finish();
      td.content_text += tf.content_text;
      for (auto& t : tf.tool_calls) td.tool_calls.push_back(std::move(t));
    }
    p.text += td.content_text;
    for (auto& t : td.tool_calls) p.tool_calls.push_back(std::move(t));
  };
  if (reasoning_) {
    tokenizer::ReasoningDelta rd = reasoning_->push(d.text);
    if (d.finished) {
      tokenizer::ReasoningDelta rf = reasoning_->finish();
      rd.reasoning_text += rf.reasoning_text;
      rd.content_text += rf.content_text;
    }
    p.reasoning = std::move(rd.reasoning_text);
    feed_content(rd.content_text, d.finished);
  } else {
    feed_content(d.text, d.finished);
  }
  return p;
}

void ResponseAssembler::note_finish(const runtime::RequestOutput& d) {
  prompt_tokens_ = d.prompt_tokens;
  completion_tokens_ = d.completion_tokens;
  cached_tokens_ = d.cached_tokens;
  if (!d.finished) return;
  finished_ = true;
  finish_ = d.finish_reason;
  if (d.stop_string) stop_reason_ = *d.stop_string;
  else if (d.stop_token) stop_reason_ = *d.stop_token;
  error_ = d.error;
}

std::string ResponseAssembler::finish_reason_text() const {
  if (finish_ == runtime::FinishReason::Stop && (tool_calls_sent_ > 0 || !tool_calls_.empty())) return "tool_calls";
  return std::string(runtime::finish_reason_name(finish_));
}

Json ResponseAssembler::logprobs_json(const std::vector<runtime::TokenLogprob>& lps, size_t text_offset) const {
  auto piece = [&](int32_t id) { return ctx_.tok ? std::string(ctx_.tok->token_bytes(id)) : std::to_string(id); };
  if (req_.chat) {
    Json content = Json::array();
    for (const runtime::TokenLogprob& lp : lps) {
      auto entry = [&](int32_t id, float v) {
        const std::string s = piece(id);
        return Json{{"token", s}, {"logprob", clamp_lp(v)}, {"bytes", std::vector<int>(s.begin(), s.end())}};
      };
      Json e = entry(lp.token, lp.logprob);
      e["top_logprobs"] = Json::array();
      for (const auto& [id, v] : lp.top) e["top_logprobs"].push_back(entry(id, v));
      content.push_back(std::move(e));
    }
    return content;
  }
  Json j{{"tokens", Json::array()}, {"token_logprobs", Json::array()}, {"top_logprobs", Json::array()},
         {"text_offset", Json::array()}};
  size_t off = text_offset;
  for (const runtime::TokenLogprob& lp : lps) {
    const std::string s = piece(lp.token);
    j["tokens"].push_back(s);
    j["token_logprobs"].push_back(clamp_lp(lp.logprob));
    Json top = Json::object();
    for (const auto& [id, v] : lp.top) top[piece(id)] = clamp_lp(v);
    top[s] = clamp_lp(lp.logprob);
    j["top_logprobs"].push_back(std::move(top));
    j["text_offset"].push_back(off);
    off += s.size();
  }
  return j;
}

Json ResponseAssembler::usage_json() const {
  return Json{{"prompt_tokens", prompt_tokens_},
              {"completion_tokens", completion_tokens_},
              {"total_tokens", prompt_tokens_ + completion_tokens_},
              {"prompt_tokens_details", {{"cached_tokens", cached_tokens_}}}};
}

Json ResponseAssembler::chunk(Json choice) const {
  Json c{{"id", id_}, {"object", req_.chat ? "chat.completion.chunk" : "text_completion"}, {"created", created_},
         {"model", ctx_.served_model_name}, {"choices", Json::array({std::move(choice)})}};
  if (req_.include_usage) c["usage"] = req_.continuous_usage ? usage_json() : Json();
  return c;
}

std::string ResponseAssembler::stream(const runtime::RequestOutput& d) {
  note_finish(d);
  std::string out;
  auto event = [&](const Json& j) { out += "data: " + dump_json(j) + "\n\n"; };
  if (finish_ == runtime::FinishReason::Error) {
    ApiError e{500, "generation failed: " + error_, "internal_error", "", "engine_error"};
    event(e.to_json());
    out += "data: [DONE]\n\n";
    return out;
  }
  Pieces p = split(d);
  const bool want_lp = req_.params.logprobs.has_value() && !d.logprobs.empty();
  if (req_.chat) {
    if (!sent_role_) {
      sent_role_ = true;
      event(chunk(Json{{"index", 0}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr},
                       {"finish_reason", nullptr}}));
    }
    Json delta = Json::object();
    if (!p.reasoning.empty()) delta["reasoning_content"] = p.reasoning;
    if (!p.text.empty()) delta["content"] = p.text;
    if (!p.tool_calls.empty()) {
      Json calls = Json::array();
      for (Json& t : p.tool_calls) {
        t["index"] = tool_calls_sent_++;
        calls.push_back(std::move(t));
      }
      delta["tool_calls"] = std::move(calls);
    }
    if (!delta.empty() || want_lp || finished_) {
      Json choice{{"index", 0}, {"delta", delta}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
      if (want_lp) choice["logprobs"] = Json{{"content", logprobs_json(d.logprobs, 0)}};
      if (finished_) {
        choice["finish_reason"] = finish_reason_text();
        choice["stop_reason"] = stop_reason_;
      }
      event(chunk(std::move(choice)));
    }
  } else if (!p.text.empty() || want_lp || finished_) {
    Json choice{{"index", 0}, {"text", p.text}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
    if (want_lp) choice["logprobs"] = logprobs_json(d.logprobs, text_offset_);
    text_offset_ += p.text.size();
    if (finished_) {
      choice["finish_reason"] = finish_reason_text();
      choice["stop_reason"] = stop_reason_;
    }
    event(chunk(std::move(choice)));
  }
  if (finished_) {
    if (req_.include_usage) {
      Json u{{"id", id_}, {"object", req_.chat ? "chat.completion.chunk" : "text_completion"}, {"created", created_},
             {"model", ctx_.served_model_name}, {"choices", Json::array()}, {"usage", usage_json()}};
      event(u);
    }
    out += "data: [DONE]\n\n";
  }
  return out;
}

void ResponseAssembler::add(const runtime::RequestOutput& d) {
  note_finish(d);
  if (finish_ == runtime::FinishReason::Error) return;
  Pieces p = split(d);
  text_ += p.text;
  reasoning_text_ += p.reasoning;
  for (Json& t : p.tool_calls) tool_calls_.push_back(std::move(t));
  if (req_.params.logprobs && !d.logprobs.empty()) {
    Json lj = logprobs_json(d.logprobs, text_offset_);
    if (req_.chat) {
      for (Json& e : lj) logprobs_.push_back(std::move(e));
    } else {
      for (const char* k : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
        for (Json& e : lj[k]) logprobs_[k].push_back(std::move(e));
    }
  }
  text_offset_ += p.text.size();
}

Json ResponseAssembler::final_body() const {
  Json choice{{"index", 0}, {"logprobs", nullptr}, {"finish_reason", finish_reason_text()}, {"stop_reason", stop_reason_}};
  if (req_.chat) {
    Json msg{{"role", "assistant"}, {"content", text_}};
    if (reasoning_) msg["reasoning_content"] = reasoning_text_.empty() ? Json() : Json(reasoning_text_);
    if (!tool_calls_.empty()) {
      msg["tool_calls"] = tool_calls_;
      if (text_.empty()) msg["content"] = nullptr;
    }
    choice["message"] = std::move(msg);
    if (req_.params.logprobs) choice["logprobs"] = Json{{"content", logprobs_}};
  } else {
    choice["text"] = text_;
    if (req_.params.logprobs) choice["logprobs"] = logprobs_;
  }
  return Json{{"id", id_}, {"object", req_.chat ? "chat.completion" : "text_completion"}, {"created", created_},
              {"model", ctx_.served_model_name}, {"choices", Json::array({std::move(choice)})}, {"usage", usage_json()}};
}

}  // namespace mla::server
