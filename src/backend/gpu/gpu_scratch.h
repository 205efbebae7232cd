// Grow-once device scratch (STYLE 5): a buffer sized by the first eager calls that need it and then
// reused. Growing while a graph is recorded is an invariant failure (the graph would record a buffer
// that the same call then outgrows). Growing outside capture retires the old buffer instead of
// freeing it: graphs captured earlier (decode graphs of smaller batches, speculative verification
// graphs) keep replaying on the buffer they recorded, which was large enough for them. Growth is
// geometric, so the retired buffers add at most twice the final size.
#pragma once

#include <cstddef>
#include <vector>

#include "core/tensor.h"

namespace mla::gpu {

class GpuBackend;

class Scratch {
 public:
  // Device memory of at least `bytes` from `backend`, contents undefined. May move to a larger
  // buffer (outside capture only): take all of a call's pointers after growing. Earlier pointers
  // stay valid memory (retired, not freed) but are no longer this scratch's current buffer.
  void* get(GpuBackend& backend, size_t bytes);
  template <typename T> T* get_as(GpuBackend& backend, size_t count) {
    return static_cast<T*>(get(backend, count * sizeof(T)));
  }
  size_t capacity() const { return buf_.size(); }

 private:
  Buffer buf_;
  std::vector<Buffer> retired_;  // outgrown buffers that captured graphs may still use
};

}  // namespace mla::gpu
