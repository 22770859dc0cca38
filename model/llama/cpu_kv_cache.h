// CpuKvCache: a KvCache whose pages live in host memory and whose attention runs per
// (sequence, kv head) on the CPU — the base of DenseKvCache and of kvstore/'s CPU store.
// It turns the pass-level calls of kv_cache.h into per-sequence ones, splitting a pass
// across the pass's host threads: Write by sequence (when the pass has several), Attend by
// (sequence, kv head) and, when those are few, row ranges of them. Which thread runs what
// never changes a result: each call writes only its own sequence's rows (Write) or its own
// (sequence, kv head, rows) outputs (Attend).
//
// Subclasses implement WriteSeq / AttendSeq (also callable directly, e.g. by tests and
// benchmarks); those run concurrently for different sequences (WriteSeq) or different
// (sequence, kv head) pairs or row ranges of one (AttendSeq: a query's output must not
// depend on which other queries share its call), and WriteSeq of a (seq, layer)
// happens-before AttendSeq of that (seq, layer).
#pragma once

#include <functional>
#include <span>
#include <string>
#include <vector>

#include "model/llama/kv_cache.h"

namespace specnode {

// How a pass of a CPU cache is split across host threads (null: the calling thread): by
// sequence for writes (only when the pass has several), by (sequence, kv head) for
// attention. Shared by every CPU cache (CpuKvCache, kvstore's CpuPagePool).
void ForEachPassSequence(ThreadPool* threads, int64_t n_seqs,
                         const std::function<void(int64_t)>& fn);
// fn(i, kv_head, begin, end): rows [begin, end) of sequence i (rows[i] of them), one kv
// head. A (sequence, kv head) is one job with all of its rows, except when the pass has
// fewer such pairs than twice the threads (one sequence verifying drafts or prefilling:
// 3 kv heads on 2 threads would run 2:1); then each pair's rows are cut into up to that
// many contiguous parts, so the threads get even shares.
void ForEachPassHead(ThreadPool* threads, std::span<const int32_t> rows, int n_kv_heads,
                     const std::function<void(int64_t, int, int32_t, int32_t)>& fn);
// The first row of each of the pass's sequences, given their row counts.
template <typename Seq>
std::vector<int64_t> FirstRows(std::span<const Seq> seqs) {
  std::vector<int64_t> first(seqs.size());
  int64_t row = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    first[i] = row;
    row += seqs[i].n;
  }
  return first;
}
// The row count of each of the pass's sequences (ForEachPassHead's `rows`).
template <typename Seq>
std::vector<int32_t> RowCounts(std::span<const Seq> seqs) {
  std::vector<int32_t> rows(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) rows[i] = seqs[i].n;
  return rows;
}

class CpuKvCache : public KvCache {
 public:
  // n_kv_heads: kv heads held (a shard's); gqa_group: query heads per kv head.
  CpuKvCache(int n_kv_heads, int head_dim, int gqa_group)
      : n_kv_heads_(n_kv_heads), head_dim_(head_dim), group_(gqa_group) {}

  Device device() const override { return Device::Cpu(); }
  absl::Status BeginPass(std::span<const KvPassEntry> entries, ThreadPool* threads) override;
  absl::Status Write(int layer, const float* k, const float* v) override;
  absl::Status Attend(int layer, const float* q, float scale, int32_t window, float* out) override;

  // Stores post-RoPE keys and values of one layer for positions [pos0, pos0 + n) of seq
  // (reserved). k, v: [n, n_kv_heads, head_dim] f32.
  virtual void WriteSeq(SeqId seq, int layer, int32_t pos0, int32_t n, const float* k,
                        const float* v) = 0;
  // Causal attention for one kv head and its group of query heads: query token i (at
  // position pos0 + i) attends to positions [0, pos0 + i], or with window > 0 to
  // [max(0, pos0 + i - window + 1), pos0 + i].
  //   q:   [n, n_heads, head_dim]  (only heads [kv_head * group, (kv_head + 1) * group) read)
  //   out: [n, n_heads, head_dim]  (only that head range is written)
  virtual void AttendSeq(SeqId seq, int layer, int32_t pos0, int32_t n, int kv_head, const float* q,
                         float scale, int32_t window, float* out) = 0;
  // One query (a draft-tree row) over the key slots `keys` (ascending: the cached context's
  // positions, then the slots of the row's path), in that order — the arithmetic AttendSeq
  // does for a query whose context is exactly those keys, so that a tree row gets what its
  // path decoded alone gets. q, out: [1, n_heads, head_dim] (the kv head's range).
  virtual void AttendSeqKeys(SeqId seq, int layer, int kv_head, const float* q, float scale,
                             std::span<const int32_t> keys, float* out) = 0;

  bool tree_passes() const override { return true; }

 private:
  const int n_kv_heads_, head_dim_, group_;
  std::vector<KvPassEntry> entries_;
  std::vector<int64_t> first_;  // the first row of each entry
  std::vector<int32_t> rows_;   // the row count of each entry
  ThreadPool* threads_ = nullptr;
};

}  // namespace specnode
