// Tensor-core MLA decode (absorbed form, MQA over the latent) for a BF16 paged latent cache.
// Declared constraints (the dispatcher in gpu_mla.cu checks them and pads or falls back):
//   - query heads a multiple of kMlaTcHeadTile; the mma.sync kernel also takes a partial last tile
//     itself (MlaDecodeTcArgs::heads_live: 12 or 8 heads per rank run as a 16-head tile with zero q
//     rows and no stores for the missing heads), the wgmma kernel does not (the dispatcher zero-pads
//     q to its 64-head tiles and slices the output back);
//   - cache BF16 [num_blocks, block_size, kv_lora_rank + rope_dim] with kv_lora_rank = 512 and
//     rope_dim = 64 (DeepSeek-V3 / Kimi geometry);
//   - an NVIDIA GPU with mma.sync bf16 (sm_80+); on HIP builds mla_decode_tc_supported() is false.
// On an H100/H200 (compute capability 9.0) head counts that are a multiple of 64 run the wgmma kernel
// of gpu_mla_decode_sm90a.h instead (same arguments, workspace format and combine) where the batch
// gives its 64-head tiles half a wave of CTAs; `kernel` forces either one.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/gpu/gpu.h"

namespace mla::ops {
class Backend;
}

namespace mla::gpu {

constexpr int kMlaTcHeadTile = 16;
// Shared by both attention kernels and the combine: 64-key tiles; a token uses as many of the grid's
// KV splits (at most kMlaDecodeMaxSplits) as give each >= kMlaDecodeMinTilesPerSplit tiles.
constexpr int kMlaDecodeKeyTile = 64;
constexpr int kMlaDecodeMinTilesPerSplit = 2;
constexpr int kMlaDecodeMaxSplits = 32;

// Which attention kernel mla_decode_tc runs.
enum class MlaDecodeKernel {
  Auto,     // Wgmma where mla_decode_sm90a_supported(num_heads, ...) and T * H / 64 >= SMs / 2, else MmaSync
  MmaSync,  // the sm_80+ mma.sync kernel (16 or 32 heads per CTA)
  Wgmma,    // the sm_90a wgmma kernel (64 heads per CTA); fails when unsupported
};

// How the mma.sync kernel merges a (token, head tile)'s KV-split partials where its grid has 2 to
// kMlaDecodeMaxFusedSplits splits (more splits, the wgmma kernel and the Kernel choice run the
// separate combine kernel).
enum class MlaDecodeMerge {
  Auto,         // on compute capability 9.0+: Cluster where the grid's clusters are all resident at
                // once; ClusterTail where they are not (62 clusters of 4 on an H100 / H200 at two CTAs
                // per SM, against 64 for batch 64 x 16 heads) but the whole grid fits one wave of lone
                // CTAs; else Tickets
  Cluster,      // the splits of a tile form a thread-block cluster and merge through distributed
                // shared memory, each CTA a share of the rows (sm_90+; forcing it elsewhere fails)
  ClusterTail,  // the first tokens (as many as have their clusters resident at once; forced: at most
                // half) in a Cluster grid, the rest in a Tickets grid running beside it (sm_90+ and
                // tickets; forcing it without either fails)
  Tickets,      // the tile's last CTA to finish (atomic tickets) merges the partials from global memory
  Kernel,       // the separate combine kernel (the A/B baseline)
};
constexpr int kMlaDecodeMaxFusedSplits = 4;

// One call's arguments. The kernels compute `num_heads` heads (a tile multiple); q/out hold the first
// heads_live of them (0: all); indptr arrays are device I32 (see ops::AttentionBatch).
struct MlaDecodeTcArgs {
  const float* q = nullptr;        // [T, num_heads, kv_lora_rank + rope_dim], row stride q_row_stride
  int64_t q_row_stride = 0, q_head_stride = 0;
  const uint16_t* cache = nullptr;  // BF16 [num_blocks, block_size, kv_dim]
  int block_size = 0;
  const int32_t* q_indptr = nullptr;
  const int32_t* kv_lens = nullptr;
  const int32_t* block_indptr = nullptr;
  const int32_t* block_ids = nullptr;
  int num_seqs = 0, num_tokens = 0, num_heads = 0;
  // Heads present in q and out, the first heads_live of num_heads (0 or num_heads: all). The heads
  // past it read as zero q and are never stored (their partials fill workspace rows the grid owns
  // anyway). The mma.sync kernel only: Auto then never picks wgmma, and forcing Wgmma fails. Why:
  // zero-padding q to the tile and slicing out back took two more kernels; the padded 12- and 8-head
  // bench rows read 6-7 points below 16 heads on the H200, ~9 us per call (performance.md, session 25).
  int heads_live = 0;
  int kv_lora_rank = 0, rope_dim = 0;
  // The launch grid may depend only on num_tokens / num_heads (fixed per captured graph), never on
  // kv_lens contents: a graph replays the same grid while contexts grow. Split-KV ranges are derived
  // on the device from kv_lens.
  float softmax_scale = 0;
  float* out = nullptr;             // [T, num_heads, kv_lora_rank], row stride out_row_stride
  int64_t out_row_stride = 0, out_head_stride = 0;
  void* workspace = nullptr;        // mla_decode_tc_workspace_bytes() bytes
  // Split-KV merge (MlaDecodeMerge). Tickets needs a ticket per (token, 16-head tile), [num_tokens *
  // num_heads / kMlaTcHeadTile] counters, zero before the call and left zero after it; a null
  // `tickets` turns Tickets (and Auto where it means Tickets) into Kernel.
  MlaDecodeMerge merge = MlaDecodeMerge::Auto;
  unsigned* tickets = nullptr;
  MlaDecodeKernel kernel = MlaDecodeKernel::Auto;  // the workspace size depends on it
};

// True on an NVIDIA device of compute capability >= 8.0 when num_heads is a positive multiple of
// kMlaTcHeadTile and (kv_lora_rank, rope_dim) = (512, 64); always false on HIP builds.
bool mla_decode_tc_supported(int num_heads, int kv_lora_rank, int rope_dim);
// True where MlaDecodeMerge::Cluster can run: an NVIDIA device of compute capability >= 9.0.
bool mla_decode_cluster_merge_supported();
// Split-KV partials for this call's num_tokens / num_heads (a function of those two and the SM count
// only, like the launch grid); 0 when one split fills the GPU, and then `workspace` may be null.
size_t mla_decode_tc_workspace_bytes(const MlaDecodeTcArgs& args);
// The grid has that many splits; each query row uses only as many as its context fills with >= 2
// tiles of 64 keys (derived on the device from kv_lens; unused CTAs exit at once, and a row that uses
// one split is written directly and skipped by the combine).
// Launches on `stream` the attention grid (with ClusterTail: a cluster grid and a ticket grid, the
// second as a programmatic dependent launch) and, where that grid does not merge its split partials
// itself (see MlaDecodeMerge), the combine kernel (also a programmatic dependent launch). q's and
// out's last dims must be contiguous; cache and workspace 16-byte aligned; out must not alias q,
// cache or workspace; num_tokens <= 65535. Never allocates or synchronizes (graph-capturable).
// Precision: q and P are rounded to bf16 for the MMAs (fp32 accumulation, fp32 softmax).
void mla_decode_tc(const MlaDecodeTcArgs& args, Stream stream);

// The kernel that `gpu` (a GPU backend) uses for mla_attention_absorbed on the tensor-core path from
// now on (gpu_mla_absorbed.cu). Forcing Wgmma pads the heads to a multiple of 64 (not 16) and fails
// where mla_decode_sm90a_supported is false. Not to be changed while a graph captured with the other
// setting is replayed (the captured launches keep theirs).
void set_mla_decode_kernel(ops::Backend& gpu, MlaDecodeKernel kernel);
// Bench / test knob: how mla_attention_absorbed on `gpu` merges split partials from now on (Auto in
// service; the others to cover and compare every path). Same rule as above while graphs replay.
void set_mla_decode_merge(ops::Backend& gpu, MlaDecodeMerge merge);

}  // namespace mla::gpu
