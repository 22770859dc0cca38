// Scheduler: continuous batching of generation requests on a SpeculativeEngine, with SLA
// classes, a bounded queue, chunked prefill and text-level streaming (UTF-8 safe, stop
// strings).
//
// One scheduler thread owns the engine. Every step it
//   1. takes new submissions and cancellations (cancelled requests end with kCancelled);
//   2. admits queued requests while fewer than max_active are running, highest-priority
//      SLA class first, FIFO within a class — but holds a lone arrival back for up to the
//      batching window (bounded by window_fraction of the tightest class's TTFT target and
//      shrunk when arrivals are rare) so that requests arriving together share steps;
//   3. runs one engine Step over every running request (prefill chunks under
//      prefill_budget tokens, speculative or direct decodes for the rest);
//   4. turns new tokens into text and emits events.
// If a step fails for lack of KV memory, the newest running request is preempted (its
// KV freed, requeued at the front of its class to recompute from its prompt + output) and
// the step is retried; a request that cannot run even alone fails with kResourceExhausted.
// If a step (or, while idle, a heartbeat: SchedulerOptions::heartbeat_s) fails because the
// target is lost (IsTargetLost: Unavailable or
// DeadlineExceeded, e.g. a tensor-parallel rank died or stopped answering), every running
// and queued request fails with that status, admission stops (Submit: Unavailable "the
// target failed: ...") and Failure() reports it; the scheduler is then Idle().
//
// Events go to the sink from the scheduler thread (the `unavailable` ones of an abandoned
// StopWithin from its caller), one call at a time, in order per request: zero or more
// kTokens, then exactly one terminal kDone or kError. The sink must not block for long
// and must not call back into the scheduler.
//
// Thread-safety: Submit, Cancel, BeginDrain, Draining, Idle, Failure and Snapshot may be
// called from any thread; Stop, StopWithin and the destructor only from the owner's thread,
// one at a time.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/latency_histogram.h"
#include "coordinator/spec_engine.h"
#include "model/tokenizer/tokenizer.h"

namespace specnode {

using Clock = std::chrono::steady_clock;

struct SlaClass {
  std::string name;
  double ttft_p99_ms = 1000;  // target for time to first token
  double tpot_p99_ms = 200;   // target for time per output token after the first
  int priority = 0;           // lower runs first
  // Load shedding: refuse a request of this class at submission (`overloaded`) when it
  // would wait longer than ttft_p99_ms for a batch slot, predicted from the requests ahead
  // of it and the measured rate at which slots free up. A fast "no" a client can retry
  // elsewhere, instead of a reply that misses its deadline anyway.
  bool shed = false;
};

struct SchedulerOptions {
  std::vector<SlaClass> classes = {{"interactive", 1000, 200, 0}, {"batch", 10000, 1000, 1}};
  std::string default_class = "interactive";
  int max_active = 16;           // running sequences (KV permitting)
  int max_queue = 256;           // waiting requests; beyond: overloaded
  double window_fraction = 0.3;  // batching window <= this * tightest TTFT target
  // A target without work for this long is pinged (SpeculativeEngine::Heartbeat), so a
  // rank that hangs or dies while idle fails the node within heartbeat_s + its deadline.
  // 0 = off.
  double heartbeat_s = 1.0;
  // The largest max_tokens a request may ask for (serve.max_tokens); prompt + max_tokens
  // must also fit the target's context (request_validator.h).
  int64_t max_tokens = 4096;
  // Called on the scheduler thread after every turn of its loop (a step, cancels, an idle
  // heartbeat) and when a request's sequence is freed, before its terminal event (so it
  // may read state the engine owns, such as KV usage, and a client that saw a request end
  // sees its KV released); its values appear in SchedulerSnapshot::gauges. Optional.
  std::function<std::map<std::string, double>()> gauges;
};

// A step error meaning the target can no longer run anything (Unavailable,
// DeadlineExceeded): a lost tensor-parallel rank. Other errors fail only the step's requests.
bool IsTargetLost(const absl::Status& s);

enum class FinishKind { kStop, kLength, kStopString, kCancelled };
// "stop", "length", "stop_string", "cancelled". Inline: the protocol's replies name it
// without linking the scheduler.
inline const char* FinishKindName(FinishKind kind) {
  switch (kind) {
    case FinishKind::kStop:
      return "stop";
    case FinishKind::kLength:
      return "length";
    case FinishKind::kStopString:
      return "stop_string";
    case FinishKind::kCancelled:
      return "cancelled";
  }
  return "?";
}

struct RequestStats {
  int32_t prompt_tokens = 0;
  int32_t cached_tokens = 0;  // of prompt_tokens, taken from the prefix cache (first run)
  int32_t completion_tokens = 0;
  int32_t drafted = 0;
  int32_t accepted = 0;
  int32_t target_passes = 0;
  int32_t tree_steps = 0;  // of the speculative steps, those that verified a draft tree
  double queue_ms = 0, ttft_ms = 0, tpot_ms = 0, total_ms = 0;
  std::string domain, sla;
};

struct GenerationEvent {
  enum class Kind { kTokens, kDone, kError };
  uint64_t handle = 0;
  Kind kind = Kind::kTokens;
  std::string text;                       // kTokens: new text; kDone: the whole text
  std::vector<int32_t> token_ids;         // kTokens: tokens committed in this step
  int32_t index = 0;                      // kTokens: tokens committed before this chunk
  FinishKind finish = FinishKind::kStop;  // kDone
  RequestStats stats;                     // kDone
  absl::Status error;                     // kError
};

struct GenerationRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int64_t max_tokens = 128;
  std::vector<std::string> stop;  // stop strings (text)
  std::string domain = "default";
  std::string sla;  // "" = default class
  // Where this request's events go (called on the scheduler thread, as the scheduler's
  // sink, which it replaces for this request); empty: the scheduler's sink. A front end
  // that owns a request end to end (the HTTP server) sets it, so that no event of the
  // request can arrive before it knows the handle.
  std::function<void(GenerationEvent)> sink;
};

// Counters and gauges for metrics (a consistent copy).
struct SchedulerSnapshot {
  int queued = 0, active = 0;
  int64_t submitted = 0, completed = 0, cancelled = 0, rejected = 0, failed = 0;
  int64_t preemptions = 0;                // every preemption (KV memory or a higher class)
  int64_t swapped = 0;                    // ... that kept the KV in the host tier (else recompute)
  int64_t class_preemptions = 0;          // ... that made room for a waiting higher class
  int64_t kv_waits = 0;                   // admission rounds stopped because the KV would not fit
  int64_t shed = 0;                       // rejected by a shedding class's deadline (in rejected)
  int64_t steps = 0, step_sequences = 0;  // Σ batch sizes; mean = step_sequences / steps
  int last_batch = 0;
  double window_ms = 0;  // current batching window
  // Per SLA class (every configured class from the start), since start, seconds: completed
  // requests' time to first token (requests with a token), time per output token after the
  // first (requests with 2+ tokens; the request's mean, RequestStats::tpot_ms), queue time
  // and end-to-end latency (RequestStats queue_ms, total_ms).
  struct SlaLatency {
    LatencyHistogram ttft{kTtftBucketsS}, tpot{kTpotBucketsS};
    LatencyHistogram queue{kRequestBucketsS}, e2e{kRequestBucketsS};
  };
  std::map<std::string, SlaLatency> latency;
  // Tokens of requests that ended (completed or cancelled; not failed), since start: prompt
  // and generated tokens, and per domain the draft tokens proposed and accepted.
  int64_t prompt_tokens = 0, generation_tokens = 0;
  int64_t cached_prompt_tokens = 0;  // of prompt_tokens, prefix-cache hits
  std::map<std::string, int64_t> drafted_by_domain, accepted_by_domain;
  std::map<std::string, int64_t> errors_by_code;  // filled by the front end's counters
  std::map<std::string, double> gauges;           // SchedulerOptions::gauges, latest
};

class Scheduler {
 public:
  using Sink = std::function<void(GenerationEvent)>;

  // engine and tokenizer must outlive the scheduler. Starts the scheduler thread.
  Scheduler(SpeculativeEngine* engine, const Tokenizer* tokenizer, SchedulerOptions options,
            Sink sink);
  ~Scheduler();  // Stop()

  // Checks a request (ValidateRequest with the target's limits and max_tokens, then its SLA
  // class) and queues it; returns its handle and queue position. Errors, each carrying its
  // RequestError (request_error.h), nothing queued: bad_request / prompt_too_long (the
  // validator), unknown_sla, overloaded (queue full, or load shed), shutting_down (draining),
  // unavailable (the target was lost).
  struct Ticket {
    uint64_t handle;
    int queue_position;
  };
  absl::StatusOr<Ticket> Submit(GenerationRequest request);

  // Ends a queued or running request with kCancelled (its KV freed). False if unknown or
  // already finished.
  bool Cancel(uint64_t handle);

  // Stop admitting (Submit returns Unavailable); running and queued requests finish.
  void BeginDrain();
  // Cancels whatever is left, emits their terminal events and joins the thread (however
  // long the engine call the thread is in takes).
  void Stop();
  // Stop, waiting at most `wait` for the scheduler thread: OK once it has cancelled the rest
  // and been joined. A thread still inside the engine then (a step or heartbeat that does not
  // return: a hung kernel or target) is abandoned instead (scheduler_stop.cc): every request
  // without its terminal event gets exactly one, kError `unavailable` (request_error.h),
  // through its own sink from the calling thread; nothing the thread emits afterwards reaches
  // a sink; Idle() turns true; and this (and every later call) returns DeadlineExceeded
  // saying so. The abandoned thread keeps using the engine, the targets and this scheduler:
  // destroy them only once it can return (the destructor still joins it, blocking until
  // then), or end the process without destructors (ServeNode does: serve_node.h).
  absl::Status StopWithin(std::chrono::duration<double> wait);
  // True after BeginDrain (or Stop).
  bool Draining() const;
  // True once draining and nothing is queued or running (or StopWithin abandoned the
  // thread: nothing more will come from it).
  bool Idle() const;
  // OK, or the step error that lost the target (see above); the node should exit.
  absl::Status Failure() const;

  SchedulerSnapshot Snapshot() const;
  const SchedulerOptions& options() const { return options_; }

 private:
  struct Req;
  void Loop();
  // Admission and preemption (scheduler_admission.cc), under mu_ on the scheduler thread.
  void AdmitLocked(Clock::time_point now);
  // With the batch full and a request of a higher class waiting, preempts the newest
  // running request of the lowest class below it.
  void MakeRoomForHigherClassLocked();
  // Among running `seqs`: the lowest class, newest within it.
  uint64_t ChooseVictim(std::span<const SeqId> seqs) const;
  // Parks the request's KV in the host tier (SpeculativeEngine::Park), or frees it for
  // recompute, and requeues it first in its class.
  void PreemptLocked(uint64_t handle);
  // Decode tokens an admitted request must have KV room for, beyond its prompt.
  static constexpr int64_t kAdmitDecodeTokens = 16;
  // A request admitted this long after its arrival waited for a slot (load shedding).
  static constexpr double kBackloggedMs = 1.0;
  void RunStep();
  // Fails every request with `st` (a lost target), stops admitting, records Failure().
  void LoseTarget(const absl::Status& st);
  Req* Lookup(uint64_t handle);  // under mu_ (the map may be growing)
  void Finish(Req& r, FinishKind kind);
  // Hands one of r's events to its sink (GenerationRequest::sink, else sink_), under
  // emit_mu_: nothing after r's first terminal event, nothing once the sinks are closed.
  void Emit(Req& r, GenerationEvent ev);
  // StopWithin's way out when the thread did not stop in time (scheduler_stop.cc); returns
  // OK when it had exited after all.
  absl::Status Abandon(std::chrono::duration<double> waited);
  // Samples options_.gauges into stats_ (scheduler thread; takes mu_ to store).
  void RefreshGauges();
  void Fail(Req& r, absl::Status status);
  // Drops a finished request from the running list, the queue and the map (r dies).
  void Forget(uint64_t handle);
  const SlaClass* FindClass(const std::string& name) const;

  SpeculativeEngine* engine_;
  const Tokenizer* tok_;
  SchedulerOptions options_;
  Sink sink_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, std::unique_ptr<Req>> reqs_;  // queued + running
  std::map<int, std::deque<uint64_t>> queue_;      // priority -> handles
  std::vector<uint64_t> running_;
  std::vector<uint64_t> cancels_;
  uint64_t next_handle_ = 1;
  bool draining_ = false, stopping_ = false;
  bool loop_exited_ = false;  // the thread has left Loop (exited_cv_ signals it)
  bool abandoned_ = false;    // StopWithin gave up on the thread
  absl::Status abandon_status_;
  std::condition_variable exited_cv_;
  absl::Status failure_;  // set once, when the target is lost
  SchedulerSnapshot stats_;
  Clock::time_point last_arrival_{};
  double mean_gap_ms_ = -1;  // EWMA of inter-arrival gaps
  // Slot turnover for load shedding: EWMA of the gaps between admissions of requests that
  // had to wait (backlogged: the gap is the time a slot takes to free up); -1 = unknown.
  Clock::time_point last_admit_{};
  double mean_admit_gap_ms_ = -1;
  // Held while a sink runs; taken before mu_ (never the other way round). Guards
  // Req::terminal_sent and sinks_closed_ (set when StopWithin abandons the thread).
  std::mutex emit_mu_;
  bool sinks_closed_ = false;
  std::thread thread_;
};

}  // namespace specnode
