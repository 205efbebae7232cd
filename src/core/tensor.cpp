#include "core/tensor.h"

#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

namespace mla {

TensorView TensorView::contiguous(void* data, DType dtype, const int64_t* dims, int ndim) {
  MLA_CHECK(ndim >= 0 && ndim <= kMaxDims, "ndim {}", ndim);
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.ndim = ndim;
  int64_t s = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    v.shape[size_t(i)] = dims[i];
    v.stride[size_t(i)] = s;
    s *= dims[i];
  }
  return v;
}

TensorView TensorView::contiguous(void* data, DType dtype, std::initializer_list<int64_t> dims) {
  return contiguous(data, dtype, dims.begin(), int(dims.size()));
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[size_t(i)];
  return n;
}

bool TensorView::is_contiguous() const {
  int64_t s = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    if (shape[size_t(i)] != 1 && stride[size_t(i)] != s) return false;
    s *= shape[size_t(i)];
  }
  return true;
}

TensorView TensorView::slice(int d, int64_t start, int64_t len) const {
  MLA_CHECK(d >= 0 && d < ndim && start >= 0 && len >= 0 && start + len <= shape[size_t(d)],
            "slice dim {} [{}, +{}) of {}", d, start, len, describe());
  TensorView v = *this;
  v.data = static_cast<char*>(data) + size_t(start * stride[size_t(d)]) * dtype_size(dtype);
  v.shape[size_t(d)] = len;
  return v;
}

TensorView TensorView::reshape(std::initializer_list<int64_t> dims) const {
  MLA_CHECK(is_contiguous(), "reshape of non-contiguous {}", describe());
  TensorView v = contiguous(data, dtype, dims);
  MLA_CHECK(v.numel() == numel(), "reshape {} to {} elements", describe(), v.numel());
  return v;
}

std::string TensorView::describe() const {
  std::string s = fmt::format("{}[", dtype_name(dtype));
  for (int i = 0; i < ndim; ++i) s += fmt::format("{}{}", i ? "," : "", shape[size_t(i)]);
  return s + "]";
}

bool same_shape(const TensorView& a, const TensorView& b) {
  if (a.dtype != b.dtype || a.ndim != b.ndim) return false;
  for (int i = 0; i < a.ndim; ++i)
    if (a.shape[size_t(i)] != b.shape[size_t(i)]) return false;
  return true;
}

TensorView Buffer::view(DType dtype, std::initializer_list<int64_t> dims) const {
  TensorView v = TensorView::contiguous(ptr_, dtype, dims);
  MLA_CHECK(v.nbytes() <= bytes_, "view {} exceeds buffer of {} bytes", v.describe(), bytes_);
  return v;
}

Buffer host_alloc(size_t bytes) {
  const size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  MLA_CHECK(p != nullptr, "host allocation of {} bytes failed", bytes);
  std::memset(p, 0, rounded == 0 ? 64 : rounded);
  return Buffer(p, bytes, [](void* q) { std::free(q); });
}

}  // namespace mla
