// Runs the @huggingface/jinja reference renderer (render_reference.mjs under node) on a batch of
// {template, context} cases in one process and returns one result per case.
#pragma once

#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <unistd.h>

namespace mla::testing {

struct ReferenceResult {
  std::optional<std::string> text;  // nullopt when the reference raised
  std::string error;
};

// `request` is the JSON render_reference.mjs reads. Returns an empty vector if node failed.
inline std::vector<ReferenceResult> run_reference(const nlohmann::ordered_json& request) {
  char path[] = "/tmp/mla_jinja_ref_XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) return {};
  close(fd);
  { std::ofstream(path, std::ios::binary) << request.dump(); }
  const std::string cmd = std::string("node ") + MLA_NPM_DIR + "/../../tokenizer/render_reference.mjs < " + path;
  std::string out;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    pclose(p);
  }
  std::remove(path);
  std::vector<ReferenceResult> results;
  auto j = nlohmann::json::parse(out, nullptr, false);
  if (!j.is_array()) return {};
  for (const auto& r : j) {
    ReferenceResult rr;
    if (r.contains("ok")) rr.text = r["ok"].get<std::string>();
    else rr.error = r.value("error", "");
    results.push_back(rr);
  }
  return results;
}

}  // namespace mla::testing
