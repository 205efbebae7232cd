// Model + engine setup shared by `serve` and `chat` (see serving_setup.h).
#include "cli/serving_setup.h"

#include "backend/cpu/cpu_backend.h"
#if MLA_HAVE_GPU
#include "backend/gpu/gpu_backend.h"
#endif
#include "cli/progress_bar.h"
#include "dist/communicator.h"
#include "io/model_config.h"
#include "model/deepseek_mtp.h"
#include "model/eagle3.h"
#include "spec/deepseek_draft.h"

namespace mla::cli {

void add_engine_options(CLI::App* sub, EngineArgs& a) {
  sub->add_option("--model", a.model, "Model directory (config.json + safetensors + tokenizer)")->required();
  sub->add_option("--device", a.device, "Where the model runs: cpu, or cuda (a build with the GPU backend)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  sub->add_option("--gemm-precision", a.gemm_precision, "cuda: fp32 (matches the CPU) or bf16 (faster)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  sub->add_option("--max-num-seqs", a.max_num_seqs, "Sequences decoded together (continuous batching)")->capture_default_str();
  sub->add_option("--max-model-len", a.max_model_len, "Longest prompt + completion (0: the model's, capped by the KV pool)")
      ->capture_default_str();
  sub->add_option("--max-tokens-per-step", a.max_tokens_per_step, "Token budget of one engine step (chunked prefill)")
      ->capture_default_str();
  sub->add_option("--block-size", a.block_size, "Tokens per KV block")->capture_default_str();
  sub->add_option("--num-kv-blocks", a.num_kv_blocks, "KV blocks in the pool")->capture_default_str();
  sub->add_option("--kv-cache-memory", a.kv_cache_memory_gib, "KV pool size in GiB (overrides --num-kv-blocks)");
  sub->add_option("--max-queue", a.max_queue, "Requests accepted but not started; beyond it: 429")->capture_default_str();
  sub->add_flag("--no-prefix-caching", a.no_prefix_caching, "Disable prefix caching");
  sub->add_option("--kv-cache-dtype", a.kv_cache_dtype, "Latent cache dtype: auto (bf16 on cuda, f32 on cpu), f32, bf16")
      ->check(CLI::IsMember({"auto", "f32", "bf16"}))
      ->capture_default_str();
  sub->add_option("--decode-graphs", a.decode_graphs, "Replay captured graphs for decode steps: auto (on for cuda), on, off")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  sub->add_option("--mla-path", a.mla_path, "MLA formulation: auto, naive or absorbed")
      ->check(CLI::IsMember({"auto", "naive", "absorbed"}))
      ->capture_default_str();
}

void add_speculative_options(CLI::App* sub, EngineArgs& a) {
  sub->add_option("--speculative", a.speculative, "Speculative decoding: draft (a smaller model), eagle3 or mtp")
      ->check(CLI::IsMember({"draft", "eagle3", "mtp"}));
  sub->add_option("--draft-model", a.draft_model, "Draft directory for --speculative draft|eagle3");
  sub->add_option("--num-draft-tokens", a.num_draft_tokens, "Tokens drafted per step (K)")
      ->check(CLI::Range(1, 16))
      ->capture_default_str();
}

Status load_draft(const EngineArgs& a, const runtime::EngineConfig& ec, LoadedServing& s) {
  if (a.speculative.empty()) {
    if (!a.draft_model.empty()) return error("--draft-model needs --speculative draft|eagle3");
    return Status::ok();
  }
  if (a.speculative != "mtp" && a.draft_model.empty()) return error("--speculative {} needs --draft-model DIR", a.speculative);
  // The draft's catch-up reads every target row of a step plus one newest token per sequence.
  model::ModelLimits limits;
  limits.max_tokens = ec.max_tokens_per_step + ec.max_num_seqs;
  limits.max_seqs = ec.max_num_seqs;
  limits.max_block_entries = s.model->limits().max_block_entries;
  if (a.speculative == "draft") {
    MLA_ASSIGN_OR_RETURN(s.draft_lm, model::DeepseekV3::load(a.draft_model, *s.backend, limits, s.comm));
    if (s.draft_lm->config().vocab_size != s.model->config().vocab_size)
      return error("{}: draft vocabulary {} differs from the target's {}", a.draft_model, s.draft_lm->config().vocab_size,
                   s.model->config().vocab_size);
    s.draft_lm->set_decode_graphs(ec.decode_graphs);
    s.draft = std::make_unique<spec::DeepseekDraft>(*s.draft_lm);
    return Status::ok();
  }
  if (a.speculative == "mtp") {
    if (!a.draft_model.empty() && a.draft_model != a.model)
      return error("--speculative mtp reads the MTP block from the target checkpoint; drop --draft-model");
    MLA_ASSIGN_OR_RETURN(std::unique_ptr<model::DeepseekMtp> mtp,
                         model::DeepseekMtp::load(a.model, *s.backend, limits, s.comm, 0, s.model.get()));
    mtp->block().set_decode_graphs(ec.decode_graphs);
    s.draft = std::move(mtp);
    return Status::ok();
  }
  // eagle3: the head reads three target layers' features and borrows the target's embedding.
  MLA_ASSIGN_OR_RETURN(std::unique_ptr<model::Eagle3Draft> eagle,
                       model::Eagle3Draft::load(a.draft_model, s.model->config(), *s.backend, limits,
                                                s.model->weights().embed_tokens));
  s.draft = std::move(eagle);
  return Status::ok();
}

LoadedServing::~LoadedServing() {
  if (engine) engine->shutdown(/*drain=*/false);
  engine.reset();
  model.reset();
}

Result<std::unique_ptr<ops::Backend>> make_backend(const std::string& device,
                                                   const std::optional<std::string>& gemm_precision) {
  if (device == "cpu") {
    if (gemm_precision) return error("--gemm-precision applies to --device cuda only");
    return cpu::make_cpu_backend();
  }
#if MLA_HAVE_GPU
  gpu::GpuBackendOptions o;
  o.gemm_precision = gemm_precision.value_or("fp32") == "bf16" ? gpu::GemmPrecision::Bf16 : gpu::GemmPrecision::Fp32;
  return gpu::make_gpu_backend(o);
#else
  return error("--device cuda: this mlaserve was built without the GPU backend (build with the cuda preset)");
#endif
}

Result<std::unique_ptr<LoadedServing>> load_serving(const EngineArgs& a, bool show_progress) {
  if (a.max_num_seqs < 1 || a.max_tokens_per_step < 1 || a.block_size < 1 || a.num_kv_blocks < 1 || a.max_queue < 0)
    return error("--max-num-seqs, --max-tokens-per-step, --block-size and --num-kv-blocks must be >= 1");
  auto s = std::make_unique<LoadedServing>();
  MLA_ASSIGN_OR_RETURN(s->backend, make_backend(a.device, a.gemm_precision));
  const bool on_gpu = a.device != "cpu";
  if (auto t = tokenizer::Tokenizer::from_model_dir(a.model); t) s->tok = std::move(t).value();
  if (auto c = tokenizer::load_chat_template_config(a.model + "/tokenizer_config.json"); c) s->chat = std::move(c).value();
  MLA_ASSIGN_OR_RETURN(io::ModelConfig cfg, io::load_model_config(a.model));

  const DType kv_dtype = a.kv_cache_dtype == "bf16" || (a.kv_cache_dtype == "auto" && on_gpu) ? DType::BF16 : DType::F32;
  int num_blocks = a.num_kv_blocks;
  if (a.kv_cache_memory_gib > 0) {
    const double per_block = double(cfg.num_hidden_layers) * a.block_size * cfg.kv_cache_dim() * double(dtype_size(kv_dtype));
    num_blocks = int(std::min(a.kv_cache_memory_gib * double(1 << 30) / per_block, double(1 << 30)));
    if (num_blocks < 1) return error("--kv-cache-memory {} GiB holds no KV block ({} bytes each)", a.kv_cache_memory_gib, per_block);
  }
  const int64_t max_len = a.max_model_len > 0 ? a.max_model_len : cfg.max_position_embeddings;
  model::ModelLimits limits;
  // With speculation every sampling sequence has K+1 logits rows.
  limits.max_tokens = std::max(a.max_tokens_per_step,
                               a.speculative.empty() ? 0 : a.max_num_seqs * (a.num_draft_tokens + 1));
  limits.max_seqs = a.max_num_seqs;
  limits.max_block_entries =
      int(std::min<int64_t>(int64_t(a.max_num_seqs) * ((max_len + a.block_size - 1) / a.block_size), int64_t(1) << 24));
  std::unique_ptr<ProgressBar> bar;
  if (show_progress) bar = std::make_unique<ProgressBar>("loading " + a.model);
  MLA_ASSIGN_OR_RETURN(s->model, model::DeepseekV3::load(a.model, *s->backend, limits, s->comm, [&bar](uint64_t done, uint64_t total) {
                         if (bar) bar->update(done, total);
                       }));
  runtime::EngineConfig ec;
  ec.max_num_seqs = a.max_num_seqs;
  ec.max_tokens_per_step = a.max_tokens_per_step;
  ec.block_size = a.block_size;
  ec.num_blocks = num_blocks;
  ec.max_model_len = a.max_model_len;
  ec.max_waiting = a.max_queue;
  ec.enable_prefix_caching = !a.no_prefix_caching;
  ec.mla_path = a.mla_path == "naive" ? model::MlaPath::Naive
                : a.mla_path == "absorbed" ? model::MlaPath::Absorbed : model::MlaPath::Auto;
  ec.kv_cache_dtype = kv_dtype;
  ec.decode_graphs = a.decode_graphs == "on" || (a.decode_graphs == "auto" && on_gpu);
  ec.eos_token_ids = s->tok ? s->tok->eos_ids() : s->model->config().eos_token_id;
  ec.num_draft_tokens = a.speculative.empty() ? 0 : a.num_draft_tokens;
  MLA_RETURN_IF_ERROR(load_draft(a, ec, *s));
  MLA_ASSIGN_OR_RETURN(s->engine, runtime::Engine::create(*s->model, *s->backend, s->tok.get(), ec, s->draft.get()));
  return s;
}

}  // namespace mla::cli
