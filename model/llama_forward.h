// The Llama forward pass on CPU over a batch of sequences, each contributing one or more
// new tokens (prefill chunks, single decode tokens, or a last token + K speculative drafts).
//
// All tokens of the batch share every matmul (weights are read once per step); Q/K/V and
// gate/up, which read the same normed input, run as one MatMulShared each (one activation
// quantisation, one thread-pool dispatch). Attention runs per (sequence, kv head) against
// the KvCache. Rows are batch-invariant: a token's
// logits do not depend on what else is in the batch (see cpu_matmul.h), so verifying K
// drafts in one pass gives bit-identical logits to decoding them one at a time.
//
// Not thread-safe: one Forward() at a time per LlamaForward (it owns scratch buffers and
// uses the ThreadPool). The weights and pool must outlive it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/cpu_matmul.h"
#include "model/kv_cache.h"
#include "model/llama_config.h"
#include "model/llama_weights.h"
#include "model/thread_pool.h"

namespace specnode {

// New tokens of one sequence in a batch. They take positions [cache.Length(seq), +n).
struct BatchEntry {
  SeqId seq = 0;
  std::span<const int32_t> tokens;
  bool all_logits = false;  // logits for every token (verification) or only the last
};

// Checks a batch before anything runs: every entry has tokens, every id is in
// [0, vocab_size), no sequence appears twice. Returns the total token count.
absl::StatusOr<int64_t> ValidateBatch(std::span<const BatchEntry> batch, int32_t vocab_size);

// The batch rows whose logits a pass returns, in order: every token of an all_logits
// entry, else the entry's last token (rows numbered over the whole batch).
std::vector<int64_t> LogitRows(std::span<const BatchEntry> batch);

// Hook for tensor parallelism: sums partial [n, d_model] activations across shards after
// the row-parallel O and down projections. Null for a single shard.
class PartialSumReducer {
 public:
  virtual ~PartialSumReducer() = default;
  virtual absl::Status AllReduceSum(float* data, int64_t count) = 0;
};

class LlamaForward {
 public:
  LlamaForward(const LlamaConfig& config, const LlamaWeights& weights, ThreadPool* pool,
               PartialSumReducer* reducer = nullptr);

  // Runs the batch and fills `logits` with [n_rows, vocab] rows: for each entry in order,
  // every token's row when all_logits, else the last token's. Checks token ids and that the
  // cache can take the tokens (Reserve) before computing anything; on error nothing in the
  // cache changes. `logits` may be null: the final norm and head are skipped (a
  // tensor-parallel shard whose logits nobody reads; the cache is updated as usual).
  absl::Status Forward(std::span<const BatchEntry> batch, KvCache* cache,
                       std::vector<float>* logits);

  const LlamaConfig& config() const { return config_; }

 private:
  void Layer(int l, std::span<const BatchEntry> batch, const std::vector<int32_t>& pos0,
             KvCache* cache);

  LlamaConfig config_;
  const LlamaWeights& w_;
  ThreadPool* pool_;
  PartialSumReducer* reducer_;
  MatMulScratch scratch_;
  // Per-step activations, [n_tokens, ...].
  std::vector<float> x_, h_, q_, k_, v_, attn_, gate_, up_;
  std::vector<int32_t> positions_;
  std::vector<float> rope_table_;  // [n_tokens, rope_dim] (cos, sin) pairs (cpu_ops.h)
  absl::Status reduce_status_;
};

}  // namespace specnode
