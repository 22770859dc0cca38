// Issue 16's determinism guarantees on the speculative engine: a seed gives the same text
// whatever speculation does (drafter, K, batch mates, preemption, a restart), and greedy
// output in mixed KV mode does not depend on how a sequence was stepped.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "coordinator/spec_engine.h"
#include "gtest/gtest.h"
#include "tests/coordinator/spec_engine_test_util.h"

namespace specnode {
namespace {

using spec_engine_test::NewController;
using spec_engine_test::SpecEngineTest;

// Issue 16: a seed gives the same text whatever speculation does. Under the match rule
// (the default) sampled output with top-k / top-p equals target-only output with the same
// seeds, for every drafter (sampled model drafts, the self-draft, deterministic n-gram), K
// fixed at 1..4 or adaptive, each prompt alone or with batch mates, and a fresh engine and
// cache for every run (a restarted node). The ratio rule does not promise this, and the
// last check shows that the comparison can tell: there the text changes with the drafter.
TEST_F(SpecEngineTest, SeededTextIsTheSameWithEveryDrafterKAndBatch) {
  auto requests = Prompts(0.8f, 40, 7);
  for (SpecRequest& r : requests) {
    r.sampling.top_k = 40;
    r.sampling.top_p = 0.9f;
  }
  auto base_runner = MakeRunner("full");
  SpeculativeEngine base(base_runner.get(), {}, {});
  const auto expected = Run(base, requests);
  for (const std::string name :
       {"draft5", "draft30", "draft100", "self1", "self2", "ngram", "suffix", "recycle"}) {
    for (int k : {0, 1, 2, 3, 4}) {  // 0: adaptive
      auto runner = MakeRunner("full");
      auto drafter = MakeDrafter(name, "full");
      auto controller = NewController();
      SpecEngineOptions options;
      options.adaptive = k == 0;
      options.fixed_k = k;
      options.pool = pool_.get();
      SpeculativeEngine engine(runner.get(), {{drafter.get(), controller.get()}}, options);
      EXPECT_EQ(Run(engine, requests, runner.get()), expected) << name << " K " << k;
      if (k == 3) {
        // Alone, without batch mates, on the same (warm) engine.
        for (size_t i = 0; i < requests.size(); ++i) {
          EXPECT_EQ(Run(engine, {requests[i]}), std::vector<std::vector<int32_t>>{expected[i]})
              << name << " alone, prompt " << i;
        }
      }
    }
  }
  int differ = 0;
  for (const std::string name : {"draft30", "draft100"}) {
    auto runner = MakeRunner("full");
    auto drafter = MakeDrafter(name, "full");
    auto controller = NewController();
    SpecEngineOptions options;
    options.adaptive = false;
    options.fixed_k = 4;
    options.acceptance = AcceptanceRule::kRatio;
    SpeculativeEngine engine(runner.get(), {{drafter.get(), controller.get()}}, options);
    const auto got = Run(engine, requests, runner.get());
    for (size_t i = 0; i < got.size(); ++i) differ += got[i] != expected[i];
  }
  EXPECT_GT(differ, 0) << "the ratio rule gave target-only text everywhere: the check is blind";
}

// A preempted sequence continues with the same text: swapped out and back (Park/Resume),
// or dropped and recomputed from prompt + output so far (what the scheduler does without
// a host tier), at any point of the generation.
TEST_F(SpecEngineTest, SeededTextSurvivesPreemption) {
  SpecRequest request = Prompts(0.9f, 36, 11)[1];
  request.sampling.top_k = 20;
  auto base_runner = MakeRunner("mixed-tight");
  SpeculativeEngine base(base_runner.get(), {}, {});
  const std::vector<int32_t> expected = Run(base, {request})[0];
  for (int cut : {1, 7, 20}) {
    auto runner = MakeRunner("mixed-tight");
    auto drafter = MakeDrafter("draft30", "mixed-tight");
    auto controller = NewController();
    SpeculativeEngine engine(runner.get(), {{drafter.get(), controller.get()}}, {});
    ASSERT_TRUE(engine.Start(request).ok());
    std::vector<int32_t> got;
    std::vector<SeqStepResult> results;
    while (static_cast<int>(got.size()) < cut) {
      ASSERT_TRUE(engine.Step(std::vector<SeqId>{request.id}, &results).ok());
      got.insert(got.end(), results[0].tokens.begin(), results[0].tokens.end());
      ASSERT_EQ(results[0].finish, FinishReason::kNone);
    }
    // Swap out and in, one more step, then recompute: drop the sequence, start it again
    // from its prompt + output, as the scheduler's preemption does.
    ASSERT_TRUE(engine.Park(request.id).ok());
    ASSERT_TRUE(engine.Resume(request.id).ok());
    ASSERT_TRUE(engine.Step(std::vector<SeqId>{request.id}, &results).ok());
    got.insert(got.end(), results[0].tokens.begin(), results[0].tokens.end());
    engine.Finish(request.id);
    SpecRequest again = request;
    again.prompt.insert(again.prompt.end(), got.begin(), got.end());
    again.max_new_tokens = request.max_new_tokens - static_cast<int32_t>(got.size());
    ASSERT_GT(again.max_new_tokens, 0);
    const auto rest = Run(engine, {again});
    got.insert(got.end(), rest[0].begin(), rest[0].end());
    EXPECT_EQ(got, expected) << "preempted after " << cut << " tokens";
  }
}

// Issue 16, item 11: in mixed mode greedy output is the same however the sequence was
// stepped — alone or with batch mates whose prefill chunks share the step's budget, with
// any drafter's history — and a prompt longer than the pass boundary is prefilled in
// pieces that each fit beside the demoted rest.
TEST_F(SpecEngineTest, MixedKvGreedyDoesNotDependOnBatchMatesOrHistory) {
  auto requests = Prompts(0.0f, 48);
  // A long prompt (5x the boundary of mixed-tight) among the short ones.
  SpecRequest long_prompt = requests[0];
  long_prompt.id = 9;
  long_prompt.prompt.clear();
  for (int i = 0; i < 40; ++i) long_prompt.prompt.push_back(20 + (i * 37) % 200);
  requests.push_back(long_prompt);
  std::vector<std::vector<int32_t>> alone;
  for (const SpecRequest& r : requests) {
    auto runner = MakeRunner("mixed-tight");
    SpeculativeEngine engine(runner.get(), {}, {});
    alone.push_back(Run(engine, {r})[0]);
  }
  auto runner = MakeRunner("mixed-tight");
  auto drafter = MakeDrafter("ngram", "mixed-tight");
  auto controller = NewController();
  SpecEngineOptions options;
  options.prefill_budget = 7;
  SpeculativeEngine engine(runner.get(), {{drafter.get(), controller.get()}}, options);
  // Twice on the same engine: the second time the n-gram drafter has a history.
  for (int round = 0; round < 2; ++round) {
    EXPECT_EQ(Run(engine, requests, runner.get()), alone) << "round " << round;
  }
}

}  // namespace
}  // namespace specnode
