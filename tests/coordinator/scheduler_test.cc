// The scheduler on a tiny model: every request gets its tokens and exactly one terminal
// event; KV pressure preempts and recomputes without changing greedy output; cancellation,
// the bounded queue and class priority (stop strings: scheduler_stop_test.cc).
#include "coordinator/request_error.h"
#include "coordinator/scheduler.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "runtime/model_runner.h"
#include "coordinator/ngram_drafter.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvstore/kv_cache_factory.h"
#include "model/llama/llama_model.h"
#include "model/llama/tiny_model.h"
#include "tests/coordinator/scheduler_test_util.h"

namespace specnode {
namespace {

using scheduler_test::Collector;
using scheduler_test::GatedRunner;
using scheduler_test::SchedulerTest;

class SchedulerKvPressureTest : public SchedulerTest, public testing::WithParamInterface<bool> {};

TEST_P(SchedulerKvPressureTest, ManyRequestsAllCompleteCorrectly) {
  const bool host_tier = GetParam();
  constexpr int kRequests = 12, kTokens = 40;
  const auto expected = Reference(kRequests, kTokens);
  // 48 KiB holds roughly three sequences at full length (f16, 2 layers x 2 kv heads x 16
  // dims): with 8 slots the scheduler must hold requests back and preempt to progress.
  auto runner = Runner(48 << 10, host_tier ? int64_t{1} << 20 : 0);
  SpeculativeEngine engine(runner.get(), {}, {});
  Collector sink;
  SchedulerOptions so;
  so.max_active = 8;
  Scheduler sched(&engine, &model_->tokenizer(), so, std::ref(sink));
  std::vector<uint64_t> handles;
  for (int i = 0; i < kRequests; ++i) {
    auto t = sched.Submit(Request(i, kTokens));
    ASSERT_TRUE(t.ok()) << t.status();
    handles.push_back(t->handle);
  }
  for (int i = 0; i < kRequests; ++i) {
    const auto rec = sink.Wait(handles[i]);
    ASSERT_EQ(rec.last.kind, GenerationEvent::Kind::kDone) << rec.last.error;
    EXPECT_EQ(rec.terminal, 1);
    EXPECT_EQ(rec.tokens, expected[i]) << "request " << i;
    EXPECT_EQ(rec.last.stats.completion_tokens, kTokens);
  }
  // How the pressure splits between held-back admissions and preemptions depends on how
  // the submissions interleave with the scheduler thread; together they must show.
  const SchedulerSnapshot snap = sched.Snapshot();
  EXPECT_GT(snap.preemptions + snap.kv_waits, 0) << "capacity was meant to bind";
  if (host_tier) {
    EXPECT_LE(snap.swapped, snap.preemptions);  // a prefilling victim is recomputed
  } else {
    EXPECT_EQ(snap.swapped, 0);
  }
  sched.Stop();
  for (uint64_t h : handles) EXPECT_EQ(sink.Wait(h).after_terminal, 0);
  EXPECT_EQ(runner->Room(0)->available, 48 << 10) << "every page was returned";
}

INSTANTIATE_TEST_SUITE_P(HostTier, SchedulerKvPressureTest, testing::Bool(),
                         [](const testing::TestParamInfo<bool>& i) {
                           return i.param ? "Swap" : "Recompute";
                         });

// With the batch full, a waiting interactive request preempts the running batch request
// (its KV parked in the host tier); the batch request resumes afterwards with exactly
// the tokens it would have produced alone.
TEST_F(SchedulerTest, WaitingHigherClassPreemptsARunningLowerClass) {
  const auto expected = Reference(2, 60);
  GatedRunner runner(Runner(64 << 20), /*hold_at=*/4);
  SpeculativeEngine engine(&runner, {}, {});
  Collector sink;
  SchedulerOptions so;
  so.max_active = 1;
  Scheduler sched(&engine, &model_->tokenizer(), so, std::ref(sink));
  GenerationRequest batch = Request(0, 60);
  batch.sla = "batch";
  auto b = sched.Submit(batch);
  ASSERT_TRUE(b.ok());
  runner.WaitHeld();  // the batch request is decoding (its 4th forward is in progress)
  GenerationRequest interactive = Request(1, 8);
  interactive.sla = "interactive";
  auto in = sched.Submit(interactive);
  ASSERT_TRUE(in.ok());
  runner.Release();
  const auto ri = sink.Wait(in->handle);
  const auto rb = sink.Wait(b->handle);
  ASSERT_EQ(ri.last.kind, GenerationEvent::Kind::kDone);
  ASSERT_EQ(rb.last.kind, GenerationEvent::Kind::kDone);
  EXPECT_EQ(rb.tokens, expected[0]);
  EXPECT_EQ(ri.tokens, std::vector<int32_t>(expected[1].begin(), expected[1].begin() + 8));
  const SchedulerSnapshot snap = sched.Snapshot();
  EXPECT_EQ(snap.class_preemptions, 1);
  EXPECT_EQ(snap.swapped, 1);
  // The interactive request did not wait for the 60-token batch request to finish.
  EXPECT_LT(ri.last.stats.total_ms, rb.last.stats.total_ms);
}

// The first request is held mid-decode (so it is known to be running, not queued: a
// position asserted before the scheduler thread admitted it would race), two more wait.
TEST_F(SchedulerTest, CancelQueuedAndRunning) {
  GatedRunner runner(Runner(64 << 20), /*hold_at=*/2);
  SpeculativeEngine engine(&runner, {}, {});
  Collector sink;
  SchedulerOptions so;
  so.max_active = 1;
  Scheduler sched(&engine, &model_->tokenizer(), so, std::ref(sink));
  auto running = sched.Submit(Request(0, 400));
  ASSERT_TRUE(running.ok());
  runner.WaitHeld();
  auto queued = sched.Submit(Request(1, 400));
  auto queued2 = sched.Submit(Request(2, 400));
  ASSERT_TRUE(queued.ok() && queued2.ok());
  EXPECT_EQ(queued->queue_position, 0);
  EXPECT_EQ(queued2->queue_position, 1);
  EXPECT_TRUE(sched.Cancel(queued2->handle));
  EXPECT_TRUE(sched.Cancel(queued->handle));
  EXPECT_TRUE(sched.Cancel(running->handle));
  runner.Release();
  for (uint64_t h : {running->handle, queued->handle, queued2->handle}) {
    const auto rec = sink.Wait(h);
    EXPECT_EQ(rec.last.kind, GenerationEvent::Kind::kDone);
    EXPECT_EQ(rec.last.finish, FinishKind::kCancelled);
    EXPECT_EQ(rec.terminal, 1);
  }
  EXPECT_FALSE(sched.Cancel(running->handle));
  EXPECT_FALSE(sched.Cancel(12345));
  EXPECT_EQ(runner.inner().cache().Length(static_cast<SeqId>(running->handle)), 0);  // KV freed
}

// The snapshot's metrics of ended requests: per-class latency histograms (seconds, the
// requests' RequestStats), token counters, and draft counters per domain.
TEST_F(SchedulerTest, SnapshotCountsLatenciesAndTokensOfEndedRequests) {
  auto runner = Runner(64 << 20);
  SpeculativeEngine engine(runner.get(), {}, {});
  Collector sink;
  Scheduler sched(&engine, &model_->tokenizer(), {}, std::ref(sink));
  {
    const SchedulerSnapshot before = sched.Snapshot();
    ASSERT_EQ(before.latency.size(), 2u);  // both default classes, from the start
    EXPECT_EQ(before.latency.at("batch").ttft.count(), 0);
    EXPECT_EQ(before.generation_tokens, 0);
  }
  std::vector<RequestStats> stats;
  for (const char* sla : {"interactive", "batch", "batch"}) {
    GenerationRequest g = Request(static_cast<int>(stats.size()), 6);
    g.sla = sla;
    g.domain = "code";
    auto t = sched.Submit(g);
    ASSERT_TRUE(t.ok()) << t.status();
    const auto rec = sink.Wait(t->handle);
    ASSERT_EQ(rec.last.kind, GenerationEvent::Kind::kDone);
    stats.push_back(rec.last.stats);
  }
  const SchedulerSnapshot snap = sched.Snapshot();
  int64_t prompt = 0, generated = 0, drafted = 0, accepted = 0;
  double batch_e2e = 0;
  int batch_tpot = 0;
  for (const RequestStats& st : stats) {
    prompt += st.prompt_tokens;
    generated += st.completion_tokens;
    drafted += st.drafted;
    accepted += st.accepted;
    if (st.sla == "batch") {
      batch_e2e += st.total_ms / 1e3;
      batch_tpot += st.completion_tokens > 1;
    }
  }
  EXPECT_EQ(snap.prompt_tokens, prompt);
  EXPECT_EQ(snap.generation_tokens, generated);
  EXPECT_EQ(snap.drafted_by_domain.at("code"), drafted);
  EXPECT_EQ(snap.accepted_by_domain.at("code"), accepted);
  const SchedulerSnapshot::SlaLatency& in = snap.latency.at("interactive");
  const SchedulerSnapshot::SlaLatency& batch = snap.latency.at("batch");
  EXPECT_EQ(in.ttft.count(), 1);
  EXPECT_EQ(in.queue.count(), 1);
  EXPECT_EQ(batch.ttft.count(), 2);
  EXPECT_EQ(batch.e2e.count(), 2);
  EXPECT_EQ(batch.tpot.count(), batch_tpot);
  EXPECT_NEAR(batch.e2e.sum(), batch_e2e, 1e-9);
  EXPECT_NEAR(in.ttft.sum(), stats[0].ttft_ms / 1e3, 1e-9);
  EXPECT_EQ(batch.e2e.CumulativeCounts().back(), 2);  // both well under 7680 s
}

TEST_F(SchedulerTest, BoundedQueueAndUnknownClass) {
  auto runner = Runner(64 << 20);
  SpeculativeEngine engine(runner.get(), {}, {});
  Collector sink;
  SchedulerOptions so;
  so.max_active = 1;
  so.max_queue = 2;
  Scheduler sched(&engine, &model_->tokenizer(), so, std::ref(sink));
  GenerationRequest g = Request(0, 300);
  std::vector<uint64_t> ok;
  int overloaded = 0;
  for (int i = 0; i < 8; ++i) {
    auto t = sched.Submit(g);
    if (t.ok()) {
      ok.push_back(t->handle);
    } else {
      EXPECT_EQ(t.status().code(), absl::StatusCode::kResourceExhausted);
      ++overloaded;
    }
  }
  EXPECT_GE(overloaded, 4);
  EXPECT_EQ(RequestErrorOf(sched.Submit(g).status()), RequestError::kOverloaded);
  g.sla = "gold";
  EXPECT_EQ(sched.Submit(g).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RequestErrorOf(sched.Submit(g).status()), RequestError::kUnknownSla);
  for (uint64_t h : ok) sched.Cancel(h);
  for (uint64_t h : ok) EXPECT_EQ(sink.Wait(h).terminal, 1);
  sched.BeginDrain();
  const absl::Status drained = sched.Submit(Request(0, 4)).status();
  EXPECT_EQ(drained.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(RequestErrorOf(drained), RequestError::kShuttingDown);
}

// Submit checks the request itself (the one validator, as its header says), before any
// queueing: each bad parameter is refused with its wire code, and nothing is queued.
TEST_F(SchedulerTest, SubmitRefusesBadRequestsWithTheirCodes) {
  auto runner = Runner(64 << 20);
  SpeculativeEngine engine(runner.get(), {}, {});
  Collector sink;
  SchedulerOptions so;
  so.max_tokens = 50;
  Scheduler sched(&engine, &model_->tokenizer(), so, std::ref(sink));
  const int32_t context = model_->config().context_length;
  struct Case {
    const char* what;
    std::function<void(GenerationRequest&)> change;
    RequestError code;
  };
  const Case cases[] = {
      {"empty prompt", [](GenerationRequest& g) { g.prompt.clear(); }, RequestError::kBadRequest},
      {"token id", [](GenerationRequest& g) { g.prompt[1] = 1 << 20; }, RequestError::kBadRequest},
      {"max_tokens 0", [](GenerationRequest& g) { g.max_tokens = 0; }, RequestError::kBadRequest},
      {"max_tokens over the limit", [](GenerationRequest& g) { g.max_tokens = 51; },
       RequestError::kBadRequest},
      {"temperature", [](GenerationRequest& g) { g.sampling.temperature = -1; },
       RequestError::kBadRequest},
      {"top_p", [](GenerationRequest& g) { g.sampling.top_p = 0; }, RequestError::kBadRequest},
      {"top_k", [](GenerationRequest& g) { g.sampling.top_k = -3; }, RequestError::kBadRequest},
      {"domain", [](GenerationRequest& g) { g.domain = "no spaces"; }, RequestError::kBadRequest},
      {"context", [context](GenerationRequest& g) { g.prompt.assign(context - 10, 70); },
       RequestError::kPromptTooLong},
      {"sla", [](GenerationRequest& g) { g.sla = "platinum"; }, RequestError::kUnknownSla},
  };
  for (const Case& c : cases) {
    GenerationRequest g = Request(0, 20);
    c.change(g);
    auto t = sched.Submit(g);
    ASSERT_FALSE(t.ok()) << c.what;
    EXPECT_EQ(RequestErrorOf(t.status()), c.code) << c.what << ": " << t.status();
  }
  EXPECT_EQ(sched.Snapshot().queued, 0);
  auto fine = sched.Submit(Request(0, 20));
  ASSERT_TRUE(fine.ok()) << fine.status();
  EXPECT_EQ(sink.Wait(fine->handle).terminal, 1);
}

// A shedding class refuses a request at once when the slots ahead of it would not free up
// within its TTFT target (measured turnover), and accepts it when a slot is free; a class
// that does not shed queues the same request.
TEST_F(SchedulerTest, SheddingClassRefusesRequestsThatWouldMissTheirTtftTarget) {
  auto runner = Runner(64 << 20);
  SpeculativeEngine engine(runner.get(), {}, {});
  Collector sink;
  SchedulerOptions so;
  so.max_active = 1;
  // "fast" sheds at a 0.5 ms TTFT target: any measured wait for a slot is too long.
  so.classes = {{"fast", 0.5, 200, 0, /*shed=*/true}, {"bulk", 10000, 1000, 1, false}};
  so.default_class = "bulk";
  Scheduler sched(&engine, &model_->tokenizer(), so, std::ref(sink));
  auto fast = [](int i, int max_tokens) {
    GenerationRequest g = Request(i, max_tokens);
    g.sla = "fast";
    return g;
  };
  // No turnover measured yet, and a slot is free: accepted.
  auto first = sched.Submit(fast(0, 8));
  ASSERT_TRUE(first.ok()) << first.status();
  sink.Wait(first->handle);
  // Measure slot turnover: three bulk requests through one slot (the 2nd and 3rd wait).
  std::vector<uint64_t> bulk;
  for (int i = 0; i < 3; ++i) {
    auto t = sched.Submit(Request(i, 300));
    ASSERT_TRUE(t.ok()) << t.status();
    bulk.push_back(t->handle);
  }
  for (uint64_t h : bulk) sink.Wait(h);
  // The slot busy with a long fast request: the next fast one would wait for it to end.
  auto busy = sched.Submit(fast(1, 400));
  ASSERT_TRUE(busy.ok()) << busy.status();
  auto refused = sched.Submit(fast(2, 8));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(refused.status().message()),
              testing::HasSubstr("overloaded: a fast request would wait"));
  // The same request in a class that does not shed is queued.
  auto queued = sched.Submit(Request(2, 8));
  ASSERT_TRUE(queued.ok()) << queued.status();
  const SchedulerSnapshot snap = sched.Snapshot();
  EXPECT_EQ(snap.shed, 1);
  EXPECT_EQ(snap.rejected, 1);
  sched.Cancel(busy->handle);
  EXPECT_EQ(sink.Wait(busy->handle).terminal, 1);
  EXPECT_EQ(sink.Wait(queued->handle).terminal, 1);
  // The slot free again: fast requests are accepted.
  auto later = sched.Submit(fast(3, 4));
  ASSERT_TRUE(later.ok()) << later.status();
  EXPECT_EQ(sink.Wait(later->handle).last.kind, GenerationEvent::Kind::kDone);
}

TEST_F(SchedulerTest, InteractiveClassIsAdmittedBeforeBatch) {
  auto runner = Runner(64 << 20);
  SpeculativeEngine engine(runner.get(), {}, {});
  Collector sink;
  SchedulerOptions so;
  so.max_active = 1;
  Scheduler sched(&engine, &model_->tokenizer(), so, std::ref(sink));
  GenerationRequest first = Request(0, 60);
  auto blocker = sched.Submit(first);  // occupies the only slot
  GenerationRequest batch = Request(1, 5);
  batch.sla = "batch";
  GenerationRequest interactive = Request(2, 5);
  interactive.sla = "interactive";
  auto b = sched.Submit(batch);
  auto i = sched.Submit(interactive);
  ASSERT_TRUE(blocker.ok() && b.ok() && i.ok());
  // Ahead of the batch request already waiting (behind the blocker at most, if the
  // scheduler thread has not admitted it yet).
  EXPECT_LE(i->queue_position, 1);
  EXPECT_GE(b->queue_position, 0);
  const auto ri = sink.Wait(i->handle);
  const auto rb = sink.Wait(b->handle);
  EXPECT_LT(ri.last.stats.queue_ms, rb.last.stats.queue_ms);
}

// A target that dies (a tensor-parallel rank gone: Unavailable) at its first forward after
// Kill() — the test arms it once every request is in, so no Submit races the failure.
class DyingRunner : public ModelRunner {
 public:
  explicit DyingRunner(std::unique_ptr<LocalModelRunner> inner) : inner_(std::move(inner)) {}
  void Kill() { dead_.store(true); }
  int32_t vocab_size() const override { return inner_->vocab_size(); }
  int32_t max_positions() const override { return inner_->max_positions(); }
  absl::Status Forward(std::span<const BatchEntry> batch, std::vector<float>* logits) override {
    if (dead_.load()) return absl::UnavailableError("target rank 2 (pid 1) is gone");
    return inner_->Forward(batch, logits);
  }
  int32_t Length(SeqId seq) const override { return inner_->Length(seq); }
  absl::Status Truncate(SeqId seq, int32_t n) override { return inner_->Truncate(seq, n); }
  void Free(SeqId seq) override { inner_->Free(seq); }
  absl::Status Ping() override {
    ++pings_;
    if (dead_.load()) return absl::DeadlineExceededError("target rank 2 did not answer");
    return absl::OkStatus();
  }
  std::atomic<int> pings_{0};

 private:
  std::unique_ptr<LocalModelRunner> inner_;
  std::atomic<bool> dead_{false};
};

TEST_F(SchedulerTest, LostTargetFailsEveryRequestAndStopsAdmitting) {
  DyingRunner runner(Runner(64 << 20));
  SpeculativeEngine engine(&runner, {}, {});
  Collector events;
  SchedulerOptions so;
  so.max_active = 2;  // the third request waits in the queue
  Scheduler sched(&engine, &model_->tokenizer(), so, std::ref(events));
  std::vector<uint64_t> handles;
  for (int i = 0; i < 3; ++i) {
    auto t = sched.Submit(Request(i, 50));
    ASSERT_TRUE(t.ok()) << t.status();
    handles.push_back(t->handle);
  }
  runner.Kill();
  for (uint64_t h : handles) {
    const Collector::Record r = events.Wait(h);
    EXPECT_EQ(r.terminal, 1);
    EXPECT_EQ(r.last.kind, GenerationEvent::Kind::kError);
    EXPECT_EQ(r.last.error.code(), absl::StatusCode::kUnavailable);
    EXPECT_TRUE(IsTargetLost(r.last.error));
  }
  EXPECT_EQ(sched.Failure().code(), absl::StatusCode::kUnavailable);
  // The last terminal reply may leave before the scheduler thread has dropped the request.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!sched.Idle() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(sched.Idle());
  auto late = sched.Submit(Request(5, 4));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(late.status().message().find("target failed"), std::string::npos);
  sched.Stop();
}

// An idle node still notices a target that stopped answering: the heartbeat pings it, and
// the scheduler fails over exactly as after a failed step.
TEST_F(SchedulerTest, HeartbeatNoticesATargetLostWhileIdle) {
  DyingRunner runner(Runner(64 << 20));
  SpeculativeEngine engine(&runner, {}, {});
  Collector sink;
  SchedulerOptions so;
  so.heartbeat_s = 0.02;
  Scheduler sched(&engine, &model_->tokenizer(), so, std::ref(sink));
  auto t = sched.Submit(Request(0, 4));
  ASSERT_TRUE(t.ok());
  ASSERT_EQ(sink.Wait(t->handle).last.kind, GenerationEvent::Kind::kDone);
  // Idle and healthy: pinged, nothing fails.
  for (int i = 0; i < 2000 && runner.pings_.load() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_GE(runner.pings_.load(), 2);
  EXPECT_TRUE(sched.Failure().ok());
  runner.Kill();
  for (int i = 0; i < 5000 && sched.Failure().ok(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(sched.Failure().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(sched.Idle());
  EXPECT_EQ(sched.Submit(Request(1, 4)).status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace specnode
