// KvStore: the paged KV cache with a precision chosen per token (kvstore/ behind the
// model's KvCache seam, model/kv_cache.h).
//
// Pages. Memory is handed out in pages of `page_tokens` token slots. A page has one
// precision class (kv_precision.h) and holds, for each slot, the K and V rows of every
// layer and kv head: data[layer][slot][kv_head][K row | V row]. A sequence maps each
// position to (page, slot) (its block table, at token granularity), so one sequence may
// hold pages of several classes: RoPE is applied before caching, so attention does not
// care where or in what order cached tokens are stored.
//
// Capacity is in bytes (pages of different classes cost different bytes) and is never
// exceeded: Reserve and SwapIn fail with ResourceExhausted and change nothing instead.
// Usage() accounts bytes per class.
//
// Policy (mode kMixed): new tokens are written at full precision. At Commit, tokens that
// fell out of the recent window (all but the last `window_tokens`), except the first
// `sink_tokens` (attention sinks), are demoted: to INT8 if critical — the attention mass
// they received, relative to a uniform share, averaged over the layers, heads and queries
// that observed them from at least window_tokens / 2 positions away (a token's weight
// while it is recent says little about whether later tokens will need it), is at least
// `critical_threshold` — else to INT4. Demotion moves a
// token to a page of the lower class (never rewrites a row in place), so pages shared
// with other sequences stay intact. Attention mass is observed by one query position in
// `mass_sample_every` (positions p with p % mass_sample_every == 0), in prefill, decode
// and verification passes alike (its cost is extra adds in the attention loop): the
// observed queries do not depend on how a sequence was stepped.
// Modes kFull / kInt8 / kInt4 store every token in that class from the start.
// Optional sliding-window eviction (off by default; lossy, logged once when on) drops
// tokens older than `evict_window` except the sinks.
//
// Sharing. Fork(src, dst) gives dst src's tokens by reference (pages are reference
// counted). Prefix caching: PublishPrefix registers the full-precision pages holding a
// sequence's first whole blocks under a hash of their token ids; MatchPrefix attaches the
// longest cached run of whole blocks to a new sequence. Cache-only pages are evicted
// (least recently used first) when a reservation needs their bytes.
//
// Preemption. SwapOut copies a sequence's rows (bit-exact bytes) to the host tier and
// releases its pages; SwapIn restores them (ResourceExhausted if they do not fit now).
// Dropping a sequence for recompute is Free(); the caller prefills it again later.
//
// Thread-safety: as KvCache. Management calls (Fork, Match/PublishPrefix, Swap*, Usage)
// run on the owning thread between steps.
#pragma once

#include <array>
#include <cstdint>
#include <list>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "kvstore/kv_precision.h"
#include "model/cpu_kv_cache.h"

namespace specnode {

namespace kv_kernels {
struct KvAttentionKernels;  // kv_attention_kernels.h (private)
}  // namespace kv_kernels

enum class KvMode : uint8_t { kFull, kInt8, kInt4, kMixed };
std::string_view KvModeName(KvMode m);  // "full", "int8", "int4", "mixed"
absl::StatusOr<KvMode> ParseKvMode(std::string_view name);

struct KvStoreConfig {
  int n_layers = 0;
  int n_kv_heads = 0;  // kv heads held here (a tensor-parallel shard's)
  int head_dim = 0;    // even, <= 256
  int gqa_group = 1;   // query heads per kv head
  int32_t max_seq_len = 0;
  int page_tokens = 8;
  int64_t capacity_bytes = 0;       // primary tier
  int64_t host_capacity_bytes = 0;  // swap tier
  KvMode mode = KvMode::kMixed;
  int sink_tokens = 4;
  int window_tokens = 64;
  float critical_threshold = 4.0f;
  int mass_sample_every = 4;
  bool evict = false;     // sliding-window eviction with sinks (lossy)
  int evict_window = 1024;
  // Store K and V rotated by an orthonormal Hadamard transform (head_dim a power of two;
  // ignored otherwise). See HadamardInPlace in kv_precision.h.
  bool rotate = true;
};

struct KvUsage {
  std::array<int64_t, kNumKvPrecisions> bytes{};   // primary-tier bytes in pages, per class
  std::array<int64_t, kNumKvPrecisions> tokens{};  // live token slots per class (all seqs)
  int64_t capacity_bytes = 0;
  int64_t used_bytes = 0;
  int64_t host_bytes = 0;
  int64_t pages = 0;
  int64_t cached_prefix_pages = 0;  // pages held by the prefix cache
  int64_t evicted_tokens = 0;       // dropped by sliding-window eviction (lossy)
};

class KvStore : public CpuKvCache {
 public:
  // InvalidArgument naming the field for inconsistent configs (zero dims, odd head_dim,
  // capacity smaller than one page, window < 1, ...).
  static absl::StatusOr<std::unique_ptr<KvStore>> Create(const KvStoreConfig& config);
  ~KvStore() override;

  // KvCache.
  int32_t Length(SeqId seq) const override;
  absl::Status Reserve(SeqId seq, int32_t n_new) override;
  void WriteSeq(SeqId seq, int layer, int32_t pos0, int32_t n, const float* k,
                const float* v) override;
  void AttendSeq(SeqId seq, int layer, int32_t pos0, int32_t n, int kv_head, const float* q,
                 float scale, float* out) override;
  void Commit(SeqId seq, int32_t new_length) override;
  absl::Status Truncate(SeqId seq, int32_t n) override;
  void Free(SeqId seq) override;

  // dst (must not exist) shares all of src's committed tokens. src must not be swapped.
  absl::Status Fork(SeqId src, SeqId dst);
  // For a new (empty) sequence: attaches cached pages covering the longest run of whole
  // blocks of `tokens` and returns the number of positions now cached (a multiple of
  // page_tokens, less than tokens.size() so the caller always computes the last token).
  int32_t MatchPrefix(SeqId seq, std::span<const int32_t> tokens);
  // Registers seq's whole leading blocks of full-precision tokens (tokens = its first
  // Length(seq) token ids) in the prefix cache.
  void PublishPrefix(SeqId seq, std::span<const int32_t> tokens);

  absl::Status SwapOut(SeqId seq);
  absl::Status SwapIn(SeqId seq);
  bool IsSwapped(SeqId seq) const;

  // Bytes of the pages a sequence of n more tokens would need at most (admission checks).
  int64_t BytesForTokens(int64_t n) const;
  // Bytes that could be made available now (free + evictable prefix-cache pages).
  int64_t AvailableBytes() const;
  KvUsage Usage() const;
  // Live tokens per class of one sequence.
  std::array<int64_t, kNumKvPrecisions> SequenceTokens(SeqId seq) const;
  const KvStoreConfig& config() const { return config_; }

 private:
  struct Page;
  struct Sequence;
  struct Loc {
    int32_t page = -1;  // -1: evicted
    int32_t slot = 0;
  };

  explicit KvStore(const KvStoreConfig& config);
  size_t PageBytes(KvPrecision p) const { return page_bytes_[static_cast<int>(p)]; }
  size_t SlotStride(KvPrecision p) const;  // bytes of one slot within one layer
  uint8_t* Row(int32_t page, int32_t slot, int layer, int kv_head, bool value);
  const uint8_t* Row(int32_t page, int32_t slot, int layer, int kv_head, bool value) const;

  KvPrecision WriteClass() const;
  absl::StatusOr<int32_t> AllocatePage(KvPrecision p);
  void Ref(int32_t page);
  void Unref(int32_t page);
  bool EnsureBytes(int64_t bytes);  // evicts cached prefixes if needed
  // Bytes neither in pages nor set aside for pending demotions.
  int64_t FreeBytes() const;
  // Sets s.pending_bytes, keeping pending_bytes_ (their sum over sequences) in step.
  void SetPendingBytes(Sequence& s, int64_t bytes);
  absl::StatusOr<Loc> TakeSlot(Sequence& s, KvPrecision p);
  void ReleaseLoc(Sequence& s, Loc loc);
  void Demote(Sequence& s, int32_t pos);
  void Evict(Sequence& s, int32_t pos);
  int64_t PagesNeeded(const Sequence* s, KvPrecision p, int64_t n) const;

  KvStoreConfig config_;
  std::array<size_t, kNumKvPrecisions> page_bytes_{};
  std::array<size_t, kNumKvPrecisions> row_bytes_{};
  std::vector<std::unique_ptr<Page>> pages_;  // by page id; null = free id
  std::vector<int32_t> free_ids_;
  std::unordered_map<SeqId, std::unique_ptr<Sequence>> seqs_;
  std::array<int64_t, kNumKvPrecisions> class_bytes_{};
  int64_t used_bytes_ = 0;
  int64_t host_bytes_ = 0;
  int64_t pending_bytes_ = 0;  // Σ Sequence::pending_bytes
  int64_t evicted_tokens_ = 0;
  bool warned_evict_ = false;
  bool rotate_ = false;
  const kv_kernels::KvAttentionKernels* kernels_;  // static tables, chosen at construction
  // Prefix cache: hash of token ids [0, (b + 1) * page_tokens) -> page, with LRU order.
  struct CacheEntry {
    int32_t page;
    std::vector<int32_t> tokens;  // the block's own ids, checked on match
    std::list<uint64_t>::iterator lru;
  };
  std::unordered_map<uint64_t, CacheEntry> prefix_cache_;
  std::list<uint64_t> lru_;  // front = most recently used
};

}  // namespace specnode
