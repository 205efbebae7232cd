// Streaming safetensors writers: the header is computed from names, dtypes and shapes alone, then
// each tensor's bytes are produced by a caller callback into one of two reused buffers and written
// out by a helper thread while the next tensor is produced, so peak memory is two tensors, never
// the model. Output is written to "<path>.tmp" and renamed into place, so a failed write never
// leaves a truncated file under the final name.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace mla::io {

// Fills a tensor's bytes (row-major, little-endian elements). The span is exactly the tensor's
// size and zeroed on entry; it is only valid during the call.
using TensorFill = std::function<void(std::span<uint8_t>)>;
// Bytes of tensor data written so far and in total (over all files of one write() call). Called
// from a writer thread, never concurrently with itself.
using WriteProgress = std::function<void(uint64_t bytes_done, uint64_t bytes_total)>;

struct PendingTensor {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  TensorFill fill;
  uint64_t nbytes = 0;  // computed by add(); 0 when the shape was invalid (the error is kept)
};

// One .safetensors file. Tensors are laid out in add() order; the JSON header is padded with
// spaces so the data section starts at a multiple of 8 bytes (as the reference writer does).
class SafetensorsWriter {
 public:
  // Invalid input (duplicate or reserved name, negative dim, size overflow) is remembered and
  // reported by write(), so callers can add() unconditionally.
  void add(std::string name, DType dtype, std::vector<int64_t> shape, TensorFill fill);
  void set_metadata(std::map<std::string, std::string> metadata) { metadata_ = std::move(metadata); }
  void set_progress(WriteProgress progress) { progress_ = std::move(progress); }
  uint64_t data_bytes() const;  // sum of the added tensors' sizes

  // Writes the file; calls each fill exactly once, in add() order, on the calling thread.
  Status write(const std::string& path);

 private:
  std::vector<PendingTensor> tensors_;
  std::map<std::string, std::string> metadata_;
  WriteProgress progress_;
  Status error_;  // first add() error
};

// A HF-style sharded checkpoint: greedily packs tensors, in add() order, into shards of at most
// `max_shard_bytes` of tensor data (a single larger tensor gets a shard of its own), and writes
// model-0000i-of-0000N.safetensors plus model.safetensors.index.json, or a lone model.safetensors
// when everything fits in one shard and sharding is not forced.
class ShardedCheckpointWriter {
 public:
  explicit ShardedCheckpointWriter(uint64_t max_shard_bytes, bool force_sharding = false)
      : max_shard_bytes_(max_shard_bytes), force_sharding_(force_sharding) {}

  void add(std::string name, DType dtype, std::vector<int64_t> shape, TensorFill fill);
  // Stored in every shard's __metadata__ (e.g. {"format": "pt"}).
  void set_metadata(std::map<std::string, std::string> metadata) { metadata_ = std::move(metadata); }
  void set_progress(WriteProgress progress) { progress_ = std::move(progress); }

  // Creates `dir` if needed. Removes a stale index (single-file output) or a stale
  // model.safetensors (sharded output) there, since a loader would otherwise pick the wrong one.
  Status write(const std::string& dir);
  // The shard file names of the last successful write(), in order.
  const std::vector<std::string>& written_files() const { return written_files_; }

 private:
  uint64_t max_shard_bytes_;
  bool force_sharding_;
  std::vector<PendingTensor> tensors_;
  std::map<std::string, std::string> metadata_;
  WriteProgress progress_;
  Status error_;
  std::vector<std::string> written_files_;
};

}  // namespace mla::io
