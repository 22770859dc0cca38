// The node's ZeroMQ endpoint while the model loads (issue 37, with loading_listeners.h for
// HTTP): serve.bind is bound before the weights are read, so a client's `health` gets
// {"type": "health", "status": "loading", ...} instead of waiting out its timeout, every
// other message an `unavailable` error ("the model is loading; retry shortly"), malformed
// frames the same errors the serving front end gives (protocol.h) — and an endpoint already
// taken fails the start at once. Stop() closes the socket (its context terminated, so the
// port is free) just before the serving Frontend binds it. A wildcard port (tcp://...:* or
// :0) is not held: the serving socket would get another port.
// Thread-safety: Start and Stop from one thread; replies come from the responder's thread.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "node/serve/protocol.h"

namespace zmq {
class context_t;
class socket_t;
}  // namespace zmq

namespace specnode {

struct LoadingZmqOptions {
  std::string endpoint;          // serve.bind
  std::string curve_secret_key;  // serve.curve_secret_key ("" = plain)
  std::string model_name;        // the health reply's "model"
  ProtocolLimits limits;
};

class LoadingZmq {
 public:
  // Null (nothing bound) for a wildcard port; Unavailable naming the endpoint when it
  // cannot be bound.
  static absl::StatusOr<std::unique_ptr<LoadingZmq>> Start(const LoadingZmqOptions& options);
  ~LoadingZmq();

  // Stops the responder and releases the endpoint (idempotent).
  void Stop();

 private:
  explicit LoadingZmq(LoadingZmqOptions options);
  void Run();
  // The reply to one client frame.
  std::string Reply(std::string_view frame) const;

  LoadingZmqOptions options_;
  std::unique_ptr<zmq::context_t> ctx_;
  std::unique_ptr<zmq::socket_t> sock_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  double started_s_ = 0;  // steady clock, seconds
};

// True for an endpoint whose port the system picks (tcp://host:* or tcp://host:0).
bool IsWildcardEndpoint(std::string_view endpoint);

}  // namespace specnode
