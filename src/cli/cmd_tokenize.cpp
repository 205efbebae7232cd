// `mlaserve tokenize`: encode TEXT to ids (plain or {"ids":[...]}) or decode `--decode 1,2,3`,
// with a model directory's tokenizer or a single tokenizer file (tiktoken rank file or
// tokenizer.json). Special-token text is recognized unless --no-special.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "tokenizer/tokenizer.h"

namespace mla::cli {

namespace {

struct TokenizeArgs {
  std::string model, tokenizer, pattern = "kimi", decode, text;
  bool json = false, no_special = false;
};

Result<std::vector<int32_t>> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t end = s.find(',', pos);
    if (end == std::string::npos) end = s.size();
    const std::string item = s.substr(pos, end - pos);
    if (item.empty() || item.size() > 10 || item.find_first_not_of("0123456789") != std::string::npos)
      return error("--decode: '{}' is not a token id", item);
    const long long v = std::stoll(item);
    if (v > INT32_MAX) return error("--decode: '{}' is out of range", item);
    ids.push_back(static_cast<int32_t>(v));
    pos = end + 1;
  }
  return ids;
}

int run_tokenize(const TokenizeArgs& a) {
  using tokenizer::Tokenizer;
  Result<std::unique_ptr<Tokenizer>> tok = error("no tokenizer");
  if (!a.model.empty()) {
    tok = Tokenizer::from_model_dir(a.model);
  } else {
    const bool is_json = a.tokenizer.size() >= 5 && a.tokenizer.compare(a.tokenizer.size() - 5, 5, ".json") == 0;
    tok = is_json ? Tokenizer::from_tokenizer_json(a.tokenizer, "") : Tokenizer::from_tiktoken_file(a.tokenizer, a.pattern);
  }
  if (!tok) {
    std::fprintf(stderr, "mlaserve tokenize: %s\n", tok.status().message().c_str());
    return 1;
  }
  if (!a.decode.empty()) {
    auto ids = parse_ids(a.decode);
    if (!ids) {
      std::fprintf(stderr, "mlaserve tokenize: %s\n", ids.status().message().c_str());
      return 1;
    }
    for (int32_t id : *ids)
      if (id >= (*tok)->vocab_size()) {
        std::fprintf(stderr, "mlaserve tokenize: --decode: id %d is outside the vocabulary (%d)\n", id,
                     (*tok)->vocab_size());
        return 1;
      }
    const std::string text = (*tok)->decode(*ids);
    if (a.json) {
      std::printf("%s\n", nlohmann::json{{"text", text}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    } else {
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::printf("\n");
    }
    return 0;
  }
  tokenizer::EncodeOptions opt;
  if (a.no_special) opt.special = tokenizer::EncodeOptions::Special::None;
  auto ids = (*tok)->try_encode(a.text, opt);
  if (!ids) {
    std::fprintf(stderr, "mlaserve tokenize: %s\n", ids.status().message().c_str());
    return 1;
  }
  if (a.json) {
    std::printf("%s\n", nlohmann::json{{"ids", *ids}}.dump().c_str());
  } else {
    std::string line;
    for (size_t i = 0; i < ids->size(); ++i) line += (i ? " " : "") + std::to_string((*ids)[i]);
    std::printf("%s\n", line.c_str());
  }
  return 0;
}

}  // namespace

Command add_tokenize_command(CLI::App& app) {
  auto a = std::make_shared<TokenizeArgs>();
  CLI::App* sub = app.add_subcommand("tokenize", "Encode TEXT to token ids, or --decode ids to text");
  auto* model = sub->add_option("--model", a->model, "Model directory (tiktoken.model or tokenizer.json)");
  auto* file = sub->add_option("--tokenizer", a->tokenizer, "Tokenizer file: a tiktoken rank file or tokenizer.json");
  model->excludes(file);
  sub->add_option("--pattern", a->pattern, "Pre-tokenization pattern for a rank file: kimi, o200k or cl100k")
      ->check(CLI::IsMember({"kimi", "o200k", "cl100k"}));
  sub->add_flag("--json", a->json, "Print {\"ids\":[...]} (or {\"text\":...} with --decode)");
  sub->add_flag("--no-special", a->no_special, "Encode special-token text as plain text");
  auto* dec = sub->add_option("--decode", a->decode, "Comma-separated ids to decode, e.g. 1,2,3");
  auto* text = sub->add_option("text", a->text, "Text to encode");
  dec->excludes(text);
  return {sub, [a, sub] {
            if (a->model.empty() && a->tokenizer.empty()) {
              std::fprintf(stderr, "mlaserve tokenize: one of --model or --tokenizer is required\n");
              return 2;
            }
            if (a->decode.empty() && sub->count("text") == 0) {
              std::fprintf(stderr, "mlaserve tokenize: TEXT or --decode is required\n");
              return 2;
            }
            return run_tokenize(*a);
          }};
}

}  // namespace mla::cli
