// DeepSeek MTP (NextN) draft on the tiny random checkpoint with one MTP block (CPU): loading, the
// DraftModel geometry, prefill/decode consistency through its one-layer cache, hidden chaining, a
// host double-precision reference of one token composed from the checkpoint tensors (MODELS.md
// 1.3/1.4/1.8/1.9, independent of the model code), and clear loader errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <numeric>

#include "io/checkpoint.h"
#include "io/safetensors_writer.h"
#include "model/deepseek_mtp.h"
#include "model/model_test_util.h"
#include "model/mtp_test_util.h"

namespace mla::test {
namespace {

const auto* const kMtpCleanup = ::testing::AddGlobalTestEnvironment(new TinyMtpCleanup);

// Relative L2 per row between two paths computing the same function in fp32 with different
// reduction orders (chunked vs one row at a time, naive vs absorbed MLA).
constexpr double kSamePathTol = 1e-5;

struct LoadedMtp {
  std::unique_ptr<ops::Backend> backend = cpu::make_cpu_backend();
  dist::SingleProcessCommunicator comm;
  std::unique_ptr<model::DeepseekMtp> mtp;
};

std::unique_ptr<LoadedMtp> load_mtp(const std::string& dir, int max_tokens = 64) {
  auto lm = std::make_unique<LoadedMtp>();
  model::ModelLimits limits;
  limits.max_tokens = max_tokens;
  limits.max_seqs = 4;
  auto m = model::DeepseekMtp::load(dir, *lm->backend, limits, lm->comm);
  EXPECT_TRUE(m.is_ok()) << m.status().message();
  if (!m) return nullptr;
  lm->mtp = std::move(m).value();
  return lm;
}

// Runs the draft over `ids` (one sequence, positions from 0) in chunks of `chunk` rows, each row
// paired with its row of `hidden_in` [n, hidden]; returns logits [n, V] and hidden_out [n, hidden].
struct MtpRun {
  std::vector<float> logits, hidden_out;
};

MtpRun run_mtp(LoadedMtp& lm, const std::vector<int32_t>& ids, const std::vector<float>& hidden_in, int chunk,
               model::MlaPath path) {
  model::DeepseekMtp& d = *lm.mtp;
  ops::Backend& b = *lm.backend;
  const int n = int(ids.size()), V = d.target_config().vocab_size, bs = 4;
  const int64_t hid = d.hidden_width();
  runtime::KvCache cache(b, {d.num_cache_layers(), (n + bs - 1) / bs + 1, bs, int(d.cache_row_width()), DType::F32});
  const std::vector<TensorView> kv = {cache.layer(0)};
  runtime::BlockTable table;
  EXPECT_TRUE(table.ensure_capacity(cache.pool(), n, bs));
  Buffer hin = b.alloc(size_t(n) * size_t(hid) * sizeof(float));
  Buffer hout = b.alloc(size_t(n) * size_t(hid) * sizeof(float));
  Buffer logits = b.alloc(size_t(n) * size_t(V) * sizeof(float));
  const TensorView hin_v = hin.view(DType::F32, {n, hid}), hout_v = hout.view(DType::F32, {n, hid});
  b.copy_from_host(hin_v, hidden_in.data());
  d.set_mla_path(path);
  MtpRun out;
  out.logits.resize(size_t(n) * size_t(V));
  for (int start = 0; start < n; start += chunk) {
    const int len = std::min(chunk, n - start);
    std::vector<int32_t> pos(static_cast<size_t>(len)), rows(static_cast<size_t>(len));
    for (int i = 0; i < len; ++i) { pos[size_t(i)] = start + i; rows[size_t(i)] = i; }
    model::SequenceSlice slice{len, start + len, table.blocks()};
    spec::DraftForwardInputs in;
    in.base = model::ForwardInputs{{ids.data() + start, size_t(len)}, pos, {&slice, 1}, rows, kv, bs};
    in.hidden_in = hin_v.slice(0, start, len);
    in.hidden_out = hout_v.slice(0, start, len);
    const TensorView lv = logits.view(DType::F32, {len, V});
    d.forward(in, lv);
    b.copy_to_host(out.logits.data() + size_t(start) * size_t(V), lv);
  }
  out.hidden_out.resize(size_t(n) * size_t(hid));
  b.copy_to_host(out.hidden_out.data(), hout_v);
  return out;
}

TEST(DeepseekMtp, LoadsWithTheDraftGeometry) {
  auto lm = load_mtp(tiny_mtp_model());
  ASSERT_TRUE(lm);
  const model::DeepseekMtp& d = *lm->mtp;
  const io::ModelConfig& c = d.target_config();
  EXPECT_EQ(d.kind(), spec::DraftKind::Mtp);
  EXPECT_EQ(d.num_cache_layers(), 1);
  EXPECT_EQ(d.cache_row_width(), c.kv_lora_rank + c.qk_rope_head_dim);
  EXPECT_EQ(d.target_feature_layers(), std::vector<int>{spec::kFinalNormed});
  EXPECT_EQ(d.target_feature_width(), c.hidden_size);
  EXPECT_EQ(d.hidden_width(), c.hidden_size);
}

// One chunk, uneven chunks and one row at a time (decode, absorbed MLA) agree on every row's logits
// and hidden_out: the draft's cache carries the context exactly like the target's.
TEST(DeepseekMtp, ChunkedPrefillEqualsDecodeThroughTheCache) {
  for (const char* dtype : {"bf16", "fp8"}) {
    auto lm = load_mtp(tiny_mtp_model(dtype));
    ASSERT_TRUE(lm);
    const int n = 13, V = lm->mtp->target_config().vocab_size;
    const int64_t hid = lm->mtp->hidden_width();
    const std::vector<int32_t> ids = random_ids(n, V, 21);
    const std::vector<float> h = random_floats(size_t(n) * size_t(hid), 22);
    const MtpRun whole = run_mtp(*lm, ids, h, n, model::MlaPath::Naive);
    const MtpRun chunked = run_mtp(*lm, ids, h, 5, model::MlaPath::Naive);
    const MtpRun decode = run_mtp(*lm, ids, h, 1, model::MlaPath::Auto);
    for (int t = 0; t < n; ++t) {
      const float* ref = whole.logits.data() + size_t(t) * size_t(V);
      const float* href = whole.hidden_out.data() + size_t(t) * size_t(hid);
      for (const MtpRun* o : {&chunked, &decode}) {
        EXPECT_LE(rel_l2(o->logits.data() + size_t(t) * size_t(V), ref, size_t(V)), kSamePathTol) << dtype << " row " << t;
        EXPECT_LE(rel_l2(o->hidden_out.data() + size_t(t) * size_t(hid), href, size_t(hid)), kSamePathTol)
            << dtype << " row " << t;
      }
      for (int v = 0; v < V; ++v) ASSERT_TRUE(std::isfinite(ref[v]));
    }
  }
}

// Chained drafting: a step fed by the target's feature, then steps fed by the draft's own
// hidden_out (hidden_from_target = false), reading and writing the same buffer in place.
TEST(DeepseekMtp, ChainsItsOwnHidden) {
  auto lm = load_mtp(tiny_mtp_model());
  ASSERT_TRUE(lm);
  model::DeepseekMtp& d = *lm->mtp;
  ops::Backend& b = *lm->backend;
  const int V = d.target_config().vocab_size, bs = 4, steps = 4;
  const int64_t hid = d.hidden_width();
  runtime::KvCache cache(b, {1, 4, bs, int(d.cache_row_width()), DType::F32});
  const std::vector<TensorView> kv = {cache.layer(0)};
  runtime::BlockTable table;
  ASSERT_TRUE(table.ensure_capacity(cache.pool(), steps, bs));
  Buffer hbuf = b.alloc(size_t(hid) * sizeof(float));
  Buffer logits = b.alloc(size_t(V) * sizeof(float));
  const TensorView hv = hbuf.view(DType::F32, {1, hid}), lv = logits.view(DType::F32, {1, V});
  const std::vector<float> target_h = random_floats(size_t(hid), 31);
  b.copy_from_host(hv, target_h.data());
  std::vector<float> prev(target_h);
  int32_t token = 17;
  for (int s = 0; s < steps; ++s) {
    const int32_t pos = s, row = 0;
    model::SequenceSlice slice{1, s + 1, table.blocks()};
    spec::DraftForwardInputs in;
    in.base = model::ForwardInputs{{&token, 1}, {&pos, 1}, {&slice, 1}, {&row, 1}, kv, bs};
    in.hidden_in = hv;
    in.hidden_from_target = s == 0;
    in.hidden_out = hv;  // in place: hidden_in is consumed before hidden_out is written
    d.forward(in, lv);
    std::vector<float> l(static_cast<size_t>(V)), h(static_cast<size_t>(hid));
    b.copy_to_host(l.data(), lv);
    b.copy_to_host(h.data(), hv);
    for (float v : l) ASSERT_TRUE(std::isfinite(v));
    for (float v : h) ASSERT_TRUE(std::isfinite(v));
    EXPECT_GT(rel_l2(h.data(), prev.data(), size_t(hid)), 1e-3) << "step " << s << " left hidden unchanged";
    prev = h;
    token = int32_t(std::max_element(l.begin(), l.end()) - l.begin());  // greedy chain
  }
}

// ---- host reference (double) -------------------------------------------------------------------

class HostWeights {
 public:
  explicit HostWeights(const std::string& dir) : ckpt_(io::Checkpoint::open(dir).value()) {}
  // Row-major values of a BF16/F32 tensor.
  std::vector<double> get(const std::string& name) const {
    const TensorView v = ckpt_.get(name).value();
    std::vector<double> out(size_t(v.numel()));
    for (size_t i = 0; i < out.size(); ++i)
      out[i] = v.dtype == DType::F32 ? double(v.as<const float>()[i]) : double(bf16_to_f32(v.as<const uint16_t>()[i]));
    return out;
  }

 private:
  io::Checkpoint ckpt_;
};

using Vec = std::vector<double>;

Vec matvec(const Vec& w, const Vec& x, size_t rows, size_t row0 = 0) {  // rows [row0, row0+rows) of w
  const size_t in = x.size();
  Vec y(rows, 0.0);
  for (size_t o = 0; o < rows; ++o)
    for (size_t i = 0; i < in; ++i) y[o] += w[(row0 + o) * in + i] * x[i];
  return y;
}

Vec rms_norm(const Vec& x, const Vec& w, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double inv = 1.0 / std::sqrt(ss / double(x.size()) + eps);
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = w[i] * x[i] * inv;
  return y;
}

Vec mlp(const HostWeights& hw, const std::string& p, const Vec& x, size_t width) {
  const Vec g = matvec(hw.get(p + "gate_proj.weight"), x, width), u = matvec(hw.get(p + "up_proj.weight"), x, width);
  Vec a(width);
  for (size_t i = 0; i < width; ++i) a[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
  return matvec(hw.get(p + "down_proj.weight"), a, x.size());
}

// One token at position 0 of an empty cache: attention over a single key has weight 1, so
// o[h] = W_UV[h] c_hat and neither q nor RoPE matter (MODELS.md 1.4).
TEST(DeepseekMtp, OneTokenMatchesAHostReference) {
  const std::string dir = tiny_mtp_model();
  auto lm = load_mtp(dir);
  ASSERT_TRUE(lm);
  const io::ModelConfig& c = lm->mtp->target_config();
  const size_t hid = size_t(c.hidden_size), V = size_t(c.vocab_size), H = size_t(c.num_attention_heads);
  const size_t r = size_t(c.kv_lora_rank), dn = size_t(c.qk_nope_head_dim), dv = size_t(c.v_head_dim);
  const double eps = c.rms_norm_eps;
  const std::vector<int32_t> ids = {123};
  const std::vector<float> h_in = random_floats(hid, 41);
  const MtpRun got = run_mtp(*lm, ids, h_in, 1, model::MlaPath::Naive);

  HostWeights hw(dir);
  const std::string p = fmt::format("model.layers.{}.", c.num_hidden_layers);
  const Vec embed = hw.get("model.embed_tokens.weight");
  const Vec e(embed.begin() + ptrdiff_t(size_t(ids[0]) * hid), embed.begin() + ptrdiff_t(size_t(ids[0] + 1) * hid));
  const Vec hd(h_in.begin(), h_in.end());
  Vec cat = rms_norm(e, hw.get(p + "enorm.weight"), eps);                    // embedding first
  const Vec hn = rms_norm(hd, hw.get(p + "hnorm.weight"), eps);
  cat.insert(cat.end(), hn.begin(), hn.end());
  const Vec u = matvec(hw.get(p + "eh_proj.weight"), cat, hid);
  // Attention.
  const Vec x = rms_norm(u, hw.get(p + "input_layernorm.weight"), eps);
  const Vec kv = matvec(hw.get(p + "self_attn.kv_a_proj_with_mqa.weight"), x, r);  // c_kv rows only
  const Vec chat = rms_norm(kv, hw.get(p + "self_attn.kv_a_layernorm.weight"), 1e-6);
  const Vec kv_b = hw.get(p + "self_attn.kv_b_proj.weight");
  Vec o;
  for (size_t h = 0; h < H; ++h) {
    const Vec vh = matvec(kv_b, chat, dv, h * (dn + dv) + dn);  // W_UV[h] c_hat
    o.insert(o.end(), vh.begin(), vh.end());
  }
  const Vec attn = matvec(hw.get(p + "self_attn.o_proj.weight"), o, hid);
  Vec h1(hid);
  for (size_t i = 0; i < hid; ++i) h1[i] = u[i] + attn[i];
  // MoE (MODELS.md 1.8): sigmoid scores, biased selection within the best groups, unbiased weights.
  const Vec x2 = rms_norm(h1, hw.get(p + "post_attention_layernorm.weight"), eps);
  ASSERT_TRUE(c.is_moe_layer(c.num_hidden_layers));
  const size_t E = size_t(c.n_routed_experts), G = size_t(c.n_group), K = size_t(c.num_experts_per_tok);
  const Vec logit = matvec(hw.get(p + "mlp.gate.weight"), x2, E);
  const Vec bias = hw.get(p + "mlp.gate.e_score_correction_bias");
  Vec s(E), sel(E);
  for (size_t i = 0; i < E; ++i) { s[i] = 1.0 / (1.0 + std::exp(-logit[i])); sel[i] = s[i] + bias[i]; }
  const size_t per = E / G;
  std::vector<std::pair<double, size_t>> groups;
  for (size_t g = 0; g < G; ++g) {
    Vec m(sel.begin() + ptrdiff_t(g * per), sel.begin() + ptrdiff_t((g + 1) * per));
    std::sort(m.rbegin(), m.rend());
    groups.push_back({m[0] + m[1], g});
  }
  std::sort(groups.rbegin(), groups.rend());
  Vec masked(E, -INFINITY);
  for (size_t k = 0; k < size_t(c.topk_group); ++k)
    for (size_t i = 0; i < per; ++i) masked[groups[k].second * per + i] = sel[groups[k].second * per + i];
  std::vector<size_t> order(E);
  std::iota(order.begin(), order.end(), size_t(0));
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return masked[a] > masked[b]; });
  double wsum = 0;
  for (size_t k = 0; k < K; ++k) wsum += s[order[k]];
  Vec y = mlp(hw, p + "mlp.shared_experts.", x2, size_t(c.moe_intermediate_size) * size_t(c.n_shared_experts));
  for (size_t k = 0; k < K; ++k) {
    const double w = s[order[k]] / wsum * c.routed_scaling_factor;
    const Vec ye = mlp(hw, fmt::format("{}mlp.experts.{}.", p, order[k]), x2, size_t(c.moe_intermediate_size));
    for (size_t i = 0; i < hid; ++i) y[i] += w * ye[i];
  }
  Vec z(hid);
  for (size_t i = 0; i < hid; ++i) z[i] = h1[i] + y[i];
  const Vec logits =
      matvec(hw.get(p + "shared_head.head.weight"), rms_norm(z, hw.get(p + "shared_head.norm.weight"), eps), V);

  // fp32 model vs double reference: rounding only (observed 2.5e-7; 1e-5 leaves a wide margin while
  // any wiring error — wrong norm, order of the concat, missed residual — is O(1)).
  const std::vector<float> zf(z.begin(), z.end()), lf(logits.begin(), logits.end());
  EXPECT_LE(rel_l2(got.hidden_out.data(), zf.data(), hid), 1e-5);
  EXPECT_LE(rel_l2(got.logits.data(), lf.data(), V), 1e-5);
}

// ---- loader errors -----------------------------------------------------------------------------

// Copies the checkpoint in `src` to `dst` without the tensors `drop` (config.json copied as is).
void copy_checkpoint_without(const std::string& src, const std::string& dst, const std::string& drop) {
  std::filesystem::create_directories(dst);
  std::filesystem::copy_file(src + "/config.json", dst + "/config.json",
                             std::filesystem::copy_options::overwrite_existing);
  const io::Checkpoint ckpt = io::Checkpoint::open(src).value();
  io::SafetensorsWriter w;
  for (const std::string& name : ckpt.tensor_names()) {
    if (name == drop) continue;
    const TensorView v = ckpt.get(name).value();
    w.add(name, v.dtype, std::vector<int64_t>(v.shape.begin(), v.shape.begin() + v.ndim),
          [v](std::span<uint8_t> b) { std::memcpy(b.data(), v.data, b.size()); });
  }
  ASSERT_TRUE(w.write(dst + "/model.safetensors").is_ok());
}

TEST(DeepseekMtp, MissingEhProjIsAOneLineErrorNamingTheTensor) {
  const std::string src = tiny_mtp_model();
  const std::string dst = tiny_mtp_dir("no_eh_proj");
  const std::string name = "model.layers.4.eh_proj.weight";
  copy_checkpoint_without(src, dst, name);
  dist::SingleProcessCommunicator comm;
  auto backend = cpu::make_cpu_backend();
  auto m = model::DeepseekMtp::load(dst, *backend, model::ModelLimits{}, comm);
  ASSERT_FALSE(m.is_ok());
  const std::string msg = m.status().message();
  EXPECT_NE(msg.find(name), std::string::npos) << msg;
  EXPECT_NE(msg.find(dst), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  // The target model still loads from it (the MTP layer is not its concern).
  EXPECT_TRUE(load_cpu_model(dst, 16));
}

TEST(DeepseekMtp, CheckpointWithoutMtpLayersIsAClearError) {
  const std::string dir = tiny_mtp_model("bf16", 0);
  dist::SingleProcessCommunicator comm;
  auto backend = cpu::make_cpu_backend();
  auto m = model::DeepseekMtp::load(dir, *backend, model::ModelLimits{}, comm);
  ASSERT_FALSE(m.is_ok());
  EXPECT_NE(m.status().message().find("num_nextn_predict_layers is 0"), std::string::npos) << m.status().message();
}

}  // namespace
}  // namespace mla::test
