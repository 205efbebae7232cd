// Public face of the Jinja-subset engine used for chat templates: parse once, render many times.
// Rendering is bounded (output size, nesting depth, total evaluation steps) so that a hostile
// template fails with an error instead of crashing or hanging the process.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"
#include "tokenizer/jinja_parser.h"
#include "tokenizer/jinja_value.h"

namespace mla::tokenizer::jinja {

struct RenderLimits {
  size_t max_output_bytes = size_t(16) << 20;  // also caps any single string value
  int max_depth = 64;                          // macro calls + nested expression evaluation
  uint64_t max_steps = 20'000'000;             // statements + expressions + loop iterations
};

// `context` must be an object (its entries become top-level variables). Globals `range`,
// `namespace`, `raise_exception`, `strftime_now`, `dict` are provided unless the context
// shadows them.
Result<std::string> render(const Template& tpl, const Value& context, const RenderLimits& limits = {});

// parse_template + render.
Result<std::string> render_string(const std::string& source, const Value& context,
                                  const RenderLimits& limits = {});

}  // namespace mla::tokenizer::jinja
