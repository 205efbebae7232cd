// Device-side building blocks shared by every kernel file: exact dtype conversions (the same values
// as core/dtype.h, so GPU and CPU dequantize bit-identically), warp/block reductions written for
// any kWarpSize, and the device view of a packed weight.
#pragma once

#include <cstdint>

#include "backend/gpu/gpu.h"
#include "ops/weight.h"

namespace mla::gpu {

// ---- programmatic dependent launch ----------------------------------------------------------------
// CUDA sm_90+ (no-ops below sm_90, on HIP, and in a grid launched without the PDL attribute).
// pdl_wait: returns once every prerequisite grid has completed and its writes are visible.
// pdl_trigger: once every CTA of this grid has called it (or exited), the next grid in the stream,
// if launched with the attribute, may start. A grid that triggers only after its own wait therefore
// lets its successor start only when its own predecessors are complete. A grid not launched with the
// attribute may trigger at its very start: its successor still waits for all of it in pdl_wait.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// The start of a kernel launched with PDL that neither streams constant data before the wait nor
// needs its successor held back: wait for every earlier kernel, then let the next one launch (a
// matvec behind it starts issuing its weight loads).
__device__ __forceinline__ void pdl_enter() {
  pdl_wait();
  pdl_trigger();
}

// Host: launches `kernel` on `stream` with `smem_bytes` of dynamic shared memory, and with the
// programmatic-stream-serialization attribute when `pdl` (the grid may then start before the
// previous kernel in the stream ends; the kernels order themselves with pdl_wait / pdl_trigger).
// Stream capture records it as a programmatic edge. Argument types are coerced to the kernel's
// parameter types. On HIP a plain launch (pdl_wait / pdl_trigger are no-ops there).
// A kernel launched with pdl = true must call pdl_wait in every CTA before it reads anything an
// earlier kernel wrote or writes anything an earlier kernel reads, and should call pdl_trigger
// only after that wait: then, when any kernel of a PDL chain starts, every kernel before its
// immediate predecessor has completed.
template <typename... KArgs, typename... Args>
void launch_maybe_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem_bytes, bool pdl, Stream stream,
                      Args... args) {
#if MLA_GPU_CUDA
  cudaLaunchAttribute attr[1] = {};
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem_bytes;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  MLA_GPU_CHECK(cudaLaunchKernelEx(&cfg, kernel, args...));
#else
  (void)pdl;
  kernel<<<grid, block, smem_bytes, stream>>>(static_cast<KArgs>(args)...);
  MLA_GPU_LAUNCH_CHECK();
#endif
}

// ---- scalar conversions (bit-exact with core/dtype.h) ---------------------------------------------
__device__ __forceinline__ float bf16_bits_to_f32(uint16_t h) { return __uint_as_float(uint32_t(h) << 16); }
// Round to nearest even; NaN stays NaN.
__device__ __forceinline__ uint16_t f32_to_bf16_bits(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
__device__ __forceinline__ float f16_bits_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h >> 15) << 31, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: man * 2^-24
    const float mag = float(man) * (1.0f / 16777216.0f);
    return sign ? -mag : mag;
  }
  if (exp == 0x1f) return __uint_as_float(sign | 0x7f800000u | (man << 13));
  return __uint_as_float(sign | ((exp + 112u) << 23) | (man << 13));
}
// IEEE half, round to nearest even (overflow to inf, NaN stays NaN).
__device__ __forceinline__ uint16_t f32_to_f16_bits(float f) {
  const uint32_t x = __float_as_uint(f), sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return uint16_t(sign | 0x7e00u);
  if (ax >= 0x477ff000u) return uint16_t(sign | 0x7c00u);        // |f| >= 65520 rounds to inf
  if (ax < 0x38800000u) return uint16_t(sign | uint32_t(rintf(__uint_as_float(ax) * 16777216.0f)));  // < 2^-14
  uint32_t h = (((ax >> 23) - 112u) << 10) | ((ax >> 13) & 0x3ffu);
  const uint32_t rem = ax & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return uint16_t(sign | h);
}
// float8_e4m3fn: bias 7, no infinities, S.1111.111 is NaN.
__device__ __forceinline__ float fp8e4m3_to_f32(uint8_t v) {
  const uint32_t sign = uint32_t(v >> 7) << 31, exp = (v >> 3) & 0xfu, man = v & 7u;
  if (exp == 0xf && man == 7) return __uint_as_float(sign | 0x7fc00000u);
  if (exp == 0) {
    const float mag = float(man) * (1.0f / 512.0f);
    return sign ? -mag : mag;
  }
  return __uint_as_float(sign | ((exp + 120u) << 23) | (man << 20));
}

// Loads element i of a BF16/F16/F32 array as fp32 (dtype is a runtime value on slow paths only).
__device__ __forceinline__ float load_as_f32(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::BF16: return bf16_bits_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::F16: return f16_bits_to_f32(static_cast<const uint16_t*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

// ---- reductions (any warp size) -------------------------------------------------------------------
__device__ __forceinline__ float warp_sum(float v) {
  for (int m = kWarpSize / 2; m > 0; m /= 2) v += shfl_xor(v, m);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int m = kWarpSize / 2; m > 0; m /= 2) v = fmaxf(v, shfl_xor(v, m));
  return v;
}
// Sum over the block; every thread gets the result. `smem` holds >= blockDim.x / kWarpSize floats.
// Precondition: blockDim.x is a multiple of kWarpSize; all threads call it.
__device__ __forceinline__ float block_sum(float v, float* smem) {
  const int lane = int(threadIdx.x) % kWarpSize, warp = int(threadIdx.x) / kWarpSize;
  const int warps = int(blockDim.x) / kWarpSize;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < warps; ++w) total += smem[w];  // fixed order: deterministic
  return total;
}
// The same in double (row statistics that the CPU reference keeps in double). `smem` holds
// >= blockDim.x / kWarpSize doubles; the leading barrier lets a caller reuse `smem` between calls.
__device__ __forceinline__ double block_sum_f64(double v, double* smem) {
  for (int m = kWarpSize / 2; m > 0; m /= 2) v += shfl_xor(v, m);
  const int lane = int(threadIdx.x) % kWarpSize, warp = int(threadIdx.x) / kWarpSize;
  __syncthreads();  // smem may still be read by a previous call
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  double total = 0.0;
  for (int w = 0; w < int(blockDim.x) / kWarpSize; ++w) total += smem[w];  // fixed order: deterministic
  return total;
}
__device__ __forceinline__ float block_max(float v, float* smem) {
  const int lane = int(threadIdx.x) % kWarpSize, warp = int(threadIdx.x) / kWarpSize;
  const int warps = int(blockDim.x) / kWarpSize;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  float m = -__int_as_float(0x7f800000);
  for (int w = 0; w < warps; ++w) m = fmaxf(m, smem[w]);
  return m;
}

// ---- packed weights ------------------------------------------------------------------------------
// A linear weight as kernels see it: plain pointers and row strides (in elements of data/scale).
struct DeviceWeight {
  ops::WeightFormat format = ops::WeightFormat::Dense;
  int64_t out = 0, in = 0;
  const void* data = nullptr;
  const void* scale = nullptr;
  DType data_dtype = DType::BF16, scale_dtype = DType::F32;
  int64_t data_stride = 0;   // elements (Dense, Fp8) or int32 words (Int4) per row
  int64_t scale_stride = 0;  // scale elements per row of the scale tensor
};

// Host side: the device view of an ops::Weight placed by this backend (checks its layout).
DeviceWeight device_weight(const ops::Weight& w);

// W[o, i] as fp32, exactly ops::dequantize_rows' value. Scalar: for slow paths and references.
__device__ __forceinline__ float weight_at(const DeviceWeight& w, int64_t o, int64_t i) {
  switch (w.format) {
    case ops::WeightFormat::Dense: return load_as_f32(w.data, w.data_dtype, o * w.data_stride + i);
    case ops::WeightFormat::Fp8Block128: {
      const float q = fp8e4m3_to_f32(static_cast<const uint8_t*>(w.data)[o * w.data_stride + i]);
      return q * static_cast<const float*>(w.scale)[(o / 128) * w.scale_stride + i / 128];
    }
    case ops::WeightFormat::Int4Group32: {
      const uint32_t word = static_cast<const uint32_t*>(w.data)[o * w.data_stride + i / 8];
      const int q = int((word >> (4 * (i % 8))) & 0xfu) - 8;
      const float s = load_as_f32(w.scale, w.scale_dtype, o * w.scale_stride + i / 32);
      // W = round_scale_dtype(q * s): the product is rounded to the scale's dtype (ops/weight.h).
      const float v = float(q) * s;
      if (w.scale_dtype == DType::BF16) return bf16_bits_to_f32(f32_to_bf16_bits(v));
      if (w.scale_dtype == DType::F16) return f16_bits_to_f32(f32_to_f16_bits(v));
      return v;
    }
  }
  return 0.0f;
}

}  // namespace mla::gpu
