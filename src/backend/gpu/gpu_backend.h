// The GPU backend's public face: options and a factory. Host code (CLI, tests, benchmarks) includes
// only this header, never a vendor header; the kernels live behind it in one source for CUDA and HIP.
#pragma once

#include <cstdint>
#include <memory>

#include "core/status.h"
#include "ops/backend.h"

namespace mla::gpu {

// How fp32 activations enter tensor-core GEMMs (weights are exact in bf16 after dequantization).
enum class GemmPrecision : uint8_t {
  Fp32,  // x = hi + mid + lo as three bf16 terms, fp32 accumulation: matches the fp32 CPU reference
         // to ~1e-6 relative (the golden tolerance), at 3x the tensor-core FLOPs
  Bf16,  // x rounded to bf16 once: serving precision (~4e-3 relative per product), full speed
};

struct GpuBackendOptions {
  int device = 0;
  GemmPrecision gemm_precision = GemmPrecision::Fp32;
};

// True when a GPU of this build's vendor is visible.
bool gpu_available();

// Creates a backend on `options.device` with its own stream, BLAS handle and scratch.
Result<std::unique_ptr<ops::Backend>> make_gpu_backend(const GpuBackendOptions& options = {});

}  // namespace mla::gpu
