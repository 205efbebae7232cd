// Prometheus text exposition (format 0.0.4) of the engine's metrics snapshot plus the server's own
// counters. Hand-written rather than via prometheus-cpp: the engine already keeps the histograms,
// so exposition is a pure function of one snapshot, with no second registry to keep in sync.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/engine.h"

namespace mla::server {

struct ServerCounters {
  uint64_t client_disconnects = 0;  // requests aborted because their client went away
  uint64_t rejected_queue_full = 0; // 429s
  uint64_t errors_4xx = 0;
  uint64_t errors_5xx = 0;
};

// Metric names follow vLLM's (`vllm:` -> `mlaserve:`), labelled with model_name.
std::string prometheus_text(const runtime::EngineMetrics& m, const ServerCounters& c, const std::string& model_name);

}  // namespace mla::server
