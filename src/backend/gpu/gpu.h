// The one place that maps the vendor runtime (CUDA or HIP) to neutral names (STYLE 8). Kernels and
// launchers include only this; nothing else in the tree names cuda* or hip* directly.
#pragma once

#if defined(__HIP_PLATFORM_AMD__) || defined(__HIPCC__)
#include <hip/hip_runtime.h>
#define MLA_GPU_HIP 1
#else
#include <cuda_runtime.h>
#define MLA_GPU_CUDA 1
#endif

namespace mla::gpu {

#if MLA_GPU_HIP
using Stream = hipStream_t;
using Error = hipError_t;
constexpr Error kSuccess = hipSuccess;
inline const char* error_string(Error e) { return hipGetErrorString(e); }
inline Error malloc(void** p, size_t bytes) { return hipMalloc(p, bytes); }
inline Error free(void* p) { return hipFree(p); }
inline Error memcpy_h2d(void* d, const void* h, size_t n, Stream s) { return hipMemcpyAsync(d, h, n, hipMemcpyHostToDevice, s); }
inline Error memcpy_d2h(void* h, const void* d, size_t n, Stream s) { return hipMemcpyAsync(h, d, n, hipMemcpyDeviceToHost, s); }
inline Error stream_sync(Stream s) { return hipStreamSynchronize(s); }
inline Error last_error() { return hipGetLastError(); }
inline Error device_count(int* n) { return hipGetDeviceCount(n); }
// AMD CDNA wavefronts are 64 lanes wide.
constexpr int kWarpSize = 64;
#else
using Stream = cudaStream_t;
using Error = cudaError_t;
constexpr Error kSuccess = cudaSuccess;
inline const char* error_string(Error e) { return cudaGetErrorString(e); }
inline Error malloc(void** p, size_t bytes) { return cudaMalloc(p, bytes); }
inline Error free(void* p) { return cudaFree(p); }
inline Error memcpy_h2d(void* d, const void* h, size_t n, Stream s) { return cudaMemcpyAsync(d, h, n, cudaMemcpyHostToDevice, s); }
inline Error memcpy_d2h(void* h, const void* d, size_t n, Stream s) { return cudaMemcpyAsync(h, d, n, cudaMemcpyDeviceToHost, s); }
inline Error stream_sync(Stream s) { return cudaStreamSynchronize(s); }
inline Error last_error() { return cudaGetLastError(); }
inline Error device_count(int* n) { return cudaGetDeviceCount(n); }
constexpr int kWarpSize = 32;
#endif

}  // namespace mla::gpu
