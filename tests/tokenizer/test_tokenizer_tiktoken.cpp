// tiktoken-format tokenizers against published oracles: gpt-tokenizer's TestPlans.txt vectors for
// o200k_base / cl100k_base, round trips, special tokens, streaming decode and Kimi's pattern.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <random>
#include <set>

#include "tokenizer_test_util.h"

namespace mla::tokenizer {
namespace {

using namespace mla::tokenizer::testing;

struct Plan {
  std::string encoding, sample;
  std::vector<int32_t> ids;
};

std::vector<Plan> read_test_plans() {
  std::vector<Plan> plans;
  std::istringstream in(slurp(npm_path("gpt-tokenizer/data/TestPlans.txt")));
  std::string line;
  Plan cur;
  while (std::getline(in, line)) {
    if (line.rfind("EncodingName: ", 0) == 0) {
      cur = Plan{line.substr(14), "", {}};
    } else if (line.rfind("Sample:", 0) == 0) {
      cur.sample = line.size() > 8 ? line.substr(8) : "";
    } else if (line.rfind("Encoded: ", 0) == 0) {
      for (const auto& v : nlohmann::json::parse(line.substr(9))) cur.ids.push_back(v.get<int32_t>());
      plans.push_back(cur);
    }
  }
  return plans;
}

TEST(TokenizerTiktoken, GptTokenizerTestPlansMatchExactly) {
  ASSERT_NE(o200k(), nullptr);
  ASSERT_NE(cl100k(), nullptr);
  const auto plans = read_test_plans();
  ASSERT_GE(plans.size(), 300u);
  std::map<std::string, int> ran, skipped;
  for (const Plan& p : plans) {
    const Tokenizer* t = p.encoding == "o200k_base" ? o200k() : p.encoding == "cl100k_base" ? cl100k() : nullptr;
    if (t == nullptr) {
      ++skipped[p.encoding];
      continue;
    }
    ++ran[p.encoding];
    EXPECT_EQ(t->encode(p.sample), p.ids) << p.encoding << " sample: " << p.sample;
    EXPECT_EQ(t->decode(p.ids), p.sample) << p.encoding;
  }
  std::printf("TestPlans: ran o200k_base=%d cl100k_base=%d; skipped (not built in):", ran["o200k_base"],
              ran["cl100k_base"]);
  for (const auto& [k, v] : skipped) std::printf(" %s=%d", k.c_str(), v);
  std::printf("\n");
  EXPECT_GT(ran["o200k_base"], 50);
  EXPECT_GT(ran["cl100k_base"], 50);
}

std::string random_text(std::mt19937& rng, size_t n_chars) {
  // Mix of ASCII, whitespace, Latin-1, CJK, Hangul, emoji, ZWJ, combining marks.
  static const std::vector<std::pair<uint32_t, uint32_t>> ranges = {
      {0x20, 0x7E}, {0x20, 0x7E}, {0x09, 0x0D}, {0xA0, 0xFF}, {0x300, 0x36F}, {0x4E00, 0x9FA5},
      {0x3040, 0x30FF}, {0xAC00, 0xD7A3}, {0x1F300, 0x1F6FF}, {0x200B, 0x200D}, {0x10000, 0x10FFFF}};
  std::string s;
  for (size_t i = 0; i < n_chars; ++i) {
    const auto& r = ranges[rng() % ranges.size()];
    utf8_append(s, r.first + rng() % (r.second - r.first + 1));
  }
  return s;
}

TEST(TokenizerTiktoken, RoundTripCorpusAndRandomText) {
  ASSERT_NE(o200k(), nullptr);
  ASSERT_NE(cl100k(), nullptr);
  std::vector<std::string> texts = corpus();
  ASSERT_GE(texts.size(), 40u);
  std::mt19937 rng(7);
  for (int i = 0; i < 200; ++i) texts.push_back(random_text(rng, rng() % 200));
  for (const Tokenizer* t : {o200k(), cl100k()})
    for (const std::string& s : texts) {
      const auto ids = t->encode(s);
      EXPECT_EQ(t->decode(ids), s);
      const auto plain = t->encode(s, {EncodeOptions::Special::None});
      EXPECT_EQ(t->decode(plain), s);
      for (int32_t id : plain) EXPECT_FALSE(t->is_special(id));
    }
}

TEST(TokenizerTiktoken, SpecialTokensAllowedOrPlain) {
  const Tokenizer* t = o200k();
  ASSERT_NE(t, nullptr);
  const std::string text = "hi<|endoftext|>there<|endofprompt|>";
  const auto all = t->encode(text);
  const auto plain = t->encode(text, {EncodeOptions::Special::None});
  EXPECT_EQ(std::count(all.begin(), all.end(), 199999), 1);
  EXPECT_EQ(std::count(all.begin(), all.end(), 200018), 1);
  EXPECT_EQ(all.back(), 200018);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 199999), 0);
  EXPECT_GT(plain.size(), all.size());
  EXPECT_EQ(t->decode(all), text);
  EXPECT_EQ(t->decode(plain), text);
  // Segments around a special are encoded independently: same as encoding each part.
  auto hi = t->encode("hi"), there = t->encode("there");
  std::vector<int32_t> expect = hi;
  expect.push_back(199999);
  expect.insert(expect.end(), there.begin(), there.end());
  expect.push_back(200018);
  EXPECT_EQ(all, expect);
  EXPECT_EQ(t->special_token_id("<|endoftext|>"), 199999);
  EXPECT_FALSE(t->special_token_id("<|nope|>").has_value());
  EXPECT_TRUE(t->is_special(199999));
  EXPECT_FALSE(t->is_special(hi[0]));
  EXPECT_EQ(t->vocab_size(), 200019);
}

bool valid(const std::string& s) { return utf8_is_valid(s); }

TEST(TokenizerTiktoken, IncrementalDetokenizerNeverBreaksUtf8) {
  const Tokenizer* t = o200k();
  ASSERT_NE(t, nullptr);
  const std::vector<std::string> texts = {"👨‍👩‍👧‍👦 family 🏳️‍🌈", "我爱北京天安门，天气很好", "🇯🇵🇫🇷 ok 👩🏽‍💻",
                                          "ภาษาไทย café 𝔘𝔫𝔦𝔠𝔬𝔡𝔢"};
  int split_tokens = 0;
  for (const std::string& s : texts) {
    const auto ids = t->encode(s);
    IncrementalDetokenizer d(*t);
    std::string acc;
    for (int32_t id : ids) {
      split_tokens += !valid(std::string(t->token_bytes(id)));
      const std::string piece = d.push(id);
      EXPECT_TRUE(valid(piece));
      acc += piece;
    }
    acc += d.finish();
    EXPECT_EQ(acc, t->decode(ids));
    EXPECT_EQ(acc, s);
  }
  EXPECT_GT(split_tokens, 0) << "the corpus must contain tokens that split a UTF-8 character";
}

TEST(TokenizerTiktoken, IncrementalDetokenizerInvalidBytesBecomeReplacement) {
  const Tokenizer* t = o200k();
  ASSERT_NE(t, nullptr);
  const auto byte_id = [&](uint8_t b) { return t->encode(std::string(1, static_cast<char>(b)).c_str())[0]; };
  // Single-byte tokens for 0xE4 0xB8 (a truncated 3-byte char), then 'a'.
  int32_t e4 = -1, b8 = -1;
  for (int32_t id = 0; id < 256 * 2 && id < t->vocab_size(); ++id) {
    if (t->token_bytes(id) == std::string_view("\xE4", 1)) e4 = id;
    if (t->token_bytes(id) == std::string_view("\xB8", 1)) b8 = id;
  }
  ASSERT_GE(e4, 0);
  ASSERT_GE(b8, 0);
  IncrementalDetokenizer d(*t);
  EXPECT_EQ(d.push(e4), "");
  EXPECT_EQ(d.push(b8), "");
  EXPECT_EQ(d.push(byte_id('a')), "\xEF\xBF\xBD" "a");
  EXPECT_EQ(d.push(b8), "\xEF\xBF\xBD");  // stray continuation byte
  EXPECT_EQ(d.push(e4), "");
  EXPECT_EQ(d.finish(), "\xEF\xBF\xBD");
  // skip_special drops specials only.
  IncrementalDetokenizer ds(*t, /*skip_special=*/true);
  EXPECT_EQ(ds.push(199999), "");
  EXPECT_EQ(ds.push(byte_id('a')), "a");
}

TEST(TokenizerTiktoken, InvalidUtf8IsRejectedOrReplaced) {
  const Tokenizer* t = o200k();
  ASSERT_NE(t, nullptr);
  const std::string bad = "ab\xFF\xE4\xB8 c\xED\xA0\x80";
  EXPECT_FALSE(t->try_encode(bad).is_ok());
  EXPECT_EQ(t->decode(t->encode(bad)), utf8_make_valid(bad));
  EXPECT_EQ(utf8_make_valid(bad), "ab\xEF\xBF\xBD\xEF\xBF\xBD c\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
}

// Kimi's `[X&&[^\p{Han}]]` rewritten as `(?:(?!\p{Han})[X])`: for every Unicode scalar value,
// membership of the rewrite equals membership of X minus membership of \p{Han}, each evaluated
// by a separate simple PCRE2 class.
std::vector<uint8_t> membership(const std::string& cls, const std::string& all, const std::vector<uint32_t>& offs) {
  auto re = Regex::compile(cls);
  EXPECT_TRUE(re.is_ok()) << cls;
  std::vector<std::pair<uint32_t, uint32_t>> hits;
  re.value()->find_all(all, hits);
  std::vector<uint8_t> m(offs.size(), 0);
  size_t k = 0;
  for (const auto& [b, e] : hits) {
    while (k < offs.size() && offs[k] < b) ++k;
    EXPECT_TRUE(k < offs.size() && offs[k] == b);
    EXPECT_TRUE(k + 1 >= offs.size() ? e == all.size() : e == offs[k + 1]) << "one character per match";
    if (k < offs.size()) m[k] = 1;
  }
  return m;
}

TEST(TokenizerTiktoken, KimiClassRewriteIsEquivalentForEveryScalarValue) {
  std::string all;
  std::vector<uint32_t> offs;
  for (uint32_t cp = 0; cp <= 0x10FFFF; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    offs.push_back(static_cast<uint32_t>(all.size()));
    utf8_append(all, cp);
  }
  const auto han = membership(R"(\p{Han})", all, offs);
  const std::pair<const char*, const char*> cases[] = {
      {kKimiUpperClass, R"([\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}])"},
      {kKimiLowerClass, R"([\p{Ll}\p{Lm}\p{Lo}\p{M}])"}};
  for (const auto& [rewritten, original] : cases) {
    const auto r = membership(rewritten, all, offs);
    const auto o = membership(original, all, offs);
    size_t mismatches = 0, members = 0, han_removed = 0;
    for (size_t i = 0; i < offs.size(); ++i) {
      const uint8_t want = o[i] && !han[i];
      mismatches += r[i] != want;
      members += r[i];
      han_removed += o[i] && han[i];
    }
    EXPECT_EQ(mismatches, 0u) << rewritten;
    EXPECT_GT(members, 10000u);
    EXPECT_GT(han_removed, 10000u) << "Han must be a real subtraction";
  }
  // The built-in pattern uses exactly these classes.
  EXPECT_NE(builtin_pattern("kimi").find(kKimiUpperClass), std::string_view::npos);
  EXPECT_NE(builtin_pattern("kimi").find(kKimiLowerClass), std::string_view::npos);
}

TEST(TokenizerTiktoken, KimiPatternSplitsHanApartAndChunksLongRuns) {
  auto t = Tokenizer::from_tiktoken_file(npm_path("gpt-tokenizer/data/o200k_base.tiktoken"), "kimi");
  ASSERT_TRUE(t.is_ok()) << t.status().message();
  // Han runs are their own pieces under kimi, unlike o200k where "abc中文" may share a piece:
  // encoding the parts separately must give the same ids.
  const std::string s = "Hello世界abc中文def";
  std::vector<int32_t> parts;
  for (const char* p : {"Hello", "世界", "abc", "中文", "def"}) {
    auto v = (*t)->encode(p);
    parts.insert(parts.end(), v.begin(), v.end());
  }
  EXPECT_EQ((*t)->encode(s), parts);
  // A 60,000-space run is cut into 25,000-character runs before the regex.
  const std::string spaces(60000, ' ');
  std::vector<int32_t> expect;
  for (size_t n : {25000u, 25000u, 10000u}) {
    auto v = (*t)->encode(std::string(n, ' '));
    expect.insert(expect.end(), v.begin(), v.end());
  }
  EXPECT_EQ((*t)->encode(spaces), expect);
  std::vector<std::string_view> chunks;  // views into `text`, which must outlive them
  const std::string text = spaces + "x";
  kimi_chunks(text, chunks);
  ASSERT_EQ(chunks.size(), 3u);
  EXPECT_EQ(chunks[0].size(), 25000u);
  EXPECT_EQ(chunks[2], std::string(10000, ' ') + "x");
}

TEST(TokenizerTiktoken, MalformedRankFilesAreErrors) {
  const std::string name = "test.tiktoken";
  std::string good;
  for (int b = 0; b < 256; ++b) {
    static const char* a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    good += std::string{a[b >> 2], a[(b & 3) << 4], '=', '='} + " " + std::to_string(b) + "\n";
  }
  auto ok = Tokenizer::from_tiktoken_text(good + "YWI= 256\n", name, "o200k");
  ASSERT_TRUE(ok.is_ok()) << ok.status().message();
  EXPECT_EQ((*ok)->encode("ab"), std::vector<int32_t>{256});
  const std::pair<std::string, std::string> cases[] = {
      {good + "YWI=\n", ":257: expected"},
      {good + "YWI= x1\n", ":257: invalid rank"},
      {good + "Y!I= 256\n", ":257: invalid base64"},
      {good + "YWI 256\n", ":257: invalid base64"},
      {good + "YWI= 3\n", "duplicate rank 3"},
      {good + "YQ== 300\n", ":257: duplicate token bytes"},
      {good + "YWI= 99999999\n", "too large"},
      {good.substr(0, good.find("YQ==")), "lacks the single-byte token 0x61"},
      {"", "lacks"},
  };
  for (const auto& [text, want] : cases) {
    auto r = Tokenizer::from_tiktoken_text(text, name, "o200k");
    ASSERT_FALSE(r.is_ok()) << want;
    EXPECT_NE(r.status().message().find(want), std::string::npos) << r.status().message();
    EXPECT_EQ(r.status().message().rfind(name, 0), 0u) << r.status().message();
  }
  EXPECT_FALSE(Tokenizer::from_tiktoken_text(good, name, "gpt2").is_ok());
  EXPECT_FALSE(Tokenizer::from_tiktoken_text(good, name, "o200k", {{"<s>", 5}}).is_ok());  // id collision
  EXPECT_FALSE(Tokenizer::from_tiktoken_file("/nonexistent/x.tiktoken", "o200k").is_ok());
}

}  // namespace
}  // namespace mla::tokenizer

namespace mla::tokenizer {
namespace {

// Long pieces (> 128 bytes) take the heap-based merge; check it against a plain re-statement of
// tiktoken's lowest-rank-leftmost merge written here.
std::vector<int32_t> reference_bpe(const std::unordered_map<std::string, int32_t>& ranks, const std::string& s) {
  std::vector<std::string> parts;
  for (char c : s) parts.emplace_back(1, c);
  for (;;) {
    int32_t best = INT32_MAX;
    size_t bi = 0;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      auto it = ranks.find(parts[i] + parts[i + 1]);
      if (it != ranks.end() && it->second < best) {
        best = it->second;
        bi = i;
      }
    }
    if (best == INT32_MAX) break;
    parts[bi] += parts[bi + 1];
    parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(bi) + 1);
  }
  std::vector<int32_t> ids;
  for (const auto& p : parts) ids.push_back(ranks.at(p));
  return ids;
}

TEST(TokenizerTiktoken, LongPieceMergeMatchesReference) {
  const Tokenizer* t = o200k();
  ASSERT_NE(t, nullptr);
  std::unordered_map<std::string, int32_t> ranks;
  for (int32_t id = 0; id < 199998; ++id)
    if (!t->token_bytes(id).empty()) ranks.emplace(std::string(t->token_bytes(id)), id);
  std::mt19937 rng(11);
  for (int k = 0; k < 30; ++k) {
    // One pre-tokenizer piece: a letter run (lowercase with accents) or a whitespace run.
    std::string s;
    const size_t n = 130 + rng() % 400;
    for (size_t i = 0; i < n; ++i) {
      if (k % 3 == 2) s += " \t"[rng() % 2];
      else utf8_append(s, rng() % 5 == 0 ? 0xE0 + rng() % 30 : 'a' + rng() % 26);
    }
    if (k % 3 == 2) s += "\n";  // "\s*[\r\n]+" keeps the run as one piece
    EXPECT_EQ(t->encode(s), reference_bpe(ranks, s)) << k;
  }
}

}  // namespace
}  // namespace mla::tokenizer
