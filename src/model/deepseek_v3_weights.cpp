#include "model/deepseek_v3_weights.h"

#include <fmt/format.h>

#include "model/deepseek_v3_tensors.h"

namespace mla::model {

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += fmt::format("{}{}", i ? "," : "", s[i]);
  return out + "]";
}

bool has_shape(const TensorView& v, const std::vector<int64_t>& shape) {
  if (v.ndim != int(shape.size())) return false;
  for (size_t i = 0; i < shape.size(); ++i)
    if (v.shape[i] != shape[i]) return false;
  return true;
}

class Loader {
 public:
  Loader(const io::Checkpoint& ckpt, ops::Backend& backend, DeepseekV3Weights& out, const PlacedBytes& on_placed)
      : ckpt_(ckpt), backend_(backend), out_(out), on_placed_(on_placed) {}

  // A plain tensor of `shape` whose dtype is one of `allowed`.
  Result<TensorView> tensor(const std::string& name, const std::vector<int64_t>& shape,
                            std::initializer_list<DType> allowed) {
    MLA_ASSIGN_OR_RETURN(TensorView v, ckpt_.get(name));
    if (!has_shape(v, shape))
      return fail(name, fmt::format("shape {} but the config implies {}", v.describe(), shape_str(shape)));
    bool ok = false;
    for (DType t : allowed) ok |= (v.dtype == t);
    if (!ok) return fail(name, fmt::format("dtype {} is not supported here", dtype_name(v.dtype)));
    return place(v);
  }

  // A linear weight in whichever stored format the checkpoint has: INT4 when
  // `<module>.weight_packed` exists, FP8 when `<name>_scale_inv` exists, dense otherwise.
  Result<ops::Weight> linear(const std::string& name, const std::vector<int64_t>& shape) {
    const std::string module = module_name(name);
    ops::Weight w;
    w.out_features = shape[0];
    w.in_features = shape[1];
    if (ckpt_.contains(module + ".weight_packed")) {
      w.format = ops::WeightFormat::Int4Group32;
      MLA_ASSIGN_OR_RETURN(w.data, ckpt_.get(module + ".weight_packed"));
      MLA_ASSIGN_OR_RETURN(w.scale, ckpt_.get(module + ".weight_scale"));
      if (ckpt_.contains(module + ".weight_shape")) MLA_RETURN_IF_ERROR(check_weight_shape(module, shape));
    } else if (ckpt_.contains(name + "_scale_inv")) {
      w.format = ops::WeightFormat::Fp8Block128;
      MLA_ASSIGN_OR_RETURN(w.data, ckpt_.get(name));
      MLA_ASSIGN_OR_RETURN(w.scale, ckpt_.get(name + "_scale_inv"));
    } else {
      MLA_ASSIGN_OR_RETURN(w.data, ckpt_.get(name));
    }
    if (Status st = ops::validate_weight(w); !st) return fail(name, st.message());
    w.data = place(w.data);
    if (w.scale.data) w.scale = place(w.scale);
    return w;
  }

  // The router bias as F32 (the op's dtype), converting BF16/F16 copies once.
  Result<TensorView> bias_f32(const std::string& name, int64_t n) {
    MLA_ASSIGN_OR_RETURN(TensorView v, tensor(name, {n}, {DType::F32, DType::BF16, DType::F16}));
    if (v.dtype == DType::F32) return v;
    MLA_ASSIGN_OR_RETURN(TensorView host, ckpt_.get(name));
    std::vector<float> f(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t h = host.as<const uint16_t>()[i];
      f[size_t(i)] = host.dtype == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
    }
    Buffer buf = backend_.alloc(size_t(n) * sizeof(float));
    TensorView dst = buf.view(DType::F32, {n});
    backend_.copy_from_host(dst, f.data());
    out_.owned.push_back(std::move(buf));
    return dst;
  }

  Status fail(const std::string& name, const std::string& problem) const {
    return error("{}: tensor '{}': {}", ckpt_.dir(), name, problem);
  }

 private:
  Status check_weight_shape(const std::string& module, const std::vector<int64_t>& shape) {
    MLA_ASSIGN_OR_RETURN(TensorView s, ckpt_.get(module + ".weight_shape"));
    if (s.numel() != 2 || (s.dtype != DType::I64 && s.dtype != DType::I32))
      return fail(module + ".weight_shape", "must hold 2 integers");
    const int64_t a = s.dtype == DType::I64 ? s.as<const int64_t>()[0] : s.as<const int32_t>()[0];
    const int64_t b = s.dtype == DType::I64 ? s.as<const int64_t>()[1] : s.as<const int32_t>()[1];
    if (a != shape[0] || b != shape[1])
      return fail(module + ".weight_shape", fmt::format("[{},{}] but the config implies {}", a, b, shape_str(shape)));
    return Status::ok();
  }

  TensorView place(const TensorView& host) {
    placed_ += host.nbytes();
    if (on_placed_) on_placed_(placed_);
    return backend_.place_weight(host);
  }

  const io::Checkpoint& ckpt_;
  ops::Backend& backend_;
  DeepseekV3Weights& out_;
  const PlacedBytes& on_placed_;
  uint64_t placed_ = 0;
};

// Places one tensor of a decoder layer (attention, norms, MLP/MoE) into its slot of `L`.
Status load_layer_tensor(const io::ModelConfig& cfg, Loader& ld, const dist::ParallelPlan& plan,
                         const TensorSpec& spec, LayerWeights& L) {
  const std::string& n = spec.name;
  L.is_moe = cfg.is_moe_layer(spec.layer);
  const std::string local = n.substr(fmt::format("model.layers.{}.", spec.layer).size());
  // Norm weights.
  if (spec.role == TensorRole::Norm) {
    MLA_ASSIGN_OR_RETURN(TensorView v, ld.tensor(n, spec.shape, {DType::BF16, DType::F32}));
    if (local == "input_layernorm.weight") L.input_layernorm = v;
    else if (local == "post_attention_layernorm.weight") L.post_attention_layernorm = v;
    else if (local == "self_attn.q_a_layernorm.weight") L.attn.q_a_layernorm = v;
    else if (local == "self_attn.kv_a_layernorm.weight") L.attn.kv_a_layernorm = v;
    else return ld.fail(n, "no slot for this tensor (internal tensor list mismatch)");
    return Status::ok();
  }
  if (spec.role == TensorRole::Router) {
    MLA_ASSIGN_OR_RETURN(L.moe.gate, ld.linear(n, spec.shape));
    return Status::ok();
  }
  if (spec.role == TensorRole::RouterBias) {
    MLA_ASSIGN_OR_RETURN(L.moe.e_score_correction_bias, ld.bias_f32(n, spec.shape[0]));
    return Status::ok();
  }
  // Linear weights: find the slot this name fills.
  int expert = -1;
  std::string part = local;
  if (local.starts_with("mlp.experts.")) {
    const size_t dot = local.find('.', 12);
    expert = std::stoi(local.substr(12, dot - 12));
    part = local.substr(dot + 1);
    if (!plan.holds_expert(expert, cfg.n_routed_experts)) return Status::ok();  // another rank's expert
  }
  MLA_ASSIGN_OR_RETURN(ops::Weight lw, ld.linear(n, spec.shape));
  auto mlp_slot = [&](ops::ExpertWeights& e, const std::string& p) {
    if (p == "gate_proj.weight") e.gate_proj = lw;
    else if (p == "up_proj.weight") e.up_proj = lw;
    else e.down_proj = lw;
  };
  if (expert >= 0) {
    mlp_slot(L.moe.experts[size_t(expert)], part);
  } else if (local.starts_with("mlp.shared_experts.")) {
    L.moe.has_shared = true;
    mlp_slot(L.moe.shared_experts, local.substr(19));
  } else if (local.starts_with("mlp.")) {
    mlp_slot(L.mlp, local.substr(4));
  } else if (local == "self_attn.q_proj.weight") {
    L.attn.q_proj = lw;
  } else if (local == "self_attn.q_a_proj.weight") {
    L.attn.q_a_proj = lw;
  } else if (local == "self_attn.q_b_proj.weight") {
    L.attn.q_b_proj = lw;
  } else if (local == "self_attn.kv_a_proj_with_mqa.weight") {
    L.attn.kv_a_proj_with_mqa = lw;
  } else if (local == "self_attn.kv_b_proj.weight") {
    L.attn.kv_b_proj = lw;
  } else if (local == "self_attn.o_proj.weight") {
    L.attn.o_proj = lw;
  } else {
    return ld.fail(n, "no slot for this tensor (internal tensor list mismatch)");
  }
  return Status::ok();
}

// Fills moe.experts_and_shared where the shared expert has the routed experts' shape and formats:
// then moe_experts runs it as expert E in an extra slot of weight 1, and
// out = sum_k w_k E_k(x) + 1 * S(x) is the same sum as the routed experts' followed by the shared
// expert's, one launch chain (one pass over x, one combine) instead of the shared MLP's own
// gate / up, silu_mul, down and add. Tensor parallelism (not implemented: the loaders refuse it)
// would shard S and must keep it out of the expert list.
void fuse_shared_expert(const io::ModelConfig& cfg, MoeWeights& moe) {
  moe.experts_and_shared.clear();
  if (!moe.has_shared || cfg.n_shared_experts != 1 || moe.experts.empty()) return;
  const ops::ExpertWeights& s = moe.shared_experts;
  auto same_kind = [](const ops::Weight& a, const ops::Weight& b) {
    return a.format == b.format && a.out_features == b.out_features && a.in_features == b.in_features &&
           a.data.dtype == b.data.dtype && a.scale.dtype == b.scale.dtype;
  };
  for (const ops::ExpertWeights& e : moe.experts) {
    if (e.gate_proj.empty()) continue;  // held by another rank
    if (!same_kind(e.gate_proj, s.gate_proj) || !same_kind(e.up_proj, s.up_proj) ||
        !same_kind(e.down_proj, s.down_proj))
      return;
  }
  moe.experts_and_shared = moe.experts;
  moe.experts_and_shared.push_back(s);
}

}  // namespace

Result<DeepseekV3Weights> load_deepseek_v3_weights(const io::ModelConfig& cfg, const io::Checkpoint& ckpt,
                                                   ops::Backend& backend, const dist::ParallelPlan& plan,
                                                   const PlacedBytes& on_placed) {
  if (plan.world_size != 1)
    return error("tensor-parallel head sharding is not implemented yet (world size {})", plan.world_size);
  DeepseekV3Weights w;
  Loader ld(ckpt, backend, w, on_placed);
  w.layers.resize(size_t(cfg.num_hidden_layers));
  for (LayerWeights& L : w.layers) {
    L.moe.experts.resize(size_t(cfg.n_routed_experts));
  }
  for (const TensorSpec& spec : deepseek_v3_tensor_specs(cfg)) {
    const std::string& n = spec.name;
    if (spec.role == TensorRole::Embedding) {
      MLA_ASSIGN_OR_RETURN(w.embed_tokens, ld.tensor(n, spec.shape, {DType::BF16, DType::F32}));
      continue;
    }
    if (spec.layer < 0) {
      if (n == "model.norm.weight") {
        MLA_ASSIGN_OR_RETURN(w.norm, ld.tensor(n, spec.shape, {DType::BF16, DType::F32}));
      } else {
        MLA_ASSIGN_OR_RETURN(w.lm_head, ld.linear(n, spec.shape));
      }
      continue;
    }
    MLA_RETURN_IF_ERROR(load_layer_tensor(cfg, ld, plan, spec, w.layers[size_t(spec.layer)]));
  }
  for (LayerWeights& L : w.layers)
    if (L.is_moe) fuse_shared_expert(cfg, L.moe);
  if (cfg.tie_word_embeddings) {
    w.lm_head.format = ops::WeightFormat::Dense;
    w.lm_head.out_features = cfg.vocab_size;
    w.lm_head.in_features = cfg.hidden_size;
    w.lm_head.data = w.embed_tokens;
  }
  return w;
}

Result<DeepseekMtpWeights> load_deepseek_mtp_weights(const io::ModelConfig& cfg, const io::Checkpoint& ckpt,
                                                     ops::Backend& backend, const dist::ParallelPlan& plan,
                                                     int mtp_layer, const TensorView* shared_embed_tokens) {
  if (plan.world_size != 1)
    return error("tensor-parallel head sharding is not implemented yet (world size {})", plan.world_size);
  if (mtp_layer < 0 || mtp_layer >= cfg.num_nextn_predict_layers)
    return error("{}/config.json: num_nextn_predict_layers is {}: no MTP layer {} in this checkpoint", ckpt.dir(),
                 cfg.num_nextn_predict_layers, mtp_layer);
  const int layer = cfg.num_hidden_layers + mtp_layer;
  DeepseekMtpWeights m;
  DeepseekV3Weights& w = m.block;
  const PlacedBytes no_progress;  // the Loader keeps a reference: must outlive it
  Loader ld(ckpt, backend, w, no_progress);
  w.layers.resize(1);
  w.layers[0].moe.experts.resize(size_t(cfg.n_routed_experts));
  if (shared_embed_tokens) {
    w.embed_tokens = *shared_embed_tokens;
  } else {
    MLA_ASSIGN_OR_RETURN(w.embed_tokens, ld.tensor("model.embed_tokens.weight", {cfg.vocab_size, cfg.hidden_size},
                                                   {DType::BF16, DType::F32}));
  }
  for (const TensorSpec& spec : deepseek_v3_mtp_tensor_specs(cfg)) {
    if (spec.layer != layer) continue;
    const std::string local = spec.name.substr(fmt::format("model.layers.{}.", layer).size());
    if (!is_mtp_only_tensor(spec)) {
      MLA_RETURN_IF_ERROR(load_layer_tensor(cfg, ld, plan, spec, w.layers[0]));
    } else if (local == "enorm.weight") {
      MLA_ASSIGN_OR_RETURN(m.enorm, ld.tensor(spec.name, spec.shape, {DType::BF16, DType::F32}));
    } else if (local == "hnorm.weight") {
      MLA_ASSIGN_OR_RETURN(m.hnorm, ld.tensor(spec.name, spec.shape, {DType::BF16, DType::F32}));
    } else if (local == "shared_head.norm.weight") {
      MLA_ASSIGN_OR_RETURN(w.norm, ld.tensor(spec.name, spec.shape, {DType::BF16, DType::F32}));
    } else if (local == "eh_proj.weight") {
      MLA_ASSIGN_OR_RETURN(m.eh_proj, ld.linear(spec.name, spec.shape));
    } else if (local == "shared_head.head.weight") {
      MLA_ASSIGN_OR_RETURN(w.lm_head, ld.linear(spec.name, spec.shape));
    } else {
      return ld.fail(spec.name, "no slot for this tensor (internal tensor list mismatch)");
    }
  }
  if (w.layers[0].is_moe) fuse_shared_expert(cfg, w.layers[0].moe);
  return m;
}

}  // namespace mla::model
