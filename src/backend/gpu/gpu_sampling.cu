// GPU sampling ops: softmax with temperature, top-k / top-p / min-p renormalization, inverse-CDF
// sampling and argmax, with the CPU reference's semantics (cpu_sampling.cpp). One 1024-thread block
// per row, no scratch and a grid fixed by the shape, so every op is graph-capturable. Top-k / top-p
// pivots are found exactly by a 4-pass radix descent over order-preserving keys of the fp32 values
// (integer shared-memory histograms, hence deterministic) rather than by sorting the row; the price is
// 6 reads of the row (4 radix passes + kept sum + write; L2-resident after the first) and shared-atomics
// contention in the first pass, where most probabilities share their top 8 key bits.
// Measured on H200, V = 163840 (B = 1 / 256, us): softmax 85 / 330, top_k 107 / 395, top_p 129 / 411,
// min_p 64 / 271, sample 37 / 104, argmax 10 / 42. B = 256 is near HBM bandwidth (rows exceed L2);
// B = 1 runs on one SM (a row per block) and is bound by its issue rate: a split-row variant for
// small B is the next step if the sampler shows up in decode profiles.
#include <climits>
#include <cmath>
#include <type_traits>

#include "backend/gpu/gpu_backend_impl.h"
#include "backend/gpu/gpu_sampling_state.h"

namespace mla::gpu {

namespace {

constexpr int kThreads = 1024;  // one block per row; a multiple of every kWarpSize
constexpr int kMaxWarps = kThreads / kWarpSize;
constexpr int kRadixBins = 256;   // 8-bit digits: 4 passes over a 32-bit key
constexpr int kHistCopies = 8;    // warps spread over 8 histogram copies to cut atomics contention
// Top-p masses are summed as integers in units of 2^-40: exact and order-independent. V = 163840
// probabilities <= 1 sum below 2^58; the rounding of each one (<= 2^-41) is far below the fp32
// resolution of a probability near any top_p boundary.
constexpr double kMassScale = 1099511627776.0;  // 2^40

__device__ __forceinline__ float neg_inf() { return -__int_as_float(0x7f800000); }

// Calls f(i, row[i]) once for every i in [0, vocab), each index on one thread, each thread's indices
// in ascending order (so first-seen rules hold and sums are deterministic). One block streams a whole
// row, so it is bound by load latency unless many bytes are in flight: a 16-byte aligned row is read as
// float4s, 4 per thread per step (64 KB in flight per block), anything else as 4 scalars per step.
// f may write element i of an output that aliases row (only this thread touches index i in this call).
template <typename F> __device__ __forceinline__ void for_each_in_row(const float* row, int64_t vocab, F&& f) {
  const int64_t step = blockDim.x;
  int64_t i = threadIdx.x;
  if ((reinterpret_cast<uintptr_t>(row) & 15u) == 0) {  // block-uniform
    const float4* row4 = reinterpret_cast<const float4*>(row);
    const int64_t nvec = vocab / 4;
    int64_t j = threadIdx.x;
    for (; j + 3 * step < nvec; j += 4 * step) {
      float4 q[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) q[u] = row4[j + u * step];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int64_t e = 4 * (j + u * step);
        f(e, q[u].x);
        f(e + 1, q[u].y);
        f(e + 2, q[u].z);
        f(e + 3, q[u].w);
      }
    }
    for (; j < nvec; j += step) {
      const float4 q = row4[j];
      f(4 * j, q.x);
      f(4 * j + 1, q.y);
      f(4 * j + 2, q.z);
      f(4 * j + 3, q.w);
    }
    i = 4 * nvec + threadIdx.x;  // the last vocab % 4 elements
  }
  for (; i + 3 * step < vocab; i += 4 * step) {
    const float v0 = row[i], v1 = row[i + step], v2 = row[i + 2 * step], v3 = row[i + 3 * step];
    f(i, v0);
    f(i + step, v1);
    f(i + 2 * step, v2);
    f(i + 3 * step, v3);
  }
  for (; i < vocab; i += step) f(i, row[i]);
}

// Block-wide min / max of an int (every thread gets it).
template <bool kMin>
__device__ int block_extreme_i32(int v, int* smem) {
  for (int m = kWarpSize / 2; m > 0; m /= 2) {
    const int o = shfl_xor(v, m);
    v = kMin ? min(v, o) : max(v, o);
  }
  const int lane = int(threadIdx.x) % kWarpSize, warp = int(threadIdx.x) / kWarpSize;
  __syncthreads();
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  int r = smem[0];
  for (int w = 1; w < kMaxWarps; ++w) r = kMin ? min(r, smem[w]) : max(r, smem[w]);
  return r;
}

// Monotone map float -> uint32 (a < b as floats implies key(a) < key(b); -0 sorts just below +0).
__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float key_value(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

__device__ __forceinline__ unsigned long long mass_units(float p) {
  return p > 0.0f ? static_cast<unsigned long long>(double(p) * kMassScale + 0.5) : 0ull;
}

// W: unsigned (counts) or unsigned long long (masses). Histograms use only 32-bit shared atomics, which
// are native (64-bit ones are a CAS loop on NVIDIA and measured 2.5x slower): a 64-bit mass is added
// as its low word plus (high word + the carry out of the low word, detected by the adder that caused
// it), which keeps the sum exact and independent of the order of the atomics.
template <typename W> struct RadixSmem {
  static constexpr bool kWide = sizeof(W) > 4;
  unsigned lo[kHistCopies][kRadixBins];              // low 32 bits of each bin's weight
  unsigned hi[kWide ? kHistCopies : 1][kRadixBins];  // high 32 bits (masses only)
  W suffix[kRadixBins];  // inclusive suffix sums of the merged histogram
  int digit[4];          // chosen digit of each pass (-1: none)
  W above[4];            // weight of all keys above the chosen bin of each pass
};

// The largest key K among the row's keys whose weight W(K) = sum of weight(x) over x with
// key(x) >= K is >= target; weight(x) = 1 (kMass false: W counts, so K is the target-th largest) or
// mass_units(x) (kMass true: the top-p boundary). Returns false when the whole row weighs less than
// target (or target == 0). Each pass histograms the next 8 bits of the keys that share the chosen
// prefix and picks the highest bin at which the running suffix weight reaches target; the chosen bin
// is never empty, so after 4 passes the prefix is a key of the row. Block-uniform result.
// Precondition: blockDim.x >= kRadixBins; all threads call it.
template <bool kMass, typename W = std::conditional_t<kMass, unsigned long long, unsigned>>
__device__ bool radix_pivot(const float* row, int64_t vocab, W target, RadixSmem<W>& sm, uint32_t* key_out) {
  const int tid = int(threadIdx.x);
  static_assert(RadixSmem<W>::kWide == kMass, "masses need the wide histogram");
  const int copy = (tid / kWarpSize) % kHistCopies;
  unsigned* hist_lo = &sm.lo[copy][0];
  unsigned* hist_hi = &sm.hi[kMass ? copy : 0][0];
  if (tid < 4) {
    sm.digit[tid] = -1;
    sm.above[tid] = 0;
  }
  uint32_t prefix = 0;  // the high 8 * pass bits chosen so far
  W above = 0;          // weight of the keys above the current prefix's range
  for (int pass = 0; pass < 4; ++pass) {
    const int shift = 24 - 8 * pass;
    for (int j = tid; j < kHistCopies * kRadixBins; j += int(blockDim.x)) {
      (&sm.lo[0][0])[j] = 0;
      if constexpr (kMass) (&sm.hi[0][0])[j] = 0;
    }
    __syncthreads();
    for_each_in_row(row, vocab, [&](int64_t, float v) {
      const uint32_t key = order_key(v);
      if (pass == 0 || (key >> (shift + 8)) == prefix) {
        const unsigned bin = (key >> shift) & 0xffu;
        if constexpr (kMass) {
          const unsigned long long m = mass_units(v);
          const unsigned m_lo = unsigned(m), m_hi = unsigned(m >> 32);
          const unsigned old = atomicAdd(&hist_lo[bin], m_lo);
          const unsigned carry = old + m_lo < old ? 1u : 0u;
          if (m_hi + carry != 0) atomicAdd(&hist_hi[bin], m_hi + carry);
        } else {
          atomicAdd(&hist_lo[bin], 1u);
        }
      }
    });
    __syncthreads();
    if (tid < kRadixBins) {
      W s = 0;
      for (int c = 0; c < kHistCopies; ++c) {
        if constexpr (kMass) s += (W(sm.hi[c][tid]) << 32) + W(sm.lo[c][tid]);
        else s += sm.lo[c][tid];
      }
      sm.suffix[tid] = s;
    }
    __syncthreads();
    for (int off = 1; off < kRadixBins; off *= 2) {  // Hillis-Steele, high bins flow down
      W add = 0;
      if (tid + off < kRadixBins) add = sm.suffix[tid + off];
      __syncthreads();
      if (tid < kRadixBins) sm.suffix[tid] += add;
      __syncthreads();
    }
    // Suffix weights fall as the bin rises, so exactly one bin crosses target when any does.
    if (tid < kRadixBins) {
      const W here = above + sm.suffix[tid];
      const W next = above + (tid + 1 < kRadixBins ? sm.suffix[tid + 1] : W(0));
      if (here >= target && next < target) {
        sm.digit[pass] = tid;
        sm.above[pass] = next;
      }
    }
    __syncthreads();
    const int digit = sm.digit[pass];  // written once per kernel, so no later pass races this read
    if (digit < 0) return false;       // only in pass 0: the row's total weight is below target
    prefix = (prefix << 8) | uint32_t(digit);
    above = sm.above[pass];
  }
  *key_out = prefix;
  return true;
}

// out = in where in >= threshold, else 0, divided by the kept sum (double, as the CPU). out may alias
// in: every thread reads then writes only its own indices, and the sum is complete before any write.
// A kept sum of 0 (the CPU CHECKs it) yields NaN for the kept entries.
__device__ void keep_at_least(const float* in, float* out, int64_t vocab, float threshold, double* smem) {
  double kept = 0.0;
  for_each_in_row(in, vocab, [&](int64_t, float v) {
    if (v >= threshold) kept += double(v);
  });
  kept = block_sum_f64(kept, smem);
  // The reciprocal differs from the CPU's division by at most 1 double ulp, far below fp32 rounding.
  const double inv = 1.0 / kept;
  for_each_in_row(in, vocab, [&](int64_t i, float v) { out[i] = v >= threshold ? float(double(v) * inv) : 0.0f; });
}

// Calls f(i, row[i]) for i in [begin, end) in order until f returns true, 8 floats in flight (two
// float4s when row + begin is 16-byte aligned, else 4 scalars).
template <typename F> __device__ __forceinline__ void for_each_in_chunk(const float* row, int begin, int end, F&& f) {
  int i = begin;
  if ((reinterpret_cast<uintptr_t>(row + begin) & 15u) == 0) {
    for (; i + 7 < end; i += 8) {
      const float4 a = *reinterpret_cast<const float4*>(row + i), b = *reinterpret_cast<const float4*>(row + i + 4);
      if (f(i, a.x) || f(i + 1, a.y) || f(i + 2, a.z) || f(i + 3, a.w) || f(i + 4, b.x) || f(i + 5, b.y) ||
          f(i + 6, b.z) || f(i + 7, b.w))
        return;
    }
  }
  for (; i + 3 < end; i += 4) {
    const float v0 = row[i], v1 = row[i + 1], v2 = row[i + 2], v3 = row[i + 3];
    if (f(i, v0) || f(i + 1, v1) || f(i + 2, v2) || f(i + 3, v3)) return;
  }
  for (; i < end; ++i)
    if (f(i, row[i])) return;
}

__device__ void copy_row(const float* in, float* out, int64_t vocab) {
  if (in == out) return;
  for_each_in_row(in, vocab, [&](int64_t i, float v) { out[i] = v; });
}

// ---- kernels (grid = rows, block = kThreads) --------------------------------------------------------

// 3 passes over the row (L2-resident after the first): bytes ~ V * (4 read + 4 write + 8 re-read),
// FLOPs ~ V * (div + exp). probs may alias logits (same-index read then write per thread).
__global__ void __launch_bounds__(kThreads)
softmax_kernel(const float* logits, int64_t l_stride, const float* temperature, int64_t t_stride, float* probs,
               int64_t p_stride, int64_t vocab) {
  __shared__ float fsmem[kMaxWarps];
  __shared__ double dsmem[kMaxWarps];
  const int64_t b = blockIdx.x;
  const float* z = logits + b * l_stride;
  float* p = probs + b * p_stride;
  // temperature > 0 is a precondition (the CPU CHECKs it; a device check would need a sync).
  const float temp = temperature[b * t_stride];
  float max_z = neg_inf();
  for_each_in_row(z, vocab, [&](int64_t, float v) { max_z = fmaxf(max_z, v / temp); });
  max_z = block_max(max_z, fsmem);
  double sum = 0.0;
  for_each_in_row(z, vocab, [&](int64_t i, float v) {
    const float e = expf(v / temp - max_z);
    p[i] = e;
    sum += double(e);
  });
  sum = block_sum_f64(sum, dsmem);
  const double inv = 1.0 / sum;
  for_each_in_row(p, vocab, [&](int64_t i, float v) { p[i] = float(double(v) * inv); });
}

__global__ void __launch_bounds__(kThreads)
top_k_kernel(const float* probs, int64_t p_stride, const int32_t* top_k, int64_t k_stride, float* out,
             int64_t o_stride, int64_t vocab) {
  __shared__ RadixSmem<unsigned> sm;
  __shared__ double dsmem[kMaxWarps];
  const int64_t b = blockIdx.x;
  const float* row = probs + b * p_stride;
  float* o = out + b * o_stride;
  const int32_t k = top_k[b * k_stride];
  if (k <= 0 || k >= vocab) {
    copy_row(row, o, vocab);
    return;
  }
  uint32_t key = 0;
  radix_pivot<false>(row, vocab, static_cast<unsigned>(k), sm, &key);  // V > k: always found
  keep_at_least(row, o, vocab, key_value(key), dsmem);  // ties at the k-th value all kept
}

__global__ void __launch_bounds__(kThreads)
top_p_kernel(const float* probs, int64_t p_stride, const float* top_p, int64_t tp_stride, float* out,
             int64_t o_stride, int64_t vocab) {
  __shared__ RadixSmem<unsigned long long> sm;
  __shared__ double dsmem[kMaxWarps];
  const int64_t b = blockIdx.x;
  const float* row = probs + b * p_stride;
  float* o = out + b * o_stride;
  const float top = top_p[b * tp_stride];
  if (top >= 1.0f) {
    copy_row(row, o, vocab);
    return;
  }
  // The CPU's boundary is the value where the descending cumsum first reaches top_p, i.e. the largest
  // value v with sum(p >= v) >= top_p; integer masses: S >= top * 2^40 <=> S >= ceil(top * 2^40).
  const unsigned long long target =
      top > 0.0f ? static_cast<unsigned long long>(ceil(double(top) * kMassScale)) : 0ull;
  uint32_t key = 0;
  // Not found: the row sums to less than top_p (rounding), and the CPU then keeps every token.
  const float threshold = radix_pivot<true>(row, vocab, target, sm, &key) ? key_value(key) : neg_inf();
  keep_at_least(row, o, vocab, threshold, dsmem);
}

__global__ void __launch_bounds__(kThreads)
min_p_kernel(const float* probs, int64_t p_stride, const float* min_p, int64_t mp_stride, float* out,
             int64_t o_stride, int64_t vocab) {
  __shared__ float fsmem[kMaxWarps];
  __shared__ double dsmem[kMaxWarps];
  const int64_t b = blockIdx.x;
  const float* row = probs + b * p_stride;
  float* o = out + b * o_stride;
  const float mp = min_p[b * mp_stride];
  if (mp == 0.0f) {
    copy_row(row, o, vocab);
    return;
  }
  float max_p = neg_inf();
  for_each_in_row(row, vocab, [&](int64_t, float v) { max_p = fmaxf(max_p, v); });
  max_p = block_max(max_p, fsmem);
  keep_at_least(row, o, vocab, mp * max_p, dsmem);
}

// Each thread owns a contiguous chunk of ~V / kThreads entries: it sums its chunk (double), a
// block scan gives each chunk's starting cumsum, then every thread re-walks its chunk and the lowest
// index with p > 0 and cumsum > u * total wins. Requiring p > 0 explicitly keeps a zero-probability
// index out even where the scan's association rounds differently from the CPU's sequential sum.
// No candidate (a rounding shortfall at the end) -> the last nonzero index; an all-zero row -> -1.
// bytes ~ 2 reads of the row.
__global__ void __launch_bounds__(kThreads)
sample_kernel(const float* probs, int64_t p_stride, const float* uniforms, int64_t u_stride, int32_t* out_ids,
              int64_t o_stride, int vocab) {
  __shared__ double scan[kThreads];
  __shared__ int ismem[kMaxWarps];
  const int tid = int(threadIdx.x);
  const int64_t b = blockIdx.x;
  const float* row = probs + b * p_stride;
  // Chunks of a multiple of 8 entries, so they start 32-byte aligned when the row is.
  const int chunk = ((vocab + int(blockDim.x) - 1) / int(blockDim.x) + 7) / 8 * 8;
  const int begin = min(vocab, tid * chunk), end = min(vocab, begin + chunk);
  double local = 0.0;
  int last_nonzero = -1;
  for_each_in_chunk(row, begin, end, [&](int i, float v) {
    local += double(v);
    if (v > 0.0f) last_nonzero = i;
    return false;
  });
  scan[tid] = local;
  __syncthreads();
  for (int off = 1; off < int(blockDim.x); off *= 2) {  // inclusive prefix sums over the chunks
    const double add = tid >= off ? scan[tid - off] : 0.0;
    __syncthreads();
    scan[tid] += add;
    __syncthreads();
  }
  const double total = scan[blockDim.x - 1];
  const double target = double(uniforms[b * u_stride]) * total;
  double cumsum = tid > 0 ? scan[tid - 1] : 0.0;
  int chosen = INT_MAX;
  for_each_in_chunk(row, begin, end, [&](int i, float v) {
    cumsum += double(v);
    if (v > 0.0f && cumsum > target) {
      chosen = i;
      return true;
    }
    return false;
  });
  chosen = block_extreme_i32<true>(chosen, ismem);
  last_nonzero = block_extreme_i32<false>(last_nonzero, ismem);
  if (tid == 0) out_ids[b * o_stride] = chosen != INT_MAX ? chosen : last_nonzero;
}

// Lowest index of the maximum: strict '>' within a thread's ascending indices, (value, lower index)
// across threads. bytes: V * 4.
__global__ void __launch_bounds__(kThreads)
argmax_kernel(const float* logits, int64_t l_stride, int32_t* out_ids, int64_t o_stride, int vocab) {
  __shared__ float vsmem[kMaxWarps];
  __shared__ int ismem[kMaxWarps];
  const int tid = int(threadIdx.x);
  const float* z = logits + int64_t(blockIdx.x) * l_stride;
  float best = neg_inf();
  int best_i = INT_MAX;  // INT_MAX: this thread saw no element
  for_each_in_row(z, vocab, [&](int64_t i, float v) {
    if (best_i == INT_MAX || v > best) {
      best = v;
      best_i = int(i);
    }
  });
  for (int m = kWarpSize / 2; m > 0; m /= 2) {
    const float ov = shfl_xor(best, m);
    const int oi = shfl_xor(best_i, m);
    if (ov > best || (ov == best && oi < best_i)) {
      best = ov;
      best_i = oi;
    }
  }
  const int lane = tid % kWarpSize, warp = tid / kWarpSize;
  if (lane == 0) {
    vsmem[warp] = best;
    ismem[warp] = best_i;
  }
  __syncthreads();
  if (tid == 0) {
    for (int w = 1; w < kMaxWarps; ++w)
      if (vsmem[w] > best || (vsmem[w] == best && ismem[w] < best_i)) {
        best = vsmem[w];
        best_i = ismem[w];
      }
    out_ids[int64_t(blockIdx.x) * o_stride] = best_i;
  }
}

// ---- host-side checks (the CPU backend's, which are the specification) -----------------------------
void check_rows(const TensorView& v, const char* op, const char* what) {
  MLA_CHECK(v.dtype == DType::F32 && v.ndim == 2 && v.inner_contiguous(), "{}: {} is {} (want F32 [B, V], rows "
            "contiguous)", op, what, v.describe());
  MLA_CHECK(v.dim(0) < (int64_t(1) << 31) && v.dim(1) < (int64_t(1) << 31), "{}: {} {} too large", op, what,
            v.describe());
  check_device_view(v, op, what);
}

void check_vec(const TensorView& v, DType dtype, int64_t n, const char* op, const char* what) {
  MLA_CHECK(v.dtype == dtype && v.ndim == 1 && v.dim(0) == n, "{}: {} is {} (want {}[{}])", op, what,
            v.describe(), dtype_name(dtype), n);
  check_device_view(v, op, what);
}

void check_renorm(const TensorView& probs, const TensorView& param, DType param_dtype, const TensorView& out,
                  const char* op) {
  check_rows(probs, op, "probs");
  check_rows(out, op, "out");
  MLA_CHECK(same_shape(probs, out), "{}: probs {} out {}", op, probs.describe(), out.describe());
  check_vec(param, param_dtype, probs.dim(0), op, "parameter");
}

}  // namespace

// Device-read parameters (temperature, k, top_p, min_p, uniforms) are preconditions, not checked:
// reading them on the host would need a sync and break graph replay.

void GpuBackend::softmax(const TensorView& logits, const TensorView& temperature, const TensorView& probs) {
  check_rows(logits, "softmax", "logits");
  check_rows(probs, "softmax", "probs");
  MLA_CHECK(same_shape(logits, probs), "softmax: logits {} probs {}", logits.describe(), probs.describe());
  check_vec(temperature, DType::F32, logits.dim(0), "softmax", "temperature");
  if (logits.dim(0) == 0) return;
  softmax_kernel<<<unsigned(logits.dim(0)), kThreads, 0, stream()>>>(
      logits.as<const float>(), logits.stride[0], temperature.as<const float>(), temperature.stride[0],
      probs.as<float>(), probs.stride[0], logits.dim(1));
  MLA_GPU_LAUNCH_CHECK();
}

void GpuBackend::top_k_renorm_prob(const TensorView& probs, const TensorView& top_k, const TensorView& out) {
  check_renorm(probs, top_k, DType::I32, out, "top_k_renorm_prob");
  if (probs.dim(0) == 0) return;
  top_k_kernel<<<unsigned(probs.dim(0)), kThreads, 0, stream()>>>(probs.as<const float>(), probs.stride[0],
                                                                  top_k.as<const int32_t>(), top_k.stride[0],
                                                                  out.as<float>(), out.stride[0], probs.dim(1));
  MLA_GPU_LAUNCH_CHECK();
}

void GpuBackend::top_p_renorm_prob(const TensorView& probs, const TensorView& top_p, const TensorView& out) {
  check_renorm(probs, top_p, DType::F32, out, "top_p_renorm_prob");
  if (probs.dim(0) == 0) return;
  top_p_kernel<<<unsigned(probs.dim(0)), kThreads, 0, stream()>>>(probs.as<const float>(), probs.stride[0],
                                                                  top_p.as<const float>(), top_p.stride[0],
                                                                  out.as<float>(), out.stride[0], probs.dim(1));
  MLA_GPU_LAUNCH_CHECK();
}

void GpuBackend::min_p_renorm_prob(const TensorView& probs, const TensorView& min_p, const TensorView& out) {
  check_renorm(probs, min_p, DType::F32, out, "min_p_renorm_prob");
  if (probs.dim(0) == 0) return;
  min_p_kernel<<<unsigned(probs.dim(0)), kThreads, 0, stream()>>>(probs.as<const float>(), probs.stride[0],
                                                                  min_p.as<const float>(), min_p.stride[0],
                                                                  out.as<float>(), out.stride[0], probs.dim(1));
  MLA_GPU_LAUNCH_CHECK();
}

void GpuBackend::sample_from_probs(const TensorView& probs, const TensorView& uniforms, const TensorView& out_ids) {
  check_rows(probs, "sample_from_probs", "probs");
  const int64_t rows = probs.dim(0);
  check_vec(uniforms, DType::F32, rows, "sample_from_probs", "uniforms");
  check_vec(out_ids, DType::I32, rows, "sample_from_probs", "out_ids");
  if (rows == 0) return;
  sample_kernel<<<unsigned(rows), kThreads, 0, stream()>>>(probs.as<const float>(), probs.stride[0],
                                                           uniforms.as<const float>(), uniforms.stride[0],
                                                           out_ids.as<int32_t>(), out_ids.stride[0],
                                                           int(probs.dim(1)));
  MLA_GPU_LAUNCH_CHECK();
}

void GpuBackend::argmax(const TensorView& logits, const TensorView& out_ids) {
  check_rows(logits, "argmax", "logits");
  MLA_CHECK(logits.dim(1) > 0, "argmax: empty rows");
  check_vec(out_ids, DType::I32, logits.dim(0), "argmax", "out_ids");
  if (logits.dim(0) == 0) return;
  argmax_kernel<<<unsigned(logits.dim(0)), kThreads, 0, stream()>>>(
      logits.as<const float>(), logits.stride[0], out_ids.as<int32_t>(), out_ids.stride[0], int(logits.dim(1)));
  MLA_GPU_LAUNCH_CHECK();
}

}  // namespace mla::gpu
