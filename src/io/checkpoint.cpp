// Checkpoint directory loading: index parsing, shard path confinement, and the global name index.
// Shard paths come from an untrusted index, so each is checked lexically (no absolute paths, no
// "..") and again after resolving symlinks, before anything is opened.
#include "io/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

#include <nlohmann/json.hpp>

#include "io/json_strict.h"

namespace mla::io {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Index files list one entry per tensor (~100 bytes each): 256 MiB is millions of tensors.
constexpr uintmax_t kMaxIndexBytes = uintmax_t(256) << 20;

Result<std::string> read_small_file(const fs::path& path) {
  std::error_code ec;
  const uintmax_t size = fs::file_size(path, ec);
  if (ec) return error("{}: cannot read: {}", path.string(), ec.message());
  if (size > kMaxIndexBytes) return error("{}: {} bytes, larger than the {}-byte limit", path.string(), size, kMaxIndexBytes);
  std::ifstream in(path, std::ios::binary);
  if (!in) return error("{}: cannot open", path.string());
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return error("{}: read failed", path.string());
  return text;
}

// True when `path` is `dir` or below it, comparing whole components ("/a/bc" is not under "/a/b").
bool is_within(const fs::path& dir, const fs::path& path) {
  auto d = dir.begin();
  auto p = path.begin();
  for (; d != dir.end(); ++d, ++p) {
    if (d->empty()) continue;  // trailing separator yields an empty last component
    if (p == path.end() || *d != *p) return false;
  }
  return true;
}

// Resolves a weight_map shard name to a canonical path inside `dir_canon`.
Result<fs::path> resolve_shard(const fs::path& dir_canon, const std::string& shard, const std::string& index_file,
                               const std::string& tensor) {
  auto fail = [&](const std::string& why) {
    return error("{}: weight_map entry for tensor '{}' names shard '{}': {}", index_file, printable(tensor),
                 printable(shard), why);
  };
  if (shard.empty()) return fail("empty file name");
  if (shard.find('\0') != std::string::npos) return fail("file name contains a NUL byte");
  const fs::path rel(shard);
  if (rel.is_absolute() || rel.has_root_name() || rel.has_root_directory()) {
    return fail("absolute paths are not allowed; shards must be inside the model directory");
  }
  for (const fs::path& part : rel) {
    if (part == "..") return fail("'..' would leave the model directory");
  }
  std::error_code ec;
  const fs::path full = fs::weakly_canonical(dir_canon / rel, ec);
  if (ec) return fail("cannot resolve: " + ec.message());
  if (!is_within(dir_canon, full)) return fail(fmt::format("resolves to {}, outside the model directory", full.string()));
  return full;
}

}  // namespace

Result<Checkpoint> Checkpoint::open(const std::string& model_dir) {
  std::error_code ec;
  if (!fs::is_directory(model_dir, ec)) {
    return error("{}: {}", model_dir, fs::exists(model_dir, ec) ? "not a directory" : "no such directory");
  }
  const fs::path dir_canon = fs::canonical(model_dir, ec);
  if (ec) return error("{}: cannot resolve: {}", model_dir, ec.message());
  const fs::path index_path = fs::path(model_dir) / kSafetensorsIndexName;
  const fs::path single_path = fs::path(model_dir) / kSafetensorsSingleName;

  Checkpoint c;
  c.dir_ = model_dir;
  // weight_map as given, kept to check each entry against its shard once all are open.
  std::vector<std::pair<std::string, size_t>> expected;  // (tensor, file index)

  if (fs::exists(index_path, ec)) {
    const std::string index_file = index_path.string();
    MLA_ASSIGN_OR_RETURN(const std::string text, read_small_file(index_path));
    auto parsed = parse_json_strict(text);
    if (!parsed.is_ok()) return error("{}: not valid JSON: {}", index_file, parsed.status().message());
    const json& root = parsed.value();
    if (!root.is_object()) return error("{}: is {}, expected a JSON object", index_file, json_type_phrase(root));
    if (!root.contains("weight_map")) return error("{}: missing key 'weight_map'", index_file);
    const json& wm = root["weight_map"];
    if (!wm.is_object()) return error("{}: weight_map is {}, expected an object", index_file, json_type_phrase(wm));
    if (wm.empty()) return error("{}: weight_map is empty", index_file);

    // Distinct shards by canonical path, so "a.safetensors" and "./a.safetensors" open once.
    std::map<std::string, size_t> shard_ids;      // canonical path -> position in open order
    std::vector<std::pair<std::string, std::string>> entries;  // (tensor, canonical shard path)
    entries.reserve(wm.size());
    for (auto it = wm.begin(); it != wm.end(); ++it) {
      if (!it.value().is_string()) {
        return error("{}: weight_map value for tensor '{}' is {}, expected a file name", index_file,
                     printable(it.key()), json_type_phrase(it.value()));
      }
      MLA_ASSIGN_OR_RETURN(const fs::path shard,
                           resolve_shard(dir_canon, it.value().get<std::string>(), index_file, it.key()));
      shard_ids.emplace(shard.string(), 0);
      entries.emplace_back(it.key(), shard.string());
    }
    // Open in path order (model-00001, model-00002, ...) so files() is deterministic.
    for (auto& [path, id] : shard_ids) {
      auto f = SafetensorsFile::open(path);
      if (!f.is_ok()) return f.status().with_context(index_file + ": shard listed in weight_map");
      id = c.files_.size();
      c.files_.push_back(std::move(f).value());
    }
    for (auto& [tensor, shard] : entries) expected.emplace_back(std::move(tensor), shard_ids.at(shard));
    for (const auto& [tensor, file] : expected) {
      if (!c.files_[file].contains(tensor)) {
        return error("{}: weight_map puts tensor '{}' in {}, but that shard has no such tensor", index_file,
                     printable(tensor), c.files_[file].path());
      }
    }
  } else if (fs::exists(single_path, ec)) {
    MLA_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::open(single_path.string()));
    c.files_.push_back(std::move(f));
  } else {
    return error("{}: no checkpoint found: looked for {} and {}", model_dir, kSafetensorsIndexName,
                 kSafetensorsSingleName);
  }

  for (size_t fi = 0; fi < c.files_.size(); ++fi) {
    const auto& tensors = c.files_[fi].tensors();
    for (size_t ti = 0; ti < tensors.size(); ++ti) {
      const auto [it, inserted] = c.index_.emplace(tensors[ti].name, Location{uint32_t(fi), uint32_t(ti)});
      if (!inserted) {
        return error("{}: tensor '{}' is in two shards: {} and {}", model_dir, printable(tensors[ti].name),
                     c.files_[it->second.file].path(), c.files_[fi].path());
      }
    }
  }
  return c;
}

const TensorInfo* Checkpoint::find(const std::string& name, const SafetensorsFile** file) const {
  const auto it = index_.find(name);
  if (it == index_.end()) return nullptr;
  const SafetensorsFile& f = files_[it->second.file];
  if (file != nullptr) *file = &f;
  return &f.tensors()[it->second.tensor];
}

Result<TensorView> Checkpoint::get(const std::string& name) const {
  const auto it = index_.find(name);
  if (it == index_.end()) return error("{}: no tensor '{}' in the checkpoint", dir_, printable(name));
  return files_[it->second.file].tensor(name);
}

std::vector<std::string> Checkpoint::tensor_names() const {
  std::vector<std::string> names;
  names.reserve(index_.size());
  for (const auto& [name, loc] : index_) names.push_back(name);
  std::sort(names.begin(), names.end());
  return names;
}

uint64_t Checkpoint::total_bytes() const {
  uint64_t total = 0;
  for (const auto& f : files_) {
    for (const auto& t : f.tensors()) total += t.nbytes();
  }
  return total;
}

}  // namespace mla::io
