// Host-side face of the GPU linear op's dispatch, for tests and benchmarks that must pin one kernel
// path (vendor-free: includes no GPU header). GpuBackend::linear is linear_with_path(..., Auto).
#pragma once

#include <cstdint>
#include <span>

#include "ops/backend.h"

namespace mla::gpu {

enum class LinearPath : uint8_t {
  Auto,        // T <= 16: GemvTc (Bf16 mode, where it applies) or Gemv; T > 16 on CUDA: Blas (Dense BF16), DequantBlas (FP8, INT4); otherwise
               // Generic. (TensorCore only when forced, or if kDequantInFp32 is turned off.)
  Generic,     // tiled SIMT fp32 GEMM, any format, any shape (the fallback and the HIP path)
  Gemv,        // weight-streaming decode kernel (T > 16 runs in groups of 16 tokens)
  Blas,        // cuBLASLt bf16 x bf16 -> fp32 (Dense BF16 weights, CUDA only)
  TensorCore,  // mma.sync with in-smem dequantization (FP8, INT4 BF16/F32 scale; CUDA only)
  DequantBlas, // FP8/INT4 rows dequantized to a bf16 scratch chunk, then Blas (CUDA only): Bf16
               // precision rounds W to bf16 once; Fp32 splits W into 3 exact bf16 terms (9 products)
  GemvTc,      // tensor-core weight-streaming decode (gpu_decode_tc.h: FP8 / INT4 BF16 scale / BF16,
               // CUDA sm_80+, shape and alignment constraint); x rounded once to f16 (FP8) / bf16.
               // Auto takes it for T <= 16 in GemmPrecision::Bf16 where it applies, else Gemv.
};

// Whether the GemvTc path takes `w` on `backend` (a GpuBackend) in this build.
bool linear_gemv_tc_supports(ops::Backend& backend, const ops::Weight& w);

// out[T, out] = x[T, in] W^T on the GPU backend `backend` (must be a GpuBackend) through `path`.
// Same contract as ops::Backend::linear; a path that cannot take the weight is an invariant failure.
void linear_with_path(ops::Backend& backend, const TensorView& x, const ops::Weight& w, const TensorView& out,
                      LinearPath path);

// Whether GpuBackend::linear_group runs `w` at T tokens as one tensor-core launch (Auto takes GemvTc
// for each weight, one format and width, 2..kMaxLinearGroup weights) rather than as separate calls.
bool linear_group_one_launch(ops::Backend& backend, int64_t T, std::span<const ops::Weight* const> w);

// True when this build has the Blas path (CUDA with cuBLASLt).
bool linear_has_blas();

class GpuBackend;
// Internal (gpu_linear_blas.cu): the Blas path for validated arguments with T > 0 and a Dense BF16
// weight. Returns false, having enqueued nothing, when cuBLASLt offers no algorithm for the shape.
bool linear_blas(GpuBackend& backend, const TensorView& x, const ops::Weight& w, const TensorView& out);
// Internal (gpu_linear_tc.cu): whether the TensorCore path takes `w` in this build, and the path
// itself (returns false, having enqueued nothing, when it does not).
bool linear_tc_supports(const ops::Weight& w);
bool linear_tc(GpuBackend& backend, const TensorView& x, const ops::Weight& w, const TensorView& out);
// Internal (gpu_linear_blas.cu): whether the DequantBlas path takes `w` in this build, and the path
// (returns false when cuBLASLt has no algorithm; it may then have written part of `out`, which the
// caller's fallback overwrites entirely).
bool linear_dequant_supports(const ops::Weight& w);
bool linear_dequant_blas(GpuBackend& backend, const TensorView& x, const ops::Weight& w, const TensorView& out);

// Internal (gpu_linear_blas.cu): the bf16 decompression of the tensor-core prefill (gpu_mla_naive.cu).
// For every head h < heads, with W_h,a = rows [h (da + db), h (da + db) + da) of w and W_h,b the db
// rows after them:
//   out_a[h n ld_a + j ld_a + c] = bf16(x_j . W_h,a[c])  (c < da),  out_b likewise with W_h,b, ld_b,
// x bf16 [n, in] contiguous; fp32 accumulation, one RNE rounding (W rounded to bf16 first for FP8 /
// INT4, as DequantBlas does). Taken for Dense BF16, FP8 and INT4 weights in GemmPrecision::Bf16 on
// CUDA (linear_heads_bf16_supports); returns false, having enqueued nothing, when it is not taken or
// cuBLASLt has no algorithm, and the caller runs linear() instead.
bool linear_heads_bf16_supports(const GpuBackend& backend, const ops::Weight& w);
bool linear_heads_bf16(GpuBackend& backend, const uint16_t* x, int64_t n, const ops::Weight& w, int heads, int da,
                       int db, uint16_t* out_a, int64_t ld_a, uint16_t* out_b, int64_t ld_b);

// Test knob: caps the weight rows the DequantBlas path dequantizes per chunk on `backend` (a
// GpuBackend), so small shapes exercise the chunk loop; 0 restores the scratch-budget default.
void linear_set_dequant_chunk_rows(ops::Backend& backend, int64_t rows);
// Bench knob: GemvTc cuts K into `splits` ranges on `backend` (clamped to the chunks K has) instead of
// dense_tc_split's count; 0 restores the default. Sums then depend on it (tuning only).
void linear_set_gemv_tc_splits(ops::Backend& backend, int64_t splits);
// Bench knob (A/B of the grouped launch): false makes linear_group run its separate calls.
void linear_set_group_one_launch(ops::Backend& backend, bool on);

}  // namespace mla::gpu
