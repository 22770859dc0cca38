// A tensor-parallel target model inside one process: T shard ranks, each a LlamaModel
// shard (ShardPlan::Spec(r)) with its own LlamaForward, ThreadPool and DenseKvCache (its
// kv heads only), summing partial O / down projections through a LocalCommunicatorGroup.
// What the single-process node and the TP tests / bench use; under mpirun each rank is a
// process instead and uses MpiCommunicator.
//
//   LocalTpTargetOptions o{.tp_size = 3};
//   SPECNODE_ASSIGN_OR_RETURN(auto target, LocalTpTarget::Load(path, o));
//   SPECNODE_RETURN_IF_ERROR(target->Forward(batch, &logits));   // [n_rows, vocab]
//
// Forward runs every rank's pass concurrently (rank 0 on the calling thread, ranks 1..T-1
// on persistent worker threads that sleep on a condition variable between steps) and
// returns rank 0's logits; every rank computes bit-identical logits (the all-reduce gives
// every rank the same bits), which tests check via rank_logits(). Cache operations
// (Truncate, Free) apply to every rank's cache.
//
// Errors: a rank's failure (bad token, cache full, communicator deadline) is returned; a
// communicator failure breaks the target (later Forward calls return FailedPrecondition).
// Not thread-safe: one call at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/llama/llama_forward.h"
#include "model/llama/llama_model.h"
#include "tensor-parallel/communicator.h"
#include "tensor-parallel/shard_plan.h"

namespace specnode {

class LocalCommunicatorGroup;

struct LocalTpTargetOptions {
  int tp_size = 1;
  int threads_per_rank = 1;  // each rank's ThreadPool
  int64_t kv_tokens = 4096;  // per rank's DenseKvCache (sum over sequences)
  CommunicatorOptions comm;  // collective deadline
};

class LocalTpTarget {
 public:
  // Validates the plan from the file's metadata before loading any shard (InvalidArgument
  // with ShardPlan's message, prefixed with the path).
  static absl::StatusOr<std::unique_ptr<LocalTpTarget>> Load(const std::string& path,
                                                             const LocalTpTargetOptions& options);
  ~LocalTpTarget();

  absl::Status Forward(std::span<const BatchEntry> batch, std::vector<float>* logits);
  absl::Status Truncate(SeqId seq, int32_t n);
  void Free(SeqId seq);
  int32_t Length(SeqId seq) const;

  int tp_size() const { return plan_.size(); }
  const ShardPlan& plan() const { return plan_; }
  const LlamaConfig& config() const { return plan_.config(); }
  const LlamaModel& model(int rank) const;
  // Rank r's logits of the last Forward (rank 0's are what Forward returned).
  const std::vector<float>& rank_logits(int rank) const;
  // Collective payload bytes, summed over ranks, since Load.
  int64_t bytes_sent() const;

 private:
  struct Rank;
  class Workers;
  explicit LocalTpTarget(ShardPlan plan);

  ShardPlan plan_;
  std::unique_ptr<LocalCommunicatorGroup> group_;
  std::vector<std::unique_ptr<Rank>> ranks_;
  std::unique_ptr<Workers> workers_;
  absl::Status broken_;
};

}  // namespace specnode
