// Host side of the benchmark scaffolding: packed random weights, device tensors, event timing and
// the result table. Timing trade-off: per-call event pairs give a median robust to clock ramps and
// stragglers, at the cost of one event per call (about a microsecond of GPU time each).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench_gpu.h"
#include "core/dtype.h"

namespace mla::bench {

const char* bench_weight_name(BenchWeight k) {
  switch (k) {
    case BenchWeight::BF16: return "bf16";
    case BenchWeight::FP8: return "fp8";
    case BenchWeight::INT4: return "int4";
  }
  return "?";
}

namespace {
void* alloc_bytes(std::vector<uint64_t>& v, size_t bytes) {
  v.assign((bytes + 7) / 8, 0);
  return v.data();
}
}  // namespace

void make_host_weight(HostWeight& hw, BenchWeight kind, int64_t out, int64_t in, uint64_t seed, float amp) {
  seed = mix64(seed);
  if (kind == BenchWeight::BF16) {
    auto* p = static_cast<uint16_t*>(alloc_bytes(hw.data, size_t(out * in) * 2));
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < out * in; ++i) p[i] = f32_to_bf16(amp * (2.0f * unit_float(mix64(seed ^ uint64_t(i))) - 1.0f));
    hw.w = ops::Weight{ops::WeightFormat::Dense, out, in, TensorView::contiguous(p, DType::BF16, {out, in}), {}};
  } else if (kind == BenchWeight::FP8) {
    const int64_t sr = (out + 127) / 128, sc = (in + 127) / 128;
    auto* q = static_cast<uint8_t*>(alloc_bytes(hw.data, size_t(out * in)));
    auto* s = static_cast<float*>(alloc_bytes(hw.scale, size_t(sr * sc) * 4));
    const int64_t words = (out * in + 7) / 8;
#pragma omp parallel for schedule(static)
    for (int64_t w = 0; w < words; ++w) {
      const uint64_t h = mix64(seed ^ uint64_t(w));
      for (int b = 0; b < 8 && w * 8 + b < out * in; ++b) {
        uint8_t v = uint8_t(h >> (8 * b));
        if ((v & 0x7F) == 0x7F) v ^= 1;  // e4m3 has no inf; 0x7F/0xFF are NaN
        q[w * 8 + b] = v;
      }
    }
    // amax/448 of values in [-amp, amp) is about amp/448; vary it by +-25% per block.
    for (int64_t i = 0; i < sr * sc; ++i) s[i] = amp / 448.0f * (0.75f + 0.5f * unit_float(mix64(~seed ^ uint64_t(i))));
    hw.w = ops::Weight{ops::WeightFormat::Fp8Block128, out, in, TensorView::contiguous(q, DType::F8_E4M3, {out, in}),
                       TensorView::contiguous(s, DType::F32, {sr, sc})};
  } else {
    const int64_t words = (in + 7) / 8, groups = (in + 31) / 32;
    auto* packed = static_cast<uint32_t*>(alloc_bytes(hw.data, size_t(out * words) * 4));
    auto* s = static_cast<uint16_t*>(alloc_bytes(hw.scale, size_t(out * groups) * 2));
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < out * words; ++i) packed[i] = uint32_t(mix64(seed ^ uint64_t(i)));
    if (in % 8 != 0)  // nibbles past `in` in a row's last word stay zero, as the packer leaves them
      for (int64_t o = 0; o < out; ++o) packed[o * words + words - 1] &= (1u << (4 * (in % 8))) - 1u;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < out * groups; ++i)
      s[i] = f32_to_bf16(amp / 7.0f * (0.75f + 0.5f * unit_float(mix64(~seed ^ uint64_t(i)))));
    hw.w = ops::Weight{ops::WeightFormat::Int4Group32, out, in, TensorView::contiguous(packed, DType::I32, {out, words}),
                       TensorView::contiguous(s, DType::BF16, {out, groups})};
  }
}

ops::Weight place(ops::Backend& backend, const HostWeight& hw) {
  ops::Weight w = hw.w;
  w.data = backend.place_weight(hw.w.data);
  if (hw.w.scale.data != nullptr) w.scale = backend.place_weight(hw.w.scale);
  return w;
}

uint64_t weight_bytes(const ops::Weight& w) {
  return uint64_t(w.data.nbytes()) + (w.scale.data != nullptr ? uint64_t(w.scale.nbytes()) : 0);
}

DevTensor dev_tensor(ops::Backend& backend, DType dtype, std::initializer_list<int64_t> dims) {
  DevTensor t;
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  t.buf = backend.alloc(size_t(n) * dtype_size(dtype));
  t.view = TensorView::contiguous(t.buf.data(), dtype, dims);
  return t;
}

DevTensor dev_from_host(ops::Backend& backend, const std::vector<int32_t>& values) {
  DevTensor t = dev_tensor(backend, DType::I32, {int64_t(values.size())});
  backend.copy_from_host(t.view, values.data());
  backend.synchronize();
  return t;
}

void profile_once(ops::Backend& backend, const std::function<void()>& call) {
  backend.synchronize();
  profiler_range(true);
  call();
  backend.synchronize();
  profiler_range(false);
}

Timing time_on_stream(gpu::Stream stream, const TimingPlan& plan, const std::function<void(int rep)>& fn) {
  using Clock = std::chrono::steady_clock;
  // Warm-up; the last call, synchronized on both sides, estimates the per-call time.
  double est_ms = 0;
  for (int i = 0; i < std::max(plan.warmup, 1); ++i) {
    MLA_GPU_CHECK(gpu::stream_sync(stream));
    const auto t0 = Clock::now();
    fn(i);
    MLA_GPU_CHECK(gpu::stream_sync(stream));
    est_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  }
  constexpr int kMaxBatch = 32;
  std::vector<gpu::Event> ev(kMaxBatch + 1);
  for (auto& e : ev) MLA_GPU_CHECK(gpu::event_create(&e));
  Timing t;
  double total_ms = 0;
  while (t.reps < plan.max_reps && (t.reps < plan.min_reps || total_ms < plan.budget_ms)) {
    const int left_by_budget = est_ms > 0 ? int((plan.budget_ms - total_ms) / est_ms) : kMaxBatch;
    const int nb = std::clamp(std::max(left_by_budget, plan.min_reps - t.reps), 1,
                              std::min(kMaxBatch, plan.max_reps - t.reps));
    // Long calls need no head start (the GPU outruns the host only for short ones).
    if (est_ms < 5.0) spin(stream, std::min(20000.0, 2000.0 + 150.0 * nb));
    for (int i = 0; i < nb; ++i) {
      MLA_GPU_CHECK(gpu::event_record(ev[size_t(i)], stream));
      fn(plan.warmup + t.reps + i);
    }
    MLA_GPU_CHECK(gpu::event_record(ev[size_t(nb)], stream));
    MLA_GPU_CHECK(gpu::event_sync(ev[size_t(nb)]));
    for (int i = 0; i < nb; ++i) {
      float ms = 0;
      MLA_GPU_CHECK(gpu::event_elapsed_ms(&ms, ev[size_t(i)], ev[size_t(i) + 1]));
      t.per_rep_ms.push_back(ms);
      total_ms += ms;
    }
    t.reps += nb;
  }
  for (auto& e : ev) MLA_GPU_CHECK(gpu::event_destroy(e));
  std::vector<double> s = t.per_rep_ms;
  std::sort(s.begin(), s.end());
  t.median_ms = s.size() % 2 ? s[s.size() / 2] : 0.5 * (s[s.size() / 2 - 1] + s[s.size() / 2]);
  t.min_ms = s.front();
  t.max_ms = s.back();
  return t;
}

void Report::add(Row row) { rows_.push_back(std::move(row)); }

namespace {
std::string fraction_text(const Row& r) {
  if (r.ceiling <= 0) return "";
  std::string s = fmt::format("{:.1f}%", 100.0 * r.value / r.ceiling);
  if (r.target > 0) s += fmt::format(" (target {:.0f}%{})", 100.0 * r.target, r.value / r.ceiling >= r.target ? ", met" : "");
  return s;
}
}  // namespace

void Report::print(const std::string& bench) const {
  std::printf("| bench | case | median ms | measured | ceiling | fraction | note |\n|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows_) {
    if (!bench.empty() && r.bench != bench) continue;
    std::printf("| %s | %s | %.4g | %.4g %s | %s | %s | %s |\n", r.bench.c_str(), r.case_name.c_str(), r.time_ms,
                r.value, r.unit.c_str(),
                r.ceiling > 0 ? fmt::format("{:.4g} ({})", r.ceiling, r.ceiling_name).c_str() : "",
                fraction_text(r).c_str(), r.note.c_str());
  }
  std::fflush(stdout);
}

void Report::write(const std::string& dir, const std::string& command) const {
  if (dir.empty()) return;
  std::filesystem::create_directories(dir);
  nlohmann::json j;
  j["command"] = command;
  j["device"] = device_;
  j["rows"] = nlohmann::json::array();
  for (const Row& r : rows_)
    j["rows"].push_back({{"bench", r.bench}, {"case", r.case_name}, {"median_ms", r.time_ms}, {"value", r.value},
                         {"unit", r.unit}, {"ceiling", r.ceiling}, {"ceiling_name", r.ceiling_name},
                         {"fraction", r.ceiling > 0 ? r.value / r.ceiling : 0.0}, {"target", r.target},
                         {"note", r.note}, {"key", r.key.empty() ? r.case_name : r.key}});
  std::ofstream(dir + "/bench_gpu.json") << j.dump(2) << "\n";
  // The same table as printed, for pasting into docs/performance.md.
  std::FILE* f = std::fopen((dir + "/bench_gpu.md").c_str(), "w");
  if (f == nullptr) return;
  std::fprintf(f, "Command: `%s`\n\nDevice: %s\n\n| bench | case | median ms | measured | ceiling | fraction | note |\n"
               "|---|---|---|---|---|---|---|\n", command.c_str(), device_.c_str());
  for (const Row& r : rows_)
    std::fprintf(f, "| %s | %s | %.4g | %.4g %s | %s | %s | %s |\n", r.bench.c_str(), r.case_name.c_str(), r.time_ms,
                 r.value, r.unit.c_str(),
                 r.ceiling > 0 ? fmt::format("{:.4g} ({})", r.ceiling, r.ceiling_name).c_str() : "",
                 fraction_text(r).c_str(), r.note.c_str());
  std::fclose(f);
}

}  // namespace mla::bench
