#include "model/deepseek_v3_synthetic.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include <omp.h>

#include "model/deepseek_v3_tensors.h"
#include "model/synthetic_random.h"
#include "ops/weight.h"

namespace mla::model {

namespace {

using synthetic::fp8e4m3_rne;
using synthetic::mix;
using synthetic::name_hash;
using synthetic::normal;
using synthetic::uniform01;

template <typename T> std::span<T> as(std::span<uint8_t> bytes) {
  return {reinterpret_cast<T*>(bytes.data()), bytes.size() / sizeof(T)};
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Work items per OpenMP chunk: ~64K elements (~3 ms of normal() draws), small enough to balance
// 16 threads on a 7168-row tensor, large enough that scheduling costs nothing.
constexpr int64_t kChunkElements = int64_t(1) << 16;

// Calls body(begin, end) over [0, n) in chunks of `grain` items on `threads` OpenMP threads.
// Invariant the callers keep: item k's bytes depend only on k and are written only by it, so any
// split and any thread count produce the same bytes.
template <typename F> void parallel_for(int64_t n, int64_t grain, int threads, const F& body) {
  const int64_t chunks = ceil_div(n, grain);
#pragma omp parallel for schedule(dynamic) num_threads(threads) if (chunks > 1 && threads > 1)
  for (int64_t c = 0; c < chunks; ++c) body(c * grain, std::min(n, (c + 1) * grain));
}

// Element-wise fill of a 2-byte or 4-byte tensor: v[i] = value(i).
template <typename T, typename F> void fill_elements(std::span<uint8_t> b, int threads, const F& value) {
  const auto v = as<T>(b);
  parallel_for(int64_t(v.size()), kChunkElements, threads, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) v[size_t(i)] = value(uint64_t(i));
  });
}

}  // namespace

bool writes_residual(const std::string& weight_name) {
  return weight_name.ends_with("self_attn.o_proj.weight") || weight_name.ends_with("down_proj.weight");
}

Status write_synthetic_checkpoint(const io::ModelConfig& cfg, const std::string& dir, const SyntheticOptions& opt) {
  MLA_RETURN_IF_ERROR(io::validate_model_config(cfg, "make-model"));
  if (!(std::isfinite(opt.branch_gain) && opt.branch_gain > 0.0f)) {
    return error("make-model: branch gain must be finite and > 0, got {}", opt.branch_gain);
  }
  if (opt.threads < 0) return error("make-model: threads must be >= 0 (0: all cores), got {}", opt.threads);
  const int threads = opt.threads > 0 ? opt.threads : omp_get_max_threads();
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return error("{}: cannot create directory: {}", dir, ec.message());
  {
    std::ofstream f(dir + "/config.json");
    f << io::model_config_to_json(cfg).dump(2) << "\n";
    if (!f) return error("{}/config.json: write failed", dir);
  }

  io::ShardedCheckpointWriter w(opt.max_shard_bytes, opt.force_sharding);
  std::map<std::string, std::string> metadata = {{"format", "pt"},
                                                 {"generator", "mlaserve make-model (random weights)"}};
  // Only a non-default gain is recorded: gain 1 must reproduce the earlier files byte for byte.
  if (opt.branch_gain != 1.0f) metadata["branch_gain"] = fmt::format("{}", opt.branch_gain);
  w.set_metadata(std::move(metadata));
  w.set_progress(opt.progress);
  // The main model, then the num_nextn_predict_layers MTP blocks (layers L >= num_hidden_layers).
  std::vector<TensorSpec> specs = deepseek_v3_tensor_specs(cfg);
  for (TensorSpec& spec : deepseek_v3_mtp_tensor_specs(cfg)) specs.push_back(std::move(spec));
  for (const TensorSpec& spec : specs) {
    const uint64_t key = mix(opt.seed ^ name_hash(spec.name));
    switch (spec.role) {
      case TensorRole::Embedding:
        w.add(spec.name, DType::BF16, spec.shape, [key, threads](std::span<uint8_t> b) {
          fill_elements<uint16_t>(b, threads, [key](uint64_t i) { return f32_to_bf16(normal(key, i)); });
        });
        continue;
      case TensorRole::Norm:
        w.add(spec.name, DType::BF16, spec.shape, [key, threads](std::span<uint8_t> b) {
          fill_elements<uint16_t>(b, threads, [key](uint64_t i) { return f32_to_bf16(1.0f + 0.1f * normal(key, i)); });
        });
        continue;
      case TensorRole::RouterBias:
        // Small positive selection bias, as trained DeepSeek routers carry.
        w.add(spec.name, DType::F32, spec.shape, [key, threads](std::span<uint8_t> b) {
          fill_elements<float>(b, threads, [key](uint64_t i) { return 0.05f + 0.1f * uniform01(key, i); });
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
    // x * 1.0f == x exactly, so the default gain leaves every value as it was.
    const float gain = writes_residual(spec.name) ? opt.branch_gain : 1.0f;
    // Row-parallel fills (FP8 blocks, INT4 words) take whole rows, ~kChunkElements per chunk.
    const int64_t rows_per_chunk = std::max<int64_t>(1, kChunkElements / std::max<int64_t>(in, 1));
    switch (spec.role == TensorRole::Router ? StoredFormat::Dense : stored_format(cfg, spec)) {
      case StoredFormat::Dense: {
        const float sd = std_dev * gain;
        w.add(spec.name, DType::BF16, spec.shape, [key, sd, threads](std::span<uint8_t> b) {
          fill_elements<uint16_t>(b, threads, [key, sd](uint64_t i) { return f32_to_bf16(sd * normal(key, i)); });
        });
        break;
      }
      case StoredFormat::Fp8Block: {
        // Per-block scale chosen first (deterministic), so weight and scale tensors are generated
        // independently: W = fp8(q) * scale with |q| <= 448 covering ~4 standard deviations. The
        // branch gain multiplies only the stored scale: the fp8 codes stay those of gain 1.
        const int64_t sc = ceil_div(in, ops::kFp8BlockSize);
        auto scale = [key, std_dev](int64_t bo, int64_t bi, int64_t cols) {
          return std_dev * 4.0f / 448.0f * (0.75f + 0.5f * uniform01(~key, uint64_t(bo * cols + bi)));
        };
        w.add(spec.name, DType::F8_E4M3, spec.shape, [=](std::span<uint8_t> b) {
          // Per byte: one normal() (~45 ns: log + sqrt + cos in double) and one fp8e4m3_rne (~4 ns,
          // the table search it replaces took ~40 ns); the scale is hoisted per (row, 128-block).
          parallel_for(out, rows_per_chunk, threads, [&](int64_t o0, int64_t o1) {
            for (int64_t o = o0; o < o1; ++o) {
              for (int64_t bi = 0; bi < sc; ++bi) {
                const float s = scale(o / ops::kFp8BlockSize, bi, sc);
                const int64_t i1 = std::min(in, (bi + 1) * ops::kFp8BlockSize);
                for (int64_t i = bi * ops::kFp8BlockSize; i < i1; ++i) {
                  b[size_t(o * in + i)] = fp8e4m3_rne(std_dev * normal(key, uint64_t(o * in + i)) / s);
                }
              }
            }
          });
        });
        w.add(spec.name + "_scale_inv", DType::F32, {ceil_div(out, ops::kFp8BlockSize), sc}, [=](std::span<uint8_t> b) {
          fill_elements<float>(b, threads, [&](uint64_t k) { return scale(int64_t(k) / sc, int64_t(k) % sc, sc) * gain; });
        });
        break;
      }
      case StoredFormat::Int4Group: {
        // The branch gain scales the group scales only; the packed codes stay those of gain 1.
        const std::string module = module_name(spec.name);
        const int64_t words = ceil_div(in, 8), groups = ceil_div(in, ops::kInt4GroupSize);
        const float scale_sd = std_dev * gain;
        w.add(module + ".weight_packed", DType::I32, {out, words}, [=](std::span<uint8_t> b) {
          auto v = as<uint32_t>(b);
          // Eight nibbles share a word (|= onto the zeroed buffer): split by rows, never inside one.
          parallel_for(out, rows_per_chunk, threads, [&](int64_t o0, int64_t o1) {
            for (int64_t o = o0; o < o1; ++o)
              for (int64_t i = 0; i < in; ++i) {
                const float q = std::nearbyint(2.5f * normal(key, uint64_t(o * in + i)));
                const uint32_t nib = uint32_t(std::clamp(q, -8.0f, 7.0f) + 8.0f);
                v[size_t(o * words + i / 8)] |= nib << (4 * (i % 8));
              }
          });
        });
        w.add(module + ".weight_scale", DType::BF16, {out, groups}, [=](std::span<uint8_t> b) {
          fill_elements<uint16_t>(b, threads, [&](uint64_t k) {
            return f32_to_bf16(scale_sd / 2.5f * (0.8f + 0.4f * uniform01(~key, k)));
          });
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
