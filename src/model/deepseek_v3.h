// DeepSeek-V3 / Kimi K2 (DeepseekV3ForCausalLM): the forward pass, written once against ops::Backend
// (ARCHITECTURE rule 1). One call runs one engine step over any mix of prefill chunks and decode
// tokens of many sequences, reading and writing the paged latent cache. A step is staged (host
// arrays -> backend memory) and then computed; decode-only steps can replay a captured graph of the
// compute (rule 4), trading one eager step per new batch shape for launch-free decode afterwards.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

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

// Absorbed steps whose sequences all have the same q_len up to this (decode, speculative
// verification of the newest token plus K <= 7 drafts) may replay decode graphs.
inline constexpr int kMaxGraphQLen = 8;

// One sequence's share of a step.
struct SequenceSlice {
  int q_len = 0;                         // new tokens this step (its rows are consecutive in the step)
  int kv_len = 0;                        // cached tokens after this step (>= q_len)
  std::span<const int32_t> block_table;  // cache blocks covering positions [0, kv_len)
};

// Names the final hidden state after the model's last norm (`model.norm`) in a feature list (every
// other entry is a decoder layer index). spec::kFinalNormed aliases it.
inline constexpr int kFinalNormedFeature = -1;

// Everything one forward step needs, as host arrays (the model stages them to the backend).
// Invariant: token rows are grouped by sequence in `seqs` order and positions[t] of the i-th new
// token of a sequence is kv_len - q_len + i.
struct ForwardInputs {
  std::span<const int32_t> token_ids;    // [T]
  std::span<const int32_t> positions;    // [T]
  std::span<const SequenceSlice> seqs;   // [S]
  std::span<const int32_t> logits_rows;  // token rows whose logits are produced, in output order
  std::span<const TensorView> kv_cache;  // per layer: F32 or BF16 [num_blocks, block_size, kv_dim], one dtype
  int block_size = 0;                    // tokens per cache block
  // Feature capture (speculative drafts, issue #8). Empty: nothing captured, no extra op. Entry l
  // >= 0 is the residual stream (pre-norm, hidden + residual) LEAVING decoder layer l;
  // kFinalNormedFeature is the final hidden after model.norm. `features` is F32 [T, n * hidden]
  // backend memory (rows and the inner dim may be strided); entry i fills columns
  // [i*hidden, (i+1)*hidden) of every token row.
  std::span<const int> feature_layers;
  TensorView features;
  // When set (MTP block): F32 [T, hidden] backend memory replacing embedding(token_ids) as the input
  // of the first layer (token_ids still give T and are staged). Read, not written.
  TensorView input_embeds;
  // When set: I32 [T] backend memory holding the token ids, copied on the backend's stream in place
  // of uploading token_ids (whose size still gives T; their values are ignored). Lets a speculative
  // draft feed the ids it just drew into its next step without a host round trip.
  TensorView token_ids_device;
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
  // Builds a model from weights already placed on `backend` (the MTP block is run as a one-layer
  // model this way: cfg.num_hidden_layers == weights.layers.size()). `checkpoint` backs the weights
  // (mmapped tensors on the CPU) and is kept alive by the model; it must not be null.
  static Result<std::unique_ptr<DeepseekV3>> from_weights(io::ModelConfig cfg, DeepseekV3Weights weights,
                                                          std::unique_ptr<io::Checkpoint> checkpoint,
                                                          ops::Backend& backend, const ModelLimits& limits,
                                                          dist::Communicator& comm);
  ~DeepseekV3();

  const io::ModelConfig& config() const { return cfg_; }
  const DeepseekV3Weights& weights() const { return weights_; }
  const ModelLimits& limits() const { return limits_; }
  const io::Checkpoint& checkpoint() const { return *checkpoint_; }
  // MLA layers, hence cache layers (all decoder layers for DeepSeek-V3).
  int num_cache_layers() const { return cfg_.num_hidden_layers; }
  int kv_dim() const { return cfg_.kv_cache_dim(); }
  void set_mla_path(MlaPath path) { mla_path_ = path; }
  // Whether MoE layers whose shared expert fits the routed experts' shape run it as one more routed
  // expert (MoeWeights::experts_and_shared; on by default) or as its own MLP (benchmark A/B).
  void set_fuse_shared_expert(bool on) { fuse_shared_expert_ = on; }
  // Decode graphs (off by default): a step in which every sequence has the same q_len <=
  // kMaxGraphQLen and the path is absorbed replays a graph captured for the key (T, q_len, logits
  // rows, logits buffer, cache views, and
  // the feature list, features view and input_embeds view: a capturing step replays only a graph
  // that captures the same features into the same buffer). The first step of a key runs eagerly
  // (its result is the step's result, and it sizes the backend's grow-once scratch), then the
  // compute is captured, unrun, for the next step of that key.
  // Precondition while on: the logits buffer, cache layers, features and input_embeds buffers stay
  // allocated while their graphs exist (clear_decode_graphs() drops them; the engine clears at the
  // end of generate()).
  void set_decode_graphs(bool on);
  bool decode_graphs() const { return decode_graphs_; }
  size_t num_decode_graphs() const { return graphs_.size(); }
  void clear_decode_graphs();

  // Runs one step and writes F32 logits [logits_rows.size(), vocab_size] into `logits`
  // (backend memory, contiguous), and the requested features. Preconditions (checked): the step
  // fits `limits`, block tables cover kv_len, positions match the slices, feature entries are
  // kFinalNormedFeature or a layer index and `features` / `input_embeds` have the shapes above.
  void forward(const ForwardInputs& in, const TensorView& logits);

 private:
  struct Workspace;
  struct DecodeGraph;
  // The per-step extras of ForwardInputs, owned (a graph keeps its copy).
  struct StepExtras {
    std::vector<int> feature_layers;
    TensorView features;
    TensorView input_embeds;
  };
  DeepseekV3(io::ModelConfig cfg, ops::Backend& backend, dist::Communicator& comm, const ModelLimits& limits);
  // Checks `in` and copies it into the workspace's backend buffers and the attention batch.
  void stage_inputs(const ForwardInputs& in);
  // Everything after staging: T tokens, N logits rows. Reads only workspace buffers and the views
  // given (invariant: no allocation, no host copy), so it can be recorded into a graph.
  void compute(int64_t T, int64_t N, bool absorbed, std::span<const TensorView> kv_cache, const TensorView& logits,
               const StepExtras& extras);
  // Copies a feature into its column block of extras.features, if the list names it.
  void capture_feature(const StepExtras& extras, int feature, const TensorView& src);
  void attention(int layer, const TensorView& x, const TensorView& cache, bool absorbed, const TensorView& out);
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
  bool decode_graphs_ = false;
  bool fuse_shared_expert_ = true;
  std::vector<std::unique_ptr<DecodeGraph>> graphs_;
};

// Scoped decode-graph setting: on entry drops the model's graphs and sets `on`; on exit drops the
// graphs again (they point into buffers the scope owns: its cache and logits) and restores the
// previous setting. Declare it after those buffers so it is destroyed first on every return path.
class ScopedDecodeGraphs {
 public:
  ScopedDecodeGraphs(DeepseekV3& model, bool on) : model_(model), was_on_(model.decode_graphs()) {
    model_.clear_decode_graphs();
    model_.set_decode_graphs(on);
  }
  ~ScopedDecodeGraphs() {
    model_.clear_decode_graphs();
    model_.set_decode_graphs(was_on_);
  }
  ScopedDecodeGraphs(const ScopedDecodeGraphs&) = delete;
  ScopedDecodeGraphs& operator=(const ScopedDecodeGraphs&) = delete;

 private:
  DeepseekV3& model_;
  bool was_on_;
};

}  // namespace mla::model
