// The node's addresses while the model loads (issue 37): serve.http_bind and
// serve.metrics_bind are bound before the weights are read (and serve.bind, the ZeroMQ
// endpoint: loading_zmq.h), so a load balancer or an
// orchestrator's probe gets an answer instead of "connection refused" — GET /health
// 503 {"status": "loading", "model", "uptime_s"}, the /v1 routes 503 `unavailable` ("the
// model is loading"), GET /metrics an empty exposition — and an address already taken fails
// the start at once, before a long load. Stop() releases the ports just before ServeNode
// binds them again for serving (a probe in that gap, milliseconds, is refused). An address
// with port 0 (any free port) is not held: the serving listener would get another port.
// Thread-safety: Start and Stop from one thread; the handlers run on the listeners' threads.
#pragma once

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "node/serve/cluster_config.h"
#include "node/serve/http_server.h"
#include "node/serve/loading_zmq.h"

namespace specnode {

class LoadingListeners {
 public:
  // Unavailable naming the address when one cannot be bound (as HttpServer::Start).
  static absl::StatusOr<std::unique_ptr<LoadingListeners>> Start(const ServeConfig& cfg);
  ~LoadingListeners() { Stop(); }

  // Closes every listener (idempotent).
  void Stop() {
    servers_.clear();
    zmq_.reset();
  }
  // HTTP listeners held (the ZeroMQ endpoint aside).
  size_t size() const { return servers_.size(); }

 private:
  LoadingListeners() = default;
  std::vector<std::unique_ptr<HttpServer>> servers_;
  std::unique_ptr<LoadingZmq> zmq_;
};

}  // namespace specnode
