// Host-callable GPU discovery (no vendor headers here, so host code can include it).
#pragma once

#include <cstddef>

namespace mla::gpu {

// Number of visible GPUs, 0 when no driver or device is present.
int device_count_or_zero();
// Runs a tiny kernel and checks its result; writes a one-line report into `message`.
bool self_test(char* message, size_t message_size);

}  // namespace mla::gpu
