// ModelRunner: the coordinator's view of one model instance (a draft, or a target that may
// later be split over tensor-parallel ranks): a batched forward pass over its own KV cache,
// plus the cache operations a speculative step needs (length, rollback, free).
//
// The speculative engine only talks to this interface, so a target whose shards live on
// other MPI ranks (tensor-parallel/) slots in without the engine changing.
//
// Not thread-safe: one caller drives a runner (the engine's step loop).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "model/kv_cache.h"
#include "model/llama_forward.h"

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

  virtual int32_t Length(SeqId seq) const = 0;
  // Drops cached positions [n, Length(seq)) (rollback of rejected drafts).
  virtual absl::Status Truncate(SeqId seq, int32_t n) = 0;
  virtual void Free(SeqId seq) = 0;
};

// A runner in this process: a LlamaForward over weights it does not own and a cache it owns.
// `weights` and `pool` must outlive the runner.
class LocalModelRunner final : public ModelRunner {
 public:
  LocalModelRunner(const LlamaConfig& config, const LlamaWeights& weights, ThreadPool* pool,
                   std::unique_ptr<KvCache> cache);

  int32_t vocab_size() const override { return forward_.config().vocab_size; }
  int32_t max_positions() const override { return forward_.config().context_length; }
  absl::Status Forward(std::span<const BatchEntry> batch, std::vector<float>* logits) override;
  int32_t Length(SeqId seq) const override { return cache_->Length(seq); }
  absl::Status Truncate(SeqId seq, int32_t n) override { return cache_->Truncate(seq, n); }
  void Free(SeqId seq) override { cache_->Free(seq); }

  LlamaForward& forward() { return forward_; }
  KvCache& cache() { return *cache_; }

 private:
  LlamaForward forward_;
  std::unique_ptr<KvCache> cache_;
};

}  // namespace specnode
