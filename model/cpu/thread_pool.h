// A fixed pool of worker threads for data-parallel loops inside one forward pass.
//
// ParallelFor splits [0, n) into n_threads contiguous chunks and returns when all are done.
// Each chunk is run by whichever thread claims it first, the caller included: a worker that
// is slow to wake (a busy machine, more threads than cores) costs at most the chunks it
// already claimed, never a wait for it to be scheduled. Workers spin briefly after a job
// (decode issues hundreds of small jobs per token), then sleep on a condition variable, so
// an idle pool costs no CPU. One job at a time: ParallelFor is not reentrant and must be
// called from one thread at a time.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace specnode {

class ThreadPool {
 public:
  // n_threads >= 1 counts the calling thread; n_threads - 1 workers are started.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int n_threads() const { return n_threads_; }

  // fn(begin, end, chunk) is called once for each non-empty chunk of [0, n). `chunk` in
  // [0, n_threads) depends only on (n, grain, n_threads), never on which thread runs it, and
  // no two concurrent calls share it: use it to pick per-chunk scratch or partial results.
  // Chunks are aligned to `grain` (except the last) so SIMD kernels get whole tiles.
  void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t, int)>& fn);

 private:
  void WorkerLoop();
  // Claims and runs chunks of the current job until none is left; returns the generation
  // in which it found none.
  uint64_t RunChunks();

  int n_threads_;
  std::vector<std::thread> workers_;
  // Job description: written by ParallelFor before `state_` publishes the job (release),
  // read by a thread only after it claimed one of the job's chunks (acquire), and valid
  // until that chunk is counted in `done_`.
  const std::function<void(int64_t, int64_t, int)>* job_ = nullptr;
  int64_t job_n_ = 0;
  int64_t job_grain_ = 1;
  // (generation << 32) | next unclaimed chunk. A fetch_add claims a chunk of whichever job
  // is current; values past n_threads mean the job has no chunk left.
  std::atomic<uint64_t> state_{0};
  std::atomic<int> done_{0};  // chunks of the current job finished
  std::atomic<bool> stop_{false};
  // Sleeping workers wait on cv_; `sleepers_` lets ParallelFor skip the mutex and notify
  // when every worker is still spinning (seq_cst pairs with the worker's re-check).
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<int> sleepers_{0};
};

}  // namespace specnode
