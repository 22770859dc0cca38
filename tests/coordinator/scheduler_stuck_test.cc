// Scheduler::StopWithin (coordinator/scheduler_stop.cc): a scheduler thread stuck in the
// engine (GatedRunner holding a forward) is abandoned after the wait, every request it held
// answered `unavailable` exactly once, through the scheduler's sink and through a request's
// own sink (as the HTTP API sets) alike; a thread that comes back in time is joined as by
// Stop.
#include <chrono>
#include <functional>
#include <thread>

#include "coordinator/request_error.h"
#include "tests/coordinator/scheduler_test_util.h"

namespace specnode::scheduler_test {
namespace {

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Slack over a bound for a loaded (or sanitizer) machine; the hang it guards against is
// unbounded.
constexpr double kSlackS = 3.0;

TEST_F(SchedulerTest, StopWithinAnswersEveryRequestOfAStuckThreadOnce) {
  GatedRunner runner(Runner(64 << 20), /*hold_at=*/2);
  SpeculativeEngine engine(&runner, {}, {});
  Collector sink, own;  // the scheduler's sink; a request's own (GenerationRequest::sink)
  SchedulerOptions so;
  so.max_active = 1;  // one request running (stuck in its first decode), two queued
  Scheduler sched(&engine, &model_->tokenizer(), so, std::ref(sink));
  auto running = sched.Submit(Request(0, 400));
  ASSERT_TRUE(running.ok()) << running.status();
  runner.WaitHeld();
  auto queued = sched.Submit(Request(1, 400));
  GenerationRequest g = Request(2, 400);
  g.sink = std::ref(own);
  auto queued_own = sched.Submit(std::move(g));
  ASSERT_TRUE(queued.ok() && queued_own.ok());
  sched.BeginDrain();

  const auto t0 = Clock::now();
  const absl::Status st = sched.StopWithin(std::chrono::milliseconds(200));
  const double waited = SecondsSince(t0);
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
  EXPECT_GE(waited, 0.2);
  EXPECT_LT(waited, 0.2 + kSlackS);
  // Every terminal event went out before StopWithin returned.
  const std::pair<Collector*, uint64_t> requests[] = {
      {&sink, running->handle}, {&sink, queued->handle}, {&own, queued_own->handle}};
  for (const auto& [collector, handle] : requests) {
    const Collector::Record r = collector->Wait(handle);
    EXPECT_EQ(r.terminal, 1) << handle;
    EXPECT_EQ(r.last.kind, GenerationEvent::Kind::kError) << handle;
    EXPECT_EQ(RequestErrorOf(r.last.error), RequestError::kUnavailable) << r.last.error;
  }
  EXPECT_TRUE(sched.Idle());
  EXPECT_FALSE(sched.Cancel(running->handle));  // already answered
  EXPECT_EQ(RequestErrorOf(sched.Submit(Request(3, 4)).status()), RequestError::kShuttingDown);
  EXPECT_EQ(sched.Snapshot().failed, 3);
  // Later calls (ServeNode's, after Run's) answer at once, with the same status.
  const auto t1 = Clock::now();
  EXPECT_EQ(sched.StopWithin(std::chrono::seconds(30)), st);
  EXPECT_LT(SecondsSince(t1), 1.0);

  // The thread comes back: it finishes its step and stops, and nothing it emits reaches a
  // sink (no second terminal event, no tokens after the first).
  runner.Release();
  sched.Stop();
  for (const auto& [collector, handle] : requests) {
    const Collector::Record r = collector->Wait(handle);
    EXPECT_EQ(r.terminal, 1) << handle;
    EXPECT_EQ(r.after_terminal, 0) << handle;
  }
}

// A thread that returns from the engine within the wait is joined: OK, and the requests end
// as after Stop (cancelled).
TEST_F(SchedulerTest, StopWithinJoinsAThreadThatComesBackInTime) {
  GatedRunner runner(Runner(64 << 20), /*hold_at=*/2);
  SpeculativeEngine engine(&runner, {}, {});
  Collector sink;
  Scheduler sched(&engine, &model_->tokenizer(), {}, std::ref(sink));
  auto t = sched.Submit(Request(0, 400));
  ASSERT_TRUE(t.ok()) << t.status();
  runner.WaitHeld();
  std::thread release([&runner] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    runner.Release();
  });
  const absl::Status st = sched.StopWithin(std::chrono::seconds(30));
  release.join();
  EXPECT_TRUE(st.ok()) << st;
  const Collector::Record r = sink.Wait(t->handle);
  EXPECT_EQ(r.terminal, 1);
  EXPECT_EQ(r.last.kind, GenerationEvent::Kind::kDone);
  EXPECT_EQ(r.last.finish, FinishKind::kCancelled);
  EXPECT_TRUE(sched.Idle());
}

}  // namespace
}  // namespace specnode::scheduler_test
