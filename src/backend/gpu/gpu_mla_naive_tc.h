// Tensor-core chunk kernel of the naive (decompressed) MLA prefill path, used under
// GemmPrecision::Bf16. Declared constraints (gpu_mla_naive.cu checks them and otherwise runs the fp32
// chunk kernel): d_qk = d_n + d_r and d_v multiples of 16, d_v <= 256, the tile's shared memory within
// the device's opt-in limit, an NVIDIA GPU with mma.sync bf16 (sm_80+); always false on HIP builds.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/gpu/gpu.h"

namespace mla::gpu {

// One (sequence, key chunk) launch. The running (max, sum, acc) per (row, head) has the fp32 chunk
// kernel's meaning: run_max in natural-log units of the scaled score, run_sum = sum of exp(s - max),
// out = the unnormalized acc between chunks and the result after the last chunk.
struct NaiveTcArgs {
  const float* q = nullptr;       // [T, H, d_qk] F32, last dim contiguous
  int64_t q_s0 = 0, q_s1 = 0;
  const uint16_t* k = nullptr;    // BF16 [H][n][d_qk]: [k_nope | k_rope] per head, from naive_tc_pack
  const uint16_t* v = nullptr;    // BF16 [H][n][d_v]
  float* out = nullptr;           // [T, H, d_v] F32, last dim contiguous
  int64_t o_s0 = 0, o_s1 = 0;
  float* run_max = nullptr;       // [T, H]
  float* run_sum = nullptr;       // [T, H]
  int heads = 0, dqk = 0, dv = 0;
  float scale = 0;                // softmax scale (natural units)
  int64_t q0 = 0, q_len = 0, first_pos = 0, j0 = 0, n = 0;  // rows, first position, this chunk's keys
  bool first = false, last = false;
};

// The tensor-core path's longest key chunk: 16384, unless the F32 decompression budget of
// gpu_mla_naive.cu gives fewer (4096 at 128 heads). Test knob: set_naive_tc_max_key_chunk(keys) caps
// it (>= 64, a multiple of 64) so small cases cross chunk edges; 0 restores the default.
// Process-wide, like set_naive_prefill_path.
constexpr int64_t kNaiveTcMaxKeyChunk = 16384;
void set_naive_tc_max_key_chunk(int64_t keys);

// True when the constraints above hold on the current device.
bool naive_tc_supported(int dqk, int dv);
// Converts the decompressed chunk (kv F32 [n, H (d_n + d_v)], rope F32 [n, d_r], both contiguous) to
// the kernel's bf16 per-head layout k [H][n][d_n + d_r], v [H][n][d_v] (RNE rounding).
void naive_tc_pack(const float* kv, const float* rope, int64_t n, int heads, int d_n, int d_r, int d_v, uint16_t* k,
                   uint16_t* v, Stream stream);
// Folds the chunk's keys into the running state of the sequence's rows for every head. d_qk 192 / d_v
// 128 with scale > 0 runs the fixed-dims kernel, anything else the runtime-dims one (same semantics).
void naive_tc_chunk(const NaiveTcArgs& args, Stream stream);

}  // namespace mla::gpu
