// The hand-over of the Prometheus text to the HTTP listeners (http_server.h: GET /metrics
// on serve.metrics_bind and serve.http_bind). Only the front end's socket thread may render
// the text (the controllers it reads are the engine's, not thread-safe): an HTTP thread
// asks, the socket thread sees the request on its next loop turn (<= 100 ms), renders and
// publishes.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>

#include "node/serve/http_address.h"  // ValidateMetricsAddress, for the config

namespace specnode {

// Thread-safe hand-over of the metrics text between one renderer and any number of
// fetchers.
class MetricsExchange {
 public:
  // Asks for a fresh text and waits up to `wait` for it; returns it, or the last one
  // published before (empty if none) when the renderer did not answer in time.
  std::string Fetch(std::chrono::milliseconds wait);
  // Renderer side: true from a Fetch until the next Publish, which answers every Fetch
  // waiting then. (Cleared by Publish itself, not by the waiters as they wake: a waiter slow
  // to be scheduled must not ask for a second render.)
  bool Wanted() const { return wanted_.load(std::memory_order_acquire); }
  void Publish(std::string text);

 private:
  std::atomic<bool> wanted_{false};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::string text_;
  uint64_t version_ = 0;  // publications so far
};

}  // namespace specnode
