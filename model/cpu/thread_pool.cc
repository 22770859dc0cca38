#include "model/cpu/thread_pool.h"

#include <algorithm>
#include <chrono>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace specnode {
namespace {

// A decode step issues a job every few microseconds, so a worker that just finished one
// keeps polling this long before it sleeps: waking from a futex costs tens of
// microseconds, several times the job itself. After this budget the pool sleeps.
constexpr auto kSpinBudget = std::chrono::microseconds(2000);
// For the first part of any wait, poll with pause only (the next job or a worker's finish
// is normally microseconds away); after it, also yield the core each poll, so that with
// more threads than cores the thread we wait for gets to run.
constexpr auto kPauseOnly = std::chrono::microseconds(50);
// Clock reads are comparatively costly; look at it once per this many polls.
constexpr int kPollsPerClockRead = 64;

constexpr uint64_t kChunkMask = 0xFFFFFFFFu;

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

// Chunk `index` of `parts` over [0, n) in whole grains; the last grain may be partial.
void ChunkBounds(int64_t n, int64_t grain, int parts, int index, int64_t* begin, int64_t* end) {
  const int64_t units = (n + grain - 1) / grain;
  *begin = std::min(n, units * index / parts * grain);
  *end = std::min(n, units * (index + 1) / parts * grain);
}

// Polls `ready` until it returns true: pause first, then yield, as described above.
template <typename Ready>
void WaitUntil(Ready ready) {
  const auto start = std::chrono::steady_clock::now();
  bool yielding = false;
  for (int polls = 0; !ready(); ++polls) {
    if (yielding) {
      std::this_thread::yield();
    } else {
      CpuRelax();
      if (polls % kPollsPerClockRead == kPollsPerClockRead - 1) {
        yielding = std::chrono::steady_clock::now() - start > kPauseOnly;
      }
    }
  }
}

}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
  workers_.reserve(n_threads_ - 1);
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    // Under the mutex so a worker between its predicate check and its wait cannot miss it.
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true, std::memory_order_seq_cst);
  }
  cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

uint64_t ThreadPool::RunChunks() {
  for (;;) {
    // acq_rel: acquire makes the job fields of the claimed generation visible.
    const uint64_t s = state_.fetch_add(1, std::memory_order_acq_rel);
    const int chunk = static_cast<int>(s & kChunkMask);
    if (chunk >= n_threads_) return s >> 32;
    int64_t begin, end;
    ChunkBounds(job_n_, job_grain_, n_threads_, chunk, &begin, &end);
    if (begin < end) (*job_)(begin, end, chunk);
    // Release: the caller's acquire of done_ sees this chunk's writes. After the last
    // chunk is counted the job (and fn) may be gone.
    done_.fetch_add(1, std::memory_order_release);
  }
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             const std::function<void(int64_t, int64_t, int)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  if (n_threads_ == 1 || n <= grain) {
    // Nothing to share: skip the hand-off, keep the chunk numbering.
    for (int c = 0; c < n_threads_; ++c) {
      int64_t begin, end;
      ChunkBounds(n, grain, n_threads_, c, &begin, &end);
      if (begin < end) fn(begin, end, c);
    }
    return;
  }
  job_ = &fn;
  job_n_ = n;
  job_grain_ = grain;
  done_.store(0, std::memory_order_relaxed);
  // Publishes the job (release). seq_cst also orders it before the sleepers_ load below,
  // pairing with the worker's sleepers_ increment before its own re-check of state_. The
  // previous job is complete, so no claim on it can be lost by overwriting the counter.
  const uint64_t generation = (state_.load(std::memory_order_relaxed) >> 32) + 1;
  state_.store(generation << 32, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) {
    { std::lock_guard<std::mutex> lock(mu_); }
    cv_.notify_all();
  }
  RunChunks();
  WaitUntil([&] { return done_.load(std::memory_order_acquire) == n_threads_; });
  job_ = nullptr;
}

void ThreadPool::WorkerLoop() {
  uint64_t seen = 0;  // generation whose chunks this worker found exhausted
  auto has_new_job = [&] { return (state_.load(std::memory_order_acquire) >> 32) != seen; };
  for (;;) {
    // Spin for new work, pause then yield, up to the budget.
    const auto spin_start = std::chrono::steady_clock::now();
    bool have_job = false, yielding = false;
    for (int polls = 0;; ++polls) {
      if (has_new_job()) {
        have_job = true;
        break;
      }
      if (stop_.load(std::memory_order_relaxed)) return;
      if (yielding) {
        std::this_thread::yield();
      } else {
        CpuRelax();
      }
      if (yielding || polls % kPollsPerClockRead == kPollsPerClockRead - 1) {
        const auto spun = std::chrono::steady_clock::now() - spin_start;
        if (spun > kSpinBudget) break;
        yielding = spun > kPauseOnly;
      }
    }
    if (!have_job) {
      std::unique_lock<std::mutex> lock(mu_);
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      cv_.wait(lock, [&] {
        return (state_.load(std::memory_order_seq_cst) >> 32) != seen ||
               stop_.load(std::memory_order_seq_cst);
      });
      sleepers_.fetch_sub(1, std::memory_order_relaxed);
      if (stop_.load(std::memory_order_relaxed)) return;
    }
    seen = RunChunks();
  }
}

}  // namespace specnode
