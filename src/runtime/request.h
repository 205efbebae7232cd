// One serving request: its parameters (OpenAI completion semantics, validated here so the server
// and the engine share one definition), its state machine, its output deltas and the thread-safe
// channel that carries them to the caller. Text is held back while it could be the start of a stop
// string, so a stop string is never emitted even when split across tokens; the price is that a
// stream lags by at most (longest stop string - 1) bytes.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/prefix_cache.h"
#include "runtime/sampler.h"
#include "tokenizer/tokenizer.h"

namespace mla::runtime {

constexpr int kMaxTopLogprobs = 20;  // OpenAI's cap on top_logprobs (and vLLM's default max_logprobs)

struct RequestParams {
  std::vector<int32_t> prompt;             // token ids, non-empty
  SamplingParams sampling;
  int max_tokens = 16;                     // tokens to generate, >= 1
  int min_tokens = 0;                      // EOS / stop tokens are masked and stop strings unchecked until then
  bool ignore_eos = false;                 // keep generating past EOS (stop_token_ids still stop)
  std::vector<int32_t> stop_token_ids;     // generating one ends the request
  std::vector<std::string> stop;           // stop strings (need the engine's tokenizer)
  bool include_stop_str_in_output = false; // vLLM's flag: keep the matched stop string / token text
  std::optional<int> logprobs;             // nullopt: none; k in [0, 20]: sampled token + top-k
  std::optional<std::string> cache_salt;   // prefix-cache tenant isolation
  bool skip_special_tokens = true;         // in the returned text
};

// What the server maps to an HTTP status: InvalidParam and ContextLengthExceeded -> 400 (the latter
// with code "context_length_exceeded"), QueueFull -> 429, ShuttingDown / EngineDead -> 503.
enum class ErrorCode : uint8_t { InvalidParam, ContextLengthExceeded, QueueFull, ShuttingDown, EngineDead };

struct EngineError {
  ErrorCode code = ErrorCode::InvalidParam;
  std::string message;  // human-readable, with the offending values
  std::string param;    // the OpenAI field at fault ("temperature", "max_tokens"), or ""
};

struct RequestLimits {
  int vocab_size = 0;
  int max_model_len = 0;       // prompt + max_tokens must not exceed it
  bool has_tokenizer = false;  // stop strings need one
};

std::optional<EngineError> validate_request(const RequestParams& p, const RequestLimits& limits);

enum class FinishReason : uint8_t { None, Stop, Length, Abort, Error };
std::string_view finish_reason_name(FinishReason r);  // "", "stop", "length", "abort", "error"

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;                         // log_softmax of the raw logits (before temperature)
  std::vector<std::pair<int32_t, float>> top;  // the k most likely (id, logprob), descending
};

// One delta of a request's output. Deltas concatenate: tokens, text and logprobs are new since the
// previous delta; usage counts are totals so far.
struct RequestOutput {
  uint64_t request_id = 0;
  std::vector<int32_t> token_ids;
  std::string text;
  std::vector<TokenLogprob> logprobs;  // one per entry of token_ids when logprobs were asked for
  bool finished = false;
  FinishReason finish_reason = FinishReason::None;
  std::optional<std::string> stop_string;  // the stop string that matched (finish "stop")
  std::optional<int32_t> stop_token;       // the stop / EOS token that matched (finish "stop")
  std::string error;                       // finish "error": what went wrong
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_tokens = 0;  // prompt tokens served from the prefix cache
};

// The channel from the engine thread to one consumer. Thread-safe. Pending deltas are merged on
// read, so a slow reader gets fewer, larger deltas instead of an unbounded backlog of small ones.
class RequestStream {
 public:
  explicit RequestStream(uint64_t id) : id_(id) {}
  uint64_t id() const { return id_; }
  // Waits up to `timeout` for output; nullopt on timeout or when the final delta was already read.
  std::optional<RequestOutput> next(std::chrono::milliseconds timeout);
  // Waits for output without a limit; nullopt only after the final delta was read.
  std::optional<RequestOutput> next();
  bool done() const;  // the final delta has been read

  // Engine side.
  void push(RequestOutput out);

 private:
  std::optional<RequestOutput> take_locked();
  const uint64_t id_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<RequestOutput> pending_;
  bool finished_pushed_ = false;
  bool finished_read_ = false;
};

// Incremental stop-string matching over streamed text.
class StopStringMatcher {
 public:
  StopStringMatcher() = default;
  StopStringMatcher(std::vector<std::string> stops, bool include_stop);
  struct Step {
    std::string emit;                    // text safe to send now
    std::optional<std::string> matched;  // set when a stop string ended the text
  };
  // Appends `piece`; with check=false (before min_tokens) no stop is matched and nothing is held.
  Step push(std::string_view piece, bool check);
  std::string flush();  // held-back text, when the request ends for another reason

 private:
  std::vector<std::string> stops_;
  bool include_stop_ = false;
  std::string held_;  // a suffix that is a proper prefix of some stop string
};

enum class RequestStatus : uint8_t {
  Waiting,    // accepted, never scheduled
  Running,    // holds KV blocks, scheduled each step
  Preempted,  // blocks released; recomputes prompt + output when readmitted
  Finished,   // terminal
};
// Legal moves: Waiting->Running, Running->Preempted, Preempted->Running, any non-terminal->Finished.
bool request_transition_allowed(RequestStatus from, RequestStatus to);

// The engine thread's state of one request (not thread-safe; owned by the engine thread).
struct Request {
  Request(uint64_t request_id, uint64_t arrival_order, RequestParams request_params,
          std::shared_ptr<RequestStream> output, const tokenizer::Tokenizer* tok);

  void transition(RequestStatus to);  // checks legality
  int num_tokens() const { return int(tokens.size()); }
  int num_output() const { return int(tokens.size()) - prompt_len; }

  uint64_t id;
  uint64_t arrival;  // submission order; smaller = older (FIFO and preemption order)
  RequestParams params;
  std::shared_ptr<RequestStream> stream;
  RequestStatus status = RequestStatus::Waiting;
  bool admitted_once = false;

  std::vector<int32_t> tokens;  // prompt, then generated
  int prompt_len = 0;
  int num_computed = 0;              // leading tokens whose latents are in the cache
  std::vector<int32_t> blocks;       // KV blocks covering positions [0, blocks.size() * block_size)
  BlockHash root_hash{};             // prefix chain root (salted)
  std::vector<BlockHash> hashes;     // chain hashes of the full blocks computed so far
  int num_registered_blocks = 0;     // leading blocks already offered to the prefix cache
  int cached_tokens = 0;             // prefix-cache hit at first admission (usage)
  int num_preemptions = 0;
  // Speculative decoding: drafts proposed for the next step (verified after tokens.back()) and
  // their row in the speculator's last proposal. Cleared whenever the proposal goes stale.
  std::vector<int32_t> draft_tokens;
  int draft_q_row = -1;

  RequestRng rng;
  std::unique_ptr<tokenizer::IncrementalDetokenizer> detok;  // null without a tokenizer
  StopStringMatcher stopper;

  std::chrono::steady_clock::time_point arrival_time;
  std::chrono::steady_clock::time_point last_token_time;  // for inter-token latency
};

}  // namespace mla::runtime
