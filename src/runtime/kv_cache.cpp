#include "runtime/kv_cache.h"

#include "core/status.h"

namespace mla::runtime {

BlockPool::BlockPool(int num_blocks) : ref_counts_(size_t(num_blocks), 0) {
  MLA_CHECK(num_blocks >= 0, "num_blocks {}", num_blocks);
  free_.reserve(size_t(num_blocks));
  for (int32_t b = num_blocks - 1; b >= 0; --b) free_.push_back(b);  // block 0 handed out first
}

std::optional<int32_t> BlockPool::allocate() {
  if (free_.empty()) return std::nullopt;
  const int32_t b = free_.back();
  free_.pop_back();
  ref_counts_[size_t(b)] = 1;
  return b;
}

void BlockPool::retain(int32_t block) {
  MLA_CHECK(block >= 0 && block < num_blocks() && ref_counts_[size_t(block)] > 0, "retain of free block {}", block);
  ++ref_counts_[size_t(block)];
}

void BlockPool::release(int32_t block) {
  MLA_CHECK(block >= 0 && block < num_blocks() && ref_counts_[size_t(block)] > 0, "release of free block {}", block);
  if (--ref_counts_[size_t(block)] == 0) free_.push_back(block);
}

int BlockPool::ref_count(int32_t block) const {
  MLA_CHECK(block >= 0 && block < num_blocks(), "block {}", block);
  return ref_counts_[size_t(block)];
}

KvCache::KvCache(ops::Backend& backend, const KvCacheConfig& config)
    : config_(config),
      storage_(backend.alloc(size_t(config.num_layers) * size_t(config.num_blocks) * size_t(config.block_size) *
                             size_t(config.kv_dim) * dtype_size(config.dtype))),
      pool_(config.num_blocks) {
  MLA_CHECK(config.num_layers > 0 && config.num_blocks > 0 && config.block_size > 0 && config.kv_dim > 0,
            "bad KV cache config: layers {} blocks {} block_size {} kv_dim {}", config.num_layers,
            config.num_blocks, config.block_size, config.kv_dim);
  MLA_CHECK(config.dtype == DType::F32 || config.dtype == DType::BF16, "KV cache dtype {} (F32 or BF16)",
            dtype_name(config.dtype));
}

TensorView KvCache::layer(int layer) const {
  MLA_CHECK(layer >= 0 && layer < config_.num_layers, "layer {}", layer);
  const size_t per_layer = size_t(config_.num_blocks) * size_t(config_.block_size) * size_t(config_.kv_dim);
  return TensorView::contiguous(static_cast<char*>(storage_.data()) + per_layer * size_t(layer) * dtype_size(config_.dtype),
                                config_.dtype,
                                {config_.num_blocks, config_.block_size, config_.kv_dim});
}

bool BlockTable::ensure_capacity(BlockPool& pool, int num_tokens, int block_size) {
  const size_t needed = size_t((num_tokens + block_size - 1) / block_size);
  if (needed <= blocks_.size()) return true;
  if (size_t(pool.num_free()) < needed - blocks_.size()) return false;
  while (blocks_.size() < needed) blocks_.push_back(*pool.allocate());
  return true;
}

void BlockTable::release_all(BlockPool& pool) {
  for (int32_t b : blocks_) pool.release(b);
  blocks_.clear();
}

void BlockTable::truncate(BlockPool& pool, int num_tokens, int block_size) {
  const size_t keep = size_t((num_tokens + block_size - 1) / block_size);
  while (blocks_.size() > keep) {
    pool.release(blocks_.back());
    blocks_.pop_back();
  }
}

int32_t BlockTable::slot(int position, int block_size) const {
  const size_t b = size_t(position / block_size);
  MLA_CHECK(position >= 0 && b < blocks_.size(), "position {} beyond {} blocks", position, blocks_.size());
  return blocks_[b] * block_size + position % block_size;
}

}  // namespace mla::runtime
