// GPU sampling ops: softmax with temperature, top-k / top-p / min-p renormalization, inverse-CDF
// sampling and argmax, with the CPU reference's semantics (cpu_sampling.cpp). One 1024-thread block
// per row (argmax: many blocks per row, see argmax_kernel), grids fixed by the shape, so every op is
// graph-capturable. Top-k / top-p pivots are found exactly by a 4-pass radix descent over
// order-preserving keys of the fp32 values (integer shared-memory histograms, hence deterministic)
// rather than by sorting the row; the price is 6 reads of the row (4 radix passes + kept sum + write;
// L2-resident after the first) and shared-atomics contention in the first pass, where most
// probabilities share their top 8 key bits.
// Measured on H200, V = 163840 (B = 1 / 256, us): softmax 85 / 330, top_k 107 / 395, top_p 129 / 411,
// min_p 64 / 271, sample 37 / 104, argmax 10 / 42 (one block per row then; now split, see
// argmax_kernel). B = 256 is near HBM bandwidth (rows exceed L2); B = 1 runs on one SM (a row per
// block) and is bound by its issue rate: a split-row variant for small B is the next step if the
// sampler shows up in decode profiles.
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

// ---- argmax: a row split over many blocks --------------------------------------------------------
// grid = (rows, chunks of kArgmaxChunk). Each block reduces its chunk to one packed key, folds it into
// the row's slot with a 64-bit atomicMax, and the row's last block (a ticket counter) writes the index
// and resets slot and ticket to 0 for the next call or graph replay. One launch, no host state: a
// 129280-wide row is 64 blocks of 2048 elements, i.e. one load round trip per thread plus three
// dependent atomics, instead of one block walking 505 KB.
// Scratch (SamplingState::argmax_slots, argmax's own): [rows] u64 slots then [rows] u32 tickets.
// Invariant: both are 0 between calls (zero-filled when allocated, reset by each row's last block).
constexpr int kArgmaxThreads = 256;
constexpr int kArgmaxPer = 8;  // elements per thread: two float4 loads in flight
constexpr int kArgmaxChunk = kArgmaxThreads * kArgmaxPer;

// The CPU's rule (strict '>' from index 0) as one unsigned order: value key in the high word (-0 ==
// +0; a NaN never compares greater, so it loses to every number, except at index 0, where the CPU
// keeps it as `best` and nothing can replace it), ~index in the low word (lowest index wins ties).
// Every element's key is > 0, the "nothing seen" value.
__device__ __forceinline__ unsigned long long argmax_key(float v, int i) {
  const uint32_t k = v != v ? (i == 0 ? 0xffffffffu : 0u) : order_key(v == 0.0f ? 0.0f : v);
  return (static_cast<unsigned long long>(k) << 32) | static_cast<unsigned long long>(~static_cast<uint32_t>(i));
}

__device__ __forceinline__ unsigned long long warp_max_u64(unsigned long long v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const uint32_t hi = __reduce_max_sync(0xffffffffu, uint32_t(v >> 32));
  const uint32_t lo = __reduce_max_sync(0xffffffffu, uint32_t(v >> 32) == hi ? uint32_t(v) : 0u);
  return (static_cast<unsigned long long>(hi) << 32) | lo;
#else
  for (int m = kWarpSize / 2; m > 0; m /= 2) {
    const unsigned long long o = shfl_xor(v, m);
    v = o > v ? o : v;
  }
  return v;
#endif
}

// bytes: V * 4 read (L2-resident after the lm_head GEMM) + 20 per block in atomics.
__global__ void __launch_bounds__(kArgmaxThreads)
argmax_kernel(const float* logits, int64_t l_stride, int32_t* out_ids, int64_t o_stride, int vocab,
              unsigned long long* slots, unsigned* tickets) {
  __shared__ unsigned long long warp_best[kArgmaxThreads / kWarpSize];
  pdl_enter();  // launched with PDL (launch_maybe_pdl)
  const int tid = int(threadIdx.x);
  const int64_t b = blockIdx.x;
  const float* z = logits + b * l_stride;
  const int c0 = int(blockIdx.y) * kArgmaxChunk, c1 = min(vocab, c0 + kArgmaxChunk);
  unsigned long long best = 0;
  if ((reinterpret_cast<uintptr_t>(z + c0) & 15u) == 0) {  // block-uniform
    const float4* z4 = reinterpret_cast<const float4*>(z + c0);
    const int n4 = (c1 - c0) / 4;
    float4 q[kArgmaxPer / 4];
#pragma unroll
    for (int u = 0; u < kArgmaxPer / 4; ++u) {
      const int j = tid + u * kArgmaxThreads;
      q[u] = j < n4 ? z4[j] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int u = 0; u < kArgmaxPer / 4; ++u) {
      const int j = tid + u * kArgmaxThreads, i = c0 + 4 * j;
      if (j < n4) {
        const unsigned long long k0 = argmax_key(q[u].x, i), k1 = argmax_key(q[u].y, i + 1);
        const unsigned long long k2 = argmax_key(q[u].z, i + 2), k3 = argmax_key(q[u].w, i + 3);
        const unsigned long long k01 = k0 > k1 ? k0 : k1, k23 = k2 > k3 ? k2 : k3;
        const unsigned long long k = k01 > k23 ? k01 : k23;
        best = k > best ? k : best;
      }
    }
    for (int i = c0 + 4 * n4 + tid; i < c1; i += kArgmaxThreads) {  // the chunk's last (c1 - c0) % 4
      const unsigned long long k = argmax_key(z[i], i);
      best = k > best ? k : best;
    }
  } else {
    float v[kArgmaxPer];
#pragma unroll
    for (int u = 0; u < kArgmaxPer; ++u) {
      const int i = c0 + tid + u * kArgmaxThreads;
      v[u] = i < c1 ? z[i] : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kArgmaxPer; ++u) {
      const int i = c0 + tid + u * kArgmaxThreads;
      if (i < c1) {
        const unsigned long long k = argmax_key(v[u], i);
        best = k > best ? k : best;
      }
    }
  }
  best = warp_max_u64(best);
  if (tid % kWarpSize == 0) warp_best[tid / kWarpSize] = best;
  __syncthreads();
  if (tid != 0) return;
  for (int w = 1; w < kArgmaxThreads / kWarpSize; ++w) best = warp_best[w] > best ? warp_best[w] : best;
  atomicMax(&slots[b], best);
  __threadfence();  // the slot update is visible before this block's ticket
  if (atomicAdd(&tickets[b], 1u) != gridDim.y - 1) return;
  __threadfence();  // every other block's slot update is visible to the reads below
  const unsigned long long k = atomicExch(&slots[b], 0ull);
  atomicExch(&tickets[b], 0u);
  out_ids[b * o_stride] = int32_t(~static_cast<uint32_t>(k));
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
  const int64_t rows = logits.dim(0), vocab = logits.dim(1);
  if (rows == 0) return;
  const int64_t chunks = (vocab + kArgmaxChunk - 1) / kArgmaxChunk;
  MLA_CHECK(chunks <= 65535, "argmax: V={} too wide", vocab);
  // Grows only outside capture (Scratch's rule); a new buffer is zero-filled, as the kernel needs.
  char* scratch = static_cast<char*>(sampling_->argmax_slots.get(*this, size_t(rows) * 12));
  auto* slots = reinterpret_cast<unsigned long long*>(scratch);
  auto* tickets = reinterpret_cast<unsigned*>(scratch + size_t(rows) * 8);
  launch_maybe_pdl(argmax_kernel, dim3(unsigned(rows), unsigned(chunks)), dim3(kArgmaxThreads), 0, true,
                   stream(),
      logits.as<const float>(), logits.stride[0], out_ids.as<int32_t>(), out_ids.stride[0], int(vocab), slots,
      tickets);
  MLA_GPU_LAUNCH_CHECK();
}

}  // namespace mla::gpu
