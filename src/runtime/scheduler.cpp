// schedule(): capacity (sequences, blocks, block-table entries) and token budget in one pass.
// O(R^2) in the worst case (victim search per preemption), R <= max_num_seqs: negligible next to a
// forward step.
#include "runtime/scheduler.h"

#include <algorithm>

#include "core/status.h"

namespace mla::runtime {

StepPlan schedule(const SchedulerState& state, const SchedulerConfig& config) {
  MLA_CHECK(state.block_size > 0 && config.max_num_seqs > 0 && config.max_tokens_per_step > 0,
            "bad scheduler config: block_size {} max_num_seqs {} max_tokens_per_step {}", state.block_size,
            config.max_num_seqs, config.max_tokens_per_step);
  const int bs = state.block_size;
  const auto blocks_for = [bs](int tokens) { return (tokens + bs - 1) / bs; };
  StepPlan plan;
  int budget = config.max_tokens_per_step;
  int avail = state.available_blocks;
  int entries = 0;
  const size_t R = state.running.size();
  std::vector<char> scheduled(R, 0), preempted(R, 0);

  // Decode priority: one-token sequences first, then prefill chunks; oldest first within each.
  std::vector<size_t> order;
  for (size_t i = 0; i < R; ++i)
    if (state.running[i].num_tokens - state.running[i].num_computed == 1) order.push_back(i);
  for (size_t i = 0; i < R; ++i)
    if (state.running[i].num_tokens - state.running[i].num_computed > 1) order.push_back(i);

  for (size_t i : order) {
    if (budget == 0 || int(plan.chunks.size()) == config.max_num_seqs) break;
    if (preempted[i]) continue;
    const SchedSeq& s = state.running[i];
    const int remaining = s.num_tokens - s.num_computed;
    int n = std::min(remaining, budget);
    // A decode verifies its drafts only whole: with too little budget it decodes one token.
    const int drafts = (remaining == 1 && s.num_lookahead > 0 && 1 + s.num_lookahead <= budget) ? s.num_lookahead : 0;
    n += drafts;
    // A prefill chunk shrinks to the blocks at hand before anyone is preempted for it.
    if (n > 1 && drafts == 0) {
      const int fit = (s.num_blocks + avail) * bs - s.num_computed;
      if (fit > 0) n = std::min(n, fit);
    }
    const int table = std::max(s.num_blocks, blocks_for(s.num_computed + n));
    if (entries + table > config.max_block_entries) continue;
    const int need = table - s.num_blocks;
    while (need > avail) {
      // Preempt the newest running sequence not scheduled this step (possibly this one).
      size_t victim = R;
      for (size_t j = 0; j < R; ++j)
        if (!scheduled[j] && !preempted[j] && (victim == R || state.running[j].arrival > state.running[victim].arrival))
          victim = j;
      MLA_CHECK(victim < R, "no preemption victim");
      preempted[victim] = 1;
      plan.preempted.push_back(state.running[victim].id);
      avail += state.running[victim].num_freeable_blocks;
      if (victim == i) break;
    }
    if (preempted[i]) continue;
    avail -= need;
    budget -= n;
    entries += table;
    scheduled[i] = 1;
    plan.chunks.push_back({s.id, n, 0, false, s.num_computed + n - drafts == s.num_tokens, drafts});
    plan.new_blocks += need;
    plan.num_tokens += n;
  }

  // Admission only when nobody was preempted (memory is tight otherwise), strictly FIFO: the
  // head of the queue blocks later arrivals, so it cannot starve.
  if (!plan.preempted.empty()) return plan;
  int num_running = int(R);
  for (const SchedSeq& w : state.waiting) {
    if (budget == 0 || num_running >= config.max_num_seqs || int(plan.chunks.size()) >= config.max_num_seqs) break;
    const int hit = w.prefix_hit_tokens;
    MLA_CHECK(hit % bs == 0 && hit < w.num_tokens, "prefix hit {} of {} tokens", hit, w.num_tokens);
    const int n = std::min(w.num_tokens - hit, budget);
    const int table = blocks_for(hit + n);
    const int need = table - hit / bs + w.prefix_hit_evictable;  // acquiring evictable hits uses them up
    if (need > avail || entries + table > config.max_block_entries) break;
    avail -= need;
    budget -= n;
    entries += table;
    ++num_running;
    plan.chunks.push_back({w.id, n, hit, true, hit + n == w.num_tokens});
    plan.new_blocks += table - hit / bs;
    plan.num_tokens += n;
  }
  return plan;
}

}  // namespace mla::runtime
