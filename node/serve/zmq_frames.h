// Reading a ZeroMQ ROUTER socket's messages, shared by the serving front end (frontend.cc)
// and the loading responder (loading_zmq.cc).
#pragma once

#include <vector>
#include <zmq.hpp>

namespace specnode {

// Receives one whole multipart message without waiting into *frames (cleared first): the
// peer's identity, then the parts. False when no message is waiting. zmq::error_t
// propagates (EINTR included: the caller decides).
inline bool RecvFrames(zmq::socket_t& sock, std::vector<zmq::message_t>* frames) {
  frames->clear();
  zmq::message_t msg;
  if (!sock.recv(msg, zmq::recv_flags::dontwait)) return false;
  frames->push_back(std::move(msg));
  while (frames->back().more()) {
    zmq::message_t part;
    if (!sock.recv(part, zmq::recv_flags::none)) break;
    frames->push_back(std::move(part));
  }
  return true;
}

}  // namespace specnode
