// The prefill linear path for Dense BF16 weights: cuBLASLt bf16 x bf16 -> fp32 on tensor cores. The
// fp32 activations enter as bf16 terms (GemmPrecision): Fp32 splits x = hi + mid + lo and stacks the
// three as 3T rows of one GEMM, so W is read once and the result matches fp32 to ~1e-6 relative at
// 3x the tensor-core FLOPs; Bf16 rounds x once. FP8/INT4 weights in Bf16 precision (DequantBlas) are
// dequantized a bounded chunk of rows at a time into a bf16 scratch (a per-call transient, not load-
// time inflation) and run through the same GEMM. Also owns LinearState's vendor half (handle, plans).
#include <algorithm>
#include <cstring>
#include <unordered_map>

#include "backend/gpu/gpu_backend_impl.h"
#include "backend/gpu/gpu_linear.h"
#include "backend/gpu/gpu_linear_state.h"

#if MLA_GPU_CUDA
#include <cublasLt.h>
#include <cuda_bf16.h>

#include "backend/gpu/gpu_decode_tc.cuh"
#endif

namespace mla::gpu {

#if MLA_GPU_CUDA

#define MLA_LT_CHECK(expr)                                                                        \
  do {                                                                                            \
    const cublasStatus_t mla_lt_st_ = (expr);                                                     \
    MLA_CHECK(mla_lt_st_ == CUBLAS_STATUS_SUCCESS, "{} failed: {}", #expr,                        \
              cublasLtGetStatusString(mla_lt_st_));                                               \
  } while (0)

// cuBLASLt workspace: 32 MiB is NVIDIA's recommendation for Hopper; allocated once via Scratch, so
// the matmuls stay graph-capturable.
namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;
constexpr size_t kScratchAlign = 256;

size_t align_up(size_t n) { return (n + kScratchAlign - 1) / kScratchAlign * kScratchAlign; }
// Largest power of two (<= 256) dividing the address: what the heuristic may assume.
uint32_t pointer_alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && a % align != 0) align /= 2;
  return align;
}

}  // namespace

// One GEMM shape as the heuristic sees it (column-major: D[m, n] = W^T-op(A)[m, k] B[k, n]), batch
// GEMMs apart by stride_a / stride_d elements (B is shared: stride 0); out_bf16: D is bf16, else fp32.
struct LinearPlanKey {
  int64_t m, n, k, lda, ldb, ldd;
  int64_t batch = 1, stride_a = 0, stride_d = 0;
  uint32_t align_a = 0, align_b = 0, align_d = 0;
  uint32_t out_bf16 = 0;  // also keeps the struct free of implicit padding (hashed and compared as bytes)
  bool operator==(const LinearPlanKey& o) const { return std::memcmp(this, &o, sizeof(LinearPlanKey)) == 0; }
};
struct LinearPlanKeyHash {
  size_t operator()(const LinearPlanKey& key) const {
    size_t h = 1469598103934665603ull;
    const auto* b = reinterpret_cast<const unsigned char*>(&key);
    for (size_t i = 0; i < sizeof(LinearPlanKey); ++i) h = (h ^ b[i]) * 1099511628211ull;
    return h;
  }
};
static_assert(sizeof(LinearPlanKey) == 9 * 8 + 4 * 4, "PlanKey must have no implicit padding");

struct LinearPlan {
  bool found = false;  // false: cuBLASLt has no algorithm; the caller falls back
  cublasLtMatmulAlgo_t algo{};
};

struct BlasPlans {
  cublasLtHandle_t handle = nullptr;
  std::unordered_map<LinearPlanKey, LinearPlan, LinearPlanKeyHash> plans;  // heuristic results, one query per shape
};

namespace {

// Splits x [T, K] (row stride ldx) into `terms` bf16 matrices stacked as [terms * T, K]:
// term 0 = bf16(x), term 1 = bf16(x - t0), term 2 = bf16(x - t0 - t1). Each residual is exact in
// fp32 (Sterbenz), so the three terms carry x to ~24 bits.
// Grid (row_grid(K / E), rows): a thread converts E = 8 adjacent elements (two 16-byte loads, one
// 16-byte store per term; kVec: K % 8 == 0 and 16-byte x rows) or E = 1, and the grid's y strides
// over rows, so no index is divided at run time. (A flat index split by i / K, i % K, 64-bit
// divisions per element, held this pass to ~1.6 TB/s on the H200, 2026-12-03: 287 us of a 1.68 ms
// T 4096 x 18432 -> 7168 call.)
template <bool kVec>
__global__ void __launch_bounds__(128) linear_split_kernel(const float* __restrict__ x, int64_t ldx, int64_t T,
                                                           int64_t K, int terms, uint16_t* __restrict__ xs) {
  constexpr int E = kVec ? 8 : 1;
  const int64_t k = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * E;
  if (k >= K) return;
  const int64_t total = T * K;
  for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
    float r[E];
    if constexpr (kVec) {
      const float4 a = __ldcs(reinterpret_cast<const float4*>(x + t * ldx + k));
      const float4 b = __ldcs(reinterpret_cast<const float4*>(x + t * ldx + k + 4));
      r[0] = a.x, r[1] = a.y, r[2] = a.z, r[3] = a.w, r[4] = b.x, r[5] = b.y, r[6] = b.z, r[7] = b.w;
    } else {
      r[0] = x[t * ldx + k];
    }
    for (int term = 0; term < terms; ++term) {
      uint16_t h[E];
#pragma unroll
      for (int j = 0; j < E; ++j) {
        h[j] = f32_to_bf16_bits(r[j]);
        r[j] -= bf16_bits_to_f32(h[j]);
      }
      uint16_t* dst = xs + term * total + t * K + k;
      if constexpr (kVec) {
        uint32_t w[4];
#pragma unroll
        for (int p = 0; p < 4; ++p) w[p] = uint32_t(h[2 * p]) | (uint32_t(h[2 * p + 1]) << 16);
        *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
      } else {
        dst[0] = h[0];
      }
    }
  }
}

// out[t, c] from partials P [3][T, wterms * n] (contiguous; x term i is block i, W term j owns
// columns [j n, (j + 1) n)): per W term (lo + mid) + hi over the x terms, then the W terms summed
// smallest first. wterms == 1 is the plain 3-term split of x.
__global__ void linear_sum3_kernel(const float* __restrict__ p, int64_t T, int64_t n, int wterms,
                                   float* __restrict__ out, int64_t ldo) {
  const int64_t width = int64_t(wterms) * n, total = T * width, outs = T * n;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < outs; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / n, c = i % n;
    int64_t e = t * width + int64_t(wterms - 1) * n + c;
    float acc = (p[2 * total + e] + p[total + e]) + p[e];
    for (int j = wterms - 2; j >= 0; --j) {
      e -= n;
      acc += (p[2 * total + e] + p[total + e]) + p[e];
    }
    out[t * ldo + c] = acc;
  }
}

unsigned elementwise_grid(int64_t total, int threads) {
  return unsigned(std::min<int64_t>((total + threads - 1) / threads, int64_t(132) * 16));
}

// Grid of a row-major pass: x covers one row's `per_row` work items with `threads` each, y strides
// over `rows` (at most 65535).
dim3 row_grid(int64_t per_row, int64_t rows, int threads) {
  return dim3(unsigned((per_row + threads - 1) / threads), unsigned(std::clamp<int64_t>(rows, 1, 65535)));
}

// RAII for the per-call descriptors (host objects; creating them is cheap next to a prefill GEMM).
struct LtCall {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~LtCall() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

}  // namespace

bool linear_has_blas() { return true; }

LinearState::LinearState(GpuBackend& /*backend*/) : blas(std::make_unique<BlasPlans>()) {
  MLA_LT_CHECK(cublasLtCreate(&blas->handle));
}

LinearState::~LinearState() {
  if (blas && blas->handle) cublasLtDestroy(blas->handle);
}

namespace {

// Descriptors and the cached algorithm of one GEMM shape: D [N, rows] = W^T-op [N, K] x B [K, rows].
// Column-major views of the row-major tensors: W [N, K] is A = K x N (ld = its row stride), used
// transposed; the stacked bf16 x [rows, K] is B = K x rows; out [rows, N] is D = N x rows.
// Returns false when cuBLASLt has no algorithm for it.
bool prepare_gemm(BlasPlans& plans, const LinearPlanKey& key, LtCall& call, const LinearPlan*& plan) {
  MLA_LT_CHECK(cublasLtMatmulDescCreate(&call.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  MLA_LT_CHECK(cublasLtMatmulDescSetAttribute(call.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  MLA_LT_CHECK(cublasLtMatmulDescSetAttribute(call.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  MLA_LT_CHECK(cublasLtMatrixLayoutCreate(&call.a, CUDA_R_16BF, uint64_t(key.k), uint64_t(key.m), key.lda));
  MLA_LT_CHECK(cublasLtMatrixLayoutCreate(&call.b, CUDA_R_16BF, uint64_t(key.k), uint64_t(key.n), key.ldb));
  MLA_LT_CHECK(cublasLtMatrixLayoutCreate(&call.d, key.out_bf16 ? CUDA_R_16BF : CUDA_R_32F, uint64_t(key.m),
                                          uint64_t(key.n), key.ldd));
  if (key.batch > 1) {
    const int32_t count = int32_t(key.batch);
    const int64_t strides[3] = {key.stride_a, 0, key.stride_d};
    cublasLtMatrixLayout_t layouts[3] = {call.a, call.b, call.d};
    for (int i = 0; i < 3; ++i) {
      MLA_LT_CHECK(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                    sizeof(count)));
      MLA_LT_CHECK(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                    &strides[i], sizeof(strides[i])));
    }
  }
  auto it = plans.plans.find(key);
  if (it == plans.plans.end()) {
    MLA_LT_CHECK(cublasLtMatmulPreferenceCreate(&call.pref));
    const uint64_t ws = kWorkspaceBytes;
    MLA_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(call.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                      sizeof(ws)));
    MLA_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(call.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                      &key.align_a, sizeof(uint32_t)));
    MLA_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(call.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                      &key.align_b, sizeof(uint32_t)));
    MLA_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(call.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                      &key.align_d, sizeof(uint32_t)));
    MLA_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(call.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                      &key.align_d, sizeof(uint32_t)));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(plans.handle, call.op, call.a, call.b, call.d, call.d,
                                                             call.pref, 1, &result, &found);
    LinearPlan p;
    p.found = hs == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS;
    if (p.found) p.algo = result.algo;
    it = plans.plans.emplace(key, p).first;
  }
  plan = &it->second;
  return plan->found;
}

// Scratch budget for the split x and the partials of one token chunk: bounds the scratch at large
// prefills (T = 16384, N = 18432 would need 3.6 GB of partials) while each chunk stays a big GEMM.
constexpr size_t kChunkBudgetBytes = size_t(256) << 20;

// x [T, K] F32 (row stride x.stride[0]), A bf16 [N, K] (row stride lda), out [T, N / wterms] F32 (row
// stride ldo). wterms > 1 (Fp32 precision only): A stacks wterms bf16 terms of one weight, each
// N / wterms rows, and the sum kernel adds their products (DequantBlas' split W).
// Fp32 precision: per token chunk, scratch holds the split x [3Tc, K] bf16 and the partials [3Tc, N]
// fp32 (napkin math, T=4096, K=7168, N=2048: the GEMM is 3 x 120 GFLOP -> ~0.5 ms at ~700 TFLOP/s
// dense bf16, against 30 MB of W: compute-bound, so the 3x is the price of exactness). Bf16
// precision: one term, and cuBLASLt writes `out` directly.
bool run_blas(GpuBackend& be, const TensorView& x, const void* wptr, int64_t lda, int64_t N, int64_t K, int wterms,
              float* out, int64_t ldo) {
  LinearState& st = be.linear_state();
  const int64_t T = x.dim(0);
  const bool split3 = be.options().gemm_precision == GemmPrecision::Fp32;
  MLA_CHECK(wterms == 1 || (split3 && N % wterms == 0), "linear: {} weight terms need Fp32 precision", wterms);
  const int terms = split3 ? 3 : 1;
  const size_t per_token = size_t(terms) * (size_t(K) * sizeof(uint16_t) + (split3 ? size_t(N) * sizeof(float) : 0));
  const int64_t chunk = std::min<int64_t>(T, std::max<int64_t>(int64_t(kChunkBudgetBytes / per_token), 64));

  const size_t xs_bytes = align_up(size_t(terms * chunk * K) * sizeof(uint16_t));
  const size_t part_bytes = split3 ? align_up(size_t(terms * chunk * N) * sizeof(float)) : 0;
  char* base = static_cast<char*>(st.scratch.get(be, kWorkspaceBytes + xs_bytes + part_bytes));
  void* workspace = base;
  auto* xs = reinterpret_cast<uint16_t*>(base + kWorkspaceBytes);
  auto* partials = reinterpret_cast<float*>(base + kWorkspaceBytes + xs_bytes);

  // Plans for the full chunk and the tail (both checked before anything is enqueued). In Bf16 mode D
  // is `out` itself: its alignment is that of every chunk's first row (chunk rows apart).
  const int64_t ldd = split3 ? N : ldo;
  const uint32_t align_d =
      split3 ? pointer_alignment(partials) : std::min(pointer_alignment(out), pointer_alignment(out + chunk * ldd));
  auto key_for = [&](int64_t rows_t) {
    LinearPlanKey key{N, int64_t(terms) * rows_t, K, lda, K, ldd};
    key.align_a = pointer_alignment(wptr);
    key.align_b = pointer_alignment(xs);
    key.align_d = align_d;
    return key;
  };
  const int64_t tail = T % chunk;
  LtCall full_call, tail_call;
  const LinearPlan *full_plan = nullptr, *tail_plan = nullptr;
  if (T >= chunk && !prepare_gemm(*st.blas, key_for(chunk), full_call, full_plan)) return false;
  if (tail != 0 && !prepare_gemm(*st.blas, key_for(tail), tail_call, tail_plan)) return false;

  constexpr int kThreads = 256;
  const bool split_vec = K % 8 == 0 && pointer_alignment(x.as<const float>()) >= 16 && x.stride[0] % 4 == 0;
  const float alpha = 1.0f, beta = 0.0f;
  for (int64_t t0 = 0; t0 < T; t0 += chunk) {
    const int64_t tc = std::min(chunk, T - t0);
    const bool is_full = tc == chunk;
    LtCall& call = is_full ? full_call : tail_call;
    const LinearPlan* plan = is_full ? full_plan : tail_plan;
    const float* xt = x.as<const float>() + t0 * x.stride[0];
    float* ot = out + t0 * ldo;
    if (split_vec)
      linear_split_kernel<true><<<row_grid(K / 8, tc, 128), 128, 0, be.stream()>>>(xt, x.stride[0], tc, K, terms, xs);
    else
      linear_split_kernel<false><<<row_grid(K, tc, 128), 128, 0, be.stream()>>>(xt, x.stride[0], tc, K, terms, xs);
    MLA_GPU_LAUNCH_CHECK();
    float* dptr = split3 ? partials : ot;
    MLA_LT_CHECK(cublasLtMatmul(st.blas->handle, call.op, &alpha, wptr, call.a, xs, call.b, &beta, dptr, call.d, dptr,
                                call.d, &plan->algo, workspace, kWorkspaceBytes, be.stream()));
    if (split3) {
      const int64_t n = N / wterms;
      linear_sum3_kernel<<<elementwise_grid(tc * n, kThreads), kThreads, 0, be.stream()>>>(partials, tc, n, wterms, ot,
                                                                                         ldo);
      MLA_GPU_LAUNCH_CHECK();
    }
  }
  return true;
}

// ---- DequantBlas: quantized rows -> bf16 scratch chunk -> cuBLASLt ---------------------------------
// One thread per 16-byte packed vec: 16 FP8 (one 128-block scale) or 32 INT4 (one group, one scale),
// or 8 elements through weight_at() when rows are not 16-byte aligned (Scalar). Each value is
// weight_at()'s fp32 value rounded to bf16 (RNE): for INT4 with BF16 scale that is the value itself;
// otherwise it is one more rounding (2^-9 relative) in Bf16 precision; Fp32 precision stores three
// bf16 terms (hi, mid, lo) whose sum is the fp32 value exactly.
// Output rows are ldw = round_up(K, 8) bf16 (16-byte rows for cuBLASLt), padding columns zero.
// Napkin math (H200, 18432 x 7168 FP8, T = 4096): read 132 MB packed + write 264 MB bf16 -> ~85 us
// at ~4.7 TB/s, and the GEMM re-reads the 264 MB under ~1.1 TFLOP (~1.4 ms at ~780 TFLOP/s): ~6%
// overhead at T = 4096, ~30-50% at T = 256 (GEMM ~0.1-0.2 ms), still far ahead of the mma.sync path.
enum class DqFmt { Fp8, Int4Bf16, Int4F16, Int4F32, Scalar };
template <DqFmt F> constexpr int dq_vec_elems() {
  return F == DqFmt::Fp8 ? 16 : F == DqFmt::Scalar ? 8 : 32;
}

// Grid (row_grid(ceil(K / VE), rows)): x over a row's vecs, y strides over rows (no run-time index
// division). Measured on the H200 (2026-12-03, T 4096 x 7168 -> 18432): ~1.5 TB/s of packed reads
// plus bf16 writes with the flat index or this grid alike; the per-element conversions bound it.
template <DqFmt F>
__global__ void __launch_bounds__(128)
    linear_dequant_kernel(DeviceWeight w, int64_t n0, int64_t rows, int wterms, uint16_t* __restrict__ wb,
                          int64_t ldw) {
  constexpr int VE = dq_vec_elems<F>();
  // ceil(K / VE) vecs cover [0, ldw): the last starts below K and ends at a multiple of 8 >= K.
  const int64_t k0 = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * VE;
  if (k0 >= w.in) return;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const int64_t o = n0 + r;
    if constexpr (F == DqFmt::Fp8 || F == DqFmt::Int4Bf16) {
      // A whole vec into one bf16 term: packed hardware conversions, the same values as the general
      // code below (exact e4m3 -> f16 -> f32, one fp32 product, RNE to bf16; INT4: exact bf16(q s)).
      // The general code's per-element conversions made the pass instruction-bound at ~1.4 TB/s.
      if (wterms == 1 && k0 + VE <= w.in) {
        uint16_t* dst = wb + r * ldw + k0;
        if constexpr (F == DqFmt::Fp8) {
          const uint4 q = *reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(w.data) + o * w.data_stride + k0);
          const float s = static_cast<const float*>(w.scale)[(o / 128) * w.scale_stride + k0 / 128];
          uint32_t out[8];
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            const uint32_t h2 = decode_tc::fp8x2_to_f16x2(decode_tc::word_of(q, i / 2) >> (16 * (i % 2)));
            const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h2));
            const __nv_bfloat162 b = __floats2bfloat162_rn(f.x * s, f.y * s);
            out[i] = *reinterpret_cast<const uint32_t*>(&b);
          }
          reinterpret_cast<uint4*>(dst)[0] = make_uint4(out[0], out[1], out[2], out[3]);
          reinterpret_cast<uint4*>(dst)[1] = make_uint4(out[4], out[5], out[6], out[7]);
        } else {
          const uint4 q = *reinterpret_cast<const uint4*>(static_cast<const uint32_t*>(w.data) + o * w.data_stride + k0 / 8);
          const uint32_t sb = static_cast<const uint16_t*>(w.scale)[o * w.scale_stride + k0 / 32];
          const uint32_t s2 = sb | (sb << 16);
#pragma unroll
          for (int i = 0; i < 4; ++i) {  // word i = elements k0 + 8i .. + 7
            const uint32_t wd = decode_tc::word_of(q, i);
            uint32_t pr[4];  // pr[p] = (x_p, x_{p+4})
#pragma unroll
            for (int p = 0; p < 4; ++p) pr[p] = decode_tc::int4x2_to_bf16x2(wd, p, s2);
            reinterpret_cast<uint4*>(dst)[i] = make_uint4(__byte_perm(pr[0], pr[1], 0x5410), __byte_perm(pr[2], pr[3], 0x5410),
                                                          __byte_perm(pr[0], pr[1], 0x7632), __byte_perm(pr[2], pr[3], 0x7632));
          }
        }
        continue;
      }
    }
    float v[VE];
    if constexpr (F == DqFmt::Scalar) {
#pragma unroll
      for (int j = 0; j < VE; ++j) v[j] = k0 + j < w.in ? weight_at(w, o, k0 + j) : 0.0f;
    } else if constexpr (F == DqFmt::Fp8) {
      // Aligned rows: data_stride is a multiple of 16 >= K, so the 16 bytes lie inside row o.
      const uint4 q = *reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(w.data) + o * w.data_stride + k0);
      const uint32_t words[4] = {q.x, q.y, q.z, q.w};
      const float s = static_cast<const float*>(w.scale)[(o / 128) * w.scale_stride + k0 / 128];
#pragma unroll
      for (int j = 0; j < VE; ++j) v[j] = fp8e4m3_to_f32(uint8_t(words[j / 4] >> (8 * (j % 4)))) * s;
    } else {
      // Aligned rows: data_stride is a multiple of 4 words >= ceil(K / 8); k0 / 8 is a multiple of 4.
      const uint4 q = *reinterpret_cast<const uint4*>(static_cast<const uint32_t*>(w.data) + o * w.data_stride + k0 / 8);
      const uint32_t words[4] = {q.x, q.y, q.z, q.w};
      const int64_t si = o * w.scale_stride + k0 / 32;
      float s;
      if constexpr (F == DqFmt::Int4Bf16) s = bf16_bits_to_f32(static_cast<const uint16_t*>(w.scale)[si]);
      else if constexpr (F == DqFmt::Int4F16) s = f16_bits_to_f32(static_cast<const uint16_t*>(w.scale)[si]);
      else s = static_cast<const float*>(w.scale)[si];
#pragma unroll
      for (int j = 0; j < VE; ++j) {
        const float p = float(int((words[j / 8] >> (4 * (j % 8))) & 0xfu) - 8) * s;
        if constexpr (F == DqFmt::Int4Bf16) v[j] = bf16_bits_to_f32(f32_to_bf16_bits(p));
        else if constexpr (F == DqFmt::Int4F16) v[j] = f16_bits_to_f32(f32_to_f16_bits(p));
        else v[j] = p;
      }
    }
    // Bytes past K are row padding (maybe NaN): zeros. Groups of 8 past ldw are not stored.
    // W term `term` of row r is row term * rows + r of wb; each residual v - bf16(v) is exact in fp32
    // (as in linear_split_kernel), so 3 terms carry the fp32 value whole.
#pragma unroll
    for (int h = 0; h < VE / 8; ++h) {
      if (k0 + 8 * h >= ldw) break;
      for (int term = 0; term < wterms; ++term) {
        uint32_t packed[4];
#pragma unroll
        for (int p = 0; p < 4; ++p) {
          const int j = 8 * h + 2 * p;
          uint32_t lo = 0, hi = 0;
          if (k0 + j < w.in) {
            lo = f32_to_bf16_bits(v[j]);
            v[j] -= bf16_bits_to_f32(uint16_t(lo));
          }
          if (k0 + j + 1 < w.in) {
            hi = f32_to_bf16_bits(v[j + 1]);
            v[j + 1] -= bf16_bits_to_f32(uint16_t(hi));
          }
          packed[p] = lo | (hi << 16);  // little-endian: the lower element in the low half
        }
        *reinterpret_cast<uint4*>(wb + (int64_t(term) * rows + r) * ldw + k0 + 8 * h) =
            make_uint4(packed[0], packed[1], packed[2], packed[3]);
      }
    }
  }
}

DqFmt dequant_format(const DeviceWeight& w) {
  const size_t elem_bytes = w.format == ops::WeightFormat::Int4Group32 ? 4 : 1;
  const bool aligned = reinterpret_cast<uintptr_t>(w.data) % 16 == 0 && (size_t(w.data_stride) * elem_bytes) % 16 == 0;
  if (!aligned) return DqFmt::Scalar;
  if (w.format == ops::WeightFormat::Fp8Block128) return DqFmt::Fp8;
  return w.scale_dtype == DType::BF16 ? DqFmt::Int4Bf16 : w.scale_dtype == DType::F16 ? DqFmt::Int4F16 : DqFmt::Int4F32;
}

template <DqFmt F>
void launch_dequant(GpuBackend& be, const DeviceWeight& w, int64_t n0, int64_t rows, int wterms, uint16_t* wb,
                    int64_t ldw) {
  const int64_t nvec = (w.in + dq_vec_elems<F>() - 1) / dq_vec_elems<F>();
  linear_dequant_kernel<F><<<row_grid(nvec, rows, 128), 128, 0, be.stream()>>>(w, n0, rows, wterms, wb, ldw);
  MLA_GPU_LAUNCH_CHECK();
}

// Weight rows [n0, n0 + rows) of `w` (format f = dequant_format(w)) into wterms bf16 terms at wb.
void dequant_rows(GpuBackend& be, const DeviceWeight& w, DqFmt f, int64_t n0, int64_t rows, int wterms, uint16_t* wb,
                  int64_t ldw) {
  switch (f) {
    case DqFmt::Fp8: launch_dequant<DqFmt::Fp8>(be, w, n0, rows, wterms, wb, ldw); break;
    case DqFmt::Int4Bf16: launch_dequant<DqFmt::Int4Bf16>(be, w, n0, rows, wterms, wb, ldw); break;
    case DqFmt::Int4F16: launch_dequant<DqFmt::Int4F16>(be, w, n0, rows, wterms, wb, ldw); break;
    case DqFmt::Int4F32: launch_dequant<DqFmt::Int4F32>(be, w, n0, rows, wterms, wb, ldw); break;
    case DqFmt::Scalar: launch_dequant<DqFmt::Scalar>(be, w, n0, rows, wterms, wb, ldw); break;
  }
}

// Scratch budget of one dequantized chunk: 18432 x 7168 bf16 (264 MB, the largest DeepSeek-V3 /
// Kimi K2 quantized linear) fits in one chunk in Bf16 precision, so x is split once per call there.
constexpr size_t kDequantBudgetBytes = size_t(256) << 20;

}  // namespace

bool linear_blas(GpuBackend& be, const TensorView& x, const ops::Weight& w, const TensorView& out) {
  return run_blas(be, x, w.data.data, w.data.stride[0], w.out_features, w.in_features, 1, out.as<float>(),
                  out.stride[0]);
}

bool linear_dequant_supports(const ops::Weight& w) {
  return w.format == ops::WeightFormat::Fp8Block128 || w.format == ops::WeightFormat::Int4Group32;
}

// Output rows in chunks of `rows` (a multiple of 128 by default, so each chunk's columns of `out`
// keep its alignment): dequantize the chunk into scratch, then run_blas writes out[:, n0 : n0 + nc].
// A stream-ordered reuse of one scratch: chunk c + 1's dequant is enqueued after chunk c's GEMM.
// With more than one chunk, x is re-split per chunk (T K x 6 bytes each: small next to the chunk's GEMM).
// Fp32 precision: W = hi + mid + lo in bf16 exactly (three stacked [nc, K] blocks) against the three
// x terms: all 9 products, so the result is exact up to fp32 accumulation like the Dense BF16 path,
// at 9x the Bf16 tensor-core FLOPs (T=4096, 7168 -> 18432: ~10 TFLOP -> ~14 ms at ~700 TFLOP/s,
// against ~87 ms for the mma.sync kernel's measured 12.4 TFLOP/s at 1 term).
bool linear_dequant_blas(GpuBackend& be, const TensorView& x, const ops::Weight& w, const TensorView& out) {
  if (!linear_dequant_supports(w)) return false;
  LinearState& st = be.linear_state();
  const DeviceWeight dw = device_weight(w);
  const int64_t K = w.in_features, N = w.out_features;
  const int64_t ldw = (K + 7) / 8 * 8;
  const int wterms = be.options().gemm_precision == GemmPrecision::Fp32 ? 3 : 1;
  const size_t row_bytes = size_t(wterms) * size_t(ldw) * sizeof(uint16_t);
  int64_t rows = std::max<int64_t>(128, int64_t(kDequantBudgetBytes / row_bytes) / 128 * 128);
  if (st.dequant_chunk_rows > 0) rows = st.dequant_chunk_rows;
  rows = std::min(rows, N);
  auto* wb = static_cast<uint16_t*>(st.dequant_scratch.get(be, size_t(rows) * row_bytes));
  const DqFmt f = dequant_format(dw);
  for (int64_t n0 = 0; n0 < N; n0 += rows) {
    const int64_t nc = std::min(rows, N - n0);
    dequant_rows(be, dw, f, n0, nc, wterms, wb, ldw);
    if (!run_blas(be, x, wb, ldw, wterms * nc, K, wterms, out.as<float>() + n0, out.stride[0])) return false;
  }
  return true;
}

bool linear_heads_bf16_supports(const GpuBackend& be, const ops::Weight& w) {
  if (be.options().gemm_precision != GemmPrecision::Bf16) return false;
  return (w.format == ops::WeightFormat::Dense && w.data.dtype == DType::BF16) || linear_dequant_supports(w);
}

// Two strided-batched GEMMs (one per output part, a batch entry per head) with bf16 D: per head the
// weight rows are [h (da + db), + da) then [+ da, + db), so A's batch stride is (da + db) rows and B
// (the shared x) has stride 0. FP8 / INT4 rows are dequantized whole first (DeepSeek-V3, 128 heads:
// 32768 x 512 -> 32 MiB of bf16, ~12 us per call next to a ~0.2 ms GEMM), with DequantBlas' values.
// Napkin (H 128, n 4096, K 512, da = db = 128): 137 GFLOP -> ~0.2 ms at ~700 TFLOP/s; 4 MiB of x,
// 32 MiB of W and 256 MiB of bf16 out (~60 us at 4.2 TB/s). The F32 route it replaces wrote 512 MiB
// of fp32 and converted it in a second pass (268 + 232 us per chunk measured at 128 heads).
bool linear_heads_bf16(GpuBackend& be, const uint16_t* x, int64_t n, const ops::Weight& w, int heads, int da, int db,
                       uint16_t* out_a, int64_t ld_a, uint16_t* out_b, int64_t ld_b) {
  if (!linear_heads_bf16_supports(be, w) || n <= 0 || heads <= 0) return false;
  MLA_CHECK(w.out_features == int64_t(heads) * (da + db) && ld_a >= da && ld_b >= db,
            "linear_heads_bf16: weight [{}, {}] for {} heads x ({} + {}), ld {} / {}", w.out_features, w.in_features,
            heads, da, db, ld_a, ld_b);
  LinearState& st = be.linear_state();
  const int64_t K = w.in_features;
  const bool dense = w.format == ops::WeightFormat::Dense;
  const int64_t ldw = dense ? w.data.stride[0] : (K + 7) / 8 * 8;
  // The weight's bf16 rows: its own storage, or the dequant scratch (whose address is known only
  // after get(), which may grow it: sized before the plans, which key on its alignment).
  const void* wb = dense ? w.data.data : st.dequant_scratch.get(be, size_t(w.out_features) * size_t(ldw) * 2);
  auto key_for = [&](int64_t rows, int64_t ld, const void* a, const uint16_t* d) {
    LinearPlanKey key{rows, n, K, ldw, K, ld};
    key.batch = heads;
    key.stride_a = int64_t(da + db) * ldw;
    key.stride_d = n * ld;
    key.align_a = std::min(pointer_alignment(a), pointer_alignment(static_cast<const uint16_t*>(a) + key.stride_a));
    key.align_b = pointer_alignment(x);
    key.align_d = std::min(pointer_alignment(d), pointer_alignment(d + key.stride_d));
    key.out_bf16 = 1;
    return key;
  };
  const uint16_t* wa = static_cast<const uint16_t*>(wb);
  const uint16_t* wv = wa + int64_t(da) * ldw;
  LtCall call_a, call_b;
  const LinearPlan *plan_a = nullptr, *plan_b = nullptr;
  if (!prepare_gemm(*st.blas, key_for(da, ld_a, wa, out_a), call_a, plan_a)) return false;
  if (!prepare_gemm(*st.blas, key_for(db, ld_b, wv, out_b), call_b, plan_b)) return false;
  if (!dense) {
    const DeviceWeight dw = device_weight(w);
    dequant_rows(be, dw, dequant_format(dw), 0, w.out_features, 1, static_cast<uint16_t*>(const_cast<void*>(wb)), ldw);
  }
  void* workspace = st.scratch.get(be, kWorkspaceBytes);
  const float alpha = 1.0f, beta = 0.0f;
  MLA_LT_CHECK(cublasLtMatmul(st.blas->handle, call_a.op, &alpha, wa, call_a.a, x, call_a.b, &beta, out_a, call_a.d,
                              out_a, call_a.d, &plan_a->algo, workspace, kWorkspaceBytes, be.stream()));
  MLA_LT_CHECK(cublasLtMatmul(st.blas->handle, call_b.op, &alpha, wv, call_b.a, x, call_b.b, &beta, out_b, call_b.d,
                              out_b, call_b.d, &plan_b->algo, workspace, kWorkspaceBytes, be.stream()));
  return true;
}

void linear_set_dequant_chunk_rows(ops::Backend& backend, int64_t rows) {
  auto* be = dynamic_cast<GpuBackend*>(&backend);
  MLA_CHECK(be != nullptr && rows >= 0, "linear_set_dequant_chunk_rows: not a GPU backend or rows {} < 0", rows);
  be->linear_state().dequant_chunk_rows = rows;
}

#else  // HIP: no BLAS library in this build (TOOLCHAIN.md); the generic kernel takes prefill.

struct BlasPlans {};

bool linear_has_blas() { return false; }

LinearState::LinearState(GpuBackend& /*backend*/) {}
LinearState::~LinearState() = default;

bool linear_blas(GpuBackend&, const TensorView&, const ops::Weight&, const TensorView&) { return false; }
bool linear_dequant_supports(const ops::Weight&) { return false; }
bool linear_dequant_blas(GpuBackend&, const TensorView&, const ops::Weight&, const TensorView&) { return false; }
bool linear_heads_bf16_supports(const GpuBackend&, const ops::Weight&) { return false; }
bool linear_heads_bf16(GpuBackend&, const uint16_t*, int64_t, const ops::Weight&, int, int, int, uint16_t*, int64_t,
                       uint16_t*, int64_t) {
  return false;
}

void linear_set_dequant_chunk_rows(ops::Backend& backend, int64_t rows) {
  auto* be = dynamic_cast<GpuBackend*>(&backend);
  MLA_CHECK(be != nullptr && rows >= 0, "linear_set_dequant_chunk_rows: not a GPU backend or rows {} < 0", rows);
  be->linear_state().dequant_chunk_rows = rows;
}

#endif

}  // namespace mla::gpu
