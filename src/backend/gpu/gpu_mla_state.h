// Grow-once scratch of the mla op group (owned by GpuBackend, one per backend). One buffer serves
// every MLA op because they never overlap on the stream: the generic split-KV partials, the
// tensor-core path's workspace and padded q/out, and the naive path's gathered chunk, decompressed
// keys and running softmax state. The absorbed (decode) uses depend on shapes only, never on
// kv_lens, so a decode step run eagerly once sizes it for its captured replays.
#pragma once

#include "backend/gpu/gpu_scratch.h"

namespace mla::gpu {

struct MlaState {
  Scratch scratch;
};

}  // namespace mla::gpu
