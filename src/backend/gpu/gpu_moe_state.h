// Grow-once scratch and cached expert tables of the moe op group (owned by GpuBackend, one per
// backend). The table cache trades a little device memory (one small table per MoE layer) for
// zero per-call H2D copies, which graph replay requires anyway.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "backend/gpu/gpu_device.cuh"
#include "backend/gpu/gpu_moe.h"
#include "backend/gpu/gpu_scratch.h"

namespace mla::gpu {

// One expert as the kernels see it. gate.data == nullptr: not held by this rank (contributes 0).
// vec_*: rows can be read in 16-byte aligned chunks (else the decode path's scalar loop runs).
struct DeviceExpert {
  DeviceWeight gate, up, down;
  int32_t vec_gate_up = 0, vec_down = 0;
};
// Whether routed id `e` names an expert of this rank: in [0, E) and not a hole of the table (every
// device reader of the ids asks this; other ids contribute nothing).
__device__ __forceinline__ bool held(const DeviceExpert* table, int num_experts, int e) {
  return e >= 0 && e < num_experts && table[e].gate.data != nullptr;
}

// One tensor map of the tensor-core decode's weight rings (a CUtensorMap: 128 opaque bytes the copy
// engine reads); per expert: gate, up, down data, then gate, up, down INT4 scales (moe_tc_ring_maps).
struct alignas(128) MoeRingMap {
  unsigned char bytes[128];
};
constexpr int kMoeRingMapsPerExpert = 6;

// Weight storage formats the expert kernels are instantiated for (one per table: every held
// expert's gate/up/down share it).
enum class MoeFormat : int32_t { BF16, F16, F32, FP8, I4_BF16, I4_F16, I4_F32 };

namespace moe {
// The routing plan in device scratch, built by the plan kernel from the ids (no host sync).
// Pairs are p = t * top_k + slot. Only pairs whose expert is held appear in `sorted`.
struct Plan {
  int32_t* offsets;      // [E + 1]: pairs of expert e are sorted[offsets[e] .. offsets[e+1])
  int32_t* active;       // [E]: held experts with >= 1 pair, ascending; count in counters[0]
  int32_t* sorted;       // [P]: pair indices grouped by expert
  int32_t* tile_expert;  // [max_tiles]: grouped-GEMM row tiles (expert, first sorted position)
  int32_t* tile_start;
  int32_t* counters;     // [0] active experts, [1] row tiles
  // Non-null only in the fused tensor-core grid's own plan (moe_tc_fused_kernel, shared memory):
  // the pairs of active slot j are sorted[slot_offsets[j] .. slot_offsets[j + 1]), and `offsets`
  // and the tile arrays are not built.
  int32_t* slot_offsets = nullptr;
};
}  // namespace moe

struct MoeExpertTable {
  const void* key_data = nullptr;     // experts.data() and experts.size() of the span it mirrors
  size_t key_size = 0;
  Buffer device;                      // DeviceExpert[num_experts]
  std::vector<DeviceExpert> host;     // the same, to validate the cache key on every call
  int64_t hidden = 0, inter = 0;      // 0 when no expert is held
  MoeFormat format = MoeFormat::BF16;
  bool all_vec = true;                // every held expert's gate/up/down rows are 16-byte readable
  bool scale_pairs = true;            // INT4: every scale row 4-byte aligned (the tc decode reads 2 groups' at once)
  // MoeTcArgs::ring_maps, built with the table where moe_tc_ring_ok holds (empty: register bursts).
  Buffer ring_maps;
  std::vector<MoeRingMap> ring_maps_host;  // the copy's source, alive as long as the table
};

struct MoeState {
  Scratch scratch;
  // MoeTcArgs::k_tickets, then MoeTcArgs::queue: zero-filled when allocated, left zero by every call.
  Scratch tc_tickets;
  MoePath path = MoePath::Auto;
  bool tc_k_split = true;             // set_moe_tc_k_split
  std::optional<bool> tc_fused;       // set_moe_tc_fused; unset: moe_tc_fused_auto decides per call
  bool tc_ring = true;                // set_moe_tc_ring: the weight rings where moe_tc_ring_ok allows them
  bool tc_last_ring = false;          // the last tensor-core decode call ran the rings (moe_tc_last_ring)
  int tc_probe = 0;                   // set_moe_tc_probe (MoeTcProbe's bits): the fused ring grid without its arithmetic
  int tc_device = -1;                 // 1: the mma.sync decode path runs on this device, 0: not, -1: unprobed
  // moe_tc_fused_grid of this device: [FP8 / I4_BF16][register bursts / rings]; 0: not yet asked.
  int tc_fused_grid[2][2] = {{0, 0}, {0, 0}};
  // One table per MoE layer's expert span, found by (data, size): a few dozen entries, linear search
  // (std::map of these trips a clang 15 HIP crash).
  std::vector<std::unique_ptr<MoeExpertTable>> tables;
};

}  // namespace mla::gpu
