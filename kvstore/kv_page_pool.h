// KvPagePool: where one device keeps KV pages and computes attention over them — the
// device half of the KV store. The KV manager (kv_store.h) decides everything else: which
// pages exist and in which precision class, which slot of which page holds which token of
// which sequence (block tables at token granularity), reference counts, forks, the prefix
// cache, demotions, byte accounting and swapping. A pool never makes such a decision; it
// stores bytes, encodes rows, runs attention and reports the attention mass the policy
// needs. CpuPagePool (cpu_page_pool.h) is the reference; cuda/cuda_page_pool.h the GPU's.
//
// Geometry (KvPoolGeometry): a page has page_tokens slots; a slot holds one token's K and V
// rows for every layer and kv head, encoded in the page's class (kv_precision.h). Page ids
// are the manager's: small integers below MaxPages(), allocated and released by it.
//
// Capabilities are asked, never assumed (KvPoolCaps): the classes it stores, whether rows
// are rotated, whether it copies slots (host-tier swap and demotion need that), whether it
// needs page order (it addresses a sequence's tokens by page list, not by slot: the manager
// keeps token p of a sequence in slot p % page_tokens of its (p / page_tokens)-th page, and
// refuses what would break that). A manager refuses, at creation and naming the device, a
// mode the pool cannot store (KvStore::CheckSupported); nothing is silently stored in
// another class. Each pool type also states its capabilities statically, so that a
// request can be refused before any weight is loaded.
//
// Thread-safety: the manager calls from one thread; a CPU pool may split a pass's Write /
// Attend across the host threads BeginPass names.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "kvstore/kv_precision.h"
#include "model/llama/device.h"
#include "model/llama/kv_cache.h"

namespace specnode {

class ThreadPool;

struct KvPoolGeometry {
  int n_layers = 0;
  int n_kv_heads = 0;  // kv heads held here (a tensor-parallel shard's)
  int head_dim = 0;
  int gqa_group = 1;  // query heads per kv head
  int page_tokens = 8;
};

// Where a token is stored: slot `slot` of page `page`; page -1 = evicted (no storage).
struct KvSlot {
  int32_t page = -1;
  int32_t slot = 0;
};

// The attention-mass observation of one sequence in a pass (the critical-token policy's
// input, kv_store.h). A query at position p (context n = p + 1) is observed when
// p % sample_every == 0 and n > min_distance; it then adds, for every cached position j in
// [lo, n - min_distance), weight(j) * n to its row's sum[kv_head][j - lo] (weight summed
// over the kv head's query heads) and the group size to cnt[kv_head][j - lo]. Each observed
// query has a row of its own (so the manager can drop the rows of queries that are rolled
// back), in the order of the pass's rows.
struct KvMassRow {
  int32_t pos = 0;  // the query's position
  int32_t lo = 0;   // first key position observed
  // [n_kv_heads, width] with width = pos + 1 - min_distance - lo: kv head h's keys at
  // sum + h * width.
  float* sum = nullptr;
  float* cnt = nullptr;
  int32_t row = -1;  // in a tree pass, the query's row (KvPoolPassSeq::parents); else -1
};
struct KvMassSink {
  bool on = false;
  int32_t sample_every = 1;
  int32_t min_distance = 0;
  std::span<const KvMassRow> rows;  // one per observed query of the entry, ascending pos
};

// One sequence's part of a pass: rows for positions [pos0, pos0 + n), its block table for
// positions [0, pos0 + n) and its mass observation.
struct KvPoolPassSeq {
  SeqId seq = 0;
  int32_t pos0 = 0;
  int32_t n = 0;
  std::span<const KvSlot> slots;
  KvMassSink mass;
  // A draft tree's parent rows ([n], KvPassEntry::parents), or empty for a chain: row r is
  // at position pos0 + depth(r) and sees positions [0, pos0) and its path's slots. Only
  // pools whose caps().tree_rows is set are given trees.
  std::span<const int32_t> parents = {};
};

struct KvPoolCaps {
  std::array<bool, kNumKvPrecisions> classes{};  // per KvPrecision: pages of it stored
  // K/V stored Hadamard-rotated (HadamardInPlace, kv_precision.h): an orthonormal change
  // of basis that attention undoes, which shrinks the quantised classes' error.
  bool rotated = false;
  bool slot_copies = false;  // Recode, ReadSlot, WriteSlot
  bool tree_rows = false;    // passes with draft-tree rows (KvPoolPassSeq::parents)
  bool page_order = false;
};

class KvPagePool {
 public:
  virtual ~KvPagePool() = default;

  virtual Device device() const = 0;
  virtual const KvPoolGeometry& geometry() const = 0;
  virtual KvPoolCaps caps() const = 0;
  bool Supports(KvPrecision p) const { return caps().classes[static_cast<int>(p)]; }
  bool rotated() const { return caps().rotated; }
  bool SupportsSlotCopies() const { return caps().slot_copies; }
  bool NeedsPageOrder() const { return caps().page_order; }

  // Memory one page of class p takes on the device (the manager's byte accounting), and
  // the host bytes of one slot (every layer) as ReadSlot / WriteSlot move them.
  virtual size_t PageBytes(KvPrecision p) const = 0;
  virtual size_t SlotBytes(KvPrecision p) const = 0;
  // Page ids must stay below this (a device pool's preallocated pages).
  virtual int64_t MaxPages() const = 0;

  // Gives page `id` storage of class p (contents unspecified until written), and takes it
  // back. ResourceExhausted when the device has no memory for it (nothing changes).
  virtual absl::Status AllocatePage(int32_t id, KvPrecision p) = 0;
  virtual void ReleasePage(int32_t id) = 0;
  // The class page `id` (allocated) was given.
  virtual KvPrecision PageClass(int32_t id) const = 0;

  // Demotion: re-encodes the rows of slot `from` (a full-precision page) into slot `to` (a
  // page of another class), every layer and kv head. Needs SupportsSlotCopies().
  virtual void Recode(KvSlot from, KvSlot to) = 0;
  // Swap tier: a slot's bytes (every layer, SlotBytes of its page's class) to and from
  // host memory, bit-exact. Need SupportsSlotCopies().
  virtual void ReadSlot(KvSlot s, uint8_t* host) const = 0;
  virtual void WriteSlot(KvSlot s, const uint8_t* host) = 0;
  // The same for many slots at once (a sequence's swap), their bytes back to back in
  // `slots` order: what the manager calls, so that a device pool moves a sequence in one
  // copy. The bytes are in (or taken from) `host` when the call returns. A device failure
  // is an error and leaves the pages as they were. Default: ReadSlot / WriteSlot per slot.
  virtual absl::Status ReadSlots(std::span<const KvSlot> slots, uint8_t* host);
  virtual absl::Status WriteSlots(std::span<const KvSlot> slots, const uint8_t* host);

  // A pass (kv_cache.h): BeginPass with every sequence's rows in row order (the spans stay
  // valid until the next BeginPass), then per layer Write and Attend over the pass's rows.
  virtual absl::Status BeginPass(std::span<const KvPoolPassSeq> seqs, ThreadPool* threads) = 0;
  // k, v: [n_rows, n_kv_heads, head_dim] f32 in device memory; each row is encoded into its
  // slot in the slot's page class.
  virtual absl::Status Write(int layer, const float* k, const float* v) = 0;
  // q, out: [n_rows, n_kv_heads * gqa_group, head_dim]; causal over each sequence's
  // stored positions (evicted ones skipped) — within the last `window` positions of each
  // query when window > 0 (KvCache::Attend) — observing mass where the sink says.
  virtual absl::Status Attend(int layer, const float* q, float scale, int32_t window,
                              float* out) = 0;
  // After the pass's last Attend, before the manager reads the mass rows (at the pass's
  // first Commit, or when the pass is dropped): a device pool brings the observations to
  // the host here. Errors are the device's (the manager reports them at its next call).
  virtual absl::Status EndPass() { return absl::OkStatus(); }
  // KvCache::PassSignature.
  virtual uint64_t PassSignature() const { return 0; }
};

}  // namespace specnode
