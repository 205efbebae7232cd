// Streaming separation of a model's reasoning (`<think>…</think>`) from its answer, on decoded
// text chunks cut at arbitrary bytes. Trade-off: only a tail that could still become a marker (or
// finish a UTF-8 character) is held back, so output lags the model by at most one marker length.
#pragma once

#include <string>
#include <string_view>

namespace mla::tokenizer {

struct ReasoningOptions {
  std::string start_marker = "<think>";
  std::string end_marker = "</think>";
  // R1 / K2-Thinking prompts end with the start marker, so the output begins inside reasoning.
  bool starts_in_reasoning = false;
};

// Text that is safe to emit now; either part may be empty. Never ends inside a UTF-8 character
// (except from finish(), which releases everything, valid or not).
struct ReasoningDelta {
  std::string reasoning_text;
  std::string content_text;
};

// Rules (deterministic in the text, independent of how it is chunked):
//  - The start marker opens reasoning only when nothing but ASCII whitespace precedes it; that
//    whitespace is content. Once non-blank content appears, no marker is looked for again.
//  - Inside reasoning, a start marker preceded only by whitespace of that block is dropped (R1-style
//    models may repeat the prompt's `<think>`); elsewhere inside reasoning it is reasoning text.
//  - The first end marker closes reasoning; everything after it is content, markers included.
//  - A reasoning block still open at finish() stays reasoning (a truncated thought), and a held
//    partial marker is released as text of the current side. Markers themselves are never emitted.
class ReasoningParser {
 public:
  explicit ReasoningParser(ReasoningOptions options = {});

  ReasoningDelta push(std::string_view chunk);
  ReasoningDelta finish();

  bool in_reasoning() const { return state_ == State::kReasoning; }

 private:
  enum class State { kBefore, kReasoning, kContent };
  void drain(ReasoningDelta& out, bool final);
  void emit(ReasoningDelta& out, std::string_view text, bool reasoning);

  ReasoningOptions options_;
  State state_;
  std::string buf_;               // bytes received but not yet emitted
  bool reasoning_nonblank_ = false;  // some non-blank reasoning text was emitted
};

}  // namespace mla::tokenizer
