// ReasoningParser: a three-state scanner (before / reasoning / content) over a small buffer.
// Invariant: buf_ only ever holds a possible marker prefix or an incomplete UTF-8 tail between
// calls, so each push costs O(chunk + marker length).
#include "tokenizer/reasoning_parser.h"

#include <utility>

#include "tokenizer/marker_scan.h"

namespace mla::tokenizer {

ReasoningParser::ReasoningParser(ReasoningOptions options)
    : options_(std::move(options)),
      state_(options_.starts_in_reasoning ? State::kReasoning : State::kBefore) {}

ReasoningDelta ReasoningParser::push(std::string_view chunk) {
  buf_.append(chunk);
  ReasoningDelta out;
  drain(out, /*final=*/false);
  return out;
}

ReasoningDelta ReasoningParser::finish() {
  ReasoningDelta out;
  drain(out, /*final=*/true);
  return out;
}

void ReasoningParser::emit(ReasoningDelta& out, std::string_view text, bool reasoning) {
  if (text.empty()) return;
  if (reasoning) {
    out.reasoning_text.append(text);
    if (!is_blank(text)) reasoning_nonblank_ = true;
  } else {
    out.content_text.append(text);
  }
}

void ReasoningParser::drain(ReasoningDelta& out, bool final) {
  const std::string_view start = options_.start_marker;
  const std::string_view end = options_.end_marker;
  for (;;) {
    std::string_view buf = buf_;
    if (state_ == State::kBefore) {
      MarkerHit hit = find_first_marker(buf, {start});
      if (hit.found()) {
        if (!is_blank(buf.substr(0, hit.pos))) {
          state_ = State::kContent;
          continue;
        }
        emit(out, buf.substr(0, hit.pos), /*reasoning=*/false);
        buf_.erase(0, hit.pos + start.size());
        state_ = State::kReasoning;
        continue;
      }
      size_t keep = final ? 0 : partial_marker_suffix(buf, {start});
      std::string_view head = buf.substr(0, buf.size() - keep);
      if (!is_blank(head)) {
        state_ = State::kContent;
        continue;
      }
      emit(out, head, /*reasoning=*/false);  // blank, hence ASCII: no UTF-8 tail to hold
      buf_.erase(0, head.size());
      return;
    }
    if (state_ == State::kReasoning) {
      MarkerHit hit = find_first_marker(buf, {end, start});
      if (hit.found()) {
        std::string_view prefix = buf.substr(0, hit.pos);
        if (hit.which == 0) {
          emit(out, prefix, /*reasoning=*/true);
          buf_.erase(0, hit.pos + end.size());
          state_ = State::kContent;
          continue;
        }
        // A start marker inside reasoning: dropped when it opens the block (a repeated
        // `<think>`), otherwise it is literal reasoning text.
        bool at_block_start = !reasoning_nonblank_ && is_blank(prefix);
        emit(out, buf.substr(0, at_block_start ? hit.pos : hit.pos + start.size()), /*reasoning=*/true);
        buf_.erase(0, hit.pos + start.size());
        continue;
      }
      size_t keep = 0;
      if (!final) {
        keep = partial_marker_suffix(buf, {end, start});
        keep += incomplete_utf8_suffix(buf.substr(0, buf.size() - keep));
      }
      emit(out, buf.substr(0, buf.size() - keep), /*reasoning=*/true);
      buf_.erase(0, buf.size() - keep);
      return;
    }
    // kContent: no more markers; only an unfinished UTF-8 character is held.
    size_t keep = final ? 0 : incomplete_utf8_suffix(buf);
    emit(out, buf.substr(0, buf.size() - keep), /*reasoning=*/false);
    buf_.erase(0, buf.size() - keep);
    return;
  }
}

}  // namespace mla::tokenizer
