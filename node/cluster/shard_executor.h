// ShardExecutor: what one tensor-parallel target shard does with a StepPlan
// (docs/control-protocol.md), independent of how plans arrive (MPI in shard_worker.h;
// threads + LocalCommunicator in the tests).
//
// Execute(plan) on every shard of the group, with the same plan:
//   1. applies the plan's ops in order (every shard applies the same op sequence, so the
//      block tables stay identical): Truncate, Free, PublishPrefix, and MatchPrefix, whose
//      count the shards agree on (one AllGather; each keeps the shortest match, so a shard
//      whose cache evicted differently — a reservation that failed on one shard only —
//      cannot make the tables diverge);
//   2. checks the batch (token ids, duplicate or empty entries) and Reserves KV for it,
//      undoing its own reservations of new sequences if one fails;
//   3. agrees with the other shards on the outcome of 2 (one AllGather of status codes)
//      BEFORE any collective of the forward pass: if any shard failed (KV exhausted on one
//      shard only, say), every shard undoes its reservations and replies with that status
//      (ResourceExhausted stays ResourceExhausted, so the scheduler preempts as with a
//      local target) — no shard is left waiting in an all-reduce;
//   4. runs the shard's forward pass (its ModelRunner: a CPU LlamaForward or a GPU one, each
//      with the group's all-reduce); only TP rank 0 computes the head and returns logits
//      [n_rows, vocab];
//   5. reports the block-table fingerprint (FingerprintLengths over its live sequences) and,
//      on TP rank 0, the prefix cache's events of the step (stored blocks, evictions).
// A communicator failure in 3 or 4 (a peer gone, deadline) is returned in the reply's
// status; the group is broken after it (Communicator contract).
//
// Not thread-safe: one Execute at a time. config and comm are borrowed and must outlive the
// executor; the model runner is owned. `comm` carries the step's agreement (step 3) in host
// memory; the pass's own all-reduce is the runner's business.
//
// Memory: the reply's KV fields come from the runner's Room / Memory (ModelRunner).
#pragma once

#include <memory>
#include <set>
#include <vector>

#include "absl/status/statusor.h"
#include "model/llama/kv_cache.h"
#include "model/llama/kv_cache_events.h"
#include "model/llama/llama_forward.h"
#include "node/cluster/control_protocol.h"
#include "runtime/model_runner.h"
#include "tensor-parallel/communicator.h"

namespace specnode {

class ShardExecutor {
 public:
  // `model`: the shard's runner from the one factory (runtime/runner_factory.h), with the
  // group's all-reduce as its reducer (host memory on the CPU, NCCL on a GPU); it must
  // implement Reserve. `comm` is a host-memory communicator of the same group.
  ShardExecutor(const LlamaConfig& config, std::unique_ptr<ModelRunner> model,
                Communicator* comm);

  StepReplyMessage Execute(const StepPlanMessage& plan);

  ModelRunner& model() { return *model_; }
  int tp_rank() const { return comm_->rank(); }
  // The shard's cache keeps a prefix cache (the paged store; HelloAckMessage).
  bool prefix_cache() const { return prefix_cache_; }

 private:
  // Gathers the cache's events between replies (the cache calls it on Execute's thread).
  struct EventLog : KvCacheEventListener {
    void OnKvCacheEvent(KvCacheEvent event) override { events.push_back(std::move(event)); }
    std::vector<KvCacheEvent> events;
  };

  KvFingerprint Fingerprint() const;
  // The MatchPrefix op: attaches, agrees on the count with the other shards, keeps that.
  absl::StatusOr<int32_t> MatchPrefix(const StepOp& op);

  const LlamaConfig& config_;
  Communicator* comm_;
  EventLog events_;  // before model_: the cache points at it until the cache is gone
  std::unique_ptr<ModelRunner> model_;
  bool prefix_cache_ = false;
  std::set<SeqId> live_;  // sequences that may hold tokens (superset; Length 0 skipped)
  std::vector<float> logits_;
};

}  // namespace specnode
