#include "model/llama/cpu_kv_cache.h"

#include "model/cpu/thread_pool.h"

namespace specnode {

absl::Status CpuKvCache::BeginPass(std::span<const KvPassEntry> entries, ThreadPool* threads) {
  entries_.assign(entries.begin(), entries.end());
  first_.resize(entries_.size());
  int64_t row = 0;
  for (size_t i = 0; i < entries_.size(); ++i) {
    first_[i] = row;
    row += entries_[i].n;
  }
  threads_ = threads;
  return absl::OkStatus();
}

absl::Status CpuKvCache::Write(int layer, const float* k, const float* v) {
  const int64_t row = static_cast<int64_t>(n_kv_heads_) * head_dim_;
  // Entries are different sequences, which WriteSeq may take concurrently (rotation and
  // encoding per row are the work).
  auto write = [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end; ++i) {
      const KvPassEntry& e = entries_[i];
      WriteSeq(e.seq, layer, e.pos0, e.n, k + first_[i] * row, v + first_[i] * row);
    }
  };
  const int64_t n = static_cast<int64_t>(entries_.size());
  if (threads_ != nullptr && n > 1) {
    threads_->ParallelFor(n, 1, write);
  } else {
    write(0, n, 0);
  }
  return absl::OkStatus();
}

absl::Status CpuKvCache::Attend(int layer, const float* q, float scale, float* out) {
  const int64_t row = static_cast<int64_t>(n_kv_heads_) * group_ * head_dim_;
  const int64_t n_jobs = static_cast<int64_t>(entries_.size()) * n_kv_heads_;
  auto attend = [&](int64_t begin, int64_t end, int) {
    for (int64_t job = begin; job < end; ++job) {
      const size_t i = static_cast<size_t>(job / n_kv_heads_);
      const int kv_head = static_cast<int>(job % n_kv_heads_);
      const KvPassEntry& e = entries_[i];
      AttendSeq(e.seq, layer, e.pos0, e.n, kv_head, q + first_[i] * row, scale,
                out + first_[i] * row);
    }
  };
  if (threads_ != nullptr) {
    threads_->ParallelFor(n_jobs, 1, attend);
  } else {
    attend(0, n_jobs, 0);
  }
  return absl::OkStatus();
}

}  // namespace specnode
