// The serving engine: one engine thread loops schedule -> build ForwardInputs -> model.forward ->
// sample -> per-request output channels, over a paged KV cache with prefix caching. Callers on any
// thread submit, abort, read metrics and shut down; only the engine thread touches the model, the
// cache and request state, so the hot loop takes a lock only to swap its inbox. Trade-off: host
// work (scheduling, detokenizing, logprobs) is serial with the forward; it is O(rows) per step.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "model/deepseek_v3.h"
#include "runtime/kv_cache.h"
#include "runtime/output_delivery.h"
#include "runtime/prefix_cache.h"
#include "runtime/request.h"
#include "runtime/sampler.h"
#include "runtime/scheduler.h"
#include "spec/speculator.h"
#include "tokenizer/tokenizer.h"

namespace mla::runtime {

struct EngineConfig {
  int max_num_seqs = 64;          // running sequences (<= the model's ModelLimits::max_seqs)
  int max_tokens_per_step = 512;  // token budget per step (<= ModelLimits::max_tokens)
  int block_size = 16;            // tokens per KV block
  int num_blocks = 1024;          // KV blocks in the pool (the memory budget)
  int max_model_len = 0;          // 0: min(max_position_embeddings, num_blocks * block_size)
  int max_waiting = 256;          // accepted but not yet started requests; beyond: QueueFull (429)
  bool enable_prefix_caching = true;
  model::MlaPath mla_path = model::MlaPath::Auto;
  DType kv_cache_dtype = DType::F32;  // F32 or BF16 latents (GPU: BF16 halves decode bytes)
  bool decode_graphs = false;         // replay captured graphs for decode-only steps (GPU: on)
  std::vector<int32_t> eos_token_ids;  // end generation unless ignore_eos (usually the tokenizer's)
  int num_draft_tokens = 0;           // speculative decoding: drafts per step (K >= 1 with a draft)
};

// Fixed-bucket latency histogram (seconds). counts[i] counts samples <= bounds[i] and > bounds[i-1];
// counts.back() the samples above every bound. Prometheus wants the cumulative form: sum prefixes.
struct LatencyHistogram {
  std::vector<double> bounds;
  std::vector<uint64_t> counts;  // bounds.size() + 1
  double sum = 0;
  uint64_t count = 0;
  explicit LatencyHistogram(std::vector<double> b = {});
  void observe(double seconds);
};

struct EngineMetrics {
  int num_running = 0;
  int num_waiting = 0;            // queued, including preempted sequences waiting to recompute
  int num_blocks = 0;
  int num_blocks_used = 0;        // held by requests (excludes cache-only blocks)
  int num_blocks_cached_evictable = 0;  // held only by the prefix cache; reusable on demand
  double kv_usage = 0;            // num_blocks_used / num_blocks
  int64_t prefix_queried_tokens = 0;
  int64_t prefix_hit_tokens = 0;
  double prefix_hit_rate = 0;     // hit / queried (0 before any query)
  int64_t prompt_tokens = 0;      // tokens in (prompts of admitted requests, counted once)
  int64_t generation_tokens = 0;  // tokens out
  int64_t preemptions = 0;
  int64_t steps = 0;
  // Where the engine thread's time goes (seconds, summed over steps): `forward_seconds` from staging a
  // step to its sampled ids on the host (model + sampling/verification: the device's share);
  // `step_seconds` whole steps (plus scheduling, block bookkeeping, detokenizing, stream pushes).
  // Server overhead per token is measured against forward_seconds / steps.
  double forward_seconds = 0;
  double step_seconds = 0;
  // The same over decode-only steps (every scheduled sequence decodes: one token, or one plus its
  // drafts), the steady state whose host share is the server's per-token overhead.
  int64_t decode_steps = 0;
  double decode_forward_seconds = 0;
  double decode_step_seconds = 0;
  int64_t requests_finished[5] = {};  // by FinishReason (index = enum value)
  LatencyHistogram ttft;              // submit -> first token
  LatencyHistogram itl;               // between consecutive tokens of a request
  LatencyHistogram e2e;               // submit -> finish
  bool healthy = true;                // false once the engine thread failed
  spec::SpecStats spec;               // speculative decoding acceptance (zeros without a draft)
  bool speculative = false;
};

// submit()'s answer: a stream, or an error the server maps to a status (see ErrorCode).
struct SubmitResult {
  std::shared_ptr<RequestStream> stream;
  EngineError error;
  bool ok() const { return stream != nullptr; }
};

class Engine {
 public:
  // Validates `config` against the model's limits and starts the engine thread. `tok` (may be
  // null: token ids only, no text, no stop strings) and `model` must outlive the engine.
  // With `draft` (must outlive the engine), decoding is speculative: config.num_draft_tokens drafts
  // per sequence and step, verified losslessly.
  static Result<std::unique_ptr<Engine>> create(model::DeepseekV3& model, ops::Backend& backend,
                                                const tokenizer::Tokenizer* tok, const EngineConfig& config,
                                                spec::DraftModel* draft = nullptr);
  ~Engine();  // shutdown(/*drain=*/false)
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Thread-safe. Validates, then queues. Output arrives on the stream as deltas; the last one has
  // finished = true. Errors: InvalidParam / ContextLengthExceeded (nothing queued), QueueFull,
  // ShuttingDown, EngineDead.
  SubmitResult submit(RequestParams params);
  // Thread-safe, idempotent, unknown ids ignored. The request ends with finish_reason "abort" and
  // its blocks are released at the start of the next step.
  void abort(uint64_t request_id);
  EngineMetrics metrics() const;
  // Stops accepting (submit answers ShuttingDown). drain: finishes every accepted request first;
  // otherwise aborts them. Joins the engine thread. Idempotent.
  void shutdown(bool drain = true);
  bool healthy() const { return !dead_.load(); }
  int max_model_len() const { return max_model_len_; }
  const EngineConfig& config() const { return config_; }

 private:
  Engine(model::DeepseekV3& model, ops::Backend& backend, const tokenizer::Tokenizer* tok, const EngineConfig& config,
         int max_model_len, spec::DraftModel* draft);
  void run();                 // the engine thread
  void take_inbox(std::vector<std::unique_ptr<Request>>& fresh, std::vector<uint64_t>& aborts);
  void step();
  void apply_plan(const StepPlan& plan);
  void forward_and_sample(const StepPlan& plan);
  // The speculative step (engine_spec.cpp): forward over chunks whose decodes carry drafts, verify,
  // emit, roll the blocks back to what the accepted tokens need, then draft for the next step.
  void forward_and_verify(const StepPlan& plan);
  void propose_drafts(const StepPlan& plan, std::span<const int> first_pos, std::span<const int> row0);
  void trim_blocks(Request& r, int tokens);
  void register_full_blocks(Request& r);
  void emit_token(Request& r, int32_t token, const float* logits_row, bool want_logprobs);
  void finish(Request& r, FinishReason reason, RequestOutput out);
  void release_blocks(Request& r);
  void preempt(Request& r);
  void fail_all(const std::string& why);
  void publish_metrics();
  Request* find(uint64_t id);

  model::DeepseekV3& model_;
  ops::Backend& backend_;
  const tokenizer::Tokenizer* tok_;
  const EngineConfig config_;
  const int max_model_len_;
  const int vocab_;

  // Engine-thread state.
  KvCache cache_;
  PrefixCache prefix_;
  std::vector<TensorView> cache_layers_;
  Sampler sampler_;
  std::unique_ptr<spec::Speculator> speculator_;  // null without a draft
  Buffer logits_buf_;
  std::unordered_map<uint64_t, std::unique_ptr<Request>> requests_;
  std::vector<Request*> running_;  // oldest first
  std::vector<Request*> waiting_;  // by arrival
  // Step scratch, reused.
  std::vector<int32_t> ids_, positions_, logits_rows_, sampled_;
  std::vector<model::SequenceSlice> slices_;
  std::vector<float> host_logits_;
  double stat_forward_seconds_ = 0, stat_step_seconds_ = 0, stat_decode_forward_seconds_ = 0,
         stat_decode_step_seconds_ = 0;
  int64_t stat_decode_steps_ = 0;
  double step_forward_seconds_ = 0;  // this step's forward share (set by the forward functions)
  bool step_decode_only_ = false;     // this step scheduled decodes only
  std::vector<OutputDelivery::Item> outbox_;  // this step's outputs, posted to delivery_ once
  int64_t stat_prompt_tokens_ = 0, stat_generation_tokens_ = 0, stat_preemptions_ = 0, stat_steps_ = 0;
  int64_t stat_finished_[5] = {};
  LatencyHistogram ttft_, itl_, e2e_;

  // Shared with callers (under mu_).
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Request>> inbox_;
  std::vector<uint64_t> abort_inbox_;
  uint64_t next_id_ = 1;
  int num_unstarted_ = 0;  // accepted, not yet admitted once (the bounded queue)
  bool stopping_ = false;  // no new submissions
  bool drain_ = true;
  EngineMetrics metrics_;  // last published snapshot
  std::atomic<bool> dead_{false};
  std::mutex join_mu_;  // serializes concurrent shutdown() joins
  std::thread thread_;
  OutputDelivery delivery_;  // stopped after thread_ is joined (shutdown), so nothing is lost
};

}  // namespace mla::runtime
