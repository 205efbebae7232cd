// The tiny random checkpoint with one MTP (NextN) block, shared by the feature-capture and MTP
// tests: written once per test binary into a temp dir (seed 7, several shards), removed at exit.
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "io/presets.h"
#include "model/deepseek_v3_synthetic.h"

namespace mla::test {

inline std::string tiny_mtp_dir(const std::string& variant) {
  return (std::filesystem::temp_directory_path() / fmt::format("mlaserve_test_mtp_{}_{}", variant, getpid())).string();
}

// Writes the tiny preset with `mtp_layers` NextN blocks in format `dtype`, once per process.
inline std::string tiny_mtp_model(const std::string& dtype = "bf16", int mtp_layers = 1) {
  const std::string dir = tiny_mtp_dir(fmt::format("{}_{}", dtype, mtp_layers));
  if (std::filesystem::exists(dir + "/config.json")) return dir;
  auto cfg = io::preset_config("tiny");
  EXPECT_TRUE(cfg.is_ok());
  cfg->num_nextn_predict_layers = mtp_layers;
  auto q = io::with_quantization(*cfg, dtype);
  EXPECT_TRUE(q.is_ok()) << q.status().message();
  model::SyntheticOptions opt;
  opt.seed = 7;
  opt.max_shard_bytes = 1 << 20;
  const Status st = model::write_synthetic_checkpoint(*q, dir, opt);
  EXPECT_TRUE(st.is_ok()) << st.message();
  return dir;
}

// Removes every directory named by tiny_mtp_dir when the test binary ends.
class TinyMtpCleanup : public ::testing::Environment {
 public:
  void TearDown() override {
    const std::string prefix = fmt::format("mlaserve_test_mtp_");
    const std::string suffix = fmt::format("_{}", getpid());
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(std::filesystem::temp_directory_path(), ec)) {
      const std::string name = e.path().filename().string();
      if (name.starts_with(prefix) && name.ends_with(suffix)) std::filesystem::remove_all(e.path(), ec);
    }
  }
};

inline std::vector<int32_t> random_ids(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int32_t& t : p) t = int32_t(rng() % uint32_t(vocab));
  return p;
}

inline std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

}  // namespace mla::test
