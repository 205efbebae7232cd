// Byte-level BPE tokenizers: tiktoken rank files (Kimi, o200k, cl100k) and Hugging Face
// tokenizer.json (DeepSeek-V3). One engine serves both: ranks of byte strings (tiktoken) or
// merge priorities of id pairs (HF); pre-tokenization by PCRE2; per-piece results cached.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/status.h"
#include "tokenizer/pretokenizer.h"

namespace mla::tokenizer {

struct EncodeOptions {
  // All: special-token text becomes the special id. None: it is encoded as plain text. Non-special
  // added tokens of a tokenizer.json (HF "added_tokens" with special=false) are matched either way.
  enum class Special { All, None } special = Special::All;
};

// Hashes for string_view keys on heterogeneous lookup (no std::string built per lookup).
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept;
};

class Tokenizer {
 public:
  // Detects `tiktoken.model` (Kimi: pattern kimi, specials from tokenizer_config.json's
  // added_tokens_decoder, 256 slots after the base vocab) or `tokenizer.json`.
  static Result<std::unique_ptr<Tokenizer>> from_model_dir(const std::string& dir);
  // pattern: "kimi" | "o200k" | "cl100k". Special ids must not collide with base ranks.
  static Result<std::unique_ptr<Tokenizer>> from_tiktoken_file(
      const std::string& path, std::string_view pattern, std::vector<std::pair<std::string, int32_t>> specials = {});
  // Parses rank-file text already in memory (`name` appears in errors). Used by the file loader.
  static Result<std::unique_ptr<Tokenizer>> from_tiktoken_text(
      std::string_view text, const std::string& name, std::string_view pattern,
      std::vector<std::pair<std::string, int32_t>> specials = {});
  // tokenizer_config_path may be empty (no bos/eos/chat template then).
  static Result<std::unique_ptr<Tokenizer>> from_tokenizer_json(const std::string& path,
                                                                const std::string& tokenizer_config_path);

  // Invalid UTF-8 in `text` is replaced, per maximal invalid subpart, by U+FFFD first (as Python's
  // errors="replace" does); use try_encode to reject it instead.
  std::vector<int32_t> encode(std::string_view text, const EncodeOptions& options = {}) const;
  Result<std::vector<int32_t>> try_encode(std::string_view text, const EncodeOptions& options = {}) const;
  // Concatenated token bytes; unknown ids contribute nothing. May be invalid UTF-8.
  std::string decode(std::span<const int32_t> ids) const;
  std::string_view token_bytes(int32_t id) const;  // "" for an unknown id
  int32_t vocab_size() const { return static_cast<int32_t>(id_bytes_.size()); }
  std::optional<int32_t> special_token_id(std::string_view text) const;
  std::optional<int32_t> bos_id() const { return bos_id_; }
  std::vector<int32_t> eos_ids() const { return eos_ids_; }
  const std::string& chat_template() const { return chat_template_; }
  bool is_special(int32_t id) const;

  // Internals shared by the loaders (tokenizer_load.cpp); not for other callers.
  struct Literal {
    std::string text;
    int32_t id;
    bool special;  // skipped under Special::None
  };
  Tokenizer();
  ~Tokenizer();

 private:
  friend class TokenizerBuilder;
  void encode_valid(std::string_view text, const EncodeOptions& options, std::vector<int32_t>& out) const;
  void encode_tier(std::string_view text, size_t tier, bool allow_special, std::vector<int32_t>& out) const;
  void encode_ordinary(std::string_view text, std::vector<int32_t>& out) const;
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  void bpe_by_rank(std::string_view piece, std::vector<int32_t>& out) const;
  void bpe_by_rank_long(std::string_view piece, std::vector<int32_t>& out) const;
  static constexpr size_t kLongPiece = 128;  // bytes; above it the heap-based merge wins
  void bpe_by_merges(std::string_view piece, std::vector<int32_t>& out) const;
  int32_t rank_of(std::string_view bytes) const;

  // Literal matching: leftmost position, longest literal there (HF's leftmost-longest).
  struct LiteralTier {
    std::array<bool, 256> first_byte{};
    std::array<std::vector<uint32_t>, 256> by_first;  // indices into entries, longest first
    std::vector<Literal> entries;
  };

  bool by_merges_ = false;                 // HF merges (true) or tiktoken ranks (false)
  std::vector<std::string> id_bytes_;      // id -> raw bytes ("" for holes)
  std::vector<uint8_t> special_;           // id -> is special
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> ranks_;  // base tokens
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;  // (left<<32|right) -> (priority, id)
  std::array<int32_t, 256> byte_id_{};     // single byte -> id; every byte present (checked at load)
  bool ignore_merges_ = false;             // HF BPE: a piece in the vocab is one token
  std::vector<LiteralTier> tiers_;         // HF: non-normalized, then normalized added tokens
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> specials_by_text_;
  PreTokenizer pre_;
  bool kimi_chunking_ = false;            // Kimi wrapper's 400k-char / 25k-run chunking
  std::optional<int32_t> bos_id_;
  std::vector<int32_t> eos_ids_;
  std::string chat_template_;

  // Per-piece cache for pieces that are not a single vocab entry (the slow BPE path). Bounded:
  // cleared when full, which keeps it O(1) and avoids LRU bookkeeping on the hot path.
  static constexpr size_t kCacheMaxEntries = 1 << 16;
  static constexpr size_t kCacheMaxPiece = 128;
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

// Streaming decode: emits text only at UTF-8 character boundaries. Invalid bytes become U+FFFD
// per maximal invalid subpart (as HF / Python "replace" do) instead of being held forever.
class IncrementalDetokenizer {
 public:
  explicit IncrementalDetokenizer(const Tokenizer& tok, bool skip_special = false);
  std::string push(int32_t id);  // newly complete text
  std::string finish();          // whatever remains; an incomplete tail becomes U+FFFD

 private:
  const Tokenizer& tok_;
  bool skip_special_;
  std::string pending_;  // bytes not yet emitted: a (possibly) incomplete UTF-8 sequence
};

}  // namespace mla::tokenizer
