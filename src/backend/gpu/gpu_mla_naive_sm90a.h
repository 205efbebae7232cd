// Hopper wgmma chunk kernel of the naive MLA prefill (d_qk 192 / d_v 128, compute capability 9.0
// exactly; built for sm_90a alone) and the knob that picks it or the portable mma.sync kernel. Same
// interface and semantics as naive_tc_chunk (gpu_mla_naive_tc.h), which dispatches to it.
#pragma once

#include "backend/gpu/gpu_mla_naive_tc.h"

namespace mla::gpu {

// Which tensor-core kernel naive_tc_chunk runs for d_qk 192 / d_v 128 (other dims always take the
// mma.sync kernels). Auto: wgmma where naive_sm90a_supported, else mma.sync. Wgmma forces it (a
// MLA_CHECK failure where unsupported); MmaSync forces the fixed-dims mma.sync kernel. Process-wide,
// for tests and benchmarks; not thread-safe against concurrent prefills.
enum class NaivePrefillPath { Auto, MmaSync, Wgmma };
void set_naive_prefill_path(NaivePrefillPath path);
NaivePrefillPath naive_prefill_path();

// True for d_qk 192 / d_v 128 on a compute capability 9.0 device with 208 KB of opt-in shared memory.
bool naive_sm90a_supported(int dqk, int dv);
// naive_tc_chunk for d_qk 192 / d_v 128 and scale > 0 on that device.
void naive_sm90a_chunk(const NaiveTcArgs& args, Stream stream);

}  // namespace mla::gpu
