// DeepseekMtp: loading the MTP block as a one-layer DeepseekV3 plus its input fusion, and the eager
// prologue (embed, enorm/hnorm into one [T, 2*hidden] buffer, eh_proj) before the block's forward.
#include "model/deepseek_mtp.h"

#include "io/checkpoint.h"
#include "model/step_inputs.h"

namespace mla::model {

namespace {
constexpr int kBlockLayer[] = {0};  // the block's only layer: its output is hidden_out (z)
}  // namespace

DeepseekMtp::~DeepseekMtp() = default;

Result<std::unique_ptr<DeepseekMtp>> DeepseekMtp::load(const std::string& target_dir, ops::Backend& backend,
                                                       const ModelLimits& limits, dist::Communicator& comm,
                                                       int mtp_layer, const DeepseekV3* target) {
  MLA_ASSIGN_OR_RETURN(io::ModelConfig cfg, io::load_model_config(target_dir));
  MLA_ASSIGN_OR_RETURN(io::Checkpoint ckpt, io::Checkpoint::open(target_dir));
  if (limits.max_tokens <= 0 || limits.max_seqs <= 0 || limits.max_block_entries <= 0)
    return error("model limits must be positive");
  if (target && (target->config().hidden_size != cfg.hidden_size || target->config().vocab_size != cfg.vocab_size))
    return error("{}: the target given to share the embedding has another geometry", target_dir);
  auto checkpoint = std::make_unique<io::Checkpoint>(std::move(ckpt));
  const dist::ParallelPlan plan{comm.rank(), comm.world_size()};
  MLA_ASSIGN_OR_RETURN(DeepseekMtpWeights w,
                       load_deepseek_mtp_weights(cfg, *checkpoint, backend, plan, mtp_layer,
                                                 target ? &target->weights().embed_tokens : nullptr));

  // The block as a one-layer model: layer 0 is layer L, dense or MoE as L is in the target.
  io::ModelConfig block_cfg = cfg;
  block_cfg.num_hidden_layers = 1;
  block_cfg.first_k_dense_replace = cfg.is_moe_layer(cfg.num_hidden_layers + mtp_layer) ? 0 : 1;
  block_cfg.num_nextn_predict_layers = 0;
  block_cfg.tie_word_embeddings = false;  // lm_head is shared_head.head
  std::unique_ptr<DeepseekMtp> m(new DeepseekMtp(std::move(cfg), backend));
  MLA_ASSIGN_OR_RETURN(m->block_, DeepseekV3::from_weights(std::move(block_cfg), std::move(w.block),
                                                           std::move(checkpoint), backend, limits, comm));
  m->enorm_ = w.enorm;
  m->hnorm_ = w.hnorm;
  m->eh_proj_ = w.eh_proj;

  const int64_t T = limits.max_tokens, hid = m->target_cfg_.hidden_size;
  auto make = [&](DType t, std::initializer_list<int64_t> dims) {
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    m->owned_.push_back(backend.alloc(size_t(n) * dtype_size(t)));
    return m->owned_.back().view(t, dims);
  };
  m->ids_ = make(DType::I32, {T});
  m->embeds_ = make(DType::F32, {T, hid});
  m->fused_ = make(DType::F32, {T, 2 * hid});
  m->block_input_ = make(DType::F32, {T, hid});
  return m;
}

void DeepseekMtp::forward(const spec::DraftForwardInputs& in, const TensorView& logits) {
  const model::ForwardInputs& base = in.base;
  const int64_t T = int64_t(base.token_ids.size()), hid = target_cfg_.hidden_size;
  MLA_CHECK(T > 0 && T <= block_->limits().max_tokens, "MTP step of {} tokens (limit {})", T,
            block_->limits().max_tokens);
  MLA_CHECK(base.feature_layers.empty() && !base.input_embeds.data,
            "MTP forward: base.feature_layers / input_embeds are set by the draft itself");
  MLA_CHECK(in.hidden_in.data && in.hidden_in.dtype == DType::F32 && in.hidden_in.ndim == 2 &&
                in.hidden_in.dim(0) == T && in.hidden_in.dim(1) == hid,
            "MTP hidden_in {} for {} rows of {}", in.hidden_in.describe(), T, hid);
  const float eps = float(target_cfg_.rms_norm_eps);
  const TensorView ids = ids_.slice(0, 0, T);
  stage_token_ids(backend_, base, ids, "MTP: ");
  const TensorView e = embeds_.slice(0, 0, T);        // {T, hidden}
  const TensorView fused = fused_.slice(0, 0, T);     // {T, 2*hidden} = [enorm(e) | hnorm(h)]
  const TensorView u = block_input_.slice(0, 0, T);   // {T, hidden}
  backend_.embedding(ids, block_->weights().embed_tokens, e);
  backend_.rms_norm(e, enorm_, eps, fused.slice(1, 0, hid));
  // hidden_in is read here, before the block writes hidden_out, so the two may share a buffer.
  backend_.rms_norm(in.hidden_in, hnorm_, eps, fused.slice(1, hid, hid));
  backend_.linear(fused, eh_proj_, u);

  model::ForwardInputs step = base;
  step.input_embeds = u;
  if (in.hidden_out.data) {
    step.feature_layers = kBlockLayer;
    step.features = in.hidden_out;
  }
  block_->set_mla_path(spec::draft_mla_path(path_, step));
  block_->forward(step, logits);
}

}  // namespace mla::model
