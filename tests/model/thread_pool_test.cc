// ThreadPool: coverage and alignment of chunks, the spin -> sleep -> wake path, many tiny
// jobs back to back, and create/destroy churn (run under TSan to check the ordering).
#include "model/cpu/thread_pool.h"

#include <time.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace specnode {
namespace {

double ProcessCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Every index visited exactly once, chunks grain-aligned, chunk indices in range, each
// called at most once, and the same as a fresh computation of the split would give.
void CheckCoverage(ThreadPool& pool, int64_t n, int64_t grain) {
  std::vector<std::atomic<int>> hits(n);
  std::vector<std::atomic<int>> by_chunk(pool.n_threads());
  std::vector<int64_t> begins(pool.n_threads(), -1);
  pool.ParallelFor(n, grain, [&](int64_t begin, int64_t end, int chunk) {
    ASSERT_LT(begin, end);
    ASSERT_GE(chunk, 0);
    ASSERT_LT(chunk, pool.n_threads());
    EXPECT_EQ(begin % grain, 0) << "begin " << begin << " grain " << grain;
    by_chunk[chunk].fetch_add(1);
    begins[chunk] = begin;
    for (int64_t i = begin; i < end; ++i) hits[i].fetch_add(1, std::memory_order_relaxed);
  });
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "index " << i;
  for (auto& c : by_chunk) EXPECT_LE(c.load(), 1);
  // Chunk numbering is a function of (n, grain, n_threads): a second run matches.
  std::vector<int64_t> again(pool.n_threads(), -1);
  pool.ParallelFor(n, grain, [&](int64_t begin, int64_t, int chunk) { again[chunk] = begin; });
  EXPECT_EQ(begins, again);
}

TEST(ThreadPoolTest, CoversRangeForManyShapes) {
  for (int threads : {1, 2, 3, 4}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.n_threads(), threads);
    for (int64_t n : {1, 2, 3, 7, 16, 17, 100, 1000, 49152}) {
      for (int64_t grain : {1, 4, 16, 64}) CheckCoverage(pool, n, grain);
    }
  }
}

TEST(ThreadPoolTest, ZeroLengthCallsNothing) {
  ThreadPool pool(3);
  int calls = 0;
  pool.ParallelFor(0, 1, [&](int64_t, int64_t, int) { ++calls; });
  pool.ParallelFor(-5, 4, [&](int64_t, int64_t, int) { ++calls; });
  EXPECT_EQ(calls, 0);
}

TEST(ThreadPoolTest, SplitsWorkIntoOneChunkPerThread) {
  ThreadPool pool(2);
  std::atomic<int> chunks{0};
  pool.ParallelFor(1000, 1, [&](int64_t, int64_t, int) { chunks.fetch_add(1); });
  EXPECT_EQ(chunks.load(), 2);
}

// Workers that are busy elsewhere (here: more threads than cores, all spinning) must not
// make ParallelFor wait for them to be scheduled: the caller takes unclaimed chunks.
// (Waiting for each worker's time slice instead took milliseconds per job.)
TEST(ThreadPoolTest, CallerRunsChunksOfSlowWorkers) {
  const int threads = 2 * static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  ThreadPool pool(threads);
  const auto start = std::chrono::steady_clock::now();
  for (int round = 0; round < 500; ++round) {
    pool.ParallelFor(threads, 1, [&](int64_t b, int64_t, int chunk) { EXPECT_EQ(b, chunk); });
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 2.0) << "500 tiny jobs on an oversubscribed pool";
}

TEST(ThreadPoolTest, ManySmallJobsBackToBack) {
  ThreadPool pool(2);
  int64_t expected = 0;
  std::atomic<int64_t> total{0};
  for (int job = 0; job < 100000; ++job) {
    const int64_t n = 1 + job % 37;
    pool.ParallelFor(n, 1 + job % 5, [&](int64_t b, int64_t e, int) {
      int64_t s = 0;
      for (int64_t i = b; i < e; ++i) s += i;
      total.fetch_add(s, std::memory_order_relaxed);
    });
    expected += n * (n - 1) / 2;
  }
  EXPECT_EQ(total.load(), expected);
}

// Results written by workers are visible to the caller once ParallelFor returns; also with
// more threads than this machine may have cores (slow when oversubscribed: few rounds).
TEST(ThreadPoolTest, WritesVisibleAfterReturn) {
  for (const int threads : {2, 4}) {
    ThreadPool pool(threads);
    std::vector<int64_t> data(4096);
    for (int round = 0; round < (threads == 2 ? 5000 : 200); ++round) {
      pool.ParallelFor(4096, 8, [&](int64_t b, int64_t e, int) {
        for (int64_t i = b; i < e; ++i) data[i] = i + round;
      });
      ASSERT_EQ(data[4095], 4095 + round);
      ASSERT_EQ(data[2048], 2048 + round);
    }
  }
}

// Jobs after the workers went to sleep (past the spin budget) still run, and a sleeping
// pool burns no CPU.
TEST(ThreadPoolTest, SleepsWhenIdleAndWakes) {
  ThreadPool pool(3);
  for (int round = 0; round < 5; ++round) {
    std::atomic<int> chunks{0};
    pool.ParallelFor(300, 1, [&](int64_t, int64_t, int) { chunks.fetch_add(1); });
    EXPECT_EQ(chunks.load(), 3);
    std::this_thread::sleep_for(std::chrono::milliseconds(15));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const double cpu0 = ProcessCpuSeconds();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const double cpu = ProcessCpuSeconds() - cpu0;
  EXPECT_LT(cpu, 0.02) << "idle pool used " << cpu << " s of CPU in 0.2 s";
  std::atomic<int> chunks{0};
  pool.ParallelFor(300, 1, [&](int64_t, int64_t, int) { chunks.fetch_add(1); });
  EXPECT_EQ(chunks.load(), 3);
}

TEST(ThreadPoolTest, RepeatedCreateDestroy) {
  for (int i = 0; i < 300; ++i) {
    ThreadPool pool(1 + i % 4);
    if (i % 3 != 0) {
      std::atomic<int64_t> sum{0};
      pool.ParallelFor(64, 1, [&](int64_t b, int64_t e, int) { sum.fetch_add(e - b); });
      EXPECT_EQ(sum.load(), 64);
    }
    if (i % 50 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

TEST(ThreadPoolTest, NonPositiveThreadCountMeansOne) {
  ThreadPool pool(0);
  EXPECT_EQ(pool.n_threads(), 1);
  int calls = 0;
  pool.ParallelFor(10, 1, [&](int64_t b, int64_t e, int t) {
    EXPECT_EQ(b, 0);
    EXPECT_EQ(e, 10);
    EXPECT_EQ(t, 0);
    ++calls;
  });
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace specnode
