// NVIDIA tensor-core building blocks shared by the mma.sync kernels (sm_80+; compiled only in CUDA
// builds): shared-memory addresses, cp.async, ldmatrix and the m16n8k16 bf16 MMA, with the fragment
// layouts every caller relies on written once.
#pragma once

#include <cstdint>

#include "backend/gpu/gpu.h"

#if MLA_GPU_CUDA
namespace mla::gpu::mma {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16-byte async copy global -> shared; src_bytes = 0 zero-fills the destination without reading.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
// 8-byte async copy global -> shared through L1 (.ca: the only form below 16 bytes); src_bytes = 0
// zero-fills the destination without reading.
__device__ __forceinline__ void cp_async8(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
// Returns once at most N of this thread's committed groups are still in flight.
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// ldmatrix .x4: lane l supplies the address of row (l % 8) of 8x8 matrix (l / 8); register i receives
// matrix i with lane l holding (row l/4, cols 2(l%4), 2(l%4)+1). .trans delivers the transpose:
// lane l holds (rows 2(l%4), 2(l%4)+1, col l/4).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// mma.sync m16n8k16, bf16 inputs, fp32 accumulate. Fragment layouts (g = lane / 4, t = lane % 4):
//   A 16x16 row-major, 4 regs of bf16x2: a0 = A[g][2t..2t+1], a1 = A[g+8][2t..], a2 = A[g][2t+8..],
//     a3 = A[g+8][2t+8..]  (= ldmatrix.x4 of the four 8x8 quadrants in order TL, BL, TR, BR);
//   B 16x8 "col-major", 2 regs: b0 = B[2t..2t+1][g], b1 = B[2t+8..2t+9][g]
//     (= ldmatrix of an 8x8 block stored n-major, or ldmatrix.trans of one stored k-major);
//   C/D 16x8 fp32, 4 regs: c0,c1 = C[g][2t..2t+1], c2,c3 = C[g+8][2t..2t+1].
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The same with f16 inputs (identical fragment layouts; f16 keeps 11 significant bits, so callers
// scale activations into its range first).
__device__ __forceinline__ void mma_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Hint: pull the 128-byte line holding `p` into L2 (no register result, never faults on a valid
// address, no effect on correctness). Streaming kernels use it to keep more HBM bytes in flight than
// their shared-memory stages hold.
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p)); }
// The same for `bytes` bytes at `p` (both multiples of 16): one bulk prefetch on sm_90+, else one
// hint per 128-byte line.
__device__ __forceinline__ void prefetch_l2_bytes(const void* p, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p), "r"(bytes) : "memory");
#else
  for (uint32_t off = 0; off < bytes; off += 128) prefetch_l2(static_cast<const char*>(p) + off);
#endif
}

// pdl_wait / pdl_trigger: gpu_device.cuh (portable: no-ops on HIP).
using gpu::pdl_trigger;
using gpu::pdl_wait;

// launch_maybe_pdl: gpu_device.cuh (portable: a plain launch on HIP).
using gpu::launch_maybe_pdl;

// d = a * b + c on bf16x2 pairs, rounded to nearest even (sm_80+; the kernels that use it are
// dispatched only there, so below it traps).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
__device__ __forceinline__ uint32_t fma_bf16x2(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
#else
__device__ __forceinline__ uint32_t fma_bf16x2(uint32_t, uint32_t, uint32_t) {
  __trap();
  return 0;
}
#endif

// Two floats to bf16x2 with round-to-nearest-even (one cvt); `lo` lands in the low half (the lower
// column of an mma fragment pair), and the two halves back as floats.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
__device__ __forceinline__ float bf16_lo(uint32_t p) { return __uint_as_float(p << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t p) { return __uint_as_float(p & 0xffff0000u); }
// 2^x on the SFU (ex2(-inf) = +0): the softmax exponent of the attention kernels.
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// wgmma ordering (sm_90a kernels only; unused inline functions emit nothing elsewhere): fence before
// the first wgmma that reads registers written since, commit a group, wait for all groups; and the
// generic-to-async proxy fence after ordinary shared-memory stores that wgmma reads next.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Returns once at most N of this warpgroup's committed wgmma groups are still in flight (groups
// complete in commit order).
template <int N> __device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// ---- sm_90 barriers: mbarriers (PTX ISA 8.0) and named barriers -------------------------------------
// Conditional forms predicate inside the asm instead of branching: a compiler-visible branch next
// to wgmma makes ptxas serialize every wgmma of the kernel (C7518, "WG.DP in divergent path").
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes the initialised barriers visible to the copy engine (async proxy).
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
// Thread with p: arrive once on `bar` (no transaction bytes).
__device__ __forceinline__ void mbar_arrive_if(bool p, uint32_t bar) {
  asm volatile("{\n.reg .pred q;\nsetp.ne.u32 q, %0, 0;\n@q mbarrier.arrive.shared::cta.b64 _, [%1];\n}\n" ::"r"(uint32_t(p)),
               "r"(bar)
               : "memory");
}
// Thread with p: arrive once on `bar` and expect `bytes` of copy-engine writes in this phase.
__device__ __forceinline__ void mbar_arrive_expect_tx_if(bool p, uint32_t bar, uint32_t bytes) {
  asm volatile("{\n.reg .pred q;\nsetp.ne.u32 q, %0, 0;\n@q mbarrier.arrive.expect_tx.shared::cta.b64 _, [%1], %2;\n}\n" ::"r"(
                   uint32_t(p)),
               "r"(bar), "r"(bytes)
               : "memory");
}
// One arrival on `bar` once every cp.async this thread issued before has landed (.noinc: the
// arrival counts against the count the barrier was initialised with).
__device__ __forceinline__ void cp_async_mbar_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// An L2 policy that marks lines evict-first (for bytes read once, like streamed weights).
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(p));
  return p;
}
// Copy-engine copy of the 2-D box at element coordinates (x, y) of the tensor map at `map` (a
// CUtensorMap in global memory, written before the launch) into this CTA's shared memory at `dst`
// (128-byte aligned), completing the box's bytes on the mbarrier `bar` (sm_90+). A shared::cta
// address is its own CTA's shared::cluster address.
__device__ __forceinline__ void tensor_copy_2d_g2s(uint32_t dst, const void* map, int x, int y, uint32_t bar,
                                                   uint64_t policy) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, "
      "%3}], [%4], %5;\n" ::"r"(dst),
      "l"(map), "r"(x), "r"(y), "r"(bar), "l"(policy)
      : "memory");
#else
  (void)dst, (void)map, (void)x, (void)y, (void)bar, (void)policy;
  __trap();  // callers dispatch this path on sm_90+ only
#endif
}
// Spins until the phase with parity `parity` of `bar` has completed. The loop lives inside the asm
// (labels are local to the braces): a compiler-visible loop next to wgmma would serialize it (C7518).
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT:\nmbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n@!done bra WAIT;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
// Named barrier `id` (0 is __syncthreads) over kCount threads (a multiple of 32).
template <int kCount> __device__ __forceinline__ void named_barrier_sync(uint32_t id) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(kCount) : "memory");
}
template <int kCount> __device__ __forceinline__ void named_barrier_arrive_if(bool p, uint32_t id) {
  asm volatile("{\n.reg .pred q;\nsetp.ne.u32 q, %0, 0;\n@q bar.arrive %1, %2;\n}\n" ::"r"(uint32_t(p)), "r"(id),
               "n"(kCount)
               : "memory");
}

}  // namespace mla::gpu::mma
#endif  // MLA_GPU_CUDA
