// A model directory's weights as one name -> tensor map: a single model.safetensors, or the
// shards listed by model.safetensors.index.json. Every shard is mmapped and validated at open, so
// a bad checkpoint fails before any weight is used; the cost is one header parse per shard.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "io/safetensors.h"

namespace mla::io {

inline constexpr const char* kSafetensorsIndexName = "model.safetensors.index.json";
inline constexpr const char* kSafetensorsSingleName = "model.safetensors";

class Checkpoint {
 public:
  // Opens `model_dir`. With an index: opens each distinct shard of its weight_map once; rejects
  // shard paths that leave the directory (absolute, "..", or a symlink resolving outside), a
  // weight_map entry whose shard lacks the tensor, and a tensor present in two shards. Tensors a
  // shard holds but the weight_map omits are still served (they are unambiguous).
  static Result<Checkpoint> open(const std::string& model_dir);

  // Errors name the checkpoint directory and the tensor; ranks above kMaxDims are errors too.
  Result<TensorView> get(const std::string& name) const;
  // nullptr when absent; `file`, when given, receives the shard holding the tensor.
  const TensorInfo* find(const std::string& name, const SafetensorsFile** file = nullptr) const;
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  std::vector<std::string> tensor_names() const;  // sorted
  uint64_t total_bytes() const;                   // sum of all tensors' data bytes
  size_t num_tensors() const { return index_.size(); }

  const std::string& dir() const { return dir_; }
  const std::vector<SafetensorsFile>& files() const { return files_; }

 private:
  struct Location {
    uint32_t file;    // index into files_
    uint32_t tensor;  // index into files_[file].tensors()
  };
  std::string dir_;
  std::vector<SafetensorsFile> files_;
  std::unordered_map<std::string, Location> index_;
};

}  // namespace mla::io
