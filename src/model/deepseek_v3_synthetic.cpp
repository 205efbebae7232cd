#include "model/deepseek_v3_synthetic.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "model/deepseek_v3_tensors.h"
#include "model/synthetic_random.h"
#include "ops/weight.h"

namespace mla::model {

namespace {

using synthetic::mix;
using synthetic::name_hash;
using synthetic::normal;
using synthetic::uniform01;

template <typename T> std::span<T> as(std::span<uint8_t> bytes) {
  return {reinterpret_cast<T*>(bytes.data()), bytes.size() / sizeof(T)};
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

Status write_synthetic_checkpoint(const io::ModelConfig& cfg, const std::string& dir, const SyntheticOptions& opt) {
  MLA_RETURN_IF_ERROR(io::validate_model_config(cfg, "make-model"));
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return error("{}: cannot create directory: {}", dir, ec.message());
  {
    std::ofstream f(dir + "/config.json");
    f << io::model_config_to_json(cfg).dump(2) << "\n";
    if (!f) return error("{}/config.json: write failed", dir);
  }

  io::ShardedCheckpointWriter w(opt.max_shard_bytes, opt.force_sharding);
  w.set_metadata({{"format", "pt"}, {"generator", "mlaserve make-model (random weights)"}});
  w.set_progress(opt.progress);
  // The main model, then the num_nextn_predict_layers MTP blocks (layers L >= num_hidden_layers).
  std::vector<TensorSpec> specs = deepseek_v3_tensor_specs(cfg);
  for (TensorSpec& spec : deepseek_v3_mtp_tensor_specs(cfg)) specs.push_back(std::move(spec));
  for (const TensorSpec& spec : specs) {
    const uint64_t key = mix(opt.seed ^ name_hash(spec.name));
    switch (spec.role) {
      case TensorRole::Embedding:
        w.add(spec.name, DType::BF16, spec.shape, [key](std::span<uint8_t> b) {
          auto v = as<uint16_t>(b);
          for (size_t i = 0; i < v.size(); ++i) v[i] = f32_to_bf16(normal(key, i));
        });
        continue;
      case TensorRole::Norm:
        w.add(spec.name, DType::BF16, spec.shape, [key](std::span<uint8_t> b) {
          auto v = as<uint16_t>(b);
          for (size_t i = 0; i < v.size(); ++i) v[i] = f32_to_bf16(1.0f + 0.1f * normal(key, i));
        });
        continue;
      case TensorRole::RouterBias:
        // Small positive selection bias, as trained DeepSeek routers carry.
        w.add(spec.name, DType::F32, spec.shape, [key](std::span<uint8_t> b) {
          auto v = as<float>(b);
          for (size_t i = 0; i < v.size(); ++i) v[i] = 0.05f + 0.1f * uniform01(key, i);
        });
        continue;
      case TensorRole::Router:
      case TensorRole::Linear:
        break;
    }
    const int64_t out = spec.shape[0], in = spec.shape[1];
    // lm_head (and MTP's shared_head.head) get a larger gain so random logits have clear top-1 margins.
    const bool head = spec.name.starts_with("lm_head") || spec.name.ends_with("shared_head.head.weight");
    const float std_dev = (head ? 3.0f : 1.0f) / std::sqrt(float(in));
    switch (spec.role == TensorRole::Router ? StoredFormat::Dense : stored_format(cfg, spec)) {
      case StoredFormat::Dense:
        w.add(spec.name, DType::BF16, spec.shape, [key, std_dev](std::span<uint8_t> b) {
          auto v = as<uint16_t>(b);
          for (size_t i = 0; i < v.size(); ++i) v[i] = f32_to_bf16(std_dev * normal(key, i));
        });
        break;
      case StoredFormat::Fp8Block: {
        // Per-block scale chosen first (deterministic), so weight and scale tensors are generated
        // independently: W = fp8(q) * scale with |q| <= 448 covering ~4 standard deviations.
        const int64_t sc = ceil_div(in, ops::kFp8BlockSize);
        auto scale = [key, std_dev](int64_t bo, int64_t bi, int64_t cols) {
          return std_dev * 4.0f / 448.0f * (0.75f + 0.5f * uniform01(~key, uint64_t(bo * cols + bi)));
        };
        w.add(spec.name, DType::F8_E4M3, spec.shape, [=](std::span<uint8_t> b) {
          for (int64_t o = 0; o < out; ++o)
            for (int64_t i = 0; i < in; ++i) {
              const float s = scale(o / ops::kFp8BlockSize, i / ops::kFp8BlockSize, sc);
              b[size_t(o * in + i)] = f32_to_fp8e4m3(std_dev * normal(key, uint64_t(o * in + i)) / s);
            }
        });
        w.add(spec.name + "_scale_inv", DType::F32, {ceil_div(out, ops::kFp8BlockSize), sc}, [=](std::span<uint8_t> b) {
          auto v = as<float>(b);
          for (size_t k = 0; k < v.size(); ++k) v[k] = scale(int64_t(k) / sc, int64_t(k) % sc, sc);
        });
        break;
      }
      case StoredFormat::Int4Group: {
        const std::string module = module_name(spec.name);
        const int64_t words = ceil_div(in, 8), groups = ceil_div(in, ops::kInt4GroupSize);
        w.add(module + ".weight_packed", DType::I32, {out, words}, [=](std::span<uint8_t> b) {
          auto v = as<uint32_t>(b);
          for (int64_t o = 0; o < out; ++o)
            for (int64_t i = 0; i < in; ++i) {
              const float q = std::nearbyint(2.5f * normal(key, uint64_t(o * in + i)));
              const uint32_t nib = uint32_t(std::clamp(q, -8.0f, 7.0f) + 8.0f);
              v[size_t(o * words + i / 8)] |= nib << (4 * (i % 8));
            }
        });
        w.add(module + ".weight_scale", DType::BF16, {out, groups}, [=](std::span<uint8_t> b) {
          auto v = as<uint16_t>(b);
          for (size_t k = 0; k < v.size(); ++k) v[k] = f32_to_bf16(std_dev / 2.5f * (0.8f + 0.4f * uniform01(~key, k)));
        });
        w.add(module + ".weight_shape", DType::I64, {2}, [=](std::span<uint8_t> b) {
          auto v = as<int64_t>(b);
          v[0] = out;
          v[1] = in;
        });
        break;
      }
    }
  }
  return w.write(dir);
}

}  // namespace mla::model
