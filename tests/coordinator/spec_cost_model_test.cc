// SpecController's cost model (spike filter, verify line through the direct step, catch-up
// rate, the a = 1 bound, probes' cost) and run-aware K.
#include <gtest/gtest.h>

#include "coordinator/spec_controller.h"
#include "tests/coordinator/spec_controller_test_util.h"

namespace specnode {
namespace {

using namespace spec_test;

// Once a direct step is timed, the verify line goes through it and only its slope is
// fitted: a verification of zero drafts is a direct step. (A free two-parameter fit of
// noisy per-k samples put the intercept at half the direct time and the slope at twice the
// real one on SmolLM2, and K = 1 looked best even at 95% acceptance.)
TEST(SpecControllerTest, VerifyLineIsAnchoredAtTheDirectStep) {
  auto ctl = Make(ExactTimings());
  ASSERT_TRUE(ctl->RecordVerifyTime(2, 9e-3).ok());
  ASSERT_TRUE(ctl->RecordVerifyTime(8, 40e-3).ok());
  // Without a direct time: the origin line (c1 = (2·9 + 8·40) / 68 ms).
  EXPECT_NEAR(*ctl->PredictVerifySeconds(1), 338.0 / 68 * 1e-3, 1e-12);
  ASSERT_TRUE(ctl->RecordDirectTime(10e-3).ok());
  // Through (0, 10 ms): c1 = (2·(9 − 10) + 8·(40 − 10)) / 68 = 3.5 ms per draft.
  EXPECT_NEAR(*ctl->PredictVerifySeconds(1), 13.5e-3, 1e-12);
  EXPECT_NEAR(*ctl->PredictVerifySeconds(4), 24e-3, 1e-12);
  for (int k = 0; k <= 8; ++k) EXPECT_GE(*ctl->PredictVerifySeconds(k), 10e-3 - 1e-15) << k;
  // One verify sample above the direct time: the line between them.
  auto one = Make(ExactTimings());
  ASSERT_TRUE(one->RecordVerifyTime(4, 18e-3).ok());
  EXPECT_NEAR(*one->PredictVerifySeconds(2), 18e-3, 1e-12);  // flat until direct is known
  ASSERT_TRUE(one->RecordDirectTime(10e-3).ok());
  EXPECT_NEAR(*one->PredictVerifySeconds(2), 14e-3, 1e-12);
  EXPECT_NEAR(*one->PredictVerifySeconds(8), 26e-3, 1e-12);
}

// One sequence per step is memory-bound (a draft row is cheap), sixteen are compute-bound
// (a draft row costs a direct row): each batch class keeps its own timings, and K follows
// the class SetBatchSize selects. A class without timings borrows the nearest smaller one.
TEST(SpecControllerTest, EachBatchClassHasItsOwnCostModel) {
  EXPECT_EQ(SpecController::BatchClass(1), 0);
  EXPECT_EQ(SpecController::BatchClass(3), 1);
  EXPECT_EQ(SpecController::BatchClass(4), 2);
  EXPECT_EQ(SpecController::BatchClass(16), 3);
  auto ctl = Make(ExactTimings());
  SetTimings(*ctl, 0.01, 10, 2, 10);  // alone: 2 ms per draft against a 10 ms step
  Feed(*ctl, "chat", 0.7, 200);
  const int alone = ctl->ChooseK("chat");
  EXPECT_GT(alone, 0);
  ctl->SetBatchSize(16);  // no batch timings yet: the single-sequence model's K
  EXPECT_EQ(ctl->ChooseK("chat"), alone);
  // A sequence's share of a 16-sequence pass: every row costs the same 4 ms.
  SetTimings(*ctl, 0.01, 4, 4, 4);
  EXPECT_NEAR(*ctl->PredictVerifySeconds(2), 12e-3, 1e-12);
  EXPECT_EQ(ctl->ChooseK("chat"), 0) << "at 70% a draft row does not pay for itself";
  ctl->SetBatchSize(1);
  EXPECT_NEAR(*ctl->PredictVerifySeconds(2), 14e-3, 1e-12);
  EXPECT_EQ(ctl->ChooseK("chat"), alone);
  ctl->SetBatchSize(5);  // class 2 has no timings: borrows class 1's, which has none: class 0
  EXPECT_NEAR(*ctl->PredictVerifySeconds(2), 14e-3, 1e-12);
}

// Bursty acceptance: fresh guesses are accepted half the time, continuations of a fully
// accepted step 95% of the time. The domain's K comes from the pooled acceptance; a
// sequence in a run drafts longer and a fresh one shorter.
TEST(SpecControllerTest, RunAwareKFollowsTheSequenceState) {
  SpecControllerConfig c = ExactTimings();
  c.k_max = 12;
  auto ctl = Make(c);
  // Free drafting, verify 10 ms + 2 ms per draft, direct 10 ms.
  SetTimings(*ctl, 0.0, 10.0, 2.0, 10.0);
  ScriptedDrafter fresh(0.5), run(0.95);
  for (int i = 0; i < 256; ++i) {
    ASSERT_TRUE(ctl->RecordStep("code", 1, fresh.Next() ? 1 : 0, false).ok());
    ASSERT_TRUE(ctl->RecordStep("code", 1, run.Next() ? 1 : 0, true).ok());
  }
  const DomainSnapshot s = ctl->Snapshot("code");
  EXPECT_NEAR(s.fresh_acceptance, 0.5, 0.02);
  EXPECT_NEAR(s.run_acceptance, 0.95, 0.02);
  // G(K) = E(K) / (10 + 2K) ms: at a = 0.5, K = 1 and 2 both give 125/s and K = 3 117/s,
  // so K <= 2 (the window's estimate is within 0.02 of 0.5); at a = 0.95 the best is
  // K = 10 (8.6 / 30 ms = 287/s against 2.85 / 14 ms = 204/s at K = 2).
  const int k_fresh = ctl->ChooseK("code", false);
  const int k_run = ctl->ChooseK("code", true);
  EXPECT_LE(k_fresh, 2);
  EXPECT_GE(k_run, 8);
  EXPECT_EQ(s.k, k_fresh);
  EXPECT_EQ(s.k_in_run, k_run);
  // Turned off, both states get the pooled K.
  c.run_aware = false;
  auto pooled = Make(c);
  SetTimings(*pooled, 0.0, 10.0, 2.0, 10.0);
  ScriptedDrafter f2(0.5), r2(0.95);
  for (int i = 0; i < 256; ++i) {
    ASSERT_TRUE(pooled->RecordStep("code", 1, f2.Next() ? 1 : 0, false).ok());
    ASSERT_TRUE(pooled->RecordStep("code", 1, r2.Next() ? 1 : 0, true).ok());
  }
  EXPECT_EQ(pooled->ChooseK("code", false), pooled->ChooseK("code", true));
}

// A pass preempted by another process takes many times its normal time; the median of the
// last timing_median samples keeps one spike out of the model.
TEST(SpecControllerTest, TimingSpikesAreFiltered) {
  SpecControllerConfig c;
  c.timing_alpha = 1.0;
  c.timing_median = 5;
  auto ctl = Make(c);
  for (double ms : {10.0, 10.0, 10.0, 95.0, 10.0}) {
    ASSERT_TRUE(ctl->RecordDirectTime(ms * 1e-3).ok());
    ASSERT_TRUE(ctl->RecordVerifyTime(4, (ms + 8.0) * 1e-3).ok());
  }
  EXPECT_NEAR(*ctl->DirectSeconds(), 10e-3, 1e-12);
  EXPECT_NEAR(*ctl->PredictVerifySeconds(4), 18e-3, 1e-12);
  // A lasting change gets through once it is the majority of the window.
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(ctl->RecordDirectTime(20e-3).ok());
  EXPECT_NEAR(*ctl->DirectSeconds(), 20e-3, 1e-12);
  c.timing_median = 0;
  EXPECT_FALSE(SpecController::Create(c).ok());
}

// Fresh guesses accepted 15% of the time do not pay for a verification (G(1) = 1.15 /
// 12 ms = 96/s < 100/s direct) while runs (95%) do: fresh sequences go direct — counted
// and probed like any direct decision — and sequences in a run keep drafting long.
TEST(SpecControllerTest, FreshGuessesThatDoNotPayGoDirect) {
  SpecControllerConfig c = ExactTimings();
  c.k_max = 12;
  c.probe_overhead_budget = 0.0;  // probe every probe_every direct decisions
  auto ctl = Make(c);
  SetTimings(*ctl, 0.0, 10.0, 2.0, 10.0);
  ScriptedDrafter fresh(0.15), run(0.95);
  for (int i = 0; i < 256; ++i) {
    ASSERT_TRUE(ctl->RecordStep("chat", 1, fresh.Next() ? 1 : 0, false).ok());
    ASSERT_TRUE(ctl->RecordStep("chat", 1, run.Next() ? 1 : 0, true).ok());
  }
  EXPECT_NE(ctl->Snapshot("chat").mode, SpecMode::kDisabled);  // the domain as a whole pays
  EXPECT_GE(ctl->ChooseK("chat", true), 8);
  int direct = 0, probes = 0;
  for (int i = 0; i < 2 * c.probe_every + 2; ++i) {
    const int k = ctl->ChooseK("chat", false);
    direct += k == 0;
    probes += k == c.probe_k;
  }
  EXPECT_EQ(probes, 2);
  EXPECT_EQ(direct, 2 * c.probe_every);
  EXPECT_EQ(ctl->Snapshot("chat").k, 0);
}

// The catch-up rate (seconds per token a drafter fed before drafting) and the a = 1 bound
// the router holds untried groups to.
TEST(SpecControllerTest, CatchUpRateAndBestCase) {
  auto ctl = spec_test::Make(spec_test::ExactTimings());
  EXPECT_FALSE(ctl->PredictCatchupSeconds(100).has_value());
  EXPECT_EQ(ctl->PredictCatchupSeconds(0).value(), 0.0);
  EXPECT_FALSE(ctl->BestCaseGoodput().has_value());
  EXPECT_EQ(ctl->RecordCatchupTime(0, 1.0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ctl->RecordCatchupTime(10, -1.0).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(ctl->RecordCatchupTime(200, 0.5).ok());
  EXPECT_NEAR(ctl->PredictCatchupSeconds(100).value(), 0.25, 1e-12);
  ASSERT_TRUE(ctl->RecordCatchupTime(100, 0.1).ok());  // alpha 1: the newest rate
  EXPECT_NEAR(ctl->PredictCatchupSeconds(100).value(), 0.1, 1e-12);
  spec_test::SetTimings(*ctl, 1, 10, 0, 10);
  // K = 8 (k_max) at a = 1: 9 tokens in 8 + 10 ms.
  EXPECT_NEAR(ctl->BestCaseGoodput().value(), 9.0 / 0.018, 1e-9);
}

// A direct (disabled) domain's goodput pays for its probes, and a drafter with state also
// for catching up at each probe on what was decoded since the last.
TEST(SpecControllerTest, DirectGoodputCountsTheProbesCatchUp) {
  auto lookup = spec_test::Make(spec_test::ExactTimings());
  auto model = spec_test::Make(spec_test::ExactTimings());
  for (SpecController* c : {lookup.get(), model.get()}) {
    spec_test::SetTimings(*c, 1, 10, 0, 10);
    for (int i = 0; i < 300; ++i) ASSERT_TRUE(c->RecordStep("legal", 1, 0).ok());
    ASSERT_EQ(c->Snapshot("legal").mode, SpecMode::kDisabled);
  }
  ASSERT_TRUE(model->RecordCatchupTime(100, 0.1).ok());  // 1 ms per token
  EXPECT_LT(model->ExpectedGoodput("legal"), lookup->ExpectedGoodput("legal"));
  EXPECT_LT(lookup->ExpectedGoodput("legal"), 100.0);  // the probes' cost
}

}  // namespace
}  // namespace specnode
