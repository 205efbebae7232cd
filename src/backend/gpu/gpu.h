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
inline Error set_device(int d) { return hipSetDevice(d); }
inline Error memcpy_d2d(void* d, const void* s_, size_t n, Stream s) { return hipMemcpyAsync(d, s_, n, hipMemcpyDeviceToDevice, s); }
inline Error memset_async(void* d, int v, size_t n, Stream s) { return hipMemsetAsync(d, v, n, s); }
inline Error stream_create(Stream* s) { return hipStreamCreateWithFlags(s, hipStreamNonBlocking); }
inline Error stream_destroy(Stream s) { return hipStreamDestroy(s); }
using Event = hipEvent_t;
inline Error event_create(Event* e) { return hipEventCreate(e); }
inline Error event_destroy(Event e) { return hipEventDestroy(e); }
inline Error event_record(Event e, Stream s) { return hipEventRecord(e, s); }
inline Error event_sync(Event e) { return hipEventSynchronize(e); }
inline Error event_elapsed_ms(float* ms, Event a, Event b) { return hipEventElapsedTime(ms, a, b); }
using Graph = hipGraph_t;
using GraphExec = hipGraphExec_t;
inline Error capture_begin(Stream s) { return hipStreamBeginCapture(s, hipStreamCaptureModeThreadLocal); }
inline Error capture_end(Stream s, Graph* g) { return hipStreamEndCapture(s, g); }
inline Error graph_instantiate(GraphExec* e, Graph g) { return hipGraphInstantiate(e, g, nullptr, nullptr, 0); }
inline Error graph_launch(GraphExec e, Stream s) { return hipGraphLaunch(e, s); }
inline Error graph_destroy(Graph g) { return hipGraphDestroy(g); }
inline Error graph_exec_destroy(GraphExec e) { return hipGraphExecDestroy(e); }
inline Error mem_get_info(size_t* free_bytes, size_t* total) { return hipMemGetInfo(free_bytes, total); }
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
inline Error set_device(int d) { return cudaSetDevice(d); }
inline Error memcpy_d2d(void* d, const void* s_, size_t n, Stream s) { return cudaMemcpyAsync(d, s_, n, cudaMemcpyDeviceToDevice, s); }
inline Error memset_async(void* d, int v, size_t n, Stream s) { return cudaMemsetAsync(d, v, n, s); }
inline Error stream_create(Stream* s) { return cudaStreamCreateWithFlags(s, cudaStreamNonBlocking); }
inline Error stream_destroy(Stream s) { return cudaStreamDestroy(s); }
using Event = cudaEvent_t;
inline Error event_create(Event* e) { return cudaEventCreate(e); }
inline Error event_destroy(Event e) { return cudaEventDestroy(e); }
inline Error event_record(Event e, Stream s) { return cudaEventRecord(e, s); }
inline Error event_sync(Event e) { return cudaEventSynchronize(e); }
inline Error event_elapsed_ms(float* ms, Event a, Event b) { return cudaEventElapsedTime(ms, a, b); }
using Graph = cudaGraph_t;
using GraphExec = cudaGraphExec_t;
inline Error capture_begin(Stream s) { return cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal); }
inline Error capture_end(Stream s, Graph* g) { return cudaStreamEndCapture(s, g); }
inline Error graph_instantiate(GraphExec* e, Graph g) { return cudaGraphInstantiate(e, g, 0); }
inline Error graph_launch(GraphExec e, Stream s) { return cudaGraphLaunch(e, s); }
inline Error graph_destroy(Graph g) { return cudaGraphDestroy(g); }
inline Error graph_exec_destroy(GraphExec e) { return cudaGraphExecDestroy(e); }
inline Error mem_get_info(size_t* free_bytes, size_t* total) { return cudaMemGetInfo(free_bytes, total); }
constexpr int kWarpSize = 32;
#endif

// Warp-level primitives with the vendor's spelling (CUDA needs a lane mask, HIP does not).
#if MLA_GPU_HIP
template <typename T> __device__ inline T shfl_xor(T v, int lane_mask) { return __shfl_xor(v, lane_mask); }
template <typename T> __device__ inline T shfl(T v, int src_lane) { return __shfl(v, src_lane); }
#else
template <typename T> __device__ inline T shfl_xor(T v, int lane_mask) { return __shfl_xor_sync(0xffffffffu, v, lane_mask); }
template <typename T> __device__ inline T shfl(T v, int src_lane) { return __shfl_sync(0xffffffffu, v, src_lane); }
#endif

}  // namespace mla::gpu

// Invariant check of a vendor call: aborts with the call, the error string and the location (it
// still fires in release builds, STYLE 11). Device-side faults surface at the next checked call.
#define MLA_GPU_CHECK(expr)                                                                              \
  do {                                                                                                  \
    const ::mla::gpu::Error mla_gpu_err_ = (expr);                                                      \
    if (mla_gpu_err_ != ::mla::gpu::kSuccess) ::mla::gpu::fail(#expr, mla_gpu_err_, __FILE__, __LINE__); \
  } while (0)

namespace mla::gpu {
[[noreturn]] void fail(const char* expr, Error err, const char* file, int line);
// After a kernel launch: checks the launch itself (bad configuration), never synchronizes.
#define MLA_GPU_LAUNCH_CHECK() MLA_GPU_CHECK(::mla::gpu::last_error())
}  // namespace mla::gpu
