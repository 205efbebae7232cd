// A plain draft model for speculation: a smaller DeepseekV3 checkpoint on the target's vocabulary
// (the embedded model's `models/draft`). It reads tokens only, so it needs no target features.
#pragma once

#include "model/deepseek_v3.h"
#include "spec/draft_model.h"

namespace mla::spec {

class DeepseekDraft final : public DraftModel {
 public:
  explicit DeepseekDraft(model::DeepseekV3& model) : model_(model) {}
  DraftKind kind() const override { return DraftKind::Draft; }
  int num_cache_layers() const override { return model_.num_cache_layers(); }
  int64_t cache_row_width() const override { return model_.kv_dim(); }
  std::vector<int> target_feature_layers() const override { return {}; }
  int64_t target_feature_width() const override { return 0; }
  int64_t hidden_width() const override { return 0; }
  void forward(const DraftForwardInputs& in, const TensorView& logits) override {
    model_.set_mla_path(draft_mla_path(path_, in.base));
    model_.forward(in.base, logits);
  }
  // Auto (default): see draft_mla_path.
  void set_mla_path(model::MlaPath path) { path_ = path; }
  void clear_graphs() override { model_.clear_decode_graphs(); }
  model::DeepseekV3& model() { return model_; }

 private:
  model::DeepseekV3& model_;
  model::MlaPath path_ = model::MlaPath::Auto;
};

}  // namespace mla::spec
