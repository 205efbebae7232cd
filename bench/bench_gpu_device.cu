// The benchmark's only device code: random fills (benchmarks never time zeros) and a spin kernel
// that holds the stream while the host queues a batch of timed calls; plus access to the backend's
// stream, which host code cannot name without the internal header.
#include <cstdint>

#include "backend/gpu/gpu_backend_impl.h"
#include "bench_gpu.h"

namespace mla::bench {

namespace {

__device__ __forceinline__ uint64_t mix64_dev(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// One element per thread-iteration, grid-stride; value = f(hash(seed, index)): independent of the grid.
__global__ void fill_f32_kernel(float* p, int64_t n, uint64_t seed, float lo, float hi) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = lo + (hi - lo) * float(mix64_dev(seed ^ uint64_t(i)) >> 40) * (1.0f / 16777216.0f);
}

__global__ void fill_bf16_kernel(uint16_t* p, int64_t n, uint64_t seed, float lo, float hi) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = gpu::f32_to_bf16_bits(lo + (hi - lo) * float(mix64_dev(seed ^ uint64_t(i)) >> 40) * (1.0f / 16777216.0f));
}

// Random bytes, 8 per iteration; with `no_fp8_nan`, the e4m3 NaN codes (0x7F, 0xFF) become 0x7E/0xFE.
__global__ void fill_bytes_kernel(uint8_t* p, int64_t n, uint64_t seed, bool no_fp8_nan) {
  for (int64_t w = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; w * 8 < n; w += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t h = mix64_dev(seed ^ uint64_t(w));
    for (int b = 0; b < 8 && w * 8 + b < n; ++b) {
      uint8_t v = uint8_t(h >> (8 * b));
      if (no_fp8_nan && (v & 0x7F) == 0x7F) v ^= 1;
      p[w * 8 + b] = v;
    }
  }
}

__global__ void spin_kernel(int64_t cycles) {
  const int64_t start = clock64();
  while (clock64() - start < cycles) {
  }
}

}  // namespace

gpu::Stream backend_stream(ops::Backend& backend) {
  auto* g = dynamic_cast<gpu::GpuBackend*>(&backend);
  MLA_CHECK(g != nullptr, "backend_stream: backend '{}' is not the GPU backend", backend.name());
  return g->stream();
}

void fill_random(const TensorView& v, uint64_t seed, float lo, float hi, gpu::Stream stream) {
  MLA_CHECK(v.is_contiguous(), "fill_random: {} is not contiguous", v.describe());
  const int64_t n = v.numel();
  if (n == 0) return;
  const int threads = 256;
  const int blocks = 132 * 16;  // grid-stride; enough to saturate any current GPU's bandwidth
  seed = mix64(seed);
  if (v.dtype == DType::F32) {
    fill_f32_kernel<<<blocks, threads, 0, stream>>>(static_cast<float*>(v.data), n, seed, lo, hi);
  } else if (v.dtype == DType::BF16) {
    fill_bf16_kernel<<<blocks, threads, 0, stream>>>(static_cast<uint16_t*>(v.data), n, seed, lo, hi);
  } else {
    fill_bytes_kernel<<<blocks, threads, 0, stream>>>(static_cast<uint8_t*>(v.data), int64_t(v.nbytes()), seed,
                                                      v.dtype == DType::F8_E4M3);
  }
  MLA_GPU_LAUNCH_CHECK();
}

void spin(gpu::Stream stream, double microseconds) {
  // ~2 GHz SM clock (H200 boosts to 1.98 GHz); the length only needs to cover host queueing.
  spin_kernel<<<1, 1, 0, stream>>>(int64_t(microseconds * 2000.0));
  MLA_GPU_LAUNCH_CHECK();
}

}  // namespace mla::bench
