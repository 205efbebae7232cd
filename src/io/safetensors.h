// Safetensors reader: mmap the file read-only and validate the header as strictly as the reference
// implementation (huggingface/safetensors) before handing out zero-copy views. Trade-off: every
// check runs at open (O(header) time and memory), so later views are plain pointer arithmetic.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "core/tensor.h"

namespace mla::io {

// Longest JSON header accepted, as in the reference implementation.
constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;
// Largest tensor accepted: the product of its non-zero dims times the dtype size. Any partial
// product of the shape (strides, numel in either order) then fits in int64 without overflow.
constexpr uint64_t kSafetensorsMaxTensorBytes = uint64_t(1) << 62;

// Bytes of a tensor of `shape` and `dtype`, or nullopt when a dim is negative or the size exceeds
// kSafetensorsMaxTensorBytes. Shared by the reader and the writer so both enforce the same limit.
std::optional<uint64_t> tensor_byte_size(DType dtype, std::span<const int64_t> shape);

struct TensorInfo {
  std::string name;             // key in the header
  DType dtype = DType::F32;     // element type
  std::vector<int64_t> shape;   // any rank; [] is a scalar (1 element); a 0 dim means no bytes
  uint64_t begin = 0;           // byte offset of the first element, relative to the data section
  uint64_t end = 0;             // one past the last byte; end - begin == numel * dtype_size

  int64_t numel() const;
  uint64_t nbytes() const { return end - begin; }
  std::string describe() const;  // e.g. "BF16[3,4]"
};

// The validated content of a header. `tensors` is sorted by (begin, end, name), i.e. in the
// order their bytes appear in the data section; the tensors tile [0, data_size) exactly.
struct ParsedHeader {
  uint64_t header_size = 0;  // N: bytes of JSON (padding included) after the 8-byte length
  uint64_t data_start = 0;   // 8 + N: file offset of the data section
  uint64_t data_size = 0;    // bytes from data_start to the end of the file
  std::vector<TensorInfo> tensors;
  std::map<std::string, std::string> metadata;  // "__metadata__", empty when absent
};

// Validates a whole safetensors file held in memory (the data section is whatever follows the
// header; only its size is used, its bytes are never read). Pure: no I/O. Never throws or aborts.
// Errors are one line: "<file_name_for_errors>: [tensor '<name>': ]<problem>".
Result<ParsedHeader> parse_safetensors_header(std::span<const uint8_t> file_bytes,
                                              const std::string& file_name_for_errors);

// A validated, memory-mapped safetensors file. Move-only; unmaps on destruction, so views taken
// from it must not outlive it. The mapping is read-only (PROT_READ): writing through a view's
// `void* data` faults. Data pointers are only as aligned as the file makes them: the start of the
// data section is 8-aligned in files from the reference writer, but a tensor's begin offset may
// not be a multiple of its dtype size (see `is_aligned`).
class SafetensorsFile {
 public:
  static Result<SafetensorsFile> open(const std::string& path);

  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  uint64_t file_size() const { return map_size_; }
  uint64_t data_size() const { return header_.data_size; }
  // Sorted by data offset (the order of their bytes in the file), not by name.
  const std::vector<TensorInfo>& tensors() const { return header_.tensors; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }

  const TensorInfo* find(const std::string& name) const;
  bool contains(const std::string& name) const { return find(name) != nullptr; }

  // Contiguous view of a tensor of this file. precondition: `info` came from this file's
  // tensors()/find() and has at most kMaxDims dims (checked; use `tensor` for untrusted ranks).
  TensorView view(const TensorInfo& info) const;
  // The checked variant: errors for an unknown name or a rank above kMaxDims.
  Result<TensorView> tensor(const std::string& name) const;
  // Raw bytes of a tensor of this file, any rank.
  std::span<const uint8_t> bytes(const TensorInfo& info) const;
  // True when the tensor's first byte is aligned to its dtype size in memory.
  bool is_aligned(const TensorInfo& info) const;

 private:
  SafetensorsFile() = default;
  void check_owns(const TensorInfo& info) const;
  void unmap();

  std::string path_;
  const uint8_t* map_ = nullptr;  // whole file, PROT_READ; nullptr only when moved-from
  uint64_t map_size_ = 0;
  ParsedHeader header_;
  std::unordered_map<std::string, size_t> by_name_;  // name -> index into header_.tensors
};

}  // namespace mla::io
