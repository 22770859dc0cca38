#include "node/serve/frontend.h"

#include <algorithm>
#include <cstdio>

#include <sys/eventfd.h>
#include <unistd.h>

#include <vector>
#include <zmq.hpp>

#include "absl/strings/str_cat.h"
#include "coordinator/request_error.h"
#include "nlohmann/json.hpp"
#include "node/serve/submit_builder.h"
#include "node/serve/zmq_frames.h"

namespace specnode {

double TeardownStopWaitS(const FrontendOptions& options, double drain_limit_s) {
  // The rest of the window for a step still running (a remote step waiting on a lost rank
  // ends within its own deadline, and its error names the rank), at least
  // kTeardownStopWaitS.
  return std::min(options.stop_wait_s, std::max(FrontendOptions::kTeardownStopWaitS,
                                                options.teardown_drain_s - drain_limit_s));
}

Frontend::Frontend(FrontendOptions options, const ModelSession* session, const DomainRouter* router,
                   Scheduler* scheduler, std::function<std::string()> metrics)
    : options_(std::move(options)),
      session_(session),
      router_(router),
      scheduler_(scheduler),
      metrics_(std::move(metrics)),
      started_(std::chrono::steady_clock::now()) {}

Frontend::~Frontend() {
  sock_.reset();
  ctx_.reset();
  if (wake_fd_ >= 0) close(wake_fd_);
}

absl::Status Frontend::Bind() {
  try {
    ctx_ = std::make_unique<zmq::context_t>(1);
    sock_ = std::make_unique<zmq::socket_t>(*ctx_, zmq::socket_type::router);
    sock_->set(zmq::sockopt::router_mandatory, 1);
    sock_->set(zmq::sockopt::linger, 500);
    sock_->set(zmq::sockopt::heartbeat_ivl, 1000);
    sock_->set(zmq::sockopt::heartbeat_timeout, 5000);
    // Frames over the protocol's limit still arrive and get a frame_too_large reply up to
    // the transport cap; beyond it libzmq drops the connection before buffering the frame
    // (memory stays bounded). docs/protocol.md states both.
    sock_->set(zmq::sockopt::maxmsgsize, TransportFrameCap(options_.limits));
    sock_->set(zmq::sockopt::sndhwm, 100000);
    if (!options_.curve_secret_key.empty()) {
      sock_->set(zmq::sockopt::curve_server, 1);
      sock_->set(zmq::sockopt::curve_secretkey, options_.curve_secret_key);
    }
    sock_->bind(options_.endpoint);
  } catch (const zmq::error_t& e) {
    return absl::UnavailableError(absl::StrCat("cannot bind ", options_.endpoint, ": ", e.what()));
  }
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) return absl::InternalError("eventfd failed");
  return absl::OkStatus();
}

void Frontend::OnEvent(GenerationEvent event) {
  {
    std::lock_guard lock(events_mu_);
    events_.push_back(std::move(event));
  }
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof(one));
}

void Frontend::Send(const std::string& peer, const std::string& payload) {
  if (gone_peers_.count(peer)) return;
  // A signal (SIGTERM from mpirun, say, just as the last error replies go out) can
  // interrupt a send with EINTR before the part is queued: retry that part.
  auto part = [this](zmq::const_buffer b, zmq::send_flags f) {
    for (int attempt = 0;; ++attempt) {
      try {
        sock_->send(b, f);
        return;
      } catch (const zmq::error_t& e) {
        if (e.num() != EINTR || attempt >= 100) throw;
      }
    }
  };
  try {
    part(zmq::buffer(peer), zmq::send_flags::sndmore);
    if (req_peers_.count(peer)) part(zmq::buffer("", 0), zmq::send_flags::sndmore);
    part(zmq::buffer(payload), zmq::send_flags::none);
  } catch (const zmq::error_t& e) {
    if (e.num() == EHOSTUNREACH) PeerGone(peer);
  }
}

void Frontend::SendError(const std::string& peer, const std::optional<std::string>& id,
                         RequestError code, const std::string& message) {
  errors_.Add(code);
  Send(peer, ErrorReply(id, code, message));
}

void Frontend::PeerGone(const std::string& peer) {
  gone_peers_.insert(peer);
  // Its requests are cancelled; their KV is freed when the scheduler ends them (the
  // terminal replies are dropped: nobody is listening).
  for (const auto& [handle, a] : active_) {
    if (a.peer == peer) scheduler_->Cancel(handle);
  }
}

void Frontend::HandleSubmit(const std::string& peer, const SubmitMessage& m) {
  auto reject = [&](RequestError code, const std::string& message) {
    SendError(peer, m.id, code, message);
  };
  if (by_peer_id_.count({peer, m.id})) {
    return reject(RequestError::kDuplicateId,
                  "a request with this id is still active on this connection");
  }
  // Tokens and domain (submit_builder.h, shared with the HTTP API); everything about the
  // request itself (prompt, limits, sampling, domain, SLA class) is checked once, by the
  // scheduler's validator (coordinator/request_validator.h); its errors carry their wire code.
  absl::StatusOr<GenerationRequest> g =
      BuildGenerationRequest(m, session_->model().tokenizer(), *router_);
  if (!g.ok()) return reject(RequestErrorOf(g.status()), std::string(g.status().message()));
  auto ticket = scheduler_->Submit(*std::move(g));
  if (!ticket.ok()) {
    return reject(RequestErrorOf(ticket.status()), std::string(ticket.status().message()));
  }
  active_[ticket->handle] = {peer, m.id, m.stream};
  by_peer_id_[{peer, m.id}] = ticket->handle;
  Send(peer, AcceptedReply(m.id, ticket->queue_position));
}

void Frontend::HandleFrame(const std::string& peer, std::string_view frame) {
  const ParseResult p = ParseClientMessage(frame, options_.limits);
  if (!p.ok) {
    SendError(peer, p.error.id, p.error.code, p.error.message);
    return;
  }
  const ClientMessage& m = p.message;
  switch (m.type) {
    case ClientMessage::Type::kSubmit:
      HandleSubmit(peer, m.submit);
      return;
    case ClientMessage::Type::kCancel: {
      auto it = by_peer_id_.find({peer, m.id});
      if (it == by_peer_id_.end()) {
        SendError(peer, m.id, RequestError::kUnknownId, "no active request with this id");
        return;
      }
      // False when the request finished just before the cancel: its terminal reply is on
      // its way (still ours to send), so the cancel gets no answer of its own. An
      // unknown_id here would reach the client before that reply, looking like a second
      // terminal reply for the id.
      (void)scheduler_->Cancel(it->second);
      return;
    }
    case ClientMessage::Type::kStats: {
      const SchedulerSnapshot s = scheduler_->Snapshot();
      nlohmann::json j = {{"type", "stats"},
                          {"version", kProtocolVersion},
                          {"requests",
                           {{"submitted", s.submitted},
                            {"completed", s.completed},
                            {"cancelled", s.cancelled},
                            {"rejected", s.rejected},
                            {"active", s.active},
                            {"queued", s.queued},
                            {"preemptions", s.preemptions}}},
                          {"metrics", metrics_ ? metrics_() : ""}};
      for (const SlaClass& c : scheduler_->options().classes) {
        j["sla_classes"].push_back({{"name", c.name},
                                    {"ttft_p99_ms", c.ttft_p99_ms},
                                    {"tpot_p99_ms", c.tpot_p99_ms},
                                    {"priority", c.priority}});
      }
      Send(peer, j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
      return;
    }
    case ClientMessage::Type::kHealth: {
      const SchedulerSnapshot s = scheduler_->Snapshot();
      const double uptime =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
      nlohmann::json j = {{"type", "health"},
                          {"status", draining_ ? "draining" : "ok"},
                          {"model", options_.model_name},
                          {"uptime_s", uptime},
                          {"active", s.active},
                          {"queued", s.queued},
                          {"version", kProtocolVersion}};
      if (!scheduler_->Failure().ok()) j["status"] = "failed";
      if (!options_.ranks.empty()) {
        j["ranks"] = nlohmann::json::array();
        for (const RankInfo& r : options_.ranks) {
          j["ranks"].push_back(
              {{"rank", r.rank}, {"role", r.role}, {"pid", r.pid}, {"host", r.host}});
        }
      }
      Send(peer, j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
      return;
    }
  }
}

void Frontend::DeliverEvents() {
  std::deque<GenerationEvent> events;
  {
    std::lock_guard lock(events_mu_);
    events.swap(events_);
  }
  for (GenerationEvent& ev : events) {
    auto it = active_.find(ev.handle);
    if (it == active_.end()) continue;
    const Active& a = it->second;
    switch (ev.kind) {
      case GenerationEvent::Kind::kTokens:
        if (a.stream) Send(a.peer, TokensReply(a.id, ev.text, ev.token_ids, ev.index));
        continue;
      case GenerationEvent::Kind::kDone:
        Send(a.peer, DoneReply(a.id, ev.finish, a.stream ? "" : ev.text, ev.stats));
        break;
      case GenerationEvent::Kind::kError:
        SendError(a.peer, a.id, RequestErrorOf(ev.error), std::string(ev.error.message()));
        break;
    }
    by_peer_id_.erase({a.peer, a.id});
    active_.erase(it);
  }
}

void Frontend::Drain(const std::atomic<bool>* stop) {
  if (stop != nullptr && stop->load() && !draining_) {
    draining_ = true;
    drain_since_ = std::chrono::steady_clock::now();
    drain_limit_s_ = options_.drain_timeout_s;
    stop_wait_s_ = options_.stop_wait_s;
    if (options_.teardown != nullptr && options_.teardown->load()) {
      drain_limit_s_ = std::min(drain_limit_s_, options_.teardown_drain_s);
      stop_wait_s_ = TeardownStopWaitS(options_, drain_limit_s_);
      std::fprintf(stderr,
                   "specnode serve: mpirun is ending the job (SIGKILL in ~%.1f s): draining "
                   "for up to %g s\n",
                   options_.teardown_drain_s + 1.0, drain_limit_s_);
    }
    scheduler_->BeginDrain();
  }
  if (draining_ && !drain_cut_ && !scheduler_->Idle() &&
      std::chrono::steady_clock::now() - drain_since_ >
          std::chrono::duration<double>(drain_limit_s_)) {
    std::fprintf(stderr, "specnode serve: drain limit (%g s) reached; cancelling the rest\n",
                 drain_limit_s_);
    // Cancels what is left (their terminal events are queued); a scheduler thread stuck
    // in the engine is abandoned after stop_wait_s_, its requests answered `unavailable`.
    stop_status_ = scheduler_->StopWithin(std::chrono::duration<double>(stop_wait_s_));
    if (!stop_status_.ok()) {
      std::fprintf(stderr, "specnode serve: %s\n", std::string(stop_status_.message()).c_str());
    }
    DeliverEvents();
    drain_cut_ = true;
  }
}

absl::Status Frontend::Run(const std::atomic<bool>* stop) {
  zmq::pollitem_t items[] = {{static_cast<void*>(*sock_), 0, ZMQ_POLLIN, 0},
                             {nullptr, wake_fd_, ZMQ_POLLIN, 0}};
  std::vector<zmq::message_t> frames;
  while (true) {
    try {
      zmq::poll(items, 2, std::chrono::milliseconds(failed_since_ ? 20 : 100));
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) return absl::InternalError(absl::StrCat("zmq poll: ", e.what()));
    }
    if (items[1].revents & ZMQ_POLLIN) {
      uint64_t n;
      [[maybe_unused]] ssize_t r = read(wake_fd_, &n, sizeof(n));
    }
    // A scrape of the HTTP metrics endpoint waits for a text only this thread may render.
    if (options_.metrics_exchange != nullptr && options_.metrics_exchange->Wanted()) {
      options_.metrics_exchange->Publish(metrics_());
    }
    // Incoming frames (non-blocking, all that are ready).
    while (true) {
      try {
        if (!RecvFrames(*sock_, &frames)) break;
      } catch (const zmq::error_t& e) {
        if (e.num() == EINTR) continue;
        break;
      }
      if (frames.size() < 2) continue;  // no payload: ignore
      const std::string peer = frames[0].to_string();
      gone_peers_.erase(peer);  // a peer that reconnects with the same id is back
      // DEALER: [peer, payload]; REQ: [peer, "", payload]. Anything else gets one error.
      if (frames.size() == 3 && frames[1].size() == 0) {
        req_peers_.insert(peer);
        HandleFrame(peer, frames[2].to_string_view());
        continue;
      }
      req_peers_.erase(peer);
      if (frames.size() != 2) {
        SendError(peer, std::nullopt, RequestError::kBadRequest,
                  "one JSON frame per message (use a DEALER socket)");
        continue;
      }
      HandleFrame(peer, frames[1].to_string_view());
    }
    DeliverEvents();
    Drain(stop);
    if (absl::Status failure = scheduler_->Failure(); !failure.ok() && scheduler_->Idle()) {
      DeliverEvents();  // the error replies of every request
      // Keep the socket open a little so that ZeroMQ's I/O thread writes the replies out
      // (closing right away can drop queued bytes; the process may be killed soon after).
      const auto now = std::chrono::steady_clock::now();
      if (!failed_since_) failed_since_ = now;
      if (now - *failed_since_ >= kFailureFlush) return failure;
    }
    if (draining_ && scheduler_->Idle()) {
      // As after a lost target: keep serving a little so that ZeroMQ's I/O thread writes the
      // last replies out before the socket closes (on a loaded machine closing at once lost
      // a `done` that had just been queued).
      DeliverEvents();
      const auto now = std::chrono::steady_clock::now();
      if (!idle_since_) idle_since_ = now;
      if (now - *idle_since_ >= kFailureFlush) return stop_status_;
    }
  }
}

}  // namespace specnode
