// Helpers shared by the speculative-decoding engine tests (CPU and GPU): run a set of requests
// concurrently through an engine and collect each stream, and read metrics once the engine has
// published the iteration that finished the last request (streams end before that publication).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
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

// Rollback (issue #8): `count` speculative requests (greedy and sampled, some ignoring EOS; request i
// built from base(i) with a distinct last prompt token) with a third of them cancelled mid-flight.
// Every stream ends, no block stays in use, drafts were made, and the engine still serves `after`.
inline void check_no_block_leaks_after_requests_some_cancelled(runtime::Engine& e, int count,
                                                               const std::function<runtime::RequestParams(int)>& base,
                                                               const runtime::RequestParams& after) {
  std::vector<runtime::SubmitResult> subs;
  for (int i = 0; i < count; ++i) {
    runtime::RequestParams p = base(i);
    p.prompt.push_back(int32_t(40 + i % 50));
    if (i % 2) {
      p.sampling.temperature = 0.7f + 0.1f * float(i % 4);
      p.sampling.top_k = i % 3 == 0 ? 0 : 20;
      p.sampling.seed = uint64_t(i);
    }
    p.ignore_eos = i % 5 == 0;
    subs.push_back(e.submit(p));
    ASSERT_TRUE(subs.back().ok());
  }
  for (int i = 0; i < count; i += 3) e.abort(subs[size_t(i)].stream->id());
  int finished = 0;
  for (auto& s : subs) finished += collect_stream(*s.stream).finished ? 1 : 0;
  EXPECT_EQ(finished, count);
  const runtime::EngineMetrics m = settled(e);
  EXPECT_EQ(m.num_blocks_used, 0);
  EXPECT_GT(m.spec.num_draft_tokens, 0);
  const runtime::RequestOutput out = run_all(e, {after})[0];
  EXPECT_EQ(int(out.token_ids.size()), after.max_tokens);
}

}  // namespace mla::test
