// CpuPagePool: the KV store's pages in host memory and attention over them on the CPU —
// the reference KvPagePool (kv_page_pool.h), every precision class.
//
// Page layout: data[layer][slot][kv_head][K row | V row], rows in the page's class's formats
// (kv_precision.h, KvRowFormat); a slot of one layer is SlotStride(p) = n_kv_heads *
// KvPairBytes(p).
// Rows are stored Hadamard-rotated when `rotate` and head_dim is a power of two (queries
// are rotated alike, outputs rotated back).
//
// Attention (kv_attention_kernels.h): a sequence's query tokens attend in blocks of up to
// 16 (a verification's K + 1 rows, a prefill chunk's), class by class — the cached
// positions grouped by precision class (in position order within a class), each group
// scored and accumulated in its stored format for all of the block's heads at once, so a
// cached row is read once per block, not once per token; each token skips the rows past
// its own position and has one softmax over all of its rows. Which positions a token sees,
// and so the groups, depends only on the block table and its own position, and every
// number it gets is computed as if it were alone, so the result does not depend on the
// batch, the block, the threads or the other queries of the pass. A pass is split across
// the host threads by sequence (Write) and by (sequence, kv head), cut into row ranges when
// there are few of those (Attend; ForEachPassHead).
//
// Thread-safety: as KvPagePool; WriteSeq / AttendSeq for different (sequence, kv head)
// pairs, or different rows of one, may run concurrently.
#pragma once

#include <array>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "kvstore/kv_page_pool.h"

namespace specnode {

namespace kv_kernels {
struct KvAttentionKernels;  // kv_attention_kernels.h (private)
}  // namespace kv_kernels

class CpuPagePool final : public KvPagePool {
 public:
  // head_dim even and <= 256 (the store checks the geometry first).
  CpuPagePool(const KvPoolGeometry& geometry, bool rotate);
  ~CpuPagePool() override;

  // What a CPU pool of this head_dim stores: every class, rotated when asked (unset: yes)
  // and head_dim is a power of two.
  static KvPoolCaps Caps(int head_dim, std::optional<bool> rotate);

  Device device() const override { return Device::Cpu(); }
  const KvPoolGeometry& geometry() const override { return g_; }
  KvPoolCaps caps() const override;
  size_t PageBytes(KvPrecision p) const override;
  size_t SlotBytes(KvPrecision p) const override;
  int64_t MaxPages() const override { return int64_t{0x7fffffff}; }
  absl::Status AllocatePage(int32_t id, KvPrecision p) override;
  void ReleasePage(int32_t id) override;
  KvPrecision PageClass(int32_t id) const override { return pages_[id]->prec; }
  void Recode(KvSlot from, KvSlot to) override;
  void ReadSlot(KvSlot s, uint8_t* host) const override;
  void WriteSlot(KvSlot s, const uint8_t* host) override;
  absl::Status BeginPass(std::span<const KvPoolPassSeq> seqs, ThreadPool* threads) override;
  absl::Status Write(int layer, const float* k, const float* v) override;
  absl::Status Attend(int layer, const float* q, float scale, int32_t window, float* out) override;

  // One sequence of the pass: rows [pos0, pos0 + n) of it, k / v: [n, n_kv_heads, head_dim].
  void WriteSeq(const KvPoolPassSeq& s, int layer, const float* k, const float* v);
  // One kv head of one sequence: q / out [n, n_heads, head_dim], heads of kv_head's group;
  // s.mass.rows holds the observed rows of these n queries only. window > 0: each query
  // sees its last `window` positions only (KvCache::Attend).
  void AttendSeq(const KvPoolPassSeq& s, int layer, int kv_head, const float* q, float scale,
                 int32_t window, float* out);

 private:
  // AttendSeq over the stored positions [lo, pos0 + n) only: every query of `s` must see
  // all of them within its own prefix (lo = 0, or one query whose window starts at lo).
  // With a `path` (one query, s.n == 1, at position s.pos0 = base + path.size() - 1): the
  // positions [lo, base) and then path[d]'s slot (base + path[d]) as position base + d —
  // a draft-tree row seeing what its path decoded alone sees.
  void AttendFrom(const KvPoolPassSeq& s, int layer, int kv_head, const float* q, float scale,
                  int32_t lo, float* out, std::span<const int32_t> path = {});
  // Row r of a tree sequence (s.parents non-empty), one kv head; q / out: the row's.
  void AttendTreeRow(const KvPoolPassSeq& s, int32_t r, int layer, int kv_head, const float* q,
                     float scale, int32_t window, float* out);

  struct Page {
    KvPrecision prec = KvPrecision::kFull;
    std::vector<uint8_t> data;
  };
  size_t SlotStride(KvPrecision p) const;  // bytes of one slot within one layer
  uint8_t* Row(KvSlot s, int layer, int kv_head, bool value);
  const uint8_t* Row(KvSlot s, int layer, int kv_head, bool value) const;

  KvPoolGeometry g_;
  bool rotate_;
  std::array<size_t, kNumKvPrecisions> key_bytes_{};   // a K row of each class
  std::array<size_t, kNumKvPrecisions> pair_bytes_{};  // a kv head's K and V rows
  std::vector<std::unique_ptr<Page>> pages_;       // by page id; null = not allocated
  const kv_kernels::KvAttentionKernels* kernels_;  // static tables, chosen at construction
  std::vector<KvPoolPassSeq> pass_;
  std::vector<int64_t> first_;  // the pass's first row of each sequence
  std::vector<int32_t> rows_;   // the pass's row count of each sequence
  ThreadPool* threads_ = nullptr;
};

}  // namespace specnode
