// `mlaserve make-model`: writes a random-weight model of a preset geometry in the exact HF layout.
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/progress_bar.h"
#include "io/presets.h"
#include "model/deepseek_v3_synthetic.h"
#include "tokenizer/byte_tokenizer_writer.h"

namespace mla::cli {

namespace {
struct MakeModelArgs {
  std::string preset = "tiny";
  std::optional<int> layers, experts, mtp_layers, dense_layers;
  std::string dtype = "bf16";
  uint64_t seed = 0;
  std::string out;
  uint64_t max_shard_mb = 4096;
  bool force_sharding = false;
  float branch_gain = 1.0f;
  int threads = 0;
};

int run_make_model(const MakeModelArgs& a) {
  Result<io::ModelConfig> cfg = io::preset_config(a.preset);
  if (!cfg) { std::fprintf(stderr, "mlaserve make-model: %s\n", cfg.status().message().c_str()); return 2; }
  if (Status st = io::apply_overrides(*cfg, a.layers, a.experts, a.dense_layers); !st) {
    std::fprintf(stderr, "mlaserve make-model: %s\n", st.message().c_str());
    return 2;
  }
  if (!(std::isfinite(a.branch_gain) && a.branch_gain > 0.0f)) {
    std::fprintf(stderr, "mlaserve make-model: --branch-gain: must be finite and > 0, got %g\n", double(a.branch_gain));
    return 2;
  }
  if (a.threads < 0) {
    std::fprintf(stderr, "mlaserve make-model: --threads: must be >= 0 (0: all cores), got %d\n", a.threads);
    return 2;
  }
  if (a.mtp_layers) cfg->num_nextn_predict_layers = *a.mtp_layers;  // range-checked by the writer's validation
  Result<io::ModelConfig> q = io::with_quantization(*cfg, a.dtype);
  if (!q) { std::fprintf(stderr, "mlaserve make-model: %s\n", q.status().message().c_str()); return 2; }
  ProgressBar bar("writing " + a.out);
  model::SyntheticOptions opt;
  opt.seed = a.seed;
  opt.max_shard_bytes = a.max_shard_mb << 20;
  opt.force_sharding = a.force_sharding;
  opt.branch_gain = a.branch_gain;
  opt.threads = a.threads;
  opt.progress = [&bar](uint64_t done, uint64_t total) { bar.update(done, total); };
  if (Status st = model::write_synthetic_checkpoint(*q, a.out, opt); !st) {
    std::fprintf(stderr, "mlaserve make-model: %s\n", st.message().c_str());
    return 1;
  }
  const bool byte_tokenizer = q->vocab_size == tokenizer::kByteTokenizerVocab;
  if (byte_tokenizer) {
    if (Status st = tokenizer::write_byte_level_tokenizer(a.out); !st) {
      std::fprintf(stderr, "mlaserve make-model: %s\n", st.message().c_str());
      return 1;
    }
  }
  const std::string gain = a.branch_gain == 1.0f ? "" : fmt::format(", branch gain {}", a.branch_gain);
  std::printf("wrote %s: preset %s, %s weights, RANDOM values (seed %llu%s)%s\n%s", a.out.c_str(), a.preset.c_str(),
              a.dtype.c_str(), static_cast<unsigned long long>(a.seed), gain.c_str(),
              byte_tokenizer ? ", byte-level tokenizer" : "", io::describe(*q).c_str());
  return 0;
}
}  // namespace

Command add_make_model_command(CLI::App& app) {
  auto args = std::make_shared<MakeModelArgs>();
  CLI::App* sub = app.add_subcommand("make-model", "Write a random-weight model (config.json + safetensors) of a preset geometry");
  sub->add_option("--preset", args->preset, "Geometry: tiny, deepseek-v3 or kimi-k2")->capture_default_str();
  sub->add_option("--layers", args->layers, "Override num_hidden_layers");
  sub->add_option("--experts", args->experts, "Override n_routed_experts");
  sub->add_option("--mtp-layers", args->mtp_layers,
                  "Override num_nextn_predict_layers: MTP (NextN) blocks written after the decoder layers");
  sub->add_option("--dense-layers", args->dense_layers,
                  "Override first_k_dense_replace: 0..layers leading dense-MLP layers (= layers: no MoE layer)");
  sub->add_option("--branch-gain", args->branch_gain,
                  "Scale of every o_proj and down_proj (the residual branches); small values make a model "
                  "with fewer layers and the same seed agree with this one")
      ->capture_default_str();
  sub->add_option("--threads", args->threads, "Generator threads; 0: all cores")->capture_default_str();
  sub->add_option("--dtype", args->dtype, "Weight format: bf16, fp8 (DeepSeek 128x128 blocks) or int4 (W4A16 group 32)")
      ->check(CLI::IsMember({"bf16", "fp8", "int4"}))
      ->capture_default_str();
  sub->add_option("--seed", args->seed, "Random seed")->capture_default_str();
  sub->add_option("--out", args->out, "Output directory")->required();
  sub->add_option("--max-shard-mb", args->max_shard_mb, "Largest safetensors shard, in MiB")->capture_default_str();
  sub->add_flag("--force-sharding", args->force_sharding, "Write an index and shards even when one file would do");
  return {sub, [args] { return run_make_model(*args); }};
}

}  // namespace mla::cli
