// config.json -> ModelConfig: typed key reads (one error per config, naming the key), the rope and
// quantization sub-parsers, and validation. Strict by design: a wrong type is an error, never a
// coercion, except that an integral JSON float (4096.0) is accepted where an integer is expected.
#include "io/model_config.h"

#include <cerrno>
#include <climits>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fmt/ranges.h>

#include "io/json_strict.h"

namespace mla::io {

namespace {

using nlohmann::json;

constexpr std::string_view kArchitecture = "DeepseekV3ForCausalLM";
constexpr std::string_view kSupported = "supported: deepseek_v3, kimi_k2 (DeepseekV3ForCausalLM)";
// Upper bounds keep every size product downstream far from int64 overflow; real models are
// orders of magnitude below them.
constexpr int kMaxWidth = 1 << 20;      // any hidden/intermediate/rank/head width
constexpr int kMaxVocab = 1 << 24;
constexpr int kMaxCount = 1 << 16;      // layers, heads, experts, groups
constexpr size_t kMaxConfigBytes = 16u << 20;

// "a string \"7168\"" style rendering of a JSON value for messages, one short line.
std::string brief(const json& v) {
  if (v.is_null() || v.is_object()) return json_brief(v, 48);
  return fmt::format("{} {}", json_type_phrase(v), json_brief(v, 48));
}

// Collapses a message to one line (nlohmann messages can quote input that contains newlines).
std::string one_line(std::string s) {
  for (char& ch : s) {
    if (ch == '\n' || ch == '\r') ch = ' ';
  }
  return s;
}

std::optional<int> json_int(const json& v) {
  if (v.is_number_unsigned()) {
    const auto u = v.get<uint64_t>();
    if (u <= uint64_t(INT_MAX)) return int(u);
    return std::nullopt;
  }
  if (v.is_number_integer()) {
    const auto i = v.get<int64_t>();
    if (i >= INT_MIN && i <= INT_MAX) return int(i);
    return std::nullopt;
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && d == std::trunc(d) && d >= double(INT_MIN) && d <= double(INT_MAX)) return int(d);
  }
  return std::nullopt;
}

enum class Need { Required, Optional };

// Typed reads from JSON objects. Records only the first error, so a config with many problems
// reports the earliest key, and later reads become no-ops returning "absent".
class Reader {
 public:
  explicit Reader(const std::string& source) : source_(source) {}

  bool failed() const { return first_.has_value(); }
  Status status() const { return first_ ? *first_ : Status::ok(); }

  void fail(const std::string& path, const std::string& msg) {
    if (!first_) first_ = Status::error(one_line(fmt::format("{}: {}: {}", source_, path, msg)));
  }

  // obj[key], or nullptr when absent. JSON null counts as absent for optional keys (HF's None).
  const json* get(const json& obj, const char* key, const std::string& path, Need need) {
    if (failed()) return nullptr;
    auto it = obj.find(key);
    if (it == obj.end() || (need == Need::Optional && it->is_null())) {
      if (need == Need::Required) {
        first_ = Status::error(fmt::format("{}: missing required key '{}'", source_, path));
      }
      return nullptr;
    }
    return &*it;
  }

  bool read_int(const json& obj, const char* key, const std::string& path, Need need, int& out) {
    const json* v = get(obj, key, path, need);
    if (!v) return false;
    if (auto i = json_int(*v)) {
      out = *i;
      return true;
    }
    const bool integral_number = v->is_number_integer();
    fail(path, fmt::format("expected an integer{}, got {}", integral_number ? " that fits in 32 bits" : "",
                           brief(*v)));
    return false;
  }

  bool read_double(const json& obj, const char* key, const std::string& path, Need need, double& out) {
    const json* v = get(obj, key, path, need);
    if (!v) return false;
    // Overflowing literals (1e400) parse as inf; no key of ours means anything non-finite.
    if (v->is_number() && std::isfinite(v->get<double>())) {
      out = v->get<double>();
      return true;
    }
    fail(path, fmt::format("expected a finite number, got {}", brief(*v)));
    return false;
  }

  bool read_bool(const json& obj, const char* key, const std::string& path, Need need, bool& out) {
    const json* v = get(obj, key, path, need);
    if (!v) return false;
    if (v->is_boolean()) {
      out = v->get<bool>();
      return true;
    }
    fail(path, fmt::format("expected a boolean, got {}", brief(*v)));
    return false;
  }

  bool read_string(const json& obj, const char* key, const std::string& path, Need need, std::string& out) {
    const json* v = get(obj, key, path, need);
    if (!v) return false;
    if (v->is_string()) {
      out = v->get<std::string>();
      return true;
    }
    fail(path, fmt::format("expected a string, got {}", brief(*v)));
    return false;
  }

  bool read_string_list(const json& obj, const char* key, const std::string& path, Need need,
                        std::vector<std::string>& out) {
    const json* v = get(obj, key, path, need);
    if (!v) return false;
    if (!v->is_array()) {
      fail(path, fmt::format("expected a list of strings, got {}", brief(*v)));
      return false;
    }
    out.clear();
    for (const json& e : *v) {
      if (!e.is_string()) {
        fail(path, fmt::format("expected a list of strings, got an element {}", brief(e)));
        return false;
      }
      out.push_back(e.get<std::string>());
    }
    return true;
  }

  // Object-valued key; nullptr when absent/null (optional) or on a type error.
  const json* get_object(const json& obj, const char* key, const std::string& path, Need need) {
    const json* v = get(obj, key, path, need);
    if (!v) return nullptr;
    if (!v->is_object()) {
      fail(path, fmt::format("expected an object, got {}", brief(*v)));
      return nullptr;
    }
    return v;
  }

 private:
  const std::string& source_;
  std::optional<Status> first_;
};

// ---- rope ---------------------------------------------------------------------------------------

// Reads either form: classic `rope_scaling` {type|rope_type, factor, ...} or v5 `rope_parameters`
// {rope_type, rope_theta, factor, ...}. `path` is the key it came from, for messages.
void parse_rope(Reader& r, const json& root, const json& rope, const std::string& path, ModelConfig& c) {
  std::string type;
  if (!r.read_string(rope, "rope_type", path + ".rope_type", Need::Optional, type) &&
      !r.read_string(rope, "type", path + ".type", Need::Optional, type)) {
    if (!r.failed()) r.fail(path, "missing 'type' (or 'rope_type')");
    return;
  }
  if (type == "default") return;  // plain RoPE; other keys are ignored like HF does
  if (type != "yarn") {
    r.fail(path + ".type", fmt::format("unsupported rope scaling '{}' (supported: yarn, default)", type));
    return;
  }
  RopeScaling& y = c.rope_scaling;
  y.type = RopeScalingType::Yarn;
  // L0: the dict's key, else HF v5's fallback (top-level key of that name, else max positions).
  if (!r.read_int(rope, "original_max_position_embeddings", path + ".original_max_position_embeddings",
                  Need::Optional, y.original_max_position_embeddings) &&
      !r.read_int(root, "original_max_position_embeddings", "original_max_position_embeddings", Need::Optional,
                  y.original_max_position_embeddings)) {
    y.original_max_position_embeddings = c.max_position_embeddings;
  }
  if (r.failed()) return;
  if (y.original_max_position_embeddings <= 0) {
    r.fail(path + ".original_max_position_embeddings",
           fmt::format("must be positive, got {}", y.original_max_position_embeddings));
    return;
  }
  // HF: a missing factor is max_position_embeddings / original_max_position_embeddings.
  if (!r.read_double(rope, "factor", path + ".factor", Need::Optional, y.factor)) {
    y.factor = double(c.max_position_embeddings) / double(y.original_max_position_embeddings);
  }
  // HF reads `get("beta_fast") or 32`: a 0 (falsy) also selects the default.
  if (!r.read_double(rope, "beta_fast", path + ".beta_fast", Need::Optional, y.beta_fast) || y.beta_fast == 0) {
    y.beta_fast = 32.0;
  }
  if (!r.read_double(rope, "beta_slow", path + ".beta_slow", Need::Optional, y.beta_slow) || y.beta_slow == 0) {
    y.beta_slow = 1.0;
  }
  double d = 0;
  if (r.read_double(rope, "mscale", path + ".mscale", Need::Optional, d)) y.mscale = d;
  if (r.read_double(rope, "mscale_all_dim", path + ".mscale_all_dim", Need::Optional, d)) y.mscale_all_dim = d;
  if (r.read_double(rope, "attention_factor", path + ".attention_factor", Need::Optional, d)) {
    y.attention_factor = d;
  }
  r.read_bool(rope, "truncate", path + ".truncate", Need::Optional, y.truncate);
  if (r.failed()) return;

  if (!(y.factor >= 1.0) || !std::isfinite(y.factor)) {
    r.fail(path + ".factor", fmt::format("must be >= 1 (YaRN extends context), got {}", y.factor));
  } else if (!(y.beta_fast > 0) || !(y.beta_slow > 0)) {
    r.fail(path + (y.beta_fast > 0 ? ".beta_slow" : ".beta_fast"),
           fmt::format("must be positive, got {}", y.beta_fast > 0 ? y.beta_slow : y.beta_fast));
  } else if (y.mscale && !(*y.mscale >= 0)) {
    r.fail(path + ".mscale", fmt::format("must be >= 0, got {}", *y.mscale));
  } else if (y.mscale_all_dim && !(*y.mscale_all_dim >= 0)) {
    r.fail(path + ".mscale_all_dim", fmt::format("must be >= 0, got {}", *y.mscale_all_dim));
  } else if (y.attention_factor && !(*y.attention_factor > 0)) {
    r.fail(path + ".attention_factor", fmt::format("must be positive, got {}", *y.attention_factor));
  }
}

// ---- quantization -------------------------------------------------------------------------------

void parse_fp8(Reader& r, const json& q, QuantizationConfig& out) {
  const std::string p = "quantization_config";
  out.method = QuantMethod::Fp8Block;
  out.fmt = "e4m3";
  out.activation_scheme = "dynamic";
  r.read_string(q, "fmt", p + ".fmt", Need::Optional, out.fmt);
  r.read_string(q, "activation_scheme", p + ".activation_scheme", Need::Optional, out.activation_scheme);
  const json* bs = r.get(q, "weight_block_size", p + ".weight_block_size", Need::Required);
  if (r.failed()) return;
  if (out.fmt != "e4m3") {
    r.fail(p + ".fmt", fmt::format("unsupported fp8 format '{}' (supported: e4m3)", out.fmt));
    return;
  }
  if (out.activation_scheme != "dynamic") {
    r.fail(p + ".activation_scheme",
           fmt::format("unsupported '{}' (supported: dynamic; static scales are not implemented)",
                       out.activation_scheme));
    return;
  }
  std::optional<int> b0, b1;
  if (bs->is_array() && bs->size() == 2) {
    b0 = json_int((*bs)[0]);
    b1 = json_int((*bs)[1]);
  }
  if (!b0 || !b1 || *b0 != 128 || *b1 != 128) {
    r.fail(p + ".weight_block_size", fmt::format("unsupported block size {} (supported: [128,128])", brief(*bs)));
    return;
  }
  out.weight_block_size = {*b0, *b1};
}

// One config group of compressed-tensors: only symmetric int4, group 32, weight-only.
void parse_ct_group(Reader& r, const json& g, const std::string& gp, QuantizationConfig& out) {
  std::vector<std::string> targets;
  r.read_string_list(g, "targets", gp + ".targets", Need::Required, targets);
  const json* w = r.get_object(g, "weights", gp + ".weights", Need::Required);
  if (r.failed()) return;
  const json* act = r.get(g, "input_activations", gp + ".input_activations", Need::Optional);
  if (act) {
    r.fail(gp + ".input_activations",
           fmt::format("activation quantization is not supported (weight-only W4A16), got {}", brief(*act)));
    return;
  }
  const std::string wp = gp + ".weights";
  int num_bits = 0, group_size = 0;
  bool symmetric = false;
  std::string type, strategy;
  r.read_int(*w, "num_bits", wp + ".num_bits", Need::Required, num_bits);
  r.read_string(*w, "type", wp + ".type", Need::Required, type);
  r.read_bool(*w, "symmetric", wp + ".symmetric", Need::Required, symmetric);
  r.read_string(*w, "strategy", wp + ".strategy", Need::Required, strategy);
  r.read_int(*w, "group_size", wp + ".group_size", Need::Required, group_size);
  const json* actorder = r.get(*w, "actorder", wp + ".actorder", Need::Optional);
  if (r.failed()) return;
  if (num_bits != 4) {
    r.fail(wp + ".num_bits", fmt::format("unsupported bit width {} (supported: 4)", num_bits));
  } else if (type != "int") {
    r.fail(wp + ".type", fmt::format("unsupported type '{}' (supported: int)", type));
  } else if (!symmetric) {
    r.fail(wp + ".symmetric", "asymmetric (zero-point) int4 is not supported (supported: true)");
  } else if (strategy != "group") {
    r.fail(wp + ".strategy", fmt::format("unsupported strategy '{}' (supported: group)", strategy));
  } else if (group_size != 32) {
    r.fail(wp + ".group_size", fmt::format("unsupported group size {} (supported: 32)", group_size));
  } else if (actorder) {
    r.fail(wp + ".actorder", fmt::format("activation reordering is not supported, got {}", brief(*actorder)));
  }
  if (r.failed()) return;
  out.num_bits = num_bits;
  out.group_size = group_size;
  out.targets.insert(out.targets.end(), targets.begin(), targets.end());
}

void parse_compressed_tensors(Reader& r, const json& q, QuantizationConfig& out) {
  const std::string p = "quantization_config";
  out.method = QuantMethod::Int4PackGroup;
  r.read_string(q, "quantization_status", p + ".quantization_status", Need::Optional, out.quantization_status);
  r.read_string_list(q, "ignore", p + ".ignore", Need::Optional, out.ignore);
  const json* groups = r.get_object(q, "config_groups", p + ".config_groups", Need::Required);
  if (r.failed()) return;
  if (groups->empty()) {
    r.fail(p + ".config_groups", "expected at least one group");
    return;
  }
  // `format` lives at the top level (older writers) or per group (newer); all must agree.
  std::string format;
  r.read_string(q, "format", p + ".format", Need::Optional, format);
  for (const auto& [name, g] : groups->items()) {
    const std::string gp = p + ".config_groups." + name;
    if (!g.is_object()) {
      r.fail(gp, fmt::format("expected an object, got {}", brief(g)));
      return;
    }
    std::string gformat;
    if (r.read_string(g, "format", gp + ".format", Need::Optional, gformat)) {
      if (!format.empty() && gformat != format) {
        r.fail(gp + ".format", fmt::format("'{}' differs from the top-level format '{}'", gformat, format));
        return;
      }
      format = gformat;
    }
    parse_ct_group(r, g, gp, out);
    if (r.failed()) return;
  }
  if (format.empty()) {
    r.fail(p + ".format", "missing (expected \"pack-quantized\")");
  } else if (format != "pack-quantized") {
    r.fail(p + ".format", fmt::format("unsupported format '{}' (supported: pack-quantized)", format));
  }
  out.format = format;
}

void parse_quantization(Reader& r, const json& root, QuantizationConfig& out) {
  const json* q = r.get_object(root, "quantization_config", "quantization_config", Need::Optional);
  if (!q) return;
  std::string method;
  if (!r.read_string(*q, "quant_method", "quantization_config.quant_method", Need::Required, method)) return;
  if (method == "fp8") {
    parse_fp8(r, *q, out);
  } else if (method == "compressed-tensors") {
    parse_compressed_tensors(r, *q, out);
  } else {
    r.fail("quantization_config.quant_method",
           fmt::format("unsupported '{}' (supported: fp8, compressed-tensors)", method));
  }
}

// ---- token ids ----------------------------------------------------------------------------------

void parse_eos(Reader& r, const json& root, std::vector<int>& out) {
  const json* v = r.get(root, "eos_token_id", "eos_token_id", Need::Optional);
  if (!v) return;
  if (auto i = json_int(*v)) {
    out = {*i};
    return;
  }
  if (v->is_array()) {
    for (const json& e : *v) {
      auto i = json_int(e);
      if (!i) {
        r.fail("eos_token_id", fmt::format("expected an integer or a list of integers, got an element {}", brief(e)));
        return;
      }
      out.push_back(*i);
    }
    return;
  }
  r.fail("eos_token_id", fmt::format("expected an integer or a list of integers, got {}", brief(*v)));
}

// ---- top level ----------------------------------------------------------------------------------

Result<ModelConfig> parse_impl(std::string_view text, const std::string& source) {
  // Strict parse: duplicate keys and absurd nesting are errors, not last-wins.
  Result<json> parsed = parse_json_strict(text);
  if (!parsed.is_ok()) {
    return Status::error(one_line(fmt::format("{}: invalid JSON: {}", source, parsed.status().message())));
  }
  const json root = std::move(parsed).value();
  if (!root.is_object()) {
    return Status::error(fmt::format("{}: expected a JSON object at the top level, got {}", source, brief(root)));
  }
  Reader r(source);
  ModelConfig c;
  // model_type first: for a foreign model every later message would be noise.
  if (r.read_string(root, "model_type", "model_type", Need::Required, c.model_type) &&
      c.model_type != "deepseek_v3" && c.model_type != "kimi_k2") {
    r.fail("model_type", fmt::format("unsupported '{}' ({})", c.model_type, kSupported));
  }
  if (!r.read_string_list(root, "architectures", "architectures", Need::Optional, c.architectures) &&
      !r.failed()) {
    c.architectures = {std::string(kArchitecture)};
  }
  r.read_int(root, "vocab_size", "vocab_size", Need::Required, c.vocab_size);
  r.read_int(root, "hidden_size", "hidden_size", Need::Required, c.hidden_size);
  r.read_int(root, "intermediate_size", "intermediate_size", Need::Required, c.intermediate_size);
  r.read_int(root, "moe_intermediate_size", "moe_intermediate_size", Need::Required, c.moe_intermediate_size);
  r.read_int(root, "num_hidden_layers", "num_hidden_layers", Need::Required, c.num_hidden_layers);
  r.read_int(root, "num_attention_heads", "num_attention_heads", Need::Required, c.num_attention_heads);
  if (!r.read_int(root, "num_key_value_heads", "num_key_value_heads", Need::Optional, c.num_key_value_heads)) {
    c.num_key_value_heads = c.num_attention_heads;  // HF's backward-compatible default
  }
  // q_lora_rank must be present: null selects the single-q_proj variant, absence is ambiguous.
  if (const json* q = r.get(root, "q_lora_rank", "q_lora_rank", Need::Required); q && !q->is_null()) {
    int rank = 0;
    if (r.read_int(root, "q_lora_rank", "q_lora_rank", Need::Required, rank)) c.q_lora_rank = rank;
  }
  r.read_int(root, "kv_lora_rank", "kv_lora_rank", Need::Required, c.kv_lora_rank);
  r.read_int(root, "qk_nope_head_dim", "qk_nope_head_dim", Need::Required, c.qk_nope_head_dim);
  r.read_int(root, "qk_rope_head_dim", "qk_rope_head_dim", Need::Required, c.qk_rope_head_dim);
  r.read_int(root, "v_head_dim", "v_head_dim", Need::Required, c.v_head_dim);
  r.read_int(root, "n_routed_experts", "n_routed_experts", Need::Required, c.n_routed_experts);
  r.read_int(root, "n_shared_experts", "n_shared_experts", Need::Required, c.n_shared_experts);
  r.read_int(root, "num_experts_per_tok", "num_experts_per_tok", Need::Required, c.num_experts_per_tok);
  r.read_int(root, "n_group", "n_group", Need::Required, c.n_group);
  r.read_int(root, "topk_group", "topk_group", Need::Required, c.topk_group);
  r.read_bool(root, "norm_topk_prob", "norm_topk_prob", Need::Required, c.norm_topk_prob);
  r.read_double(root, "routed_scaling_factor", "routed_scaling_factor", Need::Required, c.routed_scaling_factor);
  // Keys HF hard-codes (it ignores them); the defaults are the only supported values.
  c.scoring_func = "sigmoid";
  c.topk_method = "noaux_tc";
  c.hidden_act = "silu";
  r.read_string(root, "scoring_func", "scoring_func", Need::Optional, c.scoring_func);
  r.read_string(root, "topk_method", "topk_method", Need::Optional, c.topk_method);
  r.read_int(root, "moe_layer_freq", "moe_layer_freq", Need::Optional, c.moe_layer_freq);
  r.read_int(root, "first_k_dense_replace", "first_k_dense_replace", Need::Required, c.first_k_dense_replace);
  r.read_double(root, "rms_norm_eps", "rms_norm_eps", Need::Required, c.rms_norm_eps);
  r.read_string(root, "hidden_act", "hidden_act", Need::Optional, c.hidden_act);
  r.read_bool(root, "attention_bias", "attention_bias", Need::Optional, c.attention_bias);
  r.read_int(root, "max_position_embeddings", "max_position_embeddings", Need::Required, c.max_position_embeddings);
  r.read_bool(root, "tie_word_embeddings", "tie_word_embeddings", Need::Optional, c.tie_word_embeddings);
  int bos = 0;
  if (r.read_int(root, "bos_token_id", "bos_token_id", Need::Optional, bos)) c.bos_token_id = bos;
  parse_eos(r, root, c.eos_token_id);
  r.read_int(root, "num_nextn_predict_layers", "num_nextn_predict_layers", Need::Optional,
             c.num_nextn_predict_layers);
  r.read_bool(root, "rope_interleave", "rope_interleave", Need::Optional, c.rope_interleave);
  if (r.failed()) return r.status();

  // RoPE: prefer v5 `rope_parameters` over classic `rope_scaling` when both exist; rope_theta may
  // live only inside rope_parameters, and wins there (HF v5 setdefault semantics).
  const json* params = r.get_object(root, "rope_parameters", "rope_parameters", Need::Optional);
  const json* scaling = params ? nullptr : r.get_object(root, "rope_scaling", "rope_scaling", Need::Optional);
  if (r.failed()) return r.status();
  if (!(params && r.read_double(*params, "rope_theta", "rope_parameters.rope_theta", Need::Optional, c.rope_theta))) {
    r.read_double(root, "rope_theta", "rope_theta", Need::Required, c.rope_theta);
  }
  if (params) parse_rope(r, root, *params, "rope_parameters", c);
  if (scaling) parse_rope(r, root, *scaling, "rope_scaling", c);
  parse_quantization(r, root, c.quantization_config);
  if (r.failed()) return r.status();

  MLA_RETURN_IF_ERROR(validate_model_config(c, source));
  return c;
}

Status range_error(const std::string& source, const char* key, int64_t value, int64_t lo, int64_t hi) {
  if (value < lo) return error("{}: {}: must be >= {}, got {}", source, key, lo, value);
  return error("{}: {}: {} exceeds the supported maximum {}", source, key, value, hi);
}

}  // namespace

Status validate_model_config(const ModelConfig& c, const std::string& source) {
  if (c.model_type != "deepseek_v3" && c.model_type != "kimi_k2") {
    return error("{}: model_type: unsupported '{}' ({})", source, c.model_type, kSupported);
  }
  bool arch_ok = false;
  for (const auto& a : c.architectures) arch_ok = arch_ok || a == kArchitecture;
  if (!arch_ok) {
    return error("{}: architectures: unsupported [{}] ({})", source, fmt::join(c.architectures, ", "), kSupported);
  }
  struct Bound {
    const char* key;
    int64_t value, lo, hi;
  };
  const Bound bounds[] = {
      {"vocab_size", c.vocab_size, 1, kMaxVocab},
      {"hidden_size", c.hidden_size, 1, kMaxWidth},
      {"intermediate_size", c.intermediate_size, 1, kMaxWidth},
      {"moe_intermediate_size", c.moe_intermediate_size, 1, kMaxWidth},
      {"num_hidden_layers", c.num_hidden_layers, 1, kMaxCount},
      {"num_attention_heads", c.num_attention_heads, 1, kMaxCount},
      {"num_key_value_heads", c.num_key_value_heads, 1, kMaxCount},
      {"q_lora_rank", c.q_lora_rank.value_or(1), 1, kMaxWidth},
      {"kv_lora_rank", c.kv_lora_rank, 1, kMaxWidth},
      {"qk_nope_head_dim", c.qk_nope_head_dim, 1, kMaxWidth},
      {"qk_rope_head_dim", c.qk_rope_head_dim, 2, kMaxWidth},
      {"v_head_dim", c.v_head_dim, 1, kMaxWidth},
      {"n_routed_experts", c.n_routed_experts, 1, kMaxCount},
      {"n_shared_experts", c.n_shared_experts, 0, kMaxCount},
      {"num_experts_per_tok", c.num_experts_per_tok, 1, kMaxCount},
      {"n_group", c.n_group, 1, kMaxCount},
      {"topk_group", c.topk_group, 1, kMaxCount},
      {"first_k_dense_replace", c.first_k_dense_replace, 0, kMaxCount},
      {"max_position_embeddings", c.max_position_embeddings, 1, INT_MAX},
      {"num_nextn_predict_layers", c.num_nextn_predict_layers, 0, 16},
  };
  for (const Bound& b : bounds) {
    if (b.value < b.lo || b.value > b.hi) return range_error(source, b.key, b.value, b.lo, b.hi);
  }
  if (c.qk_rope_head_dim % 2 != 0) {
    return error("{}: qk_rope_head_dim: must be even (RoPE rotates pairs), got {}", source, c.qk_rope_head_dim);
  }
  if (c.first_k_dense_replace > c.num_hidden_layers) {
    return error("{}: first_k_dense_replace: {} exceeds num_hidden_layers {}", source, c.first_k_dense_replace,
                 c.num_hidden_layers);
  }
  if (c.num_experts_per_tok > c.n_routed_experts) {
    return error("{}: num_experts_per_tok: {} exceeds n_routed_experts {}", source, c.num_experts_per_tok,
                 c.n_routed_experts);
  }
  if (c.n_routed_experts % c.n_group != 0) {
    return error("{}: n_group: {} does not divide n_routed_experts {}", source, c.n_group, c.n_routed_experts);
  }
  const int per_group = c.n_routed_experts / c.n_group;
  if (c.n_group > 1 && per_group < 2) {
    return error("{}: n_group: {} groups of {} expert(s); a group score sums its top-2 experts, so each group "
                 "needs >= 2", source, c.n_group, per_group);
  }
  if (c.topk_group > c.n_group) {
    return error("{}: topk_group: {} exceeds n_group {}", source, c.topk_group, c.n_group);
  }
  if (int64_t(c.topk_group) * per_group < c.num_experts_per_tok) {
    return error("{}: topk_group: {} groups x {} experts leave fewer than num_experts_per_tok {} candidates",
                 source, c.topk_group, per_group, c.num_experts_per_tok);
  }
  if (!(c.routed_scaling_factor > 0) || !std::isfinite(c.routed_scaling_factor)) {
    return error("{}: routed_scaling_factor: must be positive, got {}", source, c.routed_scaling_factor);
  }
  if (!(c.rms_norm_eps > 0) || !std::isfinite(c.rms_norm_eps)) {
    return error("{}: rms_norm_eps: must be positive, got {}", source, c.rms_norm_eps);
  }
  if (!(c.rope_theta > 1) || !std::isfinite(c.rope_theta)) {
    return error("{}: rope_theta: must be > 1, got {}", source, c.rope_theta);
  }
  if (c.scoring_func != "sigmoid") {
    return error("{}: scoring_func: unsupported '{}' (supported: sigmoid)", source, c.scoring_func);
  }
  if (c.topk_method != "noaux_tc") {
    return error("{}: topk_method: unsupported '{}' (supported: noaux_tc)", source, c.topk_method);
  }
  if (c.moe_layer_freq != 1) {
    return error("{}: moe_layer_freq: unsupported {} (supported: 1)", source, c.moe_layer_freq);
  }
  if (c.hidden_act != "silu") {
    return error("{}: hidden_act: unsupported '{}' (supported: silu)", source, c.hidden_act);
  }
  if (c.attention_bias) return error("{}: attention_bias: true is not supported (MLA has no biases)", source);
  if (c.bos_token_id && (*c.bos_token_id < 0 || *c.bos_token_id >= c.vocab_size)) {
    return error("{}: bos_token_id: {} is outside the vocabulary [0, {})", source, *c.bos_token_id, c.vocab_size);
  }
  for (int id : c.eos_token_id) {
    if (id < 0 || id >= c.vocab_size) {
      return error("{}: eos_token_id: {} is outside the vocabulary [0, {})", source, id, c.vocab_size);
    }
  }
  const RopeScaling& y = c.rope_scaling;
  if (y.type == RopeScalingType::Yarn) {
    if (!(y.factor >= 1) || !std::isfinite(y.factor)) {
      return error("{}: rope_scaling.factor: must be >= 1, got {}", source, y.factor);
    }
    if (y.original_max_position_embeddings <= 0) {
      return error("{}: rope_scaling.original_max_position_embeddings: must be positive, got {}", source,
                   y.original_max_position_embeddings);
    }
    if (!(y.beta_fast > 0) || !(y.beta_slow > 0)) {
      return error("{}: rope_scaling.beta_fast/beta_slow: must be positive, got {}/{}", source, y.beta_fast,
                   y.beta_slow);
    }
    if ((y.mscale && !(*y.mscale >= 0)) || (y.mscale_all_dim && !(*y.mscale_all_dim >= 0))) {
      return error("{}: rope_scaling.mscale/mscale_all_dim: must be >= 0", source);
    }
    if (y.attention_factor && !(*y.attention_factor > 0)) {
      return error("{}: rope_scaling.attention_factor: must be positive, got {}", source, *y.attention_factor);
    }
  }
  const QuantizationConfig& q = c.quantization_config;
  if (q.method == QuantMethod::Fp8Block && (q.weight_block_size != std::array<int, 2>{128, 128} || q.fmt != "e4m3")) {
    return error("{}: quantization_config.weight_block_size: only e4m3 [128,128] is supported", source);
  }
  if (q.method == QuantMethod::Int4PackGroup && (q.num_bits != 4 || q.group_size != 32)) {
    return error("{}: quantization_config.config_groups: only int4 group 32 is supported, got {} bits group {}",
                 source, q.num_bits, q.group_size);
  }
  return Status::ok();
}

Result<ModelConfig> parse_model_config(std::string_view json_text, const std::string& source_for_errors) {
  // Belt and braces: the reads above do not throw, but allocation and library edge cases might.
  try {
    return parse_impl(json_text, source_for_errors);
  } catch (const std::exception& e) {
    return Status::error(one_line(fmt::format("{}: {}", source_for_errors, e.what())));
  }
}

Result<ModelConfig> load_model_config(const std::string& model_dir) {
  std::string path = model_dir;
  if (!path.empty() && path.back() != '/') path += '/';
  path += "config.json";
  std::ifstream in(path, std::ios::binary);
  if (!in) return error("{}: cannot open: {}", path, std::strerror(errno));
  std::ostringstream buf;
  buf << in.rdbuf();
  if (in.bad()) return error("{}: read failed", path);
  std::string text = std::move(buf).str();
  if (text.size() > kMaxConfigBytes) {
    return error("{}: {} bytes is larger than any plausible config.json (limit {})", path, text.size(),
                 kMaxConfigBytes);
  }
  return parse_model_config(text, path);
}

std::string_view rope_scaling_type_name(RopeScalingType t) {
  switch (t) {
    case RopeScalingType::None: return "none";
    case RopeScalingType::Yarn: return "yarn";
  }
  return "?";
}

std::string_view quant_method_name(QuantMethod m) {
  switch (m) {
    case QuantMethod::None: return "none";
    case QuantMethod::Fp8Block: return "fp8";
    case QuantMethod::Int4PackGroup: return "int4";
  }
  return "?";
}

}  // namespace mla::io
