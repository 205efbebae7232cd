// libFuzzer target for the safetensors header validator: the whole input is a candidate file
// (length prefix, header, data section). Any crash, leak or sanitizer report is a bug; errors
// are the expected outcome for almost every input.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto parsed = mla::io::parse_safetensors_header(std::span<const uint8_t>(data, size), "fuzz.safetensors");
  if (parsed.is_ok()) {
    // Invariants the reader relies on: tensors tile [0, data_size) in order, each sized exactly.
    const auto& h = parsed.value();
    uint64_t covered = 0;
    for (const auto& t : h.tensors) {
      const auto bytes = mla::io::tensor_byte_size(t.dtype, t.shape);
      if (t.begin != covered || !bytes || t.end - t.begin != *bytes) __builtin_trap();
      if (t.numel() < 0) __builtin_trap();  // and must not overflow: UBSan reports signed overflow
      if (t.shape.size() <= size_t(mla::kMaxDims)) {
        // Strides are suffix products of the shape: they must not overflow either.
        const auto v = mla::TensorView::contiguous(nullptr, t.dtype, t.shape.data(), int(t.shape.size()));
        if (v.nbytes() != t.nbytes()) __builtin_trap();
      }
      covered = t.end;
    }
    if (covered != h.data_size || h.data_start + h.data_size != size) __builtin_trap();
  } else if (parsed.status().message().find('\n') != std::string::npos) {
    __builtin_trap();  // errors are one line
  }
  return 0;
}
