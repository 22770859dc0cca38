// Private to coordinator/scheduler*.cc: the scheduler's per-request record, shared by
// scheduler.cc (the step loop, streaming) and scheduler_admission.cc (admission,
// preemption). Guarded by Scheduler::mu_ where scheduler.h says so.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "coordinator/scheduler.h"
#include "model/tokenizer/tokenizer.h"

namespace specnode {

// Milliseconds from a to b.
inline double Ms(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// The scheduler's gap averages: the first sample, then an EWMA with weight 0.2.
// `*mean` < 0 means no sample yet.
inline void UpdateMeanGap(double* mean, double sample) {
  *mean = *mean < 0 ? sample : 0.8 * *mean + 0.2 * sample;
}

struct Scheduler::Req {
  uint64_t handle = 0;
  GenerationRequest g;
  const SlaClass* cls = nullptr;
  Clock::time_point arrival, scheduled, first_token, last_token;
  bool running = false, scheduled_once = false, done = false;
  bool terminal_sent = false;  // under Scheduler::emit_mu_: its kDone / kError went out
  std::vector<int32_t> output;  // generated tokens (survive preemption)
  Utf8StreamDecoder utf8;
  std::string text;
  size_t emitted = 0;                             // bytes of text already sent
  size_t checked = 0;                             // bytes of text already searched for stop strings
  size_t max_stop = 0;                            // longest stop string
  int32_t drafted = 0, accepted = 0, passes = 0;  // over preemptions
  int32_t tree_steps = 0;                         // over preemptions
  int32_t cached_tokens = -1;  // prefix-cache hit of the first run (-1: not run yet)
};

}  // namespace specnode
