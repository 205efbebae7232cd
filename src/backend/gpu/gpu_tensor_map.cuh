// The driver's tensor-map encoder (cuTensorMapEncodeTiled) for kernels whose copy engine reads
// tensor maps (CUDA builds only). Taken from the driver the runtime already loaded, so nothing
// links against libcuda, which the CI machines lack.
#pragma once

#include "backend/gpu/gpu.h"

#if MLA_GPU_CUDA
#include <cuda.h>          // CUtensorMap (the type only)
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

namespace mla::gpu {

// Null where the driver does not offer it. Asked once per process.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      p = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

}  // namespace mla::gpu
#endif  // MLA_GPU_CUDA
