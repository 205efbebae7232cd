// Prefix cache: chained SHA-256 block hashes (checked against Python hashlib digests), salt
// isolation, reference counting against the BlockPool, and LRU eviction of cache-only blocks.
#include <gtest/gtest.h>

#include <numeric>

#include "runtime/prefix_cache.h"

namespace mla::runtime {
namespace {

std::string hex(const BlockHash& h) {
  std::string s;
  for (uint8_t b : h) s += fmt::format("{:02x}", b);
  return s;
}

std::vector<int32_t> iota_tokens(int n, int start = 0) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), start);
  return t;
}

TEST(PrefixCacheHash, MatchesHashlibDigests) {
  // python3: hashlib.sha256(b'mlaserve-prefix-v1').hexdigest()
  const BlockHash root = prefix_root_hash("");
  EXPECT_EQ(hex(root), "af9d1b00cc1b0cc948d6dd44b0bcb8d822cb784e302055a811905b180fe5b7ba");
  // hashlib.sha256(root + struct.pack('<4i', 1, 2, 3, -1)).hexdigest()
  const std::vector<int32_t> ids = {1, 2, 3, -1};
  EXPECT_EQ(hex(prefix_block_hash(root, ids)), "1c83d10f5eafd70b99dba37ee789630baa36d33a21f01ae1aa2122f0f54c04b5");
  // hashlib.sha256(b'mlaserve-prefix-v1tenant-a').hexdigest()
  EXPECT_EQ(hex(prefix_root_hash("tenant-a")), "23c3c6f3490f02a3e8552851773edba184fb6fc78822ab1372fb467a02b8f6b7");
}

TEST(PrefixCacheHash, ChainCoversFullBlocksAndDependsOnEveryEarlierToken) {
  const BlockHash root = prefix_root_hash("");
  const std::vector<int32_t> tokens = iota_tokens(23);  // block 4: 5 full blocks + 3 tokens
  std::vector<BlockHash> all;
  prefix_extend_hashes(all, root, tokens, 4);
  ASSERT_EQ(all.size(), 5u);
  // Incremental extension gives the same chain.
  std::vector<BlockHash> inc;
  for (size_t n = 0; n <= tokens.size(); n += 3)
    prefix_extend_hashes(inc, root, std::span<const int32_t>(tokens).first(n), 4);
  prefix_extend_hashes(inc, root, tokens, 4);
  EXPECT_EQ(inc, all);
  // Chained: block i's hash is over its parent and its own ids.
  EXPECT_EQ(all[2], prefix_block_hash(all[1], std::span<const int32_t>(tokens).subspan(8, 4)));
  // Changing a token in block 1 changes blocks 1.. but not block 0.
  std::vector<int32_t> changed = tokens;
  changed[5] = 999;
  std::vector<BlockHash> other;
  prefix_extend_hashes(other, root, changed, 4);
  EXPECT_EQ(other[0], all[0]);
  for (size_t i = 1; i < all.size(); ++i) EXPECT_NE(other[i], all[i]) << i;
  // Same block contents at another position hash differently (the chain encodes the prefix).
  EXPECT_NE(prefix_block_hash(all[0], std::span<const int32_t>(tokens).first(4)), all[0]);
}

TEST(PrefixCache, SaltIsolatesTenants) {
  BlockPool pool(8);
  PrefixCache cache(pool);
  const std::vector<int32_t> tokens = iota_tokens(8, 100);
  std::vector<BlockHash> a, b, none;
  prefix_extend_hashes(a, prefix_root_hash("tenant-a"), tokens, 4);
  prefix_extend_hashes(b, prefix_root_hash("tenant-b"), tokens, 4);
  prefix_extend_hashes(none, prefix_root_hash(""), tokens, 4);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NE(a[i], b[i]);
    EXPECT_NE(a[i], none[i]);
  }
  for (const BlockHash& h : a) ASSERT_TRUE(cache.insert(h, *pool.allocate()));
  EXPECT_EQ(cache.match(a), 2);
  EXPECT_EQ(cache.match(b), 0);
  EXPECT_EQ(cache.match(none), 0);
}

TEST(PrefixCache, ReferenceCountsAndEvictableSet) {
  BlockPool pool(4);
  PrefixCache cache(pool);
  std::vector<BlockHash> h;
  prefix_extend_hashes(h, prefix_root_hash(""), iota_tokens(8), 4);
  // A sequence computes two blocks and offers them to the cache.
  std::vector<int32_t> seq = {*pool.allocate(), *pool.allocate()};
  EXPECT_TRUE(cache.insert(h[0], seq[0]));
  EXPECT_TRUE(cache.insert(h[1], seq[1]));
  EXPECT_FALSE(cache.insert(h[0], seq[1]));  // a hash keeps its first block
  EXPECT_EQ(pool.ref_count(seq[0]), 2);
  EXPECT_EQ(cache.num_evictable(), 0);
  // A second sequence shares the prefix.
  std::vector<int32_t> seq2;
  cache.acquire(h, 2, seq2, /*queried_tokens=*/9, 4);
  EXPECT_EQ(seq2, seq);
  EXPECT_EQ(pool.ref_count(seq[0]), 3);
  EXPECT_EQ(cache.stats().queried_tokens, 9);
  EXPECT_EQ(cache.stats().hit_tokens, 8);
  for (int32_t b : seq) cache.release(b);
  EXPECT_EQ(cache.num_evictable(), 0);  // seq2 still holds them
  for (int32_t b : seq2) cache.release(b);
  EXPECT_EQ(cache.num_evictable(), 2);
  EXPECT_EQ(pool.ref_count(seq[0]), 1);  // the cache's own reference
  EXPECT_EQ(cache.count_evictable(h, 2), 2);
  EXPECT_EQ(cache.num_available(), 4);
  // Acquiring an evictable block takes it out of the evictable set.
  std::vector<int32_t> seq3;
  cache.acquire(h, 1, seq3, 4, 4);
  EXPECT_EQ(cache.num_evictable(), 1);
  EXPECT_EQ(cache.num_available(), 3);
  cache.release(seq3[0]);
  cache.evict_all();
  EXPECT_EQ(pool.num_free(), 4);
  EXPECT_EQ(cache.num_cached(), 0);
  EXPECT_EQ(cache.match(h), 0);
}

TEST(PrefixCache, EvictsLeastRecentlyUsedWhenThePoolRunsOut) {
  BlockPool pool(3);
  PrefixCache cache(pool);
  std::vector<BlockHash> x, y;
  prefix_extend_hashes(x, prefix_root_hash(""), iota_tokens(8, 0), 4);
  prefix_extend_hashes(y, prefix_root_hash(""), iota_tokens(4, 50), 4);
  // Sequence X holds blocks x0, x1; sequence Y holds y0. Both finish: X first, then Y.
  const int32_t bx0 = *cache.allocate(), bx1 = *cache.allocate(), by0 = *cache.allocate();
  cache.insert(x[0], bx0);
  cache.insert(x[1], bx1);
  cache.insert(y[0], by0);
  EXPECT_FALSE(cache.allocate().has_value());  // pool full, nothing evictable yet
  // Released tail first, as the engine does: x1 becomes older than x0.
  cache.release(bx1);
  cache.release(bx0);
  cache.release(by0);
  EXPECT_EQ(pool.num_free(), 0);
  EXPECT_EQ(cache.num_evictable(), 3);
  // The first allocation evicts x1 (least recently released), keeping the x0 prefix matchable.
  const std::optional<int32_t> a = cache.allocate();
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(*a, bx1);
  EXPECT_EQ(cache.match(x), 1);
  EXPECT_EQ(cache.match(y), 1);
  EXPECT_EQ(cache.stats().evictions, 1);
  // Re-using y0 makes it most recent: the next eviction takes x0.
  std::vector<int32_t> held;
  cache.acquire(y, 1, held, 4, 4);
  cache.release(held[0]);
  EXPECT_EQ(*cache.allocate(), bx0);
  EXPECT_EQ(cache.match(x), 0);
  EXPECT_EQ(*cache.allocate(), by0);
  EXPECT_FALSE(cache.allocate().has_value());  // all three in use by their holders now
  EXPECT_EQ(cache.num_cached(), 0);
}

}  // namespace
}  // namespace mla::runtime
