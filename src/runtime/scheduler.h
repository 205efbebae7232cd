// The serving scheduler as a pure function of queue and cache state (no model, no pool): which
// sequences run this step and with how many tokens. Policy (vLLM v1-like): running decodes first,
// then running prefill chunks, then FIFO admission from the waiting queue, all under one per-step
// token budget (chunked prefill) and max_num_seqs; when KV blocks run out, the newest running
// sequence is preempted by recompute. Strict FIFO admission and oldest-first service mean the
// oldest request always progresses (no starvation), at the cost of head-of-line blocking.
#pragma once

#include <cstdint>
#include <vector>

namespace mla::runtime {

struct SchedSeq {
  uint64_t id = 0;
  uint64_t arrival = 0;          // FIFO key: smaller = older
  int num_tokens = 0;            // prompt + generated: what must be cached before the next sample
  int num_computed = 0;          // tokens already in the cache (0 for waiting sequences)
  int num_blocks = 0;            // KV blocks held (0 for waiting sequences)
  int num_freeable_blocks = 0;   // running: blocks that become available if it is preempted
  int prefix_hit_tokens = 0;     // waiting: cached prefix it would reuse (block multiple, < num_tokens)
  int prefix_hit_evictable = 0;  // waiting: of those blocks, how many are evictable now
  int num_lookahead = 0;         // running decode: draft tokens to verify with its next token
};

struct SchedulerState {
  std::vector<SchedSeq> running;  // oldest first
  std::vector<SchedSeq> waiting;  // FIFO (preempted sequences keep their arrival order)
  int available_blocks = 0;       // free + evictable blocks in the pool
  int block_size = 16;
};

struct SchedulerConfig {
  int max_num_seqs = 64;            // sequences per step (and running at once)
  int max_tokens_per_step = 512;    // token budget of one step
  int max_block_entries = 1 << 30;  // block-table entries summed over a step's sequences
};

struct ScheduledChunk {
  uint64_t id = 0;
  int num_new_tokens = 0;     // consecutive tokens from num_computed (after any prefix hit)
  int prefix_hit_tokens = 0;  // admitted: tokens taken from the prefix cache first
  bool admitted = false;      // moved from waiting to running this step
  bool samples = false;       // the chunk reaches num_tokens: its last row produces a token
  int num_draft_tokens = 0;   // speculative decode: drafts verified after the token (in num_new_tokens)
};

struct StepPlan {
  std::vector<ScheduledChunk> chunks;  // row order of the step
  std::vector<uint64_t> preempted;     // release these first, in this order (newest first)
  int num_tokens = 0;                  // sum of num_new_tokens
  int new_blocks = 0;                  // blocks the step allocates beyond those held / hit
};

StepPlan schedule(const SchedulerState& state, const SchedulerConfig& config);

}  // namespace mla::runtime
