#include "model/llama/cpu_kv_cache.h"

#include "model/cpu/thread_pool.h"

namespace specnode {

void ForEachPassSequence(ThreadPool* threads, int64_t n_seqs,
                         const std::function<void(int64_t)>& fn) {
  auto run = [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end; ++i) fn(i);
  };
  if (threads != nullptr && n_seqs > 1) {
    threads->ParallelFor(n_seqs, 1, run);
  } else {
    run(0, n_seqs, 0);
  }
}

void ForEachPassHead(ThreadPool* threads, std::span<const int32_t> rows, int n_kv_heads,
                     const std::function<void(int64_t, int, int32_t, int32_t)>& fn) {
  const int64_t n_pairs = static_cast<int64_t>(rows.size()) * n_kv_heads;
  const int n_threads = threads != nullptr ? threads->n_threads() : 1;
  // Parts per (sequence, kv head): 1, or enough for two jobs per thread.
  const int64_t parts =
      n_pairs > 0 && n_pairs < 2 * n_threads ? (2 * n_threads + n_pairs - 1) / n_pairs : 1;
  auto run = [&](int64_t begin, int64_t end, int) {
    for (int64_t job = begin; job < end; ++job) {
      const int64_t pair = job / parts, part = job % parts;
      const int64_t i = pair / n_kv_heads;
      const int32_t n = rows[i];
      // Part `part` of `parts` near-equal shares of n rows (empty when n < parts).
      const auto lo = static_cast<int32_t>(n * part / parts);
      const auto hi = static_cast<int32_t>(n * (part + 1) / parts);
      if (lo < hi) fn(i, static_cast<int>(pair % n_kv_heads), lo, hi);
    }
  };
  const int64_t n_jobs = n_pairs * parts;
  if (threads != nullptr) {
    threads->ParallelFor(n_jobs, 1, run);
  } else {
    run(0, n_jobs, 0);
  }
}

absl::Status CpuKvCache::BeginPass(std::span<const KvPassEntry> entries, ThreadPool* threads) {
  entries_.assign(entries.begin(), entries.end());
  first_ = FirstRows<KvPassEntry>(entries_);
  rows_ = RowCounts<KvPassEntry>(entries_);
  threads_ = threads;
  return absl::OkStatus();
}

absl::Status CpuKvCache::Write(int layer, const float* k, const float* v) {
  const int64_t row = static_cast<int64_t>(n_kv_heads_) * head_dim_;
  // Entries are different sequences, which WriteSeq may take concurrently (rotation and
  // encoding per row are the work).
  ForEachPassSequence(threads_, static_cast<int64_t>(entries_.size()), [&](int64_t i) {
    const KvPassEntry& e = entries_[i];
    WriteSeq(e.seq, layer, e.pos0, e.n, k + first_[i] * row, v + first_[i] * row);
  });
  return absl::OkStatus();
}

absl::Status CpuKvCache::Attend(int layer, const float* q, float scale, int32_t window,
                                float* out) {
  const int64_t row = static_cast<int64_t>(n_kv_heads_) * group_ * head_dim_;
  ForEachPassHead(
      threads_, rows_, n_kv_heads_, [&](int64_t i, int kv_head, int32_t begin, int32_t end) {
        const KvPassEntry& e = entries_[i];
        if (e.parents.empty()) {
          AttendSeq(e.seq, layer, e.pos0 + begin, end - begin, kv_head,
                    q + (first_[i] + begin) * row, scale, window, out + (first_[i] + begin) * row);
          return;
        }
        std::vector<int32_t> path, keys;
        for (int32_t r = begin; r < end; ++r) {
          TreeRowPath(e.parents, r, &path);
          // The row's position is pos0 + depth; a window counts back from it.
          const int32_t position = e.pos0 + static_cast<int32_t>(path.size()) - 1;
          const int32_t lo = window > 0 ? std::max(0, position - window + 1) : 0;
          keys.clear();
          for (int32_t j = lo; j < e.pos0; ++j) keys.push_back(j);
          for (size_t d = 0; d < path.size(); ++d) {
            if (e.pos0 + static_cast<int32_t>(d) >= lo) keys.push_back(e.pos0 + path[d]);
          }
          AttendSeqKeys(e.seq, layer, kv_head, q + (first_[i] + r) * row, scale, keys,
                        out + (first_[i] + r) * row);
        }
      });
  return absl::OkStatus();
}

}  // namespace specnode
