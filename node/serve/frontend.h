// Frontend: the ZeroMQ ROUTER socket of `specnode serve` (docs/protocol.md). Parses and
// validates client frames, turns submits into scheduler requests (tokenising, chat
// template, domain routing, context checks), and sends the scheduler's events back to the
// right peer. Exactly one terminal reply (done / error) per submit.
//
// Threads: Run() owns the socket (ZeroMQ sockets are single-threaded). OnEvent() is the
// scheduler's sink, called on the scheduler thread: it only queues the event and wakes the
// socket thread through an eventfd.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "coordinator/domain_router.h"
#include "coordinator/request_error.h"
#include "coordinator/scheduler.h"
#include "node/serve/error_counter.h"
#include "node/serve/metrics_http.h"
#include "node/serve/protocol.h"
#include "node/session/model_session.h"

namespace zmq {
class context_t;
class socket_t;
}  // namespace zmq

namespace specnode {

// One process of the job, as `health` lists it (pids let tests and operators find ranks).
struct RankInfo {
  int rank = 0;
  std::string role;  // "coordinator", "target"
  int64_t pid = 0;
  std::string host;
};

struct FrontendOptions {
  std::string endpoint = "tcp://127.0.0.1:5555";
  ProtocolLimits limits;
  std::string model_name;
  // CurveZMQ: when server_secret_key is set (Z85, 40 chars) the socket is a CURVE server.
  std::string curve_secret_key;
  // Ranks of an mpirun job (health reply field "ranks"); empty for a single process.
  std::vector<RankInfo> ranks;
  // The HTTP metrics endpoint's hand-over (metrics_http.h), or null: Run renders the
  // metrics text into it whenever a scrape waits. Borrowed; must outlive the frontend.
  MetricsExchange* metrics_exchange = nullptr;
  // After *stop: the longest wait for running requests; then Scheduler::StopWithin cancels
  // the rest (each gets its terminal reply) and Run returns OK (see stop_wait_s).
  double drain_timeout_s = 30.0;
  // When *teardown is true at the start of the drain (mpirun is tearing the job down and
  // will SIGKILL it), the drain is cut to min(drain_timeout_s, teardown_drain_s), and
  // stop_wait_s to what is left of teardown_drain_s after that, but at least
  // kTeardownStopWaitS.
  const std::atomic<bool>* teardown = nullptr;
  double teardown_drain_s = 0.0;
  // After the drain limit: the longest wait for the scheduler thread to finish the step it
  // is in and cancel the rest (Scheduler::StopWithin). A thread still inside the engine
  // then is abandoned: every request in flight gets `unavailable` (both front doors: the
  // scheduler answers through each request's sink) and Run returns DeadlineExceeded. The
  // socket thread waits in StopWithin meanwhile (no frames are read).
  // A healthy step takes milliseconds to a few hundred; 5 s stays inside the stop timeouts
  // of docs/operations.md (systemd's TimeoutStopSec 45 s = the 30 s drain + 15 s).
  double stop_wait_s = 5.0;
  static constexpr double kTeardownStopWaitS = 0.5;
};

// The scheduler's stop wait in mpirun's teardown, after a drain limited to drain_limit_s:
// min(stop_wait_s, max(kTeardownStopWaitS, teardown_drain_s - drain_limit_s)).
double TeardownStopWaitS(const FrontendOptions& options, double drain_limit_s);

class Frontend {
 public:
  // session (prompt encoding), router and scheduler must outlive the frontend. metrics
  // renders the Prometheus text for `stats` replies (called on the socket thread).
  Frontend(FrontendOptions options, const ModelSession* session, const DomainRouter* router,
           Scheduler* scheduler, std::function<std::string()> metrics);
  ~Frontend();

  // Binds the socket. Unavailable with the endpoint in the message if the address is taken
  // or malformed.
  absl::Status Bind();

  // Serves until *stop turns true, then drains: new submits get shutting_down, running
  // requests finish and get their replies; returns kFailureFlush after the scheduler is
  // idle (the last replies written out), the remaining requests cancelled with terminal
  // replies if drain_timeout_s passed first — or, when the scheduler thread did not stop
  // within stop_wait_s after that, answered `unavailable`, and then returns
  // Scheduler::StopWithin's DeadlineExceeded (the thread is abandoned). If the
  // scheduler loses its target (Scheduler::Failure), returns that error once every
  // request has had its error reply (code `unavailable`), plus kFailureFlush for them to
  // leave the socket.
  absl::Status Run(const std::atomic<bool>* stop);

  // The scheduler's sink (any thread).
  void OnEvent(GenerationEvent event);

  // Error replies sent, by code; shared with the HTTP API (thread-safe).
  ErrorCounter& errors() { return errors_; }

 private:
  struct Active {
    std::string peer, id;
    bool stream = true;
  };
  void HandleFrame(const std::string& peer, std::string_view frame);
  void HandleSubmit(const std::string& peer, const SubmitMessage& m);
  void Send(const std::string& peer, const std::string& payload);
  void SendError(const std::string& peer, const std::optional<std::string>& id,
                 RequestError code, const std::string& message);
  void DeliverEvents();
  // Run's shutdown: starts the drain once *stop turns true; past the drain limit cancels
  // the rest (Scheduler::StopWithin, its status kept in stop_status_).
  void Drain(const std::atomic<bool>* stop);
  void PeerGone(const std::string& peer);

  FrontendOptions options_;
  const ModelSession* session_;
  const DomainRouter* router_;
  Scheduler* scheduler_;
  std::function<std::string()> metrics_;
  std::unique_ptr<zmq::context_t> ctx_;
  std::unique_ptr<zmq::socket_t> sock_;
  int wake_fd_ = -1;
  std::chrono::steady_clock::time_point started_;
  bool draining_ = false;
  std::chrono::steady_clock::time_point drain_since_;
  double drain_limit_s_ = 0.0;
  double stop_wait_s_ = 0.0;
  bool drain_cut_ = false;  // the drain limit cancelled the rest
  absl::Status stop_status_;  // Scheduler::StopWithin's, at the drain cut
  // Drained and idle since: Run returns kFailureFlush later, the replies written out.
  std::optional<std::chrono::steady_clock::time_point> idle_since_;
  // When the scheduler lost its target: Run keeps serving (health says "failed", submits
  // get `unavailable`) for kFailureFlush after the last error reply, then returns.
  std::optional<std::chrono::steady_clock::time_point> failed_since_;
  static constexpr std::chrono::milliseconds kFailureFlush{250};

  std::mutex events_mu_;
  std::deque<GenerationEvent> events_;  // guarded by events_mu_

  // Socket-thread state.
  std::map<uint64_t, Active> active_;
  std::map<std::pair<std::string, std::string>, uint64_t> by_peer_id_;
  std::set<std::string> gone_peers_;
  std::set<std::string> req_peers_;  // peers using REQ sockets (replies need the delimiter)
  ErrorCounter errors_;
};

}  // namespace specnode
