// GPU backend core: construction, device memory, host<->device copies, graph capture and the
// grow-once scratch. Every op enqueues on the backend's own stream (STYLE 6: two backends in one
// process do not share state).
#include "backend/gpu/gpu_backend_impl.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "backend/gpu/gpu_linear_state.h"
#include "backend/gpu/gpu_mla_state.h"
#include "backend/gpu/gpu_moe_state.h"
#include "backend/gpu/gpu_sampling_state.h"

namespace mla::gpu {

void fail(const char* expr, Error err, const char* file, int line) {
  std::fprintf(stderr, "%s:%d: GPU call failed: %s: %s\n", file, line, expr, error_string(err));
  std::abort();
}

bool gpu_available() {
  int n = 0;
  return device_count(&n) == kSuccess && n > 0;
}

Result<std::unique_ptr<ops::Backend>> make_gpu_backend(const GpuBackendOptions& options) {
  int n = 0;
  const Error e = device_count(&n);
  if (e != kSuccess) return error("no GPU: {}", error_string(e));
  if (options.device < 0 || options.device >= n) return error("GPU {} requested, {} visible", options.device, n);
  return std::unique_ptr<ops::Backend>(new GpuBackend(options));
}

GpuBackend::GpuBackend(const GpuBackendOptions& options) : options_(options) {
  MLA_GPU_CHECK(set_device(options.device));
  MLA_GPU_CHECK(stream_create(&stream_));
  linear_ = std::make_unique<LinearState>(*this);
  mla_ = std::make_unique<MlaState>();
  moe_ = std::make_unique<MoeState>();
  sampling_ = std::make_unique<SamplingState>();
}

GpuBackend::~GpuBackend() {
  if (stream_) (void)stream_sync(stream_);  // nothing may still read memory freed below
  linear_.reset();
  mla_.reset();
  moe_.reset();
  sampling_.reset();
  placed_.clear();
  if (stream_) (void)stream_destroy(stream_);
}

Buffer GpuBackend::alloc(size_t bytes) {
  MLA_CHECK(!capturing_, "alloc of {} bytes while recording a graph", bytes);
  void* p = nullptr;
  const size_t n = bytes == 0 ? 1 : bytes;
  MLA_GPU_CHECK(malloc(&p, n));
  // Zero-filled, as the interface promises; synchronous so the buffer is usable from any stream.
  MLA_GPU_CHECK(memset_async(p, 0, n, stream_));
  MLA_GPU_CHECK(stream_sync(stream_));
  return Buffer(p, n, [](void* q) { (void)free(q); });
}

TensorView GpuBackend::place_weight(const TensorView& host) {
  MLA_CHECK(host.is_contiguous(), "place_weight: {} is not contiguous", host.describe());
  placed_.push_back(alloc(host.nbytes()));
  TensorView v = host;
  v.data = placed_.back().data();
  copy_from_host(v, host.data);
  MLA_GPU_CHECK(stream_sync(stream_));  // the host view (an mmap) may go away after load
  return v;
}

bool GpuBackend::is_placed(const void* p) const {
  const char* c = static_cast<const char*>(p);
  return std::any_of(placed_.begin(), placed_.end(), [c](const Buffer& b) {
    const char* b0 = static_cast<const char*>(b.data());
    return c >= b0 && c < b0 + b.size();
  });
}

void GpuBackend::copy_from_host(const TensorView& dst, const void* src) {
  MLA_CHECK(!capturing_, "copy_from_host while recording a graph");
  MLA_CHECK(dst.is_contiguous(), "copy_from_host: destination {} is not contiguous", dst.describe());
  if (dst.nbytes() == 0) return;
  MLA_CHECK(dst.data != nullptr && src != nullptr, "copy_from_host: null pointer");
  // Pageable source: the runtime stages it before returning, so the caller may reuse `src` at once.
  MLA_GPU_CHECK(memcpy_h2d(dst.data, src, dst.nbytes(), stream_));
}

void GpuBackend::copy_to_host(void* dst, const TensorView& src) {
  MLA_CHECK(!capturing_, "copy_to_host while recording a graph");
  MLA_CHECK(src.is_contiguous(), "copy_to_host: source {} is not contiguous", src.describe());
  if (src.nbytes() == 0) return;
  MLA_CHECK(dst != nullptr && src.data != nullptr, "copy_to_host: null pointer");
  MLA_GPU_CHECK(memcpy_d2h(dst, src.data, src.nbytes(), stream_));
  MLA_GPU_CHECK(stream_sync(stream_));
}

void GpuBackend::synchronize() { MLA_GPU_CHECK(stream_sync(stream_)); }

namespace {
class GpuGraph final : public ops::OpGraph {
 public:
  GpuGraph(GraphExec exec, Stream stream) : exec_(exec), stream_(stream) {}
  ~GpuGraph() override { (void)graph_exec_destroy(exec_); }
  void replay() override { MLA_GPU_CHECK(graph_launch(exec_, stream_)); }

 private:
  GraphExec exec_;
  Stream stream_;
};
}  // namespace

std::unique_ptr<ops::OpGraph> GpuBackend::capture(const std::function<void()>& record) {
  MLA_CHECK(!capturing_, "nested graph capture");
  MLA_GPU_CHECK(capture_begin(stream_));
  capturing_ = true;
  record();
  capturing_ = false;
  Graph graph = nullptr;
  MLA_GPU_CHECK(capture_end(stream_, &graph));
  GraphExec exec = nullptr;
  MLA_GPU_CHECK(graph_instantiate(&exec, graph));
  MLA_GPU_CHECK(graph_destroy(graph));
  return std::make_unique<GpuGraph>(exec, stream_);
}

void* Scratch::get(GpuBackend& backend, size_t bytes) {
  if (bytes > buf_.size()) {
    MLA_CHECK(!backend.capturing(), "scratch must grow from {} to {} bytes while recording a graph "
              "(run the step eagerly first)", buf_.size(), bytes);
    const size_t grown = std::max(bytes, buf_.size() + buf_.size() / 2);  // geometric: few retirements
    if (buf_.size() > 0) retired_.push_back(std::move(buf_));  // earlier graphs may replay on it
    buf_ = backend.alloc(grown);
  }
  return buf_.data();
}

DeviceWeight device_weight(const ops::Weight& w) {
  MLA_CHECK(w.data.data != nullptr, "weight has no data");
  MLA_CHECK(w.data.ndim == 2 && w.data.inner_contiguous(), "weight data {} must be 2-D, rows contiguous",
            w.data.describe());
  DeviceWeight d;
  d.format = w.format;
  d.out = w.out_features;
  d.in = w.in_features;
  d.data = w.data.data;
  d.data_dtype = w.data.dtype;
  d.data_stride = w.data.stride[0];
  if (w.format != ops::WeightFormat::Dense) {
    MLA_CHECK(w.scale.data != nullptr && w.scale.ndim == 2 && w.scale.inner_contiguous(),
              "weight scale {} must be 2-D, rows contiguous", w.scale.describe());
    d.scale = w.scale.data;
    d.scale_dtype = w.scale.dtype;
    d.scale_stride = w.scale.stride[0];
  }
  return d;
}

void check_device_view(const TensorView& v, const char* op, const char* name) {
  MLA_CHECK(v.numel() == 0 || v.data != nullptr, "{}: {} is null", op, name);
}

}  // namespace mla::gpu
