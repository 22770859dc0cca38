// The node's Prometheus endpoint: a minimal HTTP/1.1 server for scrapers (docs/serving.md,
// "Metrics"). GET /metrics answers the Prometheus text of the `stats` reply, GET /health
// "ok"; every response closes its connection. One connection at a time, requests up to
// 8 KiB, a slow client is dropped after 2 s: it serves scrapes, not traffic.
//
// The text comes from a MetricsExchange, because only the front end's socket thread may
// render it (it reads that thread's counters): the HTTP thread asks, the socket thread sees
// the request on its next loop turn (<= 100 ms), renders and publishes.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace specnode {

// Thread-safe hand-over of the metrics text between one renderer and any number of
// fetchers.
class MetricsExchange {
 public:
  // Asks for a fresh text and waits up to `wait` for it; returns it, or the last one
  // published before (empty if none) when the renderer did not answer in time.
  std::string Fetch(std::chrono::milliseconds wait);
  // Renderer side: true while a Fetch waits for a text.
  bool Wanted() const { return wanted_.load(std::memory_order_acquire) > 0; }
  void Publish(std::string text);

 private:
  std::atomic<int> wanted_{0};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::string text_;
  uint64_t version_ = 0;  // publications so far
};

class MetricsHttpServer {
 public:
  // Listens on `address` = "HOST:PORT" (an IPv4 literal, e.g. 127.0.0.1:9464; port 0 = any
  // free port, see port()) and serves from `exchange`, which must outlive the server.
  // InvalidArgument for a malformed address; Unavailable when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(const std::string& address,
                                                                  MetricsExchange* exchange);
  // Stops accepting and joins the thread (returns within ~200 ms).
  ~MetricsHttpServer();
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  int port() const { return port_; }

 private:
  MetricsHttpServer() = default;
  void Loop();
  void Serve(int fd);

  int listen_fd_ = -1;
  int port_ = 0;
  MetricsExchange* exchange_ = nullptr;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Checks "HOST:PORT" as Start does (for config validation): IPv4 literal, port 0..65535.
absl::Status ValidateMetricsAddress(const std::string& address);

}  // namespace specnode
