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

void ForEachPassHead(ThreadPool* threads, int64_t n_seqs, int n_kv_heads,
                     const std::function<void(int64_t, int)>& fn) {
  auto run = [&](int64_t begin, int64_t end, int) {
    for (int64_t job = begin; job < end; ++job)
      fn(job / n_kv_heads, static_cast<int>(job % n_kv_heads));
  };
  const int64_t n_jobs = n_seqs * n_kv_heads;
  if (threads != nullptr) {
    threads->ParallelFor(n_jobs, 1, run);
  } else {
    run(0, n_jobs, 0);
  }
}

absl::Status CpuKvCache::BeginPass(std::span<const KvPassEntry> entries, ThreadPool* threads) {
  entries_.assign(entries.begin(), entries.end());
  first_ = FirstRows<KvPassEntry>(entries_);
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

absl::Status CpuKvCache::Attend(int layer, const float* q, float scale, float* out) {
  const int64_t row = static_cast<int64_t>(n_kv_heads_) * group_ * head_dim_;
  ForEachPassHead(threads_, static_cast<int64_t>(entries_.size()), n_kv_heads_,
                  [&](int64_t i, int kv_head) {
                    const KvPassEntry& e = entries_[i];
                    AttendSeq(e.seq, layer, e.pos0, e.n, kv_head, q + first_[i] * row, scale,
                              out + first_[i] * row);
                  });
  return absl::OkStatus();
}

}  // namespace specnode
