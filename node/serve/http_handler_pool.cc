#include "node/serve/http_handler_pool.h"

namespace specnode {
namespace {

thread_local bool t_overflow = false;

}  // namespace

HttpHandlerPool::HttpHandlerPool(size_t workers, size_t overflow,
                                 std::chrono::steady_clock::duration grace)
    : has_overflow_(overflow > 0), grace_(grace) {
  threads_.reserve(workers + overflow);
  for (size_t i = 0; i < workers; ++i) threads_.emplace_back([this] { Work(&workers_, false); });
  for (size_t i = 0; i < overflow; ++i) threads_.emplace_back([this] { Work(&overflow_, true); });
}

HttpHandlerPool::~HttpHandlerPool() { shutdown(); }

bool HttpHandlerPool::OnOverflowThread() { return t_overflow; }

void HttpHandlerPool::enqueue(std::function<void()> fn) {
  std::lock_guard lock(mu_);
  Task task{std::move(fn), std::chrono::steady_clock::now()};
  // A worker is free when more of them wait than tasks are already queued for them.
  if (workers_.idle > workers_.tasks.size() || !has_overflow_) {
    workers_.tasks.push_back(std::move(task));
    workers_.cv.notify_one();
    return;
  }
  overflow_.tasks.push_back(std::move(task));
  overflow_.cv.notify_one();
  workers_.cv.notify_one();  // a worker that frees up first takes it, as a normal connection
}

void HttpHandlerPool::shutdown() {
  {
    std::lock_guard lock(mu_);
    if (stop_ && threads_.empty()) return;
    stop_ = true;
  }
  workers_.cv.notify_all();
  overflow_.cv.notify_all();
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
  threads_.clear();
}

void HttpHandlerPool::Work(Queue* q, bool overflow) {
  t_overflow = overflow;
  while (true) {
    std::function<void()> fn;
    {
      std::unique_lock lock(mu_);
      // A worker also serves connections queued for the overflow threads: they arrived while
      // every worker was held, and one is free now.
      auto next = [&]() -> Queue* {
        if (!q->tasks.empty()) return q;
        if (!overflow && !overflow_.tasks.empty()) return &overflow_;
        return nullptr;
      };
      ++q->idle;
      q->cv.wait(lock, [&] { return stop_ || next() != nullptr; });
      --q->idle;
      // Queued connections are still served after stop (httplib closes them at once then).
      Queue* from = next();
      if (from == nullptr) return;
      if (overflow && !stop_) {
        // The grace (see the header): a worker finishing a connection may take this one.
        const auto until = from->tasks.front().arrived + grace_;
        if (std::chrono::steady_clock::now() < until) {
          q->cv.wait_until(lock, until);
          continue;
        }
      }
      fn = std::move(from->tasks.front().fn);
      from->tasks.pop_front();
    }
    fn();
  }
}

}  // namespace specnode
