// GPU catalog: per-GPU memory, bandwidth, dense tensor rates and a default price, read from a JSON
// data file (data/gpu_catalog.json) that users can override entry by entry. Trade-off: figures are
// datasheet peaks and estimated prices, so everything derived from them is an upper bound.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace mla::plan {

struct GpuSpec {
  std::string key;                    // catalog key, lower case ("mi355x")
  std::string name;                   // marketing name
  double memory_gb = 0;               // HBM capacity, 1e9 bytes
  double hbm_tbps = 0;                // HBM bandwidth, 1e12 bytes/s
  std::optional<double> bf16_tflops;  // dense; nullopt: no native rate
  std::optional<double> fp8_tflops;
  std::optional<double> fp4_tflops;
  std::string interconnect;           // e.g. "NVLink 5"
  double interconnect_gbps = 0;       // per GPU, 1e9 bytes/s
  std::string spec_source;
  double price_per_gpu_hour = 0;      // USD
  std::string price_source;           // where the price comes from ("estimate: ..." when it is one)
  std::string price_date;             // YYYY-MM-DD
};

struct GpuCatalog {
  std::vector<GpuSpec> gpus;  // sorted by key, keys unique

  // Case-insensitive lookup; nullptr if absent.
  const GpuSpec* find(std::string_view key) const;
  std::vector<std::string> keys() const;
};

// Parses catalog JSON: {"gpus": {"<key>": {...}}}. Every error starts with `source` and names the
// key (e.g. "cat.json: gpus.b200.hbm_tbps: must be a positive number").
Result<GpuCatalog> parse_gpu_catalog(std::string_view json_text, const std::string& source);

// Reads and parses a full catalog file.
Result<GpuCatalog> load_gpu_catalog(const std::string& path);

// Applies a user override file on top of `base`: fields present in the file replace the base
// entry's; unknown GPU keys add new entries, which must then be complete.
Status apply_catalog_override(GpuCatalog& base, const std::string& override_path);

// The shipped catalog: $MLASERVE_GPU_CATALOG, else data/gpu_catalog.json found from the working
// directory or from the executable's directory upwards (build trees sit under the repo).
Result<GpuCatalog> load_default_gpu_catalog();

}  // namespace mla::plan
