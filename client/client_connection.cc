#include "client/client_connection.h"

#include <zmq.h>

#include <array>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "zmq.hpp"

namespace specnode::client {

struct ClientConnection::Impl {
  zmq::context_t context{1};
  zmq::socket_t socket{context, zmq::socket_type::dealer};
};

ClientConnection::ClientConnection(ConnectionOptions options, std::unique_ptr<Impl> impl)
    : options_(std::move(options)), impl_(std::move(impl)) {}

ClientConnection::~ClientConnection() = default;

absl::StatusOr<std::unique_ptr<ClientConnection>> ClientConnection::Open(
    const ConnectionOptions& options) {
  auto impl = std::make_unique<Impl>();
  try {
    zmq::socket_t& s = impl->socket;
    s.set(zmq::sockopt::linger, 0);
    // Queue messages only on completed connections, so a missing node makes Send time out
    // instead of queueing forever.
    s.set(zmq::sockopt::immediate, 1);
    s.set(zmq::sockopt::sndtimeo, options.connect_timeout_ms);
    // Answer the node's heartbeats and detect a node that vanished silently.
    s.set(zmq::sockopt::heartbeat_ivl, 2000);
    s.set(zmq::sockopt::heartbeat_timeout, 6000);
    if (!options.curve_server_key.empty()) {
      std::string pub = options.curve_public_key;
      std::string sec = options.curve_secret_key;
      if (pub.empty() != sec.empty()) {
        return absl::InvalidArgumentError(
            "CURVE: give both the client public and secret key, or neither");
      }
      if (pub.empty()) {
        std::array<char, 41> p{}, k{};
        if (zmq_curve_keypair(p.data(), k.data()) != 0) {
          return absl::FailedPreconditionError(
              "CURVE: this libzmq cannot generate keys (built without CURVE support)");
        }
        pub = p.data();
        sec = k.data();
      }
      for (const auto& [name, key] :
           {std::pair<const char*, const std::string&>{"server", options.curve_server_key},
            {"public", pub},
            {"secret", sec}}) {
        if (key.size() != 40) {
          return absl::InvalidArgumentError(
              absl::StrCat("CURVE ", name, " key must be 40 Z85 characters, got ", key.size()));
        }
      }
      s.set(zmq::sockopt::curve_serverkey, options.curve_server_key);
      s.set(zmq::sockopt::curve_publickey, pub);
      s.set(zmq::sockopt::curve_secretkey, sec);
    }
    s.connect(options.endpoint);
  } catch (const zmq::error_t& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot connect to '", options.endpoint, "': ", e.what()));
  }
  return std::unique_ptr<ClientConnection>(new ClientConnection(options, std::move(impl)));
}

void ClientConnection::SetLinger(int ms) { impl_->socket.set(zmq::sockopt::linger, ms); }

absl::Status ClientConnection::Send(const nlohmann::json& message) {
  const std::string text = message.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  try {
    auto sent = impl_->socket.send(zmq::buffer(text), zmq::send_flags::none);
    if (!sent) {
      return absl::UnavailableError(absl::StrCat(
          "no connection to a specnode node at ", options_.endpoint, " within ",
          options_.connect_timeout_ms / 1000.0, " s (is `specnode serve` running there",
          options_.curve_server_key.empty() ? "" : ", with this CURVE server key", "?)"));
    }
  } catch (const zmq::error_t& e) {
    return absl::InternalError(absl::StrCat("send failed: ", e.what()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<nlohmann::json>> ClientConnection::Receive(int timeout_ms) {
  std::array<zmq::pollitem_t, 1> items = {{{impl_->socket.handle(), 0, ZMQ_POLLIN, 0}}};
  try {
    const int ready = zmq::poll(items.data(), items.size(), std::chrono::milliseconds(timeout_ms));
    if (ready == 0 || !(items[0].revents & ZMQ_POLLIN)) return std::optional<nlohmann::json>();
    // One frame per message; tolerate a REQ-style empty delimiter before it.
    std::vector<zmq::message_t> frames;
    do {
      zmq::message_t frame;
      if (!impl_->socket.recv(frame, zmq::recv_flags::dontwait)) break;
      frames.push_back(std::move(frame));
    } while (frames.back().more());
    std::string body;
    for (const auto& f : frames) {
      if (f.size() > 0) body = f.to_string();
    }
    nlohmann::json message = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (message.is_discarded() || !message.is_object()) {
      return absl::DataLossError(absl::StrCat("the node sent a frame that is not a JSON object (",
                                              body.size(), " bytes)"));
    }
    return std::optional<nlohmann::json>(std::move(message));
  } catch (const zmq::error_t& e) {
    if (e.num() == EINTR) return std::optional<nlohmann::json>();
    return absl::InternalError(absl::StrCat("receive failed: ", e.what()));
  }
}

}  // namespace specnode::client
