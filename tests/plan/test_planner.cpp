// Planner and GPU catalog tests: a small geometry counted tensor by tensor by hand, the article's
// Kimi K3 claims, DeepSeek-V3's published size, and the catalog loader's error messages.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "io/presets.h"
#include "plan/planner.h"

namespace mla::plan {
namespace {

const std::string kCatalog =
    (std::filesystem::path(__FILE__).parent_path().parent_path().parent_path() / "data" / "gpu_catalog.json").string();

io::ModelConfig small_config() {
  Result<io::ModelConfig> base = io::preset_config("tiny");
  EXPECT_TRUE(base.is_ok());
  io::ModelConfig c = *base;
  c.vocab_size = 10, c.hidden_size = 8, c.intermediate_size = 16, c.moe_intermediate_size = 4;
  c.num_hidden_layers = 3, c.first_k_dense_replace = 1, c.num_attention_heads = 2, c.num_key_value_heads = 2;
  c.q_lora_rank = 4, c.kv_lora_rank = 4, c.qk_nope_head_dim = 2, c.qk_rope_head_dim = 2, c.v_head_dim = 2;
  c.n_routed_experts = 4, c.n_shared_experts = 1, c.num_experts_per_tok = 2, c.n_group = 1, c.topk_group = 1;
  return c;
}

GpuSpec toy_gpu(double memory_bytes) {
  GpuSpec g;
  g.key = "toy";
  g.memory_gb = memory_bytes / 1e9;
  g.hbm_tbps = 1;
  g.bf16_tflops = 1;
  g.price_per_gpu_hour = 1;
  return g;
}

TEST(PlannerSmall, CountsEveryTensorByHand) {
  const ModelGeometry m = geometry_from_config(small_config(), "small");
  // embed 10*8 + lm_head 10*8 + norms 8*(1 + 2*3 layers)
  // attention per layer: q_a 4*8, q_a_ln 4, q_b (2*4)*4, kv_a (4+2)*8, kv_a_ln 4, kv_b (2*4)*4, o 8*(2*2)
  const int64_t attn = 32 + 4 + 32 + 48 + 4 + 32 + 32;
  const int64_t dense = 3 * 16 * 8;
  const int64_t router = 4 * 8 + 4, experts = 4 * 3 * 4 * 8, shared = 3 * 4 * 8;
  const int64_t total = 80 + 80 + 56 + 3 * attn + dense + 2 * (router + experts + shared);
  ASSERT_EQ(total, 2184);
  PlanInput in;
  in.gpus = 1;
  in.workspace_gb = 0;
  auto r = plan(m, toy_gpu(1e6), in);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->total_params, total);
  EXPECT_EQ(r->total_params, io::parameter_count(small_config()));
  EXPECT_EQ(r->active_params, io::active_parameter_count(small_config()));
  EXPECT_EQ(r->by_component[int(Component::Attention)].params, 3 * attn);
  EXPECT_EQ(r->by_component[int(Component::RoutedExperts)].params, 2 * experts);
  EXPECT_EQ(r->by_component[int(Component::SharedExperts)].params, 2 * shared);
  EXPECT_EQ(r->by_component[int(Component::DenseFfn)].params, dense);
  EXPECT_EQ(r->by_component[int(Component::LmHead)].params, 80);
  // bf16 everywhere except the f32 router bias (4 per MoE layer).
  EXPECT_DOUBLE_EQ(r->weight_bytes, 2.0 * (total - 8) + 4.0 * 8);
  EXPECT_DOUBLE_EQ(r->kv_bytes_per_token, 3.0 * (4 + 2) * 2);
  EXPECT_DOUBLE_EQ(r->state_bytes_per_seq, 0);

  // fp8: 1872 quantized params in 48 matrices (15 attention, 3 dense, 24 expert, 6 shared), each a
  // single 128x128 block with one f32 scale; 304 params stay bf16, the 8 bias values f32.
  in.weights = WeightFormat::Fp8;
  r = plan(m, toy_gpu(1e6), in);
  ASSERT_TRUE(r.is_ok());
  EXPECT_DOUBLE_EQ(r->scale_bytes, 48 * 4);
  EXPECT_DOUBLE_EQ(r->weight_bytes, 1872 + 48 * 4 + 304 * 2 + 8 * 4);

  // mxfp4 (experts only): 768 params at half a byte; one e8m0 scale per row per 32 inputs:
  // gate/up [4,8] -> 4 each, down [8,4] -> 8, per expert 16, times 8 experts.
  in.weights = WeightFormat::Mxfp4;
  r = plan(m, toy_gpu(1e6), in);
  ASSERT_TRUE(r.is_ok());
  EXPECT_DOUBLE_EQ(r->scale_bytes, 16 * 8);
  EXPECT_DOUBLE_EQ(r->weight_bytes, 768 / 2 + 128 + (2184 - 768 - 8) * 2 + 8 * 4);

  // int4: bf16 scales, twice the mxfp4 scale bytes.
  in.weights = WeightFormat::Int4;
  r = plan(m, toy_gpu(1e6), in);
  ASSERT_TRUE(r.is_ok());
  EXPECT_DOUBLE_EQ(r->scale_bytes, 2 * 16 * 8);
}

TEST(PlannerSmall, FitRuleAndBudget) {
  const ModelGeometry m = geometry_from_config(small_config(), "small");
  PlanInput in;
  in.gpus = 1;
  in.workspace_gb = 0;
  in.context = 100;  // 100 * 36 = 3600 bytes per sequence
  // 10000 bytes of HBM: usable 9000, weights 4384 (bf16), budget 4616.
  auto r = plan(m, toy_gpu(10000), in);
  ASSERT_TRUE(r.is_ok());
  EXPECT_NEAR(r->kv_budget_bytes, 9000 - 4384, 1e-6);
  EXPECT_NEAR(r->kv_tokens, (9000.0 - 4384) / 36, 1e-6);
  EXPECT_EQ(r->max_concurrency, 1);
  EXPECT_TRUE(r->fits);
  EXPECT_GT(r->decode_tok_s, 0);
  in.context = 200;  // 7200 bytes: weights fit, one sequence does not
  r = plan(m, toy_gpu(10000), in);
  ASSERT_TRUE(r.is_ok());
  EXPECT_TRUE(r->weights_fit);
  EXPECT_FALSE(r->fits);
  r = plan(m, toy_gpu(4000), in);
  ASSERT_TRUE(r.is_ok());
  EXPECT_FALSE(r->weights_fit);
  in.tp = 3;
  EXPECT_FALSE(plan(m, toy_gpu(1e6), in).is_ok());
}

TEST(PlannerSmall, DecodeBandwidthRoofline) {
  // One sequence, bandwidth-bound: tok/s = bandwidth / (non-expert bytes + 2 of 4 experts per
  // MoE layer + its cache), all computed here from the hand counts.
  const ModelGeometry m = geometry_from_config(small_config(), "small");
  PlanInput in;
  in.gpus = 1;
  in.workspace_gb = 0;
  in.context = 10;
  GpuSpec g = toy_gpu(1e6);
  g.bf16_tflops = 1e9;  // make compute free
  auto r = plan(m, g, in);
  ASSERT_TRUE(r.is_ok());
  const double expert_bytes = 2.0 * 4 * 3 * 4 * 8 * 2;  // 2 layers, 4 experts, bf16
  const double step_bytes = (4384 - expert_bytes) + expert_bytes / 2 + 10 * 36;
  EXPECT_TRUE(r->decode_bandwidth_bound);
  EXPECT_NEAR(r->decode_tok_s, 1e12 / step_bytes, 1e12 / step_bytes * 1e-9);
}

class PlannerPresets : public ::testing::Test {
 protected:
  void SetUp() override {
    auto c = load_gpu_catalog(kCatalog);
    ASSERT_TRUE(c.is_ok()) << c.status().message();
    catalog_ = *c;
  }
  PlanResult run(const std::string& preset, const std::string& gpu, int64_t context) {
    auto m = plan_preset(preset);
    EXPECT_TRUE(m.is_ok());
    PlanInput in;
    in.weights = m->shipped;
    in.gpus = 8;
    in.context = context;
    in.concurrency = 16;
    const GpuSpec* g = catalog_.find(gpu);
    EXPECT_NE(g, nullptr) << gpu;
    auto r = plan(*m, *g, in);
    EXPECT_TRUE(r.is_ok());
    return *r;
  }
  GpuCatalog catalog_;
};

TEST_F(PlannerPresets, KimiK3MatchesTheArticle) {
  const PlanResult r = run("kimi-k3", "mi355x", 131072);
  EXPECT_NEAR(double(r.total_params), 2.8e12, 0.03 * 2.8e12);
  EXPECT_GT(r.weight_bytes, 1.5e12);
  EXPECT_TRUE(r.fits);
  EXPECT_GT(r.state_bytes_per_seq, 69.0 * 96 * 128 * 128 * 4);  // at least the fp32 S matrices
  EXPECT_DOUBLE_EQ(r.kv_bytes_per_token, 24.0 * 576 * 2);
  EXPECT_GT(r.decode_tok_s, 0);
  EXPECT_GT(r.usd_per_mtok_output, 0);
  EXPECT_TRUE(run("kimi-k3", "b300", 131072).fits);
  const PlanResult b200 = run("kimi-k3", "b200", 1);  // smallest possible KV need
  EXPECT_FALSE(b200.weights_fit);
  EXPECT_FALSE(b200.fits);
}

TEST_F(PlannerPresets, DeepSeekV3Fp8) {
  const PlanResult r = run("deepseek-v3", "h200", 8192);
  EXPECT_NEAR(double(r.total_params), 671e9, 0.01 * 671e9);
  EXPECT_GT(r.weight_bytes, 650e9);
  EXPECT_LT(r.weight_bytes, 720e9);
  EXPECT_TRUE(r.fits);
  const nlohmann::json j = plan_to_json(r);
  for (const char* k : {"total_params", "weight_bytes", "fits", "kv_bytes_per_token"}) EXPECT_TRUE(j.contains(k)) << k;
  // K2 Thinking: int4 experts are smaller than K2's fp8 ones.
  EXPECT_LT(run("kimi-k2-thinking", "h200", 8192).weight_bytes, run("kimi-k2", "h200", 8192).weight_bytes * 0.7);
  EXPECT_FALSE(plan_preset("gpt-2").is_ok());
}

std::string write_temp(const std::string& name, const std::string& text) {
  const std::string p = (std::filesystem::temp_directory_path() / name).string();
  std::ofstream(p) << text;
  return p;
}

TEST(GpuCatalog, ShippedCatalogIsComplete) {
  auto c = load_gpu_catalog(kCatalog);
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  for (const char* k : {"h100", "h200", "b200", "b300", "mi300x", "mi325x", "mi355x"}) EXPECT_NE(c->find(k), nullptr) << k;
  EXPECT_FALSE(c->find("h100")->fp4_tflops.has_value());
  EXPECT_NE(c->find("MI355X"), nullptr);
}

TEST(GpuCatalog, ErrorsNameFileAndKey) {
  auto missing = load_gpu_catalog("/nonexistent/cat.json");
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/cat.json"), std::string::npos);
  auto bad = parse_gpu_catalog(R"({"gpus":{"x":{"name":"X","memory_gb":-1}}})", "c.json");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("c.json: gpus.x.memory_gb"), std::string::npos) << bad.status().message();
  EXPECT_FALSE(parse_gpu_catalog("{", "c.json").is_ok());
  EXPECT_FALSE(parse_gpu_catalog(R"({"gpus":{}})", "c.json").is_ok());
}

TEST(GpuCatalog, OverrideChangesOneField) {
  auto c = load_gpu_catalog(kCatalog);
  ASSERT_TRUE(c.is_ok());
  const double hbm = c->find("b200")->hbm_tbps;
  const std::string p = write_temp("mla_plan_override.json", R"({"gpus":{"b200":{"price_per_gpu_hour":9.5}}})");
  ASSERT_TRUE(apply_catalog_override(*c, p).is_ok());
  EXPECT_DOUBLE_EQ(c->find("b200")->price_per_gpu_hour, 9.5);
  EXPECT_DOUBLE_EQ(c->find("b200")->hbm_tbps, hbm);
  const std::string bad = write_temp("mla_plan_override_bad.json", R"({"gpus":{"newgpu":{"memory_gb":10}}})");
  Status s = apply_catalog_override(*c, bad);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("gpus.newgpu"), std::string::npos) << s.message();
  std::remove(p.c_str());
  std::remove(bad.c_str());
}

}  // namespace
}  // namespace mla::plan
