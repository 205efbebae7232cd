// DeepSeek MTP (NextN) draft (issue #8, MODELS.md 1.9): the block stored after the target's decoder
// layers, proposing the token after next from (next token, target hidden). Its decoder layer runs
// as a one-layer DeepseekV3 (same code, staging and decode graphs as the target); only the input
// fusion e/h -> eh_proj is its own, a few eager ops before the block's forward.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/deepseek_v3.h"
#include "spec/draft_model.h"

namespace mla::model {

class DeepseekMtp final : public spec::DraftModel {
 public:
  // Loads MTP block `mtp_layer` of the target checkpoint in `target_dir` (config.json must declare
  // num_nextn_predict_layers > mtp_layer). When `target` is given (loaded from the same directory on
  // the same backend, and outliving this draft) its placed embedding is reused instead of placing
  // model.embed_tokens twice. Errors are one line naming the directory and tensor.
  static Result<std::unique_ptr<DeepseekMtp>> load(const std::string& target_dir, ops::Backend& backend,
                                                   const ModelLimits& limits, dist::Communicator& comm,
                                                   int mtp_layer = 0, const DeepseekV3* target = nullptr);
  ~DeepseekMtp() override;

  spec::DraftKind kind() const override { return spec::DraftKind::Mtp; }
  int num_cache_layers() const override { return 1; }
  int64_t cache_row_width() const override { return target_cfg_.kv_cache_dim(); }
  // h = the target's final hidden after model.norm (MODELS.md 7.2 leaves this [U]; sglang and vLLM
  // are believed to take it after the norm).
  std::vector<int> target_feature_layers() const override { return {spec::kFinalNormed}; }
  int64_t target_feature_width() const override { return target_cfg_.hidden_size; }
  int64_t hidden_width() const override { return target_cfg_.hidden_size; }

  // e = embed(ids); u = eh_proj([enorm(e) | hnorm(hidden_in)]); z = layer(u) through the draft's one
  // cache layer at in.base.positions; logits = shared_head.head(shared_head.norm(z)) over the
  // target vocabulary; hidden_out (when given) = z, the pre-norm stream. hidden_in is F32
  // [T, hidden] for both sources (the widths are equal). in.base.feature_layers must be empty.
  void forward(const spec::DraftForwardInputs& in, const TensorView& logits) override;

  void clear_graphs() override { block_->clear_decode_graphs(); }
  const io::ModelConfig& target_config() const { return target_cfg_; }
  // Auto (default): see spec::draft_mla_path.
  void set_mla_path(MlaPath path) { path_ = path; }
  // The block as a one-layer model: decode graphs are set here (graph keys include the hidden_out
  // view); its MLA path is set per step from set_mla_path's.
  DeepseekV3& block() { return *block_; }

 private:
  DeepseekMtp(io::ModelConfig target_cfg, ops::Backend& backend) : target_cfg_(std::move(target_cfg)), backend_(backend) {}

  io::ModelConfig target_cfg_;
  ops::Backend& backend_;
  std::unique_ptr<DeepseekV3> block_;  // layer L, norm = shared_head.norm, lm_head = shared_head.head
  TensorView enorm_, hnorm_;           // [hidden]
  ops::Weight eh_proj_;                // [hidden, 2*hidden]
  std::vector<Buffer> owned_;
  TensorView ids_;                     // I32 [max_tokens]
  TensorView embeds_;                  // F32 [max_tokens, hidden]: e
  TensorView fused_;                   // F32 [max_tokens, 2*hidden]: [enorm(e) | hnorm(h)]
  TensorView block_input_;             // F32 [max_tokens, hidden]: u, the block's input_embeds
  MlaPath path_ = MlaPath::Auto;
};

}  // namespace mla::model
