// Grow-once scratch and cached plans of the sampling op group (owned by GpuBackend, one per backend).
#pragma once

#include "backend/gpu/gpu_scratch.h"

namespace mla::gpu {

struct SamplingState {
  // argmax's per-row packed-max slots and ticket counters. Invariant: all zero between calls (alloc
  // zero-fills; each row's last block resets its pair), so nothing else may use this buffer.
  Scratch argmax_slots;
};

}  // namespace mla::gpu
