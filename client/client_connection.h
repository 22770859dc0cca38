// A client's connection to `specnode serve`: one ZeroMQ DEALER socket speaking the JSON
// protocol of docs/protocol.md (one frame = one JSON object). Used by specnode-client.
//
// Never blocks forever: Send gives up with Unavailable when no connection to the node is
// established within the connect timeout (ZMQ_IMMEDIATE: nothing is queued for a peer that
// is not there), and Receive waits at most the time it is given.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace specnode::client {

struct ConnectionOptions {
  std::string endpoint = "tcp://127.0.0.1:5555";
  // How long Send waits for the connection (TCP + ZMTP, + CURVE handshake) to the node.
  int connect_timeout_ms = 5000;
  // CurveZMQ, all Z85 (40 characters). Set server_key to enable; without a client key pair
  // a fresh one is generated for this connection.
  std::string curve_server_key;
  std::string curve_public_key;
  std::string curve_secret_key;
};

class ClientConnection {
 public:
  static absl::StatusOr<std::unique_ptr<ClientConnection>> Open(const ConnectionOptions& options);
  ~ClientConnection();
  ClientConnection(const ClientConnection&) = delete;
  ClientConnection& operator=(const ClientConnection&) = delete;

  const std::string& endpoint() const { return options_.endpoint; }

  // Sends one JSON object as one frame. Unavailable when the node cannot be reached within
  // the connect timeout.
  absl::Status Send(const nlohmann::json& message);

  // Waits up to timeout_ms (0 = just poll) for one message. std::nullopt on timeout.
  // DataLoss when the node sent a frame that is not a JSON object.
  absl::StatusOr<std::optional<nlohmann::json>> Receive(int timeout_ms);

  // How long pending outgoing messages may linger after the connection is destroyed
  // (default 0: drop them).
  void SetLinger(int ms);

 private:
  struct Impl;
  ClientConnection(ConnectionOptions options, std::unique_ptr<Impl> impl);
  ConnectionOptions options_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace specnode::client
