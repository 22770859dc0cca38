// RemoteTargetRunner: rank 0's ModelRunner for a target model whose tensor-parallel shards
// run on other MPI ranks (node/shard_worker.h). Each Forward is one StepPlan sent to every
// shard and one StepReply from each (docs/control-protocol.md); TP rank 0's reply carries
// the logits. The speculative engine and scheduler drive it exactly like a LocalModelRunner.
//
// Cache bookkeeping. The runner keeps every sequence's committed length locally, so
// Length() never waits for the network. Truncate/Free update that copy at once and are
// queued; they travel as ops at the head of the next StepPlan, and every shard applies the
// same op sequence, so their block tables stay identical. Each reply reports a fingerprint
// of the shard's (seq, length) table; the runner checks that every shard's equals its own.
//
// Draft trees travel the same way: a tree entry's parents in the StepPlan, the kept path as
// a KeepRows op at the head of the next one.
//
// Prefix cache. When every shard's cache keeps one (HelloAck), MatchPrefix is an ops-only
// step of its own (the engine needs the count before it plans the prompt: one round trip
// per admitted request); the shards agree on the count, and the runner's copy of the
// sequence's length becomes it. PublishPrefix is queued like Truncate. TP rank 0's replies
// carry the cache's events (blocks stored, evicted), handed to the listener of
// SetKvEventListener on the driving thread, in order, when the reply arrives.
//
// Failures:
//   - ResourceExhausted / InvalidArgument from the shards (they agree on it before any
//     collective, so every shard fails alike): returned as is; the caches are unchanged,
//     the runner stays usable (the scheduler preempts and retries).
//   - A shard that does not answer within timeout_s (awaited 1.5x as long, see
//     kReplyGraceFactor), a shard process that is gone (same
//     host: noticed within ~20 ms), a malformed reply, diverging fingerprints, or any other
//     shard error: the runner is broken. This and every later call return
//     Unavailable / DeadlineExceeded / Internal naming the rank, e.g.
//       "target rank 2 did not answer within 5.0 s"
//       "target rank 2 (pid 4711) is gone"
//
// Thread-safety: not thread-safe (one driver: the engine). shards() is immutable after
// Connect and may be read from any thread. Uses the ControlChannel, which must outlive it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "node/cluster/control_channel.h"
#include "node/cluster/control_protocol.h"
#include "runtime/model_runner.h"

namespace specnode {

struct ShardInfo {
  int world_rank = 0;
  int tp_rank = 0;
  int64_t pid = 0;
  std::string host;
  int64_t kv_capacity_bytes = 0;
  int n_kv_heads_local = 0;
  int64_t kv_page_bytes = 0;  // 0: the shard's cache cannot tell (HelloAckMessage)
  int32_t kv_page_tokens = 0;
  int32_t kv_pass_boundary = 0;  // HelloAckMessage
  bool kv_prefix_cache = false;  // HelloAckMessage
  bool kv_tree_passes = false;   // HelloAckMessage (v6)
};

struct RemoteTargetOptions {
  std::vector<int> shard_ranks;    // world ranks of TP ranks 0..T-1, in TP order
  double timeout_s = 5.0;          // per step: the longest wait for a shard's reply
  double startup_timeout_s = 300;  // for the HelloAcks (shards load their weights first)
  ModelFingerprint model;          // rank 0's view of the model file
  int32_t vocab_size = 0;
  int32_t max_positions = 0;
  std::string role = "target";  // names the ranks in errors: "target rank 2", "draft rank 4"
};

class RemoteTargetRunner final : public ModelRunner {
 public:
  // Replies are awaited for timeout_s times this (see CollectReplies): the shards' own
  // collective deadlines (timeout_s) expire first, so a hung rank is named correctly.
  static constexpr double kReplyGraceFactor = 1.5;
  // Sends Hello to every shard and checks their HelloAcks: protocol version, model
  // fingerprint, TP rank and size, and the shard's own start-up status. Errors name the
  // rank: FailedPrecondition "target rank 2 opened a different model file (...) than rank 0
  // (...)", the shard's load error "target rank 2: <message>", or a timeout.
  static absl::StatusOr<std::unique_ptr<RemoteTargetRunner>> Connect(ControlChannel* channel,
                                                                     RemoteTargetOptions options);

  int32_t vocab_size() const override { return options_.vocab_size; }
  int32_t max_positions() const override { return options_.max_positions; }
  // The shards' (one config, so one value; their gcd if they differ: a pass inside a block
  // of the gcd is inside a block of each).
  int32_t PassBoundary() const override {
    int32_t b = 0;
    for (const ShardInfo& s : shards_) b = std::gcd(b, s.kv_pass_boundary);
    return b;
  }
  // "ranks 1,2,3" (the shard ranks it drives).
  std::string device() const override;
  absl::Status Forward(std::span<const BatchEntry> batch, std::vector<float>* logits) override;
  // BeginForward sends the step plan to every shard; EndForward waits for their replies.
  // Between the two, other runners' shards can compute (several groups of a cluster).
  absl::Status BeginForward(std::span<const BatchEntry> batch) override;
  absl::Status EndForward(std::vector<float>* logits) override;
  int32_t Length(SeqId seq) const override;
  absl::Status Truncate(SeqId seq, int32_t n) override;
  // Draft trees: when every shard's cache takes them (HelloAck v6). Entries carry their
  // parents; KeepRows is checked against the runner's copy of the length, which becomes
  // pos0 + rows.size() at once, and queued like Truncate (a kKeepRows op).
  bool TreePasses() const override;
  absl::Status KeepRows(SeqId seq, int32_t pos0, std::span<const int32_t> rows) override;
  void Free(SeqId seq) override;
  // From the shards' page geometry (HelloAck) and their available bytes as of the last
  // reply (capacity before the first step); the tightest shard decides, since every shard
  // must hold the sequence's slice. nullopt when a shard cannot tell.
  std::optional<KvRoom> Room(int64_t tokens) const override;
  // An empty StepPlan (ops only): every shard must answer within timeout_s.
  absl::Status Ping() override;
  // Summed over the shards, as of the last reply.
  std::optional<KvMemory> Memory() const override;
  // The shards' prefix cache (see the top of this file). MatchPrefix answers 0 without a
  // round trip when a shard has no prefix cache, the sequence exists, or the runner broke
  // (the next Forward reports it); SetKvEventListener is Unimplemented without one.
  int32_t MatchPrefix(SeqId seq, std::span<const int32_t> tokens) override;
  void PublishPrefix(SeqId seq, std::span<const int32_t> tokens) override;
  absl::Status SetKvEventListener(KvCacheEventListener* listener) override;

  // Tells every shard to leave its loop (best effort, ~1 s per shard at most). Call after
  // the last Forward, from the thread that drives the runner.
  void Shutdown(const std::string& reason);

  // OK until the runner broke; then the error every call returns.
  const absl::Status& broken() const { return broken_; }
  const std::vector<ShardInfo>& shards() const { return shards_; }

 private:
  RemoteTargetRunner(ControlChannel* channel, RemoteTargetOptions options)
      : channel_(channel), options_(std::move(options)) {}
  absl::Status Break(absl::Status s);
  std::string RankName(size_t i) const;  // "target rank 2"
  // Unavailable "target rank R (pid P) is gone" for the first dead shard among `which`.
  absl::Status CheckAlive(const std::vector<size_t>& which) const;
  absl::Status SendPlan(const std::string& plan_frame);
  absl::Status CollectReplies(uint64_t step, std::vector<StepReplyMessage>* replies);
  bool PrefixCache() const;  // every shard keeps one

  // The step in flight between BeginForward and EndForward.
  struct Pending {
    uint64_t step = 0;
    int64_t rows = 0;                            // logits rows expected
    std::vector<std::pair<SeqId, int32_t>> fed;  // tokens each entry feeds
    std::vector<SeqId> matching;                 // the plan's MatchPrefix ops, in order
  };

  ControlChannel* channel_;
  RemoteTargetOptions options_;
  std::vector<ShardInfo> shards_;
  std::map<SeqId, int32_t> lengths_;  // committed length per sequence (ordered: fingerprint)
  std::vector<StepOp> pending_ops_;   // sent with the next plan
  uint64_t step_ = 0;
  Pending pending_;
  // A shard's KV memory as of its last reply (its whole capacity before the first step).
  struct ShardKv {
    int64_t available = -1;  // -1: the shard cannot tell
    int64_t used = 0;
    std::array<int64_t, kNumKvPrecisions> class_bytes{};
    std::array<int64_t, kNumKvPrecisions> class_tokens{-1, -1, -1, -1};  // -1: cannot tell
    int64_t host_bytes = -1;
    int64_t cache_only = -1;  // -1: the shard cannot tell
  };
  std::vector<ShardKv> kv_;  // per shard, in TP order
  bool in_flight_ = false;
  absl::Status broken_;
  KvCacheEventListener* listener_ = nullptr;  // borrowed (SetKvEventListener)
};

}  // namespace specnode
