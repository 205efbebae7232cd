// What `mlaserve serve` and `mlaserve chat` share: the engine knobs on the command line, the
// backend named by --device, and loading model + tokenizer + chat template into a running Engine.
// One definition so the two commands cannot drift apart.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "core/status.h"
#include "dist/communicator.h"
#include "model/deepseek_v3.h"
#include "ops/backend.h"
#include "runtime/engine.h"
#include "spec/draft_model.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace mla::cli {

struct EngineArgs {
  std::string model;
  std::string device = "cpu";                 // cpu or cuda
  std::optional<std::string> gemm_precision;  // cuda only: fp32 or bf16
  int max_num_seqs = 16;
  int max_model_len = 0;                      // 0: from the model and the KV pool
  int max_tokens_per_step = 512;
  int block_size = 16;
  int num_kv_blocks = 2048;
  double kv_cache_memory_gib = 0;             // > 0: overrides num_kv_blocks
  int max_queue = 256;
  bool no_prefix_caching = false;
  std::string kv_cache_dtype = "auto";        // auto = bf16 on cuda, f32 on cpu
  std::string decode_graphs = "auto";         // auto = on for cuda
  std::string mla_path = "auto";
  std::string speculative;                    // "" (off), draft, eagle3 or mtp
  std::string draft_model;                    // draft / eagle3: the draft's directory
  int num_draft_tokens = 4;                   // K
};

void add_engine_options(CLI::App* sub, EngineArgs& a);

// The backend named by --device ("cpu" or "cuda") with --gemm-precision ("fp32" or "bf16", cuda
// only; shared by every command that runs a model). A build without the GPU backend says so in one line.
Result<std::unique_ptr<ops::Backend>> make_backend(const std::string& device,
                                                   const std::optional<std::string>& gemm_precision);

// Everything a serving command holds, in destruction order (engine before model before backend).
struct LoadedServing {
  std::unique_ptr<ops::Backend> backend;
  dist::SingleProcessCommunicator comm;               // the model keeps a reference
  std::unique_ptr<tokenizer::Tokenizer> tok;          // null when the directory has none
  std::optional<tokenizer::ChatTemplateConfig> chat;  // nullopt when tokenizer_config.json has no template
  std::unique_ptr<model::DeepseekV3> model;
  std::unique_ptr<model::DeepseekV3> draft_lm;  // --speculative draft: the draft checkpoint
  std::unique_ptr<spec::DraftModel> draft;      // null without --speculative
  std::unique_ptr<runtime::Engine> engine;
  ~LoadedServing();
};

// --speculative / --draft-model / --num-draft-tokens (serve, chat and generate).
void add_speculative_options(CLI::App* sub, EngineArgs& a);

// Loads the draft named by a.speculative for `target` (limits sized for an engine of `ec`'s shape)
// into `s`. No-op when a.speculative is empty.
Status load_draft(const EngineArgs& a, const runtime::EngineConfig& ec, LoadedServing& s);

// Loads the model on the chosen backend and starts an engine. `progress` may print a bar.
Result<std::unique_ptr<LoadedServing>> load_serving(const EngineArgs& a, bool show_progress);

}  // namespace mla::cli
