// libFuzzer target for encode on arbitrary bytes, with a small in-process tokenizer (all 256
// bytes plus a few merges; the fuzzer has no access to the npm rank files) under each built-in
// pattern. Valid UTF-8 must round-trip exactly; invalid UTF-8 must be rejected by try_encode and
// replaced (U+FFFD) by encode, never crash.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace {

std::string b64(std::string_view s) {
  static const char* a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < s.size(); i += 3) {
    uint32_t w = static_cast<uint8_t>(s[i]) << 16;
    if (i + 1 < s.size()) w |= static_cast<uint8_t>(s[i + 1]) << 8;
    if (i + 2 < s.size()) w |= static_cast<uint8_t>(s[i + 2]);
    out += a[(w >> 18) & 63];
    out += a[(w >> 12) & 63];
    out += i + 1 < s.size() ? a[(w >> 6) & 63] : '=';
    out += i + 2 < s.size() ? a[w & 63] : '=';
  }
  return out;
}

std::vector<std::unique_ptr<mla::tokenizer::Tokenizer>> make_tokenizers() {
  std::string text;
  int rank = 0;
  for (int b = 0; b < 256; ++b) text += b64(std::string(1, static_cast<char>(b))) + " " + std::to_string(rank++) + "\n";
  for (const char* m : {"he", "ll", "hell", "hello", " w", " wo", "or", "  ", "    ", "\xE4\xBD", "\xE4\xBD\xA0", "12", "123"})
    text += b64(m) + " " + std::to_string(rank++) + "\n";
  std::vector<std::unique_ptr<mla::tokenizer::Tokenizer>> out;
  for (const char* pat : {"o200k", "cl100k", "kimi"}) {
    auto t = mla::tokenizer::Tokenizer::from_tiktoken_text(text, "embedded", pat, {{"<|end|>", rank}});
    if (!t.is_ok()) __builtin_trap();
    out.push_back(std::move(t).value());
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const auto toks = make_tokenizers();
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const bool valid = mla::tokenizer::utf8_is_valid(text);
  for (const auto& t : toks) {
    auto r = t->try_encode(text);
    if (r.is_ok() != valid) __builtin_trap();
    const auto ids = t->encode(text);
    const std::string back = t->decode(ids);
    if (valid ? back != text : back != mla::tokenizer::utf8_make_valid(text)) __builtin_trap();
    if (valid && r.value() != ids) __builtin_trap();
    const auto plain = t->encode(text, {mla::tokenizer::EncodeOptions::Special::None});
    if (t->decode(plain) != back) __builtin_trap();
    mla::tokenizer::IncrementalDetokenizer d(*t);
    std::string streamed;
    for (int32_t id : ids) streamed += d.push(id);
    streamed += d.finish();
    if (!mla::tokenizer::utf8_is_valid(streamed)) __builtin_trap();
    if (valid && streamed != text) __builtin_trap();
  }
  return 0;
}
