// Request-body parsing for the OpenAI routes (see openai_request.h). Every check names the JSON
// field at fault; numeric fields accept JSON integers where OpenAI documents integers (a float such
// as 1.5 for max_tokens is a 400, as in vLLM's pydantic models).
#include "server/openai_request.h"

#include <cmath>
#include <limits>

#include <fmt/format.h>

namespace mla::server {

namespace {

using Json = nlohmann::json;

ApiError err(const std::string& param, const std::string& msg) { return bad_param(param, msg); }

std::string type_name(const Json& v) { return v.type_name(); }

// Field readers: nullopt when absent or null; an ApiError when present with the wrong type/range.
struct Reader {
  const Json& body;
  std::optional<ApiError> error;

  const Json* get(const char* key) {
    auto it = body.find(key);
    if (it == body.end() || it->is_null()) return nullptr;
    return &*it;
  }
  bool fail(const std::string& param, const std::string& msg) {
    if (!error) error = err(param, msg);
    return false;
  }
  std::optional<bool> boolean(const char* key) {
    const Json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) return fail(key, fmt::format("'{}' must be a boolean, got {}", key, type_name(*v))), std::nullopt;
    return v->get<bool>();
  }
  std::optional<int64_t> integer(const char* key, int64_t lo, int64_t hi) {
    const Json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_number_integer()) {
      // 3.0 is accepted as 3 (JSON has one number type; some clients print integers that way).
      if (v->is_number_float() && std::isfinite(v->get<double>()) && std::floor(v->get<double>()) == v->get<double>() &&
          std::fabs(v->get<double>()) < 9.0e15) {
        const auto x = int64_t(v->get<double>());
        if (x < lo || x > hi) return fail(key, fmt::format("'{}' must be in [{}, {}], got {}", key, lo, hi, x)), std::nullopt;
        return x;
      }
      return fail(key, fmt::format("'{}' must be an integer, got {}", key, v->dump())), std::nullopt;
    }
    if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
      return fail(key, fmt::format("'{}' must be in [{}, {}], got {}", key, lo, hi, v->dump())), std::nullopt;
    const int64_t x = v->get<int64_t>();
    if (x < lo || x > hi) return fail(key, fmt::format("'{}' must be in [{}, {}], got {}", key, lo, hi, x)), std::nullopt;
    return x;
  }
  std::optional<double> number(const char* key, double lo, double hi, bool lo_open = false) {
    const Json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_number()) return fail(key, fmt::format("'{}' must be a number, got {}", key, type_name(*v))), std::nullopt;
    const double x = v->get<double>();
    if (!std::isfinite(x) || x < lo || x > hi || (lo_open && x == lo))
      return fail(key, fmt::format("'{}' must be in {}{}, {}], got {}", key, lo_open ? "(" : "[", lo, hi, x)), std::nullopt;
    return x;
  }
  std::optional<std::string> string(const char* key) {
    const Json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_string()) return fail(key, fmt::format("'{}' must be a string, got {}", key, type_name(*v))), std::nullopt;
    return v->get<std::string>();
  }
};

// Text of a message's content: a string, null, or an array of {"type":"text","text":...} parts.
std::optional<std::string> content_text(const Json& c, const std::string& param, std::optional<ApiError>& e) {
  if (c.is_null()) return std::nullopt;
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) {
    e = err(param, fmt::format("'{}' must be a string, null or an array of text parts", param));
    return std::nullopt;
  }
  std::string text;
  for (size_t i = 0; i < c.size(); ++i) {
    const Json& part = c[i];
    const std::string p = fmt::format("{}[{}]", param, i);
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string()) {
      e = err(p, "content parts must be objects with a string 'type'");
      return std::nullopt;
    }
    if (part["type"] != "text") {
      e = err(p + ".type", fmt::format("content part type '{}' is not supported (text only)", part["type"].get<std::string>()));
      return std::nullopt;
    }
    if (!part.contains("text") || !part["text"].is_string()) {
      e = err(p + ".text", "a text part needs a string 'text'");
      return std::nullopt;
    }
    if (!text.empty()) text += "\n";  // vLLM joins text parts with newlines
    text += part["text"].get<std::string>();
  }
  return text;
}

std::optional<ApiError> parse_messages(const Json& msgs, std::vector<tokenizer::ChatMessage>& out) {
  if (!msgs.is_array()) return err("messages", "'messages' must be an array");
  if (msgs.empty()) return err("messages", "'messages' must not be empty");
  for (size_t i = 0; i < msgs.size(); ++i) {
    const Json& m = msgs[i];
    const std::string p = fmt::format("messages[{}]", i);
    if (!m.is_object()) return err(p, "each message must be an object");
    if (!m.contains("role") || !m["role"].is_string()) return err(p + ".role", "each message needs a string 'role'");
    tokenizer::ChatMessage cm;
    cm.role = m["role"].get<std::string>();
    if (cm.role != "system" && cm.role != "user" && cm.role != "assistant" && cm.role != "tool" && cm.role != "developer")
      return err(p + ".role", fmt::format("unknown role '{}'", cm.role));
    std::optional<ApiError> e;
    if (m.contains("content")) cm.content = content_text(m["content"], p + ".content", e);
    if (e) return e;
    if (!m.contains("content") && cm.role != "assistant") return err(p + ".content", "the message has no 'content'");
    if (auto it = m.find("reasoning_content"); it != m.end() && !it->is_null()) {
      if (!it->is_string()) return err(p + ".reasoning_content", "'reasoning_content' must be a string");
      cm.reasoning_content = it->get<std::string>();
    }
    if (auto it = m.find("tool_calls"); it != m.end() && !it->is_null()) {
      if (!it->is_array()) return err(p + ".tool_calls", "'tool_calls' must be an array");
      cm.tool_calls = nlohmann::ordered_json::parse(it->dump());
    }
    if (auto it = m.find("tool_call_id"); it != m.end() && !it->is_null()) {
      if (!it->is_string()) return err(p + ".tool_call_id", "'tool_call_id' must be a string");
      cm.tool_call_id = it->get<std::string>();
    }
    if (auto it = m.find("name"); it != m.end() && !it->is_null()) {
      if (!it->is_string()) return err(p + ".name", "'name' must be a string");
      cm.name = it->get<std::string>();
    }
    out.push_back(std::move(cm));
  }
  return std::nullopt;
}

std::optional<ApiError> check_tools(const Json& tools) {
  if (!tools.is_array()) return err("tools", "'tools' must be an array");
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json& t = tools[i];
    const std::string p = fmt::format("tools[{}]", i);
    if (!t.is_object() || t.value("type", Json()) != "function") return err(p + ".type", "tools must be {\"type\":\"function\",...}");
    if (!t.contains("function") || !t["function"].is_object()) return err(p + ".function", "a tool needs a 'function' object");
    const Json& f = t["function"];
    if (!f.contains("name") || !f["name"].is_string() || f["name"].get<std::string>().empty())
      return err(p + ".function.name", "a function needs a non-empty string 'name'");
    if (f.contains("parameters") && !f["parameters"].is_null() && !f["parameters"].is_object())
      return err(p + ".function.parameters", "'parameters' must be a JSON Schema object");
  }
  return std::nullopt;
}

// Prompt ids of a completions `prompt`: a string, a list of token ids, or a one-element list of either.
std::optional<ApiError> completion_prompt(const Json& prompt, const ModelContext& ctx, ParsedRequest& r) {
  const Json* p = &prompt;
  if (p->is_array() && p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array())) p = &(*p)[0];
  if (p->is_string()) {
    if (!ctx.tok) return err("prompt", "this model has no tokenizer: send the prompt as token ids");
    r.prompt_text = p->get<std::string>();
    auto ids = ctx.tok->try_encode(r.prompt_text, {tokenizer::EncodeOptions::Special::None});
    if (!ids) return err("prompt", ids.status().message());
    r.params.prompt = std::move(ids).value();
    if (ctx.tok->bos_id()) r.params.prompt.insert(r.params.prompt.begin(), *ctx.tok->bos_id());
  } else if (p->is_array()) {
    if (p->empty()) return err("prompt", "'prompt' must not be empty");
    for (const Json& t : *p) {
      if (!t.is_number_integer()) {
        if (t.is_string() || t.is_array()) return err("prompt", "batched prompts are not supported: send one prompt per request");
        return err("prompt", "'prompt' must be a string or an array of token ids");
      }
      const int64_t id = t.get<int64_t>();
      if (id < 0 || id >= ctx.vocab_size)
        return err("prompt", fmt::format("token id {} is outside the vocabulary [0, {})", id, ctx.vocab_size));
      r.params.prompt.push_back(int32_t(id));
    }
  } else {
    return err("prompt", "'prompt' must be a string or an array of token ids");
  }
  if (r.params.prompt.empty()) return err("prompt", "the prompt is empty");
  return std::nullopt;
}

std::optional<ApiError> chat_prompt(const Json& body, const ModelContext& ctx, ParsedRequest& r) {
  if (!ctx.tok || !ctx.chat_template)
    return err("messages", "this model has no chat template (tokenizer_config.json chat_template); use /v1/completions");
  if (!body.contains("messages")) return err("messages", "'messages' is required");
  std::vector<tokenizer::ChatMessage> msgs;
  if (auto e = parse_messages(body["messages"], msgs)) return e;
  tokenizer::RenderOptions ro;
  ro.add_generation_prompt = true;
  ro.bos_token = ctx.chat_template->bos_token;
  ro.eos_token = ctx.chat_template->eos_token;
  Reader rd{body, std::nullopt};
  if (auto agp = rd.boolean("add_generation_prompt")) ro.add_generation_prompt = *agp;
  if (rd.error) return rd.error;
  std::string tool_choice = "auto";
  if (const Json* tc = rd.get("tool_choice")) {
    if (tc->is_string()) tool_choice = tc->get<std::string>();
    else tool_choice = "named";
    if (tool_choice != "auto" && tool_choice != "none")
      return err("tool_choice", "only tool_choice \"auto\" and \"none\" are supported");
  }
  if (const Json* tools = rd.get("tools")) {
    if (auto e = check_tools(*tools)) return e;
    if (!tools->empty()) {
      ro.tools = nlohmann::ordered_json::parse(tools->dump());
      r.parse_tools = tool_choice != "none" && ctx.tool_call_format.has_value();
    }
  }
  if (const Json* kw = rd.get("chat_template_kwargs")) {
    if (!kw->is_object()) return err("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    ro.extra = nlohmann::ordered_json::parse(kw->dump());
  }
  Result<std::string> text =
      tokenizer::render_chat_template(ctx.chat_template->chat_template, tokenizer::chat_messages_to_json(msgs), ro);
  if (!text) return err("messages", "chat template: " + text.status().message());
  auto ids = ctx.tok->try_encode(*text, {tokenizer::EncodeOptions::Special::All});  // the template's markers are specials
  if (!ids) return err("messages", ids.status().message());
  r.params.prompt = std::move(ids).value();
  if (r.params.prompt.empty()) return err("messages", "the rendered chat prompt is empty");
  if (ctx.reasoning) {
    std::string_view t = *text;
    while (!t.empty() && (t.back() == ' ' || t.back() == '\n' || t.back() == '\t' || t.back() == '\r')) t.remove_suffix(1);
    r.starts_in_reasoning = t.ends_with("<think>");
  }
  // Tool-call markers are special tokens, and so is <think> in some tokenizers: keep them in the
  // text the parsers see (they never reach the client: the parsers consume them).
  if (r.parse_tools) r.params.skip_special_tokens = false;
  if (ctx.reasoning) {
    if (std::optional<int32_t> think = ctx.tok->special_token_id("<think>"); think && ctx.tok->is_special(*think))
      r.params.skip_special_tokens = false;
  }
  return std::nullopt;
}

}  // namespace

std::variant<ParsedRequest, ApiError> parse_request(const std::string& body_text, bool chat, const ModelContext& ctx) {
  Json body = Json::parse(body_text, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) return err("", "the request body is not valid JSON");
  if (!body.is_object()) return err("", fmt::format("the request body must be a JSON object, got {}", type_name(body)));
  ParsedRequest r;
  r.chat = chat;
  Reader rd{body, std::nullopt};

  if (auto model = rd.string("model"); model && *model != ctx.served_model_name) {
    ApiError e{404, fmt::format("The model `{}` does not exist.", *model), "NotFoundError", "model", "model_not_found"};
    return e;
  }
  if (rd.error) return *rd.error;

  // Unsupported fields, rejected by name rather than ignored.
  if (auto n = rd.integer("n", 1, 128); n && *n != 1) return err("n", fmt::format("only n=1 is supported, got {}", *n));
  if (rd.error) return *rd.error;
  if (const Json* lb = rd.get("logit_bias"); lb && !(lb->is_object() && lb->empty()))
    return err("logit_bias", "logit_bias is not supported");
  for (const char* pen : {"presence_penalty", "frequency_penalty"})
    if (auto v = rd.number(pen, -2.0, 2.0); v && *v != 0.0) return err(pen, fmt::format("{} is not supported (0 only)", pen));
  if (auto v = rd.number("repetition_penalty", 0.0, 1e9, true); v && *v != 1.0)
    return err("repetition_penalty", "repetition_penalty is not supported (1 only)");
  if (rd.error) return *rd.error;
  if (const Json* rf = rd.get("response_format"); rf && !(rf->is_object() && rf->value("type", Json()) == "text"))
    return err("response_format", "only response_format {\"type\":\"text\"} is supported");
  if (!chat) {
    if (rd.get("suffix")) return err("suffix", "suffix is not supported");
    if (auto echo = rd.boolean("echo"); echo && *echo) return err("echo", "echo is not supported");
    if (rd.error) return *rd.error;
  }

  // Prompt.
  if (chat) {
    if (auto e = chat_prompt(body, ctx, r)) return *e;
  } else {
    if (!rd.get("prompt")) return err("prompt", "'prompt' is required");
    if (auto e = completion_prompt(body["prompt"], ctx, r)) return *e;
  }
  const int prompt_len = int(r.params.prompt.size());

  // Length.
  std::optional<int64_t> max_tokens = rd.integer("max_tokens", 1, std::numeric_limits<int32_t>::max());
  if (chat) {
    if (auto mct = rd.integer("max_completion_tokens", 1, std::numeric_limits<int32_t>::max())) max_tokens = mct;
  }
  if (rd.error) return *rd.error;
  const char* length_param = chat && body.contains("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  if (!max_tokens) {
    // vLLM: chat defaults to the rest of the context; completions to OpenAI's 16.
    max_tokens = chat ? std::max<int64_t>(1, int64_t(ctx.max_model_len) - prompt_len) : 16;
  }
  if (int64_t(prompt_len) + *max_tokens > ctx.max_model_len) {
    ApiError e;
    e.param = chat ? "messages" : "prompt";
    e.code = "context_length_exceeded";
    e.message = fmt::format(
        "This model's maximum context length is {} tokens. However, you requested {} tokens ({} in the {}, {} in "
        "the completion). Please reduce the length of the {} or the completion ({}).",
        ctx.max_model_len, int64_t(prompt_len) + *max_tokens, prompt_len, chat ? "messages" : "prompt", *max_tokens,
        chat ? "messages" : "prompt", length_param);
    return e;
  }
  r.params.max_tokens = int(*max_tokens);
  if (auto v = rd.integer("min_tokens", 0, std::numeric_limits<int32_t>::max())) r.params.min_tokens = int(*v);

  // Sampling.
  runtime::SamplingParams& s = r.params.sampling;
  if (auto v = rd.number("temperature", 0.0, 1e6)) s.temperature = float(*v);
  if (auto v = rd.number("top_p", 0.0, 1.0, /*lo_open=*/true)) s.top_p = float(*v);
  if (auto v = rd.integer("top_k", -1, std::numeric_limits<int32_t>::max())) s.top_k = int(*v);
  if (auto v = rd.number("min_p", 0.0, 1.0)) s.min_p = float(*v);
  if (auto v = rd.integer("seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()))
    s.seed = uint64_t(*v);
  if (auto v = rd.boolean("ignore_eos")) r.params.ignore_eos = *v;
  if (auto v = rd.boolean("include_stop_str_in_output")) r.params.include_stop_str_in_output = *v;
  if (auto v = rd.boolean("skip_special_tokens"); v && !r.parse_tools) r.params.skip_special_tokens = *v;
  if (rd.error) return *rd.error;

  // Stops.
  if (const Json* st = rd.get("stop")) {
    if (st->is_string()) {
      r.params.stop.push_back(st->get<std::string>());
    } else if (st->is_array()) {
      for (const Json& x : *st) {
        if (!x.is_string()) return err("stop", "'stop' must be a string or an array of strings");
        r.params.stop.push_back(x.get<std::string>());
      }
    } else {
      return err("stop", "'stop' must be a string or an array of strings");
    }
    for (const std::string& x : r.params.stop)
      if (x.empty()) return err("stop", "stop strings must be non-empty");
  }
  if (const Json* st = rd.get("stop_token_ids")) {
    if (!st->is_array()) return err("stop_token_ids", "'stop_token_ids' must be an array of token ids");
    for (const Json& x : *st) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= ctx.vocab_size)
        return err("stop_token_ids", "'stop_token_ids' must hold token ids of the vocabulary");
      r.params.stop_token_ids.push_back(int32_t(x.get<int64_t>()));
    }
  }

  // Logprobs: completions take an integer k; chat a boolean plus top_logprobs.
  if (chat) {
    auto lp = rd.boolean("logprobs");
    auto top = rd.integer("top_logprobs", 0, runtime::kMaxTopLogprobs);
    if (rd.error) return *rd.error;
    if (top && !(lp && *lp)) return err("top_logprobs", "top_logprobs needs logprobs=true");
    if (lp && *lp) {
      r.chat_logprobs = true;
      r.params.logprobs = int(top.value_or(0));
    }
  } else {
    if (auto lp = rd.integer("logprobs", 0, runtime::kMaxTopLogprobs)) r.params.logprobs = int(*lp);
    if (rd.error) return *rd.error;
  }

  if (auto salt = rd.string("cache_salt")) {
    if (salt->empty()) return err("cache_salt", "'cache_salt' must be a non-empty string");
    r.params.cache_salt = *salt;
  }

  // Streaming.
  if (auto v = rd.boolean("stream")) r.stream = *v;
  if (rd.error) return *rd.error;
  if (const Json* so = rd.get("stream_options")) {
    if (!so->is_object()) return err("stream_options", "'stream_options' must be an object");
    if (!r.stream) return err("stream_options", "stream_options can only be set when stream is true");
    Reader sr{*so, std::nullopt};
    if (auto v = sr.boolean("include_usage")) r.include_usage = *v;
    if (auto v = sr.boolean("continuous_usage_stats")) r.continuous_usage = *v;
    if (sr.error) {
      sr.error->param = "stream_options." + sr.error->param;
      return *sr.error;
    }
  }

  // The engine's own checks (ranges it owns, e.g. min_tokens <= max_tokens), with its param names.
  runtime::RequestLimits lim{ctx.vocab_size, ctx.max_model_len, ctx.tok != nullptr};
  if (auto e = runtime::validate_request(r.params, lim)) {
    ApiError a = from_engine_error(*e);
    if (a.param == "max_tokens" && chat && body.contains("max_completion_tokens")) a.param = "max_completion_tokens";
    return a;
  }
  return r;
}

}  // namespace mla::server
