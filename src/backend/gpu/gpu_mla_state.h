// Grow-once scratch of the mla op group (owned by GpuBackend, one per backend). One buffer serves
// every MLA op because they never overlap on the stream: the generic split-KV partials, the
// tensor-core path's workspace and padded q/out, and the naive path's gathered chunk, decompressed
// keys and running softmax state. The absorbed (decode) uses depend on shapes only, never on
// kv_lens, so a decode step run eagerly once sizes it for its captured replays.
#pragma once

#include <unordered_map>

#include "backend/gpu/gpu_mla_decode_tc.h"
#include "backend/gpu/gpu_scratch.h"

namespace mla::gpu {

struct MlaState {
  Scratch scratch;
  // absorb_q on tensor cores (Bf16 mode): W_UK^T [H r, d_n] FP8 and its scales, one per kv_b_proj.
  // uk_t holds them for weights placed by place_weight (keyed by the weight's data pointer: placed
  // memory is never freed while the backend lives, so a key never names other bytes), built on the
  // first eager call; any other weight (and a first call under capture) rebuilds them per call in
  // tc_scratch.
  std::unordered_map<const void*, Buffer> uk_t;
  Scratch tc_scratch;
  int tc_device = -1;  // sm_80+ probe, -1 until first asked
  // The absorbed decode's attention kernel on the tensor-core path (set_mla_decode_kernel): Auto in
  // service; tests and benchmarks force MmaSync or Wgmma to cover and compare both.
  MlaDecodeKernel decode_kernel = MlaDecodeKernel::Auto;
  // The mma.sync decode kernel's split-merge tickets (MlaDecodeTcArgs::tickets): zero-filled when
  // (re)allocated and left zero by every call; sized by shapes only (an eager step sizes it for its
  // captured replays); passed whatever decode_merge says, and used where the merge is Tickets.
  Scratch decode_tickets;
  MlaDecodeMerge decode_merge = MlaDecodeMerge::Auto;  // set_mla_decode_merge
};

}  // namespace mla::gpu
