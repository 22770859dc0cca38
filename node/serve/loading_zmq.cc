#include "node/serve/loading_zmq.h"

#include <chrono>
#include <vector>
#include <zmq.hpp>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "node/serve/zmq_frames.h"

namespace specnode {
namespace {

double SteadySeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

constexpr char kLoading[] = "the model is loading; retry shortly";

}  // namespace

bool IsWildcardEndpoint(std::string_view endpoint) {
  return endpoint.starts_with("tcp://") && (endpoint.ends_with(":*") || endpoint.ends_with(":0"));
}

LoadingZmq::LoadingZmq(LoadingZmqOptions options)
    : options_(std::move(options)), started_s_(SteadySeconds()) {}

absl::StatusOr<std::unique_ptr<LoadingZmq>> LoadingZmq::Start(const LoadingZmqOptions& options) {
  if (options.endpoint.empty() || IsWildcardEndpoint(options.endpoint)) {
    return std::unique_ptr<LoadingZmq>();
  }
  std::unique_ptr<LoadingZmq> l(new LoadingZmq(options));
  try {
    l->ctx_ = std::make_unique<zmq::context_t>(1);
    l->sock_ = std::make_unique<zmq::socket_t>(*l->ctx_, zmq::socket_type::router);
    l->sock_->set(zmq::sockopt::linger, 0);
    l->sock_->set(zmq::sockopt::maxmsgsize, TransportFrameCap(options.limits));
    if (!options.curve_secret_key.empty()) {
      l->sock_->set(zmq::sockopt::curve_server, 1);
      l->sock_->set(zmq::sockopt::curve_secretkey, options.curve_secret_key);
    }
    l->sock_->bind(options.endpoint);
  } catch (const zmq::error_t& e) {
    return absl::UnavailableError(absl::StrCat("cannot bind ", options.endpoint, ": ", e.what()));
  }
  l->thread_ = std::thread([p = l.get()] { p->Run(); });
  return l;
}

LoadingZmq::~LoadingZmq() { Stop(); }

void LoadingZmq::Stop() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
  sock_.reset();  // linger 0: closed at once
  ctx_.reset();   // zmq_ctx_term returns once the socket is closed: the port is free
}

std::string LoadingZmq::Reply(std::string_view frame) const {
  const ParseResult p = ParseClientMessage(frame, options_.limits);
  if (!p.ok) return ErrorReply(p.error.id, p.error.code, p.error.message);
  switch (p.message.type) {
    case ClientMessage::Type::kHealth: {
      const nlohmann::json j = {{"type", "health"},
                                {"status", "loading"},
                                {"model", options_.model_name},
                                {"uptime_s", SteadySeconds() - started_s_},
                                {"active", 0},
                                {"queued", 0},
                                {"version", kProtocolVersion}};
      return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    }
    case ClientMessage::Type::kSubmit:
      return ErrorReply(p.message.submit.id, RequestError::kUnavailable, kLoading);
    case ClientMessage::Type::kCancel:
      return ErrorReply(p.message.id, RequestError::kUnavailable, kLoading);
    case ClientMessage::Type::kStats:
      return ErrorReply(std::nullopt, RequestError::kUnavailable, kLoading);
  }
  return ErrorReply(std::nullopt, RequestError::kUnavailable, kLoading);
}

void LoadingZmq::Run() {
  zmq::pollitem_t items[] = {{static_cast<void*>(*sock_), 0, ZMQ_POLLIN, 0}};
  std::vector<zmq::message_t> frames;
  while (!stop_.load()) {
    try {
      zmq::poll(items, 1, std::chrono::milliseconds(50));
      while (RecvFrames(*sock_, &frames)) {
        // DEALER: [peer, payload]; REQ: [peer, "", payload] (the front end's framing).
        const bool req = frames.size() == 3 && frames[1].size() == 0;
        if (frames.size() != 2 && !req) continue;
        const std::string reply = Reply(frames.back().to_string_view());
        sock_->send(zmq::buffer(frames[0].to_string_view()), zmq::send_flags::sndmore);
        if (req) sock_->send(zmq::buffer("", 0), zmq::send_flags::sndmore);
        sock_->send(zmq::buffer(reply), zmq::send_flags::none);
      }
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      if (e.num() == ETERM) return;
      // A peer gone mid-reply (EHOSTUNREACH) or the like: keep answering the others.
    }
  }
}

}  // namespace specnode
