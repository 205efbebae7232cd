// libFuzzer target for tiktoken rank-file parsing: arbitrary bytes must load or give a one-line
// error that names the file; a loaded tokenizer must round-trip a few fixed strings.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto t = mla::tokenizer::Tokenizer::from_tiktoken_text(text, "fuzz.tiktoken", "o200k", {{"<|end|>", 1 << 20}});
  if (!t.is_ok()) {
    const std::string msg = t.status().message();
    if (msg.rfind("fuzz.tiktoken", 0) != 0 || msg.find('\n') != std::string::npos) __builtin_trap();
    return 0;
  }
  for (std::string_view s : {"hello world", "\xE4\xBD\xA0\xE5\xA5\xBD 123 <|end|>", "  \n\t x"}) {
    const auto ids = t.value()->encode(s);
    if (t.value()->decode(ids) != s) __builtin_trap();
  }
  return 0;
}
