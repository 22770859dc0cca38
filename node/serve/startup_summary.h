// The line `serve` prints once it is ready: how long the start took, what the weights
// take, and what the KV budget it sized holds — tokens at f16 and whole sequences of the
// served length against max_active — so an operator sees the capacity without arithmetic.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "runtime/model_runner.h"

namespace specnode {

struct StartupFigures {
  double ready_s = 0;        // since the process started (ProcessAgeS)
  int64_t weight_bytes = 0;  // the target file's tensors
  // The target's store: capacity (summed over ranks) and, for one sequence of
  // max_model_len tokens, the bytes it needs and the room there is (ModelRunner::Room:
  // the tightest rank's). Unset: an unmanaged cache (kv mode dense).
  std::optional<ModelRunner::KvMemory> kv;
  std::optional<ModelRunner::KvRoom> sequence_room;
  int32_t max_model_len = 0;
  int max_active = 0;
};

// "ready in 3.2 s; weights 85.9 MiB; KV 1024 MiB (46603 tokens at f16: 5.7 sequences of
// 8192 tokens, max_active 16)"; the KV figure sums a tensor-parallel target's ranks.
std::string StartupSummary(const StartupFigures& f);

// Seconds since this process started (/proc/self/stat's start time against
// /proc/uptime); 0 when they cannot be read.
double ProcessAgeS();

}  // namespace specnode
