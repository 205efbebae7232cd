// libFuzzer target for the Jinja-subset engine: arbitrary template text is parsed and rendered
// against a fixed small chat context with tight limits. Any crash, sanitizer report, leak (a
// reference cycle), hang or thrown exception is a bug; an error Status is a fine outcome.
#include <cstddef>
#include <cstdint>
#include <string>

#include "tokenizer/jinja.h"

namespace {

const mla::tokenizer::jinja::Value& context() {
  static const mla::tokenizer::jinja::Value ctx = mla::tokenizer::jinja::Value::from_json(nlohmann::ordered_json::parse(R"({
    "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "héllo {{x}}"},
                 {"role": "assistant", "content": null, "tool_calls": [{"type": "function",
                   "function": {"name": "f", "arguments": "{\"a\": 1}"}}]},
                 {"role": "tool", "content": "out"}, {"role": "assistant", "content": "<think>r</think>ok"}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"})"));
  return ctx;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  mla::tokenizer::jinja::RenderLimits limits;
  limits.max_output_bytes = 1 << 20;
  limits.max_steps = 200'000;
  auto tpl = mla::tokenizer::jinja::parse_template(text);
  if (!tpl.is_ok()) {
    if (tpl.status().message().empty()) __builtin_trap();
    return 0;
  }
  auto out = mla::tokenizer::jinja::render(*tpl.value(), context(), limits);
  if (out.is_ok() && out.value().size() > limits.max_output_bytes) __builtin_trap();
  return 0;
}
