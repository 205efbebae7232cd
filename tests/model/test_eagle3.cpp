// EAGLE-3 draft on the CPU backend: a synthetic draft for the tiny target loads; a chunked or batched
// forward equals token-by-token steps through the paged cache (the cache carries the context);
// logits are -inf exactly outside the d2t image; chained steps (hidden_in = the previous hidden_out,
// in place) run; the target's embedding is borrowed when the draft has none; and broken checkpoints
// fail at load with one line naming the file or tensor.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "io/checkpoint.h"
#include "io/presets.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "model/eagle3.h"
#include "model/eagle3_synthetic.h"

namespace mla::test {
namespace {

namespace fs = std::filesystem;

constexpr int kBlockSize = 4;  // small, so contexts cross block edges
constexpr int kDraftVocab = 150;

io::ModelConfig target_config() {
  auto c = io::preset_config("tiny");
  EXPECT_TRUE(c.is_ok());
  return c.value();
}

std::string temp_dir(const std::string& name) {
  return (fs::temp_directory_path() / fmt::format("mlaserve_eagle3_{}_{}", name, getpid())).string();
}

// A fresh synthetic draft in its own directory (removed by the caller's ScopedDir).
struct ScopedDir {
  std::string path;
  explicit ScopedDir(const std::string& name, const model::Eagle3SyntheticOptions& opt = {}) : path(temp_dir(name)) {
    fs::remove_all(path);
    model::Eagle3SyntheticOptions o = opt;
    if (o.draft_vocab == 0) o.draft_vocab = kDraftVocab;
    const Status st = model::write_synthetic_eagle3(path, target_config(), o);
    EXPECT_TRUE(st.is_ok()) << st.message();
  }
  ~ScopedDir() { fs::remove_all(path); }
};

model::ModelLimits limits() {
  model::ModelLimits l;
  l.max_tokens = 64;
  l.max_seqs = 4;
  l.max_block_entries = 256;
  return l;
}

std::unique_ptr<model::Eagle3Draft> load_ok(const std::string& dir, ops::Backend& be, const TensorView& embed = {}) {
  auto r = model::Eagle3Draft::load(dir, target_config(), be, limits(), embed);
  EXPECT_TRUE(r.is_ok()) << r.status().message();
  return r ? std::move(r).value() : nullptr;
}

std::string load_error(const std::string& dir, const TensorView& embed = {}) {
  auto be = cpu::make_cpu_backend();
  auto r = model::Eagle3Draft::load(dir, target_config(), *be, limits(), embed);
  return r.is_ok() ? std::string("(loaded)") : r.status().message();
}

// One sequence's draft state: its block table over a private cache and its length.
struct DraftRunner {
  model::Eagle3Draft& draft;
  std::vector<float> cache;
  int num_blocks;
  std::vector<std::vector<int32_t>> tables;  // per sequence
  std::vector<int> lens;

  DraftRunner(model::Eagle3Draft& d, int seqs, int blocks_per_seq)
      : draft(d), num_blocks(seqs * blocks_per_seq), tables(size_t(seqs)), lens(size_t(seqs), 0) {
    cache.assign(size_t(num_blocks) * kBlockSize * size_t(d.cache_row_width()), NAN);
    // Interleaved block ids (sequence s owns blocks s, s + seqs, ...): tables are not contiguous.
    for (int s = 0; s < seqs; ++s)
      for (int b = 0; b < blocks_per_seq; ++b) tables[size_t(s)].push_back(b * seqs + s);
  }

  // One step: sequence s adds rows [begin_s, begin_s + q_len_s) of its token / feature streams.
  // Returns logits of every new row (target vocab) and writes hidden_out rows.
  std::vector<float> step(const std::vector<int>& seqs, const std::vector<int>& q_lens,
                          const std::vector<std::vector<int32_t>>& tokens,
                          const std::vector<std::vector<float>>& features, bool from_target,
                          std::vector<float>* hidden_out = nullptr) {
    std::vector<int32_t> ids, pos, rows;
    std::vector<float> hin;
    std::vector<model::SequenceSlice> slices;
    const int64_t fw = from_target ? draft.target_feature_width() : draft.hidden_width();
    for (size_t i = 0; i < seqs.size(); ++i) {
      const size_t s = size_t(seqs[i]);
      for (int j = 0; j < q_lens[i]; ++j) {
        const int p = lens[s] + j;
        rows.push_back(int32_t(ids.size()));
        ids.push_back(tokens[s][size_t(p)]);
        pos.push_back(p);
        hin.insert(hin.end(), features[s].begin() + p * fw, features[s].begin() + (p + 1) * fw);
      }
      lens[s] += q_lens[i];
      slices.push_back({q_lens[i], lens[s], tables[s]});
    }
    const int64_t T = int64_t(ids.size()), V = target_config().vocab_size, H = draft.hidden_width();
    const TensorView layer =
        TensorView::contiguous(cache.data(), DType::F32, {num_blocks, kBlockSize, draft.cache_row_width()});
    std::vector<float> logits(size_t(T * V), NAN);
    std::vector<float> hout(size_t(T * H), NAN);
    spec::DraftForwardInputs in;
    in.base = model::ForwardInputs{ids, pos, slices, rows, {&layer, 1}, kBlockSize};
    in.hidden_in = TensorView::contiguous(hin.data(), DType::F32, {T, fw});
    in.hidden_from_target = from_target;
    in.hidden_out = TensorView::contiguous(hout.data(), DType::F32, {T, H});
    draft.forward(in, TensorView::contiguous(logits.data(), DType::F32, {T, V}));
    if (hidden_out) *hidden_out = hout;
    return logits;
  }
};

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (std::isinf(a[i]) || std::isinf(b[i])) {
      if (a[i] != b[i]) return INFINITY;
      continue;
    }
    worst = std::max(worst, std::fabs(double(a[i]) - double(b[i])));
  }
  return worst;
}

TEST(Eagle3, ConfigAndGeometryFromSyntheticCheckpoint) {
  ScopedDir dir("geometry");
  auto be = cpu::make_cpu_backend();
  auto d = load_ok(dir.path, *be);
  ASSERT_TRUE(d);
  const io::ModelConfig t = target_config();
  EXPECT_EQ(d->kind(), spec::DraftKind::Eagle3);
  EXPECT_EQ(d->num_cache_layers(), 1);
  EXPECT_EQ(d->cache_row_width(), 2 * 2 * 32);  // 2 kv heads x head_dim 32, k then v
  EXPECT_EQ(d->target_feature_layers(), (std::vector<int>{0, t.num_hidden_layers / 2, t.num_hidden_layers - 1}));
  EXPECT_EQ(d->target_feature_width(), 3 * t.hidden_size);
  EXPECT_EQ(d->hidden_width(), t.hidden_size);
  EXPECT_EQ(d->config().draft_vocab_size, kDraftVocab);
}

TEST(Eagle3, ChunkedAndBatchedEqualTokenByTokenAndLogitsLiveOnTheD2tImage) {
  ScopedDir dir("chunked");
  auto be = cpu::make_cpu_backend();
  auto d = load_ok(dir.path, *be);
  ASSERT_TRUE(d);
  const io::ModelConfig t = target_config();
  const int V = t.vocab_size, n0 = 23, n1 = 9;
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<std::vector<int32_t>> tokens(2);
  std::vector<std::vector<float>> feats(2);
  for (int s = 0; s < 2; ++s) {
    const int n = s == 0 ? n0 : n1;
    for (int i = 0; i < n; ++i) tokens[size_t(s)].push_back(int32_t(rng() % uint32_t(V)));
    for (int64_t i = 0; i < n * d->target_feature_width(); ++i) feats[size_t(s)].push_back(u(rng));
  }
  // Reference: each sequence alone, one token per step.
  std::vector<float> ref[2], ref_hidden[2];
  for (int s = 0; s < 2; ++s) {
    DraftRunner r(*d, 2, 8);
    for (int i = 0; i < (s == 0 ? n0 : n1); ++i) {
      std::vector<float> h;
      const std::vector<float> l = r.step({s}, {1}, tokens, feats, true, &h);
      ref[s].insert(ref[s].end(), l.begin(), l.end());
      ref_hidden[s].insert(ref_hidden[s].end(), h.begin(), h.end());
    }
  }
  // Both sequences in each step, in chunks (a prefill chunk beside a shorter one, then decode rows).
  DraftRunner r(*d, 2, 8);
  std::vector<float> got[2], got_hidden[2];
  const std::vector<std::pair<int, int>> chunks = {{7, 4}, {5, 1}, {1, 3}, {10, 1}};
  for (const auto& [c0, c1] : chunks) {
    std::vector<float> h;
    const std::vector<float> l = r.step({0, 1}, {c0, c1}, tokens, feats, true, &h);
    const int64_t H = d->hidden_width();
    got[0].insert(got[0].end(), l.begin(), l.begin() + int64_t(c0) * V);
    got[1].insert(got[1].end(), l.begin() + int64_t(c0) * V, l.end());
    got_hidden[0].insert(got_hidden[0].end(), h.begin(), h.begin() + c0 * H);
    got_hidden[1].insert(got_hidden[1].end(), h.begin() + c0 * H, h.end());
  }
  // Same fp32 operations in the same order per row (batch-invariant linear, one key chunk), up to the
  // summation order inside the attention chunk: 1e-5 absolute on O(1)-O(10) logits.
  for (int s = 0; s < 2; ++s) {
    EXPECT_LT(max_abs_diff(got[s], ref[s]), 1e-4) << "seq " << s;
    EXPECT_LT(max_abs_diff(got_hidden[s], ref_hidden[s]), 1e-5) << "seq " << s;
  }

  // -inf exactly outside the image of d2t (read from the checkpoint), finite on it.
  auto ckpt = io::Checkpoint::open(dir.path);
  ASSERT_TRUE(ckpt.is_ok());
  auto d2t = ckpt.value().get("d2t");
  ASSERT_TRUE(d2t.is_ok());
  std::set<int64_t> image;
  for (int64_t i = 0; i < kDraftVocab; ++i) image.insert(i + d2t.value().as<const int64_t>()[i]);
  ASSERT_EQ(image.size(), size_t(kDraftVocab));
  for (int64_t i = 0; i < 64; ++i) EXPECT_TRUE(image.count(i)) << "id " << i << " must be draftable";
  for (size_t row = 0; row < ref[0].size() / size_t(V); ++row)
    for (int64_t col = 0; col < V; ++col) {
      const float x = ref[0][row * size_t(V) + size_t(col)];
      if (image.count(col)) ASSERT_TRUE(std::isfinite(x)) << row << "," << col;
      else ASSERT_EQ(x, -INFINITY) << row << "," << col;
    }
}

TEST(Eagle3, ChainedStepsReadTheirOwnOutputInPlace) {
  ScopedDir dir("chained");
  auto be = cpu::make_cpu_backend();
  auto d = load_ok(dir.path, *be);
  ASSERT_TRUE(d);
  const int V = target_config().vocab_size;
  const int64_t H = d->hidden_width(), F = d->target_feature_width();
  std::mt19937 rng(12);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  // Prefill 6 rows from target features, then 3 chained draft steps fed by the previous output.
  std::vector<std::vector<int32_t>> tokens(1);
  std::vector<std::vector<float>> feats(1);
  for (int i = 0; i < 9; ++i) tokens[0].push_back(int32_t(rng() % uint32_t(V)));
  for (int64_t i = 0; i < 6 * F; ++i) feats[0].push_back(u(rng));
  DraftRunner r(*d, 1, 8);
  std::vector<float> h;
  r.step({0}, {6}, tokens, feats, true, &h);
  // Own-output features: the engine would pass the last row's output; rows 6.. of the stream.
  std::vector<std::vector<float>> own(1, std::vector<float>(size_t(9 * H), 0.0f));
  std::copy(h.end() - H, h.end(), own[0].begin() + 6 * H);
  for (int step = 0; step < 3; ++step) {
    std::vector<float> out;
    const std::vector<float> l = r.step({0}, {1}, tokens, own, false, &out);
    for (float x : out) ASSERT_TRUE(std::isfinite(x));
    if (step < 2) std::copy(out.begin(), out.end(), own[0].begin() + (7 + step) * H);
    int finite = 0;
    for (float x : l) finite += std::isfinite(x);
    EXPECT_EQ(finite, kDraftVocab);
  }
  // In place: hidden_out may be hidden_in's buffer (the engine's chained step).
  std::vector<int32_t> ids = {tokens[0][0]}, pos = {0}, rows = {0};
  std::vector<int32_t> table = {0};
  std::vector<float> cache(static_cast<size_t>(kBlockSize * d->cache_row_width()), NAN);
  std::vector<float> hbuf(static_cast<size_t>(H)), logits(static_cast<size_t>(V));
  for (int64_t i = 0; i < H; ++i) hbuf[size_t(i)] = own[0][size_t(6 * H + i)];
  const TensorView layer = TensorView::contiguous(cache.data(), DType::F32, {1, kBlockSize, d->cache_row_width()});
  model::SequenceSlice slice{1, 1, table};
  spec::DraftForwardInputs in;
  in.base = model::ForwardInputs{ids, pos, {&slice, 1}, rows, {&layer, 1}, kBlockSize};
  in.hidden_from_target = false;
  std::vector<float> separate(static_cast<size_t>(H));
  in.hidden_in = TensorView::contiguous(hbuf.data(), DType::F32, {1, H});
  in.hidden_out = TensorView::contiguous(separate.data(), DType::F32, {1, H});
  d->forward(in, TensorView::contiguous(logits.data(), DType::F32, {1, V}));
  in.hidden_out = in.hidden_in;
  d->forward(in, TensorView::contiguous(logits.data(), DType::F32, {1, V}));
  for (int64_t i = 0; i < H; ++i) ASSERT_EQ(hbuf[size_t(i)], separate[size_t(i)]) << i;
}

TEST(Eagle3, BorrowsTheTargetEmbedding) {
  model::Eagle3SyntheticOptions opt;
  opt.with_embed_tokens = false;
  ScopedDir dir("borrow", opt);
  EXPECT_NE(load_error(dir.path).find("no embed_tokens.weight"), std::string::npos) << load_error(dir.path);
  const io::ModelConfig t = target_config();
  std::vector<float> table(size_t(t.vocab_size) * size_t(t.hidden_size), 0.25f);
  const TensorView embed = TensorView::contiguous(table.data(), DType::F32, {t.vocab_size, t.hidden_size});
  auto be = cpu::make_cpu_backend();
  EXPECT_TRUE(load_ok(dir.path, *be, embed));
  const TensorView wrong = TensorView::contiguous(table.data(), DType::F32, {t.vocab_size, t.hidden_size / 2});
  EXPECT_NE(load_error(dir.path, wrong).find("target embedding"), std::string::npos) << load_error(dir.path, wrong);
}

// Rewrites dir/model.safetensors: drops `drop`, and re-adds `replace` (if named) with a new shape and
// a fill. Every other tensor is copied byte for byte.
void rewrite(const std::string& dir, const std::string& drop, const std::string& replace = "",
             std::vector<int64_t> shape = {}, DType dtype = DType::BF16, io::TensorFill fill = {}) {
  const std::string path = dir + "/model.safetensors";
  std::vector<std::pair<io::TensorInfo, std::vector<uint8_t>>> keep;
  {
    auto f = io::SafetensorsFile::open(path);
    ASSERT_TRUE(f.is_ok()) << f.status().message();
    for (const io::TensorInfo& info : f.value().tensors()) {
      if (info.name == drop || info.name == replace) continue;
      const auto b = f.value().bytes(info);
      keep.emplace_back(info, std::vector<uint8_t>(b.begin(), b.end()));
    }
  }
  io::SafetensorsWriter w;
  for (auto& kept : keep) {
    const std::vector<uint8_t>& bytes = kept.second;  // a named reference: clang 14 cannot capture bindings
    w.add(kept.first.name, kept.first.dtype, kept.first.shape,
          [&bytes](std::span<uint8_t> out) { std::copy(bytes.begin(), bytes.end(), out.begin()); });
  }
  if (!replace.empty()) w.add(replace, dtype, shape, fill ? fill : io::TensorFill([](std::span<uint8_t>) {}));
  const Status st = w.write(path);
  ASSERT_TRUE(st.is_ok()) << st.message();
}

TEST(Eagle3, BrokenCheckpointsFailWithOneClearLine) {
  const io::ModelConfig t = target_config();
  {
    ScopedDir dir("missing_fc");
    rewrite(dir.path, "fc.weight");
    const std::string e = load_error(dir.path);
    EXPECT_NE(e.find("'fc.weight': missing"), std::string::npos) << e;
  }
  {
    ScopedDir dir("fc_width");
    rewrite(dir.path, "", "fc.weight", {t.hidden_size, 2 * t.hidden_size});
    const std::string e = load_error(dir.path);
    EXPECT_NE(e.find("fc.weight"), std::string::npos) << e;
    EXPECT_NE(e.find(fmt::format("[{},{}]", t.hidden_size, 3 * t.hidden_size)), std::string::npos) << e;
  }
  {
    ScopedDir dir("d2t_range");
    rewrite(dir.path, "", "d2t", {kDraftVocab}, DType::I64, [&](std::span<uint8_t> b) {
      auto* v = reinterpret_cast<int64_t*>(b.data());
      v[kDraftVocab - 1] = t.vocab_size;  // maps the last draft id past the vocabulary
    });
    const std::string e = load_error(dir.path);
    EXPECT_NE(e.find("d2t"), std::string::npos) << e;
    EXPECT_NE(e.find("outside the vocabulary"), std::string::npos) << e;
  }
  {
    ScopedDir dir("d2t_dup");
    rewrite(dir.path, "", "d2t", {kDraftVocab}, DType::I64, [&](std::span<uint8_t> b) {
      auto* v = reinterpret_cast<int64_t*>(b.data());
      v[1] = -1;  // draft ids 0 and 1 both map to target id 0
    });
    const std::string e = load_error(dir.path);
    EXPECT_NE(e.find("image of two draft ids"), std::string::npos) << e;
  }
  {
    ScopedDir dir("arch");
    std::ifstream in(dir.path + "/config.json");
    nlohmann::json j = nlohmann::json::parse(in);
    j["architectures"] = {"LlamaForCausalLM"};
    std::ofstream(dir.path + "/config.json") << j.dump();
    const std::string e = load_error(dir.path);
    EXPECT_NE(e.find("config.json"), std::string::npos) << e;
    EXPECT_NE(e.find("LlamaForCausalLMEagle3"), std::string::npos) << e;
  }
  {
    ScopedDir dir("aux_ids");
    std::ifstream in(dir.path + "/config.json");
    nlohmann::json j = nlohmann::json::parse(in);
    j["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = {0, 1, t.num_hidden_layers};
    std::ofstream(dir.path + "/config.json") << j.dump();
    const std::string e = load_error(dir.path);
    EXPECT_NE(e.find("eagle_aux_hidden_state_layer_ids"), std::string::npos) << e;
  }
}

// tools/eagle3_reference.py writes a draft (its own writer, SpecForge layout) and fp32 PyTorch logits
// of a 13-row prefill plus one chained row. Run where torch exists; skipped otherwise.
// Tolerance: fp32 on both sides over bf16 weights; sums of <= 384 terms in another order: 1e-4
// absolute on logits of RMS ~3, 1e-5 relative-ish on hidden rows of O(1).
TEST(Eagle3, MatchesPyTorchReference) {
  // tests/fixtures/eagle3_ref: written on the GPU host by tools/eagle3_reference.py (torch, fp32 CPU);
  // MLA_EAGLE3_REFERENCE points elsewhere for a fresh one.
  const char* env = std::getenv("MLA_EAGLE3_REFERENCE");
  const std::string dir_s = env ? std::string(env) : std::string(MLA_FIXTURE_DIR) + "/eagle3_ref";
  const char* dir = dir_s.c_str();
  auto ref_file = io::SafetensorsFile::open(std::string(dir) + "/reference.safetensors");
  ASSERT_TRUE(ref_file.is_ok()) << ref_file.status().message();
  const io::SafetensorsFile& ref = ref_file.value();
  auto floats = [&](const char* name) {
    const TensorView v = ref.tensor(name).value();
    return std::vector<float>(v.as<const float>(), v.as<const float>() + v.numel());
  };
  const TensorView tok = ref.tensor("tokens").value();
  const int n = int(tok.numel()) - 1;
  auto be = cpu::make_cpu_backend();
  auto d = load_ok(dir, *be);
  ASSERT_TRUE(d);
  const int32_t* tp = tok.as<const int32_t>();
  std::vector<std::vector<int32_t>> tokens(1, std::vector<int32_t>(tp, tp + n + 1));
  std::vector<std::vector<float>> feats(1, floats("features"));
  DraftRunner r(*d, 1, 8);
  std::vector<float> hidden;
  const std::vector<float> logits = r.step({0}, {n}, tokens, feats, true, &hidden);
  EXPECT_LT(max_abs_diff(logits, floats("prefill_logits")), 1e-4);
  EXPECT_LT(max_abs_diff(hidden, floats("prefill_hidden")), 1e-4);
  const int64_t H = d->hidden_width();
  std::vector<std::vector<float>> own(1, std::vector<float>(size_t((n + 1) * H)));
  std::copy(hidden.end() - H, hidden.end(), own[0].begin() + n * H);
  std::vector<float> hidden2;
  const std::vector<float> logits2 = r.step({0}, {1}, tokens, own, false, &hidden2);
  EXPECT_LT(max_abs_diff(logits2, floats("chained_logits")), 1e-4);
  EXPECT_LT(max_abs_diff(hidden2, floats("chained_hidden")), 1e-4);
}

TEST(Eagle3, RopeScalingVariants) {
  model::Eagle3Config c;
  c.head_dim = 64;
  c.rope_theta = 500000.0;
  const std::vector<float> base = model::eagle3_rope_inv_freq(c);
  ASSERT_EQ(base.size(), 32u);
  EXPECT_FLOAT_EQ(base[0], 1.0f);
  EXPECT_NEAR(base[1], std::pow(500000.0, -2.0 / 64), 1e-7 * base[1]);
  c.rope_type = "linear";
  c.rope_factor = 4.0;
  EXPECT_FLOAT_EQ(model::eagle3_rope_inv_freq(c)[5], base[5] / 4.0f);
  // llama3 (Llama 3.1: factor 8, low 1, high 4, original 8192): short wavelengths kept, long divided.
  c.rope_type = "llama3";
  c.rope_factor = 8.0;
  c.rope_low_freq_factor = 1.0;
  c.rope_high_freq_factor = 4.0;
  c.rope_original_max_position_embeddings = 8192;
  const std::vector<float> l3 = model::eagle3_rope_inv_freq(c);
  EXPECT_EQ(l3[0], base[0]);
  EXPECT_FLOAT_EQ(l3[31], base[31] / 8.0f);
  for (size_t i = 0; i < l3.size(); ++i) EXPECT_LE(l3[i], base[i]);
  EXPECT_EQ(model::eagle3_rope_attention_factor(c), 1.0f);
}

}  // namespace
}  // namespace mla::test
