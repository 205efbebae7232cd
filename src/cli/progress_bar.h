// A one-line progress bar on stderr for long loads and writes; silent when stderr is not a
// terminal (logs and CI stay clean) unless forced.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace mla::cli {

class ProgressBar {
 public:
  explicit ProgressBar(std::string label, bool force = false);
  // Redraws at most every 100 ms; the final update (done == total) always draws and ends the line.
  void update(uint64_t done, uint64_t total);

 private:
  std::string label_;
  bool enabled_;
  bool finished_ = false;
  std::chrono::steady_clock::time_point start_, last_draw_{};
};

}  // namespace mla::cli
