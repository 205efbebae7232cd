// Hopper wgmma kernel of the tensor-core grouped MoE GEMM (compute capability 9.0 exactly; built for
// sm_90a alone), and the knob that picks it or the portable mma.sync kernel. Same contract, formats,
// tiles and values as gpu_moe_grouped_tc.h, whose launch dispatches to it.
#pragma once

#include <cstdint>

#include "backend/gpu/gpu.h"

namespace mla::gpu {

// Device-side types of gpu_moe_state.h / gpu_moe_grouped_tc.h (this header stays host-clean for tests).
enum class MoeFormat : int32_t;
struct MoeGroupedTcArgs;

// Which kernel moe_grouped_tc_launch runs. Auto: wgmma where moe_grouped_sm90a_supported, else
// mma.sync; Wgmma forces it (an MLA_CHECK failure where unsupported); MmaSync forces the portable
// kernel. Process-wide, for tests and benchmarks; not thread-safe against concurrent prefills.
enum class MoeGroupedPath { Auto, MmaSync, Wgmma };
void set_moe_grouped_path(MoeGroupedPath path);
MoeGroupedPath moe_grouped_path();

// True on a compute capability 9.0 device whose opt-in shared memory holds the kernel's tiles.
bool moe_grouped_sm90a_supported();
// Gate/up (-> bf16 h) and down (-> y) of moe_grouped_tc_launch, after its x -> bf16 prep.
// Preconditions: moe_grouped_tc_ok(format, ...) and the launch's plan checks.
void moe_grouped_sm90a_launch(MoeFormat format, const MoeGroupedTcArgs& args, Stream stream);

}  // namespace mla::gpu
