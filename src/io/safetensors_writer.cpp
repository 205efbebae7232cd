// Streaming safetensors writers. Two fill buffers, each sized to the largest tensor it has held,
// alternate: tensor k+1 is generated while a helper thread writes tensor k, so a CPU-bound fill
// (make-model) and the disk overlap; peak memory is two tensors, never the model. Data goes out in
// 64 MiB chunks so progress moves smoothly on multi-GB tensors.
#include "io/safetensors_writer.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <future>
#include <memory>

#include <nlohmann/json.hpp>

#include "io/checkpoint.h"
#include "io/json_strict.h"
#include "io/safetensors.h"

namespace mla::io {

namespace fs = std::filesystem;

namespace {

constexpr size_t kWriteChunk = size_t(64) << 20;

// Reused fill buffer; grows to the largest tensor and never shrinks within one write() call.
struct FillBuffer {
  std::unique_ptr<uint8_t[]> data;
  size_t capacity = 0;
  std::span<uint8_t> get(size_t n) {
    if (n == 0) return {};  // an empty tensor (a buffer never grown is null: memset(nullptr) is UB)
    if (n > capacity) {
      data.reset();  // free first: the old and new buffers need not coexist
      data = std::make_unique_for_overwrite<uint8_t[]>(n);
      capacity = n;
    }
    std::memset(data.get(), 0, n);
    return {data.get(), n};
  }
};
// The pair write_file alternates between (see the file comment).
using FillBuffers = std::array<FillBuffer, 2>;

// An open "<path>.tmp" that is removed unless commit() renames it to `path`.
class TempFile {
 public:
  explicit TempFile(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp") {}
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  ~TempFile() {
    if (f_ != nullptr) std::fclose(f_);
    if (!committed_) std::remove(tmp_.c_str());
  }

  Status open() {
    f_ = std::fopen(tmp_.c_str(), "wb");
    if (f_ == nullptr) return error("{}: cannot create: {}", tmp_, std::strerror(errno));
    return Status::ok();
  }
  Status write(const void* p, size_t n) {
    if (n != 0 && std::fwrite(p, 1, n, f_) != n) return error("{}: write failed: {}", tmp_, std::strerror(errno));
    return Status::ok();
  }
  Status commit() {
    // fsync before rename: a crash must not leave a renamed file whose data never reached disk.
    if (std::fflush(f_) != 0 || ::fsync(fileno(f_)) != 0) {
      return error("{}: flush failed: {}", tmp_, std::strerror(errno));
    }
    const int rc = std::fclose(f_);
    f_ = nullptr;
    if (rc != 0) return error("{}: close failed: {}", tmp_, std::strerror(errno));
    if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
      return error("{}: cannot rename to {}: {}", tmp_, path_, std::strerror(errno));
    }
    committed_ = true;
    return Status::ok();
  }

 private:
  std::string path_;
  std::string tmp_;
  std::FILE* f_ = nullptr;
  bool committed_ = false;
};

PendingTensor make_pending(std::string name, DType dtype, std::vector<int64_t> shape, TensorFill fill, Status& err) {
  PendingTensor t{std::move(name), dtype, std::move(shape), std::move(fill), 0};
  const auto bytes = tensor_byte_size(dtype, t.shape);
  if (!err.is_ok()) return t;  // keep only the first error
  if (t.name == "__metadata__") {
    err = error("tensor name '__metadata__' is reserved for the header's metadata");
  } else if (!bytes) {
    std::string dims;
    for (const int64_t d : t.shape) dims += fmt::format("{}{}", dims.empty() ? "" : ",", d);
    err = error("tensor '{}': shape [{}] has a negative dim or exceeds 2^62 bytes", printable(t.name), dims);
  } else if (!t.fill) {
    err = error("tensor '{}': no fill function", printable(t.name));
  } else {
    t.nbytes = *bytes;
  }
  return t;
}

Status check_unique_names(const std::vector<PendingTensor>& tensors) {
  std::vector<const std::string*> names;
  names.reserve(tensors.size());
  for (const auto& t : tensors) names.push_back(&t.name);
  std::sort(names.begin(), names.end(), [](const std::string* a, const std::string* b) { return *a < *b; });
  for (size_t i = 1; i < names.size(); ++i) {
    if (*names[i] == *names[i - 1]) return error("tensor '{}' added twice", printable(*names[i]));
  }
  return Status::ok();
}

// Writes `tensors` as one file. `done` counts data bytes across calls for progress.
Status write_file(const std::string& path, std::span<PendingTensor> tensors,
                  const std::map<std::string, std::string>& metadata, const WriteProgress& progress, uint64_t& done,
                  uint64_t total, FillBuffers& buffers) {
  // The header text is assembled by hand: nlohmann's ordered_json finds keys by linear search,
  // which is quadratic for the ~100k tensors of a single-file DeepSeek-size checkpoint.
  std::string text = "{";
  try {
    const auto quoted = [](const std::string& s) {
      return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::strict);
    };
    if (!metadata.empty()) {
      text += "\"__metadata__\":";
      text += nlohmann::json(metadata).dump(-1, ' ', false, nlohmann::json::error_handler_t::strict);
    }
    uint64_t offset = 0;
    for (const auto& t : tensors) {
      if (text.size() > 1) text += ',';
      text += quoted(t.name);
      text += fmt::format(":{{\"dtype\":\"{}\",\"shape\":[", dtype_name(t.dtype));
      for (size_t d = 0; d < t.shape.size(); ++d) text += fmt::format("{}{}", d ? "," : "", t.shape[d]);
      text += fmt::format("],\"data_offsets\":[{},{}]}}", offset, offset + t.nbytes);
      offset += t.nbytes;
    }
  } catch (const nlohmann::json::exception&) {
    return error("{}: a tensor name or metadata string is not valid UTF-8", path);
  }
  text += '}';
  // Pad with spaces (allowed trailing JSON whitespace) so the data section is 8-byte aligned.
  text.append((8 - text.size() % 8) % 8, ' ');
  if (text.size() > kSafetensorsMaxHeaderBytes) {
    return error("{}: header of {} bytes exceeds the {}-byte limit readers accept", path, text.size(),
                 kSafetensorsMaxHeaderBytes);
  }

  TempFile out(path);
  MLA_RETURN_IF_ERROR(out.open());
  uint8_t prefix[8];
  for (int i = 0; i < 8; ++i) prefix[i] = uint8_t(uint64_t(text.size()) >> (8 * i));
  MLA_RETURN_IF_ERROR(out.write(prefix, 8));
  MLA_RETURN_IF_ERROR(out.write(text.data(), text.size()));
  // Pipeline: fill tensor k into buffers[k % 2], then wait for tensor k-1's write (which also
  // frees buffers[(k + 1) % 2] for the next fill) and hand tensor k to a writer thread. Fills run
  // on this thread, in add() order, one at a time; `done` and `progress` are touched only by the
  // writer, one write at a time. `pending` is declared after `out`, so an early return joins the
  // write before the file is closed.
  std::future<Status> pending;
  const auto write_tensor = [&out, &done, &progress, total](std::span<const uint8_t> bytes) -> Status {
    for (size_t pos = 0; pos < bytes.size(); pos += kWriteChunk) {
      const size_t n = std::min(kWriteChunk, bytes.size() - pos);
      MLA_RETURN_IF_ERROR(out.write(bytes.data() + pos, n));
      done += n;
      if (progress) progress(done, total);
    }
    return Status::ok();
  };
  for (size_t k = 0; k < tensors.size(); ++k) {
    const std::span<uint8_t> bytes = buffers[k % 2].get(size_t(tensors[k].nbytes));
    tensors[k].fill(bytes);
    if (pending.valid()) MLA_RETURN_IF_ERROR(pending.get());
    pending = std::async(std::launch::async, write_tensor, std::span<const uint8_t>(bytes));
  }
  if (pending.valid()) MLA_RETURN_IF_ERROR(pending.get());
  return out.commit();
}

uint64_t sum_bytes(const std::vector<PendingTensor>& tensors) {
  uint64_t total = 0;
  for (const auto& t : tensors) total += t.nbytes;
  return total;
}

void remove_if_present(const fs::path& p) {
  std::error_code ec;
  fs::remove(p, ec);  // absent is fine; a real failure shows up when the loader sees both files
}

}  // namespace

// ---- SafetensorsWriter -------------------------------------------------------------------------

void SafetensorsWriter::add(std::string name, DType dtype, std::vector<int64_t> shape, TensorFill fill) {
  tensors_.push_back(make_pending(std::move(name), dtype, std::move(shape), std::move(fill), error_));
}

uint64_t SafetensorsWriter::data_bytes() const { return sum_bytes(tensors_); }

Status SafetensorsWriter::write(const std::string& path) {
  if (!error_.is_ok()) return error_.with_context(path);
  MLA_RETURN_IF_ERROR(check_unique_names(tensors_).with_context(path));
  uint64_t done = 0;
  FillBuffers buffers;
  return write_file(path, tensors_, metadata_, progress_, done, data_bytes(), buffers);
}

// ---- ShardedCheckpointWriter -------------------------------------------------------------------

void ShardedCheckpointWriter::add(std::string name, DType dtype, std::vector<int64_t> shape, TensorFill fill) {
  tensors_.push_back(make_pending(std::move(name), dtype, std::move(shape), std::move(fill), error_));
}

Status ShardedCheckpointWriter::write(const std::string& dir) {
  written_files_.clear();
  if (!error_.is_ok()) return error_.with_context(dir);
  MLA_RETURN_IF_ERROR(check_unique_names(tensors_).with_context(dir));
  if (max_shard_bytes_ == 0) return error("{}: max shard size must be positive", dir);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return error("{}: cannot create directory: {}", dir, ec.message());

  // Greedy packing in add() order; shard i holds tensors [starts[i], starts[i+1]).
  std::vector<size_t> starts = {0};
  uint64_t in_shard = 0;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (in_shard > 0 && in_shard + tensors_[i].nbytes > max_shard_bytes_) {
      starts.push_back(i);
      in_shard = 0;
    }
    in_shard += tensors_[i].nbytes;
  }
  starts.push_back(tensors_.size());
  const size_t n_shards = starts.size() - 1;
  if (n_shards > 99999) return error("{}: {} shards exceed the 5-digit shard naming", dir, n_shards);

  const uint64_t total = sum_bytes(tensors_);
  const fs::path base(dir);
  uint64_t done = 0;
  FillBuffers buffers;
  std::span<PendingTensor> all(tensors_);

  if (n_shards == 1 && !force_sharding_) {
    remove_if_present(base / kSafetensorsIndexName);
    MLA_RETURN_IF_ERROR(write_file((base / kSafetensorsSingleName).string(), all, metadata_, progress_, done, total,
                                   buffers));
    written_files_.push_back(kSafetensorsSingleName);
    return Status::ok();
  }

  // std::map-backed json: O(log n) inserts, and HF indexes list weight_map sorted by name too.
  nlohmann::json weight_map = nlohmann::json::object();
  std::vector<std::string> names;
  for (size_t s = 0; s < n_shards; ++s) {
    const std::string file = fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, n_shards);
    const auto shard = all.subspan(starts[s], starts[s + 1] - starts[s]);
    MLA_RETURN_IF_ERROR(write_file((base / file).string(), shard, metadata_, progress_, done, total, buffers));
    for (const auto& t : shard) weight_map[t.name] = file;
    names.push_back(file);
  }
  const nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", std::move(weight_map)}};
  std::string text;
  try {
    text = index.dump(2, ' ', false, nlohmann::json::error_handler_t::strict) + "\n";
  } catch (const nlohmann::json::exception&) {
    return error("{}: a tensor name is not valid UTF-8", dir);
  }
  TempFile out((base / kSafetensorsIndexName).string());
  MLA_RETURN_IF_ERROR(out.open());
  MLA_RETURN_IF_ERROR(out.write(text.data(), text.size()));
  MLA_RETURN_IF_ERROR(out.commit());
  remove_if_present(base / kSafetensorsSingleName);
  written_files_ = std::move(names);
  return Status::ok();
}

}  // namespace mla::io
