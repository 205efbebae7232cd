// The lossless property of speculative_verify on the GPU backend (issue #8, "the same tests on the
// H200"): the chi-square checks of unit/spec_distribution.h with every op of the filter pipeline,
// the draft sampling and the verification running on the GPU.
#include <gtest/gtest.h>

#include "backend/gpu/gpu_backend.h"
#include "unit/spec_distribution.h"

namespace mla::test {
namespace {

std::unique_ptr<ops::Backend> gpu() {
  auto b = gpu::make_gpu_backend({});
  EXPECT_TRUE(b.is_ok()) << b.status().message();
  return std::move(b).value();
}

TEST(GpuSpecDistribution, EveryEmittedPositionIsDistributedAsTheTarget) {
  spec_distribution::check_every_position_is_distributed_as_the_target(*gpu());
}

TEST(GpuSpecDistribution, TheTokenStreamIsIid) { spec_distribution::check_token_stream_is_iid(*gpu()); }

}  // namespace
}  // namespace mla::test
