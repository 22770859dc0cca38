// ModelRunner: the coordinator's view of one model instance (a draft, or a target that may
// be split over tensor-parallel ranks): a batched forward pass over its own KV cache, plus
// the cache operations a speculative step and the scheduler need (length, rollback, free,
// admission room, usage, swap, sharing).
//
// The runtime layer, below coordinator/: the speculative engine only talks to this
// interface, so a target on a GPU or one whose shards live on other MPI ranks
// (node/cluster's RemoteTargetRunner) slots in without the engine changing. Runners in
// this process are LocalModelRunner — the one Llama graph over a Backend and a KvCache on
// the same device — built by runtime/runner_factory.h.
//
// Not thread-safe: one caller drives a runner (the engine's step loop).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "model/llama/backend.h"
#include "model/llama/kv_cache.h"
#include "model/llama/llama_forward.h"

namespace specnode {

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;

  virtual int32_t vocab_size() const = 0;
  // Longest sequence the model accepts (its context length).
  virtual int32_t max_positions() const = 0;

  // LlamaForward::Forward over this runner's cache: `logits` gets [n_rows, vocab] rows (every
  // token of an all_logits entry, else its last token). On error the cache is unchanged.
  virtual absl::Status Forward(std::span<const BatchEntry> batch, std::vector<float>* logits) = 0;

  // Split-phase Forward, so that targets on different ranks compute at the same time (the
  // engine begins every group's pass, then ends each). BeginForward starts the pass;
  // `batch` (and the token spans it points to) must stay valid until EndForward, which
  // waits for it and fills `logits` exactly as Forward would. At most one pass is pending.
  // An error from BeginForward means nothing started (no EndForward follows). The default
  // runs Forward inside EndForward (a runner in this process has nothing to overlap).
  virtual absl::Status BeginForward(std::span<const BatchEntry> batch);
  virtual absl::Status EndForward(std::vector<float>* logits);

  // For greedy consumers: (*ids)[r] = ArgMax of logits row r, the rows Forward would give,
  // the same tokens; a runner whose logits live on a device keeps them there (only the ids
  // travel). ForwardArgMax's default runs Forward and takes the arg max on the host;
  // EndForwardArgMax ends a BeginForward that way: ForwardArgMax on the default split
  // phase's pending batch, else EndForward and the host's arg max (a remote target).
  virtual absl::Status ForwardArgMax(std::span<const BatchEntry> batch, std::vector<int32_t>* ids);
  virtual absl::Status EndForwardArgMax(std::vector<int32_t>* ids);

  // For top-k samplers (Sampler::HeadCandidates): each row's k largest logits, ids and
  // values [n_rows * k] in TopK's order (model/llama/sampling.h), from the rows Forward would
  // give; a runner whose logits live on a device moves only those. 0 < k <= vocab_size().
  // Defaults and split phase as ForwardArgMax's.
  virtual absl::Status ForwardTopK(std::span<const BatchEntry> batch, int k,
                                   std::vector<int32_t>* ids, std::vector<float>* values);
  virtual absl::Status EndForwardTopK(int k, std::vector<int32_t>* ids, std::vector<float>* values);

  // For samplers that prune nothing (Sampler::DrawsWithParams): (*ids)[r] = the token row r
  // of Forward's rows draws with draws[r] ([n_rows]; DrawRows of model/llama/sampling.h), the
  // token Sampler::Sample would give; a runner whose logits live on a device draws there
  // and moves one id a row. InvalidArgument when draws.size() is not the number of rows.
  // Defaults and split phase as ForwardArgMax's (`draws` must stay valid until the end).
  virtual absl::Status ForwardDrawn(std::span<const BatchEntry> batch,
                                    std::span<const sample::DrawParams> draws,
                                    std::vector<int32_t>* ids);
  virtual absl::Status EndForwardDrawn(std::span<const sample::DrawParams> draws,
                                       std::vector<int32_t>* ids);

  virtual int32_t Length(SeqId seq) const = 0;
  // Makes room for `count` more tokens of `seq` ahead of a Forward that adds them (KvCache
  // Reserve semantics: ResourceExhausted when the cache is full, nothing changes). Forward
  // reserves on its own; a tensor-parallel shard reserves first so that every shard can
  // agree on the outcome before the pass's collectives. Unimplemented by default.
  virtual absl::Status Reserve(SeqId seq, int32_t count);
  // Drops cached positions [n, Length(seq)) (rollback of rejected drafts).
  virtual absl::Status Truncate(SeqId seq, int32_t n) = 0;
  // Draft trees (BatchEntry::parents): whether Forward takes tree entries, and after one
  // the path to keep (KvCache::KeepRows: rows ascending offsets from pos0, row rows[j] kept
  // at position pos0 + j). false / Unimplemented by default (a remote target: its protocol
  // carries chains only).
  virtual bool TreePasses() const { return false; }
  virtual absl::Status KeepRows(SeqId seq, int32_t pos0, std::span<const int32_t> rows);
  virtual void Free(SeqId seq) = 0;

  // "cpu", "cuda:N", or for a remote target the ranks it runs on: for logs and errors.
  virtual std::string device() const { return "an unnamed device"; }

  // KV-aware admission: `needed` = bytes `tokens` more tokens take at most, `available` =
  // bytes the cache can make available now. nullopt when the runner cannot tell (a dense
  // cache); the scheduler then admits and relies on preemption.
  struct KvRoom {
    int64_t needed = 0;
    int64_t available = 0;
  };
  virtual std::optional<KvRoom> Room(int64_t tokens) const;
  // KV bytes allowed and in use (summed over a remote target's shards), for metrics;
  // nullopt when unknown.
  struct KvMemory {
    int64_t capacity_bytes = 0;
    int64_t used_bytes = 0;
    std::array<int64_t, kKvClasses> class_bytes{};  // in pages of each precision class
    // Live tokens per class and swap-tier bytes: unset where the runner cannot tell (a
    // remote target: the shards' replies carry bytes only).
    std::optional<std::array<int64_t, kKvClasses>> class_tokens;
    std::optional<int64_t> host_bytes;
    // Of used_bytes, the prefix cache's pages no sequence uses (evictable); unset where the
    // runner cannot tell.
    std::optional<int64_t> cache_only_bytes;
  };
  virtual std::optional<KvMemory> Memory() const;
  // Live tokens per class of one sequence; nullopt when unknown.
  virtual std::optional<std::array<int64_t, kKvClasses>> SequenceTokens(SeqId seq) const;
  // Preemption that keeps the KV: SwapOut moves a sequence's cached rows to the cache's host
  // tier and frees its pages; SwapIn brings them back (ResourceExhausted when they do not
  // fit now; nothing changes). Unimplemented by default: the caller frees and recomputes.
  virtual absl::Status SwapOut(SeqId seq);
  virtual absl::Status SwapIn(SeqId seq);
  // Sharing (KvCache::Fork / MatchPrefix / PublishPrefix): Unimplemented / nothing cached /
  // ignored by default.
  virtual absl::Status Fork(SeqId src, SeqId dst);
  virtual int32_t MatchPrefix(SeqId seq, std::span<const int32_t> tokens) { return 0; }
  virtual void PublishPrefix(SeqId seq, std::span<const int32_t> tokens) {}
  // KvCache::SetEventListener of the target's cache (for a remote target, its shards'
  // caches: node/cluster/remote_target_runner.h). Unimplemented by default.
  virtual absl::Status SetKvEventListener(KvCacheEventListener* listener);
  // KvCache::PassBoundary of the target's cache (for a remote target, its shards'): the
  // rows one pass may hold of one sequence lie between two multiples of it (0: any).
  virtual int32_t PassBoundary() const { return 0; }
  // Liveness while idle: a remote target exchanges an empty step with its ranks (and
  // flushes queued frees), failing like Forward when one is gone or silent. OK by default.
  virtual absl::Status Ping();

 private:
  std::span<const BatchEntry> pending_;  // the default split phase's batch
  bool has_pending_ = false;
  std::vector<float> argmax_logits_;  // the defaults' host logits
};

// A runner in this process: the Llama graph over a Backend, with weights in the backend's
// memory and a KvCache on the same device. KV management (room, usage, swap, sharing) is the
// cache's (KvCache's management calls; a cache that is not managed answers none of it).
class LocalModelRunner final : public ModelRunner {
 public:
  // `backend` (owned), `weights` (in its memory: Backend::UploadWeights), `cache` (owned,
  // on backend->device()). `reducer`: a tensor-parallel shard's all-reduce (null for a whole
  // model), borrowed.
  LocalModelRunner(const LlamaConfig& config, std::unique_ptr<Backend> backend,
                   std::shared_ptr<const LlamaWeights> weights, std::unique_ptr<KvCache> cache,
                   PartialSumReducer* reducer = nullptr);
  // The CPU reference (tests, tools): a CpuBackend over `pool` (may be null), rounding
  // activations as weights.activations says. `weights` and `pool` must outlive the runner.
  LocalModelRunner(const LlamaConfig& config, const LlamaWeights& weights, ThreadPool* pool,
                   std::unique_ptr<KvCache> cache, PartialSumReducer* reducer = nullptr);
  ~LocalModelRunner() override;

  int32_t vocab_size() const override { return forward_->config().vocab_size; }
  int32_t max_positions() const override { return forward_->config().context_length; }
  std::string device() const override { return backend_->device().name(); }
  absl::Status Forward(std::span<const BatchEntry> batch, std::vector<float>* logits) override;
  absl::Status ForwardArgMax(std::span<const BatchEntry> batch, std::vector<int32_t>* ids) override;
  absl::Status ForwardTopK(std::span<const BatchEntry> batch, int k, std::vector<int32_t>* ids,
                           std::vector<float>* values) override;
  absl::Status ForwardDrawn(std::span<const BatchEntry> batch,
                            std::span<const sample::DrawParams> draws,
                            std::vector<int32_t>* ids) override;
  int32_t Length(SeqId seq) const override { return cache_->Length(seq); }
  absl::Status Reserve(SeqId seq, int32_t count) override { return cache_->Reserve(seq, count); }
  absl::Status Truncate(SeqId seq, int32_t n) override { return cache_->Truncate(seq, n); }
  bool TreePasses() const override { return cache_->tree_passes(); }
  absl::Status KeepRows(SeqId seq, int32_t pos0, std::span<const int32_t> rows) override {
    return cache_->KeepRows(seq, pos0, rows);
  }
  void Free(SeqId seq) override { cache_->Free(seq); }
  int32_t PassBoundary() const override { return cache_->PassBoundary(); }
  std::optional<KvRoom> Room(int64_t tokens) const override;
  std::optional<KvMemory> Memory() const override;
  std::optional<std::array<int64_t, kKvClasses>> SequenceTokens(SeqId seq) const override;
  absl::Status SwapOut(SeqId seq) override { return cache_->SwapOut(seq); }
  absl::Status SwapIn(SeqId seq) override { return cache_->SwapIn(seq); }
  absl::Status Fork(SeqId src, SeqId dst) override { return cache_->Fork(src, dst); }
  int32_t MatchPrefix(SeqId seq, std::span<const int32_t> tokens) override {
    return cache_->MatchPrefix(seq, tokens);
  }
  void PublishPrefix(SeqId seq, std::span<const int32_t> tokens) override {
    cache_->PublishPrefix(seq, tokens);
  }
  absl::Status SetKvEventListener(KvCacheEventListener* listener) override {
    return cache_->SetEventListener(listener);
  }

  LlamaForward& forward() { return *forward_; }
  Backend& backend() { return *backend_; }
  KvCache& cache() { return *cache_; }
  const KvCache& cache() const { return *cache_; }

 private:
  std::unique_ptr<Backend> backend_;  // before forward_, which uses it
  std::unique_ptr<LlamaForward> forward_;
  std::unique_ptr<KvCache> cache_;
};

}  // namespace specnode
