// Encode (literal/special split -> pre-tokenize -> BPE per piece), decode and streaming decode.
// BPE is the simple O(n^2)-per-piece lowest-rank-first merge that tiktoken and HF use; pieces are
// short after pre-tokenization, and a piece that is itself a vocab entry never reaches it.
#include "tokenizer/tokenizer.h"

#include <cstring>
#include <functional>
#include <limits>
#include <queue>
#include <tuple>

namespace mla::tokenizer {

size_t StringHash::operator()(std::string_view s) const noexcept {
  // FNV-1a over 8-byte words: faster than std::hash for the short keys here, good enough spread.
  uint64_t h = 0xcbf29ce484222325ULL ^ s.size();
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = (h ^ w) * 0x100000001b3ULL;
    h ^= h >> 29;
  }
  uint64_t tail = 0;
  std::memcpy(&tail, s.data() + i, s.size() - i);
  h = (h ^ tail) * 0x100000001b3ULL;
  h ^= h >> 32;
  return static_cast<size_t>(h);
}

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

namespace {
constexpr int32_t kNoRank = std::numeric_limits<int32_t>::max();
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, const EncodeOptions& options) const {
  std::vector<int32_t> out;
  if (utf8_is_valid(text)) {
    encode_valid(text, options, out);
  } else {
    encode_valid(utf8_make_valid(text), options, out);
  }
  return out;
}

Result<std::vector<int32_t>> Tokenizer::try_encode(std::string_view text, const EncodeOptions& options) const {
  if (!utf8_is_valid(text)) return error("text is not valid UTF-8");
  std::vector<int32_t> out;
  encode_valid(text, options, out);
  return out;
}

void Tokenizer::encode_valid(std::string_view text, const EncodeOptions& options, std::vector<int32_t>& out) const {
  out.reserve(out.size() + text.size() / 3);
  const bool allow_special = options.special == EncodeOptions::Special::All;
  if (kimi_chunking_) {
    std::vector<std::string_view> chunks;
    kimi_chunks(text, chunks);
    for (std::string_view c : chunks) encode_tier(c, 0, allow_special, out);
  } else {
    encode_tier(text, 0, allow_special, out);
  }
}

// Splits `text` on the literals of tier `tier` (leftmost, then longest), recursing into the gaps
// with the next tier; text with no tier left is ordinary text.
void Tokenizer::encode_tier(std::string_view text, size_t tier, bool allow_special, std::vector<int32_t>& out) const {
  if (tier >= tiers_.size()) {
    encode_ordinary(text, out);
    return;
  }
  const LiteralTier& t = tiers_[tier];
  size_t gap = 0;
  for (size_t pos = 0; pos < text.size();) {
    const auto c = static_cast<uint8_t>(text[pos]);
    const Literal* hit = nullptr;
    if (t.first_byte[c]) {
      for (uint32_t idx : t.by_first[c]) {
        const Literal& lit = t.entries[idx];
        if ((allow_special || !lit.special) && text.compare(pos, lit.text.size(), lit.text) == 0) {
          hit = &lit;  // by_first is longest first
          break;
        }
      }
    }
    if (hit == nullptr) {
      ++pos;
      continue;
    }
    if (pos > gap) encode_tier(text.substr(gap, pos - gap), tier + 1, allow_special, out);
    out.push_back(hit->id);
    pos += hit->text.size();
    gap = pos;
  }
  if (gap < text.size()) encode_tier(text.substr(gap), tier + 1, allow_special, out);
}

void Tokenizer::encode_ordinary(std::string_view text, std::vector<int32_t>& out) const {
  std::vector<std::pair<uint32_t, uint32_t>> pieces;
  pieces.reserve(text.size() / 4 + 1);
  pre_.split(text, pieces);
  for (const auto& [b, e] : pieces) encode_piece(text.substr(b, e - b), out);
}

void Tokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (!by_merges_ || ignore_merges_) {
    // Fast path: most pieces are one vocab entry.
    if (auto it = ranks_.find(piece); it != ranks_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (piece.size() == 1) {
    out.push_back(byte_id_[static_cast<uint8_t>(piece[0])]);
    return;
  }
  const bool cacheable = piece.size() <= kCacheMaxPiece;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (auto it = cache_.find(piece); it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t before = out.size();
  if (by_merges_) {
    bpe_by_merges(piece, out);
  } else {
    bpe_by_rank(piece, out);
  }
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (cache_.size() >= kCacheMaxEntries) cache_.clear();
    cache_.emplace(std::string(piece), std::vector<int32_t>(out.begin() + before, out.end()));
  }
}

int32_t Tokenizer::rank_of(std::string_view bytes) const {
  auto it = ranks_.find(bytes);
  return it == ranks_.end() ? kNoRank : it->second;
}

// tiktoken: repeatedly merge the adjacent pair whose concatenation has the lowest rank (leftmost
// on ties). parts[i] = (start offset, rank of bytes[start_i, start_{i+2})).
void Tokenizer::bpe_by_rank(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.size() > kLongPiece) {
    bpe_by_rank_long(piece, out);
    return;
  }
  std::vector<std::pair<uint32_t, int32_t>> parts;
  parts.reserve(piece.size() + 1);
  for (uint32_t i = 0; i <= piece.size(); ++i) parts.emplace_back(i, kNoRank);
  const auto pair_rank = [&](size_t i) {
    // rank of the bytes spanned by parts i and i+1, i.e. [start_i, start_{i+2})
    if (i + 2 >= parts.size()) return kNoRank;
    return rank_of(piece.substr(parts[i].first, parts[i + 2].first - parts[i].first));
  };
  for (size_t i = 0; i + 2 < parts.size(); ++i) parts[i].second = pair_rank(i);
  while (parts.size() > 2) {
    int32_t best = kNoRank;
    size_t bi = 0;
    for (size_t i = 0; i + 1 < parts.size(); ++i)
      if (parts[i].second < best) {
        best = parts[i].second;
        bi = i;
      }
    if (best == kNoRank) break;
    parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(bi) + 1);
    parts[bi].second = pair_rank(bi);
    if (bi > 0) parts[bi - 1].second = pair_rank(bi - 1);
  }
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    const std::string_view tok = piece.substr(parts[i].first, parts[i + 1].first - parts[i].first);
    const int32_t r = rank_of(tok);
    // A part is either one byte (always present, checked at load) or the result of a merge,
    // which by construction has a rank.
    out.push_back(r != kNoRank ? r : byte_id_[static_cast<uint8_t>(tok[0])]);
  }
}

// Same merges as bpe_by_rank in O(n log n) for long pieces (whitespace runs): a min-heap of
// (rank, start, end) candidates over a linked list of parts, with stale entries skipped. Ties
// break on the smaller start, i.e. leftmost, as in the linear scan.
void Tokenizer::bpe_by_rank_long(std::string_view piece, std::vector<int32_t>& out) const {
  const auto n = static_cast<uint32_t>(piece.size());
  std::vector<uint32_t> nxt(n + 1), prv(n + 1);  // parts are identified by their start offset
  for (uint32_t i = 0; i <= n; ++i) {
    nxt[i] = i + 1;
    prv[i] = i == 0 ? 0 : i - 1;
  }
  std::vector<uint8_t> alive(n + 1, 1);
  using Cand = std::tuple<int32_t, uint32_t, uint32_t>;  // (rank, start, end)
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> pq;
  const auto push = [&](uint32_t i) {
    if (i >= n || nxt[i] >= n) return;
    const uint32_t e = nxt[nxt[i]];
    const int32_t r = rank_of(piece.substr(i, e - i));
    if (r != kNoRank) pq.emplace(r, i, e);
  };
  for (uint32_t i = 0; i < n; ++i) push(i);
  while (!pq.empty()) {
    const auto [r, i, e] = pq.top();
    pq.pop();
    if (!alive[i] || nxt[i] >= n || nxt[nxt[i]] != e) continue;  // stale
    alive[nxt[i]] = 0;
    nxt[i] = e;
    prv[e] = i;
    push(i);
    if (i > 0) push(prv[i]);
  }
  for (uint32_t i = 0; i < n; i = nxt[i]) {
    const std::string_view tok = piece.substr(i, nxt[i] - i);
    const int32_t r = rank_of(tok);
    out.push_back(r != kNoRank ? r : byte_id_[static_cast<uint8_t>(tok[0])]);
  }
}

// HF BPE: symbols start as the byte tokens; repeatedly apply the merge with the lowest priority
// among adjacent pairs (leftmost on ties), as tokenizers' Word::merge_all does.
void Tokenizer::bpe_by_merges(std::string_view piece, std::vector<int32_t>& out) const {
  std::vector<int32_t> sym;
  sym.reserve(piece.size());
  for (char c : piece) sym.push_back(byte_id_[static_cast<uint8_t>(c)]);
  std::vector<std::pair<int32_t, int32_t>> pr(sym.size());  // (priority, merged id) for (i, i+1)
  const auto lookup = [&](size_t i) -> std::pair<int32_t, int32_t> {
    if (i + 1 >= sym.size()) return {kNoRank, -1};
    const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(sym[i])) << 32) | static_cast<uint32_t>(sym[i + 1]);
    auto it = merges_.find(key);
    return it == merges_.end() ? std::pair<int32_t, int32_t>{kNoRank, -1} : it->second;
  };
  for (size_t i = 0; i < sym.size(); ++i) pr[i] = lookup(i);
  while (sym.size() > 1) {
    int32_t best = kNoRank;
    size_t bi = 0;
    for (size_t i = 0; i + 1 < sym.size(); ++i)
      if (pr[i].first < best) {
        best = pr[i].first;
        bi = i;
      }
    if (best == kNoRank) break;
    sym[bi] = pr[bi].second;
    sym.erase(sym.begin() + static_cast<std::ptrdiff_t>(bi) + 1);
    pr.erase(pr.begin() + static_cast<std::ptrdiff_t>(bi) + 1);
    pr[bi] = lookup(bi);
    if (bi > 0) pr[bi - 1] = lookup(bi - 1);
  }
  out.insert(out.end(), sym.begin(), sym.end());
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (int32_t id : ids) out.append(token_bytes(id));
  return out;
}

std::string_view Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return id_bytes_[static_cast<size_t>(id)];
}

std::optional<int32_t> Tokenizer::special_token_id(std::string_view text) const {
  auto it = specials_by_text_.find(text);
  if (it == specials_by_text_.end()) return std::nullopt;
  return it->second;
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size() && special_[static_cast<size_t>(id)] != 0;
}

// ---------------------------------------------------------------- IncrementalDetokenizer

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tok, bool skip_special)
    : tok_(tok), skip_special_(skip_special) {}

std::string IncrementalDetokenizer::push(int32_t id) {
  if (skip_special_ && tok_.is_special(id)) return {};
  pending_.append(tok_.token_bytes(id));
  std::string out;
  size_t pos = 0, bad;
  while (pos < pending_.size()) {
    const size_t n = utf8_char_len(pending_, pos, &bad);
    if (n > 0) {
      pos += n;
      continue;
    }
    if (bad == 0) break;  // incomplete tail: wait for more bytes
    out.append(pending_, 0, pos);
    utf8_append(out, 0xFFFD);
    pending_.erase(0, pos + bad);
    pos = 0;
  }
  out.append(pending_, 0, pos);
  pending_.erase(0, pos);
  return out;
}

std::string IncrementalDetokenizer::finish() {
  std::string out = utf8_make_valid(pending_);
  pending_.clear();
  return out;
}

}  // namespace mla::tokenizer
