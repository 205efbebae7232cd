// Host-visible knob of the GPU MoE ops (plain C++, included by tests): which moe_experts path runs.
// Auto picks the decode (weight-streaming GEMV) path for small batches and the grouped GEMM path for
// prefill; tests force each path so both are checked against the CPU at every size. In
// GemmPrecision::Bf16, Decode runs the tensor-core kernel where its constraint holds
// (gpu_decode_tc.h) and the exact fp32 decode kernel otherwise.
#pragma once

#include <optional>

#include "ops/backend.h"

namespace mla::gpu {

enum class MoePath { Auto, Decode, Grouped };

// Sets the moe_experts path of `gpu` (a GpuBackend); Auto is the default.
void set_moe_path(ops::Backend& gpu, MoePath path);

// Test / bench knob: false keeps the tensor-core decode's gate/up pass unsplit over K (default true:
// split over two CTAs per tile where its grid is small). Both give the same bits.
void set_moe_tc_k_split(ops::Backend& gpu, bool split);

// Test / bench knob: true runs the tensor-core decode as one persistent grid that takes both passes'
// tiles from a work queue, false as two grids (gate/up, then down; one CTA per tile); unset (the
// default) lets moe_tc_fused_auto (gpu_decode_tc.h) pick per call. Both give the same bits.
void set_moe_tc_fused(ops::Backend& gpu, std::optional<bool> fused);

// Test / bench knob: false streams the tensor-core decode's weights through register bursts where the
// shared-memory weight rings would run (default true: the rings wherever moe_tc_ring_ok and the
// weights' alignment allow). Both give the same bits.
void set_moe_tc_ring(ops::Backend& gpu, bool ring);
// Whether the last tensor-core decode call of `gpu` streamed its weights through the rings (tests).
bool moe_tc_last_ring(ops::Backend& gpu);

// Bench knob (outputs are garbage while it is on): anything but Off runs the fused ring grid with
// every weight byte streamed through the same queue, items and rings but the arithmetic of the named
// items skipped (All: the structure's ceiling, kernels, item boundaries and tail with free math;
// GateUp or Down: what one kind's math costs). A call that would not run the fused ring grid fails
// its check. Default Off. The values are bits: GateUp | Down == All. MathOnly is the converse: no
// weight byte is copied and every item's arithmetic runs on whatever its ring holds (the arithmetic
// and the structure with free weights; on Hopper this time does not depend on the card's bandwidth).
enum class MoeTcProbe : int { Off = 0, GateUp = 1, Down = 2, All = 3, MathOnly = 4 };
void set_moe_tc_probe(ops::Backend& gpu, MoeTcProbe probe);

}  // namespace mla::gpu
