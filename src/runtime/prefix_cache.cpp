// Chained block hashes (OpenSSL libcrypto's SHA-256) and the evictable-block LRU of the prefix
// cache. Cost: one SHA-256 over 32 + 4 * block_size bytes per full block (~0.3 us at block 16),
// paid once per block as it fills, never per step.
#include "runtime/prefix_cache.h"

#include <openssl/evp.h>

#include <cstring>

#include "core/status.h"

namespace mla::runtime {

namespace {

BlockHash sha256(const uint8_t* data, size_t len) {
  BlockHash out{};
  unsigned int out_len = 0;
  const int ok = EVP_Digest(data, len, out.data(), &out_len, EVP_sha256(), nullptr);
  MLA_CHECK(ok == 1 && out_len == out.size(), "EVP_Digest(sha256) failed");
  return out;
}

}  // namespace

size_t BlockHashHasher::operator()(const BlockHash& h) const noexcept {
  size_t v = 0;
  std::memcpy(&v, h.data(), sizeof(v));
  return v;
}

BlockHash prefix_root_hash(std::string_view cache_salt) {
  static constexpr std::string_view kTag = "mlaserve-prefix-v1";
  std::vector<uint8_t> buf(kTag.begin(), kTag.end());
  buf.insert(buf.end(), cache_salt.begin(), cache_salt.end());
  return sha256(buf.data(), buf.size());
}

BlockHash prefix_block_hash(const BlockHash& parent, std::span<const int32_t> ids) {
  std::vector<uint8_t> buf(parent.size() + 4 * ids.size());
  std::memcpy(buf.data(), parent.data(), parent.size());
  uint8_t* p = buf.data() + parent.size();
  for (int32_t id : ids) {  // little-endian whatever the host, so hashes are portable
    const uint32_t u = uint32_t(id);
    *p++ = uint8_t(u);
    *p++ = uint8_t(u >> 8);
    *p++ = uint8_t(u >> 16);
    *p++ = uint8_t(u >> 24);
  }
  return sha256(buf.data(), buf.size());
}

void prefix_extend_hashes(std::vector<BlockHash>& hashes, const BlockHash& root, std::span<const int32_t> tokens,
                          int block_size) {
  MLA_CHECK(block_size > 0, "block_size {}", block_size);
  const size_t full = tokens.size() / size_t(block_size);
  while (hashes.size() < full) {
    const size_t b = hashes.size();
    const BlockHash& parent = b == 0 ? root : hashes[b - 1];
    hashes.push_back(prefix_block_hash(parent, tokens.subspan(b * size_t(block_size), size_t(block_size))));
  }
}

int PrefixCache::match(std::span<const BlockHash> hashes) const {
  int n = 0;
  for (const BlockHash& h : hashes) {
    if (!block_of_hash_.count(h)) break;
    ++n;
  }
  return n;
}

int PrefixCache::count_evictable(std::span<const BlockHash> hashes, int n) const {
  int count = 0;
  for (int i = 0; i < n; ++i) count += lru_pos_.count(block_of_hash_.at(hashes[size_t(i)])) ? 1 : 0;
  return count;
}

void PrefixCache::acquire(std::span<const BlockHash> hashes, int n, std::vector<int32_t>& blocks,
                          int64_t queried_tokens, int block_size) {
  MLA_CHECK(n >= 0 && size_t(n) <= hashes.size(), "acquire {} of {} hashes", n, hashes.size());
  for (int i = 0; i < n; ++i) {
    const auto it = block_of_hash_.find(hashes[size_t(i)]);
    MLA_CHECK(it != block_of_hash_.end(), "acquire of an uncached block hash (index {})", i);
    const int32_t block = it->second;
    const auto pos = lru_pos_.find(block);
    if (pos != lru_pos_.end()) {  // in use again: no longer evictable
      lru_.erase(pos->second);
      lru_pos_.erase(pos);
    }
    pool_.retain(block);
    blocks.push_back(block);
  }
  stats_.queried_tokens += queried_tokens;
  stats_.hit_tokens += int64_t(n) * block_size;
}

bool PrefixCache::insert(const BlockHash& hash, int32_t block) {
  if (block_of_hash_.count(hash) || hash_of_block_.count(block)) return false;
  pool_.retain(block);
  block_of_hash_.emplace(hash, block);
  hash_of_block_.emplace(block, hash);
  return true;
}

void PrefixCache::touch_evictable(int32_t block) {
  const auto pos = lru_pos_.find(block);
  if (pos != lru_pos_.end()) lru_.erase(pos->second);
  lru_.push_back(block);
  lru_pos_[block] = std::prev(lru_.end());
}

void PrefixCache::release(int32_t block) {
  pool_.release(block);
  if (hash_of_block_.count(block) && pool_.ref_count(block) == 1) touch_evictable(block);
}

bool PrefixCache::evict_one() {
  if (lru_.empty()) return false;
  const int32_t block = lru_.front();
  lru_.pop_front();
  lru_pos_.erase(block);
  const auto h = hash_of_block_.find(block);
  MLA_CHECK(h != hash_of_block_.end() && pool_.ref_count(block) == 1, "evictable block {} not cache-only", block);
  block_of_hash_.erase(h->second);
  hash_of_block_.erase(h);
  pool_.release(block);  // ref count 0: back to the free list
  ++stats_.evictions;
  return true;
}

std::optional<int32_t> PrefixCache::allocate() {
  if (pool_.num_free() == 0 && !evict_one()) return std::nullopt;
  return pool_.allocate();
}

void PrefixCache::evict_all() {
  while (evict_one()) {
  }
}

}  // namespace mla::runtime
