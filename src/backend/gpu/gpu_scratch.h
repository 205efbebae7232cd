// Grow-once device scratch (STYLE 5): a buffer sized by the first eager calls that need it and then
// reused. Growing while a graph is recorded would bake a freed pointer into the graph, so it is an
// invariant failure instead.
#pragma once

#include <cstddef>

#include "core/tensor.h"

namespace mla::gpu {

class GpuBackend;

class Scratch {
 public:
  // Device memory of at least `bytes` from `backend`, contents undefined. May reallocate (outside
  // capture only), which invalidates earlier pointers: take all of a call's pointers after growing.
  void* get(GpuBackend& backend, size_t bytes);
  template <typename T> T* get_as(GpuBackend& backend, size_t count) {
    return static_cast<T*>(get(backend, count * sizeof(T)));
  }
  size_t capacity() const { return buf_.size(); }

 private:
  Buffer buf_;
};

}  // namespace mla::gpu
