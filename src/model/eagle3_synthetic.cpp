// Random EAGLE-3 drafts: a fixed small Llama layer over the target width, a d2t over a random
// subset of the target vocabulary. Trade-off: one unsharded file (drafts are small).
#include "model/eagle3_synthetic.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <span>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "io/safetensors_writer.h"
#include "model/synthetic_random.h"

namespace mla::model {

namespace {

using synthetic::mix;
using synthetic::normal;

uint64_t name_key(uint64_t seed, const std::string& s) {  // the name's hash mixed with the seed
  return mix(seed ^ synthetic::name_hash(s));
}

}  // namespace

Status write_synthetic_eagle3(const std::string& dir, const io::ModelConfig& target,
                              const Eagle3SyntheticOptions& opt) {
  const int64_t V = target.vocab_size, H = target.hidden_size, L = target.num_hidden_layers;
  const int64_t Vd = opt.draft_vocab > 0 ? opt.draft_vocab : std::min<int64_t>(V, 64 + V / 4);
  const int64_t always = std::min<int64_t>(V, 64);
  if (Vd < always || Vd > V) return error("eagle3 synthetic: draft_vocab {} outside [{}, {}]", Vd, always, V);
  if (opt.num_attention_heads < 1 || opt.num_key_value_heads < 1 ||
      opt.num_attention_heads % opt.num_key_value_heads != 0 || opt.head_dim < 2 || opt.head_dim % 2 != 0)
    return error("eagle3 synthetic: heads {} / kv heads {} / head_dim {}", opt.num_attention_heads,
                 opt.num_key_value_heads, opt.head_dim);
  std::vector<int> aux = opt.aux_layer_ids;
  if (aux.empty()) aux = {0, int(L / 2), int(L - 1)};
  const int64_t I = opt.intermediate_size > 0 ? opt.intermediate_size : 2 * H;
  const int64_t Hq = opt.num_attention_heads, KVH = opt.num_key_value_heads, D = opt.head_dim;

  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return error("{}: cannot create directory: {}", dir, ec.message());
  nlohmann::json cfg = {
      {"architectures", {"LlamaForCausalLMEagle3"}},
      {"model_type", "llama"},
      {"hidden_size", H},
      {"intermediate_size", I},
      {"num_hidden_layers", 1},
      {"num_attention_heads", Hq},
      {"num_key_value_heads", KVH},
      {"head_dim", D},
      {"hidden_act", "silu"},
      {"rms_norm_eps", 1e-5},
      {"rope_theta", 10000.0},
      {"rope_scaling", nullptr},
      {"max_position_embeddings", target.max_position_embeddings},
      {"vocab_size", V},
      {"draft_vocab_size", Vd},
      {"target_hidden_size", H},
      {"tie_word_embeddings", false},
      {"attention_bias", false},
      {"torch_dtype", "bfloat16"},
      {"eagle_config", {{"eagle_aux_hidden_state_layer_ids", aux}, {"use_aux_hidden_state", true}}}};
  {
    std::ofstream f(dir + "/config.json");
    f << cfg.dump(2) << "\n";
    if (!f) return error("{}/config.json: write failed", dir);
  }

  // The draft vocabulary: ids [0, always) plus a random subset of the rest, ascending.
  std::vector<int64_t> rest(static_cast<size_t>(V - always));
  std::iota(rest.begin(), rest.end(), always);
  std::mt19937_64 rng(mix(opt.seed ^ 0xd2d2d2d2ull));
  std::shuffle(rest.begin(), rest.end(), rng);
  std::vector<int64_t> ids(static_cast<size_t>(always));
  std::iota(ids.begin(), ids.end(), int64_t(0));
  ids.insert(ids.end(), rest.begin(), rest.begin() + (Vd - always));
  std::sort(ids.begin(), ids.end());

  io::SafetensorsWriter w;
  w.set_metadata({{"format", "pt"}, {"generator", "mlaserve eagle3 synthetic (random weights)"}});
  auto bf16 = [&](const std::string& name, std::vector<int64_t> shape, float mean, float std_dev) {
    const uint64_t key = name_key(opt.seed, name);
    w.add(name, DType::BF16, std::move(shape), [=](std::span<uint8_t> b) {
      auto* v = reinterpret_cast<uint16_t*>(b.data());
      for (size_t i = 0; i < b.size() / 2; ++i) v[i] = f32_to_bf16(mean + std_dev * normal(key, i));
    });
  };
  auto linear = [&](const std::string& name, int64_t out, int64_t in, float gain = 1.0f) {
    bf16(name, {out, in}, 0.0f, gain / std::sqrt(float(in)));
  };
  auto norm = [&](const std::string& name) { bf16(name, {H}, 1.0f, 0.1f); };
  if (opt.with_embed_tokens) bf16("embed_tokens.weight", {V, H}, 0.0f, 1.0f);
  linear("fc.weight", H, int64_t(aux.size()) * H);
  norm("midlayer.input_layernorm.weight");
  norm("midlayer.hidden_norm.weight");
  norm("midlayer.post_attention_layernorm.weight");
  linear("midlayer.self_attn.q_proj.weight", Hq * D, 2 * H);
  linear("midlayer.self_attn.k_proj.weight", KVH * D, 2 * H);
  linear("midlayer.self_attn.v_proj.weight", KVH * D, 2 * H);
  linear("midlayer.self_attn.o_proj.weight", H, Hq * D);
  linear("midlayer.mlp.gate_proj.weight", I, H);
  linear("midlayer.mlp.up_proj.weight", I, H);
  linear("midlayer.mlp.down_proj.weight", H, I);
  norm("norm.weight");
  linear("lm_head.weight", Vd, H, 3.0f);  // larger gain: clear top-1 margins, as the target's
  w.add("d2t", DType::I64, {Vd}, [ids](std::span<uint8_t> b) {
    auto* v = reinterpret_cast<int64_t*>(b.data());
    for (size_t d = 0; d < ids.size(); ++d) v[d] = ids[d] - int64_t(d);
  });
  w.add("t2d", DType::BOOL, {V}, [ids](std::span<uint8_t> b) {
    for (int64_t t : ids) b[size_t(t)] = 1;
  });
  return w.write(dir + "/model.safetensors");
}

}  // namespace mla::model
