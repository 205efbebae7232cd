// DeepSeek-V3 / Kimi K2 (DeepseekV3ForCausalLM): the forward pass, written once against ops::Backend
// (ARCHITECTURE rule 1). One call runs one engine step over any mix of prefill chunks and decode
// tokens of many sequences, reading and writing the paged latent cache.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>

#include "dist/communicator.h"
#include "io/model_config.h"
#include "model/deepseek_v3_weights.h"
#include "ops/backend.h"

namespace mla::model {

// Which MLA formulation the attention uses. Both compute the same function (tested).
enum class MlaPath : uint8_t {
  Auto,      // absorbed when every sequence decodes one token, naive otherwise
  Naive,     // decompress per-head K/V from the latent cache (prefill-friendly, compute-bound)
  Absorbed,  // MQA over the latent (decode-friendly, reads 576 values per cached token)
};

// One sequence's share of a step.
struct SequenceSlice {
  int q_len = 0;                         // new tokens this step (its rows are consecutive in the step)
  int kv_len = 0;                        // cached tokens after this step (>= q_len)
  std::span<const int32_t> block_table;  // cache blocks covering positions [0, kv_len)
};

// Everything one forward step needs, as host arrays (the model stages them to the backend).
// Invariant: token rows are grouped by sequence in `seqs` order and positions[t] of the i-th new
// token of a sequence is kv_len - q_len + i.
struct ForwardInputs {
  std::span<const int32_t> token_ids;    // [T]
  std::span<const int32_t> positions;    // [T]
  std::span<const SequenceSlice> seqs;   // [S]
  std::span<const int32_t> logits_rows;  // token rows whose logits are produced, in output order
  std::span<const TensorView> kv_cache;  // per layer: F32 [num_blocks, block_size, kv_dim]
  int block_size = 0;                    // tokens per cache block
};

// Upper bounds that size every workspace at load time (ARCHITECTURE rule 4).
struct ModelLimits {
  int max_tokens = 512;         // T per step
  int max_seqs = 64;            // S per step
  int max_block_entries = 8192;  // total block-table entries across a step's sequences
};

// Reports loading progress: bytes of tensors placed so far and in total.
using LoadProgress = std::function<void(uint64_t done, uint64_t total)>;

class DeepseekV3 {
 public:
  // Opens config.json and the safetensors of `model_dir`, checks every tensor, places the weights
  // on `backend` and allocates workspaces for `limits`.
  static Result<std::unique_ptr<DeepseekV3>> load(const std::string& model_dir, ops::Backend& backend,
                                                  const ModelLimits& limits, dist::Communicator& comm,
                                                  const LoadProgress& progress = {});
  ~DeepseekV3();

  const io::ModelConfig& config() const { return cfg_; }
  const ModelLimits& limits() const { return limits_; }
  const io::Checkpoint& checkpoint() const { return *checkpoint_; }
  // MLA layers, hence cache layers (all decoder layers for DeepSeek-V3).
  int num_cache_layers() const { return cfg_.num_hidden_layers; }
  int kv_dim() const { return cfg_.kv_cache_dim(); }
  void set_mla_path(MlaPath path) { mla_path_ = path; }

  // Runs one step and writes F32 logits [logits_rows.size(), vocab_size] into `logits`
  // (backend memory, contiguous). Preconditions (checked): the step fits `limits`, block tables
  // cover kv_len, and positions match the slices.
  void forward(const ForwardInputs& in, const TensorView& logits);

 private:
  struct Workspace;
  DeepseekV3(io::ModelConfig cfg, ops::Backend& backend, dist::Communicator& comm, const ModelLimits& limits);
  void stage_inputs(const ForwardInputs& in, ops::AttentionBatch& batch);
  void attention(int layer, const TensorView& x, const ops::AttentionBatch& batch, const TensorView& positions,
                 const ForwardInputs& in, bool absorbed, const TensorView& out);
  void ffn(int layer, const TensorView& x, const TensorView& out);

  io::ModelConfig cfg_;
  ops::Backend& backend_;
  dist::Communicator& comm_;
  ModelLimits limits_;
  std::unique_ptr<io::Checkpoint> checkpoint_;  // keeps the mmapped weights alive
  DeepseekV3Weights weights_;
  ops::MlaDims dims_;
  ops::MoeRouting routing_;
  ops::RopeTable rope_;
  std::unique_ptr<Workspace> ws_;
  MlaPath mla_path_ = MlaPath::Auto;
};

}  // namespace mla::model
