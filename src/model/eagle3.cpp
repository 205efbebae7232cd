// EAGLE-3 draft: loading (every tensor checked against the config and the target, one-line errors
// naming the file and tensor) and the straight-line forward of MODELS.md §4 against ops::Backend.
// Trade-off: dense (BF16/F16/F32) weights only, and no decode graphs; the draft is one layer, so its
// launches are few next to the target's.
#include "model/eagle3.h"

#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>

#include <fmt/format.h>

#include "model/step_inputs.h"

namespace mla::model {

namespace {

constexpr size_t kMaxConfigBytes = 1 << 20;

Result<std::string> read_config_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return error("{}: cannot open", path);
  std::ostringstream buf;
  buf << in.rdbuf();
  if (in.bad()) return error("{}: read failed", path);
  std::string text = std::move(buf).str();
  if (text.size() > kMaxConfigBytes) return error("{}: {} bytes is not a plausible config.json", path, text.size());
  return text;
}

std::string shape_str(const TensorView& v) {
  std::string s = "[";
  for (int d = 0; d < v.ndim; ++d) s += fmt::format("{}{}", d ? "," : "", v.dim(d));
  return s + "]";
}

bool has_shape(const TensorView& v, std::initializer_list<int64_t> shape) {
  if (v.ndim != int(shape.size())) return false;
  int d = 0;
  for (int64_t n : shape)
    if (v.dim(d++) != n) return false;
  return true;
}

}  // namespace

struct Eagle3Draft::Weights {
  TensorView embed_tokens;              // [vocab, H] BF16/F32: the draft's own or the target's
  ops::Weight fc;                       // [H, n_aux * H_t]
  TensorView input_layernorm;           // [H] on the embedding
  TensorView hidden_norm;               // [H] on h
  TensorView post_attention_layernorm;  // [H]
  ops::Weight q_proj, k_proj, v_proj;   // [Hq*D | KVH*D, 2H]
  ops::Weight o_proj;                   // [H, Hq*D]
  ops::Weight gate_proj, up_proj;       // [I, H]
  ops::Weight down_proj;                // [H, I]
  TensorView norm;                      // [H] final norm
  ops::Weight lm_head;                  // [draft_vocab, H]
  TensorView d2t_index;                 // I32 [draft_vocab]: target column of each draft id (d + d2t[d])
  std::vector<Buffer> owned;            // d2t_index
};

// Activation buffers for limits.max_tokens rows, allocated once at load; a step uses the first rows.
struct Eagle3Draft::Workspace : StepInputs {  // step inputs as DeepseekV3's, then:
  std::vector<Buffer> owned;
  TensorView embeds;        // {T, H}
  TensorView fc_out;        // {T, H}: fc(target features)
  TensorView attn_in;       // {T, 2H}: [input_layernorm(e) | hidden_norm(h)]
  TensorView q;             // {T, Hq*D}
  TensorView k, v;          // {T, KVH*D}
  TensorView attn;          // {T, Hq*D}
  TensorView proj;          // {T, H}: o_proj, then the MLP output
  TensorView resid;         // {T, H}: r = a + h
  TensorView normed;        // {T, H}
  TensorView gate, up;      // {T, I}
  TensorView out;           // {T, H}: the layer output (pre-norm), hidden_out's source
  TensorView rows;          // {T, H}: rows gathered for lm_head, normalized in place
  TensorView draft_logits;  // {T, draft_vocab}

  TensorView make(ops::Backend& b, DType t, std::initializer_list<int64_t> dims) {
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    owned.push_back(b.alloc(size_t(std::max<int64_t>(n, 1)) * dtype_size(t)));
    return owned.back().view(t, dims);
  }
};

Eagle3Draft::Eagle3Draft(Eagle3Config cfg, ops::Backend& backend, const ModelLimits& limits)
    : cfg_(std::move(cfg)), backend_(backend), limits_(limits) {}

Eagle3Draft::~Eagle3Draft() = default;

namespace {

// Reads and places the tensors of one EAGLE-3 checkpoint. Names are tried as stored by SpecForge /
// the EAGLE repo ("midlayer.…", "fc.weight") and with a "model." prefix.
class Eagle3Loader {
 public:
  Eagle3Loader(const io::Checkpoint& ckpt, ops::Backend& backend) : ckpt_(ckpt), backend_(backend) {}

  std::string resolve(const std::string& name) const {
    if (ckpt_.contains(name) || !ckpt_.contains("model." + name)) return name;
    return "model." + name;
  }
  bool contains(const std::string& name) const { return ckpt_.contains(resolve(name)); }

  // The host view of a tensor of `shape` whose dtype is one of `allowed` (not placed).
  Result<TensorView> host(const std::string& name, std::initializer_list<int64_t> shape,
                          std::initializer_list<DType> allowed) const {
    const std::string n = resolve(name);
    if (!ckpt_.contains(n)) return fail(name, "missing");
    MLA_ASSIGN_OR_RETURN(TensorView v, ckpt_.get(n));
    if (!has_shape(v, shape)) {
      std::vector<int64_t> want(shape);
      return fail(n, fmt::format("shape {} but the config implies [{}]", shape_str(v), fmt::join(want, ",")));
    }
    bool ok = false;
    for (DType t : allowed) ok |= v.dtype == t;
    if (!ok) return fail(n, fmt::format("dtype {} is not supported here", dtype_name(v.dtype)));
    return v;
  }
  Result<TensorView> norm(const std::string& name, int64_t width) const {
    MLA_ASSIGN_OR_RETURN(TensorView v, host(name, {width}, {DType::BF16, DType::F32}));
    return backend_.place_weight(v);
  }
  // A dense linear [out, in] (quantized drafts are not implemented: their companions are rejected).
  Result<ops::Weight> linear(const std::string& name, int64_t out, int64_t in) const {
    const std::string n = resolve(name);
    if (ckpt_.contains(n + "_scale_inv") || ckpt_.contains(n + "_scale") || ckpt_.contains(n + "_packed"))
      return fail(n, "quantized draft weights are not supported (dense BF16/F16/F32 only)");
    ops::Weight w;
    w.out_features = out;
    w.in_features = in;
    MLA_ASSIGN_OR_RETURN(w.data, host(name, {out, in}, {DType::BF16, DType::F16, DType::F32}));
    if (Status st = ops::validate_weight(w); !st) return fail(n, st.message());
    w.data = backend_.place_weight(w.data);
    return w;
  }
  Status fail(const std::string& name, const std::string& problem) const {
    return error("{}: tensor '{}': {}", ckpt_.dir(), name, problem);
  }

 private:
  const io::Checkpoint& ckpt_;
  ops::Backend& backend_;
};

}  // namespace

Result<std::unique_ptr<Eagle3Draft>> Eagle3Draft::load(const std::string& dir, const io::ModelConfig& target,
                                                       ops::Backend& backend, const ModelLimits& limits,
                                                       const TensorView& target_embed_tokens) {
  const std::string config_path = dir + (dir.empty() || dir.back() == '/' ? "" : "/") + "config.json";
  MLA_ASSIGN_OR_RETURN(std::string text, read_config_text(config_path));
  MLA_ASSIGN_OR_RETURN(Eagle3Config cfg, parse_eagle3_config(text, config_path, target));
  if (limits.max_tokens <= 0 || limits.max_seqs <= 0 || limits.max_block_entries <= 0)
    return error("model limits must be positive");
  MLA_ASSIGN_OR_RETURN(io::Checkpoint ckpt, io::Checkpoint::open(dir));
  std::unique_ptr<Eagle3Draft> m(new Eagle3Draft(std::move(cfg), backend, limits));
  m->checkpoint_ = std::make_unique<io::Checkpoint>(std::move(ckpt));
  m->weights_ = std::make_unique<Weights>();
  m->target_vocab_ = target.vocab_size;
  const Eagle3Config& c = m->cfg_;
  Weights& w = *m->weights_;
  const Eagle3Loader ld(*m->checkpoint_, backend);
  const int64_t H = c.hidden_size, V = c.vocab_size, Vd = c.draft_vocab_size, I = c.intermediate_size;
  const int64_t D = c.head_dim, Hq = c.num_attention_heads, KVH = c.num_key_value_heads;

  if (ld.contains("embed_tokens.weight")) {
    MLA_ASSIGN_OR_RETURN(TensorView e, ld.host("embed_tokens.weight", {V, H}, {DType::BF16, DType::F32}));
    w.embed_tokens = backend.place_weight(e);
  } else {
    const TensorView& e = target_embed_tokens;
    if (e.data == nullptr)
      return error("{}: no embed_tokens.weight in the checkpoint and no target embedding was given", dir);
    if (!(e.dtype == DType::BF16 || e.dtype == DType::F32) || !has_shape(e, {V, H}) || !e.inner_contiguous())
      return error("{}: no embed_tokens.weight, and the target embedding {} is not BF16/F32 [{}, {}]", dir,
                   e.describe(), V, H);
    w.embed_tokens = e;
  }
  const int64_t feature_width = int64_t(c.aux_layer_ids.size()) * c.target_hidden_size;
  MLA_ASSIGN_OR_RETURN(w.fc, ld.linear("fc.weight", H, feature_width));
  MLA_ASSIGN_OR_RETURN(w.input_layernorm, ld.norm("midlayer.input_layernorm.weight", H));
  MLA_ASSIGN_OR_RETURN(w.hidden_norm, ld.norm("midlayer.hidden_norm.weight", H));
  MLA_ASSIGN_OR_RETURN(w.post_attention_layernorm, ld.norm("midlayer.post_attention_layernorm.weight", H));
  MLA_ASSIGN_OR_RETURN(w.q_proj, ld.linear("midlayer.self_attn.q_proj.weight", Hq * D, 2 * H));
  MLA_ASSIGN_OR_RETURN(w.k_proj, ld.linear("midlayer.self_attn.k_proj.weight", KVH * D, 2 * H));
  MLA_ASSIGN_OR_RETURN(w.v_proj, ld.linear("midlayer.self_attn.v_proj.weight", KVH * D, 2 * H));
  MLA_ASSIGN_OR_RETURN(w.o_proj, ld.linear("midlayer.self_attn.o_proj.weight", H, Hq * D));
  MLA_ASSIGN_OR_RETURN(w.gate_proj, ld.linear("midlayer.mlp.gate_proj.weight", I, H));
  MLA_ASSIGN_OR_RETURN(w.up_proj, ld.linear("midlayer.mlp.up_proj.weight", I, H));
  MLA_ASSIGN_OR_RETURN(w.down_proj, ld.linear("midlayer.mlp.down_proj.weight", H, I));
  MLA_ASSIGN_OR_RETURN(w.norm, ld.norm("norm.weight", H));
  MLA_ASSIGN_OR_RETURN(w.lm_head, ld.linear("lm_head.weight", Vd, H));

  // d2t: target id = d + d2t[d]; the image must be distinct ids of the target vocabulary (the scatter
  // writes one column per draft id).
  MLA_ASSIGN_OR_RETURN(TensorView d2t, ld.host("d2t", {Vd}, {DType::I64, DType::I32}));
  std::vector<int32_t> index(static_cast<size_t>(Vd));
  std::vector<uint8_t> seen(static_cast<size_t>(V), 0);
  for (int64_t d = 0; d < Vd; ++d) {
    const int64_t off = d2t.dtype == DType::I64 ? d2t.as<const int64_t>()[d] : d2t.as<const int32_t>()[d];
    const int64_t t = d + off;
    if (t < 0 || t >= V)
      return ld.fail(ld.resolve("d2t"), fmt::format("draft id {} maps to {} outside the vocabulary [0, {})", d, t, V));
    if (seen[size_t(t)]++)
      return ld.fail(ld.resolve("d2t"), fmt::format("target id {} is the image of two draft ids", t));
    index[size_t(d)] = int32_t(t);
  }
  w.owned.push_back(backend.alloc(size_t(Vd) * sizeof(int32_t)));
  w.d2t_index = w.owned.back().view(DType::I32, {Vd});
  backend.copy_from_host(w.d2t_index, index.data());
  // t2d (bool [vocab]) is the inverse map; unused here, but a present one must have the right shape.
  if (ld.contains("t2d")) MLA_RETURN_IF_ERROR(ld.host("t2d", {V}, {DType::BOOL, DType::U8}).status());

  m->dims_ = ops::GqaDims{int(Hq), int(KVH), int(D), float(1.0 / std::sqrt(double(D)))};
  auto ws = std::make_unique<Workspace>();
  const int64_t T = limits.max_tokens;
  const std::vector<float> inv_freq = eagle3_rope_inv_freq(c);
  TensorView inv = ws->make(backend, DType::F32, {int64_t(inv_freq.size())});
  backend.copy_from_host(inv, inv_freq.data());
  m->rope_ = ops::RopeTable{inv, eagle3_rope_attention_factor(c), /*interleaved=*/false};

  ws->allocate(backend, limits, ws->owned);
  for (TensorView* v : {&ws->embeds, &ws->fc_out, &ws->proj, &ws->resid, &ws->normed, &ws->out, &ws->rows})
    *v = ws->make(backend, DType::F32, {T, H});
  ws->attn_in = ws->make(backend, DType::F32, {T, 2 * H});
  ws->q = ws->make(backend, DType::F32, {T, Hq * D});
  ws->attn = ws->make(backend, DType::F32, {T, Hq * D});
  ws->k = ws->make(backend, DType::F32, {T, KVH * D});
  ws->v = ws->make(backend, DType::F32, {T, KVH * D});
  ws->gate = ws->make(backend, DType::F32, {T, I});
  ws->up = ws->make(backend, DType::F32, {T, I});
  ws->draft_logits = ws->make(backend, DType::F32, {T, Vd});
  m->ws_ = std::move(ws);
  return m;
}

void Eagle3Draft::stage_inputs(const ForwardInputs& in) {
  MLA_CHECK(in.kv_cache.size() == 1, "eagle3: {} cache layers given (want 1)", in.kv_cache.size());
  const int bs = in.block_size;
  const TensorView& c = in.kv_cache[0];
  MLA_CHECK(bs > 0 && (c.dtype == DType::F32 || c.dtype == DType::BF16) && c.ndim == 3 && c.dim(1) == bs &&
                c.dim(2) == cache_row_width(),
            "eagle3: cache {} must be F32 or BF16 [blocks, {}, {}]", c.describe(), bs, cache_row_width());
  ws_->stage(backend_, in, limits_, "eagle3: ");
}

void Eagle3Draft::forward(const spec::DraftForwardInputs& in, const TensorView& logits) {
  stage_inputs(in.base);
  Workspace& ws = *ws_;
  const Weights& w = *weights_;
  const int64_t T = int64_t(in.base.token_ids.size()), N = int64_t(in.base.logits_rows.size());
  const int64_t H = cfg_.hidden_size, Hq = dims_.num_heads, KVH = dims_.num_kv_heads, D = dims_.head_dim;
  const float eps = float(cfg_.rms_norm_eps);
  const int64_t in_width = in.hidden_from_target ? target_feature_width() : hidden_width();
  MLA_CHECK(in.hidden_in.dtype == DType::F32 && in.hidden_in.ndim == 2 && in.hidden_in.dim(0) == T &&
                in.hidden_in.dim(1) == in_width && in.hidden_in.inner_contiguous(),
            "eagle3: hidden_in {} (want F32 [{}, {}], {})", in.hidden_in.describe(), T, in_width,
            in.hidden_from_target ? "target features" : "the previous draft output");
  const bool want_hidden = in.hidden_out.data != nullptr;
  MLA_CHECK(!want_hidden || (in.hidden_out.dtype == DType::F32 && in.hidden_out.ndim == 2 &&
                             in.hidden_out.dim(0) == T && in.hidden_out.dim(1) == H),
            "eagle3: hidden_out {} (want F32 [{}, {}])", in.hidden_out.describe(), T, H);
  MLA_CHECK(logits.dtype == DType::F32 && logits.ndim == 2 && logits.dim(0) == N && logits.dim(1) == target_vocab_ &&
                logits.is_contiguous(),
            "eagle3: logits {} for {} rows (want contiguous F32 [{}, {}])", logits.describe(), N, N, target_vocab_);
  const ops::AttentionBatch& batch = ws.batch;
  const TensorView cache = in.base.kv_cache[0];
  const TensorView positions = ws.positions.slice(0, 0, T);

  const TensorView e = ws.embeds.slice(0, 0, T);                       // {T, H}
  backend_.embedding(ws.ids.slice(0, 0, T), w.embed_tokens, e);
  TensorView h = in.hidden_in;                                         // {T, H}
  if (in.hidden_from_target) {
    h = ws.fc_out.slice(0, 0, T);
    backend_.linear(in.hidden_in, w.fc, h);                            // fc(feat3): {T, 3H_t} -> {T, H}
  }
  const TensorView x = ws.attn_in.slice(0, 0, T);                      // {T, 2H}: [norm(e) | norm(h)]
  backend_.rms_norm(e, w.input_layernorm, eps, x.slice(1, 0, H));
  backend_.rms_norm(h, w.hidden_norm, eps, x.slice(1, H, H));

  // Llama attention with RoPE (rotate_half) over the draft's own paged cache.
  const TensorView q = ws.q.slice(0, 0, T);                            // {T, Hq*D}
  const TensorView k = ws.k.slice(0, 0, T), v = ws.v.slice(0, 0, T);   // {T, KVH*D}
  const ops::Weight* qkv_proj[] = {&w.q_proj, &w.k_proj, &w.v_proj};  // one input: one group
  const TensorView qkv[] = {q, k, v};
  backend_.linear_group(x, qkv_proj, qkv);
  backend_.rope(q.reshape({T, Hq, D}), positions, rope_);
  backend_.rope(k.reshape({T, KVH, D}), positions, rope_);
  backend_.gqa_cache_write(k, v, batch.slot_mapping, cache);
  const TensorView o = ws.attn.slice(0, 0, T);                         // {T, Hq*D}
  backend_.gqa_attention(q, cache, batch, dims_, o);
  const TensorView a = ws.proj.slice(0, 0, T);                         // {T, H}
  backend_.linear(o, w.o_proj, a);

  // r = a + h; out = mlp(post_attention_layernorm(r)) + r.
  const TensorView r = ws.resid.slice(0, 0, T);                        // {T, H}
  backend_.add(a, h, r);
  const TensorView xn = ws.normed.slice(0, 0, T);                      // {T, H}
  backend_.rms_norm(r, w.post_attention_layernorm, eps, xn);
  const TensorView g = ws.gate.slice(0, 0, T), u = ws.up.slice(0, 0, T);  // {T, I}
  const ops::Weight* mlp_proj[] = {&w.gate_proj, &w.up_proj};
  const TensorView mlp_out[] = {g, u};
  backend_.linear_group(xn, mlp_proj, mlp_out);
  backend_.silu_mul(g, u, g);
  backend_.linear(g, w.down_proj, a);                                  // a now holds the MLP output
  const TensorView out = ws.out.slice(0, 0, T);                        // {T, H} pre-norm layer output
  backend_.add(a, r, out);
  if (want_hidden) backend_.copy(out, in.hidden_out);                  // h may be hidden_out: read above

  // Logits only for the requested rows: lm_head(norm(out)) over the draft vocabulary, scattered.
  const TensorView rows = ws.rows.slice(0, 0, N);                      // {N, H}
  backend_.embedding(ws.logits_rows.slice(0, 0, N), out, rows);
  backend_.rms_norm(rows, w.norm, eps, rows);
  const TensorView dl = ws.draft_logits.slice(0, 0, N);                // {N, draft_vocab}
  backend_.linear(rows, w.lm_head, dl);
  backend_.scatter_columns(dl, w.d2t_index, -std::numeric_limits<float>::infinity(), logits);
}

}  // namespace mla::model
