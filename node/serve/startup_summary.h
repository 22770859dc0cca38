// The line `serve` prints once it is ready: how long the start took, what the weights
// take, and what the KV budget it sized holds — tokens at f16 and whole sequences of the
// served length against max_active — so an operator sees the capacity without arithmetic.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

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

// One target rank's share of a tensor-parallel group, as rank 0 learns it: the weights
// from the shard plan (tensor-parallel/shard_plan.h ForFile), the KV budget from the rank's
// HelloAck.
struct RankMemory {
  int rank = 0;
  std::string device;  // "cpu", "cuda:1"
  std::string host;
  int64_t weight_bytes = 0;
  int64_t kv_bytes = 0;
};

// "group a target, TP 2 over ...: per rank 4 heads, 1 kv heads, 256 ffn units; rank 1 cpu
// on nodeA: weights 42.1 MiB, KV 64 MiB; rank 2 ...": what each rank of a TP target holds.
std::string TargetRanksLine(std::string_view group, std::string_view plan,
                            std::span<const RankMemory> ranks);

// Seconds since this process started (/proc/self/stat's start time against
// /proc/uptime); 0 when they cannot be read.
double ProcessAgeS();

}  // namespace specnode
