// Checks shared by every backend's implementation of an op (the contracts are in backend.h).
#include "ops/backend.h"

#include "core/status.h"

namespace mla::ops {

void check_linear_group(std::span<const Weight* const> w, std::span<const TensorView> out) {
  MLA_CHECK(w.size() == out.size() && w.size() <= Backend::kMaxLinearGroup,
            "linear_group: {} weights, {} outputs (at most {})", w.size(), out.size(), Backend::kMaxLinearGroup);
  for (size_t i = 0; i < out.size(); ++i)
    for (size_t j = i + 1; j < out.size(); ++j)
      MLA_CHECK(!views_alias(out[i], out[j]), "linear_group: out {} aliases out {}", i, j);
}

}  // namespace mla::ops
