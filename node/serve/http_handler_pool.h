// The HTTP listener's handler threads (http_server.h): httplib hands each accepted
// connection to a task queue, and a connection holds its thread for as long as it is open
// (a streaming response, keep-alive requests). With one pool, a node whose threads are all
// held by streams answers nothing else — not even /health, so a load balancer or a
// Kubernetes probe declares a busy node dead.
//
// This pool keeps `workers` threads for connections and `overflow` more for the connections
// that arrive while every worker is held. Code running on an overflow thread sees
// OnOverflowThread() true: the listener answers health, metrics and model listings there as
// usual, turns generation requests away with 429 `overloaded` at once instead of letting
// them wait unseen in the accept backlog, and closes each such connection after its answer
// (so that a client's next request gets a worker again). When the overflow threads are held
// too, connections wait for the first free thread of either kind.
//
// A worker that has just closed a connection is not yet waiting for the next one: a client
// that sends requests one after another on new connections would see its next connection
// queued for the overflow threads and turned away with 429 although no worker stays held.
// So an overflow thread leaves a connection for `grace` after it arrived, and a worker that
// frees up within that time takes it as a normal connection; only a connection still
// waiting after the grace is answered on the overflow thread.
//
// Thread-safety: enqueue and shutdown may be called from any thread (httplib: the accept
// thread, then the thread stopping the server). shutdown runs what is queued, then joins.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include <httplib.h>

namespace specnode {

class HttpHandlerPool final : public httplib::TaskQueue {
 public:
  static constexpr std::chrono::milliseconds kDefaultGrace{100};

  HttpHandlerPool(size_t workers, size_t overflow,
                  std::chrono::steady_clock::duration grace = kDefaultGrace);
  ~HttpHandlerPool() override;

  void enqueue(std::function<void()> fn) override;
  void shutdown() override;

  // True on an overflow thread (see above); false on every other thread.
  static bool OnOverflowThread();

 private:
  struct Task {
    std::function<void()> fn;
    std::chrono::steady_clock::time_point arrived;
  };
  struct Queue {
    std::deque<Task> tasks;
    size_t idle = 0;  // threads of this kind waiting for a task
    std::condition_variable cv;
  };
  void Work(Queue* q, bool overflow);

  const bool has_overflow_;
  const std::chrono::steady_clock::duration grace_;
  std::mutex mu_;
  Queue workers_, overflow_;  // guarded by mu_
  bool stop_ = false;         // guarded by mu_
  std::vector<std::thread> threads_;
};

}  // namespace specnode
