#include "cli/progress_bar.h"

#include <unistd.h>

#include <cstdio>

namespace mla::cli {

ProgressBar::ProgressBar(std::string label, bool force)
    : label_(std::move(label)), enabled_(force || isatty(STDERR_FILENO)), start_(std::chrono::steady_clock::now()) {}

void ProgressBar::update(uint64_t done, uint64_t total) {
  if (!enabled_ || finished_) return;
  const auto now = std::chrono::steady_clock::now();
  const bool final = total > 0 && done >= total;
  if (!final && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  const double frac = total ? double(done) / double(total) : 1.0;
  const double secs = std::chrono::duration<double>(now - start_).count();
  constexpr int kWidth = 30;
  const int filled = int(frac * kWidth);
  std::string bar(size_t(filled), '#');
  bar.resize(kWidth, '.');
  std::fprintf(stderr, "\r%s [%s] %5.1f%% %8.1f MB  %5.1fs", label_.c_str(), bar.c_str(), 100.0 * frac,
               double(done) / 1e6, secs);
  if (final) {
    std::fprintf(stderr, "\n");
    finished_ = true;
  }
  std::fflush(stderr);
}

}  // namespace mla::cli
