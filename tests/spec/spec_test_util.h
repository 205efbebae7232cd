// Helpers shared by the speculative-decoding engine tests (CPU and GPU): run a set of requests
// concurrently through an engine and collect each stream, and read metrics once the engine has
// published the iteration that finished the last request (streams end before that publication).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "runtime/engine.h"

namespace mla::test {

inline runtime::RequestOutput collect_stream(runtime::RequestStream& s) {
  runtime::RequestOutput all;
  while (auto d = s.next()) {
    all.token_ids.insert(all.token_ids.end(), d->token_ids.begin(), d->token_ids.end());
    all.text += d->text;
    all.finished = d->finished;
    all.finish_reason = d->finish_reason;
    for (auto& lp : d->logprobs) all.logprobs.push_back(lp);
  }
  return all;
}

// Submits every request, then reads every stream; outputs in request order.
inline std::vector<runtime::RequestOutput> run_all(runtime::Engine& e, const std::vector<runtime::RequestParams>& reqs) {
  std::vector<runtime::SubmitResult> subs;
  for (const runtime::RequestParams& p : reqs) {
    subs.push_back(e.submit(p));
    EXPECT_TRUE(subs.back().ok()) << subs.back().error.message;
  }
  std::vector<runtime::RequestOutput> outs;
  for (auto& s : subs) outs.push_back(s.ok() ? collect_stream(*s.stream) : runtime::RequestOutput{});
  return outs;
}

inline runtime::EngineMetrics settled(runtime::Engine& e) {
  runtime::EngineMetrics m = e.metrics();
  for (int i = 0; i < 400 && (m.num_running + m.num_waiting > 0 || m.num_blocks_used > 0); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    m = e.metrics();
  }
  return m;
}

}  // namespace mla::test
