// Prometheus parsing and point deltas for `mlaserve bench` (see server_metrics.h).
#include "bench/server_metrics.h"

#include <cstdlib>
#include <sstream>

namespace mla::bench {

double ServerCounters::get(const std::string& name) const {
  const auto it = values.find(name);
  return it == values.end() ? 0.0 : it->second;
}

ServerCounters parse_prometheus_counters(const std::string& text) {
  ServerCounters c;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    // name{labels} value  |  name value
    const size_t brace = line.find('{');
    const size_t space = line.rfind(' ');
    if (space == std::string::npos || space == 0) continue;
    std::string name = line.substr(0, std::min(brace, space));
    const std::string labels = brace != std::string::npos && brace < space ? line.substr(brace, space - brace) : "";
    char* end = nullptr;
    const std::string value_text = line.substr(space + 1);
    const double v = std::strtod(value_text.c_str(), &end);
    if (end == value_text.c_str()) continue;
    for (const char* prefix : {"mlaserve:", "vllm:"})
      if (name.rfind(prefix, 0) == 0) name = name.substr(std::string(prefix).size());
    if (name.size() > 6 && name.compare(name.size() - 6, 6, "_total") == 0) name.resize(name.size() - 6);
    if (name == "spec_decode_num_accepted_tokens_per_pos") {
      const size_t p = labels.find("position=\"");
      if (p == std::string::npos) continue;
      const long pos = std::strtol(labels.c_str() + p + 10, nullptr, 10);
      if (pos < 0 || pos > 1024) continue;
      if (c.accepted_per_pos.size() <= size_t(pos)) c.accepted_per_pos.resize(size_t(pos) + 1, 0.0);
      c.accepted_per_pos[size_t(pos)] += v;
      continue;
    }
    c.values[name] += v;
  }
  return c;
}

ServerPointStats server_point_stats(const ServerCounters& before, const ServerCounters& after, double duration_s) {
  ServerPointStats s;
  const auto delta = [&](const char* n) { return after.get(n) - before.get(n); };
  if (after.has("engine_steps") && after.has("engine_forward_seconds")) {
    s.has_engine = true;
    // Decode-only steps when the server splits them out (mlaserve does): a prefill step's longer
    // forward would otherwise inflate the per-step figure TPOT is compared with.
    const bool decode = after.has("engine_decode_steps");
    s.decode_steps_only = decode;
    s.steps = delta(decode ? "engine_decode_steps" : "engine_steps");
    const double fwd = delta(decode ? "engine_decode_forward_seconds" : "engine_forward_seconds");
    const double step = delta(decode ? "engine_decode_step_seconds" : "engine_step_seconds");
    if (s.steps > 0) {
      s.forward_ms_per_step = 1e3 * fwd / s.steps;
      s.step_ms_per_step = 1e3 * step / s.steps;
    }
    if (fwd > 0) s.engine_host_overhead = (step - fwd) / fwd;
    const double all_fwd = delta("engine_forward_seconds");
    if (all_fwd > 0 && duration_s > 0) s.server_overhead = duration_s / all_fwd - 1.0;
    const double all_step = delta("engine_step_seconds");
    if (all_step > 0 && duration_s > 0) s.server_overhead_vs_step = duration_s / all_step - 1.0;
  }
  if (after.has("spec_decode_num_drafts")) {
    s.has_spec = true;
    s.spec_num_drafts = delta("spec_decode_num_drafts");
    s.spec_draft_tokens = delta("spec_decode_num_draft_tokens");
    s.spec_accepted_tokens = delta("spec_decode_num_accepted_tokens");
    if (s.spec_draft_tokens > 0) s.spec_acceptance_rate = s.spec_accepted_tokens / s.spec_draft_tokens;
    if (s.spec_num_drafts > 0) {
      s.spec_acceptance_length = 1.0 + s.spec_accepted_tokens / s.spec_num_drafts;
      for (size_t i = 0; i < after.accepted_per_pos.size(); ++i) {
        const double b = i < before.accepted_per_pos.size() ? before.accepted_per_pos[i] : 0.0;
        s.spec_per_position_acceptance_rates.push_back((after.accepted_per_pos[i] - b) / s.spec_num_drafts);
      }
    }
  }
  return s;
}

namespace {

// The JSON name of each figure (vLLM bench's for the speculative ones) and the group it belongs to:
// a group's figures are written only when the server reported its counters.
struct JsonFigure {
  const char* name;
  double ServerPointStats::*value;
  bool ServerPointStats::*present;
};
using S = ServerPointStats;
constexpr JsonFigure kJsonFigures[] = {
    {"engine_steps", &S::steps, &S::has_engine},
    {"engine_forward_ms_per_step", &S::forward_ms_per_step, &S::has_engine},
    {"engine_step_ms_per_step", &S::step_ms_per_step, &S::has_engine},
    {"engine_host_overhead", &S::engine_host_overhead, &S::has_engine},
    {"server_overhead", &S::server_overhead, &S::has_engine},
    {"server_overhead_vs_engine_step", &S::server_overhead_vs_step, &S::has_engine},
    {"spec_decode_num_drafts", &S::spec_num_drafts, &S::has_spec},
    {"spec_decode_draft_tokens", &S::spec_draft_tokens, &S::has_spec},
    {"spec_decode_accepted_tokens", &S::spec_accepted_tokens, &S::has_spec},
    {"spec_decode_acceptance_rate", &S::spec_acceptance_rate, &S::has_spec},
    {"spec_decode_acceptance_length", &S::spec_acceptance_length, &S::has_spec},
};

}  // namespace

nlohmann::json server_stats_to_json(const ServerPointStats& s) {
  nlohmann::json j = nlohmann::json::object();
  for (const JsonFigure& f : kJsonFigures)
    if (s.*f.present) j[f.name] = s.*f.value;
  if (s.has_engine) j["engine_steps_are_decode_only"] = s.decode_steps_only;
  if (s.has_spec) j["spec_decode_per_position_acceptance_rates"] = s.spec_per_position_acceptance_rates;
  return j;
}

}  // namespace mla::bench
