// config.json of an EAGLE-3 draft -> Eagle3Config, and its RoPE frequencies. Strict: a key the forward
// does not implement (biases, activations, rope types other than default/linear/llama3/yarn) is an
// error naming the key, never approximated. The RoPE math follows transformers'
// `modeling_rope_utils` (Llama's default, linear and llama3 rules; YaRN via model/rope_yarn).
#include <algorithm>
#include <cmath>
#include <numbers>

#include <fmt/ranges.h>

#include "io/json_strict.h"
#include "model/eagle3.h"
#include "model/rope_yarn.h"

namespace mla::model {

namespace {

using nlohmann::json;

constexpr int kMaxWidth = 1 << 20;

// Typed reads of one object: absent keys keep the default; a present key of the wrong type or range
// is an error naming it.
class Reader {
 public:
  Reader(const json& obj, std::string source) : obj_(obj), source_(std::move(source)) {}

  Status read_int(const char* key, int& out, bool required, int lo = 1, int hi = kMaxWidth) const {
    const json* v = find(key);
    if (!v) return required ? error("{}: missing '{}'", source_, key) : Status::ok();
    if (!v->is_number_integer()) return error("{}: '{}' must be an integer, got {}", source_, key, io::json_brief(*v));
    const int64_t x = v->get<int64_t>();
    if (x < lo || x > hi) return error("{}: '{}' = {} outside [{}, {}]", source_, key, x, lo, hi);
    out = int(x);
    return Status::ok();
  }
  Status read_double(const char* key, double& out) const {
    const json* v = find(key);
    if (!v) return Status::ok();
    if (!v->is_number()) return error("{}: '{}' must be a number, got {}", source_, key, io::json_brief(*v));
    out = v->get<double>();
    if (!std::isfinite(out)) return error("{}: '{}' is not finite", source_, key);
    return Status::ok();
  }
  // An optional boolean that must be `want` when present (a feature the forward does not have).
  Status require_bool(const char* key, bool want, const char* why) const {
    const json* v = find(key);
    if (!v || v->is_null()) return Status::ok();
    if (!v->is_boolean()) return error("{}: '{}' must be a boolean, got {}", source_, key, io::json_brief(*v));
    if (v->get<bool>() != want) return error("{}: '{}' = {} is not supported ({})", source_, key, !want, why);
    return Status::ok();
  }
  const json* find(const char* key) const {
    auto it = obj_.find(key);
    return it == obj_.end() ? nullptr : &*it;
  }
  const std::string& source() const { return source_; }

 private:
  const json& obj_;
  std::string source_;
};

Status parse_rope_scaling(const Reader& top, Eagle3Config& c) {
  const json* rs = top.find("rope_scaling");
  if (!rs) rs = top.find("rope_parameters");
  if (!rs || rs->is_null()) return Status::ok();
  if (!rs->is_object()) return error("{}: 'rope_scaling' must be an object or null", top.source());
  const Reader r(*rs, top.source() + " rope_scaling");
  const json* type = r.find("rope_type");
  if (!type) type = r.find("type");
  if (!type || !type->is_string()) return error("{}: 'rope_type' (or 'type') must be a string", r.source());
  c.rope_type = type->get<std::string>();
  if (c.rope_type != "default" && c.rope_type != "linear" && c.rope_type != "llama3" && c.rope_type != "yarn")
    return error("{}: rope type '{}' is not supported (default, linear, llama3, yarn)", r.source(), c.rope_type);
  if (c.rope_type == "default") return Status::ok();
  MLA_RETURN_IF_ERROR(r.read_double("factor", c.rope_factor));
  if (!(c.rope_factor >= 1.0)) return error("{}: 'factor' = {} must be >= 1", r.source(), c.rope_factor);
  if (c.rope_type == "linear") return Status::ok();
  MLA_RETURN_IF_ERROR(r.read_int("original_max_position_embeddings", c.rope_original_max_position_embeddings,
                                 true, 1, 1 << 30));
  if (c.rope_type == "llama3") {
    MLA_RETURN_IF_ERROR(r.read_double("low_freq_factor", c.rope_low_freq_factor));
    MLA_RETURN_IF_ERROR(r.read_double("high_freq_factor", c.rope_high_freq_factor));
    if (!(c.rope_low_freq_factor > 0) || !(c.rope_high_freq_factor > c.rope_low_freq_factor))
      return error("{}: need 0 < low_freq_factor < high_freq_factor, got {} and {}", r.source(),
                   c.rope_low_freq_factor, c.rope_high_freq_factor);
    return Status::ok();
  }
  io::RopeScaling& y = c.yarn;  // yarn
  y.type = io::RopeScalingType::Yarn;
  y.factor = c.rope_factor;
  y.original_max_position_embeddings = c.rope_original_max_position_embeddings;
  MLA_RETURN_IF_ERROR(r.read_double("beta_fast", y.beta_fast));
  MLA_RETURN_IF_ERROR(r.read_double("beta_slow", y.beta_slow));
  double d = 0;
  if (r.find("mscale")) { MLA_RETURN_IF_ERROR(r.read_double("mscale", d)); y.mscale = d; }
  if (r.find("mscale_all_dim")) { MLA_RETURN_IF_ERROR(r.read_double("mscale_all_dim", d)); y.mscale_all_dim = d; }
  if (r.find("attention_factor")) { MLA_RETURN_IF_ERROR(r.read_double("attention_factor", d)); y.attention_factor = d; }
  if (const json* t = r.find("truncate"); t && t->is_boolean()) y.truncate = t->get<bool>();
  if (!(y.beta_fast > 0) || !(y.beta_slow > 0)) return error("{}: beta_fast/beta_slow must be positive", r.source());
  return Status::ok();
}

Status parse_aux_ids(const Reader& top, Eagle3Config& c, const io::ModelConfig& target) {
  const json* ids = nullptr;
  if (const json* ec = top.find("eagle_config"); ec && ec->is_object()) {
    auto it = ec->find("eagle_aux_hidden_state_layer_ids");
    if (it != ec->end()) ids = &*it;
  }
  if (!ids) ids = top.find("eagle_aux_hidden_state_layer_ids");
  const int L = target.num_hidden_layers;
  c.aux_layer_ids.clear();
  if (!ids || ids->is_null()) {
    // sglang's default captures the inputs of layers [2, L/2, L-3], i.e. the outputs of these.
    if (L < 4)
      return error("{}: no eagle_aux_hidden_state_layer_ids and the target has only {} layers", top.source(), L);
    c.aux_layer_ids = {1, L / 2 - 1, L - 4};
    return Status::ok();
  }
  if (!ids->is_array() || ids->empty())
    return error("{}: eagle_aux_hidden_state_layer_ids must be a non-empty list, got {}", top.source(),
                 io::json_brief(*ids));
  for (const json& v : *ids) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= L)
      return error("{}: eagle_aux_hidden_state_layer_ids entry {} is not a layer of the {}-layer target",
                   top.source(), io::json_brief(v), L);
    c.aux_layer_ids.push_back(v.get<int>());
  }
  return Status::ok();
}

}  // namespace

Result<Eagle3Config> parse_eagle3_config(std::string_view json_text, const std::string& source,
                                         const io::ModelConfig& target) {
  auto parsed = io::parse_json_strict(json_text);
  if (!parsed) return error("{}: {}", source, parsed.status().message());
  const json& root = parsed.value();
  if (!root.is_object()) return error("{}: not a JSON object", source);
  const Reader r(root, source);
  Eagle3Config c;
  const json* arch = r.find("architectures");
  if (arch && arch->is_array())
    for (const json& a : *arch)
      if (a.is_string()) c.architectures.push_back(a.get<std::string>());
  if (std::find(c.architectures.begin(), c.architectures.end(), "LlamaForCausalLMEagle3") == c.architectures.end())
    return error("{}: architectures {} is not an EAGLE-3 draft (want LlamaForCausalLMEagle3)", source,
                 arch ? io::json_brief(*arch) : std::string("(missing)"));
  MLA_RETURN_IF_ERROR(r.read_int("hidden_size", c.hidden_size, true));
  MLA_RETURN_IF_ERROR(r.read_int("intermediate_size", c.intermediate_size, true));
  MLA_RETURN_IF_ERROR(r.read_int("num_attention_heads", c.num_attention_heads, true, 1, 65535));
  c.num_key_value_heads = c.num_attention_heads;
  MLA_RETURN_IF_ERROR(r.read_int("num_key_value_heads", c.num_key_value_heads, false, 1, 65535));
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    return error("{}: num_attention_heads {} is not a multiple of num_key_value_heads {}", source,
                 c.num_attention_heads, c.num_key_value_heads);
  if (const json* hd = r.find("head_dim"); hd && !hd->is_null()) {
    MLA_RETURN_IF_ERROR(r.read_int("head_dim", c.head_dim, true));
  } else {
    if (c.hidden_size % c.num_attention_heads != 0)
      return error("{}: no head_dim and hidden_size {} is not a multiple of num_attention_heads {}", source,
                   c.hidden_size, c.num_attention_heads);
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  if (c.head_dim % 2 != 0) return error("{}: head_dim {} must be even (RoPE rotates pairs)", source, c.head_dim);
  MLA_RETURN_IF_ERROR(r.read_int("vocab_size", c.vocab_size, true, 1, 1 << 30));
  c.draft_vocab_size = c.vocab_size;
  MLA_RETURN_IF_ERROR(r.read_int("draft_vocab_size", c.draft_vocab_size, false, 1, 1 << 30));
  c.target_hidden_size = c.hidden_size;
  if (const json* th = r.find("target_hidden_size"); th && !th->is_null())
    MLA_RETURN_IF_ERROR(r.read_int("target_hidden_size", c.target_hidden_size, true));
  MLA_RETURN_IF_ERROR(r.read_double("rms_norm_eps", c.rms_norm_eps));
  MLA_RETURN_IF_ERROR(r.read_double("rope_theta", c.rope_theta));
  if (!(c.rms_norm_eps > 0) || !(c.rope_theta > 1))
    return error("{}: rms_norm_eps {} must be > 0 and rope_theta {} > 1", source, c.rms_norm_eps, c.rope_theta);
  int layers = 1;
  MLA_RETURN_IF_ERROR(r.read_int("num_hidden_layers", layers, false));
  if (layers != 1) return error("{}: num_hidden_layers = {} (an EAGLE-3 draft has exactly 1)", source, layers);
  if (const json* act = r.find("hidden_act"); act && !(act->is_string() && act->get<std::string>() == "silu"))
    return error("{}: hidden_act {} is not supported (silu)", source, io::json_brief(*act));
  MLA_RETURN_IF_ERROR(r.require_bool("attention_bias", false, "no bias tensors are read"));
  MLA_RETURN_IF_ERROR(r.require_bool("mlp_bias", false, "no bias tensors are read"));
  MLA_RETURN_IF_ERROR(r.require_bool("bias", false, "fc.bias is not read"));
  MLA_RETURN_IF_ERROR(r.require_bool("tie_word_embeddings", false, "lm_head covers the draft vocabulary"));
  MLA_RETURN_IF_ERROR(parse_rope_scaling(r, c));
  MLA_RETURN_IF_ERROR(parse_aux_ids(r, c, target));

  // Against the target.
  if (c.vocab_size != target.vocab_size)
    return error("{}: vocab_size {} != the target's {}", source, c.vocab_size, target.vocab_size);
  if (c.draft_vocab_size > c.vocab_size)
    return error("{}: draft_vocab_size {} > vocab_size {}", source, c.draft_vocab_size, c.vocab_size);
  if (c.target_hidden_size != target.hidden_size)
    return error("{}: target_hidden_size {} != the target's hidden_size {}", source, c.target_hidden_size,
                 target.hidden_size);
  return c;
}

std::vector<float> eagle3_rope_inv_freq(const Eagle3Config& cfg) {
  const int dim = cfg.head_dim;
  if (cfg.rope_type == "yarn") {
    io::ModelConfig m;  // rope_yarn reads the rotated width, the base and the scaling only
    m.qk_rope_head_dim = dim;
    m.rope_theta = cfg.rope_theta;
    m.rope_scaling = cfg.yarn;
    return rope_inv_freq(m);
  }
  // HF default: 1 / base^(float(2i) / dim), exponent in fp32 (as model/rope_yarn.cpp), pow in double
  // rounded once.
  std::vector<float> inv(size_t(dim / 2));
  for (int i = 0; i < dim / 2; ++i) {
    const float exponent = float(2 * i) / float(dim);
    inv[size_t(i)] = 1.0f / float(std::pow(cfg.rope_theta, double(exponent)));
  }
  if (cfg.rope_type == "linear") {
    for (float& f : inv) f = float(double(f) / cfg.rope_factor);
  } else if (cfg.rope_type == "llama3") {
    // HF _compute_llama3_parameters: long wavelengths divided by the factor, short kept, a smooth
    // blend in between.
    const double old_len = cfg.rope_original_max_position_embeddings;
    const double low_wavelen = old_len / cfg.rope_low_freq_factor;
    const double high_wavelen = old_len / cfg.rope_high_freq_factor;
    for (float& f : inv) {
      const double wavelen = 2.0 * std::numbers::pi / double(f);
      if (wavelen > low_wavelen) {
        f = float(double(f) / cfg.rope_factor);
      } else if (wavelen >= high_wavelen) {
        const double smooth = (old_len / wavelen - cfg.rope_low_freq_factor) /
                              (cfg.rope_high_freq_factor - cfg.rope_low_freq_factor);
        f = float((1.0 - smooth) * double(f) / cfg.rope_factor + smooth * double(f));
      }
    }
  }
  return inv;
}

float eagle3_rope_attention_factor(const Eagle3Config& cfg) {
  if (cfg.rope_type != "yarn") return 1.0f;
  io::ModelConfig m;
  m.qk_rope_head_dim = cfg.head_dim;
  m.rope_theta = cfg.rope_theta;
  m.rope_scaling = cfg.yarn;
  return rope_attention_factor(m);
}

}  // namespace mla::model
