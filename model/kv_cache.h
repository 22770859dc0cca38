// The forward pass's only view of KV memory (the seam kvstore/ implements with paged,
// mixed-precision storage; DenseKvCache is the simple f32 reference).
//
// A sequence is identified by a caller-chosen SeqId. Its committed length n is the
// number of positions [0, n) whose K/V every layer holds. One forward step over tokens
// at positions [pos0, pos0 + n_new) with pos0 == Length(seq) does:
//   Reserve(seq, n_new)                       -- may fail: ResourceExhausted, nothing changed
//   for each layer: Write(...), then Attend(...) for those positions
//   Commit(seq, pos0 + n_new)
// Rollback of rejected speculative tokens is Truncate(seq, n).
//
// Thread-safety: Reserve/Commit/Truncate/Free are called from one thread between steps.
// Within a step, Write and Attend for different (seq, kv_head) pairs may run concurrently;
// Write for a (seq, layer) happens-before any Attend of that (seq, layer).
#pragma once

#include <cstdint>

#include "absl/status/status.h"

namespace specnode {

using SeqId = int64_t;

class KvCache {
 public:
  virtual ~KvCache() = default;

  // Committed length of seq; 0 for an unknown sequence.
  virtual int32_t Length(SeqId seq) const = 0;

  // Makes room for n_new positions after Length(seq) in every layer, creating the
  // sequence if new. ResourceExhausted (with nothing changed) when memory is short;
  // InvalidArgument beyond the cache's maximum sequence length.
  virtual absl::Status Reserve(SeqId seq, int32_t n_new) = 0;

  // Stores post-RoPE keys and values of one layer for positions [pos0, pos0 + n).
  // k, v: [n, n_kv_heads, head_dim] f32 (this shard's kv heads).
  virtual void Write(SeqId seq, int layer, int32_t pos0, int32_t n, const float* k,
                     const float* v) = 0;

  // Causal attention for one kv head and its group of query heads: query token i (at
  // position pos0 + i) attends to positions [0, pos0 + i].
  //   q:   [n, n_heads, head_dim]  (all query heads of the shard; only heads
  //        [kv_head * group, (kv_head + 1) * group) are read)
  //   out: [n, n_heads, head_dim]  (only that head range is written)
  // scale multiplies q·k before the softmax.
  virtual void Attend(SeqId seq, int layer, int32_t pos0, int32_t n, int kv_head,
                      const float* q, float scale, float* out) = 0;

  // Sets the committed length after a step (new_length <= reserved length).
  virtual void Commit(SeqId seq, int32_t new_length) = 0;

  // Drops positions [n, Length(seq)); InvalidArgument if n > Length(seq).
  virtual absl::Status Truncate(SeqId seq, int32_t n) = 0;

  // Forgets seq and releases its memory. Unknown ids are ignored.
  virtual void Free(SeqId seq) = 0;
};

}  // namespace specnode
