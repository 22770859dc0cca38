// The ZeroMQ front end (node/serve/frontend.h) over a scheduler whose thread is stuck in the
// engine when the node stops (GatedRunner holds a forward and never lets go until the test
// ends): every request in flight, running or queued, streamed or not, gets exactly one
// terminal reply, `error` with code `unavailable`, within the drain limit plus
// FrontendOptions::stop_wait_s, and Run returns (DeadlineExceeded) instead of hanging in a
// join of the scheduler thread.
#include "node/serve/frontend.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "coordinator/domain_router.h"
#include "nlohmann/json.hpp"
#include "node/session/model_session.h"
#include "tests/coordinator/scheduler_test_util.h"

namespace specnode {
namespace {

using Json = nlohmann::json;
using scheduler_test::GatedRunner;
using scheduler_test::SchedulerTest;

// A DEALER client: each reply kept per request id, with the time it arrived.
class Client {
 public:
  explicit Client(const std::string& endpoint) : sock_(ctx_, zmq::socket_type::dealer) {
    sock_.set(zmq::sockopt::linger, 0);
    sock_.connect(endpoint);
  }
  void Send(const Json& j) {
    const std::string s = j.dump();
    sock_.send(zmq::buffer(s), zmq::send_flags::none);
  }
  // Receives until `done` holds or `timeout` passes; false on timeout.
  bool ReceiveUntil(const std::function<bool()>& done, std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    while (!done()) {
      if (Clock::now() >= deadline) return false;
      zmq::pollitem_t item = {static_cast<void*>(sock_), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(20));
      zmq::message_t msg;
      while (sock_.recv(msg, zmq::recv_flags::dontwait)) {
        Json j = Json::parse(msg.to_string());
        const std::string type = j.value("type", "");
        if (type == "done" || type == "error") terminal_at_[j.value("id", "")] = Clock::now();
        replies_[j.value("id", "")].push_back(std::move(j));
      }
    }
    return true;
  }
  std::map<std::string, std::vector<Json>>& replies() { return replies_; }
  std::map<std::string, Clock::time_point>& terminal_at() { return terminal_at_; }

 private:
  zmq::context_t ctx_;
  zmq::socket_t sock_;
  std::map<std::string, std::vector<Json>> replies_;
  std::map<std::string, Clock::time_point> terminal_at_;
};

class FrontendStuckTest : public SchedulerTest {};

// In mpirun's teardown the scheduler thread gets what is left of the window (a remote step
// waiting on a lost rank then ends by itself and names the rank), never under 0.5 s.
TEST(FrontendTeardownTest, StopWaitIsTheRestOfTheWindow) {
  FrontendOptions fo;  // stop_wait_s 5
  fo.teardown_drain_s = 5.0;  // odls_base_sigkill_timeout 3: 2 x 3 - 1
  EXPECT_DOUBLE_EQ(TeardownStopWaitS(fo, 2.0), 3.0);  // drain_timeout_s 2
  EXPECT_DOUBLE_EQ(TeardownStopWaitS(fo, 5.0), FrontendOptions::kTeardownStopWaitS);
  fo.teardown_drain_s = 1.0;  // OpenMPI's default T = 1
  EXPECT_DOUBLE_EQ(TeardownStopWaitS(fo, 1.0), FrontendOptions::kTeardownStopWaitS);
  fo.teardown_drain_s = 40.0;
  EXPECT_DOUBLE_EQ(TeardownStopWaitS(fo, 30.0), 5.0);  // never above stop_wait_s
}

TEST_F(FrontendStuckTest, EveryRequestInFlightGetsOneUnavailableReplyAndRunReturns) {
  auto session = ModelSession::Open(path_, 1, false);
  ASSERT_TRUE(session.ok()) << session.status();
  auto router = DomainRouter::Create(RouterConfig{});
  ASSERT_TRUE(router.ok()) << router.status();
  const Tokenizer& tokenizer = (*session)->model().tokenizer();
  GatedRunner runner(Runner(64 << 20), /*hold_at=*/2);
  SpeculativeEngine engine(&runner, {}, {});
  SchedulerOptions so;
  so.max_active = 1;  // r0 running (stuck in its first decode), r1 and r2 queued
  std::unique_ptr<Frontend> frontend;
  Scheduler sched(&engine, &tokenizer, so,
                  [&frontend](GenerationEvent ev) { frontend->OnEvent(std::move(ev)); });
  FrontendOptions fo;
  // An abstract socket: no file left behind when an assertion ends the test early.
  fo.endpoint = "ipc://@specnode_frontend_stuck_" + std::to_string(getpid());
  fo.model_name = "tiny";
  fo.drain_timeout_s = 0.3;
  fo.stop_wait_s = 0.3;
  frontend = std::make_unique<Frontend>(fo, session->get(), router->get(), &sched, nullptr);
  ASSERT_TRUE(frontend->Bind().ok());
  std::atomic<bool> stop{false};
  absl::Status run_status;
  std::atomic<bool> returned{false};
  Clock::time_point returned_at;
  std::thread server([&] {
    run_status = frontend->Run(&stop);
    returned_at = Clock::now();
    returned.store(true);
  });
  // On every way out (a failed ASSERT too) the runner lets go and Run is joined before the
  // scheduler's destructor joins its thread, so that a failing run ends instead of hanging.
  struct JoinAtEnd {
    GatedRunner* runner;
    std::atomic<bool>* stop;
    std::thread* server;
    ~JoinAtEnd() {
      stop->store(true);
      runner->Release();
      if (server->joinable()) server->join();
    }
  } join_at_end{&runner, &stop, &server};

  Client client(fo.endpoint);
  const std::vector<std::string> ids = {"r0", "r1", "r2"};
  for (const std::string& id : ids) {
    client.Send({{"type", "submit"},
                 {"id", id},
                 {"prompt", "hello world"},
                 {"max_tokens", 400},
                 {"temperature", 0},
                 {"stream", id != "r2"}});
    if (id == "r0") runner.WaitHeld();  // r0 is running when the others arrive
  }
  auto all_accepted = [&] {
    for (const std::string& id : ids) {
      bool accepted = false;
      for (const Json& j : client.replies()[id]) accepted |= j.value("type", "") == "accepted";
      if (!accepted) return false;
    }
    return true;
  };
  ASSERT_TRUE(client.ReceiveUntil(all_accepted, std::chrono::seconds(30)));

  const auto t0 = Clock::now();
  stop.store(true);
  // The front end polls every 100 ms, drains, waits for the stuck thread, then flushes.
  const double bound = 0.1 + fo.drain_timeout_s + fo.stop_wait_s + 0.25;
  constexpr double kSlackS = 3.0;  // a loaded (or sanitizer) machine; the hang is unbounded
  auto all_terminal = [&] { return client.terminal_at().size() == ids.size(); };
  EXPECT_TRUE(client.ReceiveUntil(all_terminal, std::chrono::seconds(10)));
  // Run returns (no join of the stuck thread); then nothing more arrives.
  const auto give_up = Clock::now() + std::chrono::seconds(10);
  while (!returned.load() && Clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(returned.load()) << "Run did not return with the scheduler thread stuck";
  server.join();
  EXPECT_EQ(run_status.code(), absl::StatusCode::kDeadlineExceeded) << run_status;
  EXPECT_LT(std::chrono::duration<double>(returned_at - t0).count(), bound + kSlackS);
  client.ReceiveUntil([] { return false; }, std::chrono::milliseconds(300));

  for (const std::string& id : ids) {
    int terminal = 0;
    for (const Json& j : client.replies()[id]) {
      const std::string type = j.value("type", "");
      if (type != "done" && type != "error") continue;
      ++terminal;
      EXPECT_EQ(type, "error") << j.dump();
      EXPECT_EQ(j.value("code", ""), "unavailable") << j.dump();
    }
    EXPECT_EQ(terminal, 1) << id;
    ASSERT_TRUE(client.terminal_at().count(id)) << id;
    EXPECT_LT(std::chrono::duration<double>(client.terminal_at()[id] - t0).count(),
              bound + kSlackS)
        << id;
  }
  // The thread comes back and stops; its late events reach no client.
  runner.Release();
  sched.Stop();
  frontend.reset();
}

}  // namespace
}  // namespace specnode
