// GPU catalog loader: strict JSON validation (every field typed and range-checked, errors name the
// file and the key) and per-field overrides done as a JSON merge-patch on the shipped entry, so an
// override file only needs the fields it changes yet the merged entry is validated in full.
#include "plan/gpu_catalog.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace mla::plan {

namespace {

using nlohmann::json;

std::string lower(std::string_view s) {
  std::string r(s);
  for (char& c : r) c = char(std::tolower(static_cast<unsigned char>(c)));
  return r;
}

Result<std::string> read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return error("{}: cannot open", path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

Result<double> positive(const json& e, const std::string& where, const char* key) {
  auto it = e.find(key);
  if (it == e.end()) return error("{}.{}: missing", where, key);
  if (!it->is_number()) return error("{}.{}: must be a number", where, key);
  const double v = it->get<double>();
  if (!(v > 0) || v > 1e9) return error("{}.{}: must be a positive number, got {}", where, key, v);
  return v;
}

Result<std::optional<double>> optional_rate(const json& e, const std::string& where, const char* key) {
  auto it = e.find(key);
  if (it == e.end()) return error("{}.{}: missing (use null when the GPU has no such rate)", where, key);
  if (it->is_null()) return std::optional<double>();
  MLA_ASSIGN_OR_RETURN(double v, positive(e, where, key));
  return std::optional<double>(v);
}

Result<std::string> text(const json& e, const std::string& where, const char* key) {
  auto it = e.find(key);
  if (it == e.end()) return error("{}.{}: missing", where, key);
  if (!it->is_string() || it->get<std::string>().empty()) return error("{}.{}: must be a non-empty string", where, key);
  return it->get<std::string>();
}

Result<GpuSpec> parse_entry(const std::string& key, const json& e, const std::string& where) {
  if (!e.is_object()) return error("{}: must be an object", where);
  GpuSpec g;
  g.key = lower(key);
  MLA_ASSIGN_OR_RETURN(g.name, text(e, where, "name"));
  MLA_ASSIGN_OR_RETURN(g.memory_gb, positive(e, where, "memory_gb"));
  MLA_ASSIGN_OR_RETURN(g.hbm_tbps, positive(e, where, "hbm_tbps"));
  MLA_ASSIGN_OR_RETURN(g.bf16_tflops, optional_rate(e, where, "bf16_tflops"));
  MLA_ASSIGN_OR_RETURN(g.fp8_tflops, optional_rate(e, where, "fp8_tflops"));
  MLA_ASSIGN_OR_RETURN(g.fp4_tflops, optional_rate(e, where, "fp4_tflops"));
  if (!g.bf16_tflops && !g.fp8_tflops && !g.fp4_tflops) return error("{}: needs at least one non-null TFLOP/s rate", where);
  MLA_ASSIGN_OR_RETURN(g.interconnect, text(e, where, "interconnect"));
  MLA_ASSIGN_OR_RETURN(g.interconnect_gbps, positive(e, where, "interconnect_gbps"));
  MLA_ASSIGN_OR_RETURN(g.spec_source, text(e, where, "spec_source"));
  MLA_ASSIGN_OR_RETURN(g.price_per_gpu_hour, positive(e, where, "price_per_gpu_hour"));
  MLA_ASSIGN_OR_RETURN(g.price_source, text(e, where, "price_source"));
  MLA_ASSIGN_OR_RETURN(g.price_date, text(e, where, "price_date"));
  const std::string& d = g.price_date;
  const bool date_ok = d.size() == 10 && d[4] == '-' && d[7] == '-' &&
                       std::all_of(d.begin(), d.end(), [](char c) { return c == '-' || std::isdigit(static_cast<unsigned char>(c)); });
  if (!date_ok) return error("{}.price_date: must be YYYY-MM-DD, got \"{}\"", where, d);
  return g;
}

json entry_to_json(const GpuSpec& g) {
  auto rate = [](const std::optional<double>& r) { return r ? json(*r) : json(nullptr); };
  return json{{"name", g.name},
              {"memory_gb", g.memory_gb},
              {"hbm_tbps", g.hbm_tbps},
              {"bf16_tflops", rate(g.bf16_tflops)},
              {"fp8_tflops", rate(g.fp8_tflops)},
              {"fp4_tflops", rate(g.fp4_tflops)},
              {"interconnect", g.interconnect},
              {"interconnect_gbps", g.interconnect_gbps},
              {"spec_source", g.spec_source},
              {"price_per_gpu_hour", g.price_per_gpu_hour},
              {"price_source", g.price_source},
              {"price_date", g.price_date}};
}

Result<json> parse_gpus_object(std::string_view text_in, const std::string& source) {
  json j = json::parse(text_in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return error("{}: not valid JSON", source);
  if (!j.is_object()) return error("{}: top level must be an object", source);
  auto it = j.find("gpus");
  if (it == j.end() || !it->is_object()) return error("{}: gpus: missing or not an object", source);
  return *it;
}

void sort_unique(GpuCatalog& c) {
  std::sort(c.gpus.begin(), c.gpus.end(), [](const GpuSpec& a, const GpuSpec& b) { return a.key < b.key; });
}

}  // namespace

const GpuSpec* GpuCatalog::find(std::string_view key) const {
  const std::string k = lower(key);
  for (const GpuSpec& g : gpus)
    if (g.key == k) return &g;
  return nullptr;
}

std::vector<std::string> GpuCatalog::keys() const {
  std::vector<std::string> r;
  for (const GpuSpec& g : gpus) r.push_back(g.key);
  return r;
}

Result<GpuCatalog> parse_gpu_catalog(std::string_view json_text, const std::string& source) {
  MLA_ASSIGN_OR_RETURN(json gpus, parse_gpus_object(json_text, source));
  if (gpus.empty()) return error("{}: gpus: is empty", source);
  GpuCatalog c;
  for (auto& [key, e] : gpus.items()) {
    if (c.find(key)) return error("{}: gpus.{}: duplicate key (keys are case-insensitive)", source, key);
    MLA_ASSIGN_OR_RETURN(GpuSpec g, parse_entry(key, e, fmt::format("{}: gpus.{}", source, key)));
    c.gpus.push_back(std::move(g));
  }
  sort_unique(c);
  return c;
}

Result<GpuCatalog> load_gpu_catalog(const std::string& path) {
  MLA_ASSIGN_OR_RETURN(std::string t, read_text(path));
  return parse_gpu_catalog(t, path);
}

Status apply_catalog_override(GpuCatalog& base, const std::string& override_path) {
  MLA_ASSIGN_OR_RETURN(std::string t, read_text(override_path));
  MLA_ASSIGN_OR_RETURN(json gpus, parse_gpus_object(t, override_path));
  GpuCatalog merged = base;
  for (auto& [key, e] : gpus.items()) {
    const std::string where = fmt::format("{}: gpus.{}", override_path, key);
    if (!e.is_object()) return error("{}: must be an object", where);
    GpuSpec* existing = nullptr;
    for (GpuSpec& g : merged.gpus)
      if (g.key == lower(key)) existing = &g;
    json full = existing ? entry_to_json(*existing) : json::object();
    full.merge_patch(e);
    MLA_ASSIGN_OR_RETURN(GpuSpec g, parse_entry(key, full, where));
    if (existing) {
      *existing = std::move(g);
    } else {
      merged.gpus.push_back(std::move(g));
    }
  }
  sort_unique(merged);
  base = std::move(merged);
  return Status();
}

Result<GpuCatalog> load_default_gpu_catalog() {
  if (const char* env = std::getenv("MLASERVE_GPU_CATALOG"); env && *env) return load_gpu_catalog(env);
  namespace fs = std::filesystem;
  const fs::path rel = fs::path("data") / "gpu_catalog.json";
  std::vector<fs::path> tried;
  std::error_code ec;
  for (fs::path dir : {fs::current_path(ec), fs::read_symlink("/proc/self/exe", ec).parent_path()}) {
    for (int up = 0; up < 6 && !dir.empty(); ++up, dir = dir.parent_path()) {
      const fs::path p = dir / rel;
      if (fs::is_regular_file(p, ec)) return load_gpu_catalog(p.string());
      tried.push_back(p);
      if (dir == dir.parent_path()) break;
    }
  }
  return error("gpu catalog: data/gpu_catalog.json not found near the working directory or the executable; "
               "pass --catalog FILE or set MLASERVE_GPU_CATALOG");
}

}  // namespace mla::plan
