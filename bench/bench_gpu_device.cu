// The benchmark's only device code: random fills (benchmarks never time zeros) and a spin kernel
// that holds the stream while the host queues a batch of timed calls; plus access to the backend's
// stream, which host code cannot name without the internal header.
#include <cstdint>

#include <cuda_profiler_api.h>

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

// Read-pattern probe for the dense decode matvec (bench_dense_decode): streams a [rows, row_bytes]
// matrix with the matvec's grid, CTA shape and registers in flight (64 rows per CTA, 16 per warp,
// 16 loads of 16 bytes per lane per burst = 512 bytes of each of the warp's 16 rows), but with LPR
// lanes per row in each load instruction: 4 (8 rows x 64 B: the mma fragment order), 8 (4 rows x
// 128 B) or 32 (one row x 512 B). Only the bytes' XOR is kept, so the loads cannot be dropped.
template <int LPR>
__global__ void __launch_bounds__(128, 4)
    row_read_probe_kernel(const uint4* __restrict__ w, int64_t row_u4, int64_t split_u4, unsigned* sink) {
  constexpr int kRowsPerLoad = 32 / LPR, kGroups = 16 / kRowsPerLoad, kPieces = 16 / kGroups;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int64_t row0 = int64_t(blockIdx.y) * 64 + warp * 16 + lane / LPR;
  const int64_t begin = int64_t(blockIdx.x) * split_u4, end = min(row_u4, begin + split_u4);
  unsigned acc = 0;
  for (int64_t pos = begin; pos < end; pos += kPieces * LPR) {
    uint4 a[16];
#pragma unroll
    for (int gi = 0; gi < kGroups; ++gi)
#pragma unroll
      for (int pi = 0; pi < kPieces; ++pi) {
        const int64_t col = pos + pi * LPR + lane % LPR;
        a[gi * kPieces + pi] =
            col < end ? __ldcs(w + (row0 + gi * kRowsPerLoad) * row_u4 + col) : make_uint4(0u, 0u, 0u, 0u);
      }
#pragma unroll
    for (int i = 0; i < 16; ++i) acc ^= a[i].x ^ a[i].y ^ a[i].z ^ a[i].w;
  }
  if (acc == 0x9e3779b9u) atomicAdd(sink, 1u);
}

#if MLA_GPU_CUDA
// The same walk fed by cp.async (16 bytes per lane, one row's 512 bytes per instruction, no
// registers held) into a per-warp ring of S stages of 8 KB in shared memory; the warp then reads
// each stage back in the matvec's fragment order (lane g, t: row g and g + 8 at 16 t + 64 u).
template <int S>
__global__ void __launch_bounds__(128)
    row_read_probe_cpasync_kernel(const uint4* __restrict__ w, int64_t row_u4, int64_t split_u4, unsigned* sink) {
  extern __shared__ uint4 ring[];  // [4 warps][S][16 rows][32 uint4]
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, g = lane / 4, t = lane % 4;
  uint4* mine = ring + warp * S * 512;
  const int64_t row0 = int64_t(blockIdx.y) * 64 + warp * 16;
  const int64_t begin = int64_t(blockIdx.x) * split_u4, end = min(row_u4, begin + split_u4);
  const int64_t bursts = (end - begin + 31) / 32;
  auto issue = [&](int64_t b) {
    if (b < bursts) {
      uint4* st = mine + (b % S) * 512;
      const int64_t col = begin + b * 32 + lane;
#pragma unroll
      for (int r = 0; r < 16; ++r) {
        const uint32_t dst = uint32_t(__cvta_generic_to_shared(st + r * 32 + (lane ^ (r & 7))));
        const void* src = w + (row0 + r) * row_u4 + min(col, end - 1);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(col < end ? 16 : 0));
      }
    }
    asm volatile("cp.async.commit_group;\n" ::);
  };
#pragma unroll
  for (int b = 0; b < S - 1; ++b) issue(b);
  unsigned acc = 0;
  for (int64_t b = 0; b < bursts; ++b) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(S - 2) : "memory");
    __syncwarp();
    const uint4* st = mine + (b % S) * 512;
#pragma unroll
    for (int u = 0; u < 8; ++u)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = g + 8 * h, piece = 4 * u + t;
        const uint4 v = st[r * 32 + (piece ^ (r & 7))];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
      }
    __syncwarp();  // every lane has read stage b % S before it is refilled
    issue(b + S - 1);
  }
  if (acc == 0x9e3779b9u) atomicAdd(sink, 1u);
}
#endif

}  // namespace

void row_read_probe(gpu::Stream stream, const void* w, int64_t rows, int64_t row_bytes, int lanes_per_row, int splits,
                    unsigned* sink) {
  MLA_CHECK(rows % 64 == 0 && row_bytes % 16 == 0 && splits >= 1, "row_read_probe: rows {} row_bytes {}", rows,
            row_bytes);
  const int64_t row_u4 = row_bytes / 16, split_u4 = (row_u4 + splits - 1) / splits;
  const dim3 grid(unsigned(splits), unsigned(rows / 64));
  const auto* p = static_cast<const uint4*>(w);
#if MLA_GPU_CUDA
  if (lanes_per_row < 0) {  // -S: the cp.async ring of S stages
    const size_t smem = size_t(4 * 512 * 16) * size_t(-lanes_per_row);
    if (lanes_per_row == -2) {
      MLA_GPU_CHECK(cudaFuncSetAttribute(row_read_probe_cpasync_kernel<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
      row_read_probe_cpasync_kernel<2><<<grid, 128, smem, stream>>>(p, row_u4, split_u4, sink);
    } else {
      MLA_GPU_CHECK(cudaFuncSetAttribute(row_read_probe_cpasync_kernel<3>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
      row_read_probe_cpasync_kernel<3><<<grid, 128, smem, stream>>>(p, row_u4, split_u4, sink);
    }
    MLA_GPU_LAUNCH_CHECK();
    return;
  }
#endif
  if (lanes_per_row == 4) row_read_probe_kernel<4><<<grid, 128, 0, stream>>>(p, row_u4, split_u4, sink);
  else if (lanes_per_row == 8) row_read_probe_kernel<8><<<grid, 128, 0, stream>>>(p, row_u4, split_u4, sink);
  else row_read_probe_kernel<32><<<grid, 128, 0, stream>>>(p, row_u4, split_u4, sink);
  MLA_GPU_LAUNCH_CHECK();
}

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

void profiler_range(bool start) {
  MLA_GPU_CHECK(start ? cudaProfilerStart() : cudaProfilerStop());
}

std::string device_description() {
  int dev = 0, sms = 0;
  cudaDeviceProp prop{};
  MLA_GPU_CHECK(cudaGetDevice(&dev));
  MLA_GPU_CHECK(cudaGetDeviceProperties(&prop, dev));
  MLA_GPU_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return std::string(prop.name) + ", " + std::to_string(sms) + " SMs";
}

}  // namespace mla::bench
