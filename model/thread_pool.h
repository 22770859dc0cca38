// A fixed pool of worker threads for data-parallel loops inside one forward pass.
//
// ParallelFor splits [0, n) into contiguous chunks, one per thread (the calling thread
// takes chunk 0), and returns when all chunks are done. Workers wait on a condition
// variable between jobs after a short spin, so an idle pool costs no CPU. One job at a
// time: ParallelFor is not reentrant and must be called from one thread at a time.
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

  // fn(begin, end, thread_index) is called for disjoint chunks covering [0, n).
  // Chunks are aligned to `grain` (except the last) so SIMD kernels get whole tiles.
  void ParallelFor(int64_t n, int64_t grain,
                   const std::function<void(int64_t, int64_t, int)>& fn);

 private:
  void WorkerLoop(int index);

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  const std::function<void(int64_t, int64_t, int)>* job_ = nullptr;
  int64_t job_n_ = 0;
  int64_t job_grain_ = 1;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  bool stop_ = false;
};

}  // namespace specnode
