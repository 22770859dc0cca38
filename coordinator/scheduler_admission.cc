// Scheduler admission and preemption (the policy half of scheduler.h): which queued
// requests join the running batch, and which running one gives way when KV memory or a
// higher class needs room.
#include <algorithm>

#include "coordinator/scheduler.h"
#include "coordinator/scheduler_internal.h"

namespace specnode {

void Scheduler::AdmitLocked(Clock::time_point now) {
  MakeRoomForHigherClassLocked();
  // Tokens of requests admitted in this round: not in the KV store yet, so the store's
  // free bytes do not show them.
  int64_t planned = 0;
  for (auto& [prio, q] : queue_) {
    while (!q.empty() && static_cast<int>(running_.size()) < options_.max_active) {
      const uint64_t h = q.front();
      Req& r = *reqs_.at(h);
      const auto id = static_cast<SeqId>(h);
      if (engine_->Parked(id)) {
        // Swapped out by a preemption: back in only if its KV fits again.
        if (!engine_->Resume(id).ok()) return;
      } else if (!engine_->Has(id)) {
        // KV-aware admission: the prompt (with any output so far, after a recompute
        // preemption) plus a little decode room must fit. With nothing running, admit
        // anyway: alone it either fits or fails with resource_exhausted.
        const int64_t need = static_cast<int64_t>(r.g.prompt.size() + r.output.size()) +
                             std::min<int64_t>(kAdmitDecodeTokens, r.g.max_tokens);
        if (!running_.empty() && !engine_->HasRoomFor(planned + need)) {
          stats_.kv_waits++;
          return;  // strict class/FIFO order: nothing behind it jumps ahead
        }
        planned += need;
      }
      q.pop_front();
      r.running = true;
      if (!r.scheduled_once) {
        r.scheduled_once = true;
        r.scheduled = now;
        // Slot turnover for load shedding, from requests that had to wait: after an idle
        // spell the next request is admitted at once and only restarts the clock.
        if (Ms(r.arrival, now) > kBackloggedMs && last_admit_ != Clock::time_point{}) {
          UpdateMeanGap(&mean_admit_gap_ms_, Ms(last_admit_, now));
        }
        last_admit_ = now;
      }
      running_.push_back(h);
    }
  }
}

void Scheduler::MakeRoomForHigherClassLocked() {
  if (static_cast<int>(running_.size()) < options_.max_active || running_.empty()) return;
  int waiting = -1;  // the best class with a queued request
  for (const auto& [prio, q] : queue_) {
    if (!q.empty()) {
      waiting = prio;
      break;
    }
  }
  if (waiting < 0) return;
  std::vector<SeqId> seqs(running_.begin(), running_.end());
  const uint64_t victim = ChooseVictim(seqs);
  // Only a strictly lower class gives way (equal classes wait their turn: no thrashing).
  if (reqs_.at(victim)->cls->priority <= waiting) return;
  PreemptLocked(victim);
  stats_.class_preemptions++;
}

uint64_t Scheduler::ChooseVictim(std::span<const SeqId> seqs) const {
  // The lowest class (highest priority number); within it the newest (last in the list).
  uint64_t victim = static_cast<uint64_t>(seqs.back());
  int worst = -1;
  for (SeqId s : seqs) {
    const int prio = reqs_.at(static_cast<uint64_t>(s))->cls->priority;
    if (prio >= worst) {
      worst = prio;
      victim = static_cast<uint64_t>(s);
    }
  }
  return victim;
}

void Scheduler::PreemptLocked(uint64_t victim) {
  Req& r = *reqs_.at(victim);
  const auto id = static_cast<SeqId>(victim);
  if (engine_->Park(id).ok()) {
    stats_.swapped++;
  } else {
    // No host tier (or it is full, or the sequence is still prefilling): drop its KV and
    // recompute later from prompt + output so far.
    const SpecSeqStats& s = engine_->Stats(id);
    if (r.cached_tokens < 0) r.cached_tokens = s.cached_tokens;
    r.drafted += s.drafted;
    r.accepted += s.accepted;
    r.passes += s.steps;
    r.tree_steps += s.tree_steps;
    engine_->Finish(id);
  }
  r.running = false;
  running_.erase(std::find(running_.begin(), running_.end(), victim));
  queue_[r.cls->priority].push_front(victim);
  stats_.preemptions++;
}

}  // namespace specnode
