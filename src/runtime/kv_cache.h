// The paged latent KV cache (ARCHITECTURE rule 5): per MLA layer, [num_blocks, block_size, kv_dim]
// values (kv_dim = kv_lora_rank + qk_rope_head_dim: the normalized latent c_kv, then the rotated
// k_rope), addressed through per-sequence block tables. Blocks are reference counted so prefix
// sharing (serving issue) can hand one block to several sequences. Storage is allocated once.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "core/tensor.h"
#include "ops/backend.h"

namespace mla::runtime {

// Free list + reference counts over block ids [0, num_blocks). Not thread-safe: owned by the
// engine thread.
class BlockPool {
 public:
  explicit BlockPool(int num_blocks);
  int num_blocks() const { return int(ref_counts_.size()); }
  int num_free() const { return int(free_.size()); }
  // A block with reference count 1, or nullopt when none is free.
  std::optional<int32_t> allocate();
  // precondition: `block` is allocated.
  void retain(int32_t block);
  // Drops one reference; the block returns to the free list at zero. precondition: allocated.
  void release(int32_t block);
  int ref_count(int32_t block) const;

 private:
  std::vector<int32_t> free_;        // LIFO, so recently freed (cache-warm) blocks are reused first
  std::vector<int32_t> ref_counts_;  // 0 = free
};

struct KvCacheConfig {
  int num_layers = 0;   // MLA layers holding a cache
  int num_blocks = 0;   // blocks per layer (all layers share block ids)
  int block_size = 16;  // tokens per block
  int kv_dim = 0;       // values per token per layer (576 for DeepSeek-V3 / Kimi K2)
  // Storage dtype of the latents: F32 (the CPU default, exact) or BF16 (the GPU default: half the
  // bytes per decode step; the latent is rounded once when written, attention accumulates in fp32).
  DType dtype = DType::F32;
};

class KvCache {
 public:
  KvCache(ops::Backend& backend, const KvCacheConfig& config);
  const KvCacheConfig& config() const { return config_; }
  int block_size() const { return config_.block_size; }
  // config().dtype [num_blocks, block_size, kv_dim] of layer `layer`.
  TensorView layer(int layer) const;
  BlockPool& pool() { return pool_; }
  const BlockPool& pool() const { return pool_; }
  size_t bytes() const { return storage_.size(); }

 private:
  KvCacheConfig config_;
  Buffer storage_;  // all layers, contiguous: [num_layers, num_blocks, block_size, kv_dim]
  BlockPool pool_;
};

// The blocks of one sequence, in position order: token at position p lives in
// blocks[p / block_size] at offset p % block_size.
class BlockTable {
 public:
  const std::vector<int32_t>& blocks() const { return blocks_; }
  // Grows the table so it covers `num_tokens` positions. All-or-nothing: on failure (pool
  // exhausted) nothing is allocated and false is returned.
  bool ensure_capacity(BlockPool& pool, int num_tokens, int block_size);
  // Releases every block (the sequence finished or was preempted).
  void release_all(BlockPool& pool);
  // Drops blocks beyond those needed for `num_tokens` positions (speculative rollback).
  void truncate(BlockPool& pool, int num_tokens, int block_size);
  int32_t slot(int position, int block_size) const;

 private:
  std::vector<int32_t> blocks_;
};

}  // namespace mla::runtime
