// Non-owning, typed, strided tensor views (up to 4 dims) and the one owning buffer type.
// Views are what every op takes; ownership lives only in `Buffer`, created at start-up (STYLE 5).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <utility>

#include "core/dtype.h"
#include "core/status.h"

namespace mla {

constexpr int kMaxDims = 4;

struct TensorView {
  void* data = nullptr;                 // first element; host or device memory (the op's backend knows)
  DType dtype = DType::F32;             // element type, checked by every op
  int ndim = 0;                         // number of dims in use
  std::array<int64_t, kMaxDims> shape{};   // elements per dim
  std::array<int64_t, kMaxDims> stride{};  // in elements, not bytes

  // A contiguous row-major view.
  static TensorView contiguous(void* data, DType dtype, std::initializer_list<int64_t> dims);
  static TensorView contiguous(void* data, DType dtype, const int64_t* dims, int ndim);

  int64_t numel() const;
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }
  int64_t dim(int i) const { return shape[size_t(i)]; }
  bool is_contiguous() const;
  // True when the last dim has stride 1 (rows may be strided): what most ops need.
  bool inner_contiguous() const { return ndim == 0 || stride[size_t(ndim - 1)] == 1; }

  template <typename T> T* as() const { return static_cast<T*>(data); }
  // Element pointer at a multi-index (missing trailing indices are 0).
  template <typename T> T* at(int64_t i0, int64_t i1 = 0, int64_t i2 = 0, int64_t i3 = 0) const {
    return static_cast<T*>(data) + i0 * stride[0] + i1 * stride[1] + i2 * stride[2] + i3 * stride[3];
  }

  // Sub-range [start, start+len) of dim `d`, same rank.
  TensorView slice(int d, int64_t start, int64_t len) const;
  // Row-major reshape of a contiguous view.
  TensorView reshape(std::initializer_list<int64_t> dims) const;

  std::string describe() const;  // e.g. "F32[3,4]"
};

// True when two views have the same dtype and shape.
bool same_shape(const TensorView& a, const TensorView& b);

// Owning, move-only byte buffer with a backend-provided release function.
class Buffer {
 public:
  using Release = std::function<void(void*)>;
  Buffer() = default;
  Buffer(void* ptr, size_t bytes, Release release) : ptr_(ptr), bytes_(bytes), release_(std::move(release)) {}
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      reset();
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
      release_ = std::move(o.release_);
    }
    return *this;
  }
  ~Buffer() { reset(); }

  void* data() const { return ptr_; }
  size_t size() const { return bytes_; }
  TensorView view(DType dtype, std::initializer_list<int64_t> dims) const;

  void reset() {
    if (ptr_ && release_) release_(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  Release release_;
};

// 64-byte aligned host allocation (zero-initialized).
Buffer host_alloc(size_t bytes);

// A cheap bug catcher for the ops' "must not alias" preconditions (every backend uses it): true when
// both views start at the same address, or both are contiguous and their byte ranges intersect.
// Disjoint strided views of one buffer (e.g. column slices of a shared workspace) are legal and
// are not flagged.
inline bool views_alias(const TensorView& a, const TensorView& b) {
  if (a.numel() == 0 || b.numel() == 0) return false;
  if (a.data == b.data) return true;
  if (!a.is_contiguous() || !b.is_contiguous()) return false;
  const char* a0 = static_cast<const char*>(a.data);
  const char* b0 = static_cast<const char*>(b.data);
  return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

}  // namespace mla
