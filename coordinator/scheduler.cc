#include "coordinator/scheduler.h"

#include <algorithm>
#include <cassert>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "coordinator/request_error.h"
#include "coordinator/request_validator.h"
#include "coordinator/scheduler_internal.h"
#include "model/status_macros.h"

namespace specnode {
namespace {

// Largest n <= limit such that s[0, n) ends on a UTF-8 character boundary.
size_t Utf8Floor(const std::string& s, size_t limit) {
  size_t n = std::min(limit, s.size());
  while (n > 0 && n < s.size() && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return n;
}

}  // namespace

Scheduler::Scheduler(SpeculativeEngine* engine, const Tokenizer* tokenizer,
                     SchedulerOptions options, Sink sink)
    : engine_(engine), tok_(tokenizer), options_(std::move(options)), sink_(std::move(sink)) {
  // Every documented series exists from the start: per class, empty latency histograms (a
  // scrape shows 0 until a request completes), and the engine's gauges as they are before
  // any step (the thread that reads them later has not started yet).
  for (const SlaClass& c : options_.classes) stats_.latency[c.name];
  if (options_.gauges) stats_.gauges = options_.gauges();
  thread_ = std::thread([this] {
    Loop();
    std::lock_guard lock(mu_);
    loop_exited_ = true;
    exited_cv_.notify_all();
  });
}

Scheduler::~Scheduler() { Stop(); }

const SlaClass* Scheduler::FindClass(const std::string& name) const {
  const std::string& want = name.empty() ? options_.default_class : name;
  for (const SlaClass& c : options_.classes) {
    if (c.name == want) return &c;
  }
  return nullptr;
}

absl::StatusOr<Scheduler::Ticket> Scheduler::Submit(GenerationRequest request) {
  RequestLimits limits = engine_->limits();
  limits.max_tokens = options_.max_tokens;
  SPECNODE_RETURN_IF_ERROR(ValidateRequest(request.prompt, request.max_tokens, request.sampling,
                                           request.domain, limits));
  const SlaClass* cls = FindClass(request.sla);
  if (cls == nullptr) {
    return RequestErrorStatus(RequestError::kUnknownSla,
                              absl::StrCat("unknown SLA class \"", request.sla, "\""));
  }
  auto r = std::make_unique<Req>();
  r->g = std::move(request);
  r->cls = cls;
  r->g.sla = cls->name;
  for (const std::string& s : r->g.stop) r->max_stop = std::max(r->max_stop, s.size());
  r->arrival = Clock::now();
  std::lock_guard lock(mu_);
  if (!failure_.ok()) {
    return RequestErrorStatus(RequestError::kUnavailable,
                              absl::StrCat("the target failed: ", failure_.message()));
  }
  if (draining_ || stopping_) {
    return RequestErrorStatus(RequestError::kShuttingDown, "the node is shutting down");
  }
  int queued = 0;
  for (const auto& [prio, q] : queue_) queued += static_cast<int>(q.size());
  if (queued >= options_.max_queue) {
    stats_.rejected++;
    return RequestErrorStatus(RequestError::kOverloaded,
                              absl::StrCat("overloaded: ", queued, " requests already queued"));
  }
  if (cls->shed && mean_admit_gap_ms_ > 0) {
    // Slots this request needs freed before it runs: the queue ahead of it (its class and
    // better), less free slots and slots held by lower classes (preemptable).
    int ahead = 0, preemptable = 0;
    for (const auto& [prio, q] : queue_) {
      if (prio <= cls->priority) ahead += static_cast<int>(q.size());
    }
    for (uint64_t h : running_) preemptable += reqs_.at(h)->cls->priority > cls->priority;
    const int free_slots = options_.max_active - static_cast<int>(running_.size()) + preemptable;
    const int shortfall = ahead + 1 - free_slots;
    const double predicted_ms = shortfall * mean_admit_gap_ms_;
    if (shortfall > 0 && predicted_ms > cls->ttft_p99_ms) {
      stats_.rejected++;
      stats_.shed++;
      return RequestErrorStatus(
          RequestError::kOverloaded,
          absl::StrFormat("overloaded: a %s request would wait ~%.0f ms for a slot (%d ahead), "
                          "over its %.0f ms TTFT target",
                          cls->name, predicted_ms, ahead, cls->ttft_p99_ms));
    }
  }
  // Inter-arrival EWMA for the batching window.
  if (last_arrival_ != Clock::time_point{}) {
    UpdateMeanGap(&mean_gap_ms_, Ms(last_arrival_, r->arrival));
  }
  last_arrival_ = r->arrival;
  const uint64_t handle = next_handle_++;
  r->handle = handle;
  int position = 0;
  for (const auto& [prio, q] : queue_) {
    if (prio <= cls->priority) position += static_cast<int>(q.size());
  }
  queue_[cls->priority].push_back(handle);
  reqs_[handle] = std::move(r);
  stats_.submitted++;
  cv_.notify_all();
  return Ticket{handle, position};
}

bool Scheduler::Cancel(uint64_t handle) {
  std::lock_guard lock(mu_);
  auto it = reqs_.find(handle);
  if (it == reqs_.end() || it->second->done) return false;
  cancels_.push_back(handle);
  cv_.notify_all();
  return true;
}

void Scheduler::BeginDrain() {
  std::lock_guard lock(mu_);
  draining_ = true;
  cv_.notify_all();
}

bool Scheduler::Idle() const {
  std::lock_guard lock(mu_);
  return draining_ && (reqs_.empty() || abandoned_);
}

bool IsTargetLost(const absl::Status& s) {
  return s.code() == absl::StatusCode::kUnavailable ||
         s.code() == absl::StatusCode::kDeadlineExceeded;
}

bool Scheduler::Draining() const {
  std::lock_guard lock(mu_);
  return draining_ || stopping_;
}

absl::Status Scheduler::Failure() const {
  std::lock_guard lock(mu_);
  return failure_;
}

SchedulerSnapshot Scheduler::Snapshot() const {
  std::lock_guard lock(mu_);
  SchedulerSnapshot s = stats_;
  s.active = static_cast<int>(running_.size());
  s.queued = 0;
  for (const auto& [prio, q] : queue_) s.queued += static_cast<int>(q.size());
  return s;
}

void Scheduler::Loop() {
  while (true) {
    std::vector<uint64_t> cancels;
    {
      std::unique_lock lock(mu_);
      auto has_queue = [&] {
        for (const auto& [prio, q] : queue_) {
          if (!q.empty()) return true;
        }
        return false;
      };
      auto has_work = [&] {
        return stopping_ || !cancels_.empty() || !running_.empty() || has_queue();
      };
      if (options_.heartbeat_s > 0 && failure_.ok()) {
        // Idle: wake up now and then to check that the targets still answer.
        cv_.wait_for(lock, std::chrono::duration<double>(options_.heartbeat_s), has_work);
      } else {
        cv_.wait(lock, has_work);
      }
      if (stopping_) {
        for (auto& [h, r] : reqs_) cancels.push_back(h);
      } else {
        cancels.swap(cancels_);
      }
    }
    if (options_.heartbeat_s > 0 && Failure().ok()) {
      // Targets without work for heartbeat_s (an idle node, or an idle group of a busy one)
      // must still answer: a rank that hung while idle fails the node within a bound.
      absl::Status beat = engine_->Heartbeat(options_.heartbeat_s);
      if (IsTargetLost(beat)) LoseTarget(beat);
    }
    for (uint64_t h : cancels) {
      Req* r = nullptr;
      {
        std::lock_guard lock(mu_);
        auto it = reqs_.find(h);
        if (it != reqs_.end() && !it->second->done) r = it->second.get();
      }
      if (r != nullptr) Finish(*r, FinishKind::kCancelled);
    }
    {
      std::unique_lock lock(mu_);
      if (stopping_) {
        stats_.window_ms = 0;
        return;
      }
      // Batching window: with nothing running, a lone arrival waits briefly for company
      // when arrivals come faster than the window (else waiting only adds latency).
      double bound = 1e9;
      for (const SlaClass& c : options_.classes) bound = std::min(bound, c.ttft_p99_ms);
      bound *= options_.window_fraction;
      const double window = (mean_gap_ms_ >= 0 && mean_gap_ms_ < bound) ? mean_gap_ms_ : 0.0;
      stats_.window_ms = window;
      if (running_.empty() && window > 0) {
        int queued = 0;
        Clock::time_point oldest = Clock::now();
        for (const auto& [prio, q] : queue_) {
          queued += static_cast<int>(q.size());
          if (!q.empty()) oldest = std::min(oldest, reqs_.at(q.front())->arrival);
        }
        const auto deadline = oldest + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double, std::milli>(window));
        if (queued > 0 && queued < options_.max_active && Clock::now() < deadline) {
          cv_.wait_until(lock, deadline, [&] { return stopping_ || !cancels_.empty(); });
          continue;
        }
      }
      AdmitLocked(Clock::now());
    }
    RunStep();
    // After the step (and after an idle heartbeat, which carries a remote target's pending
    // frees): the gauges show what the targets hold now, not what the last step left.
    RefreshGauges();
  }
}

void Scheduler::RefreshGauges() {
  if (!options_.gauges) return;
  std::map<std::string, double> gauges = options_.gauges();
  std::lock_guard lock(mu_);
  stats_.gauges = std::move(gauges);
}

void Scheduler::LoseTarget(const absl::Status& st) {
  // The target is gone: nothing can run any more. Fail everything and stop admitting.
  std::vector<uint64_t> all;
  {
    std::lock_guard lock(mu_);
    if (failure_.ok()) failure_ = st;
    draining_ = true;
    for (const auto& [h, r] : reqs_) {
      if (!r->done) all.push_back(h);
    }
  }
  for (uint64_t h : all) Fail(*Lookup(h), st);
}

Scheduler::Req* Scheduler::Lookup(uint64_t handle) {
  std::lock_guard lock(mu_);
  auto it = reqs_.find(handle);
  return it == reqs_.end() ? nullptr : it->second.get();
}

void Scheduler::RunStep() {
  std::vector<uint64_t> ids;
  {
    std::lock_guard lock(mu_);
    ids = running_;
  }
  // (Re)start sequences that are not in the engine yet: new, or preempted (recomputed from
  // prompt + the output so far).
  for (uint64_t h : ids) {
    Req& r = *Lookup(h);
    if (engine_->Has(static_cast<SeqId>(h))) continue;
    SpecRequest sr;
    sr.id = static_cast<SeqId>(h);
    sr.prompt = r.g.prompt;
    sr.prompt.insert(sr.prompt.end(), r.output.begin(), r.output.end());
    sr.sampling = r.g.sampling;
    sr.max_new_tokens = static_cast<int32_t>(r.g.max_tokens - static_cast<int64_t>(r.output.size()));
    sr.domain = r.g.domain;
    absl::Status st = engine_->Start(sr);
    if (!st.ok()) Fail(r, st);
  }
  {
    std::lock_guard lock(mu_);
    ids = running_;
  }
  if (ids.empty()) return;
  std::vector<SeqId> seqs(ids.begin(), ids.end());
  std::vector<SeqStepResult> results;
  absl::Status st = engine_->Step(seqs, &results);
  while (st.code() == absl::StatusCode::kResourceExhausted && seqs.size() > 1) {
    // Out of KV memory: preempt one sequence (lowest class, newest; its KV swapped to the
    // host tier, else freed for recompute; requeued first in its class), retry the rest.
    const uint64_t victim = ChooseVictim(seqs);
    seqs.erase(std::find(seqs.begin(), seqs.end(), static_cast<SeqId>(victim)));
    {
      std::lock_guard lock(mu_);
      PreemptLocked(victim);
    }
    st = engine_->Step(seqs, &results);
  }
  if (!st.ok()) {
    if (IsTargetLost(st)) {
      LoseTarget(st);
      return;
    }
    for (SeqId s : seqs) Fail(*Lookup(static_cast<uint64_t>(s)), st);
    return;
  }
  const auto now = Clock::now();
  {
    std::lock_guard lock(mu_);
    stats_.steps++;
    stats_.step_sequences += static_cast<int64_t>(seqs.size());
    stats_.last_batch = static_cast<int>(seqs.size());
  }
  for (const SeqStepResult& res : results) {
    Req& r = *Lookup(static_cast<uint64_t>(res.id));
    if (!res.tokens.empty()) {
      if (r.output.empty()) r.first_token = now;
      r.last_token = now;
      GenerationEvent ev;
      ev.handle = r.handle;
      ev.kind = GenerationEvent::Kind::kTokens;
      ev.index = static_cast<int32_t>(r.output.size());
      // Token by token, so that a stop string ends the output at the token that completes
      // it: tokens a speculative step accepted past it are not the request's (nor counted
      // in its usage), exactly as when the step had produced one token at a time.
      size_t stop_at = std::string::npos;
      for (int32_t t : res.tokens) {
        r.output.push_back(t);
        ev.token_ids.push_back(t);
        r.text += r.utf8.Push(tok_->TokenToBytes(t));
        if (r.g.stop.empty()) continue;
        // Search only where a new match can start.
        const size_t from = r.checked >= r.max_stop ? r.checked - r.max_stop + 1 : 0;
        for (const std::string& s : r.g.stop) {
          const size_t p = r.text.find(s, from);
          if (p != std::string::npos) stop_at = std::min(stop_at, p);
        }
        r.checked = r.text.size();
        if (stop_at != std::string::npos) break;
      }
      if (stop_at != std::string::npos) r.text.resize(stop_at);
      // Hold back bytes that could begin a stop string (unless the request ends now).
      const bool ending = stop_at != std::string::npos || res.finish != FinishReason::kNone;
      size_t release = r.text.size();
      if (!ending && r.max_stop > 1) {
        release = Utf8Floor(r.text,
                            r.text.size() >= r.max_stop - 1 ? r.text.size() - (r.max_stop - 1) : 0);
      }
      release = std::max(release, r.emitted);
      ev.text = r.text.substr(r.emitted, release - r.emitted);
      r.emitted = release;
      Emit(r, std::move(ev));
      if (stop_at != std::string::npos) {
        Finish(r, FinishKind::kStopString);
        continue;
      }
    }
    if (res.finish != FinishReason::kNone) {
      Finish(r, res.finish == FinishReason::kStop ? FinishKind::kStop : FinishKind::kLength);
    }
  }
}

void Scheduler::Finish(Req& r, FinishKind kind) {
  const auto now = Clock::now();
  if (engine_->Has(static_cast<SeqId>(r.handle))) {
    const SpecSeqStats& s = engine_->Stats(static_cast<SeqId>(r.handle));
    if (r.cached_tokens < 0) r.cached_tokens = s.cached_tokens;
    r.drafted += s.drafted;
    r.accepted += s.accepted;
    r.passes += s.steps;
    r.tree_steps += s.tree_steps;
    engine_->Finish(static_cast<SeqId>(r.handle));
    // Before the terminal reply goes out: a client that reads the metrics after it sees
    // this request's KV released.
    RefreshGauges();
  }
  // Release held-back text (a final partial UTF-8 sequence becomes U+FFFD).
  if (kind != FinishKind::kStopString) r.text += r.utf8.Flush();
  GenerationEvent ev;
  ev.handle = r.handle;
  ev.kind = GenerationEvent::Kind::kDone;
  ev.finish = kind;
  if (r.emitted < r.text.size()) {
    GenerationEvent tail;
    tail.handle = r.handle;
    tail.kind = GenerationEvent::Kind::kTokens;
    tail.index = static_cast<int32_t>(r.output.size());
    tail.text = r.text.substr(r.emitted);
    r.emitted = r.text.size();
    Emit(r, std::move(tail));
  }
  ev.text = r.text;
  RequestStats& st = ev.stats;
  st.prompt_tokens = static_cast<int32_t>(r.g.prompt.size());
  st.cached_tokens = std::max(0, r.cached_tokens);
  st.completion_tokens = static_cast<int32_t>(r.output.size());
  st.drafted = r.drafted;
  st.accepted = r.accepted;
  st.target_passes = r.passes;
  st.tree_steps = r.tree_steps;
  st.queue_ms = r.scheduled_once ? Ms(r.arrival, r.scheduled) : Ms(r.arrival, now);
  st.ttft_ms = r.output.empty() ? 0.0 : Ms(r.arrival, r.first_token);
  st.tpot_ms = r.output.size() > 1 ? Ms(r.first_token, r.last_token) / (r.output.size() - 1) : 0.0;
  st.total_ms = Ms(r.arrival, now);
  st.domain = r.g.domain;
  st.sla = r.g.sla;
  {
    std::lock_guard lock(mu_);
    r.done = true;
    stats_.prompt_tokens += st.prompt_tokens;
    stats_.cached_prompt_tokens += st.cached_tokens;
    stats_.generation_tokens += st.completion_tokens;
    stats_.drafted_by_domain[st.domain] += st.drafted;
    stats_.accepted_by_domain[st.domain] += st.accepted;
    if (kind == FinishKind::kCancelled) {
      stats_.cancelled++;
    } else {
      stats_.completed++;
      SchedulerSnapshot::SlaLatency& lat = stats_.latency[r.g.sla];
      if (!r.output.empty()) lat.ttft.Observe(st.ttft_ms / 1e3);
      if (r.output.size() > 1) lat.tpot.Observe(st.tpot_ms / 1e3);
      lat.queue.Observe(st.queue_ms / 1e3);
      lat.e2e.Observe(st.total_ms / 1e3);
    }
  }
  Emit(r, std::move(ev));
  Forget(r.handle);
}

void Scheduler::Emit(Req& r, GenerationEvent ev) {
  std::lock_guard lock(emit_mu_);
  if (sinks_closed_ || r.terminal_sent) return;
  if (ev.kind != GenerationEvent::Kind::kTokens) r.terminal_sent = true;
  if (r.g.sink) {
    r.g.sink(std::move(ev));
  } else {
    sink_(std::move(ev));
  }
}

void Scheduler::Forget(uint64_t handle) {
  std::lock_guard lock(mu_);
  auto it = std::find(running_.begin(), running_.end(), handle);
  if (it != running_.end()) running_.erase(it);
  for (auto& [prio, q] : queue_) q.erase(std::remove(q.begin(), q.end(), handle), q.end());
  reqs_.erase(handle);
}

void Scheduler::Fail(Req& r, absl::Status status) {
  engine_->Finish(static_cast<SeqId>(r.handle));
  GenerationEvent ev;
  ev.handle = r.handle;
  ev.kind = GenerationEvent::Kind::kError;
  ev.error = std::move(status);
  {
    std::lock_guard lock(mu_);
    r.done = true;
    stats_.failed++;
  }
  Emit(r, std::move(ev));
  Forget(r.handle);
}

}  // namespace specnode
