// Prefix caching over the ref-counted BlockPool: a full block of token ids is named by a chained
// SHA-256 (hash of the parent block's hash, then the block's ids), rooted in an optional per-tenant
// `cache_salt`, so equal prefixes share KV blocks and different tenants never do. The cache holds
// one reference on each block it names; a block whose only reference is the cache's is
// "evictable" and is reused LRU when the pool runs dry. Not thread-safe: owned by the engine thread.
#pragma once

#include <array>
#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "runtime/kv_cache.h"

namespace mla::runtime {

using BlockHash = std::array<uint8_t, 32>;  // SHA-256 digest

struct BlockHashHasher {
  size_t operator()(const BlockHash& h) const noexcept;  // the digest's first 8 bytes
};

// The chain's root: SHA-256("mlaserve-prefix-v1" || salt). Distinct salts give disjoint chains.
BlockHash prefix_root_hash(std::string_view cache_salt);
// SHA-256(parent || ids as little-endian int32). `ids` holds exactly one block's tokens.
BlockHash prefix_block_hash(const BlockHash& parent, std::span<const int32_t> ids);
// Extends `hashes` (the chain of the first hashes.size() full blocks of `tokens`) to cover every
// full block of `tokens`. Incremental: earlier entries are not recomputed.
void prefix_extend_hashes(std::vector<BlockHash>& hashes, const BlockHash& root, std::span<const int32_t> tokens,
                          int block_size);

struct PrefixCacheStats {
  int64_t queried_tokens = 0;  // prompt tokens looked up at admission
  int64_t hit_tokens = 0;      // of those, found cached
  int64_t evictions = 0;
};

class PrefixCache {
 public:
  explicit PrefixCache(BlockPool& pool) : pool_(pool) {}

  // Number of leading hashes that name cached blocks (no state change).
  int match(std::span<const BlockHash> hashes) const;
  // Of the first `n` matched blocks, how many are evictable now (acquiring them would take them
  // out of the evictable set). precondition: n <= match(hashes).
  int count_evictable(std::span<const BlockHash> hashes, int n) const;
  // Takes one pool reference on each of the blocks named by hashes[0, n) (precondition: n <=
  // match(hashes)) and appends their ids to `blocks`. Counts `queried_tokens` / `n * block_size`
  // hit tokens in the stats.
  void acquire(std::span<const BlockHash> hashes, int n, std::vector<int32_t>& blocks, int64_t queried_tokens,
               int block_size);
  // Names `block` (holding the tokens `hash` covers) in the cache, which takes its own reference.
  // A hash already cached keeps its existing block (returns false; `block` stays private).
  bool insert(const BlockHash& hash, int32_t block);
  bool contains_block(int32_t block) const { return hash_of_block_.count(block) != 0; }

  // Drops a sequence's reference on `block` (instead of pool.release): a cached block left with
  // only the cache's reference becomes the most recently used evictable block.
  void release(int32_t block);
  // A free block, evicting the least recently used evictable block when the pool is empty.
  std::optional<int32_t> allocate();
  // Drops every evictable block back to the pool (tests, or a cache reset).
  void evict_all();

  int num_cached() const { return int(block_of_hash_.size()); }
  int num_evictable() const { return int(lru_.size()); }
  // Blocks an allocation can obtain: free in the pool plus evictable.
  int num_available() const { return pool_.num_free() + num_evictable(); }
  const PrefixCacheStats& stats() const { return stats_; }

 private:
  bool evict_one();
  void touch_evictable(int32_t block);  // precondition: cached with ref count 1

  BlockPool& pool_;
  std::unordered_map<BlockHash, int32_t, BlockHashHasher> block_of_hash_;
  std::unordered_map<int32_t, BlockHash> hash_of_block_;
  std::list<int32_t> lru_;  // evictable blocks, least recently used first
  std::unordered_map<int32_t, std::list<int32_t>::iterator> lru_pos_;
  PrefixCacheStats stats_;
};

}  // namespace mla::runtime
