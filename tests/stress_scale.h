// Sizes of the stress tests (request counts, generation lengths): the full size in the plain build,
// a smaller one under AddressSanitizer + UBSan, where the same code runs ~10x slower. Both builds
// assert the same invariants (no leaked block, every request answered, drain on SIGTERM); the
// sanitized run checks them for memory errors at a size that keeps CI's wall time down.
#pragma once

namespace mla::test {

#if defined(MLA_TEST_SANITIZED)
inline constexpr bool kSanitizedBuild = true;
#else
inline constexpr bool kSanitizedBuild = false;
#endif

// `plain` in the plain build, `sanitized` in the asan preset's.
constexpr int stress_size(int plain, int sanitized) { return kSanitizedBuild ? sanitized : plain; }

}  // namespace mla::test
