// MoE ops on the GPU: noaux_tc routing (one warp per token, exact CPU selection order) and the
// routed experts (device-built routing plan, then the decode (fp32, or tensor-core in Bf16 mode:
// gpu_decode_tc.cu) or grouped-GEMM (fp32, or tensor-core in Bf16 mode: gpu_moe_grouped_tc.cu)
// expert kernels and a fixed-slot-order combine). Nothing here syncs or copies per call; expert
// tables are cached per expert span, so decode steps capture into graphs.
#include <algorithm>
#include <cstdint>

#include "backend/gpu/gpu_backend_impl.h"
#include "backend/gpu/gpu_decode_tc.h"
#include "backend/gpu/gpu_moe.h"
#include "backend/gpu/gpu_moe_grouped_tc.h"
#include "backend/gpu/gpu_moe_kernels.cuh"
#include "backend/gpu/gpu_moe_state.h"

namespace mla::gpu {

namespace {

using moe::Plan;

constexpr int kMaxRouteExperts = 4096;  // 2 E floats of dynamic smem stay under the 48 KB default
constexpr int kPlanThreads = 1024;
constexpr int kMaxExperts = 2048;       // plan kernel's smem counters
constexpr size_t kMaxChunkBytes = size_t(256) << 20;  // h + y scratch per token chunk (prefill)
// The tensor-core grouped GEMM is compute-bound only with many pairs per expert, and every chunk
// re-reads all experts' weights: at DeepSeek-V3's shape 256 MB is 910 tokens (~28 pairs per expert,
// 11.3 GB of FP8 weights per chunk), 1 GiB 3640. The price is 1 GiB of grow-once scratch (prefill only).
constexpr size_t kMaxChunkBytesGroupedTc = size_t(1) << 30;
constexpr int64_t kDecodeMaxTokens = 16;

// ---- moe_route ------------------------------------------------------------------------------------
// One warp per token (kRouteWarps tokens per block; no block barrier, so idle warps just leave).
// The selection is the CPU's order exactly (score desc, lower index first on ties) via order-
// preserving keys: route_key(score) with the index as tie-break. Steps per token:
//  1. lane l computes the sigmoid and biased score of experts l, l + W, ... into shared memory;
//  2. (n_group > 1) lane g takes group g's top-2 sum with the CPU's loop, ranks it among the groups
//     and writes -inf over its experts when it ranks topk_group or below, as the CPU does;
//  3. top_k rounds of a warp argmax: each lane holds the best (key, index) of its own experts that
//     sorts below the last one taken from it; two warp reductions (max key, then min index at that
//     key) give the winner; only the winner's lane rescans its E / W experts;
//  4. the unbiased scores of the chosen experts (the same expression recomputed from the logits,
//     bit-identical), summed in slot order like the CPU, give the weights.
// DeepSeek-V3 (E = 256, 8 groups, top-8) per token: 8 logits + 8 bias loads per lane (one round
// trip), 8 expf per lane, 32-step group scans on 8 lanes, 8 x (2 warp reductions + an 8-entry rescan).
constexpr int kRouteWarps = 4;  // tokens per block
constexpr int kNoExpert = 0x7fffffff;  // "no candidate" index (INT_MAX)

// __syncwarp: CUDA's, or on AMD (lock-step wavefronts, LDS accesses in issue order) a wavefront-scope
// fence that keeps the compiler from moving shared accesses across it.
__device__ __forceinline__ void route_syncwarp() {
#if MLA_GPU_CUDA
  __syncwarp();
#else
  __builtin_amdgcn_fence(__ATOMIC_SEQ_CST, "wavefront");
  __builtin_amdgcn_wave_barrier();
#endif
}

// Order-preserving key of a selection score: a > b as floats <=> key(a) > key(b), with -0 == +0 (as
// the CPU's comparisons) and NaN mapped to 1, below every number (the CPU's order leaves NaN
// unspecified; here it stays deterministic and in range). 0 means "no candidate".
__device__ __forceinline__ uint32_t route_key(float v) {
  if (v != v) return 1u;
  const uint32_t u = __float_as_uint(v == 0.0f ? 0.0f : v);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);  // -inf -> 0x007fffff > 1
}

__device__ __forceinline__ uint32_t route_warp_max(uint32_t v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  return __reduce_max_sync(0xffffffffu, v);  // one REDUX instead of log2(W) shuffle rounds
#else
  for (int m = kWarpSize / 2; m > 0; m /= 2) {
    const uint32_t o = shfl_xor(v, m);
    v = o > v ? o : v;
  }
  return v;
#endif
}
__device__ __forceinline__ int route_warp_min(int v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  return __reduce_min_sync(0xffffffffu, v);
#else
  for (int m = kWarpSize / 2; m > 0; m /= 2) {
    const int o = shfl_xor(v, m);
    v = o < v ? o : v;
  }
  return v;
#endif
}

// Shared memory per warp: [E] biased scores (then the chosen experts' unbiased scores), [n_group]
// group scores, [top_k] chosen ids: 4 * (E + n_group + top_k) bytes.
__global__ void __launch_bounds__(kRouteWarps * kWarpSize) moe_route_kernel(
    const float* __restrict__ logits, int64_t logits_stride, const float* __restrict__ bias, int64_t bias_stride,
    int num_tokens, int num_experts, int n_group, int topk_group, int top_k, int norm, float scale,
    int32_t* __restrict__ ids, int64_t ids_stride, float* __restrict__ weights, int64_t weights_stride) {
  extern __shared__ float route_smem[];
  pdl_enter();  // launched with PDL (launch_maybe_pdl)
  const int lane = int(threadIdx.x) % kWarpSize, warp = int(threadIdx.x) / kWarpSize;
  const int64_t t = int64_t(blockIdx.x) * (blockDim.x / kWarpSize) + warp;
  if (t >= num_tokens) return;  // a whole warp: nothing below waits for it
  float* b = route_smem + int64_t(warp) * (num_experts + n_group + top_k);
  float* gscore = b + num_experts;
  int32_t* chosen = reinterpret_cast<int32_t*>(gscore + n_group);
  const float* l = logits + t * logits_stride;
  const float ninf = -__int_as_float(0x7f800000);

  // 1. Scores (the CPU's expressions). Lane l owns experts l + m * W in every later step.
#pragma unroll 4
  for (int e = lane; e < num_experts; e += kWarpSize) {
    const float s = 1.0f / (1.0f + expf(-l[e]));
    b[e] = s + (bias != nullptr ? bias[int64_t(e) * bias_stride] : 0.0f);
  }
  route_syncwarp();

  // 2. Group limit.
  if (n_group > 1) {
    const int gsize = num_experts / n_group;
    for (int g = lane; g < n_group; g += kWarpSize) {  // top-2 sum, the CPU's exact loop
      float first = ninf, second = ninf;
      for (int e = 0; e < gsize; ++e) {
        const float v = b[g * gsize + e];
        if (v > first) {
          second = first;
          first = v;
        } else if (v > second) {
          second = v;
        }
      }
      gscore[g] = first + second;
    }
    route_syncwarp();
    for (int g = lane; g < n_group; g += kWarpSize) {
      const float mine = gscore[g];
      int rank = 0;
      for (int h = 0; h < n_group && rank < topk_group; ++h)
        rank += (gscore[h] > mine || (gscore[h] == mine && h < g)) ? 1 : 0;
      if (rank >= topk_group)
        for (int e = g * gsize; e < (g + 1) * gsize; ++e) b[e] = ninf;
    }
    route_syncwarp();
  }

  // 3. Top-k. (cap_k, cap_e): the last (key, index) taken from this lane; the lane's candidates are
  // its experts that sort strictly after it. Its indices ascend, so '>' keeps the lower index on ties.
  uint32_t cap_k = 0xffffffffu, best_k = 0;  // real keys are < 0xffffffff (NaN maps to 1)
  int cap_e = -1, best_e = kNoExpert;
  auto rescan = [&]() {
    best_k = 0;
    best_e = kNoExpert;
    for (int e = lane; e < num_experts; e += kWarpSize) {
      const uint32_t key = route_key(b[e]);
      if ((key < cap_k || (key == cap_k && e > cap_e)) && key > best_k) {
        best_k = key;
        best_e = e;
      }
    }
  };
  rescan();
  for (int k = 0; k < top_k; ++k) {
    const uint32_t win_k = route_warp_max(best_k);
    const int win_e = route_warp_min(best_k == win_k ? best_e : kNoExpert);
    // win_e == kNoExpert only if fewer than top_k experts exist, which the host checks exclude.
    const int e = win_e < num_experts ? win_e : 0;
    if (lane == 0) chosen[k] = e;
    if (lane == e % kWarpSize && k + 1 < top_k) {
      cap_k = win_k;
      cap_e = win_e;
      rescan();
    }
  }
  route_syncwarp();  // every rescan is done: b is free, chosen is complete

  // 4. Weights from the unbiased scores, recomputed for the chosen experts into b[0, top_k).
  for (int k = lane; k < top_k; k += kWarpSize) b[k] = 1.0f / (1.0f + expf(-l[chosen[k]]));
  route_syncwarp();
  float sum = 0.0f;
  for (int k = 0; k < top_k; ++k) sum += b[k];  // slot order, as the CPU
  const float denom = norm ? sum + 1e-20f : 1.0f;
  for (int k = lane; k < top_k; k += kWarpSize) {
    ids[t * ids_stride + k] = chosen[k];
    weights[t * weights_stride + k] = b[k] / denom * scale;
  }
}

// ---- routing plan -------------------------------------------------------------------------------
// One block: count pairs per held expert, scan (counts, grouped row tiles, active experts), scatter
// pairs into expert order. All loops are sized by P = T * top_k and E, never by the ids' values.
// Order inside an expert's segment depends on atomics, but every pair's result is computed
// independently and stored by pair index, so outputs stay deterministic.
// The block size comes from the shapes (moe_plan_threads): one warp for a decode step of
// DeepSeek-V3 (E = 256, P = 8), 1024 threads for prefill. Critical path at decode: the ids and the
// held flags load together (one round trip), the counts' smem atomics, a warp scan of 8 experts per
// lane, the plan stores; with one warp every __syncthreads is a single-warp barrier and the
// cross-warp scan is skipped.
__global__ void __launch_bounds__(kPlanThreads) moe_plan_kernel(const DeviceExpert* __restrict__ table,
                                                                int num_experts, const int32_t* __restrict__ ids,
                                                                int64_t ids_stride, int num_tokens, int top_k,
                                                                Plan plan) {
  __shared__ int count[kMaxExperts];
  __shared__ int cursor[kMaxExperts];
  __shared__ unsigned char is_held[kMaxExperts];
  pdl_enter();  // launched with PDL (launch_maybe_pdl)
  constexpr int kPlanWarps = kPlanThreads / kWarpSize;
  static_assert(kPlanWarps <= kWarpSize, "warp 0 scans the warp totals");
  __shared__ int warp_total[3][kPlanWarps];
  const int tid = int(threadIdx.x), nt = int(blockDim.x);
  const int pairs = num_tokens * top_k;
  // The first pair's id of each thread loads alongside the held flags; later ones (prefill) in the loops.
  const int first_e = tid < pairs ? ids[int64_t(tid / top_k) * ids_stride + tid % top_k] : -1;
  for (int e = tid; e < num_experts; e += nt) {
    count[e] = 0;
    is_held[e] = table[e].gate.data != nullptr ? 1 : 0;
  }
  __syncthreads();
  // held(): in range and not a hole of this rank's table (ids outside [0, E) contribute nothing).
  auto pair_expert = [&](int p) { return p == tid ? first_e : ids[int64_t(p / top_k) * ids_stride + p % top_k]; };
  auto held_here = [&](int e) { return e >= 0 && e < num_experts && is_held[e] != 0; };
  for (int p = tid; p < pairs; p += nt) {
    const int e = pair_expert(p);
    if (held_here(e)) atomicAdd(&count[e], 1);
  }
  __syncthreads();
  const int per = (num_experts + nt - 1) / nt;
  const int e0 = min(num_experts, tid * per), e1 = min(num_experts, e0 + per);
  int own[3] = {0, 0, 0};
  for (int e = e0; e < e1; ++e) {
    own[0] += count[e];
    own[1] += (count[e] + moe::kBM - 1) / moe::kBM;
    own[2] += count[e] > 0 ? 1 : 0;
  }
  // Inclusive block scan of own[]: shuffle Hillis-Steele inside each warp, then (several warps only)
  // warp 0 scans the warp totals: 2 barriers instead of 2 per step.
  const int lane = tid % kWarpSize, warp = tid / kWarpSize, warps = nt / kWarpSize;
  int inc[3] = {own[0], own[1], own[2]};
  for (int off = 1; off < kWarpSize; off <<= 1)
    for (int j = 0; j < 3; ++j) {
      const int t = shfl(inc[j], max(lane - off, 0));
      if (lane >= off) inc[j] += t;
    }
  if (warps > 1) {  // block-uniform
    if (lane == kWarpSize - 1)
      for (int j = 0; j < 3; ++j) warp_total[j][warp] = inc[j];
    __syncthreads();
    if (warp == 0)
      for (int j = 0; j < 3; ++j) {
        int v = lane < warps ? warp_total[j][lane] : 0;
        for (int off = 1; off < kWarpSize; off <<= 1) {
          const int t = shfl(v, max(lane - off, 0));
          if (lane >= off) v += t;
        }
        if (lane < warps) warp_total[j][lane] = v;
      }
    __syncthreads();
    for (int j = 0; j < 3; ++j) inc[j] += warp > 0 ? warp_total[j][warp - 1] : 0;
  }
  int pos = inc[0] - own[0], tile = inc[1] - own[1], act = inc[2] - own[2];
  for (int e = e0; e < e1; ++e) {
    plan.offsets[e] = pos;
    cursor[e] = pos;
    if (count[e] > 0) plan.active[act++] = e;
    for (int i = 0; i * moe::kBM < count[e]; ++i) {
      plan.tile_expert[tile] = e;
      plan.tile_start[tile++] = pos + i * moe::kBM;
    }
    pos += count[e];
  }
  if (tid == nt - 1) {
    plan.offsets[num_experts] = inc[0];
    plan.counters[0] = inc[2];
    plan.counters[1] = inc[1];
  }
  __syncthreads();
  for (int p = tid; p < pairs; p += nt) {
    const int e = pair_expert(p);
    if (held_here(e)) plan.sorted[atomicAdd(&cursor[e], 1)] = p;
  }
}

// Plan block size: whole warps, about 8 experts per thread and at least one thread per pair, at most
// kPlanThreads (a function of the shapes only: graph-stable).
int moe_plan_threads(int64_t num_experts, int64_t pairs) {
  const int64_t want = std::max<int64_t>((num_experts + 7) / 8, pairs);
  return int(std::clamp<int64_t>((want + kWarpSize - 1) / kWarpSize * kWarpSize, kWarpSize, kPlanThreads));
}

// out[t, o] = sum over slots in order of w[t, s] * y[t * k + s, o] (held experts only). Every element
// of out is written (0 when no slot is held). Bytes: read k * H * 4 per token, write H * 4.
__global__ void moe_combine_kernel(const DeviceExpert* __restrict__ table, int num_experts,
                                   const int32_t* __restrict__ ids, int64_t ids_stride,
                                   const float* __restrict__ w, int64_t w_stride, int top_k,
                                   const float* __restrict__ y, int64_t hidden, float* __restrict__ out,
                                   int64_t out_stride) {
  pdl_enter();  // launched with PDL (launch_maybe_pdl)
  const int64_t o = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (o >= hidden) return;
  const int64_t t = blockIdx.y;
  float acc = 0.0f;
  for (int s = 0; s < top_k; ++s) {
    const int e = ids[t * ids_stride + s];
    if (held(table, num_experts, e)) acc += w[t * w_stride + s] * y[(t * top_k + s) * hidden + o];
  }
  out[t * out_stride + o] = acc;
}

// ---- host helpers ----------------------------------------------------------------------------------
void check_2d(const TensorView& v, DType dtype, const char* what) {
  MLA_CHECK(v.dtype == dtype && v.ndim == 2 && v.inner_contiguous(), "{}: {} must be {} 2-D with contiguous rows",
            what, v.describe(), dtype_name(dtype));
  MLA_CHECK(v.data != nullptr || v.numel() == 0, "{}: null data", what);
}

MoeFormat format_of(const ops::Weight& w) {
  switch (w.format) {
    case ops::WeightFormat::Dense:
      if (w.data.dtype == DType::BF16) return MoeFormat::BF16;
      if (w.data.dtype == DType::F16) return MoeFormat::F16;
      return MoeFormat::F32;
    case ops::WeightFormat::Fp8Block128: return MoeFormat::FP8;
    case ops::WeightFormat::Int4Group32:
      if (w.scale.dtype == DType::BF16) return MoeFormat::I4_BF16;
      if (w.scale.dtype == DType::F16) return MoeFormat::I4_F16;
      return MoeFormat::I4_F32;
  }
  return MoeFormat::F32;
}

// Rows readable as 16-byte aligned chunks (moe::moe_decode_kernel's loads): base and row pitch in
// bytes both multiples of 16. data_stride counts elements (Dense, FP8) or int32 words (INT4).
bool chunk_aligned(const DeviceWeight& d) {
  const auto addr = reinterpret_cast<uintptr_t>(d.data);
  const int64_t unit = d.format == ops::WeightFormat::Fp8Block128   ? 1
                       : d.format == ops::WeightFormat::Int4Group32 ? 4
                                                                    : int64_t(dtype_size(d.data_dtype));
  return addr % 16 == 0 && (d.data_stride * unit) % 16 == 0;
}

// True when `d` is still device_weight(w): the table entry can be reused as is.
bool same_weight(const ops::Weight& w, const DeviceWeight& d) {
  const bool dense = w.format == ops::WeightFormat::Dense;
  return d.format == w.format && d.out == w.out_features && d.in == w.in_features && d.data == w.data.data &&
         d.data_dtype == w.data.dtype && d.data_stride == w.data.stride[0] &&
         d.scale == (dense ? nullptr : w.scale.data) && (dense || (d.scale_dtype == w.scale.dtype &&
                                                                   d.scale_stride == w.scale.stride[0]));
}

bool same_source(const ops::ExpertWeights& ew, const DeviceExpert& d) {
  if (ew.gate_proj.empty()) return d.gate.data == nullptr;
  return same_weight(ew.gate_proj, d.gate) && same_weight(ew.up_proj, d.up) && same_weight(ew.down_proj, d.down);
}

void check_expert_weight(const ops::Weight& w, int64_t out_features, int64_t in_features, size_t e,
                         const char* name) {
  const Status st = ops::validate_weight(w);
  MLA_CHECK(st.is_ok(), "expert {} {}: {}", e, name, st.message());
  MLA_CHECK(w.out_features == out_features && w.in_features == in_features, "expert {} {} is [{}, {}], want [{}, {}]",
            e, name, w.out_features, w.in_features, out_features, in_features);
}

// The cached device table of `experts`, (re)built outside capture when the span is new or changed.
const MoeExpertTable& expert_table(GpuBackend& backend, std::span<const ops::ExpertWeights> experts) {
  MoeState& state = backend.moe_state();
  std::unique_ptr<MoeExpertTable>* slot = nullptr;
  for (auto& t : state.tables)
    if (t->key_data == experts.data() && t->key_size == experts.size()) slot = &t;
  if (slot != nullptr) {
    bool same = true;
    for (size_t e = 0; e < experts.size() && same; ++e) same = same_source(experts[e], (*slot)->host[e]);
    if (same) return **slot;
  }
  MLA_CHECK(!backend.capturing(), "moe_experts: new expert table ({} experts) needed while capturing a graph",
            experts.size());
  auto table_ptr = std::make_unique<MoeExpertTable>();
  MoeExpertTable& table = *table_ptr;
  table.key_data = experts.data();
  table.key_size = experts.size();
  table.host.resize(experts.size());
  bool first = true;
  for (size_t e = 0; e < experts.size(); ++e) {
    const ops::ExpertWeights& ew = experts[e];
    if (ew.gate_proj.empty()) continue;  // not held by this rank
    if (first) {
      table.inter = ew.gate_proj.out_features;
      table.hidden = ew.gate_proj.in_features;
      table.format = format_of(ew.gate_proj);
      first = false;
    }
    check_expert_weight(ew.gate_proj, table.inter, table.hidden, e, "gate_proj");
    check_expert_weight(ew.up_proj, table.inter, table.hidden, e, "up_proj");
    check_expert_weight(ew.down_proj, table.hidden, table.inter, e, "down_proj");
    MLA_CHECK(format_of(ew.gate_proj) == table.format && format_of(ew.up_proj) == table.format &&
                  format_of(ew.down_proj) == table.format,
              "moe_experts: expert {} mixes weight formats (one format per expert set)", e);
    DeviceExpert& d = table.host[e];
    d.gate = device_weight(ew.gate_proj);
    d.up = device_weight(ew.up_proj);
    d.down = device_weight(ew.down_proj);
    d.vec_gate_up = chunk_aligned(d.gate) && chunk_aligned(d.up) ? 1 : 0;
    d.vec_down = chunk_aligned(d.down) ? 1 : 0;
    table.all_vec = table.all_vec && d.vec_gate_up != 0 && d.vec_down != 0;
    for (const DeviceWeight* w : {&d.gate, &d.up, &d.down})
      if (w->format == ops::WeightFormat::Int4Group32)
        table.scale_pairs = table.scale_pairs && reinterpret_cast<uintptr_t>(w->scale) % 4 == 0 &&
                            w->scale_stride * int64_t(dtype_size(w->scale_dtype)) % 4 == 0;
  }
  if (!experts.empty()) {
    const size_t bytes = experts.size() * sizeof(DeviceExpert);
    table.device = backend.alloc(bytes);
    // The host vector lives in the cache, so the async copy's source outlives the copy.
    MLA_GPU_CHECK(memcpy_h2d(table.device.data(), table.host.data(), bytes, backend.stream()));
    // The tensor-core decode's weight rings (gpu_decode_tc.h) where the format, shape and device
    // allow them and every expert's rows are aligned for the copy engine.
    if (moe_tc_ring_ok(table.format, table.hidden, table.inter)) {
      table.ring_maps_host.resize(experts.size() * kMoeRingMapsPerExpert);
      if (moe_tc_ring_maps(table.host.data(), int64_t(experts.size()), table.hidden, table.inter,
                           table.ring_maps_host.data())) {
        const size_t map_bytes = table.ring_maps_host.size() * sizeof(MoeRingMap);
        table.ring_maps = backend.alloc(map_bytes);
        MLA_GPU_CHECK(memcpy_h2d(table.ring_maps.data(), table.ring_maps_host.data(), map_bytes, backend.stream()));
      } else {
        table.ring_maps_host.clear();
      }
    }
  }
  if (slot != nullptr) *slot = std::move(table_ptr);  // frees the stale table (cudaFree waits for its users)
  else state.tables.push_back(std::move(table_ptr));
  return table;
}

size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

struct ExpertLaunch {
  const DeviceExpert* table;
  Plan plan;
  const float* x;
  int64_t x_stride;
  int x_vec;
  int top_k;
  int64_t hidden, inter, inter_pad;
  float* h;
  float* y;
  int slots, max_tiles, pairs;
};

template <MoeFormat F> void launch_experts(const ExpertLaunch& a, bool decode, Stream stream) {
  if (decode) {
    constexpr int kRowsGateUp = moe::kThreads / kWarpSize * moe::decode_rows<F, true>();
    constexpr int kRowsDown = moe::kThreads / kWarpSize * moe::decode_rows<F, false>();
    const dim3 g1(unsigned(a.slots), unsigned((a.inter + kRowsGateUp - 1) / kRowsGateUp));
    moe::moe_decode_kernel<F, true><<<g1, moe::kThreads, 0, stream>>>(a.table, a.plan, a.x, a.x_stride, a.x_vec,
                                                                      a.top_k, a.inter, a.hidden, a.h, a.inter_pad);
    MLA_GPU_LAUNCH_CHECK();
    const dim3 g2(unsigned(a.slots), unsigned((a.hidden + kRowsDown - 1) / kRowsDown));
    moe::moe_decode_kernel<F, false><<<g2, moe::kThreads, 0, stream>>>(a.table, a.plan, a.h, a.inter_pad, 1,
                                                                       a.top_k, a.hidden, a.inter, a.y, a.hidden);
    MLA_GPU_LAUNCH_CHECK();
  } else {
    const dim3 g1(unsigned(a.max_tiles), unsigned((a.inter + moe::kBN - 1) / moe::kBN));
    moe::moe_grouped_kernel<F, true><<<g1, moe::kThreads, 0, stream>>>(a.table, a.plan, a.x, a.x_stride, a.top_k,
                                                                       a.inter, a.hidden, a.h, a.inter_pad);
    MLA_GPU_LAUNCH_CHECK();
    const dim3 g2(unsigned(a.max_tiles), unsigned((a.hidden + moe::kBN - 1) / moe::kBN));
    moe::moe_grouped_kernel<F, false><<<g2, moe::kThreads, 0, stream>>>(a.table, a.plan, a.h, a.inter_pad, a.top_k,
                                                                        a.hidden, a.inter, a.y, a.hidden);
    MLA_GPU_LAUNCH_CHECK();
  }
}

void dispatch_experts(MoeFormat f, const ExpertLaunch& a, bool decode, Stream stream) {
  switch (f) {
    case MoeFormat::BF16: return launch_experts<MoeFormat::BF16>(a, decode, stream);
    case MoeFormat::F16: return launch_experts<MoeFormat::F16>(a, decode, stream);
    case MoeFormat::F32: return launch_experts<MoeFormat::F32>(a, decode, stream);
    case MoeFormat::FP8: return launch_experts<MoeFormat::FP8>(a, decode, stream);
    case MoeFormat::I4_BF16: return launch_experts<MoeFormat::I4_BF16>(a, decode, stream);
    case MoeFormat::I4_F16: return launch_experts<MoeFormat::I4_F16>(a, decode, stream);
    case MoeFormat::I4_F32: return launch_experts<MoeFormat::I4_F32>(a, decode, stream);
  }
}

// The MoE state of `gpu`, which the knobs below require to be the GPU backend (`knob` names the caller).
MoeState& moe_state_of(ops::Backend& gpu, const char* knob) {
  auto* backend = dynamic_cast<GpuBackend*>(&gpu);
  MLA_CHECK(backend != nullptr, "{}: backend '{}' is not the GPU backend", knob, gpu.name());
  return backend->moe_state();
}
}  // namespace

void set_moe_path(ops::Backend& gpu, MoePath path) { moe_state_of(gpu, "set_moe_path").path = path; }
void set_moe_tc_k_split(ops::Backend& gpu, bool split) { moe_state_of(gpu, "set_moe_tc_k_split").tc_k_split = split; }
void set_moe_tc_fused(ops::Backend& gpu, std::optional<bool> fused) {
  moe_state_of(gpu, "set_moe_tc_fused").tc_fused = fused;
}
void set_moe_tc_ring(ops::Backend& gpu, bool ring) { moe_state_of(gpu, "set_moe_tc_ring").tc_ring = ring; }
void set_moe_tc_probe(ops::Backend& gpu, MoeTcProbe probe) {
  moe_state_of(gpu, "set_moe_tc_probe").tc_probe = int(probe);
}
bool moe_tc_last_ring(ops::Backend& gpu) { return moe_state_of(gpu, "moe_tc_last_ring").tc_last_ring; }

void GpuBackend::moe_route(const TensorView& router_logits, const TensorView& bias, const ops::MoeRouting& routing,
                           const TensorView& topk_ids, const TensorView& topk_weights) {
  check_2d(router_logits, DType::F32, "moe_route router_logits");
  check_2d(topk_ids, DType::I32, "moe_route topk_ids");
  check_2d(topk_weights, DType::F32, "moe_route topk_weights");
  const int64_t num_tokens = router_logits.dim(0), num_experts = router_logits.dim(1);
  const int64_t top_k = routing.top_k, n_group = routing.n_group, topk_group = routing.topk_group;
  MLA_CHECK(topk_ids.dim(0) == num_tokens && topk_ids.dim(1) == top_k && topk_weights.dim(0) == num_tokens &&
                topk_weights.dim(1) == top_k,
            "moe_route: logits {} ids {} weights {} top_k {}", router_logits.describe(), topk_ids.describe(),
            topk_weights.describe(), top_k);
  const bool has_bias = bias.data != nullptr;
  if (has_bias)
    MLA_CHECK(bias.dtype == DType::F32 && bias.ndim == 1 && bias.dim(0) == num_experts,
              "moe_route bias: {} (want F32[{}])", bias.describe(), num_experts);
  MLA_CHECK(n_group >= 1 && num_experts % n_group == 0 && topk_group >= 1 && topk_group <= n_group,
            "moe_route: {} experts in {} groups, keep {}", num_experts, n_group, topk_group);
  const int64_t group_size = num_experts / n_group;
  MLA_CHECK(n_group == 1 || group_size >= 2, "moe_route: group score needs >= 2 experts per group, got {}",
            group_size);
  MLA_CHECK(top_k >= 1 && top_k <= topk_group * group_size, "moe_route: top_k {} of {} selectable experts", top_k,
            topk_group * group_size);
  MLA_CHECK(num_experts <= kMaxRouteExperts, "moe_route: {} experts (at most {})", num_experts, kMaxRouteExperts);
  if (num_tokens == 0) return;
  // One warp per token; as many tokens per block as fit the default 48 KB of shared memory (E <= 4096
  // keeps one warp's 4 * (E + n_group + top_k) bytes under 40 KB).
  const size_t warp_smem = size_t(num_experts + n_group + top_k) * sizeof(float);
  const int64_t warps =
      std::clamp<int64_t>(int64_t((48 << 10) / warp_smem), 1, std::min<int64_t>(kRouteWarps, num_tokens));
  const int64_t blocks = (num_tokens + warps - 1) / warps;
  MLA_CHECK(blocks < (int64_t(1) << 31), "moe_route: {} tokens", num_tokens);
  launch_maybe_pdl(moe_route_kernel, dim3(unsigned(blocks)), dim3(unsigned(warps * kWarpSize)),
                   size_t(warps) * warp_smem, true, stream(),
      router_logits.as<const float>(), router_logits.stride[0], has_bias ? bias.as<const float>() : nullptr,
      has_bias ? bias.stride[0] : 0, int(num_tokens), int(num_experts), int(n_group), int(topk_group), int(top_k),
      routing.norm_topk_prob ? 1 : 0, routing.routed_scaling_factor, topk_ids.as<int32_t>(), topk_ids.stride[0],
      topk_weights.as<float>(), topk_weights.stride[0]);
  MLA_GPU_LAUNCH_CHECK();
}

void GpuBackend::moe_experts(const TensorView& x, const TensorView& topk_ids, const TensorView& topk_weights,
                             std::span<const ops::ExpertWeights> experts, const TensorView& out) {
  check_2d(x, DType::F32, "moe_experts x");
  check_2d(out, DType::F32, "moe_experts out");
  check_2d(topk_ids, DType::I32, "moe_experts topk_ids");
  check_2d(topk_weights, DType::F32, "moe_experts topk_weights");
  MLA_CHECK(same_shape(x, out), "moe_experts: x {} out {}", x.describe(), out.describe());
  MLA_CHECK(x.numel() == 0 || x.data != out.data, "moe_experts: out aliases x");
  const int64_t num_tokens = x.dim(0), hidden = x.dim(1), top_k = topk_ids.dim(1);
  MLA_CHECK(topk_ids.dim(0) == num_tokens && topk_weights.dim(0) == num_tokens && topk_weights.dim(1) == top_k,
            "moe_experts: x {} ids {} weights {}", x.describe(), topk_ids.describe(), topk_weights.describe());
  const int64_t num_experts = int64_t(experts.size());
  MLA_CHECK(num_experts <= kMaxExperts, "moe_experts: {} experts (at most {})", num_experts, kMaxExperts);
  if (num_tokens == 0 || hidden == 0) return;
  // Ids outside [0, E) cannot be checked without a sync: such pairs contribute 0 (the CPU aborts).
  const MoeExpertTable& table = expert_table(*this, experts);
  const int64_t inter = table.inter;
  MLA_CHECK(inter == 0 || table.hidden == hidden, "moe_experts: experts take {} features, x has {}", table.hidden,
            hidden);
  const MoePath path = moe_->path != MoePath::Auto ? moe_->path
                                                   : (num_tokens <= kDecodeMaxTokens ? MoePath::Decode : MoePath::Grouped);
  // Serving precision: the tensor-core decode kernel where its constraint holds (gpu_decode_tc.h),
  // else the exact fp32 decode kernel. Depends on shapes, format and device only: graph-stable.
  if (moe_->tc_device < 0) moe_->tc_device = moe_tc_device_ok() ? 1 : 0;
  const bool use_tc = path == MoePath::Decode && options().gemm_precision == GemmPrecision::Bf16 &&
                      moe_->tc_device == 1 && inter > 0 && table.all_vec && table.scale_pairs &&
                      moe_tc_shape_ok(table.format, hidden, inter);
  // Prefill in Bf16 mode: the tensor-core grouped GEMM where its constraint holds (gpu_moe_grouped_tc.h).
  static_assert(kMoeGroupedTcRows % moe::kBM == 0, "grouped tc CTAs cover whole plan tiles");
  const bool use_grouped_tc = path == MoePath::Grouped && options().gemm_precision == GemmPrecision::Bf16 &&
                              moe_->tc_device == 1 && inter > 0 &&
                              moe_grouped_tc_ok(table.format, hidden, inter, table.all_vec);

  // Token chunks bound the [pairs, I] + [pairs, H] intermediates (prefill only; decode is one chunk).
  const int64_t inter_pad = (inter + 3) / 4 * 4;  // 16-byte aligned h rows for the decode down pass
  const int64_t per_token = std::max<int64_t>(1, top_k * (inter_pad + hidden) * int64_t(sizeof(float)));
  const int64_t max_chunk_bytes = int64_t(use_grouped_tc ? kMaxChunkBytesGroupedTc : kMaxChunkBytes);
  const int64_t chunk_cap = std::clamp<int64_t>(max_chunk_bytes / per_token, 1, std::min<int64_t>(num_tokens, 65535));
  // Balanced chunks (T 4096 at a 3640 cap: 2 x 2048, not 3640 + 456); one chunk when T fits the cap.
  const int64_t num_chunks = (num_tokens + chunk_cap - 1) / chunk_cap;
  const int64_t chunk = (num_tokens + num_chunks - 1) / num_chunks;
  const int64_t max_pairs = chunk * top_k;
  const int64_t max_tiles = (max_pairs + moe::kBM - 1) / moe::kBM + std::min(num_experts, max_pairs);
  const size_t sz_offsets = align_up(size_t(num_experts + 1) * 4, 256), sz_active = align_up(size_t(num_experts + 1) * 4, 256);
  const size_t sz_sorted = align_up(size_t(max_pairs + 1) * 4, 256), sz_tiles = align_up(size_t(max_tiles + 1) * 4, 256);
  const size_t sz_counters = 256, sz_h = align_up(size_t(max_pairs * inter_pad) * 4, 256);
  const size_t sz_y = align_up(size_t(max_pairs * hidden) * 4, 256);
  const size_t sz_tc = use_tc ? align_up(moe_tc_scratch_bytes(table.format, chunk, max_pairs, hidden, inter), 256) : 0;
  char* base = static_cast<char*>(moe_->scratch.get(
      *this, sz_offsets + sz_active + sz_sorted + 2 * sz_tiles + sz_counters + sz_h + sz_y + sz_tc));
  Plan plan;
  plan.offsets = reinterpret_cast<int32_t*>(base);
  plan.active = reinterpret_cast<int32_t*>(base += sz_offsets);
  plan.sorted = reinterpret_cast<int32_t*>(base += sz_active);
  plan.tile_expert = reinterpret_cast<int32_t*>(base += sz_sorted);
  plan.tile_start = reinterpret_cast<int32_t*>(base += sz_tiles);
  plan.counters = reinterpret_cast<int32_t*>(base += sz_tiles);
  float* h = reinterpret_cast<float*>(base += sz_counters);
  float* y = reinterpret_cast<float*>(base += sz_h);
  void* tc_scratch = base + sz_y;
  // Tensor-core decode counters (zero-filled when allocated, left zero by every call): a ticket per
  // gate/up tile for the K split, then the fused grid's queue (head, exited, one per expert slot).
  const int64_t max_slots = std::min(num_experts, max_pairs);
  unsigned* tc_tickets = use_tc ? moe_->tc_tickets.get_as<unsigned>(*this, size_t(max_slots * (inter / 64) + 2 + max_slots))
                                : nullptr;
  // The fused grid's CTA count, asked once per device and format; 0 where no call could use it.
  int fused_ctas = 0;
  // The weight rings where the table has their maps (format, shape, device and alignment allow them).
  const bool ring = use_tc && moe_->tc_ring && table.ring_maps.data() != nullptr;
  if (use_tc && moe_->tc_fused.value_or(true)) {
    int& grid = moe_->tc_fused_grid[table.format == MoeFormat::FP8 ? 0 : 1][ring ? 1 : 0];
    if (grid == 0) grid = moe_tc_fused_grid(table.format, ring);
    fused_ctas = grid;
  }

  const auto* dev_table = static_cast<const DeviceExpert*>(table.device.data());
  for (int64_t t0 = 0; t0 < num_tokens; t0 += chunk) {
    const int64_t tn = std::min(chunk, num_tokens - t0), pairs = tn * top_k;
    const int32_t* ids = topk_ids.at<const int32_t>(t0);
    // The fused tensor-core grid builds its own plan from the ids where they are few (decode batches
    // up to 4 at top-8): no plan kernel before it.
    const bool fused_now = use_tc && pairs > 0 && fused_ctas > 0 &&
                           moe_->tc_fused.value_or(moe_tc_fused_auto(table.format, tn, ring));
    const bool grid_plan = fused_now && pairs <= kGridPlanMaxPairs;
    if (!grid_plan) {
      launch_maybe_pdl(moe_plan_kernel, dim3(1), dim3(moe_plan_threads(num_experts, pairs)), 0, true, stream(),
                       dev_table, int(num_experts), ids, topk_ids.stride[0], int(tn), int(top_k), plan);
      MLA_GPU_LAUNCH_CHECK();
    }
    if (use_tc && pairs > 0) {
      MoeTcArgs a;
      a.table = dev_table;
      a.plan = plan;
      a.x = x.at<const float>(t0);
      a.x_stride = x.stride[0];
      a.tokens = int(tn);
      a.top_k = int(top_k);
      a.pairs = int(pairs);
      a.slots = int(std::min(num_experts, pairs));
      a.hidden = hidden;
      a.inter = inter;
      a.scratch = tc_scratch;
      a.y = y;
      a.k_tickets = moe_->tc_k_split ? tc_tickets : nullptr;
      a.fused_ctas = fused_now ? fused_ctas : 0;
      if (grid_plan) a.grid_plan = {ids, topk_ids.stride[0], int(num_experts), int(top_k), int(pairs), dev_table};
      a.queue = tc_tickets + max_slots * (inter / 64);
      a.ring_maps = ring ? static_cast<const MoeRingMap*>(table.ring_maps.data()) : nullptr;
      moe_->tc_last_ring = ring;
      a.probe = moe_->tc_probe;
      MLA_CHECK(a.probe == 0 || (ring && a.fused_ctas > 0),
                "set_moe_tc_probe: this call runs no fused ring grid (format, device or set_moe_tc_fused)");
      moe_tc_launch(table.format, a, stream());
    } else if (inter > 0 && pairs > 0) {
      ExpertLaunch a;
      a.table = dev_table;
      a.plan = plan;
      a.x = x.at<const float>(t0);
      a.x_stride = x.stride[0];
      a.x_vec = (reinterpret_cast<uintptr_t>(x.data) % 16 == 0 && x.stride[0] % 4 == 0) ? 1 : 0;
      a.top_k = int(top_k);
      a.hidden = hidden;
      a.inter = inter;
      a.inter_pad = inter_pad;
      a.h = h;
      a.y = y;
      a.slots = int(std::min(num_experts, pairs));
      a.pairs = int(pairs);
      a.max_tiles = int((pairs + moe::kBM - 1) / moe::kBM + std::min(num_experts, pairs));
      if (use_grouped_tc && a.max_tiles <= kMoeGroupedTcMaxTiles) {
        // bf16 h fits the fp32 h scratch; bf16 x fits y, which is dead until the down pass writes it.
        MoeGroupedTcArgs g{dev_table, plan, moe::kBM, a.max_tiles, a.x, a.x_stride, int(tn), int(top_k),
                           hidden, inter, reinterpret_cast<uint16_t*>(y), reinterpret_cast<uint16_t*>(h), y};
        moe_grouped_tc_launch(table.format, g, stream());
      } else {
        dispatch_experts(table.format, a, path == MoePath::Decode, stream());
      }
    }
    const dim3 grid(unsigned((hidden + 255) / 256), unsigned(tn));
    launch_maybe_pdl(moe_combine_kernel, grid, dim3(256), 0, true, stream(), dev_table, int(num_experts), ids,
                     topk_ids.stride[0], topk_weights.at<const float>(t0), topk_weights.stride[0], int(top_k), y,
                     hidden, out.at<float>(t0), out.stride[0]);
    MLA_GPU_LAUNCH_CHECK();
  }
}

}  // namespace mla::gpu
