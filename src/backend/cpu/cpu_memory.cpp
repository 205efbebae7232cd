// CPU backend memory: backend memory *is* host memory, so weights are used in place (zero copy from
// the mmapped checkpoint) and copies are plain memcpy. Nothing is asynchronous.
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_util.h"

namespace mla::cpu {

Buffer CpuBackend::alloc(size_t bytes) { return host_alloc(bytes); }

TensorView CpuBackend::place_weight(const TensorView& host) { return host; }

void CpuBackend::copy_from_host(const TensorView& dst, const void* src) {
  MLA_CHECK(dst.is_contiguous(), "copy_from_host: destination {} is not contiguous", dst.describe());
  if (dst.nbytes() == 0) return;
  MLA_CHECK(dst.data != nullptr && src != nullptr, "copy_from_host: null pointer");
  std::memcpy(dst.data, src, dst.nbytes());
}

void CpuBackend::copy_to_host(void* dst, const TensorView& src) {
  MLA_CHECK(src.is_contiguous(), "copy_to_host: source {} is not contiguous", src.describe());
  if (src.nbytes() == 0) return;
  MLA_CHECK(dst != nullptr && src.data != nullptr, "copy_to_host: null pointer");
  std::memcpy(dst, src.data, src.nbytes());
}

namespace {
// The CPU has no graphs: replay re-runs the recorded ops eagerly.
class EagerGraph final : public ops::OpGraph {
 public:
  explicit EagerGraph(std::function<void()> record) : record_(std::move(record)) {}
  void replay() override { record_(); }

 private:
  std::function<void()> record_;
};
}  // namespace

std::unique_ptr<ops::OpGraph> CpuBackend::capture(const std::function<void()>& record) {
  return std::make_unique<EagerGraph>(record);
}

std::unique_ptr<ops::Backend> make_cpu_backend(const CpuBackendOptions& options) {
  return std::make_unique<CpuBackend>(options);
}

}  // namespace mla::cpu
