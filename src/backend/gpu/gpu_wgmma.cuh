// Hopper wgmma building blocks shared by the sm_90a kernels (*_sm90a.cu, built for sm_90a alone):
// shared-memory matrix descriptors of 128-byte-swizzled tiles, the m64n128k16 bf16 wgmma with both
// operands in shared memory, and the register fence that keeps accumulators away from the compiler
// while a wgmma is in flight. Ordering (fence, commit, wait) and barriers are gpu_mma.cuh's.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/gpu/gpu.h"

#if MLA_GPU_CUDA
namespace mla::gpu::wgmma {

// Descriptor (PTX ISA "Matrix Descriptor Format") of an operand stored in 128-byte rows (64 bf16)
// with 16-byte chunk c of row r at chunk c ^ (r % 8), i.e. the 128-byte swizzle. Bits 0-13 start
// address >> 4; 16-29 leading byte offset >> 4 (`lbo`: unused by K-major operands, 16; for an
// MN-major one the distance between its 64-element column boxes); 32-45 stride byte offset >> 4
// (`sbo`: 1024, eight 128-byte rows); 49-51 base offset 0 (the pattern's 1024-byte period starts at
// a 1024-aligned address: callers align tile bases); 62-63 swizzle mode 1 (128B). A K-major k16
// slice at element k0 (a multiple of 16) of the row starts at byte 2 k0: desc_add(desc, 2 * k0).
__device__ __forceinline__ uint64_t desc_sw128(uint32_t saddr, uint32_t lbo = 16, uint32_t sbo = 1024) {
  return uint64_t((saddr & 0x3FFFFu) >> 4) | (uint64_t(lbo >> 4) << 16) | (uint64_t(sbo >> 4) << 32) |
         (uint64_t(1) << 62);
}
// Start-address advance by `bytes` (a multiple of 16): the field is the low 14 bits and shared
// addresses stay below 2^18 B, so the addition never carries out of it.
__device__ __forceinline__ uint64_t desc_add(uint64_t d, uint32_t bytes) { return d + uint64_t(bytes >> 4); }

// Byte offset of 16-byte chunk `chunk` (0..7) of row `row` in a tile of 128-byte swizzled rows.
__device__ __forceinline__ uint32_t sw128_off(int row, int chunk) {
  return uint32_t(row * 128 + (((chunk ^ row) & 7) << 4));
}

// D[64 x 128] (+)= A[64 x 16] B[16 x 128], bf16 in, fp32 accumulate, A and B from shared memory, both
// K-major. scale_d = 0: D = A B (D's input ignored); 1: D += A B. Accumulator fragment (per
// warpgroup; w = warp % 4, g = lane / 4, t = lane % 4): d[4j + 0..1] = D[16w + g][8j + 2t + 0..1],
// d[4j + 2..3] = D[16w + g + 8][8j + 2t + 0..1], j < 16 (the mma.sync m16n8 C layout along N).
__device__ __forceinline__ void mma_m64n128k16_ss(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, "
      "%8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, "
      "%40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, "
      "%56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// Ties every register of `d` to this point of the instruction stream: the compiler may move neither
// their producers below nor their consumers above it. wgmma reads and writes its accumulators
// asynchronously, between issue and wait_group, which the compiler cannot see: fence after the wait
// (and before the issue where the registers were just written).
template <int R> __device__ __forceinline__ void fence_regs(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Host: whether the current device runs sm_90a machine code (compute capability 9.0 exactly) and
// lets a CTA opt in to `smem_bytes` of dynamic shared memory. Each *_sm90a.cu's dispatch asks this.
inline bool sm90a_device_fits(size_t smem_bytes) {
  int dev = 0, major = 0, minor = 0, smem_optin = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) return false;
  return major == 9 && minor == 0 && smem_bytes <= size_t(smem_optin);
}

}  // namespace mla::gpu::wgmma
#endif  // MLA_GPU_CUDA
