// `mla_gpu_info`: prints the visible GPUs and runs the launch self-test (used by tools/gpu_check.sh).
#include <cstdio>

#include "backend/gpu/device_info.h"

int main() {
  const int n = mla::gpu::device_count_or_zero();
  std::printf("gpus: %d\n", n);
  if (n == 0) return 1;
  char msg[256];
  const bool ok = mla::gpu::self_test(msg, sizeof msg);
  std::printf("%s\n", msg);
  return ok ? 0 : 1;
}
