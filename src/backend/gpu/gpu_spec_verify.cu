// GPU speculative_verify (issue #8): chain verification by rejection sampling with the CPU reference's
// semantics (cpu_spec_verify.cpp). One 1024-thread block per sequence, no scratch, a grid fixed by the
// shape, so it is graph-capturable. The accept chain (<= K scalar tests) runs on one thread; the extra
// token is an inverse-CDF draw over the row, the residual max(p - q, 0) computed on the fly rather
// than stored (no scratch, at the price of reading p and q twice).
#include <climits>
#include <cstdint>

#include "backend/gpu/gpu_backend_impl.h"

namespace mla::gpu {

namespace {

constexpr int kThreads = 1024;  // one block per sequence; a multiple of every kWarpSize
constexpr int kMaxWarps = kThreads / kWarpSize;

struct VerifyArgs {
  const float* draft_probs;  // [B, K, V], strides dp_b, dp_k (V contiguous); unread when K = 0
  int64_t dp_b, dp_k;
  const int32_t* draft_ids;  // [B, K], row stride ids_b
  int64_t ids_b;
  const int32_t* num_drafts;  // [B], stride nd
  int64_t nd;
  const float* target_probs;  // [B, K + 1, V], strides tp_b, tp_k
  int64_t tp_b, tp_k;
  const float* uniforms;  // [B, K + 1], row stride u_b
  int64_t u_b;
  int32_t* out_ids;  // [B, K + 1], row stride o_b
  int64_t o_b;
  int32_t* out_num_emitted;  // [B], stride e
  int64_t e;
  int max_drafts;  // K
  int vocab;       // V
};

// Block-wide min (kMin) or max of an int; every thread gets it. All threads call it.
template <bool kMin> __device__ int block_extreme(int v, int* smem) {
  for (int m = kWarpSize / 2; m > 0; m /= 2) {
    const int o = shfl_xor(v, m);
    v = kMin ? min(v, o) : max(v, o);
  }
  const int lane = int(threadIdx.x) % kWarpSize, warp = int(threadIdx.x) / kWarpSize;
  __syncthreads();  // smem may still be read by a previous call
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  int r = smem[0];
  for (int w = 1; w < int(blockDim.x) / kWarpSize; ++w) r = kMin ? min(r, smem[w]) : max(r, smem[w]);
  return r;
}

// Calls f(i, w_i) for i in [begin, end) in ascending order until f returns true, where w_i = p[i], or the
// residual max(p[i] - q[i], 0) in fp32 when q is non-null (the CPU's std::fmax: 0 for NaN as well).
// Float4 loads when both rows are 16-byte aligned at `begin` (block-uniform: begin is a multiple of 8).
template <typename F>
__device__ __forceinline__ void walk_chunk(const float* p, const float* q, int begin, int end, F&& f) {
  int i = begin;
  const uintptr_t addr = reinterpret_cast<uintptr_t>(p + begin) | (q ? reinterpret_cast<uintptr_t>(q + begin) : 0);
  if ((addr & 15u) == 0) {
    for (; i + 3 < end; i += 4) {
      float4 w = *reinterpret_cast<const float4*>(p + i);
      if (q) {
        const float4 d = *reinterpret_cast<const float4*>(q + i);
        w = make_float4(fmaxf(w.x - d.x, 0.0f), fmaxf(w.y - d.y, 0.0f), fmaxf(w.z - d.z, 0.0f), fmaxf(w.w - d.w, 0.0f));
      }
      if (f(i, w.x) || f(i + 1, w.y) || f(i + 2, w.z) || f(i + 3, w.w)) return;
    }
  }
  for (; i < end; ++i) {
    const float w = q ? fmaxf(p[i] - q[i], 0.0f) : p[i];
    if (f(i, w)) return;
  }
}

// The inverse-CDF rule of sample_from_probs (gpu_sampling.cu's sample_kernel, cpu_util.h's
// inverse_cdf_pick) over the weights of walk_chunk(p, q): each thread owns a contiguous chunk of ~V /
// blockDim entries, sums it in double, a block scan gives each chunk's starting cumsum, then the lowest
// index with w > 0 and cumsum > u * total wins (w > 0 explicitly, so a zero weight never wins where the
// scan's association rounds differently from the CPU's sequential sum). No candidate (a rounding
// shortfall at the end) -> the last positive index; no positive weight -> -1. Block-uniform result.
// Precondition: all threads call it. bytes ~ 2 passes over p (and q): 8V (16V for a residual).
__device__ int pick_inverse_cdf(const float* p, const float* q, int vocab, float u, double* scan, int* ismem) {
  const int tid = int(threadIdx.x), threads = int(blockDim.x);
  const int chunk = ((vocab + threads - 1) / threads + 7) / 8 * 8;  // multiple of 8: 32-byte aligned chunks
  const int begin = min(vocab, tid * chunk), end = min(vocab, begin + chunk);
  double local = 0.0;
  int last_positive = -1;
  walk_chunk(p, q, begin, end, [&](int i, float w) {
    local += double(w);
    if (w > 0.0f) last_positive = i;
    return false;
  });
  __syncthreads();  // scan may still be read by a previous call
  scan[tid] = local;
  __syncthreads();
  for (int off = 1; off < threads; off *= 2) {  // inclusive prefix sums over the chunks (Hillis-Steele)
    const double add = tid >= off ? scan[tid - off] : 0.0;
    __syncthreads();
    scan[tid] += add;
    __syncthreads();
  }
  const double target = double(u) * scan[threads - 1];
  double cumsum = tid > 0 ? scan[tid - 1] : 0.0;
  int chosen = INT_MAX;
  walk_chunk(p, q, begin, end, [&](int i, float w) {
    cumsum += double(w);
    if (w > 0.0f && cumsum > target) {
      chosen = i;
      return true;
    }
    return false;
  });
  chosen = block_extreme<true>(chosen, ismem);
  last_positive = block_extreme<false>(last_positive, ismem);
  return chosen != INT_MAX ? chosen : last_positive;
}

// grid = B, block = kThreads. Per sequence: <= K scalar accept tests (4 scattered loads each), then one
// inverse-CDF draw: bytes ~ 8V from p_n (bonus) or 16V from p_i and q_i (residual; +8V in the rare
// all-zero fallback). FLOPs are negligible; at V = 163840 a row is ~2.6 MB of reads, bound by one
// SM's load throughput as sample_from_probs is.
__global__ void __launch_bounds__(kThreads) speculative_verify_kernel(VerifyArgs a) {
  __shared__ double scan[kThreads];
  __shared__ int ismem[kMaxWarps];
  __shared__ int s_accepted, s_rejected;
  const int64_t b = blockIdx.x;
  const int tid = int(threadIdx.x);
  const int32_t* ids = a.draft_ids + b * a.ids_b;
  const float* u_row = a.uniforms + b * a.u_b;
  if (tid == 0) {
    // num_drafts and draft ids are device data (the CPU CHECKs them; a device check would need a
    // sync): n is clamped to [0, K] and an out-of-range id is rejected, so bad input cannot read out
    // of bounds.
    const int n = min(max(a.num_drafts[b * a.nd], 0), a.max_drafts);
    int accepted = 0;
    for (; accepted < n; ++accepted) {
      const int d = ids[accepted];
      if (d < 0 || d >= a.vocab) break;
      const float q = a.draft_probs[b * a.dp_b + accepted * a.dp_k + d];
      const float p = a.target_probs[b * a.tp_b + accepted * a.tp_k + d];
      if (!(u_row[accepted] * q < p)) break;  // the CPU's test, fp32, no division
    }
    s_accepted = accepted;
    s_rejected = accepted < n ? 1 : 0;
  }
  __syncthreads();
  const int accepted = s_accepted;  // block-uniform from here on
  const float u_extra = u_row[a.max_drafts];
  const float* p = a.target_probs + b * a.tp_b + accepted * a.tp_k;
  int extra = -1;
  if (s_rejected) {
    const float* q = a.draft_probs + b * a.dp_b + accepted * a.dp_k;
    extra = pick_inverse_cdf(p, q, a.vocab, u_extra, scan, ismem);
  }
  // Bonus token, or an all-zero residual: from p itself. -1 stays only for a row of p with no positive
  // entry (the CPU CHECKs it).
  if (extra < 0) extra = pick_inverse_cdf(p, nullptr, a.vocab, u_extra, scan, ismem);
  int32_t* out = a.out_ids + b * a.o_b;
  for (int j = tid; j <= a.max_drafts; j += int(blockDim.x))
    out[j] = j < accepted ? ids[j] : j == accepted ? extra : -1;
  if (tid == 0) a.out_num_emitted[b * a.e] = accepted + 1;
}

// ---- host-side checks (the CPU backend's, which are the specification) -----------------------------
constexpr const char* kOp = "speculative_verify";

// dtype, rank, leading dims, contiguous last dim, non-null.
void check_dims(const TensorView& v, DType dtype, std::initializer_list<int64_t> dims, const char* what) {
  MLA_CHECK(v.dtype == dtype && v.ndim == int(dims.size()) && (v.ndim == 1 || v.inner_contiguous()),
            "{}: {} is {} (want {} of rank {}, rows contiguous)", kOp, what, v.describe(), dtype_name(dtype),
            dims.size());
  int d = 0;
  for (int64_t want : dims) {
    MLA_CHECK(v.dim(d) == want, "{}: {} is {} (dim {} should be {})", kOp, what, v.describe(), d, want);
    ++d;
  }
  check_device_view(v, kOp, what);
}

}  // namespace

// Device-read values (num_drafts, draft ids, uniforms, probabilities) are preconditions, not checked:
// reading them on the host would need a sync and break graph replay. Outputs must not alias inputs
// (the CPU checks it; the kernel reads draft ids while writing out_ids).
void GpuBackend::speculative_verify(const TensorView& draft_probs, const TensorView& draft_ids,
                                    const TensorView& num_drafts, const TensorView& target_probs,
                                    const TensorView& uniforms, const TensorView& out_ids,
                                    const TensorView& out_num_emitted) {
  MLA_CHECK(target_probs.ndim == 3, "{}: target_probs is {} (want F32 [B, K + 1, V])", kOp, target_probs.describe());
  const int64_t rows = target_probs.dim(0), slots = target_probs.dim(1), vocab = target_probs.dim(2);
  MLA_CHECK(slots >= 1 && vocab >= 1 && slots < (int64_t(1) << 30) && vocab < (int64_t(1) << 31) &&
                rows < (int64_t(1) << 31),
            "{}: target_probs {} needs 1 <= K + 1 < 2^30, 1 <= V < 2^31", kOp, target_probs.describe());
  const int64_t max_drafts = slots - 1;
  check_dims(target_probs, DType::F32, {rows, slots, vocab}, "target_probs");
  check_dims(draft_probs, DType::F32, {rows, max_drafts, vocab}, "draft_probs");
  check_dims(draft_ids, DType::I32, {rows, max_drafts}, "draft_ids");
  check_dims(num_drafts, DType::I32, {rows}, "num_drafts");
  check_dims(uniforms, DType::F32, {rows, slots}, "uniforms");
  check_dims(out_ids, DType::I32, {rows, slots}, "out_ids");
  check_dims(out_num_emitted, DType::I32, {rows}, "out_num_emitted");
  if (rows == 0) return;
  VerifyArgs a{};
  a.draft_probs = draft_probs.as<const float>();
  a.dp_b = draft_probs.stride[0];
  a.dp_k = draft_probs.stride[1];
  a.draft_ids = draft_ids.as<const int32_t>();
  a.ids_b = draft_ids.stride[0];
  a.num_drafts = num_drafts.as<const int32_t>();
  a.nd = num_drafts.stride[0];
  a.target_probs = target_probs.as<const float>();
  a.tp_b = target_probs.stride[0];
  a.tp_k = target_probs.stride[1];
  a.uniforms = uniforms.as<const float>();
  a.u_b = uniforms.stride[0];
  a.out_ids = out_ids.as<int32_t>();
  a.o_b = out_ids.stride[0];
  a.out_num_emitted = out_num_emitted.as<int32_t>();
  a.e = out_num_emitted.stride[0];
  a.max_drafts = int(max_drafts);
  a.vocab = int(vocab);
  speculative_verify_kernel<<<unsigned(rows), kThreads, 0, stream()>>>(a);
  MLA_GPU_LAUNCH_CHECK();
}

}  // namespace mla::gpu
