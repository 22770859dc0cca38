// Stop strings in the scheduler: the text cut before the stop string, prefixes of one held
// back until they can no longer begin it, and the output (and its usage) ending at the
// token that completes it, however many tokens a speculative step accepted.
#include <algorithm>
#include <string>
#include <vector>

#include "coordinator/model_drafter.h"
#include "coordinator/spec_controller.h"
#include "tests/coordinator/scheduler_test_util.h"

namespace specnode::scheduler_test {
namespace {

TEST_F(SchedulerTest, StopStringsCutTheTextAndHoldBackPrefixes) {
  auto runner = Runner(64 << 20);
  SpeculativeEngine engine(runner.get(), {}, {});
  Collector sink;
  Scheduler sched(&engine, &model_->tokenizer(), {}, std::ref(sink));
  auto free_run = sched.Submit(Request(3, 30));
  ASSERT_TRUE(free_run.ok());
  const std::string text = sink.Wait(free_run->handle).last.text;
  ASSERT_GT(text.size(), 8u);
  GenerationRequest g = Request(3, 30);
  g.stop = {text.substr(5, 3), "never-appears-in-output"};
  auto stopped = sched.Submit(g);
  ASSERT_TRUE(stopped.ok());
  const auto rec = sink.Wait(stopped->handle);
  EXPECT_EQ(rec.last.finish, FinishKind::kStopString);
  EXPECT_EQ(rec.text, text.substr(0, text.find(text.substr(5, 3))));
  EXPECT_EQ(rec.last.text, rec.text);
}

// A speculative step accepts several tokens at once (here: the draft is the target, K = 4,
// so every decode step gives 5): a stop string completed by one of them ends the request at
// that token — the tokens after it are neither sent nor counted, as when decoding one token
// at a time.
TEST_F(SchedulerTest, StopStringEndsTheOutputAtTheTokenThatCompletesIt) {
  auto runner = Runner(64 << 20);
  KvOptions kv;
  kv.mode = KvMode::kFull;
  kv.capacity_bytes = 64 << 20;
  auto drafter = ModelDrafter::Load(path_, *model_, pool_.get(), kv);
  ASSERT_TRUE(drafter.ok()) << drafter.status();
  auto controller = SpecController::Create({});
  ASSERT_TRUE(controller.ok()) << controller.status();
  SpecEngineOptions eo;
  eo.adaptive = false;
  eo.fixed_k = 4;
  SpeculativeEngine engine(runner.get(), {{drafter->get(), controller->get()}}, eo);
  Collector sink;
  Scheduler sched(&engine, &model_->tokenizer(), {}, std::ref(sink));
  auto free_run = sched.Submit(Request(3, 30));
  ASSERT_TRUE(free_run.ok());
  const auto all = sink.Wait(free_run->handle);
  ASSERT_EQ(all.tokens.size(), 30u);
  // Stop at the text of a token inside a speculative step (a one-byte ASCII token, so that
  // the text is its bytes): the request's tokens are those up to the one whose bytes
  // complete the stop string's first occurrence.
  auto ascii = [](const std::string& b) {
    return !b.empty() && std::all_of(b.begin(), b.end(), [](char c) { return c >= 0; });
  };
  size_t pick = 2;
  while (pick < all.tokens.size() && !ascii(model_->tokenizer().TokenToBytes(all.tokens[pick]))) {
    ++pick;
  }
  ASSERT_LT(pick, all.tokens.size());
  const std::string stop = model_->tokenizer().TokenToBytes(all.tokens[pick]);
  std::string text;
  size_t want = 0;
  while (text.find(stop) == std::string::npos) {
    text += model_->tokenizer().TokenToBytes(all.tokens[want++]);
  }
  ASSERT_LE(want, pick + 1);
  GenerationRequest g = Request(3, 30);
  g.stop = {stop};
  auto stopped = sched.Submit(g);
  ASSERT_TRUE(stopped.ok());
  const auto rec = sink.Wait(stopped->handle);
  EXPECT_EQ(rec.last.finish, FinishKind::kStopString);
  EXPECT_EQ(rec.tokens, std::vector<int32_t>(all.tokens.begin(), all.tokens.begin() + want));
  EXPECT_EQ(rec.last.stats.completion_tokens, static_cast<int32_t>(want));
  EXPECT_EQ(rec.text.find(stop), std::string::npos);  // cut before it
  EXPECT_GT(rec.last.stats.accepted, 0);              // the steps really were speculative
}

}  // namespace
}  // namespace specnode::scheduler_test
