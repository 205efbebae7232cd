// libFuzzer target for config.json parsing: any crash, sanitizer report or thrown exception is a
// bug. Accepted configs must also round-trip through the writer and drive the rope math safely;
// rejected ones must carry a one-line message that starts with the source name.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "io/model_config.h"
#include "model/rope_yarn.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const auto parsed = mla::io::parse_model_config(text, "fuzz.json");
  if (!parsed.is_ok()) {
    const std::string msg = parsed.status().message();
    if (msg.rfind("fuzz.json: ", 0) != 0 || msg.find('\n') != std::string::npos) __builtin_trap();
    return 0;
  }
  const mla::io::ModelConfig& c = parsed.value();
  const auto back = mla::io::parse_model_config(mla::io::model_config_to_json(c).dump(), "roundtrip");
  if (!back.is_ok() || !(back.value() == c)) __builtin_trap();
  (void)mla::io::describe(c);
  if (mla::io::parameter_count(c) < mla::io::active_parameter_count(c)) __builtin_trap();
  const auto inv = mla::model::rope_inv_freq(c);
  if (inv.size() != size_t(c.qk_rope_head_dim / 2)) __builtin_trap();
  (void)mla::model::rope_attention_factor(c);
  (void)mla::model::mla_softmax_scale(c);
  return 0;
}
