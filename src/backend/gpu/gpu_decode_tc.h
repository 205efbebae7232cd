// Tensor-core decode matvec (internal to gpu_moe.cu and gpu_linear.cu): for GemmPrecision::Bf16,
// FP8 and INT4 (BF16 scale) weights are streamed once with 16-byte loads and multiplied on mma.sync
// with the tokens as the n = 8 columns. Used for the routed experts of moe_experts and for linear at
// decode sizes (T <= 16). Trades exactness (activations rounded once to f16 / bf16) for ~5x fewer
// instructions per weight byte than the fp32 decode kernels.
//
// Declared constraint (the dispatchers check it and otherwise run their exact kernels):
//   - CUDA build, device sm_80+ (moe_tc_device_ok); HIP: never;
//   - format FP8 (128x128 block scales) or I4_BF16 (group 32);
//   - MoE: hidden and inter multiples of 64 (FP8) / 128 (INT4) (moe_tc_shape_ok); every held
//     expert's rows 16-byte readable (MoeExpertTable::all_vec) and, INT4, scale rows 4-byte aligned
//     (MoeExpertTable::scale_pairs);
//   - dense: in a multiple of 64 (FP8) / 128 (INT4), out a multiple of 64, the weight's data and
//     row starts 16-byte aligned, INT4 scale rows 8-byte aligned (dense_tc_weight_ok).
// Any number of tokens works (MoE: 8 FP8 / 2 INT4 token columns per pass; more re-stream the weights).
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/gpu/gpu.h"
#include "backend/gpu/gpu_moe_state.h"

namespace mla::gpu {

// The fused grid's own routing plan (moe_tc_fused_kernel): where `ids` is set, every CTA builds
// the plan in shared memory from the ids (at most kGridPlanMaxPairs pairs), and no plan kernel
// needs to run before the launch; MoeTcArgs::plan is then unused. Measured with a 64-pair limit
// (H100, 2026-12-06, one machine, two processes): INT4 batch 1 / 2 / 4 / 8 read 69.0 / 79.2 / 84.2
// / 86.1% of copy bandwidth against 66.8-66.9 / 77.0-77.3 / 83.4-83.6 / 86.5-86.7% with the plan
// kernel; so up to 32 pairs (DeepSeek-V3 batch 1-4), and batch 8 keeps the plan kernel.
constexpr int kGridPlanMaxPairs = 32;
struct MoeGridPlanArgs {
  const int32_t* ids = nullptr;  // [tokens, ids_stride] expert ids of this token chunk
  int64_t ids_stride = 0;
  int num_experts = 0, top_k = 0, pairs = 0;
  const DeviceExpert* table = nullptr;
};

struct MoeTcArgs {
  const DeviceExpert* table;  // device table; plan built by moe_plan_kernel on the same stream
  moe::Plan plan;
  const float* x;             // [tokens, hidden] fp32 rows of this token chunk
  int64_t x_stride;
  int tokens, top_k, pairs, slots;  // pairs = tokens * top_k; slots = min(E, pairs) (grid x)
  int64_t hidden, inter;
  void* scratch;              // moe_tc_scratch_bytes(format, tokens, pairs, hidden, inter) bytes, 256-aligned
  float* y;                   // out: [pairs, hidden] fp32, row = pair index t * top_k + slot
  // Gate/up K-split tickets: [slots * inter / 64] counters, zero between calls (the kernel leaves
  // them zero); nullptr: no K split.
  unsigned* k_tickets = nullptr;
  // > 0: one fused, persistent grid of this many CTAs (moe_tc_fused_grid) runs gate/up and down
  // from a work queue; 0: two grids. Both give the same bits.
  int fused_ctas = 0;
  unsigned* queue = nullptr;  // fused: [2 + slots] counters, zero between calls (the kernel leaves them zero)
  // Non-null: the weights stream through per-warp shared-memory rings that the copy engine fills
  // from these maps ([experts x kMoeRingMapsPerExpert], device; precondition: moe_tc_ring_ok), else
  // through register bursts. Both give the same bits.
  const MoeRingMap* ring_maps = nullptr;
  // fused_ctas > 0 only: the grid builds its plan itself (see MoeGridPlanArgs).
  MoeGridPlanArgs grid_plan;
  // Bench only (set_moe_tc_probe; needs fused_ctas > 0 and ring_maps): skip the arithmetic of the
  // gate/up items (bit 0) and of the down items (bit 1); 4: every weight copy instead.
  int probe = 0;
};

bool moe_tc_shape_ok(MoeFormat format, int64_t hidden, int64_t inter);
// Compute capability major of the current device >= 8 (false on HIP builds).
bool moe_tc_device_ok();
size_t moe_tc_scratch_bytes(MoeFormat format, int64_t tokens, int64_t pairs, int64_t hidden, int64_t inter);
// CTAs the device holds at once of the fused grid for `format` (FP8 or I4_BF16; 0 on HIP builds),
// with (ring) or without the weight rings.
int moe_tc_fused_grid(MoeFormat format, bool ring);
// Whether the weight-ring path (MoeTcArgs::ring_maps) exists for this format, shape and device:
// INT4, sm_90+ (tensor-map copies), hidden a multiple of 256 and inter of 512 (whole gate/up and
// down stages; stages twice as wide where hidden % 512 == 0 and inter % 1024 == 0). The weights'
// alignment is moe_tc_ring_maps' to check.
bool moe_tc_ring_ok(MoeFormat format, int64_t hidden, int64_t inter);
// The ring maps of `experts` experts of host_table (maps[e * kMoeRingMapsPerExpert + i]; experts not
// held are left zero). False (maps unspecified) where an expert's rows or scale rows are not
// 16-byte aligned or the driver refuses a map; the caller then keeps the register bursts.
bool moe_tc_ring_maps(const DeviceExpert* host_table, int64_t experts, int64_t hidden, int64_t inter,
                      MoeRingMap* maps);
// The default choice between the fused grid and two grids for a call of `tokens` tokens, with or
// without the weight rings (measured; the definition says where).
bool moe_tc_fused_auto(MoeFormat format, int64_t tokens, bool ring);
// Enqueues prep (x -> 16-bit), gate/up (-> 16-bit h) and down (-> y). Precondition: the constraint
// above holds and `format` is the table's.
void moe_tc_launch(MoeFormat format, const MoeTcArgs& args, Stream stream);

// Dense layers (gpu_dense_tc.cu): out[T, out] = x[T, in] W^T in one launch. Split K over `splits`
// CTA columns of `chunks_per_split` 64-k (FP8) / 128-k (INT4) chunks each (dense_tc_split: from the
// shape only, so a token's sums never depend on the batch); the last CTA of a row block to finish
// adds the partial planes in split order. The activations are rounded to 16 bits inside the kernel
// (no prep pass, no activation scratch). Launched with programmatic dependent launch: the weight
// loads of a call are issued before it waits for the previous kernel in the stream.
struct DenseTcSplit {
  int64_t splits = 1, chunks_per_split = 0;
};
bool dense_tc_shape_ok(MoeFormat format, int64_t in, int64_t out);
// The shape, plus 16-byte aligned data rows and (INT4) 8-byte aligned group-scale rows.
bool dense_tc_weight_ok(MoeFormat format, const DeviceWeight& w);
DenseTcSplit dense_tc_split(MoeFormat format, int64_t in, int64_t out);
// K of width `in` cut into about `want` equal ranges of whole chunks (at most one per chunk).
DenseTcSplit dense_tc_split_into(MoeFormat format, int64_t in, int64_t want);

// One weight of a launch and where its rows go. A launch takes up to kDenseTcMaxParts weights of
// one input and one format and width (linear_group: q_a + kv_a, gate + up); its grid runs over every
// part's 64-row blocks in order, so narrow weights share one wave instead of each leaving the GPU
// mostly idle, and the input is staged once per CTA for all of them.
constexpr int kDenseTcMaxParts = 4;
struct DenseTcPart {
  DeviceWeight w;            // heads > 1: head h's matrix is rows [h * w_head_rows, + out) of w
  float* y = nullptr;        // out: row t at y + t * y_stride (+ h * y_head_stride)
  int64_t y_stride = 0;
};
struct DenseTcArgs {
  DenseTcPart part[kDenseTcMaxParts];
  int num_parts = 1;         // parts share in, format and the split
  const float* x;            // [tokens * heads, in] fp32 rows, row t * heads + h
  int64_t x_stride;          // elements between those rows
  int tokens;
  int heads = 1;             // per-head matvecs (one part, one split only; FP8: w_head_rows % 128 == 0)
  int64_t w_head_rows = 0;
  int64_t y_head_stride = 0; // elements between heads in y
  DenseTcSplit split;        // from the parts' summed rows: dense_tc_split(format, in, total rows)
  float* partial = nullptr;     // splits > 1: dense_tc_partial_bytes(split, tokens, total rows) of scratch
  unsigned* tickets = nullptr;  // splits > 1: [total rows / 64] counters, zero between calls (left zero)
};
size_t dense_tc_partial_bytes(const DenseTcSplit& split, int64_t tokens, int64_t out);
void dense_tc_launch(MoeFormat format, const DenseTcArgs& args, Stream stream);

}  // namespace mla::gpu
