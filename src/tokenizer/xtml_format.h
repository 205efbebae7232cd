// Kimi K3 "XTML" prompt format, built in (K3 ships Python `encoding_k3.py`, not a Jinja template).
// Built only from ../shared/MODELS.md §5.1; no reference renderer exists here, so choices marked
// [U] below are our reading of those notes and must be re-checked against the real encoder.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace mla::tokenizer {

struct XtmlOptions {
  bool add_generation_prompt = true;
  bool thinking = true;             // generation prompt opens a think block (else a response block)
  std::string thinking_effort;      // "", "low", "high" or "max": a type="thinking-effort" system message
  nlohmann::ordered_json tools;     // array of tool schemas or null: a type="tool-declare" message
};

// Layout (MODELS.md §5.1):
//   preamble   <|open|>message role="system" type="tool-declare"<|sep|>{tools JSON}<|close|>message<|sep|><|end_of_msg|>
//              <|open|>message role="system" type="thinking-effort"<|sep|>high<|close|>message<|sep|><|end_of_msg|>
//   message    <|open|>message role="user"<|sep|>TEXT<|close|>message<|sep|><|end_of_msg|>
//   assistant  <|open|>message role="assistant"<|sep|><|open|>think<|sep|>R<|close|>think<|sep|>
//              <|open|>response<|sep|>C<|close|>response<|sep|>[tools block]<|close|>message<|sep|><|end_of_msg|>
//   tools      <|open|>tools<|sep|><|open|>call tool="NAME" index="1"<|sep|>
//              <|open|>argument key="K" type="string"<|sep|>RAW<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|>
//   gen prompt <|open|>message role="assistant"<|sep|><|open|>think<|sep|>   (thinking off: <|open|>response<|sep|>)
// [U] choices: tool JSON compact (json.dumps separators (',', ':')); non-string arguments as
// type="json" with compact JSON; tool results as role="tool" messages; attribute values escaped
// as XML entities (& < > "); content raw.
Result<std::string> render_xtml(const nlohmann::ordered_json& messages, const XtmlOptions& options);

}  // namespace mla::tokenizer
