// The speculative engine's routing across groups and shadow scoring (coordinator/
// spec_engine_route.cc) on tiny models: first tries and moves never change a greedy text,
// prompt lookup learnt on other groups' steps and on its own direct steps, a greedy replay
// equal to a real run.
#include "coordinator/spec_engine.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/coordinator/spec_controller_test_util.h"
#include "tests/coordinator/spec_engine_test_util.h"

namespace specnode {
namespace {

using spec_engine_test::NewController;
using spec_engine_test::SpecEngineTest;
using spec_engine_test::TargetOptions;
using spec_engine_test::TempPath;

// With several groups, each drafter gets a first try and routing (first tries, moves,
// periodic exploration) never changes a greedy text. Which group is
// better on tiny models depends on timings (a draft as large as its target never pays), so
// the test checks the wiring; the choice itself is DomainRouter::ChooseGroupFor's
// (domain_router_test.cc).
TEST_F(SpecEngineTest, SequencesAreRoutedAndTextIsUnchanged) {
  auto base_runner = MakeRunner("dense");
  SpeculativeEngine base(base_runner.get(), {}, {});
  auto runner = MakeRunner("dense");
  auto a = MakeDrafter("draft5", "dense");
  auto b = MakeDrafter("draft100", "dense");
  auto ca = NewController();
  auto cb = NewController();
  SpecEngineOptions options;
  options.explore_every = 4;
  SpeculativeEngine engine(runner.get(), {{a.get(), ca.get()}, {b.get(), cb.get()}}, options);
  for (int i = 0; i < 24; ++i) {
    auto r = Prompts(0.0f, 12)[i % 3];
    r.id = 100 + i;
    r.domain = i % 2 ? "code" : "chat";
    auto plain = r;
    EXPECT_EQ(Run(engine, {r}), Run(base, {plain})) << "sequence " << i;
  }
  // Each group had a first try (while nothing bounded it: no timings yet); past that, a
  // group whose a = 1 bound cannot beat the other's measured rate need not be tried on a
  // domain (on tiny models a draft costs as much as its target).
  const std::vector<int64_t> starts = engine.GroupStarts();
  EXPECT_GT(starts[0], 0);
  EXPECT_GT(starts[1], 0);
  EXPECT_EQ(starts[0] + starts[1], 24);
  for (SpecController* c : {ca.get(), cb.get()}) {
    int64_t learned = 0;
    for (const DomainSnapshot& d : c->AllDomains()) learned += d.spec_steps + d.direct_decisions;
    EXPECT_GT(learned, 0);
  }
}

// Shadow scoring: a prompt-lookup group learns a domain's acceptance on the sequences a
// draft model serves, without a first try of its own, and exactly (greedy): its recorded
// outcomes are what verifying its proposals would have given.
TEST_F(SpecEngineTest, PromptLookupIsScoredOnOtherGroupsSteps) {
  auto runner = MakeRunner("dense");
  auto model = MakeDrafter("draft5", "dense");
  auto lookup = MakeDrafter("ngram", "dense");
  auto c_model = NewController();
  auto c_lookup = NewController();
  // The model is known on "code" (so the lookup gets no first try there).
  spec_test::SetTimings(*c_model, 1, 10, 0, 10);
  for (int i = 0; i < 64; ++i) ASSERT_TRUE(c_model->RecordStep("code", 4, 4).ok());
  SpeculativeEngine engine(runner.get(),
                           {{lookup.get(), c_lookup.get()}, {model.get(), c_model.get()}}, {});
  auto r = Prompts(0.0f, 200)[1];
  r.domain = "code";
  // A prompt long enough for its catch-up to be timed (kMinCatchupSample), repeating.
  for (int i = 0; i < 8; ++i) r.prompt.insert(r.prompt.end(), {1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
  ASSERT_TRUE(engine.Start(r).ok());
  EXPECT_EQ(engine.Group(r.id), 1);
  // Fewer decode steps than the move check (kRouteCheckSteps) needs: it stays on the model.
  std::vector<SeqStepResult> results;
  const SeqId ids[] = {r.id};
  while (engine.Stats(r.id).steps < SpeculativeEngine::kRouteCheckSteps - 1) {
    ASSERT_TRUE(engine.Step(ids, &results).ok());
    ASSERT_EQ(results[0].finish, FinishReason::kNone);
  }
  EXPECT_EQ(engine.Group(r.id), 1);
  const DomainSnapshot shadow = c_lookup->Snapshot("code");
  EXPECT_EQ(shadow.decisions, 0);  // never asked for a K: it served no step
  EXPECT_GT(shadow.spec_steps, 0);
  EXPECT_LE(shadow.accepted, shadow.drafted);
  // The model's catch-up on the prompt was timed; the lookup has none (it never catches up).
  EXPECT_TRUE(c_model->PredictCatchupSeconds(100).has_value());
  EXPECT_FALSE(c_lookup->PredictCatchupSeconds(100).has_value());
  // Target timings reached it, so it has an estimate the router can weigh.
  EXPECT_TRUE(c_lookup->DirectSeconds().has_value());
  EXPECT_GT(c_lookup->ExpectedGoodput("code"), 0.0);
}

// A cheap drafter that proposes wrong tokens until the sequence is `good_from` tokens long,
// then the target's own greedy continuation (`text`, the whole greedy sequence).
class ScriptedDrafter final : public Drafter {
 public:
  ScriptedDrafter(std::vector<int32_t> text, size_t good_from)
      : text_(std::move(text)), good_from_(good_from) {}
  std::string name() const override { return "scripted"; }
  absl::Status Propose(std::span<const DraftRequest> requests,
                       std::vector<Draft>* drafts) override {
    drafts->assign(requests.size(), Draft{});
    for (size_t i = 0; i < requests.size(); ++i) {
      const size_t at = requests[i].context.size();
      for (size_t j = at; j < at + requests[i].k && j < text_.size(); ++j) {
        const int32_t wrong = text_[j] == 0 ? 1 : text_[j] - 1;
        (*drafts)[i].tokens.push_back(at < good_from_ ? wrong : text_[j]);
      }
    }
    return absl::OkStatus();
  }
  bool CheapToShadow() const override { return true; }
  void Free(SeqId) override {}

 private:
  std::vector<int32_t> text_;
  size_t good_from_;
};

// A cheap drafter's own direct steps are scored as the run it would have made: a domain
// disabled by a bad start (its drafts wrong at first) is re-enabled once they pass, long
// before probing alone would (every probe_every direct steps), and speculates again.
TEST_F(SpecEngineTest, ADisabledCheapDrafterIsReEnabledByScoringItsOwnDirectSteps) {
  SpecRequest r = Prompts(0.0f, 120)[0];
  auto base_runner = MakeRunner("dense");
  SpeculativeEngine base(base_runner.get(), {}, {});
  const auto generated = Run(base, {r});
  std::vector<int32_t> text = r.prompt;
  text.insert(text.end(), generated[0].begin(), generated[0].end());
  const size_t good_from = r.prompt.size() + 20;
  ScriptedDrafter drafter(text, good_from);
  SpecControllerConfig config;
  config.probe_every = 1000;  // no probe in this run: only the scoring can re-enable
  auto controller = SpecController::Create(config).value();
  spec_test::SetTimings(*controller, 1, 10, 0, 10);
  auto runner = MakeRunner("dense");
  SpeculativeEngine engine(runner.get(), {{&drafter, controller.get()}}, {});
  EXPECT_EQ(Run(engine, {r}, runner.get()), generated);
  const DomainSnapshot snap = controller->Snapshot(r.domain);
  EXPECT_GE(snap.disables, 1);
  EXPECT_GE(snap.reenables, 1);
  EXPECT_NE(snap.mode, SpecMode::kDisabled);
  EXPECT_GT(snap.accepted, 40);  // the good stretch was speculated (and its shadow scored)
}

// Greedy shadow scoring replays the run prompt lookup would have made: its controller
// records the same outcomes as a real prompt-lookup run of the sequence at the same K
// (up to the last steps, which a real run clamps to max_new_tokens and a replay leaves
// waiting for tokens that never come).
TEST_F(SpecEngineTest, ShadowScoringReplaysARealPromptLookupRun) {
  SpecControllerConfig k4;
  k4.k_min = k4.k_max = k4.k_initial = 4;
  SpecRequest r = Prompts(0.0f, 96)[2];
  r.domain = "edit";
  r.prompt.insert(r.prompt.end(), {17, 300, 42, 5, 120, 121, 122, 9, 17, 17, 300, 42});
  // The real run: prompt lookup alone at a fixed K of 4.
  auto runner_a = MakeRunner("dense");
  auto lookup_a = MakeDrafter("ngram", "dense");
  auto ctl_a = SpecController::Create(k4).value();
  SpecEngineOptions fixed;
  fixed.adaptive = false;
  fixed.fixed_k = 4;
  SpeculativeEngine a(runner_a.get(), {{lookup_a.get(), ctl_a.get()}}, fixed);
  const auto tokens_a = Run(a, {r});
  // The replay: the sequence served by a draft model, prompt lookup shadowing it.
  auto runner_b = MakeRunner("dense");
  auto lookup_b = MakeDrafter("ngram", "dense");
  auto model = MakeDrafter("draft5", "dense");
  auto ctl_b = SpecController::Create(k4).value();
  auto ctl_model = NewController();
  spec_test::SetTimings(*ctl_model, 1, 10, 0, 10);
  for (int i = 0; i < 64; ++i) ASSERT_TRUE(ctl_model->RecordStep("edit", 4, 4).ok());
  SpecEngineOptions stay;
  stay.route_moves = false;
  SpeculativeEngine b(runner_b.get(),
                      {{lookup_b.get(), ctl_b.get()}, {model.get(), ctl_model.get()}}, stay);
  EXPECT_EQ(Run(b, {r}), tokens_a);
  EXPECT_EQ(b.GroupStarts()[1], 1);
  const DomainSnapshot real = ctl_a->Snapshot("edit"), shadow = ctl_b->Snapshot("edit");
  ASSERT_GE(real.spec_steps, 10);
  EXPECT_LE(shadow.spec_steps, real.spec_steps);
  EXPECT_GE(shadow.spec_steps, real.spec_steps - 2);
  EXPECT_LE(shadow.accepted, real.accepted);
  EXPECT_GE(shadow.accepted, real.accepted - 8);
  EXPECT_NEAR(shadow.acceptance, real.acceptance, 0.05);
  EXPECT_NEAR(shadow.proposal_rate, real.proposal_rate, 0.05);
}

}  // namespace
}  // namespace specnode
