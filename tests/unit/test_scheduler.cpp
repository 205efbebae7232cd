// The scheduler as a pure function: token budget, decode priority, chunked prefill, max_num_seqs,
// preemption order (newest first), prefix hits, and a randomized simulation with a tiny pool in
// which every request must finish (no starvation, no overcommit).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "runtime/scheduler.h"

namespace mla::runtime {
namespace {

SchedSeq waiting_seq(uint64_t id, int num_tokens) {
  SchedSeq s;
  s.id = id;
  s.arrival = id;
  s.num_tokens = num_tokens;
  return s;
}

// A running sequence with `computed` tokens cached in ceil(computed / bs) private blocks.
SchedSeq running_seq(uint64_t id, int num_tokens, int computed, int bs = 4) {
  SchedSeq s = waiting_seq(id, num_tokens);
  s.num_computed = computed;
  s.num_blocks = (computed + bs - 1) / bs;
  s.num_freeable_blocks = s.num_blocks;
  return s;
}

int total_tokens(const StepPlan& p) {
  int n = 0;
  for (const ScheduledChunk& c : p.chunks) n += c.num_new_tokens;
  return n;
}

TEST(Scheduler, ChunkedPrefillStaysWithinTheTokenBudget) {
  SchedulerState st;
  st.block_size = 4;
  st.available_blocks = 1000;
  st.waiting = {waiting_seq(1, 100), waiting_seq(2, 7), waiting_seq(3, 50)};
  SchedulerConfig cfg;
  cfg.max_tokens_per_step = 64;
  const StepPlan p = schedule(st, cfg);
  ASSERT_EQ(p.chunks.size(), 1u);  // the head takes the whole budget
  EXPECT_EQ(p.chunks[0].id, 1u);
  EXPECT_EQ(p.chunks[0].num_new_tokens, 64);
  EXPECT_FALSE(p.chunks[0].samples);
  EXPECT_TRUE(p.chunks[0].admitted);
  EXPECT_EQ(p.num_tokens, 64);
  EXPECT_EQ(p.new_blocks, 16);

  cfg.max_tokens_per_step = 111;
  const StepPlan q = schedule(st, cfg);
  ASSERT_EQ(q.chunks.size(), 3u);
  EXPECT_EQ(q.chunks[0].num_new_tokens, 100);
  EXPECT_TRUE(q.chunks[0].samples);
  EXPECT_EQ(q.chunks[1].num_new_tokens, 7);
  EXPECT_EQ(q.chunks[2].num_new_tokens, 4);  // the remainder of the budget: a chunk of seq 3
  EXPECT_FALSE(q.chunks[2].samples);
  EXPECT_EQ(total_tokens(q), 111);
}

TEST(Scheduler, DecodesComeFirstThenRunningPrefillThenWaiting) {
  SchedulerState st;
  st.block_size = 4;
  st.available_blocks = 1000;
  st.running = {running_seq(1, 60, 10), running_seq(2, 21, 20), running_seq(3, 9, 8)};
  st.waiting = {waiting_seq(4, 30)};
  SchedulerConfig cfg;
  cfg.max_tokens_per_step = 10;
  const StepPlan p = schedule(st, cfg);
  ASSERT_EQ(p.chunks.size(), 3u);
  EXPECT_EQ(p.chunks[0].id, 2u);  // decodes, oldest first
  EXPECT_EQ(p.chunks[1].id, 3u);
  EXPECT_EQ(p.chunks[0].num_new_tokens, 1);
  EXPECT_TRUE(p.chunks[0].samples);
  EXPECT_EQ(p.chunks[2].id, 1u);  // then the running prefill gets the rest of the budget
  EXPECT_EQ(p.chunks[2].num_new_tokens, 8);
  EXPECT_FALSE(p.chunks[2].samples);
  // With budget left over, the running prefill finishes and the waiting head is admitted.
  cfg.max_tokens_per_step = 100;
  const StepPlan q = schedule(st, cfg);
  ASSERT_EQ(q.chunks.size(), 4u);
  EXPECT_EQ(q.chunks[2].num_new_tokens, 50);
  EXPECT_TRUE(q.chunks[2].samples);
  EXPECT_EQ(q.chunks[3].id, 4u);
  EXPECT_EQ(q.chunks[3].num_new_tokens, 30);
}

TEST(Scheduler, MaxNumSeqsBoundsTheStepAndAdmission) {
  SchedulerState st;
  st.block_size = 4;
  st.available_blocks = 1000;
  for (uint64_t i = 1; i <= 5; ++i) st.running.push_back(running_seq(i, 11, 10));
  st.waiting = {waiting_seq(6, 3)};
  SchedulerConfig cfg;
  cfg.max_num_seqs = 3;
  const StepPlan p = schedule(st, cfg);
  ASSERT_EQ(p.chunks.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(p.chunks[i].id, i + 1);
  // Two running of max 3: exactly one admission even though two wait.
  st.running.resize(2);
  st.waiting = {waiting_seq(6, 3), waiting_seq(7, 3)};
  const StepPlan q = schedule(st, cfg);
  ASSERT_EQ(q.chunks.size(), 3u);
  EXPECT_EQ(q.chunks[2].id, 6u);
}

TEST(Scheduler, PreemptsNewestFirstWhenBlocksRunOut) {
  SchedulerState st;
  st.block_size = 4;
  st.available_blocks = 0;
  // Three decodes, each at a block boundary (8 cached tokens in 2 blocks, a 9th to write).
  st.running = {running_seq(1, 9, 8), running_seq(2, 9, 8), running_seq(3, 9, 8)};
  st.waiting = {waiting_seq(4, 2)};
  const StepPlan p = schedule(st, {});
  ASSERT_EQ(p.preempted.size(), 1u);
  EXPECT_EQ(p.preempted[0], 3u);  // newest, freeing 2 blocks for seqs 1 and 2
  ASSERT_EQ(p.chunks.size(), 2u);
  EXPECT_EQ(p.chunks[0].id, 1u);
  EXPECT_EQ(p.chunks[1].id, 2u);
  EXPECT_EQ(p.new_blocks, 2);
  // No admission in a step that preempted.
  for (const ScheduledChunk& c : p.chunks) EXPECT_FALSE(c.admitted);

  // Blocks shared with others free nothing: preemption walks on to older sequences, and a
  // sequence that is itself the newest candidate preempts itself.
  for (SchedSeq& s : st.running) s.num_freeable_blocks = 0;
  const StepPlan q = schedule(st, {});
  EXPECT_EQ(q.preempted, (std::vector<uint64_t>{3, 2, 1}));
  EXPECT_TRUE(q.chunks.empty());
}

TEST(Scheduler, RunningPrefillShrinksToAvailableBlocksBeforePreempting) {
  SchedulerState st;
  st.block_size = 4;
  st.available_blocks = 2;
  st.running = {running_seq(1, 9, 8), running_seq(2, 40, 4)};
  SchedulerConfig cfg;
  cfg.max_tokens_per_step = 64;
  const StepPlan p = schedule(st, cfg);
  EXPECT_TRUE(p.preempted.empty());
  ASSERT_EQ(p.chunks.size(), 2u);
  EXPECT_EQ(p.chunks[1].id, 2u);
  EXPECT_EQ(p.chunks[1].num_new_tokens, 4);  // one block left after seq 1's decode took one
}

TEST(Scheduler, PrefixHitsSkipComputeAndCountEvictableBlocks) {
  SchedulerState st;
  st.block_size = 4;
  st.available_blocks = 4;
  SchedSeq w = waiting_seq(1, 13);
  w.prefix_hit_tokens = 8;
  w.prefix_hit_evictable = 2;  // both hit blocks are evictable: acquiring them uses 2 of the 4
  st.waiting = {w};
  const StepPlan p = schedule(st, {});
  ASSERT_EQ(p.chunks.size(), 1u);
  EXPECT_EQ(p.chunks[0].prefix_hit_tokens, 8);
  EXPECT_EQ(p.chunks[0].num_new_tokens, 5);
  EXPECT_TRUE(p.chunks[0].samples);
  EXPECT_EQ(p.new_blocks, 2);
  st.waiting[0].num_tokens = 17;  // needs 3 new blocks + 2 evictable hits > 4
  EXPECT_TRUE(schedule(st, {}).chunks.empty());
}

TEST(Scheduler, WaitingHeadBlocksLaterArrivals) {
  SchedulerState st;
  st.block_size = 4;
  st.available_blocks = 3;
  st.waiting = {waiting_seq(1, 40), waiting_seq(2, 4)};
  SchedulerConfig cfg;
  cfg.max_tokens_per_step = 16;  // the head's first chunk needs 4 blocks: it waits, and so does 2
  EXPECT_TRUE(schedule(st, cfg).chunks.empty());
}

// Drives schedule() like the engine: random prompts and output lengths, a pool that holds only a
// few sequences, random arrivals. Every request must finish, the pool must never be overcommitted,
// and a request never waits while a younger one is admitted ahead of it.
TEST(Scheduler, SimulationTinyPoolEveryoneFinishes) {
  struct Sim {
    SchedSeq s;
    int max_out = 0;
    int out = 0;
    bool running = false, done = false;
  };
  std::mt19937 rng(5);
  const int bs = 4, pool = 24;
  std::vector<Sim> sims;
  SchedulerConfig cfg;
  cfg.max_num_seqs = 6;
  cfg.max_tokens_per_step = 32;
  int64_t preemptions = 0;
  int free_blocks = pool;
  uint64_t next_id = 1;
  for (int step = 0; step < 5000; ++step) {
    if (next_id <= 40 && rng() % 3 == 0) {
      Sim n;
      n.s = waiting_seq(next_id++, 1 + int(rng() % 50));
      n.max_out = 1 + int(rng() % 40);  // prompt + output <= 90 tokens <= 24 blocks * 4
      sims.push_back(n);
    }
    SchedulerState st;
    st.block_size = bs;
    st.available_blocks = free_blocks;
    for (Sim& x : sims)
      if (!x.done) (x.running ? st.running : st.waiting).push_back(x.s);
    auto by_arrival = [](const SchedSeq& a, const SchedSeq& b) { return a.arrival < b.arrival; };
    std::sort(st.running.begin(), st.running.end(), by_arrival);
    std::sort(st.waiting.begin(), st.waiting.end(), by_arrival);
    const StepPlan p = schedule(st, cfg);
    auto sim_of = [&](uint64_t id) -> Sim& { return sims[size_t(id - 1)]; };
    for (uint64_t id : p.preempted) {
      Sim& x = sim_of(id);
      free_blocks += x.s.num_blocks;
      x.s.num_blocks = x.s.num_computed = 0;
      x.s.num_freeable_blocks = 0;
      x.running = false;
      ++preemptions;
    }
    size_t admitted = 0;
    int tokens = 0;
    for (const ScheduledChunk& c : p.chunks) {
      Sim& x = sim_of(c.id);
      if (c.admitted) {  // admissions are a prefix of the FIFO queue
        ASSERT_LT(admitted, st.waiting.size());
        EXPECT_EQ(c.id, st.waiting[admitted++].id) << "admitted ahead of an older waiting request";
        x.running = true;
      }
      const int blocks = (x.s.num_computed + c.num_new_tokens + bs - 1) / bs;
      free_blocks -= std::max(0, blocks - x.s.num_blocks);
      x.s.num_blocks = std::max(blocks, x.s.num_blocks);
      x.s.num_freeable_blocks = x.s.num_blocks;
      x.s.num_computed += c.num_new_tokens;
      tokens += c.num_new_tokens;
      ASSERT_LE(x.s.num_computed, x.s.num_tokens);
      if (c.samples) {
        ASSERT_EQ(x.s.num_computed, x.s.num_tokens);
        ++x.out;
        ++x.s.num_tokens;
        if (x.out == x.max_out) {
          x.done = true;
          free_blocks += x.s.num_blocks;
        }
      }
    }
    ASSERT_GE(free_blocks, 0) << "pool overcommitted at step " << step;
    ASSERT_LE(tokens, cfg.max_tokens_per_step);
    ASSERT_LE(int(p.chunks.size()), cfg.max_num_seqs);
    if (next_id > 40 && std::all_of(sims.begin(), sims.end(), [](const Sim& x) { return x.done; })) break;
  }
  EXPECT_EQ(sims.size(), 40u);
  for (const Sim& x : sims) EXPECT_TRUE(x.done) << "request " << x.s.id << " starved";
  EXPECT_EQ(free_blocks, pool);
  EXPECT_GT(preemptions, 0);  // the pool is small enough that preemption happened
}

}  // namespace
}  // namespace mla::runtime
