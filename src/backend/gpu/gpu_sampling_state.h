// Grow-once scratch and cached plans of the sampling op group (owned by GpuBackend, one per backend).
#pragma once

#include "backend/gpu/gpu_scratch.h"

namespace mla::gpu {

struct SamplingState {
  Scratch scratch;
};

}  // namespace mla::gpu
