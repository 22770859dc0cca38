// Stopping the scheduler thread (scheduler.h: Stop, StopWithin): the unbounded join, and
// the bounded one that, when the thread does not come back from the engine (a step or
// heartbeat that never returns), answers every request itself and abandons the thread.
//
// Why the thread is abandoned rather than joined or killed: a thread blocked inside an
// engine call cannot be joined (the join would hang the node, leaving its clients without
// replies) and cannot be cancelled safely (it may hold the engine's or a runner's locks).
// So the requests it holds get their terminal replies from here, its later events are
// dropped, and whoever owns the scheduler decides what to do with the process; the serving
// node ends it without destructors (node/serve/serve_node.cc).
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "coordinator/request_error.h"
#include "coordinator/scheduler.h"
#include "coordinator/scheduler_internal.h"

namespace specnode {

void Scheduler::Stop() {
  {
    std::lock_guard lock(mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
    draining_ = true;
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

absl::Status Scheduler::StopWithin(std::chrono::duration<double> wait) {
  {
    std::unique_lock lock(mu_);
    if (abandoned_) return abandon_status_;
    stopping_ = true;
    draining_ = true;
    cv_.notify_all();
    if (!exited_cv_.wait_for(lock, wait, [&] { return loop_exited_; })) {
      lock.unlock();
      if (absl::Status st = Abandon(wait); !st.ok()) return st;
    }
  }
  if (thread_.joinable()) thread_.join();
  return absl::OkStatus();
}

absl::Status Scheduler::Abandon(std::chrono::duration<double> waited) {
  // emit_mu_ is held throughout: the thread, should it move now, can neither emit nor drop
  // a request (Forget follows the request's terminal Emit) until every open request has its
  // reply, so the records collected below stay alive while they are answered.
  std::lock_guard emit(emit_mu_);
  std::vector<Req*> open;
  {
    std::lock_guard lock(mu_);
    if (loop_exited_) return absl::OkStatus();  // it came back after all: join it
    // The records stay in reqs_ (and running_, queue_): the thread may still be using them.
    for (auto& [h, r] : reqs_) {
      if (r->terminal_sent) continue;
      r->done = true;  // Cancel() says false from now on
      open.push_back(r.get());
    }
    stats_.failed += static_cast<int64_t>(open.size());
    abandoned_ = true;
    abandon_status_ = absl::DeadlineExceededError(absl::StrFormat(
        "the scheduler thread did not stop within %.3g s (stuck in an engine step); its %d "
        "requests in flight were answered `unavailable` and the thread was abandoned",
        waited.count(), open.size()));
  }
  sinks_closed_ = true;  // whatever the thread emits from now on goes nowhere
  const std::string message =
      absl::StrFormat("the node is shutting down and its engine did not return within %.3g s: "
                      "the request was not finished",
                      waited.count());
  for (Req* r : open) {
    r->terminal_sent = true;
    GenerationEvent ev;
    ev.handle = r->handle;
    ev.kind = GenerationEvent::Kind::kError;
    // A status of its own per event: copies of one would share a refcounted payload across
    // the front ends' threads.
    ev.error = RequestErrorStatus(RequestError::kUnavailable, message);
    if (r->g.sink) {
      r->g.sink(std::move(ev));
    } else {
      sink_(std::move(ev));
    }
  }
  std::lock_guard lock(mu_);
  return abandon_status_;
}

}  // namespace specnode
