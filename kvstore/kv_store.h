// KvStore: the KV manager — the paged KV cache with a precision chosen per token, behind
// the model's KvCache seam (model/kv_cache.h), device-agnostic. It owns the block tables,
// reference counts, forks, the prefix cache, the precision policy and its demotion
// decisions, byte accounting and swap bookkeeping; the pages themselves, their encoding and
// attention over them belong to a page pool of the device (kv_page_pool.h: CpuPagePool on
// the CPU, CudaPagePool on a GPU). One manager, every device.
//
// Pages. Memory is handed out in pages of `page_tokens` token slots. A page has one
// precision class (kv_precision.h) and holds, for each slot, the K and V rows of every
// layer and kv head. A sequence maps each position to (page, slot) (its block table, at
// token granularity), so one sequence may hold pages of several classes: RoPE is applied
// before caching, so attention does not care where or in what order cached tokens are
// stored. (A pool that NeedsPageOrder() gets sequences whose token p is slot
// p % page_tokens of their (p / page_tokens)-th page: the manager refuses the operations
// that would break that order on it — forks, demotion, eviction.)
//
// Capacity is in bytes (pages of different classes cost different bytes, PageBytes of the
// pool) and is never exceeded: Reserve and SwapIn fail with ResourceExhausted and change
// nothing instead. Usage() accounts bytes per class.
//
// Policy (mode kMixed): new tokens are written at full precision. Once a sequence's
// committed length reaches a multiple of `demote_every` (B), the tokens older than the
// recent window counted back from there (positions < floor(L / B) * B - window_tokens),
// except the first `sink_tokens` (attention sinks), are demoted: to INT8 if critical — the
// attention mass
// they received, relative to a uniform share, averaged over the layers, heads and queries
// that observed them from at least window_tokens / 2 positions away (a token's weight
// while it is recent says little about whether later tokens will need it), is at least
// `critical_threshold` — to INT2 if cold (that mass below `cold_threshold`, when > 0) —
// else to INT4. Demotion moves a token to a page of the lower class
// (never rewrites a row in place), so pages shared with other sequences stay intact.
// Attention mass is observed by one query position in `mass_sample_every` (positions p
// with p % mass_sample_every == 0), in prefill, decode and verification passes alike (its
// cost is extra adds in the attention loop). Each observed query's contribution is staged
// until its position is committed (Truncate drops the rows of rolled-back drafts) and then
// added in position order, and demotion happens only at those length boundaries, which a
// caller keeps every pass of a sequence from straddling (PassBoundary): so what a query
// sees, and which tokens end in which class, depend only on the committed tokens — not on
// whether the sequence decoded one token per step, verified drafts, prefilled in chunks of
// any size, or had batch mates (greedy output is deterministic, and greedy speculation
// equals plain decoding, in mixed mode too). Demotion and eviction run in Settle: at the
// next Reserve, Truncate, SwapOut or Fork after a Commit.
// With a byte budget (`bytes_per_token` > 0) the classes of all demotable tokens are chosen
// at each boundary instead (kv_byte_budget.h: by mass, or by recency with budget_rank), so
// that the sequence's pages stay within budget x length until the next boundary; tokens
// demoted further are packed out of their old pages (Compact). Same determinism.
// Modes kFull / kInt8 / kInt4 / kInt2 store every token in that class from the start.
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
// Dropping a sequence for recompute is Free(); the caller prefills it again later. Both
// need a pool that SupportsSlotCopies(); otherwise Unimplemented, naming the device.
//
// Thread-safety: as KvCache. Management calls (Fork, Match/PublishPrefix, Swap*, Usage)
// run on the owning thread between passes.
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
#include "kvstore/kv_options.h"
#include "kvstore/kv_page_pool.h"
#include "kvstore/kv_precision.h"
#include "model/llama/kv_cache.h"

namespace specnode {

// The store's configuration: the user's options (parsed once, kv_options.h) and the model
// geometry the store is built for.
struct KvStoreConfig : KvOptions {
  int n_layers = 0;
  int n_kv_heads = 0;  // kv heads held here (a tensor-parallel shard's)
  int head_dim = 0;    // even, <= 256
  int gqa_group = 1;   // query heads per kv head
  int32_t max_seq_len = 0;
};

static_assert(kNumKvPrecisions == kKvClasses, "model/kv_cache.h counts the classes alike");

class KvStore : public KvCache {
 public:
  // InvalidArgument naming the field when the geometry cannot make a store (zero dims, odd
  // or too large head_dim, page_tokens outside [1, 4096], max_seq_len < 1): what Create
  // checks first, and what a pool's maker checks before building pages.
  static absl::Status CheckGeometry(const KvStoreConfig& config);
  // A store over `pool` (whose geometry must match the config's); a store over host pages:
  // MakeHostKvStore (kv_cache_factory.h). InvalidArgument naming the field for inconsistent
  // configs (CheckGeometry, capacity smaller than two pages, window < 1, mode dense, ...),
  // and naming the device when the pool cannot store what the mode needs (a
  // class, rotation, the slot copies of mixed mode or eviction).
  // kYes: the caller checked the options (KvOptions::Validate and CheckSupported with this
  // pool's caps) already — the runner factory, after CheckRunnerOptions — and only the
  // geometry and capacity are checked here.
  enum class OptionsChecked { kNo, kYes };
  static absl::StatusOr<std::unique_ptr<KvStore>> Create(
      const KvStoreConfig& config, std::unique_ptr<KvPagePool> pool,
      OptionsChecked checked = OptionsChecked::kNo);
  // Whether a pool with `caps` on `device` can hold a store with these options (what
  // Create checks of the pool), so a request can be refused before a model is loaded.
  static absl::Status CheckSupported(const KvOptions& options, const KvPoolCaps& caps,
                                     const Device& device);
  // kAuto resolved for a pool: mixed where the pool stores every class and copies slots,
  // full otherwise; other modes as they are.
  static KvMode ResolvedMode(KvMode mode, const KvPoolCaps& caps);
  ~KvStore() override;

  // KvCache.
  Device device() const override { return pool_->device(); }
  int32_t Length(SeqId seq) const override;
  absl::Status Reserve(SeqId seq, int32_t n_new) override;
  absl::Status BeginPass(std::span<const KvPassEntry> entries, ThreadPool* threads) override;
  absl::Status Write(int layer, const float* k, const float* v) override;
  absl::Status Attend(int layer, const float* q, float scale, int32_t window, float* out) override;
  uint64_t PassSignature() const override { return pool_->PassSignature(); }
  void Commit(SeqId seq, int32_t new_length) override;
  absl::Status Truncate(SeqId seq, int32_t n) override;
  void Free(SeqId seq) override;
  // Draft-tree passes where the pool takes tree rows (KvPoolCaps::tree_rows). A tree row's
  // mass observation is staged by its position (pos0 + depth) and its row; KeepRows copies
  // the kept path's slots into place (bit-exact slot copies), keeps those rows'
  // observations and drops the rest, so the sequence is as if the path had been decoded
  // alone (kvstore/kv_store_tree.cc).
  bool tree_passes() const override { return pool_->caps().tree_rows; }
  absl::Status KeepRows(SeqId seq, int32_t pos0, std::span<const int32_t> rows) override;
  // demote_every in mixed mode or with eviction, else 0 (no constraint).
  int32_t PassBoundary() const override;

  // dst (must not exist) shares all of src's committed tokens. src must not be swapped.
  // Unimplemented on a pool that NeedsPageOrder() when src ends inside a page.
  absl::Status Fork(SeqId src, SeqId dst) override;
  // For a new (empty) sequence: attaches cached pages covering the longest run of whole
  // blocks of `tokens` and returns the number of positions now cached (a multiple of
  // page_tokens, less than tokens.size() so the caller always computes the last token).
  int32_t MatchPrefix(SeqId seq, std::span<const int32_t> tokens) override;
  // Registers seq's whole leading blocks of full-precision tokens (tokens = its first
  // Length(seq) token ids) in the prefix cache.
  void PublishPrefix(SeqId seq, std::span<const int32_t> tokens) override;
  // Events: BlockStored for each run of blocks PublishPrefix adds (parent: the block before
  // the run), BlockRemoved for the blocks an eviction drops (EnsureBytes). Hashes are the
  // cache's own chained block hashes, top bit cleared (kv_cache_events.h).
  absl::Status SetEventListener(KvCacheEventListener* listener) override;

  absl::Status SwapOut(SeqId seq) override;
  absl::Status SwapIn(SeqId seq) override;
  bool IsSwapped(SeqId seq) const override;
  // Whether SwapOut / SwapIn work here (the pool copies slots to the host, and the host
  // tier has room).
  bool CanSwap() const override {
    return pool_->SupportsSlotCopies() && config_.host_capacity_bytes > 0;
  }

  bool managed() const override { return true; }
  // Bytes of the pages a new sequence of n tokens would need at most (admission checks):
  // in mixed mode, fed within PassBoundary, its f16 window and sinks plus the rest at INT8.
  int64_t BytesForTokens(int64_t n) const override;
  // Bytes that could be made available now (free + evictable prefix-cache pages).
  int64_t AvailableBytes() const override;
  KvUsage Usage() const override;
  // Live tokens per class of one sequence.
  std::array<int64_t, kKvClasses> SequenceTokens(SeqId seq) const override;
  // The class position `pos` of `seq` is stored in; nullopt for an unknown sequence or
  // position, an evicted position or a swapped-out sequence.
  std::optional<KvPrecision> PositionClass(SeqId seq, int32_t pos) const;
  const KvStoreConfig& config() const { return config_; }
  const KvPagePool& pool() const { return *pool_; }

 private:
  struct Page;
  struct Sequence;
  using Loc = KvSlot;

  KvStore(const KvStoreConfig& config, std::unique_ptr<KvPagePool> pool);
  size_t PageBytes(KvPrecision p) const { return page_bytes_[static_cast<int>(p)]; }

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
  // Moves position pos to a slot of class `target` if that is less precise than its own
  // (never up); stays where it is if no slot can be had.
  void Demote(Sequence& s, int32_t pos, KvPrecision target);
  // Mean observed attention mass of a position (relative to a uniform share) over kv heads;
  // *seen: whether any query observed it.
  float MeanMass(const Sequence& s, int32_t pos, bool* seen) const;
  // The thresholds' class for a token leaving the window (critical / cold / the rest).
  KvPrecision ThresholdClass(const Sequence& s, int32_t pos) const;
  // The byte budget at a demotion boundary: every position in [sinks, demote_to) to the
  // class ChooseClassesForBudget picks so that the rows fit bytes_per_token until the next
  // boundary. False (nothing changed) when they cannot, even all at int2.
  bool DemoteToBudget(Sequence& s, int32_t demote_to);
  // Moves s's tokens of class c below `upto` out of its private pages of that class that
  // hold dead slots (left by tokens demoted further) into fresh pages, byte for byte, so
  // those pages are freed; stops where no page can be had.
  void Compact(Sequence& s, KvPrecision c, int32_t upto);
  void Evict(Sequence& s, int32_t pos);
  // Positions below this are demoted (mixed) / evicted (evict on) once a sequence has
  // `length` committed positions: the window counted back from the last multiple of
  // demote_every, so it moves only at those boundaries (kv_options.h).
  int64_t DemoteLimit(int64_t length) const;
  int64_t EvictLimit(int64_t length) const;
  // Applies what the committed length implies: adds the staged observations of committed
  // queries to the sequence's mass, then demotes and evicts up to the limits. A function of
  // the committed tokens only, so calling it again, or earlier, changes nothing.
  void Settle(Sequence& s);
  int64_t PagesNeeded(const Sequence* s, KvPrecision p, int64_t n) const;
  Sequence& NewSequence(SeqId seq);
  // Ends the pool's pass if one is open (KvPagePool::EndPass: a device pool's observations
  // reach the rows); a device error is kept for TakePoolError, which the next call that
  // returns a status reports.
  void EndPoolPass();
  absl::Status TakePoolError();

  KvStoreConfig config_;
  std::unique_ptr<KvPagePool> pool_;
  const bool page_order_;  // pool_->NeedsPageOrder()
  std::array<size_t, kNumKvPrecisions> page_bytes_{};
  std::vector<std::unique_ptr<Page>> pages_;  // by page id; null = free id
  std::vector<int32_t> free_ids_;
  int64_t live_pages_ = 0;  // pages_ entries that are not null
  std::unordered_map<SeqId, std::unique_ptr<Sequence>> seqs_;
  std::array<int64_t, kNumKvPrecisions> class_bytes_{};
  int64_t used_bytes_ = 0;
  int64_t host_bytes_ = 0;
  int64_t pending_bytes_ = 0;  // Σ Sequence::pending_bytes
  int64_t evicted_tokens_ = 0;
  bool warned_evict_ = false;
  // The current pass, as handed to the pool (spans into the sequences' tables).
  std::vector<KvPoolPassSeq> pass_;
  std::vector<std::vector<KvMassRow>> pass_mass_;  // [entries][observed queries]
  bool pass_open_ = false;  // BeginPass reached the pool; its EndPass has not run
  absl::Status pool_error_;
  // Prefix cache: hash of token ids [0, (b + 1) * page_tokens) -> page, with LRU order.
  struct CacheEntry {
    int32_t page;
    std::vector<int32_t> tokens;  // the block's own ids, checked on match
    std::list<uint64_t>::iterator lru;
  };
  std::unordered_map<uint64_t, CacheEntry> prefix_cache_;
  KvCacheEventListener* listener_ = nullptr;  // borrowed; null: no events
  std::list<uint64_t> lru_;  // front = most recently used
};

}  // namespace specnode
