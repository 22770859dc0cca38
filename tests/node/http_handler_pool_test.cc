// The HTTP listener's handler threads (node/serve/http_handler_pool.h): connections go to a
// free worker; while every worker is held they go to an overflow thread, but only after the
// grace in which a worker that is just finishing its connection takes them instead.
#include "node/serve/http_handler_pool.h"

#include <chrono>
#include <condition_variable>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

#include "gtest/gtest.h"

namespace specnode {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// A connection that holds its thread until Release.
class Held {
 public:
  std::function<void()> Task() {
    return [this] {
      std::unique_lock lock(mu_);
      started_ = true;
      cv_.notify_all();
      cv_.wait(lock, [&] { return released_; });
    };
  }
  void WaitStarted() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return started_; });
  }
  void Release() {
    std::lock_guard lock(mu_);
    released_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool started_ = false, released_ = false;
};

// Runs on a pool thread and reports whether it was an overflow thread.
std::function<void()> Report(std::promise<bool>* on_overflow) {
  return [on_overflow] { on_overflow->set_value(HttpHandlerPool::OnOverflowThread()); };
}

TEST(HttpHandlerPoolTest, AFreeWorkerTakesTheConnection) {
  HttpHandlerPool pool(2, 1, seconds(30));
  std::promise<bool> p;
  pool.enqueue(Report(&p));
  ASSERT_EQ(p.get_future().wait_for(seconds(10)), std::future_status::ready);
}

// The race behind a spurious 429: the only worker finishes its connection just after the
// next one arrived. With a long grace the overflow thread leaves it to that worker.
TEST(HttpHandlerPoolTest, AWorkerFinishingWithinTheGraceTakesTheNextConnection) {
  HttpHandlerPool pool(1, 1, seconds(30));
  Held held;
  pool.enqueue(held.Task());
  held.WaitStarted();
  std::promise<bool> p;
  std::future<bool> f = p.get_future();
  pool.enqueue(Report(&p));  // every worker is held: queued for the overflow threads
  EXPECT_EQ(f.wait_for(milliseconds(200)), std::future_status::timeout)
      << "answered on overflow before the grace ended";
  held.Release();
  ASSERT_EQ(f.wait_for(seconds(10)), std::future_status::ready);
  EXPECT_FALSE(f.get()) << "a worker was free within the grace";
}

// A worker held past the grace: the overflow thread answers (health stays up).
TEST(HttpHandlerPoolTest, AConnectionStillWaitingAfterTheGraceGoesToOverflow) {
  HttpHandlerPool pool(1, 1, milliseconds(20));
  Held held;
  pool.enqueue(held.Task());
  held.WaitStarted();
  std::promise<bool> p;
  std::future<bool> f = p.get_future();
  const auto t0 = std::chrono::steady_clock::now();
  pool.enqueue(Report(&p));
  ASSERT_EQ(f.wait_for(seconds(10)), std::future_status::ready);
  EXPECT_TRUE(f.get());
  EXPECT_GE(std::chrono::steady_clock::now() - t0, milliseconds(20));
  held.Release();
}

// Shutdown runs what is queued (httplib closes those sockets) without waiting for the grace.
TEST(HttpHandlerPoolTest, ShutdownRunsQueuedConnectionsAtOnce) {
  HttpHandlerPool pool(1, 1, seconds(30));
  Held held;
  pool.enqueue(held.Task());
  held.WaitStarted();
  std::promise<bool> p;
  std::future<bool> f = p.get_future();
  pool.enqueue(Report(&p));
  std::thread stopper([&] { pool.shutdown(); });
  ASSERT_EQ(f.wait_for(seconds(10)), std::future_status::ready);
  held.Release();
  stopper.join();
}

}  // namespace
}  // namespace specnode
