// Writes a byte-level tokenizer in Kimi's on-disk layout (tiktoken.model + tokenizer_config.json +
// generation_config.json) for random-weight models whose vocabulary is exactly 256 byte tokens
// plus 256 special slots (make-model's tiny preset). It lets text prompts, chat templates and
// text output run end to end on a model that has no trained tokenizer yet.
#pragma once

#include <string>

#include "core/status.h"

namespace mla::tokenizer {

// Vocabulary size of the layout: 256 byte tokens + 256 special slots.
constexpr int kByteTokenizerVocab = 512;

// Writes the three files into `dir`: ids 0..255 are the single bytes, 256 [BOS], 257 [EOS],
// 258 <|im_end|>, 259 <|im_user|>, 260 <|im_assistant|>, 261 <|im_system|>, 262 <|im_middle|>, and a
// Kimi K2-style chat template; generation stops at [EOS] or <|im_end|>.
Status write_byte_level_tokenizer(const std::string& dir);

}  // namespace mla::tokenizer
