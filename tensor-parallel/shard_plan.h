// How a Llama model is split across the T ranks of a tensor-parallel group (Megatron
// style, the same slicing LoadLlamaWeights applies for ShardSpec{rank, T}: HeadsOfShard in
// model/llama/llama_weights.h):
//
//   Q, K, V      column-parallel: rank r owns query heads heads(r) and kv heads kv_heads(r)
//                (whole heads; each rank's query heads use only its own kv heads, since
//                heads [g*k, g*(k+1)) belong to kv head k)
//   gate, up     column-parallel: ffn units ffn(r)
//   O, down      row-parallel over the same head / unit ranges; the [n_tokens, d_model]
//                partial sums are all-reduced (2 AllReduceSum per layer)
//   norms, token embedding, output head: replicated (every rank computes full logits)
//
// Rules (Create returns InvalidArgument naming the model's numbers and the valid sizes):
//   - tp_size >= 1, dividing n_heads and d_ff.
//   - tp_size divides n_kv_heads, or is a multiple of it: KV-head replication (as vLLM
//     does). Then each kv head is computed and cached on tp_size / n_kv_heads ranks alike
//     (kv_replicas()), each of them with a 1 / tp_size share of the query heads that use it:
//     K/V compute and KV memory are duplicated on the replicas, the rest is split T ways.
//     It is what lets TP 16 run a model with 8 KV heads; at TP <= n_kv_heads each kv head
//     has one owner, whose store keeps exactly the KV pages of its heads (DESIGN.md).
//   - every column slice of O (q_dim / T values) and down (d_ff / T) starts on a 32-value
//     quantisation block boundary. 32 is the block of every quantised type specnode reads
//     (Q4_0, Q4_1, Q8_0); the rule is applied regardless of the file's storage types so a
//     plan valid for one quantisation of a model is valid for all.
//   SmolLM2-135M (9 heads / 3 kv heads, head_dim 64, d_ff 1536): TP 1 and 3 are valid;
//   2 -> "tensor parallelism 2 does not divide SmolLM2's 3 KV heads; use 1 or 3".
//   Llama-3-8B (32 heads / 8 kv heads, d_ff 14336): 1, 2, 4, 8 and, replicating, 16 and 32.
//
// Immutable value type; thread-compatible.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/llama/llama_config.h"
#include "model/llama/llama_weights.h"

namespace specnode {

class GgufFile;

// Half-open range [begin, end).
struct ShardRange {
  int begin = 0;
  int end = 0;
  int count() const { return end - begin; }
};

struct RankShard {
  int rank = 0;
  ShardRange heads;     // query heads
  ShardRange kv_heads;  // kv heads (the KV cache of this rank holds only these; under
                        // replication the same one on kv_replicas() ranks)
  ShardRange ffn;       // feed-forward units (rows of gate/up, columns of down)
  ShardRange q_cols;    // columns of O: heads * head_dim
  // Bytes of weights this rank reads, filled by ForFile (0 from Create): its slices of the
  // sharded matrices, plus the replicated tensors (norms, embedding, head).
  int64_t sharded_bytes = 0;
  int64_t replicated_bytes = 0;
  int64_t weight_bytes() const { return sharded_bytes + replicated_bytes; }
};

class ShardPlan {
 public:
  static constexpr int kColumnBlock = 32;  // values per quantisation block (see rules)

  static absl::StatusOr<ShardPlan> Create(const LlamaConfig& config, int tp_size);
  // Create + per-rank weight bytes from the file's tensor types and shapes (metadata only;
  // no weight page is read). InvalidArgument names a missing tensor.
  static absl::StatusOr<ShardPlan> ForFile(const GgufFile& file, const LlamaConfig& config,
                                           int tp_size);
  // The sizes Create accepts for `config`, ascending (always contains 1).
  static std::vector<int> ValidSizes(const LlamaConfig& config);

  int size() const { return static_cast<int>(ranks_.size()); }
  // Ranks holding each kv head: 1, or size() / n_kv_heads under KV-head replication.
  int kv_replicas() const { return kv_replicas_; }
  const LlamaConfig& config() const { return config_; }
  const RankShard& rank(int r) const { return ranks_[r]; }  // 0 <= r < size()
  // What LoadLlamaWeights / LoadOptions::shard take for rank r.
  ShardSpec Spec(int r) const { return ShardSpec{r, size()}; }
  // Bytes one AllReduceSum exchange moves per token per layer: 2 reductions of d_model
  // floats (O and down).
  int64_t AllReduceFloatsPerTokenPerLayer() const { return 2LL * config_.d_model; }
  // "TP 3 over llama 30L d576 h9/3 ff1536: per rank 3 heads, 1 kv head, 512 ffn units".
  std::string Summary() const;

 private:
  LlamaConfig config_;
  std::vector<RankShard> ranks_;
  int kv_replicas_ = 1;
};

}  // namespace specnode
