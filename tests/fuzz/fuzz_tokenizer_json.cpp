// libFuzzer target for HF tokenizer.json parsing: arbitrary bytes (written to a scratch file, as the
// loader reads files) must load or give a one-line error naming the file. A loaded tokenizer must
// encode without crashing and produce only ids it can decode; when it holds all 256 byte tokens it
// must also round-trip (a vocabulary missing bytes legitimately cannot).
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/mla_fuzz_tokenizer_" + std::to_string(getpid()) + ".json";
  if (FILE* f = std::fopen(path.c_str(), "wb")) {
    std::fwrite(data, 1, size, f);
    std::fclose(f);
  } else {
    return 0;
  }
  auto t = mla::tokenizer::Tokenizer::from_tokenizer_json(path, "");
  if (!t.is_ok()) {
    const std::string msg = t.status().message();
    if (msg.find(path) == std::string::npos || msg.find('\n') != std::string::npos) __builtin_trap();
    return 0;
  }
  const mla::tokenizer::Tokenizer& tok = *t.value();
  bool has_byte[256] = {};
  for (int32_t id = 0; id < tok.vocab_size() && id < (1 << 16); ++id) {
    const std::string_view b = tok.token_bytes(id);
    if (b.size() == 1 && !tok.is_special(id)) has_byte[static_cast<unsigned char>(b[0])] = true;
  }
  bool all_bytes = true;
  for (bool h : has_byte) all_bytes = all_bytes && h;
  for (std::string_view s : {"hello world", "\xE4\xBD\xA0\xE5\xA5\xBD 123", "  \n\t x"}) {
    const auto ids = tok.encode(s);
    for (int32_t id : ids)
      if (id < 0 || id >= tok.vocab_size()) __builtin_trap();
    if (all_bytes && tok.decode(ids) != s) __builtin_trap();
  }
  return 0;
}
