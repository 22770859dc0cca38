// The forward pass's only view of KV memory: the seam kvstore/ implements with its KV
// manager over a page pool per device (kvstore/kv_store.h); DenseKvCache is the simple f32
// reference on the CPU.
//
// A sequence is identified by a caller-chosen SeqId. Its committed length n is the number
// of positions [0, n) whose K/V every layer holds. One forward pass over a batch of
// sequences, entry i adding tokens at positions [pos0_i, pos0_i + n_i) with
// pos0_i == Length(seq_i), does:
//   Reserve(seq_i, n_i) for each entry          -- may fail: ResourceExhausted, nothing changed
//   BeginPass(entries)                          -- rows numbered over the entries in order
//   for each layer: Write(layer, k, v), then Attend(layer, q, scale, window, out)
//   Commit(seq_i, pos0_i + n_i) for each entry
// Rollback of rejected speculative tokens is Truncate(seq, n).
//
// Memory: k, v, q and out are the memory of the device the cache lives on (device()): host
// memory for "cpu", device memory for "cuda:N". A cache is used only with a Backend of the
// same device (the graph checks).
//
// Thread-safety: every call comes from the thread driving the forward pass. A CPU cache may
// split Write / Attend across the pass's host threads (BeginPass).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "model/llama/device.h"
#include "model/llama/kv_cache_events.h"

namespace specnode {

class ThreadPool;

using SeqId = int64_t;

// One sequence's rows of a pass: n new tokens in slots [pos0, pos0 + n).
// A chain (parents empty): row r is position pos0 + r and attends to positions [0, pos0 + r].
// A tree (parents = [n] parent rows, parents[r] in [-1, r), -1 = the cached context): row r
// is position pos0 + depth(r) (depth 0 for a child of the context) and attends to positions
// [0, pos0) and to the rows on its path (its ancestors and itself), each at its depth's
// position — exactly what it would see had its path been decoded alone (draft trees,
// coordinator/draft_tree.h). KeepRows then keeps one path. Only caches whose tree_passes()
// is true take tree entries.
struct KvPassEntry {
  SeqId seq = 0;
  int32_t pos0 = 0;
  int32_t n = 0;
  std::span<const int32_t> parents = {};  // [n] or empty; valid until the pass's last Attend
};

// The rows a tree row attends to within its pass, by depth (its root-most ancestor first,
// the row itself last): path[d] is the row at position pos0 + d. Appends to *path (cleared).
void TreeRowPath(std::span<const int32_t> parents, int32_t row, std::vector<int32_t>* path);
// depth[r]: 0 for a child of the context (parents[r] == -1), depth[parents[r]] + 1 else.
std::vector<int32_t> TreeRowDepths(std::span<const int32_t> parents);

// KeepRows' argument check, for its implementations: rows strictly ascending, rows[j] >= j,
// all below length - pos0, and 0 <= pos0 <= length. InvalidArgument naming the bad row.
absl::Status CheckKeptRows(int32_t pos0, int32_t length, std::span<const int32_t> rows);

// Precision classes a managed cache accounts for, in kvstore/kv_precision.h's order: f16,
// int8, int4, int2.
inline constexpr int kKvClasses = 4;

// What a managed cache holds (kvstore/kv_store.h), for admission and metrics.
struct KvUsage {
  std::array<int64_t, kKvClasses> bytes{};   // primary-tier bytes in pages, per class
  std::array<int64_t, kKvClasses> tokens{};  // live token slots per class (all sequences)
  int64_t capacity_bytes = 0;
  int64_t used_bytes = 0;
  int64_t host_bytes = 0;  // swap tier
  int64_t pages = 0;
  int64_t cached_prefix_pages = 0;  // pages held by the prefix cache
  // Bytes (in used_bytes) of cached pages no sequence uses: evicted when a reservation
  // needs them, so an idle node's used_bytes is this.
  int64_t cache_only_bytes = 0;
  int64_t evicted_tokens = 0;       // dropped by sliding-window eviction (lossy)
};

class KvCache {
 public:
  virtual ~KvCache() = default;

  // "cpu" or "cuda:N": where the pages (and the pass's k / v / q / out) live.
  virtual Device device() const = 0;

  // Committed length of seq; 0 for an unknown sequence.
  virtual int32_t Length(SeqId seq) const = 0;

  // Makes room for n_new positions after Length(seq) in every layer, creating the
  // sequence if new. ResourceExhausted (with nothing changed) when memory is short;
  // InvalidArgument beyond the cache's maximum sequence length. (The paged store first
  // settles the sequence's previous commit — the demotions it implies — and keeps that
  // when the reservation then fails: it depends on committed tokens only.)
  virtual absl::Status Reserve(SeqId seq, int32_t n_new) = 0;

  // Starts a pass over `entries` (each reserved; no sequence twice). Row r of the pass's
  // tensors belongs to the entry whose rows [sum of earlier n, + n) contain r. `threads`:
  // host threads the cache may split the pass's work across (null: the calling thread).
  // The entries are copied; errors (a device failing to stage its tables) end the pass.
  virtual absl::Status BeginPass(std::span<const KvPassEntry> entries, ThreadPool* threads) = 0;

  // Stores post-RoPE keys and values of one layer for every row of the pass.
  // k, v: [n_rows, n_kv_heads, head_dim] f32 (this shard's kv heads).
  virtual absl::Status Write(int layer, const float* k, const float* v) = 0;

  // Causal attention of every row of the pass: the row at position p of sequence s attends
  // to positions [0, p] of s — or, with window > 0 (a sliding-window layer: Mistral,
  // Gemma 3's local layers), to [max(0, p - window + 1), p] — each kv head with its group
  // of query heads. A cache without windowed attention refuses window > 0 (Unimplemented).
  //   q:   [n_rows, n_heads, head_dim]  (this shard's query heads)
  //   out: [n_rows, n_heads, head_dim]
  // scale multiplies q·k before the softmax. Every layer's Write precedes its Attend.
  virtual absl::Status Attend(int layer, const float* q, float scale, int32_t window,
                              float* out) = 0;

  // For passes a backend records and replays (Backend::Record): a value that changes
  // whenever this cache's Write / Attend for a pass of the same rows would use different
  // device addresses or strides. 0 for a cache whose calls are not recorded (the CPU's).
  virtual uint64_t PassSignature() const { return 0; }

  // Sets the committed length after a step (new_length <= reserved length).
  virtual void Commit(SeqId seq, int32_t new_length) = 0;

  // Drops positions [n, Length(seq)) and any reservation beyond; InvalidArgument if
  // n > Length(seq).
  virtual absl::Status Truncate(SeqId seq, int32_t n) = 0;

  // Tree passes (KvPassEntry::parents): whether this cache takes them, and the step that
  // follows one. After a committed pass wrote rows at slots [pos0, Length(seq)), KeepRows
  // keeps rows `rows` (offsets from pos0, strictly ascending, rows[j] >= j: a path of the
  // tree, whose row rows[j] is at position pos0 + j) at positions [pos0, pos0 + rows.size())
  // and drops every other row and any reservation beyond: Length becomes pos0 + rows.size(),
  // and the cache is as if that path had been decoded alone. InvalidArgument for rows that
  // are not such a list; Unimplemented where tree_passes() is false.
  virtual bool tree_passes() const { return false; }
  virtual absl::Status KeepRows(SeqId seq, int32_t pos0, std::span<const int32_t> rows);

  // Forgets seq and releases its memory. Unknown ids are ignored.
  virtual void Free(SeqId seq) = 0;

  // B > 0: a pass must not hold rows of one sequence at positions on both sides of a
  // multiple of B (rows [pos0, pos0 + n) need pos0 / B == (pos0 + n - 1) / B), or what its
  // queries see depends on how the sequence was stepped (the paged store's mixed mode,
  // kvstore/kv_store.h). The cache still runs such a pass; only determinism is lost.
  // 0: no constraint.
  virtual int32_t PassBoundary() const { return 0; }

  // Management, between passes. A managed cache (the paged store, kvstore/kv_store.h)
  // accounts bytes and tokens per precision class and answers the calls below; the others
  // (the dense reference) keep the defaults: managed() false, empty usage, and
  // Unimplemented, naming why, for what they cannot do.
  virtual bool managed() const { return false; }
  // Bytes and tokens held.
  virtual KvUsage Usage() const { return {}; }
  // Live tokens per class of one sequence.
  virtual std::array<int64_t, kKvClasses> SequenceTokens(SeqId seq) const { return {}; }
  // Admission: bytes the pages of n more tokens of a new sequence may take, and bytes that
  // could be made available now (0 when not managed).
  virtual int64_t BytesForTokens(int64_t n) const { return 0; }
  virtual int64_t AvailableBytes() const { return 0; }
  // Preemption keeping the KV: SwapOut moves a sequence's rows to the host tier and frees
  // its pages; SwapIn brings them back (ResourceExhausted when they do not fit now, nothing
  // changed). CanSwap says whether this cache has a host tier it can use.
  virtual bool CanSwap() const { return false; }
  virtual absl::Status SwapOut(SeqId seq);
  virtual absl::Status SwapIn(SeqId seq);
  virtual bool IsSwapped(SeqId seq) const { return false; }
  // Sharing: dst (new) shares src's committed tokens; the prefix cache attaches the longest
  // cached run of whole blocks of `tokens` to a new sequence (returning the positions now
  // cached) and publishes a sequence's leading blocks.
  virtual absl::Status Fork(SeqId src, SeqId dst);
  virtual int32_t MatchPrefix(SeqId seq, std::span<const int32_t> tokens) { return 0; }
  virtual void PublishPrefix(SeqId seq, std::span<const int32_t> tokens) {}
  // The prefix cache's events (kv_cache_events.h: blocks stored, removed) go to `listener`
  // from now on (borrowed, must outlive the cache or be reset to null first; called on the
  // thread driving the cache). Unimplemented for a cache without a prefix cache.
  virtual absl::Status SetEventListener(KvCacheEventListener* listener);
};

}  // namespace specnode
