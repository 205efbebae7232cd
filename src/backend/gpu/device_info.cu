// Device discovery and a self-test kernel: proves the toolchain, the portability layer and the
// launch path work on a machine, before any real kernel exists.
#include "backend/gpu/device_info.h"

#include <cstdio>

#include "backend/gpu/gpu.h"

namespace mla::gpu {

namespace {
// out[i] = a * x[i] + y[i]; one element per thread.
__global__ void saxpy_kernel(int n, float a, const float* x, const float* y, float* out) {
  const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) out[i] = a * x[i] + y[i];
}
}  // namespace

int device_count_or_zero() {
  int n = 0;
  return device_count(&n) == kSuccess ? n : 0;
}

bool self_test(char* message, size_t message_size) {
  constexpr int n = 1000;
  float hx[n], hy[n], hout[n];
  for (int i = 0; i < n; ++i) { hx[i] = float(i % 17) - 8.0f; hy[i] = float(i % 5) * 0.25f; hout[i] = -1e30f; }
  float *dx = nullptr, *dy = nullptr, *dout = nullptr;
  Error e = malloc(reinterpret_cast<void**>(&dx), sizeof hx);
  if (e == kSuccess) e = malloc(reinterpret_cast<void**>(&dy), sizeof hy);
  if (e == kSuccess) e = malloc(reinterpret_cast<void**>(&dout), sizeof hout);
  if (e == kSuccess) e = memcpy_h2d(dx, hx, sizeof hx, nullptr);
  if (e == kSuccess) e = memcpy_h2d(dy, hy, sizeof hy, nullptr);
  if (e == kSuccess) {
    saxpy_kernel<<<(n + 255) / 256, 256>>>(n, 3.0f, dx, dy, dout);
    e = last_error();
  }
  if (e == kSuccess) e = memcpy_d2h(hout, dout, sizeof hout, nullptr);
  if (e == kSuccess) e = stream_sync(nullptr);
  (void)free(dx);  // best effort: the self-test reports the first error only
  (void)free(dy);
  (void)free(dout);
  if (e != kSuccess) {
    std::snprintf(message, message_size, "gpu error: %s", error_string(e));
    return false;
  }
  for (int i = 0; i < n; ++i) {
    if (hout[i] != 3.0f * hx[i] + hy[i]) {
      std::snprintf(message, message_size, "mismatch at %d: %g", i, double(hout[i]));
      return false;
    }
  }
  std::snprintf(message, message_size, "saxpy self-test passed on %d elements (warp size %d)", n, kWarpSize);
  return true;
}

}  // namespace mla::gpu
