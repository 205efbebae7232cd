// The output thread (see output_delivery.h).
#include "runtime/output_delivery.h"

namespace mla::runtime {

OutputDelivery::OutputDelivery() : thread_([this] { run(); }) {}

OutputDelivery::~OutputDelivery() { stop(); }

void OutputDelivery::post(std::vector<Item>& batch) {
  if (batch.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (queue_.empty()) {
      queue_.swap(batch);
    } else {
      for (Item& it : batch) queue_.push_back(std::move(it));
      batch.clear();
    }
  }
  cv_.notify_one();
}

void OutputDelivery::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_one();
  std::lock_guard<std::mutex> join_lock(join_mu_);
  if (thread_.joinable()) thread_.join();
}

void OutputDelivery::run() {
  std::vector<Item> batch;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return !queue_.empty() || stopping_; });
      if (queue_.empty()) return;  // stopping and drained
      batch.swap(queue_);
    }
    for (Item& it : batch) it.first->push(std::move(it.second));
    batch.clear();
  }
}

}  // namespace mla::runtime
