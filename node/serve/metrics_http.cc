#include "node/serve/metrics_http.h"

namespace specnode {

std::string MetricsExchange::Fetch(std::chrono::milliseconds wait) {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t seen = version_;
  wanted_.store(true, std::memory_order_release);
  cv_.wait_for(lock, wait, [&] { return version_ != seen; });
  return text_;
}

void MetricsExchange::Publish(std::string text) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    text_ = std::move(text);
    ++version_;
    wanted_.store(false, std::memory_order_release);
  }
  cv_.notify_all();
}

}  // namespace specnode
