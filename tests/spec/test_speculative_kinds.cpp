// Feature-fed drafts (MTP, EAGLE-3) through the serving engine on the CPU reference backend: greedy
// output identical to non-speculative output for K in {1, 2, 4} at batch 1 and 8 (4 under the
// sanitizers; the check itself: spec/feature_fed_greedy.h, shared with the GPU suite).
#include <gtest/gtest.h>

#include "backend/cpu/cpu_backend.h"
#include "spec/feature_fed_greedy.h"

namespace mla::test {
namespace {

FeatureFedTarget& target() {
  static std::unique_ptr<FeatureFedTarget> t = make_feature_fed_target(cpu::make_cpu_backend(), "cpu");
  return *t;
}

// The tiny target and the EAGLE-3 directory are removed at exit by TinyMtpCleanup (test_deepseek_mtp).
class FeatureFedGreedy : public ::testing::TestWithParam<std::tuple<std::string, int, int>> {};

TEST_P(FeatureFedGreedy, IdenticalToNonSpeculative) {
  const auto [kind, k, batch] = GetParam();
  check_feature_fed_greedy(target(), kind, k, batch);
}

INSTANTIATE_TEST_SUITE_P(KindsKAndBatch, FeatureFedGreedy, feature_fed_grid(), feature_fed_name);

}  // namespace
}  // namespace mla::test
