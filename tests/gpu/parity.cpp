// Parity harness implementation and the GPU test binary's main(): creates the CPU reference and the
// GPU backend once, runs every test, and prints the summary table of what ran and what passed.
#include "gpu/parity.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>

#include "backend/cpu/cpu_backend.h"
#include "backend/gpu/gpu_backend.h"

namespace mla::test {

namespace {

struct Row {
  std::string op, case_name;
  double worst = 0;  // max |err| / (atol + rtol |ref|)
  bool pass = false;
  std::string detail;
};

std::vector<Row>& rows() {
  static std::vector<Row> r;
  return r;
}

std::unique_ptr<ops::Backend> g_cpu, g_gpu;

std::shared_ptr<Buffer> shared(Buffer b) { return std::make_shared<Buffer>(std::move(b)); }

Twin make_twin(DType dtype, std::initializer_list<int64_t> shape) {
  Twin t;
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  const size_t bytes = size_t(n) * dtype_size(dtype);
  t.host_buf = shared(cpu_backend().alloc(bytes));
  t.dev_buf = shared(gpu_backend().alloc(bytes));
  t.cpu = t.host_buf->view(dtype, shape);
  t.gpu = t.dev_buf->view(dtype, shape);
  return t;
}

float element_as_float(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::F32: return static_cast<const float*>(base)[i];
    case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::F16: return f16_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::I32: return float(static_cast<const int32_t*>(base)[i]);
    default: return NAN;
  }
}

// The byte every poisoned output buffer is filled with: 0xFF (NaN for F32/BF16/F16) or kPoisonI32's.
uint8_t poison_byte(DType t) { return t == DType::I32 ? uint8_t(kPoisonI32 & 0xFF) : uint8_t(0xFF); }
static_assert(kPoisonI32 == 0x7F7F7F7F, "poison_byte assumes a poison of one repeated byte");

int32_t word_at(const void* base, int64_t i) {
  int32_t v;
  std::memcpy(&v, static_cast<const char*>(base) + i * 4, 4);
  return v;
}

// Element offsets (within the buffer) of every element of `v`, row-major over the view's shape.
std::vector<int64_t> view_offsets(const TensorView& v, int64_t base) {
  std::vector<int64_t> out;
  out.reserve(size_t(v.numel()));
  std::array<int64_t, kMaxDims> idx{};
  const int64_t n = v.numel();
  for (int64_t k = 0; k < n; ++k) {
    int64_t off = base;
    for (int d = 0; d < v.ndim; ++d) off += idx[size_t(d)] * v.stride[size_t(d)];
    out.push_back(off);
    for (int d = v.ndim - 1; d >= 0; --d) {
      if (++idx[size_t(d)] < v.shape[size_t(d)]) break;
      idx[size_t(d)] = 0;
    }
  }
  return out;
}

}  // namespace

ops::Backend& cpu_backend() { return *g_cpu; }
ops::Backend& gpu_backend() { return *g_gpu; }

int64_t Twin::offset() const {
  return int64_t((static_cast<const char*>(cpu.data) - static_cast<const char*>(host_buf->data())) /
                 int64_t(dtype_size(cpu.dtype)));
}

Twin Twin::slice(int d, int64_t start, int64_t len) const {
  Twin t = *this;
  t.cpu = cpu.slice(d, start, len);
  t.gpu = gpu.slice(d, start, len);
  return t;
}

Twin Twin::reshape(std::initializer_list<int64_t> dims) const {
  Twin t = *this;
  t.cpu = cpu.reshape(dims);
  t.gpu = gpu.reshape(dims);
  return t;
}

void sync_to_device(const Twin& t) {
  TensorView whole = TensorView::contiguous(t.dev_buf->data(), DType::U8, {int64_t(t.host_buf->size())});
  gpu_backend().copy_from_host(whole, t.host_buf->data());
}

Twin twin_random(std::mt19937& rng, DType dtype, std::initializer_list<int64_t> shape, float lo, float hi) {
  Twin t = make_twin(dtype, shape);
  const int64_t n = t.cpu.numel();
  if (dtype == DType::I32) {
    std::uniform_int_distribution<int32_t> dist(int32_t(lo), int32_t(hi) - 1);
    for (int64_t i = 0; i < n; ++i) t.cpu.as<int32_t>()[i] = dist(rng);
  } else {
    std::uniform_real_distribution<float> dist(lo, hi);
    for (int64_t i = 0; i < n; ++i) {
      const float v = dist(rng);
      if (dtype == DType::F32) t.cpu.as<float>()[i] = v;
      else if (dtype == DType::BF16) t.cpu.as<uint16_t>()[i] = f32_to_bf16(v);
      else if (dtype == DType::F16) t.cpu.as<uint16_t>()[i] = f32_to_f16(v);
      else MLA_CHECK(false, "twin_random: dtype {}", dtype_name(dtype));
    }
  }
  sync_to_device(t);
  return t;
}

Twin twin_from_floats(const std::vector<float>& values, std::initializer_list<int64_t> shape) {
  Twin t = make_twin(DType::F32, shape);
  MLA_CHECK(int64_t(values.size()) == t.cpu.numel(), "twin_from_floats: {} values for {}", values.size(),
            t.cpu.describe());
  std::memcpy(t.cpu.data, values.data(), values.size() * 4);
  sync_to_device(t);
  return t;
}

Twin twin_from_ints(const std::vector<int32_t>& values, std::initializer_list<int64_t> shape) {
  Twin t = make_twin(DType::I32, shape);
  MLA_CHECK(int64_t(values.size()) == t.cpu.numel(), "twin_from_ints: {} values for {}", values.size(),
            t.cpu.describe());
  std::memcpy(t.cpu.data, values.data(), values.size() * 4);
  sync_to_device(t);
  return t;
}

Twin twin_output(DType dtype, std::initializer_list<int64_t> shape) {
  Twin t = make_twin(dtype, shape);
  std::memset(t.host_buf->data(), poison_byte(dtype), t.host_buf->size());
  sync_to_device(t);
  return t;
}

std::vector<float> gpu_values(const Twin& t) {
  std::vector<uint8_t> bytes(t.dev_buf->size());
  TensorView whole = TensorView::contiguous(t.dev_buf->data(), DType::U8, {int64_t(bytes.size())});
  gpu_backend().copy_to_host(bytes.data(), whole);
  std::vector<float> out;
  for (int64_t off : view_offsets(t.gpu, t.offset())) out.push_back(element_as_float(bytes.data(), t.gpu.dtype, off));
  return out;
}

std::vector<float> cpu_values(const Twin& t) {
  std::vector<float> out;
  for (int64_t off : view_offsets(t.cpu, t.offset()))
    out.push_back(element_as_float(t.host_buf->data(), t.cpu.dtype, off));
  return out;
}

const char* weight_kind_name(WeightKind k) {
  switch (k) {
    case WeightKind::F32: return "f32";
    case WeightKind::BF16: return "bf16";
    case WeightKind::F16: return "f16";
    case WeightKind::FP8: return "fp8-block128";
    case WeightKind::INT4_BF16: return "int4-g32(bf16 scale)";
    case WeightKind::INT4_F32: return "int4-g32(f32 scale)";
  }
  return "?";
}

void make_twin_weight(TwinWeight& tw, std::mt19937& rng, WeightKind kind, int64_t out, int64_t in, float amp) {
  switch (kind) {
    case WeightKind::F32: make_dense(tw.host, rng, out, in, DType::F32, amp); break;
    case WeightKind::BF16: make_dense(tw.host, rng, out, in, DType::BF16, amp); break;
    case WeightKind::F16: make_dense(tw.host, rng, out, in, DType::F16, amp); break;
    case WeightKind::FP8: make_fp8(tw.host, rng, out, in, amp); break;
    case WeightKind::INT4_BF16: make_int4(tw.host, rng, out, in, DType::BF16, amp); break;
    case WeightKind::INT4_F32: make_int4(tw.host, rng, out, in, DType::F32, amp); break;
  }
  tw.cpu = tw.host.w;
  tw.gpu = tw.host.w;
  tw.gpu.data = gpu_backend().place_weight(tw.host.w.data);
  if (tw.host.w.scale.data) tw.gpu.scale = gpu_backend().place_weight(tw.host.w.scale);
}

std::unique_ptr<TwinBatch> make_twin_batch(std::mt19937& rng, const std::vector<SeqSpec>& seqs, int block_size) {
  auto b = std::make_unique<TwinBatch>();
  static_cast<PagedLayout&>(*b) = make_paged_layout(rng, seqs, block_size, 3);
  if (b->block_ids.empty()) b->block_ids.push_back(0);  // a 0-length twin is not allocatable
  const int64_t n = int64_t(seqs.size());
  b->q_indptr_t = twin_from_ints(b->q_indptr, {n + 1});
  b->kv_lens_t = twin_from_ints(b->kv_lens, {n});
  b->block_indptr_t = twin_from_ints(b->block_indptr, {n + 1});
  b->block_ids_t = twin_from_ints(b->block_ids, {int64_t(b->block_ids.size())});
  b->slot_mapping_t = twin_from_ints(b->slot_mapping, {b->tokens});
  for (bool on_gpu : {false, true})
    (on_gpu ? b->gpu : b->cpu) =
        attention_batch(*b, {pick(b->q_indptr_t, on_gpu), pick(b->kv_lens_t, on_gpu), pick(b->block_indptr_t, on_gpu),
                             pick(b->block_ids_t, on_gpu), pick(b->slot_mapping_t, on_gpu)});
  return b;
}

std::string seqs_name(const std::vector<SeqSpec>& seqs) {
  std::string s;
  for (const auto& q : seqs) s += fmt::format("{}{}/{}", s.empty() ? "" : ",", q.q_len, q.kv_len);
  return s;
}

::testing::AssertionResult check_parity(const std::string& op, const std::string& case_name, const Twin& out,
                                        const Tolerance& tol) {
  std::vector<uint8_t> bytes(out.dev_buf->size());
  gpu_backend().copy_to_host(bytes.data(), TensorView::contiguous(out.dev_buf->data(), DType::U8,
                                                                  {int64_t(bytes.size())}));
  const std::vector<int64_t> offsets = view_offsets(out.gpu, out.offset());
  const std::vector<float> ref = cpu_values(out), got = gpu_values(out);
  Row row{op, case_name};
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    bool ok;
    if (out.cpu.dtype == DType::I32) {
      // Raw words, not the float copies: exact beyond 2^24, and an unwritten element is the poison.
      const int32_t g = word_at(bytes.data(), offsets[i]), c = word_at(out.host_buf->data(), offsets[i]);
      ok = g == c && g != kPoisonI32;
    } else {
      const double bound = tol.atol + tol.rtol * std::fabs(double(ref[i]));
      const double err = std::fabs(double(got[i]) - double(ref[i]));
      ok = std::isfinite(got[i]) && err <= bound;
      if (std::isfinite(got[i])) row.worst = std::max(row.worst, bound > 0 ? err / bound : err);
    }
    if (!ok && bad++ == 0) first = i;
  }
  // Bytes of the buffer outside the view must still be poison (no stray writes).
  std::vector<uint8_t> inside(bytes.size(), 0);
  const size_t es = dtype_size(out.gpu.dtype);
  for (int64_t off : offsets) std::memset(inside.data() + size_t(off) * es, 1, es);
  const uint8_t poison = poison_byte(out.gpu.dtype);
  size_t stray = 0;
  for (size_t i = 0; i < bytes.size(); ++i) stray += !inside[i] && bytes[i] != poison;

  row.pass = bad == 0 && stray == 0;
  if (bad && out.cpu.dtype == DType::I32) {
    row.detail = fmt::format("{} of {} off; first [{}] gpu {} cpu {} (poison {})", bad, ref.size(), first,
                             word_at(bytes.data(), offsets[first]), word_at(out.host_buf->data(), offsets[first]),
                             kPoisonI32);
  } else if (bad) {
    row.detail = fmt::format("{} of {} off; first [{}] gpu {} cpu {}", bad, ref.size(), first, got[first], ref[first]);
  } else if (stray) {
    row.detail = fmt::format("{} bytes written outside the output view", stray);
  }
  std::printf("[parity] %-22s %-48s worst %.3g of tol  %s %s\n", op.c_str(), case_name.c_str(), row.worst,
              row.pass ? "PASS" : "FAIL", row.detail.c_str());
  rows().push_back(row);
  if (row.pass) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << op << " " << case_name << ": " << row.detail << " (tol atol " << tol.atol
                                       << " rtol " << tol.rtol << ": " << tol.basis << ")";
}

}  // namespace mla::test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  auto gpu = mla::gpu::make_gpu_backend();
  if (!gpu.is_ok()) {
    std::fprintf(stderr, "mlaserve_gpu_tests: %s\n", gpu.status().message().c_str());
    return 2;
  }
  mla::test::g_gpu = std::move(gpu).value();
  mla::test::g_cpu = mla::cpu::make_cpu_backend();
  const int rc = RUN_ALL_TESTS();
  // Summary: one line per op with cases run and passed.
  std::map<std::string, std::pair<int, int>> per_op;
  for (const auto& r : mla::test::rows()) {
    auto& c = per_op[r.op];
    ++c.first;
    c.second += r.pass;
  }
  std::printf("\n%-24s %8s %8s\n", "parity: op", "cases", "passed");
  int total = 0, passed = 0;
  for (const auto& [op, c] : per_op) {
    std::printf("%-24s %8d %8d%s\n", op.c_str(), c.first, c.second, c.first == c.second ? "" : "  <-- FAIL");
    total += c.first;
    passed += c.second;
  }
  std::printf("%-24s %8d %8d\n", "total", total, passed);
  mla::test::g_cpu.reset();
  mla::test::g_gpu.reset();
  return rc;
}
