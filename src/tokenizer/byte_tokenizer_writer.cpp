#include "tokenizer/byte_tokenizer_writer.h"

#include <fstream>

#include <nlohmann/json.hpp>

namespace mla::tokenizer {

namespace {

std::string base64(const std::string& bytes) {
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (unsigned char c : bytes) {
    acc = (acc << 8) | c;
    bits += 8;
    while (bits >= 6) {
      bits -= 6;
      out += kAlphabet[(acc >> bits) & 63];
    }
  }
  if (bits > 0) out += kAlphabet[(acc << (6 - bits)) & 63];
  while (out.size() % 4) out += '=';
  return out;
}

Status write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
  if (!f) return error("{}: write failed", path);
  return Status::ok();
}

}  // namespace

Status write_byte_level_tokenizer(const std::string& dir) {
  std::string ranks;
  for (int b = 0; b < 256; ++b) ranks += base64(std::string(1, char(b))) + " " + std::to_string(b) + "\n";
  MLA_RETURN_IF_ERROR(write_text(dir + "/tiktoken.model", ranks));

  const std::pair<int, const char*> specials[] = {{256, "[BOS]"},        {257, "[EOS]"},         {258, "<|im_end|>"},
                                                  {259, "<|im_user|>"},  {260, "<|im_assistant|>"}, {261, "<|im_system|>"},
                                                  {262, "<|im_middle|>"}};
  nlohmann::ordered_json added = nlohmann::ordered_json::object();
  for (const auto& [id, text] : specials) added[std::to_string(id)] = {{"content", text}, {"special", true}};
  nlohmann::ordered_json cfg = {
      {"tokenizer_class", "TikTokenTokenizer"},
      {"bos_token", "[BOS]"},
      {"eos_token", "[EOS]"},
      {"added_tokens_decoder", added},
      // Kimi K2's message framing (MODELS.md §5.1).
      {"chat_template",
       "{%- for message in messages -%}<|im_{{ message.role }}|>{{ message.role }}<|im_middle|>{{ message.content }}"
       "<|im_end|>{%- endfor -%}{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}"}};
  MLA_RETURN_IF_ERROR(write_text(dir + "/tokenizer_config.json", cfg.dump(2) + "\n"));
  const nlohmann::ordered_json gen = {{"bos_token_id", 256}, {"eos_token_id", {257, 258}}};
  return write_text(dir + "/generation_config.json", gen.dump(2) + "\n");
}

}  // namespace mla::tokenizer
