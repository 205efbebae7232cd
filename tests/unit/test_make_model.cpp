// make-model (write_synthetic_checkpoint and its CLI): the parallel generator reproduces the
// single-threaded files byte for byte (SHA-256 oracles recorded before it was parallelised), a
// smaller model of one seed is a prefix of a larger one, --branch-gain scales exactly the residual
// branches, and --dense-layers is bounds-checked.
#include <openssl/evp.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "core/dtype.h"
#include "io/presets.h"
#include "io/safetensors.h"
#include "model/deepseek_v3_synthetic.h"
#include "model/synthetic_random.h"
#include "unit/safetensors_test_util.h"

namespace mla::model {
namespace {

using io::test_util::TempDir;
using io::test_util::read_bytes;

std::string sha256_hex(const std::vector<uint8_t>& bytes) {
  std::array<uint8_t, 32> digest{};
  unsigned int len = 0;
  EXPECT_EQ(EVP_Digest(bytes.data(), bytes.size(), digest.data(), &len, EVP_sha256(), nullptr), 1);
  std::string hex;
  for (const uint8_t b : digest) hex += fmt::format("{:02x}", b);
  return hex;
}

struct TinyArgs {
  const char* dtype = "bf16";
  std::optional<int> layers, experts, dense_layers;
  int mtp_layers = 0;
};

io::ModelConfig tiny_config(const TinyArgs& a) {
  Result<io::ModelConfig> cfg = io::preset_config("tiny");
  EXPECT_TRUE(cfg.is_ok());
  EXPECT_TRUE(io::apply_overrides(*cfg, a.layers, a.experts, a.dense_layers).is_ok());
  cfg->num_nextn_predict_layers = a.mtp_layers;
  Result<io::ModelConfig> q = io::with_quantization(*cfg, a.dtype);
  EXPECT_TRUE(q.is_ok());
  return *q;
}

// Writes the checkpoint and returns SHA-256 per weight file (index included when sharded).
std::vector<std::pair<std::string, std::string>> write_and_hash(const io::ModelConfig& cfg, const std::string& dir,
                                                                const SyntheticOptions& opt) {
  const Status st = write_synthetic_checkpoint(cfg, dir, opt);
  EXPECT_TRUE(st.is_ok()) << st.message();
  std::vector<std::pair<std::string, std::string>> hashes;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.starts_with("model")) hashes.emplace_back(name, sha256_hex(read_bytes(e.path().string())));
  }
  std::sort(hashes.begin(), hashes.end());
  return hashes;
}

// Regression oracle: SHA-256 of the files the single-threaded generator (before the OpenMP fill
// and the overlapped writer, commit 0578e7f) wrote for these arguments, recorded once with
// `mlaserve make-model --preset tiny --dtype D --seed 7` and, for the sharded case,
// `--dtype fp8 --layers 3 --experts 6 --mtp-layers 1 --seed 11 --max-shard-mb 1 --force-sharding`.
// The committed test fixtures were made from these weights: a changed hash means changed values.
struct GoldenFile {
  const char* name;
  const char* sha256;
};
struct GoldenCase {
  const char* dtype;
  int layers, experts, mtp_layers;  // 0: the preset's
  uint64_t seed;
  bool sharded;
  std::vector<GoldenFile> files;
};

std::vector<GoldenCase> golden_cases() {
  return {
      {"bf16", 0, 0, 0, 7, false, {{"model.safetensors", "77a7d394ec8dfd3e94f3567f91efc69d3de157cce2d7ae2a73bce6ddeef7d9c2"}}},
      {"fp8", 0, 0, 0, 7, false, {{"model.safetensors", "a726dbeeaf26219fc761ad37560c180137628ff7dfe9ac8435c027853d3f6e97"}}},
      {"int4", 0, 0, 0, 7, false, {{"model.safetensors", "a5557f64b3695a5db5f17d74aca1ef862ecad6b7652c80e7a7a1d3f7bc57bc41"}}},
      {"int4", 3, 6, 1, 11, false, {{"model.safetensors", "680978c4f9379c514e5e1bf07f291efa0cdf9d039585d6cc62ff6e9142d63bc5"}}},
      {"fp8", 3, 6, 1, 11, true,
       {{"model-00001-of-00002.safetensors", "39a868664e7ed71f75c4193b1790812d003ed4cec829a7cf08fadc7d27d3c203"},
        {"model-00002-of-00002.safetensors", "4157ddc7eac23f3cc8735b5025d2ca9489b7bee059c99bea30cf70aa6b4d9936"},
        {"model.safetensors.index.json", "80a1a6e90de12b16c138e0e70e733c2c9fa743edbbc5c312a01539a9ceb1ae57"}}},
  };
}

TEST(MakeModel, BitIdenticalToSingleThreadedOracleAtAnyThreadCount) {
  for (const GoldenCase& c : golden_cases()) {
    std::vector<std::pair<std::string, std::string>> want;
    for (const GoldenFile& f : c.files) want.emplace_back(f.name, f.sha256);
    TinyArgs args{c.dtype};
    if (c.layers > 0) args.layers = c.layers;
    if (c.experts > 0) args.experts = c.experts;
    args.mtp_layers = c.mtp_layers;
    for (const int threads : {1, 3, 8}) {
      SCOPED_TRACE(fmt::format("dtype {} seed {} threads {}", c.dtype, c.seed, threads));
      TempDir tmp;
      SyntheticOptions opt;
      opt.seed = c.seed;
      opt.threads = threads;
      if (c.sharded) {
        opt.max_shard_bytes = uint64_t(1) << 20;
        opt.force_sharding = true;
      }
      EXPECT_EQ(write_and_hash(tiny_config(args), tmp.path().string(), opt), want);
    }
  }
}

float float_of(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// The fast fp8 conversion make-model uses must equal core's table search everywhere it can be
// called. (All 2^32 inputs but the saturated band (512, 2^127) were also compared once by hand, 0
// mismatches; this keeps a fast subset: a stride over every exponent, every rounding tie and its
// neighbours, the subnormal/normal and saturation edges, both signs, inf and NaN.)
TEST(MakeModel, Fp8FastConversionMatchesCore) {
  std::vector<uint32_t> inputs = {0x7f800000u, 0x7fc00000u, 0x7f800001u, 0x43e00000u, 0x43dfffffu, 0x43e80000u,
                                  0x43f00000u, 0x3c800000u, 0x3c7fffffu, 0x3a800000u, 0x3a000000u, 0x00000001u};
  for (uint32_t u = 0; u < 0x44000000u; u += 251) inputs.push_back(u);
  for (uint32_t e = 100; e <= 136; ++e) {
    for (uint32_t m = 0; m < 16; ++m) {  // 3 kept mantissa bits + the half bit
      const uint32_t base = (e << 23) | (m << 19);
      for (const uint32_t d : {0u, 1u, 0x7fffu, 0x7ffffu}) inputs.push_back(base | d);
      inputs.push_back(base - 1);
    }
  }
  int bad = 0;
  for (const uint32_t u : inputs) {
    for (const uint32_t sign : {0u, 0x80000000u}) {
      const float f = float_of(u | sign);
      const uint8_t want = f32_to_fp8e4m3(f), got = synthetic::fp8e4m3_rne(f);
      if (want != got && ++bad <= 5) ADD_FAILURE() << fmt::format("{:08x}: core {:02x}, fast {:02x}", u | sign, want, got);
    }
  }
  EXPECT_EQ(bad, 0);
}

// Every tensor of file `small` exists in `large` with the same dtype, shape and bytes.
void expect_prefix(const std::string& small, const std::string& large) {
  auto a = io::SafetensorsFile::open(small);
  auto b = io::SafetensorsFile::open(large);
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  ASSERT_LT(a->tensors().size(), b->tensors().size());
  for (const io::TensorInfo& t : a->tensors()) {
    const io::TensorInfo* u = b->find(t.name);
    ASSERT_NE(u, nullptr) << t.name;
    EXPECT_EQ(t.describe(), u->describe()) << t.name;
    const auto x = a->bytes(t), y = b->bytes(*u);
    EXPECT_TRUE(std::equal(x.begin(), x.end(), y.begin(), y.end())) << t.name;
  }
}

TEST(MakeModel, FewerLayersShareEveryCommonTensor) {
  for (const char* dtype : {"bf16", "fp8", "int4"}) {
    SCOPED_TRACE(dtype);
    TempDir tmp;
    SyntheticOptions opt;
    opt.seed = 5;
    const std::string two = (tmp.path() / "l2").string(), four = (tmp.path() / "l4").string();
    ASSERT_TRUE(write_synthetic_checkpoint(tiny_config({dtype, 2}), two, opt).is_ok());
    ASSERT_TRUE(write_synthetic_checkpoint(tiny_config({dtype, 4}), four, opt).is_ok());
    expect_prefix(two + "/model.safetensors", four + "/model.safetensors");
  }
}

// The module a stored tensor belongs to ("...mlp.down_proj" for "...mlp.down_proj.weight_scale").
std::string module_of(const std::string& tensor) {
  for (const char* suffix : {".weight_scale_inv", ".weight_packed", ".weight_scale", ".weight_shape", ".weight"}) {
    if (tensor.ends_with(suffix)) return tensor.substr(0, tensor.size() - std::string(suffix).size());
  }
  return tensor;
}

float element(const io::TensorInfo& t, std::span<const uint8_t> bytes, size_t i) {
  if (t.dtype == DType::BF16) return bf16_to_f32(uint16_t(bytes[2 * i] | (bytes[2 * i + 1] << 8)));
  float f;
  std::memcpy(&f, bytes.data() + 4 * i, 4);
  return f;
}

TEST(MakeModel, BranchGainScalesExactlyTheResidualBranches) {
  constexpr float kGain = 0.1f;
  for (const char* dtype : {"bf16", "fp8", "int4"}) {
    SCOPED_TRACE(dtype);
    TempDir tmp;
    SyntheticOptions opt;
    opt.seed = 9;
    const io::ModelConfig cfg = tiny_config({dtype, std::nullopt, std::nullopt, std::nullopt, 1});
    const std::string base = (tmp.path() / "g1").string(), gained = (tmp.path() / "g01").string();
    ASSERT_TRUE(write_synthetic_checkpoint(cfg, base, opt).is_ok());
    opt.branch_gain = kGain;
    ASSERT_TRUE(write_synthetic_checkpoint(cfg, gained, opt).is_ok());
    auto a = io::SafetensorsFile::open(base + "/model.safetensors");
    auto b = io::SafetensorsFile::open(gained + "/model.safetensors");
    ASSERT_TRUE(a.is_ok() && b.is_ok());
    EXPECT_EQ(a->metadata().count("branch_gain"), 0u);
    EXPECT_EQ(b->metadata().at("branch_gain"), "0.1");
    ASSERT_EQ(a->tensors().size(), b->tensors().size());
    int scaled = 0;
    for (const io::TensorInfo& t : a->tensors()) {
      const io::TensorInfo* u = b->find(t.name);
      ASSERT_NE(u, nullptr) << t.name;
      ASSERT_EQ(t.describe(), u->describe()) << t.name;
      const auto x = a->bytes(t), y = b->bytes(*u);
      const std::string module = module_of(t.name);
      const bool residual = module.ends_with("self_attn.o_proj") || module.ends_with("down_proj");
      EXPECT_EQ(residual, writes_residual(module + ".weight")) << t.name;
      // Scaled: dense bf16 weights and the FP8/INT4 scales. Codes (fp8 bytes, packed nibbles) and
      // every non-residual tensor stay byte-identical.
      const bool value_scaled = residual && (t.dtype == DType::BF16 || t.name.ends_with("_scale_inv"));
      if (!value_scaled) {
        EXPECT_TRUE(std::equal(x.begin(), x.end(), y.begin(), y.end())) << t.name;
        continue;
      }
      ++scaled;
      // bf16 stores with relative rounding <= 2^-8 on each side, so the ratio is within 2^-7 of the
      // gain; f32 scales (fp8's scale_inv) differ by one f32 rounding of the product.
      const double tol = t.dtype == DType::BF16 ? std::ldexp(1.0, -7) : 1e-6;
      const size_t n = size_t(t.numel());
      for (size_t i = 0; i < n; ++i) {
        const double ref = double(kGain) * element(t, x, i), got = element(*u, y, i);
        ASSERT_LE(std::abs(got - ref), tol * std::abs(ref) + 1e-30) << t.name << " element " << i;
      }
    }
    // Every layer (4 decoder + 1 MTP) has one o_proj and >= one down_proj whose values scale.
    EXPECT_GE(scaled, 10);
  }
}

TEST(MakeModel, BranchGainMustBePositiveAndFinite) {
  TempDir tmp;
  for (const float g : {0.0f, -1.0f, NAN, INFINITY}) {
    SyntheticOptions opt;
    opt.branch_gain = g;
    EXPECT_FALSE(write_synthetic_checkpoint(tiny_config({}), tmp.path().string(), opt).is_ok()) << g;
  }
}

TEST(MakeModel, DenseLayersBounds) {
  Result<io::ModelConfig> cfg = io::preset_config("tiny");
  ASSERT_TRUE(cfg.is_ok());
  const io::ModelConfig before = *cfg;
  EXPECT_FALSE(io::apply_overrides(*cfg, 3, std::nullopt, 4).is_ok());  // more dense layers than layers
  EXPECT_FALSE(io::apply_overrides(*cfg, std::nullopt, std::nullopt, -1).is_ok());
  EXPECT_FALSE(io::apply_overrides(*cfg, std::nullopt, std::nullopt, before.num_hidden_layers + 1).is_ok());
  EXPECT_TRUE(*cfg == before);  // untouched on error
  ASSERT_TRUE(io::apply_overrides(*cfg, 3, std::nullopt, 0).is_ok());
  EXPECT_EQ(cfg->first_k_dense_replace, 0);
  ASSERT_TRUE(io::apply_overrides(*cfg, std::nullopt, std::nullopt, 3).is_ok());
  EXPECT_EQ(cfg->first_k_dense_replace, 3);  // all dense: no MoE layer

  // An all-dense checkpoint has no router or expert in any decoder layer.
  TempDir tmp;
  ASSERT_TRUE(write_synthetic_checkpoint(tiny_config({"fp8", 2, std::nullopt, 2}), tmp.path().string(), {}).is_ok());
  auto f = io::SafetensorsFile::open(tmp.file("model.safetensors"));
  ASSERT_TRUE(f.is_ok());
  for (const io::TensorInfo& t : f->tensors()) EXPECT_EQ(t.name.find(".mlp.experts."), std::string::npos) << t.name;
  EXPECT_NE(f->find("model.layers.1.mlp.down_proj.weight"), nullptr);
}

std::pair<int, std::string> run_cli(const std::string& args) {
  FILE* p = popen((std::string(MLA_BINARY) + " " + args + " 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  while (p != nullptr && std::fgets(buf, sizeof buf, p) != nullptr) out += buf;
  const int status = p != nullptr ? pclose(p) : -1;
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

TEST(MakeModel, CliParsesDenseLayersBranchGainAndThreads) {
  TempDir tmp;
  const std::string dir = tmp.file("m");
  auto [rc, out] = run_cli(fmt::format("make-model --layers 3 --dense-layers 4 --out {}", dir));
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("--dense-layers: 4 exceeds the model's 3 layers"), std::string::npos) << out;
  std::tie(rc, out) = run_cli(fmt::format("make-model --branch-gain 0 --out {}", dir));
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("--branch-gain: must be finite and > 0, got 0"), std::string::npos) << out;
  std::tie(rc, out) = run_cli(fmt::format("make-model --threads -2 --out {}", dir));
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("--threads: must be >= 0"), std::string::npos) << out;
  EXPECT_FALSE(std::filesystem::exists(dir));  // rejected before anything is written
  std::tie(rc, out) = run_cli(
      fmt::format("make-model --layers 2 --dense-layers 2 --branch-gain 0.25 --threads 2 --seed 3 --out {}", dir));
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("branch gain 0.25"), std::string::npos) << out;
  auto f = io::SafetensorsFile::open(dir + "/model.safetensors");
  ASSERT_TRUE(f.is_ok());
  EXPECT_EQ(f->metadata().at("branch_gain"), "0.25");
  EXPECT_EQ(f->find("model.layers.1.mlp.gate.weight"), nullptr);  // layer 1 is dense
}

}  // namespace
}  // namespace mla::model
