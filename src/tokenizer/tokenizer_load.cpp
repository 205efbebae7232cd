// Loading tokenizers from untrusted files: tiktoken rank files, HF tokenizer.json (+ config) and
// model directories. Everything unsupported is rejected by name rather than approximated, since a
// silently different tokenizer degrades every answer.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include "io/json_strict.h"
#include "tokenizer/tokenizer.h"

namespace mla::tokenizer {

using nlohmann::json;

namespace {

constexpr int64_t kMaxId = 1 << 24;  // bounds vocab allocation for hostile files

Result<std::string> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return error("{}: cannot open", path);
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) return error("{}: read error", path);
  return ss.str();
}

// Strict standard base64 (RFC 4648 with padding), as tiktoken files use.
bool base64_decode(std::string_view in, std::string& out) {
  static const auto table = [] {
    std::array<int8_t, 256> t{};
    t.fill(-1);
    const char* a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int i = 0; i < 64; ++i) t[static_cast<uint8_t>(a[i])] = static_cast<int8_t>(i);
    return t;
  }();
  out.clear();
  if (in.empty() || in.size() % 4 != 0) return false;
  for (size_t i = 0; i < in.size(); i += 4) {
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = in[i + static_cast<size_t>(k)];
      if (c == '=') {
        if (i + 4 != in.size() || k < 2) return false;
        v[k] = 0;
        ++pad;
      } else {
        if (pad > 0) return false;  // data after padding
        v[k] = table[static_cast<uint8_t>(c)];
        if (v[k] < 0) return false;
      }
    }
    const uint32_t w = (uint32_t(v[0]) << 18) | (uint32_t(v[1]) << 12) | (uint32_t(v[2]) << 6) | uint32_t(v[3]);
    out += static_cast<char>(w >> 16);
    if (pad < 2) out += static_cast<char>((w >> 8) & 0xFF);
    if (pad < 1) out += static_cast<char>(w & 0xFF);
  }
  return true;
}

// GPT-2's byte <-> printable-character map used by byte-level BPE vocabularies.
const std::array<uint32_t, 256>& byte_to_cp() {
  static const auto m = [] {
    std::array<uint32_t, 256> t{};
    uint32_t n = 0;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      t[b] = printable ? b : 256 + n++;
    }
    return t;
  }();
  return m;
}

// Byte-level decoded bytes of a vocab string; false if a character is outside the map.
bool byte_level_decode(std::string_view s, std::string& out) {
  static const auto inv = [] {
    std::array<int16_t, 324> t{};
    t.fill(-1);
    for (uint32_t b = 0; b < 256; ++b) t[byte_to_cp()[b]] = static_cast<int16_t>(b);
    return t;
  }();
  out.clear();
  size_t pos = 0, bad;
  while (pos < s.size()) {
    const size_t n = utf8_char_len(s, pos, &bad);
    if (n == 0) return false;
    uint32_t cp;
    const auto u = [&](size_t i) { return static_cast<uint32_t>(static_cast<uint8_t>(s[pos + i])); };
    if (n == 1) cp = u(0);
    else if (n == 2) cp = ((u(0) & 0x1F) << 6) | (u(1) & 0x3F);
    else return false;  // every mapped character is below U+0800
    if (cp >= inv.size() || inv[cp] < 0) return false;
    out += static_cast<char>(inv[cp]);
    pos += n;
  }
  return true;
}

}  // namespace

// Fills the derived tables of a Tokenizer once its vocabulary is known.
class TokenizerBuilder {
 public:
  static Status finish(Tokenizer& t, std::vector<std::vector<Tokenizer::Literal>> tiers, const std::string& name) {
    for (auto& entries : tiers) {
      if (entries.empty()) continue;
      Tokenizer::LiteralTier tier;
      tier.entries = std::move(entries);
      for (uint32_t i = 0; i < tier.entries.size(); ++i) {
        const auto c = static_cast<uint8_t>(tier.entries[i].text[0]);
        tier.first_byte[c] = true;
        tier.by_first[c].push_back(i);
      }
      for (auto& v : tier.by_first)
        std::stable_sort(v.begin(), v.end(), [&](uint32_t a, uint32_t b) {
          return tier.entries[a].text.size() > tier.entries[b].text.size();
        });
      t.tiers_.push_back(std::move(tier));
    }
    t.special_.assign(t.id_bytes_.size(), 0);
    for (const auto& tier : t.tiers_)
      for (const auto& lit : tier.entries)
        if (lit.special) t.special_[static_cast<size_t>(lit.id)] = 1;
    if (t.id_bytes_.empty()) return error("{}: empty vocabulary", name);
    return Status::ok();
  }

  static Status set_byte_ids(Tokenizer& t, const std::string& name) {
    for (int b = 0; b < 256; ++b) {
      const std::string key(1, static_cast<char>(b));
      auto it = t.ranks_.find(key);
      if (it == t.ranks_.end()) return error("{}: vocabulary lacks the single-byte token 0x{:02x}", name, b);
      t.byte_id_[static_cast<size_t>(b)] = it->second;
    }
    return Status::ok();
  }

  static Result<std::unique_ptr<Tokenizer>> tiktoken(std::string_view text, const std::string& name,
                                                     std::string_view pattern,
                                                     std::vector<std::pair<std::string, int32_t>> specials) {
    auto t = std::make_unique<Tokenizer>();
    const std::string_view pat = builtin_pattern(pattern);
    if (pat.empty()) return error("unknown pre-tokenization pattern '{}' (expected kimi, o200k or cl100k)", pattern);
    MLA_ASSIGN_OR_RETURN(auto re, Regex::compile(pat));
    std::vector<std::unique_ptr<Regex>> stages;
    stages.push_back(std::move(re));
    t->pre_.set(PreTokenizer::Mode::FindAll, std::move(stages));
    t->kimi_chunking_ = pattern == "kimi";

    std::string bytes;
    size_t line_no = 0, pos = 0;
    int64_t max_id = -1;
    std::vector<std::pair<int32_t, std::string>> entries;
    while (pos < text.size()) {
      size_t eol = text.find('\n', pos);
      if (eol == std::string_view::npos) eol = text.size();
      std::string_view line = text.substr(pos, eol - pos);
      pos = eol + 1;
      ++line_no;
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line.empty()) continue;
      const size_t sp = line.find(' ');
      if (sp == std::string_view::npos || line.find(' ', sp + 1) != std::string_view::npos)
        return error("{}:{}: expected 'BASE64 RANK'", name, line_no);
      if (!base64_decode(line.substr(0, sp), bytes)) return error("{}:{}: invalid base64 token", name, line_no);
      const std::string_view num = line.substr(sp + 1);
      int64_t rank = 0;
      if (num.empty() || num.size() > 9) return error("{}:{}: invalid rank", name, line_no);
      for (char c : num) {
        if (c < '0' || c > '9') return error("{}:{}: invalid rank", name, line_no);
        rank = rank * 10 + (c - '0');
      }
      if (rank >= kMaxId) return error("{}:{}: rank {} too large", name, line_no, rank);
      if (!t->ranks_.emplace(bytes, static_cast<int32_t>(rank)).second)
        return error("{}:{}: duplicate token bytes", name, line_no);
      entries.emplace_back(static_cast<int32_t>(rank), bytes);
      max_id = std::max(max_id, rank);
    }
    for (const auto& [s, id] : specials) max_id = std::max<int64_t>(max_id, id);
    if (max_id >= kMaxId) return error("{}: special id too large", name);
    t->id_bytes_.assign(static_cast<size_t>(max_id + 1), std::string());
    std::vector<uint8_t> used(t->id_bytes_.size(), 0);
    for (auto& [rank, b] : entries) {
      if (used[static_cast<size_t>(rank)]) return error("{}: duplicate rank {}", name, rank);
      used[static_cast<size_t>(rank)] = 1;
      t->id_bytes_[static_cast<size_t>(rank)] = std::move(b);
    }
    MLA_RETURN_IF_ERROR(set_byte_ids(*t, name));
    std::vector<Tokenizer::Literal> lits;
    for (auto& [s, id] : specials) {
      if (id < 0) return error("{}: special token '{}' has negative id", name, io::printable(s));
      if (s.empty() || !utf8_is_valid(s)) return error("{}: special token with id {} is empty or not UTF-8", name, id);
      if (used[static_cast<size_t>(id)]) return error("{}: special token '{}' reuses id {}", name, io::printable(s), id);
      used[static_cast<size_t>(id)] = 1;
      t->id_bytes_[static_cast<size_t>(id)] = s;
      if (!t->specials_by_text_.emplace(s, id).second)
        return error("{}: duplicate special token '{}'", name, io::printable(s));
      lits.push_back({s, id, true});
    }
    std::vector<std::vector<Tokenizer::Literal>> tiers;
    tiers.push_back(std::move(lits));
    MLA_RETURN_IF_ERROR(finish(*t, std::move(tiers), name));
    return t;
  }

  static Result<std::unique_ptr<Tokenizer>> hf(const std::string& path, const std::string& config_path);
  static Status apply_config(Tokenizer& t, const std::string& config_path);
};

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_tiktoken_text(std::string_view text, const std::string& name,
                                                                 std::string_view pattern,
                                                                 std::vector<std::pair<std::string, int32_t>> specials) {
  return TokenizerBuilder::tiktoken(text, name, pattern, std::move(specials));
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_tiktoken_file(const std::string& path, std::string_view pattern,
                                                                 std::vector<std::pair<std::string, int32_t>> specials) {
  MLA_ASSIGN_OR_RETURN(std::string text, read_file(path));
  return TokenizerBuilder::tiktoken(text, path, pattern, std::move(specials));
}

namespace {

Result<json> load_json(const std::string& path) {
  MLA_ASSIGN_OR_RETURN(std::string text, read_file(path));
  auto j = io::parse_json_strict(text);
  if (!j) return j.status().with_context(path);
  return std::move(j).value();
}

// "type" of a JSON object, or "" when absent / not an object.
std::string type_of(const json& j) {
  if (!j.is_object()) return "";
  auto it = j.find("type");
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

bool is_null_or(const json& j, const char* key, const json& allowed) {
  auto it = j.find(key);
  return it == j.end() || it->is_null() || *it == allowed;
}

// Regex pattern of an HF Split: {"Regex": "..."} or {"String": "..."} (escaped literal).
Result<std::string> split_pattern(const json& step, const std::string& where) {
  auto it = step.find("pattern");
  if (it == step.end() || !it->is_object()) return error("{}: missing pattern", where);
  if (auto r = it->find("Regex"); r != it->end() && r->is_string()) return r->get<std::string>();
  if (auto s = it->find("String"); s != it->end() && s->is_string()) return "\\Q" + s->get<std::string>() + "\\E";
  return error("{}: pattern must be {{\"Regex\": ...}} or {{\"String\": ...}}", where);
}

std::string token_content(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object()) {
    auto it = j.find("content");
    if (it != j.end() && it->is_string()) return it->get<std::string>();
  }
  return "";
}

}  // namespace

Status TokenizerBuilder::apply_config(Tokenizer& t, const std::string& config_path) {
  MLA_ASSIGN_OR_RETURN(json cfg, load_json(config_path));
  if (!cfg.is_object()) return error("{}: top level is not an object", config_path);
  const auto id_of = [&](const std::string& text) -> std::optional<int32_t> {
    if (auto s = t.special_token_id(text)) return s;
    auto it = t.ranks_.find(text);
    if (it != t.ranks_.end()) return it->second;
    return std::nullopt;
  };
  if (auto it = cfg.find("bos_token"); it != cfg.end() && !it->is_null()) {
    const std::string s = token_content(*it);
    if (s.empty()) return error("{}: key bos_token: expected a string or {{\"content\": ...}}", config_path);
    t.bos_id_ = id_of(s);
    if (!t.bos_id_) return error("{}: key bos_token: '{}' is not in the vocabulary", config_path, io::printable(s));
  }
  if (auto it = cfg.find("eos_token"); it != cfg.end() && !it->is_null()) {
    const std::string s = token_content(*it);
    if (s.empty()) return error("{}: key eos_token: expected a string or {{\"content\": ...}}", config_path);
    auto id = id_of(s);
    if (!id) return error("{}: key eos_token: '{}' is not in the vocabulary", config_path, io::printable(s));
    t.eos_ids_.push_back(*id);
  }
  if (auto it = cfg.find("chat_template"); it != cfg.end() && !it->is_null()) {
    if (it->is_string()) {
      t.chat_template_ = it->get<std::string>();
    } else if (it->is_array()) {  // [{"name": "default", "template": ...}, ...]
      for (const json& e : *it)
        if (e.is_object() && e.value("name", json()).is_string() && e["name"] == "default" &&
            e.value("template", json()).is_string())
          t.chat_template_ = e["template"].get<std::string>();
      if (t.chat_template_.empty()) return error("{}: key chat_template: no 'default' template", config_path);
    } else {
      return error("{}: key chat_template: expected a string or a list", config_path);
    }
  }
  return Status::ok();
}

Result<std::unique_ptr<Tokenizer>> TokenizerBuilder::hf(const std::string& path, const std::string& config_path) {
  MLA_ASSIGN_OR_RETURN(json j, load_json(path));
  if (!j.is_object()) return error("{}: top level is not an object", path);
  auto t = std::make_unique<Tokenizer>();
  t->by_merges_ = true;

  // normalizer: none, or an empty Sequence.
  if (auto it = j.find("normalizer"); it != j.end() && !it->is_null()) {
    const bool empty_seq = type_of(*it) == "Sequence" && it->value("normalizers", json::array()).empty();
    if (!empty_seq) return error("{}: key normalizer: type '{}' is not supported", path, type_of(*it));
  }
  // pre_tokenizer: Split(Isolated, invert=false) steps and ByteLevel(use_regex=false), alone or
  // in a Sequence.
  std::vector<std::unique_ptr<Regex>> stages;
  {
    auto it = j.find("pre_tokenizer");
    if (it == j.end() || !it->is_object()) return error("{}: key pre_tokenizer: missing", path);
    std::vector<json> steps;
    if (type_of(*it) == "Sequence") {
      auto s = it->find("pretokenizers");
      if (s == it->end() || !s->is_array()) return error("{}: key pre_tokenizer.pretokenizers: missing", path);
      steps.assign(s->begin(), s->end());
    } else {
      steps.push_back(*it);
    }
    bool byte_level = false;
    for (size_t i = 0; i < steps.size(); ++i) {
      const json& st = steps[i];
      const std::string where = fmt::format("{}: key pre_tokenizer[{}]", path, i);
      const std::string type = type_of(st);
      if (type == "Split") {
        if (st.value("behavior", json()) != "Isolated")
          return error("{}: Split behavior '{}' is not supported (only Isolated)", where,
                       io::json_brief(st.value("behavior", json())));
        if (!is_null_or(st, "invert", false)) return error("{}: Split with invert=true is not supported", where);
        if (byte_level) return error("{}: Split after ByteLevel is not supported", where);
        MLA_ASSIGN_OR_RETURN(std::string pat, split_pattern(st, where));
        auto re = Regex::compile(pat);
        if (!re) return re.status().with_context(where);
        stages.push_back(std::move(re).value());
      } else if (type == "ByteLevel") {
        if (!is_null_or(st, "use_regex", false))
          return error("{}: ByteLevel with use_regex=true is not supported", where);
        if (!is_null_or(st, "add_prefix_space", false))
          return error("{}: ByteLevel with add_prefix_space=true is not supported", where);
        byte_level = true;
      } else {
        return error("{}: pre-tokenizer type '{}' is not supported", where, io::printable(type));
      }
    }
    if (!byte_level) return error("{}: key pre_tokenizer: no ByteLevel step (only byte-level BPE is supported)", path);
  }
  t->pre_.set(PreTokenizer::Mode::SplitIsolated, std::move(stages));
  if (auto it = j.find("decoder"); it != j.end() && !it->is_null() && type_of(*it) != "ByteLevel")
    return error("{}: key decoder: type '{}' is not supported", path, io::printable(type_of(*it)));

  // model: BPE.
  auto mit = j.find("model");
  if (mit == j.end() || type_of(*mit) != "BPE") return error("{}: key model: only type BPE is supported", path);
  const json& m = *mit;
  if (!is_null_or(m, "dropout", json()) && !is_null_or(m, "dropout", 0.0))
    return error("{}: key model.dropout is not supported", path);
  if (!is_null_or(m, "byte_fallback", false)) return error("{}: key model.byte_fallback is not supported", path);
  if (!is_null_or(m, "continuing_subword_prefix", "")) return error("{}: key model.continuing_subword_prefix is not supported", path);
  if (!is_null_or(m, "end_of_word_suffix", "")) return error("{}: key model.end_of_word_suffix is not supported", path);
  if (auto it = m.find("ignore_merges"); it != m.end() && it->is_boolean()) t->ignore_merges_ = it->get<bool>();
  auto vit = m.find("vocab");
  if (vit == m.end() || !vit->is_object()) return error("{}: key model.vocab: missing", path);
  std::unordered_map<std::string, int32_t> vocab;  // vocab string (byte-level chars) -> id
  std::vector<std::pair<int32_t, std::string>> raw_vocab;
  int64_t max_id = -1;
  std::string bytes;
  std::unordered_map<int32_t, std::string> key_by_id;  // an id shared by two entries could not decode both
  for (auto it = vit->begin(); it != vit->end(); ++it) {
    if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() >= kMaxId)
      return error("{}: key model.vocab[\"{}\"]: id must be an integer in [0, {})", path, io::printable(it.key()), kMaxId);
    const auto id = static_cast<int32_t>(it->get<int64_t>());
    if (!vocab.emplace(it.key(), id).second)
      return error("{}: key model.vocab[\"{}\"]: duplicate", path, io::printable(it.key()));
    if (!key_by_id.emplace(id, it.key()).second)
      return error("{}: key model.vocab[\"{}\"]: id {} is used by another entry", path, io::printable(it.key()), id);
    max_id = std::max<int64_t>(max_id, id);
    // Entries outside the byte map (DeepSeek lists its added tokens here too) keep their raw
    // text, as HF's ByteLevel decoder does; they cannot come out of byte-level BPE directly.
    if (!byte_level_decode(it.key(), bytes)) {
      raw_vocab.emplace_back(id, it.key());
      continue;
    }
    if (!t->ranks_.emplace(bytes, id).second)
      return error("{}: key model.vocab[\"{}\"]: duplicate token bytes", path, io::printable(it.key()));
  }
  // added_tokens
  std::vector<std::vector<Tokenizer::Literal>> tiers(2);  // non-normalized, then normalized
  std::vector<std::pair<int32_t, std::string>> added;
  if (auto at = j.find("added_tokens"); at != j.end() && !at->is_null()) {
    if (!at->is_array()) return error("{}: key added_tokens: expected a list", path);
    for (size_t i = 0; i < at->size(); ++i) {
      const json& a = (*at)[i];
      const std::string where = fmt::format("{}: key added_tokens[{}]", path, i);
      if (!a.is_object() || !a.value("id", json()).is_number_integer() || !a.value("content", json()).is_string())
        return error("{}: expected {{\"id\": int, \"content\": string, ...}}", where);
      const int64_t id = a["id"].get<int64_t>();
      const std::string content = a["content"].get<std::string>();
      if (id < 0 || id >= kMaxId) return error("{}: id out of range", where);
      if (content.empty()) return error("{}: empty content", where);
      for (const char* k : {"lstrip", "rstrip", "single_word"})
        if (!is_null_or(a, k, false)) return error("{}: {}=true is not supported", where, k);
      const bool special = a.value("special", json(false)) == true;
      const bool normalized = a.value("normalized", json(!special)) == true;
      tiers[normalized ? 1 : 0].push_back({content, static_cast<int32_t>(id), special});
      if (!t->specials_by_text_.emplace(content, static_cast<int32_t>(id)).second)
        return error("{}: duplicate content", where);
      // DeepSeek also lists its added tokens in model.vocab, under the same id and text. An id
      // that names different text in the two places (or in two added tokens) could not decode
      // to both: BPE output of that id would decode as the added token's text.
      if (auto [k, fresh] = key_by_id.emplace(static_cast<int32_t>(id), content); !fresh && k->second != content)
        return error("{}: id {} is \"{}\" in model.vocab or an earlier added token", where, id, io::printable(k->second));
      added.emplace_back(static_cast<int32_t>(id), content);
      max_id = std::max(max_id, id);
    }
  }
  t->id_bytes_.assign(static_cast<size_t>(max_id + 1), std::string());
  for (const auto& [bytes_key, id] : t->ranks_) t->id_bytes_[static_cast<size_t>(id)] = bytes_key;
  for (const auto& [id, text] : raw_vocab) t->id_bytes_[static_cast<size_t>(id)] = text;
  for (const auto& [id, content] : added) {
    // HF's ByteLevel decoder maps a token's characters back to bytes when all are in the byte
    // map, and keeps the raw text otherwise.
    std::string b;
    t->id_bytes_[static_cast<size_t>(id)] = byte_level_decode(content, b) ? b : content;
  }
  MLA_RETURN_IF_ERROR(set_byte_ids(*t, path));

  // merges: "a b" strings or [a, b] pairs; priority = position.
  auto mg = m.find("merges");
  if (mg == m.end() || !mg->is_array()) return error("{}: key model.merges: missing", path);
  for (size_t i = 0; i < mg->size(); ++i) {
    const json& e = (*mg)[i];
    std::string a, b;
    if (e.is_string()) {
      const std::string s = e.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        return error("{}: key model.merges[{}]: expected 'A B'", path, i);
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      return error("{}: key model.merges[{}]: expected 'A B' or [A, B]", path, i);
    }
    auto ia = vocab.find(a), ib = vocab.find(b), im = vocab.find(a + b);
    if (ia == vocab.end() || ib == vocab.end() || im == vocab.end())
      return error("{}: key model.merges[{}]: token not in vocab", path, i);
    const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(ia->second)) << 32) | static_cast<uint32_t>(ib->second);
    t->merges_.emplace(key, std::pair<int32_t, int32_t>{static_cast<int32_t>(i), im->second});  // first wins
  }
  MLA_RETURN_IF_ERROR(finish(*t, std::move(tiers), path));
  if (!config_path.empty()) MLA_RETURN_IF_ERROR(apply_config(*t, config_path));
  return t;
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_tokenizer_json(const std::string& path,
                                                                  const std::string& tokenizer_config_path) {
  return TokenizerBuilder::hf(path, tokenizer_config_path);
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_model_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path d(dir);
  const std::string config = (d / "tokenizer_config.json").string();
  const bool has_config = fs::exists(config);
  std::unique_ptr<Tokenizer> t;
  if (fs::exists(d / "tiktoken.model")) {
    const std::string model = (d / "tiktoken.model").string();
    MLA_ASSIGN_OR_RETURN(std::string text, read_file(model));
    // Kimi: 256 special slots after the base vocabulary, named by added_tokens_decoder.
    int64_t num_base = 0;  // len(mergeable_ranks): the non-empty lines
    for (size_t pos = 0; pos < text.size();) {
      size_t eol = std::min(text.find('\n', pos), text.size());
      if (eol > pos && !(eol == pos + 1 && text[pos] == '\r')) ++num_base;
      pos = eol + 1;
    }
    std::vector<std::pair<std::string, int32_t>> specials;
    std::unordered_map<int64_t, std::string> names;
    if (has_config) {
      MLA_ASSIGN_OR_RETURN(json cfg, load_json(config));
      if (auto it = cfg.find("added_tokens_decoder"); cfg.is_object() && it != cfg.end() && it->is_object())
        for (auto e = it->begin(); e != it->end(); ++e) {
          const std::string s = token_content(*e);
          int64_t id = -1;
          if (e.key().size() <= 9 && !e.key().empty() && std::all_of(e.key().begin(), e.key().end(), [](char c) { return c >= '0' && c <= '9'; }))
            id = std::stoll(e.key());
          if (id < 0 || s.empty()) return error("{}: key added_tokens_decoder[\"{}\"]: bad entry", config, io::printable(e.key()));
          names[id] = s;
        }
    }
    for (int64_t id = num_base; id < num_base + 256; ++id) {
      auto it = names.find(id);
      specials.emplace_back(it != names.end() ? it->second : fmt::format("<|reserved_token_{}|>", id),
                            static_cast<int32_t>(id));
    }
    MLA_ASSIGN_OR_RETURN(t, TokenizerBuilder::tiktoken(text, model, "kimi", std::move(specials)));
    if (has_config) MLA_RETURN_IF_ERROR(TokenizerBuilder::apply_config(*t, config));
  } else if (fs::exists(d / "tokenizer.json")) {
    MLA_ASSIGN_OR_RETURN(t, TokenizerBuilder::hf((d / "tokenizer.json").string(), has_config ? config : ""));
  } else {
    return error("{}: neither tiktoken.model nor tokenizer.json found", dir);
  }
  // generation_config.json's eos_token_id (int or list) adds stop ids (e.g. <|im_end|>).
  const std::string gen = (d / "generation_config.json").string();
  if (fs::exists(gen)) {
    MLA_ASSIGN_OR_RETURN(json g, load_json(gen));
    if (auto it = g.find("eos_token_id"); g.is_object() && it != g.end()) {
      std::vector<json> ids = it->is_array() ? std::vector<json>(it->begin(), it->end()) : std::vector<json>{*it};
      for (const json& v : ids) {
        if (!v.is_number_integer()) return error("{}: key eos_token_id: expected integers", gen);
        const auto id = static_cast<int32_t>(v.get<int64_t>());
        if (std::find(t->eos_ids_.begin(), t->eos_ids_.end(), id) == t->eos_ids_.end()) t->eos_ids_.push_back(id);
      }
    }
  }
  return t;
}

}  // namespace mla::tokenizer
