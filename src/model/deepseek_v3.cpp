#include "model/deepseek_v3.h"

#include <algorithm>

#include "io/checkpoint.h"
#include "model/rope_yarn.h"
#include "model/step_inputs.h"

namespace mla::model {

namespace {
// q_a_layernorm and kv_a_layernorm are built with the module default eps in both references, not
// rms_norm_eps (MODELS.md §1.3; confirmed by the golden fixtures' recorded HF values).
constexpr float kLatentNormEps = 1e-6f;
}  // namespace

// Activation buffers for `limits.max_tokens` rows, allocated once at load (ARCHITECTURE rule 4);
// a step uses the first T rows of each.
struct DeepseekV3::Workspace : StepInputs {  // step inputs (ids, positions, batch, logits rows), then:
  std::vector<Buffer> owned;
  // Activations, F32.
  TensorView hidden;      // {T, hidden}: the residual stream
  TensorView normed;      // {T, hidden}: input of the current sub-block
  TensorView attn_proj;   // {T, hidden}: o_proj output
  TensorView ffn_out;     // {T, hidden}: MLP / MoE output
  TensorView shared_out;  // {T, hidden}: shared-expert output
  TensorView q_latent;    // {T, q_lora_rank}
  TensorView q;           // {T, H*(d_n+d_r)}
  TensorView kv;          // {T, r+d_r}: [c_kv | k_rope] rows, exactly the cache row layout
  TensorView q_absorbed;  // {T, H, r+d_r}
  TensorView o_latent;    // {T, H, r}
  TensorView attn_out;    // {T, H*d_v}
  TensorView gate, up;    // {T, widest MLP}
  TensorView router_logits;                 // {T, E}
  TensorView topk_ids, topk_weights;        // {T, k}
  TensorView final_rows;                    // {T, hidden}: rows gathered for lm_head

  TensorView make(ops::Backend& b, DType t, std::initializer_list<int64_t> dims) {
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    owned.push_back(b.alloc(size_t(std::max<int64_t>(n, 1)) * dtype_size(t)));
    return owned.back().view(t, dims);
  }
};

DeepseekV3::DeepseekV3(io::ModelConfig cfg, ops::Backend& backend, dist::Communicator& comm,
                       const ModelLimits& limits)
    : cfg_(std::move(cfg)), backend_(backend), comm_(comm), limits_(limits) {}

DeepseekV3::~DeepseekV3() = default;

Result<std::unique_ptr<DeepseekV3>> DeepseekV3::load(const std::string& model_dir, ops::Backend& backend,
                                                     const ModelLimits& limits, dist::Communicator& comm,
                                                     const LoadProgress& progress) {
  MLA_ASSIGN_OR_RETURN(io::ModelConfig cfg, io::load_model_config(model_dir));
  MLA_ASSIGN_OR_RETURN(io::Checkpoint ckpt, io::Checkpoint::open(model_dir));
  if (limits.max_tokens <= 0 || limits.max_seqs <= 0 || limits.max_block_entries <= 0)
    return error("model limits must be positive");
  auto checkpoint = std::make_unique<io::Checkpoint>(std::move(ckpt));
  const dist::ParallelPlan plan{comm.rank(), comm.world_size()};
  const uint64_t total = checkpoint->total_bytes();
  PlacedBytes on_placed;
  if (progress) on_placed = [&progress, total](uint64_t done) { progress(std::min(done, total), total); };
  MLA_ASSIGN_OR_RETURN(DeepseekV3Weights weights, load_deepseek_v3_weights(cfg, *checkpoint, backend, plan, on_placed));
  if (progress) progress(total, total);  // tensors the model does not use (e.g. MTP) count as done
  return from_weights(std::move(cfg), std::move(weights), std::move(checkpoint), backend, limits, comm);
}

Result<std::unique_ptr<DeepseekV3>> DeepseekV3::from_weights(io::ModelConfig cfg, DeepseekV3Weights weights,
                                                             std::unique_ptr<io::Checkpoint> checkpoint,
                                                             ops::Backend& backend, const ModelLimits& limits,
                                                             dist::Communicator& comm) {
  if (limits.max_tokens <= 0 || limits.max_seqs <= 0 || limits.max_block_entries <= 0)
    return error("model limits must be positive");
  if (!checkpoint) return error("from_weights: no checkpoint backs the weights");
  if (int64_t(weights.layers.size()) != cfg.num_hidden_layers)
    return error("from_weights: {} layer weights for num_hidden_layers {}", weights.layers.size(), cfg.num_hidden_layers);
  std::unique_ptr<DeepseekV3> m(new DeepseekV3(std::move(cfg), backend, comm, limits));
  m->checkpoint_ = std::move(checkpoint);
  m->weights_ = std::move(weights);
  const dist::ParallelPlan plan{comm.rank(), comm.world_size()};

  const io::ModelConfig& c = m->cfg_;
  m->dims_ = ops::MlaDims{plan.local_heads(c.num_attention_heads), c.qk_nope_head_dim, c.qk_rope_head_dim,
                          c.v_head_dim, c.kv_lora_rank, mla_softmax_scale(c)};
  m->routing_ = ops::MoeRouting{c.num_experts_per_tok, c.n_group, c.topk_group, c.norm_topk_prob,
                                float(c.routed_scaling_factor)};

  auto ws = std::make_unique<Workspace>();
  const int64_t T = limits.max_tokens, hid = c.hidden_size, H = m->dims_.num_heads;
  const int64_t r = c.kv_lora_rank, dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim, dv = c.v_head_dim;
  const std::vector<float> inv_freq = rope_inv_freq(c);
  TensorView inv = ws->make(backend, DType::F32, {int64_t(inv_freq.size())});
  backend.copy_from_host(inv, inv_freq.data());
  m->rope_ = ops::RopeTable{inv, rope_attention_factor(c)};

  ws->allocate(backend, limits, ws->owned);
  for (TensorView* v : {&ws->hidden, &ws->normed, &ws->attn_proj, &ws->ffn_out, &ws->shared_out, &ws->final_rows})
    *v = ws->make(backend, DType::F32, {T, hid});
  ws->q_latent = ws->make(backend, DType::F32, {T, c.q_lora_rank.value_or(1)});
  ws->q = ws->make(backend, DType::F32, {T, H * (dn + dr)});
  ws->kv = ws->make(backend, DType::F32, {T, r + dr});
  ws->q_absorbed = ws->make(backend, DType::F32, {T, H, r + dr});
  ws->o_latent = ws->make(backend, DType::F32, {T, H, r});
  ws->attn_out = ws->make(backend, DType::F32, {T, H * dv});
  const int64_t width = std::max<int64_t>(
      {c.first_k_dense_replace > 0 ? c.intermediate_size : 1, int64_t(c.moe_intermediate_size) * c.n_shared_experts,
       int64_t(c.moe_intermediate_size)});
  ws->gate = ws->make(backend, DType::F32, {T, width});
  ws->up = ws->make(backend, DType::F32, {T, width});
  ws->router_logits = ws->make(backend, DType::F32, {T, std::max(c.n_routed_experts, 1)});
  // One column more than top-k where a shared expert exists: the shared expert's slot (expert E,
  // weight 1) for layers that run it as a routed expert (MoeWeights::experts_and_shared), written
  // once here; moe_route fills the first k columns.
  const int64_t k = std::max(c.num_experts_per_tok, 1), slots = k + (c.n_shared_experts > 0 ? 1 : 0);
  ws->topk_ids = ws->make(backend, DType::I32, {T, slots});
  ws->topk_weights = ws->make(backend, DType::F32, {T, slots});
  if (slots > k) {
    std::vector<int32_t> ids(size_t(T * slots), 0);
    std::vector<float> wts(size_t(T * slots), 0.0f);
    for (int64_t t = 0; t < T; ++t) {
      ids[size_t(t * slots + k)] = c.n_routed_experts;
      wts[size_t(t * slots + k)] = 1.0f;
    }
    backend.copy_from_host(ws->topk_ids, ids.data());
    backend.copy_from_host(ws->topk_weights, wts.data());
  }
  m->ws_ = std::move(ws);
  return m;
}

// One captured decode compute and the key it was captured for (see set_decode_graphs).
struct DeepseekV3::DecodeGraph {
  int64_t T = 0, N = 0;                // tokens and logits rows
  int q_len = 1;                       // every sequence's new tokens (so sequences = T / q_len)
  void* logits = nullptr;              // data of the logits view [N, vocab]
  std::vector<TensorView> kv_cache;    // the cache views the graph writes and reads
  StepExtras extras;                   // features captured and input_embeds read, part of the key
  std::unique_ptr<ops::OpGraph> graph;
};

namespace {
bool same_view(const TensorView& a, const TensorView& b) {
  if (a.data != b.data || a.dtype != b.dtype || a.ndim != b.ndim) return false;
  for (int d = 0; d < a.ndim; ++d)
    if (a.shape[size_t(d)] != b.shape[size_t(d)] || a.stride[size_t(d)] != b.stride[size_t(d)]) return false;
  return true;
}
}  // namespace

void DeepseekV3::set_decode_graphs(bool on) {
  decode_graphs_ = on;
  if (!on) graphs_.clear();
}

void DeepseekV3::clear_decode_graphs() { graphs_.clear(); }

void DeepseekV3::stage_inputs(const ForwardInputs& in) {
  MLA_CHECK(int(in.kv_cache.size()) == num_cache_layers(), "{} cache layers given", in.kv_cache.size());
  const int bs = in.block_size;
  for (const TensorView& c : in.kv_cache)
    MLA_CHECK((c.dtype == DType::F32 || c.dtype == DType::BF16) && c.dtype == in.kv_cache[0].dtype && c.ndim == 3 &&
                  c.dim(1) == bs && c.dim(2) == kv_dim() && c.dim(0) == in.kv_cache[0].dim(0),
              "cache layer {} must be F32 or BF16 [blocks, {}, {}] like layer 0 ({})", c.describe(), bs, kv_dim(),
              in.kv_cache[0].describe());
  ws_->stage(backend_, in, limits_, "");
}

void DeepseekV3::forward(const ForwardInputs& in, const TensorView& logits) {
  stage_inputs(in);
  const int64_t T = int64_t(in.token_ids.size()), N = int64_t(in.logits_rows.size());
  MLA_CHECK(logits.dtype == DType::F32 && logits.ndim == 2 && logits.dim(0) == N && logits.dim(1) == cfg_.vocab_size &&
                logits.is_contiguous(),
            "logits {} for {} rows", logits.describe(), N);
  const int64_t hid = cfg_.hidden_size;
  StepExtras extras;
  extras.feature_layers.assign(in.feature_layers.begin(), in.feature_layers.end());
  if (!extras.feature_layers.empty()) {
    for (int l : extras.feature_layers)
      MLA_CHECK(l == kFinalNormedFeature || (l >= 0 && l < cfg_.num_hidden_layers), "feature layer {} (model has {})",
                l, cfg_.num_hidden_layers);
    const int64_t n = int64_t(extras.feature_layers.size());
    MLA_CHECK(in.features.data && in.features.dtype == DType::F32 && in.features.ndim == 2 &&
                  in.features.dim(0) == T && in.features.dim(1) == n * hid,
              "features {} for {} rows of {} features x {}", in.features.describe(), T, n, hid);
    extras.features = in.features;
  }
  if (in.input_embeds.data) {
    MLA_CHECK(in.input_embeds.dtype == DType::F32 && in.input_embeds.ndim == 2 && in.input_embeds.dim(0) == T &&
                  in.input_embeds.dim(1) == hid,
              "input_embeds {} for {} rows of {}", in.input_embeds.describe(), T, hid);
    extras.input_embeds = in.input_embeds;
  }
  // Auto: absorbed for decode-only steps (a rule that does not depend on what else shares a prefill
  // step, so prompt logits stay batch-invariant). An absorbed step whose sequences all have the same
  // short q_len (decode, or speculative verification of the newest token plus K drafts, which the
  // engine runs absorbed explicitly) can replay a graph.
  const int q0 = in.seqs.front().q_len;
  const bool uniform = std::all_of(in.seqs.begin(), in.seqs.end(), [q0](const SequenceSlice& s) { return s.q_len == q0; });
  const bool absorbed = mla_path_ == MlaPath::Absorbed || (mla_path_ == MlaPath::Auto && uniform && q0 == 1);
  if (!decode_graphs_ || !uniform || q0 > kMaxGraphQLen || !absorbed) {
    compute(T, N, absorbed, in.kv_cache, logits, extras);
    return;
  }
  for (const std::unique_ptr<DecodeGraph>& g : graphs_) {
    if (g->T != T || g->N != N || g->q_len != q0 || g->logits != logits.data) continue;
    if (!std::equal(g->kv_cache.begin(), g->kv_cache.end(), in.kv_cache.begin(), in.kv_cache.end(), same_view)) continue;
    if (g->extras.feature_layers != extras.feature_layers) continue;
    if (!extras.feature_layers.empty() && !same_view(g->extras.features, extras.features)) continue;
    if (!same_view(g->extras.input_embeds, extras.input_embeds)) continue;
    g->graph->replay();
    return;
  }
  compute(T, N, true, in.kv_cache, logits, extras);  // this step's result; sizes the backend's scratch
  // Bounded: one graph per batch size and buffer pair is the steady state; stale keys (buffers of an
  // earlier run) are dropped wholesale rather than tracked.
  if (graphs_.size() >= size_t(2 * limits_.max_seqs + 8)) graphs_.clear();
  auto g = std::make_unique<DecodeGraph>();
  g->T = T;
  g->N = N;
  g->q_len = q0;
  g->logits = logits.data;
  g->kv_cache.assign(in.kv_cache.begin(), in.kv_cache.end());
  g->extras = std::move(extras);
  // Heap-owned by g: stable for the graph's life.
  const std::vector<TensorView>* layers = &g->kv_cache;
  const StepExtras* kept = &g->extras;
  g->graph = backend_.capture([this, T, N, layers, logits, kept] { compute(T, N, true, *layers, logits, *kept); });
  graphs_.push_back(std::move(g));
}

void DeepseekV3::capture_feature(const StepExtras& extras, int feature, const TensorView& src) {
  const int64_t hid = cfg_.hidden_size;
  for (size_t i = 0; i < extras.feature_layers.size(); ++i)
    if (extras.feature_layers[i] == feature) backend_.copy(src, extras.features.slice(1, int64_t(i) * hid, hid));
}

void DeepseekV3::compute(int64_t T, int64_t N, bool absorbed, std::span<const TensorView> kv_cache,
                         const TensorView& logits, const StepExtras& extras) {
  Workspace& ws = *ws_;
  const float eps = float(cfg_.rms_norm_eps);
  const TensorView ids = ws.ids.slice(0, 0, T);
  const TensorView h = ws.hidden.slice(0, 0, T);     // {T, hidden} residual stream
  const TensorView x = ws.normed.slice(0, 0, T);     // {T, hidden} normalized sub-block input
  const TensorView a = ws.attn_proj.slice(0, 0, T);  // {T, hidden}
  const TensorView f = ws.ffn_out.slice(0, 0, T);    // {T, hidden}

  if (extras.input_embeds.data) backend_.copy(extras.input_embeds, h);
  else backend_.embedding(ids, weights_.embed_tokens, h);
  for (int L = 0; L < cfg_.num_hidden_layers; ++L) {
    const LayerWeights& lw = weights_.layers[size_t(L)];
    // Pre-norm block: h += Attn(norm(h)); h += FFN(norm(h)). The previous FFN output is added here,
    // fused with the norm; only then does h hold the stream leaving layer L-1.
    if (L == 0) {
      backend_.rms_norm(h, lw.input_layernorm, eps, x);
    } else {
      backend_.add_rms_norm(h, f, lw.input_layernorm, eps, x);
      capture_feature(extras, L - 1, h);
    }
    attention(L, x, kv_cache[size_t(L)], absorbed, a);
    backend_.add_rms_norm(h, a, lw.post_attention_layernorm, eps, x);
    ffn(L, x, f);
  }
  backend_.add_rms_norm(h, f, weights_.norm, eps, x);
  capture_feature(extras, cfg_.num_hidden_layers - 1, h);  // {T, hidden} pre-norm stream
  capture_feature(extras, kFinalNormedFeature, x);         // {T, hidden} after model.norm
  // lm_head only on the rows that need logits (the last token of each prefill, every decode row).
  const TensorView rows = ws.final_rows.slice(0, 0, N);
  backend_.embedding(ws.logits_rows.slice(0, 0, N), x, rows);
  backend_.linear(rows, weights_.lm_head, logits);
}

void DeepseekV3::attention(int layer, const TensorView& x, const TensorView& cache, bool absorbed,
                           const TensorView& out) {
  const AttentionWeights& w = weights_.layers[size_t(layer)].attn;
  Workspace& ws = *ws_;
  const ops::AttentionBatch& batch = ws.batch;
  const int64_t T = x.dim(0), H = dims_.num_heads;
  const TensorView positions = ws.positions.slice(0, 0, T);
  const int64_t dn = dims_.qk_nope_head_dim, dr = dims_.qk_rope_head_dim, dv = dims_.v_head_dim;
  const int64_t r = dims_.kv_lora_rank;

  // Queries: q = q_b(norm(q_a x)) or q_proj x.                    {T, H*(d_n+d_r)}
  const TensorView q = ws.q.slice(0, 0, T);
  // Latent: [c_kv | k_rope] = kv_a x; c_kv normalized, k_rope rotated, then cached.  {T, r+d_r}
  const TensorView kv = ws.kv.slice(0, 0, T);
  if (cfg_.q_lora_rank) {
    // q_a and kv_a read the same x: one group (on a GPU one pass filling the device, where kv_a's
    // 576 rows alone leave it mostly idle).
    const TensorView q_lat = ws.q_latent.slice(0, 0, T);             // {T, q_lora_rank}
    const ops::Weight* proj[] = {&w.q_a_proj, &w.kv_a_proj_with_mqa};
    const TensorView proj_out[] = {q_lat, kv};
    backend_.linear_group(x, proj, proj_out);
    backend_.rms_norm(q_lat, w.q_a_layernorm, kLatentNormEps, q_lat);
    backend_.linear(q_lat, w.q_b_proj, q);
  } else {
    backend_.linear(x, w.q_proj, q);
    backend_.linear(x, w.kv_a_proj_with_mqa, kv);
  }
  const TensorView q3 = q.reshape({T, H, dn + dr});                  // {T, H, d_n+d_r}
  const TensorView q_rope = q3.slice(2, dn, dr);                     // {T, H, d_r} strided

  const TensorView c_kv = kv.slice(1, 0, r);                         // {T, r} strided
  backend_.rms_norm(c_kv, w.kv_a_layernorm, kLatentNormEps, c_kv);
  TensorView k_rope = kv.slice(1, r, dr);                            // {T, 1, d_r}: one key shared by all heads
  k_rope.ndim = 3;
  k_rope.shape = {T, 1, dr, 0};
  k_rope.stride = {r + dr, dr, 1, 0};
  backend_.rope(q_rope, positions, rope_);
  backend_.rope(k_rope, positions, rope_);
  backend_.kv_cache_write(kv, batch.slot_mapping, cache);

  const TensorView o = ws.attn_out.slice(0, 0, T);                   // {T, H*d_v}
  const TensorView o3 = o.reshape({T, H, dv});
  if (!absorbed) {
    backend_.mla_attention_naive(q3, cache, w.kv_b_proj, batch, dims_, o3);
  } else {
    const TensorView qa = ws.q_absorbed.slice(0, 0, T);              // {T, H, r+d_r} = [W_UK^T q_nope | q_rope]
    backend_.mla_absorb_q(q3.slice(2, 0, dn), w.kv_b_proj, dims_, qa.slice(2, 0, r));
    backend_.copy(q_rope, qa.slice(2, r, dr));
    const TensorView ol = ws.o_latent.slice(0, 0, T);                // {T, H, r}
    backend_.mla_attention_absorbed(qa, cache, batch, dims_, ol);
    backend_.mla_expand_v(ol, w.kv_b_proj, dims_, o3);
  }
  backend_.linear(o, w.o_proj, out);                                 // {T, hidden}
  comm_.all_reduce_sum(out);
}

void DeepseekV3::ffn(int layer, const TensorView& x, const TensorView& out) {
  const LayerWeights& lw = weights_.layers[size_t(layer)];
  Workspace& ws = *ws_;
  const int64_t T = x.dim(0);
  auto mlp = [&](const ops::ExpertWeights& e, const TensorView& y) {  // y = down(silu(gate x) * up x)
    const TensorView g = ws.gate.slice(0, 0, T).slice(1, 0, e.gate_proj.out_features);
    const TensorView u = ws.up.slice(0, 0, T).slice(1, 0, e.up_proj.out_features);
    const ops::Weight* proj[] = {&e.gate_proj, &e.up_proj};  // one input: one group
    const TensorView proj_out[] = {g, u};
    backend_.linear_group(x, proj, proj_out);
    backend_.silu_mul(g, u, g);
    backend_.linear(g, e.down_proj, y);
  };
  if (!lw.is_moe) {
    mlp(lw.mlp, out);
  } else {
    const TensorView logits = ws.router_logits.slice(0, 0, T);       // {T, E}
    const TensorView ids_all = ws.topk_ids.slice(0, 0, T), wts_all = ws.topk_weights.slice(0, 0, T);
    const int64_t k = routing_.top_k;
    const TensorView ids = ids_all.slice(1, 0, k), wts = wts_all.slice(1, 0, k);  // {T, k}
    backend_.linear(x, lw.moe.gate, logits);
    backend_.moe_route(logits, lw.moe.e_score_correction_bias, routing_, ids, wts);
    const bool shared_in_experts = fuse_shared_expert_ && !lw.moe.experts_and_shared.empty();
    if (shared_in_experts)  // {T, k + 1}: the last slot is the shared expert (workspace constant)
      backend_.moe_experts(x, ids_all, wts_all, lw.moe.experts_and_shared, out);
    else
      backend_.moe_experts(x, ids, wts, lw.moe.experts, out);
    if (lw.moe.has_shared && !shared_in_experts) {
      const TensorView s = ws.shared_out.slice(0, 0, T);
      mlp(lw.moe.shared_experts, s);
      backend_.add(out, s, out);
    }
  }
  comm_.all_reduce_sum(out);
}

}  // namespace mla::model
