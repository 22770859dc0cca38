// SpecController: acceptance estimates, the cost model, and the decisions they drive,
// with scripted acceptance sequences.
#include "coordinator/spec_controller.h"
#include "coordinator/domain_router.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "tests/coordinator/spec_controller_test_util.h"

namespace specnode {
namespace {

using namespace spec_test;

TEST(ExpectedTokensTest, Formula) {
  EXPECT_DOUBLE_EQ(ExpectedTokensPerStep(0.5, 1), 1.5);
  EXPECT_NEAR(ExpectedTokensPerStep(0.9, 3), 1 + 0.9 + 0.81 + 0.729, 1e-12);
  EXPECT_DOUBLE_EQ(ExpectedTokensPerStep(1.0, 4), 5.0);
  EXPECT_DOUBLE_EQ(ExpectedTokensPerStep(0.0, 4), 1.0);
  EXPECT_DOUBLE_EQ(ExpectedTokensPerStep(0.7, 0), 1.0);
}

TEST(SpecControllerTest, AcceptanceIsGeometricMle) {
  auto ctl = Make();
  ASSERT_TRUE(ctl->RecordStep("d", 4, 2).ok());  // 2 passed + 1 failed = 3 evaluated
  ASSERT_TRUE(ctl->RecordStep("d", 4, 4).ok());  // 4 passed, none failed
  ASSERT_TRUE(ctl->RecordStep("d", 3, 0).ok());  // 1 failed
  ASSERT_TRUE(ctl->RecordStep("d", 0, 0).ok());  // direct step: ignored
  DomainSnapshot s = ctl->Snapshot("d");
  EXPECT_EQ(s.window_positions, 8);
  EXPECT_DOUBLE_EQ(s.acceptance, 6.0 / 8.0);
  EXPECT_EQ(s.spec_steps, 3);
  EXPECT_EQ(s.drafted, 11);
  EXPECT_EQ(s.accepted, 6);
}

TEST(SpecControllerTest, WarmupAndNoTimingsUseInitialK) {
  auto ctl = Make();
  EXPECT_EQ(ctl->Snapshot("new").mode, SpecMode::kWarmup);
  EXPECT_EQ(ctl->ChooseK("chat"), 4);
  Feed(*ctl, "chat", 0.9, 15);
  EXPECT_EQ(ctl->Snapshot("chat").mode, SpecMode::kWarmup);
  EXPECT_EQ(ctl->ChooseK("chat"), 4);
  Feed(*ctl, "chat", 0.9, 1);
  // Enough observations, but no timings: the cost model is not ready -> k_initial.
  EXPECT_EQ(ctl->Snapshot("chat").mode, SpecMode::kFree);
  EXPECT_EQ(ctl->ChooseK("chat"), 4);
  EXPECT_EQ(ctl->ExpectedGoodput("chat"), 0.0);  // unknown without timings
  // Only verify times: still not ready (both are required).
  ASSERT_TRUE(ctl->RecordVerifyTime(2, 0.01).ok());
  EXPECT_EQ(ctl->ChooseK("chat"), 4);
}

TEST(SpecControllerTest, HighAcceptanceStaysSpeculativeAndKGrows) {
  auto ctl = Make();
  // Draft 2 ms/token, verify 10 ms + 0.5 ms/K, direct 10 ms.
  SetTimings(*ctl, 2.0, 10.0, 0.5, 10.0);
  ScriptedDrafter drafter(0.65);
  // a = 0.65: G(1) = 1.65/12.5 ms = 132/s, G(2) = 2.0725/15 ms = 138/s,
  // G(3) = 2.347/17.5 ms = 134/s -> K = 2.
  Feed(*ctl, "chat", 0.65, 256);
  EXPECT_EQ(ctl->Snapshot("chat").mode, SpecMode::kFree);
  const int k_low = ctl->ChooseK("chat");
  EXPECT_EQ(k_low, 2);
  // Acceptance climbs to 0.95: G(7) = 6.73/27.5 ms = 245/s < G(8) = 7.40/30 ms = 247/s.
  drafter.set_rate(0.95);
  std::vector<int> ks = Drive(*ctl, "chat", drafter, 300);
  for (int k : ks) EXPECT_GT(k, 0) << "a free domain never goes direct";
  const DomainSnapshot s = ctl->Snapshot("chat");
  EXPECT_EQ(s.mode, SpecMode::kFree);
  EXPECT_NEAR(s.acceptance, 0.95, 0.01);
  EXPECT_EQ(ctl->ChooseK("chat"), 8);
  EXPECT_GT(ks.back(), k_low);
  EXPECT_EQ(s.direct_decisions, 0);
  EXPECT_EQ(s.disables, 0);
}

// Two controllers of drafters on "code": verify 10 ms + 0.1 ms per K, direct 10 ms, drafting
// ms_a / ms_b per token, acceptance a / b.
std::pair<std::unique_ptr<SpecController>, std::unique_ptr<SpecController>> TwoOnCode(double ms_a,
                                                                                      double a,
                                                                                      double ms_b,
                                                                                      double b) {
  auto first = Make();
  auto second = Make();
  SetTimings(*first, ms_a, 10.0, 0.1, 10.0);
  SetTimings(*second, ms_b, 10.0, 0.1, 10.0);
  Feed(*first, "code", a, 256);
  Feed(*second, "code", b, 256);
  return {std::move(first), std::move(second)};
}

TEST(SpecControllerTest, KFollowsRelativeCostOfDrafting) {
  // Same acceptance (0.8), two drafters: cheap (prompt lookup-like) vs expensive.
  auto [cheap, dear] = TwoOnCode(0.1, 0.8, 5.0, 0.8);
  // cheap: G(8) = 4.33/11.6 ms = 373/s is the best. dear: G(1) = 1.8/15.1 ms = 119/s,
  // G(2) = 2.44/20.2 ms = 121/s, G(3) = 2.95/25.3 ms = 117/s -> K = 2.
  EXPECT_EQ(cheap->ChooseK("code"), 8);
  EXPECT_EQ(dear->ChooseK("code"), 2);
  EXPECT_GT(cheap->ExpectedGoodput("code"), dear->ExpectedGoodput("code"));
  const double a = dear->Snapshot("code").acceptance;
  EXPECT_NEAR(dear->ExpectedGoodput("code"), ExpectedTokensPerStep(a, 2) / 20.2e-3, 1e-6);
}

// A drafter that proposes in only some of the steps it is asked to (prompt lookup without a
// match) is rated by what those steps get: π E(K) + 1 − π tokens in t_draft(K) + π
// t_verify(K) + (1 − π) t_direct, not by its proposals' acceptance alone; and the router then
// prefers a drafter that always proposes at a lower acceptance where that is faster.
TEST(SpecControllerTest, ExpectedGoodputCountsStepsWithoutAProposal) {
  auto [lookup, model] = TwoOnCode(0.1, 0.8, 2.0, 0.7);
  const double g_all = lookup->ExpectedGoodput("code");
  EXPECT_EQ(lookup->Snapshot("code").proposal_rate, 1.0);  // none recorded: every step
  const SpecController* both[] = {lookup.get(), model.get()};
  EXPECT_EQ(DomainRouter::ChooseGroup("code", both), 0);
  // It matches in 1 of 10 asks.
  for (int i = 0; i < 100; ++i) lookup->RecordProposal("code", i % 10 == 0);
  const DomainSnapshot s = lookup->Snapshot("code");
  EXPECT_NEAR(s.proposal_rate, 0.1, 1e-12);
  const int k = s.k;
  ASSERT_GT(k, 0);
  const double pi = 0.1, a = s.acceptance;
  const double want = (pi * ExpectedTokensPerStep(a, k) + 1 - pi) /
                      (0.1e-3 * k + pi * (10.0 + 0.1 * k) * 1e-3 + (1 - pi) * 10e-3);
  EXPECT_NEAR(lookup->ExpectedGoodput("code"), want, 1e-6 * want);
  EXPECT_NEAR(s.expected_goodput, want, 1e-6 * want);
  EXPECT_LT(want, 0.5 * g_all);
  EXPECT_EQ(DomainRouter::ChooseGroup("code", both), 1);
  // Another domain keeps its own rate; K itself does not change (a step without a
  // proposal costs nothing to verify).
  EXPECT_EQ(lookup->Snapshot("chat").proposal_rate, 1.0);
  EXPECT_EQ(lookup->ChooseK("code"), k);
}

TEST(SpecControllerTest, LowAcceptanceDisablesProbesAndReenables) {
  auto ctl = Make();  // probe_every 32, probe_k 2, min_observations 16
  SetTimings(*ctl, 1.0, 10.0, 0.5, 10.0);
  ScriptedDrafter drafter(0.3);
  // Speculate at 30% until the window holds min_observations positions: then disabled.
  int steps = 0;
  while (ctl->Snapshot("finance").mode != SpecMode::kDisabled) {
    ASSERT_LT(steps, 32) << "never disabled";
    const int k = ctl->ChooseK("finance");
    ASSERT_GT(k, 0);
    ASSERT_TRUE(ctl->RecordStep("finance", k, drafter.Step(k)).ok());
    ++steps;
  }
  DomainSnapshot s = ctl->Snapshot("finance");
  EXPECT_GE(s.window_positions, 4);  // early disabling may judge before min_observations
  EXPECT_LT(s.acceptance, 0.4);
  EXPECT_EQ(s.k, 0);
  EXPECT_EQ(s.disables, 1);
  // Direct (1 / 10 ms) less the probes' share: a k=2 probe costs 2 + 11 - 10 = 3 ms extra
  // once per 32 direct steps.
  EXPECT_NEAR(ctl->ExpectedGoodput("finance"), 100.0 / (1 + 3.0 / 320), 1e-9);

  // Still bad: exactly probe_every direct steps, then one probe with probe_k, repeatedly.
  for (int cycle = 0; cycle < 20; ++cycle) {
    for (int i = 0; i < 32; ++i) ASSERT_EQ(ctl->ChooseK("finance"), 0) << cycle << "/" << i;
    ASSERT_EQ(ctl->ChooseK("finance"), 2) << "probe in cycle " << cycle;
    EXPECT_EQ(ctl->Snapshot("finance").mode, SpecMode::kProbing);
    ASSERT_TRUE(ctl->RecordStep("finance", 2, drafter.Step(2)).ok());
    ASSERT_EQ(ctl->Snapshot("finance").mode, SpecMode::kDisabled) << "re-enabled at 30%";
  }
  s = ctl->Snapshot("finance");
  EXPECT_EQ(s.probes, 20);
  EXPECT_EQ(s.direct_decisions, 20 * 32);
  EXPECT_GE(s.probe_positions, 16);
  EXPECT_LT(s.probe_acceptance, 0.4);

  // The domain recovers (say the drafter was swapped): probes see 95%.
  drafter.set_rate(0.95);
  int probes_to_recover = 0;
  while (ctl->Snapshot("finance").mode == SpecMode::kDisabled) {
    ASSERT_LT(probes_to_recover, 40) << "never re-enabled";
    for (int i = 0; i < 32; ++i) ASSERT_EQ(ctl->ChooseK("finance"), 0);
    ASSERT_EQ(ctl->ChooseK("finance"), 2);
    ASSERT_TRUE(ctl->RecordStep("finance", 2, drafter.Step(2)).ok());
    ++probes_to_recover;
  }
  // The probe window (64 positions) held ~20 bad probe positions; good probes push them
  // out. Re-enabled once the probe acceptance reached the disable threshold.
  EXPECT_GE(probes_to_recover, 2);
  s = ctl->Snapshot("finance");
  EXPECT_EQ(s.reenables, 1);
  EXPECT_GE(s.acceptance, 0.4);
  EXPECT_EQ(s.probe_positions, 0);
  // Not warmup: the window restarted from the probe outcomes (>= min_observations).
  EXPECT_GE(s.window_positions, 16);
  EXPECT_TRUE(s.mode == SpecMode::kAdapt || s.mode == SpecMode::kFree) << SpecModeName(s.mode);
  EXPECT_GT(s.k, 0);
  // Speculating again; acceptance keeps climbing to ~0.95 with full-length steps.
  std::vector<int> ks = Drive(*ctl, "finance", drafter, 200);
  for (int k : ks) EXPECT_GT(k, 0);
  EXPECT_GT(ctl->Snapshot("finance").acceptance, 0.9);
  EXPECT_EQ(ctl->Snapshot("finance").disables, 1);
}

TEST(SpecControllerTest, UnrecordedProbeDoesNotStayProbing) {
  SpecControllerConfig c;
  c.probe_every = 4;
  auto ctl = Make(c);
  Feed(*ctl, "d", 0.2, 16);
  ASSERT_EQ(ctl->Snapshot("d").mode, SpecMode::kDisabled);
  for (int i = 0; i < 4; ++i) ASSERT_EQ(ctl->ChooseK("d"), 0);
  ASSERT_EQ(ctl->ChooseK("d"), 2);
  EXPECT_EQ(ctl->Snapshot("d").mode, SpecMode::kProbing);
  // The engine clamped the probe to k = 0 (end of the request) and never recorded it.
  ASSERT_EQ(ctl->ChooseK("d"), 0);
  EXPECT_EQ(ctl->Snapshot("d").mode, SpecMode::kDisabled);
  EXPECT_EQ(ctl->Snapshot("d").probes, 1);
}

TEST(SpecControllerTest, AdaptBandFollowsCostModel) {
  SpecControllerConfig c = ExactTimings();
  c.probe_overhead_budget = 0.0;  // probe every probe_every (ExpensiveProbesAreSpacedOut)
  auto ctl = Make(c);
  Feed(*ctl, "mixed", 0.5, 256);  // alternate pass/fail: a = 0.5 exactly
  ASSERT_DOUBLE_EQ(ctl->Snapshot("mixed").acceptance, 0.5);
  // The verify line runs through the direct step (10 ms = 100/s) with the measured slope.
  // Cheap drafting (0.1 ms/token), verify 10 + 0.1·K ms: E(K) = 2(1 − 0.5^(K+1)),
  // G(3) = 1.875/10.6 ms = 176.9, G(4) = 1.9375/10.8 ms = 179.4, G(5) = 1.969/11 = 179.0.
  SetTimings(*ctl, 0.1, 10.0, 0.1, 10.0);
  EXPECT_EQ(ctl->Snapshot("mixed").mode, SpecMode::kAdapt);
  EXPECT_EQ(ctl->ChooseK("mixed"), 4);
  // Drafting costs 3 ms/token: G(1) = 1.5/13.1 ms = 114.5 > G(2) = 1.75/16.2 ms = 108 > 100.
  SetTimings(*ctl, 3.0, 10.0, 0.1, 10.0);
  EXPECT_EQ(ctl->ChooseK("mixed"), 1);
  // Each draft costs 10 ms to verify: G(1) = 1.5/23 ms = 65/s < 100/s direct -> K = 0.
  SetTimings(*ctl, 3.0, 10.0, 10.0, 10.0);
  EXPECT_EQ(ctl->ChooseK("mixed"), 0);
  DomainSnapshot s = ctl->Snapshot("mixed");
  EXPECT_EQ(s.mode, SpecMode::kAdapt);
  EXPECT_EQ(s.k, 0);
  // Direct less the probes' share: a probe (K = 2) costs 6 + 30 - 10 = 26 ms extra per 32
  // direct steps.
  EXPECT_NEAR(ctl->ExpectedGoodput("mixed"), 100.0 / (1 + 26.0 / 320), 1e-9);
  // Adapt-and-direct is probed too (31 more direct decisions complete the 32).
  for (int i = 0; i < 31; ++i) ASSERT_EQ(ctl->ChooseK("mixed"), 0);
  EXPECT_EQ(ctl->ChooseK("mixed"), 2);
  EXPECT_EQ(ctl->Snapshot("mixed").probes, 1);
  // A free domain with the same costs: a = 0.7, G(1) = 1.7/23 ms = 73.9/s is the best K
  // but direct (100/s) is faster by more than the 10% margin -> direct.
  Feed(*ctl, "free", 0.7, 256);
  EXPECT_EQ(ctl->Snapshot("free").mode, SpecMode::kFree);
  EXPECT_EQ(ctl->ChooseK("free"), 0);
  // Within the margin (5 ms per draft: G(1) = 1.7/18 ms = 94.4/s is the best K, and
  // 94.4 * 1.1 > 100) free keeps speculating although direct is a little faster.
  SetTimings(*ctl, 3.0, 10.0, 5.0, 10.0);
  EXPECT_EQ(ctl->ChooseK("free"), 1);
}

TEST(SpecControllerTest, TiesGoToSmallerK) {
  SpecControllerConfig c;
  c.disable_threshold = 0.0;  // never disable, always free
  c.free_threshold = 0.0;
  c.k_min = 2;
  auto ctl = Make(c);
  // Nothing is ever accepted and extra drafts cost nothing: every K has G(K) = 100/s.
  SetTimings(*ctl, 0.0, 10.0, 0.0, 10.0);
  Feed(*ctl, "d", 0.0, 32);
  EXPECT_EQ(ctl->Snapshot("d").mode, SpecMode::kFree);
  EXPECT_EQ(ctl->ChooseK("d"), 2);
}

TEST(SpecControllerTest, DomainsAreIndependent) {
  auto ctl = Make();
  SetTimings(*ctl, 1.0, 10.0, 0.5, 10.0);
  Feed(*ctl, "code", 0.9, 256);
  Feed(*ctl, "finance", 0.2, 64);
  EXPECT_EQ(ctl->Snapshot("finance").mode, SpecMode::kDisabled);
  EXPECT_EQ(ctl->Snapshot("code").mode, SpecMode::kFree);
  const int k_code = ctl->ChooseK("code");
  EXPECT_GT(k_code, 0);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(ctl->ChooseK("finance"), 0);
  EXPECT_EQ(ctl->ChooseK("code"), k_code);
  EXPECT_EQ(ctl->Snapshot("code").probes, 0);
  EXPECT_EQ(ctl->Snapshot("code").direct_decisions, 0);
  EXPECT_NEAR(ctl->Snapshot("code").acceptance, 0.9, 0.01);
  EXPECT_EQ(ctl->Snapshot("chat").mode, SpecMode::kWarmup);  // untouched domain
  std::vector<DomainSnapshot> all = ctl->AllDomains();
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].domain, "code");
  EXPECT_EQ(all[1].domain, "finance");
  EXPECT_EQ(all[1].mode, SpecMode::kDisabled);
}

TEST(SpecControllerTest, WindowSlides) {
  SpecControllerConfig c;
  c.window = 32;
  c.min_observations = 8;
  c.probe_window = 16;
  auto ctl = Make(c);
  Feed(*ctl, "d", 0.5, 32);
  EXPECT_DOUBLE_EQ(ctl->Snapshot("d").acceptance, 0.5);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(ctl->RecordStep("d", 4, 4).ok());  // 16 passes
  EXPECT_EQ(ctl->Snapshot("d").window_positions, 32);
  EXPECT_DOUBLE_EQ(ctl->Snapshot("d").acceptance, 24.0 / 32.0);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(ctl->RecordStep("d", 4, 4).ok());
  EXPECT_DOUBLE_EQ(ctl->Snapshot("d").acceptance, 1.0);  // the 0.5 history is gone
  EXPECT_EQ(ctl->Snapshot("d").drafted, 32 + 32);        // lifetime counters keep it all
}

TEST(SpecControllerTest, TimingModel) {
  auto ctl = Make(ExactTimings());
  EXPECT_FALSE(ctl->PredictVerifySeconds(2).has_value());
  EXPECT_FALSE(ctl->DirectSeconds().has_value());
  // One verify point: flat. One draft point: proportional to K.
  ASSERT_TRUE(ctl->RecordVerifyTime(2, 0.012).ok());
  ASSERT_TRUE(ctl->RecordDraftTime(4, 0.008).ok());
  EXPECT_DOUBLE_EQ(*ctl->PredictVerifySeconds(7), 0.012);
  EXPECT_DOUBLE_EQ(*ctl->PredictDraftSeconds(8), 0.016);
  // Two verify points: the least-squares line 10 ms + 1 ms·K; K = 0 stands in for direct.
  ASSERT_TRUE(ctl->RecordVerifyTime(6, 0.016).ok());
  EXPECT_NEAR(*ctl->PredictVerifySeconds(4), 0.014, 1e-12);
  EXPECT_NEAR(*ctl->DirectSeconds(), 0.010, 1e-12);
  ASSERT_TRUE(ctl->RecordDirectTime(0.009).ok());
  EXPECT_DOUBLE_EQ(*ctl->DirectSeconds(), 0.009);
  // Three points, least squares (not interpolation): (0,1) (1,3) (2,3) -> 1.333 + 1·K.
  auto ls = Make(ExactTimings());
  ASSERT_TRUE(ls->RecordVerifyTime(0, 1.0).ok());
  ASSERT_TRUE(ls->RecordVerifyTime(1, 3.0).ok());
  ASSERT_TRUE(ls->RecordVerifyTime(2, 3.0).ok());
  EXPECT_NEAR(*ls->PredictVerifySeconds(3), 4.0 / 3.0 + 3.0, 1e-9);
  // A falling fit is clamped flat (time never falls as K grows): the mean.
  auto falling = Make(ExactTimings());
  ASSERT_TRUE(falling->RecordVerifyTime(2, 0.016).ok());
  ASSERT_TRUE(falling->RecordVerifyTime(6, 0.012).ok());
  EXPECT_NEAR(*falling->PredictVerifySeconds(20), 0.014, 1e-12);
  // A negative intercept is clamped to a line through the origin: c1 = Σxy/Σx² = 0.35.
  auto steep = Make(ExactTimings());
  ASSERT_TRUE(steep->RecordDraftTime(4, 1.0).ok());
  ASSERT_TRUE(steep->RecordDraftTime(8, 3.0).ok());
  EXPECT_NEAR(*steep->PredictDraftSeconds(2), 0.7, 1e-12);
}

TEST(SpecControllerTest, TimingsAreEwmas) {
  SpecControllerConfig c;
  c.timing_alpha = 0.5;
  auto ctl = Make(c);
  ASSERT_TRUE(ctl->RecordDirectTime(0.010).ok());
  ASSERT_TRUE(ctl->RecordDirectTime(0.020).ok());
  EXPECT_DOUBLE_EQ(*ctl->DirectSeconds(), 0.015);
  ASSERT_TRUE(ctl->RecordVerifyTime(3, 0.010).ok());
  ASSERT_TRUE(ctl->RecordVerifyTime(3, 0.030).ok());
  EXPECT_DOUBLE_EQ(*ctl->PredictVerifySeconds(3), 0.020);
}

TEST(SpecControllerTest, RejectsBadRecords) {
  auto ctl = Make();
  EXPECT_EQ(ctl->RecordStep("d", 3, 4).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ctl->RecordStep("d", -1, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ctl->RecordStep("d", 2, -1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ctl->RecordDraftTime(0, 0.01).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ctl->RecordVerifyTime(-1, 0.01).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ctl->RecordVerifyTime(1, -0.01).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ctl->RecordDirectTime(std::nan("")).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ctl->RecordDirectTime(INFINITY).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ctl->Snapshot("d").window_positions, 0);  // nothing recorded
  EXPECT_FALSE(ctl->DirectSeconds().has_value());
}

TEST(SpecControllerTest, ConfigValidationNamesTheField) {
  struct Case {
    const char* field;
    void (*mutate)(SpecControllerConfig&);
  };
  const Case cases[] = {
      {"free_threshold", [](SpecControllerConfig& c) { c.free_threshold = 1.5; }},
      {"disable_threshold", [](SpecControllerConfig& c) { c.disable_threshold = -0.1; }},
      {"disable_threshold", [](SpecControllerConfig& c) { c.disable_threshold = 0.7; }},
      {"k_min", [](SpecControllerConfig& c) { c.k_min = 0; }},
      {"k_max", [](SpecControllerConfig& c) { c.k_max = 0; }},
      {"k_max", [](SpecControllerConfig& c) { c.k_max = 1000; }},
      {"k_initial", [](SpecControllerConfig& c) { c.k_initial = 9; }},
      {"window", [](SpecControllerConfig& c) { c.window = 0; }},
      {"min_observations", [](SpecControllerConfig& c) { c.min_observations = 300; }},
      {"probe_every", [](SpecControllerConfig& c) { c.probe_every = 0; }},
      {"probe_k", [](SpecControllerConfig& c) { c.probe_k = 9; }},
      {"probe_window", [](SpecControllerConfig& c) { c.probe_window = 8; }},
      {"timing_alpha", [](SpecControllerConfig& c) { c.timing_alpha = 0.0; }},
      {"max_domains", [](SpecControllerConfig& c) { c.max_domains = 0; }},
  };
  EXPECT_TRUE(ValidateSpecControllerConfig(SpecControllerConfig{}).ok());
  for (const Case& tc : cases) {
    SpecControllerConfig c;
    tc.mutate(c);
    absl::Status st = ValidateSpecControllerConfig(c);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << tc.field;
    EXPECT_NE(std::string(st.message()).find(tc.field), std::string::npos) << st;
    EXPECT_FALSE(SpecController::Create(c).ok()) << tc.field;
  }
}

TEST(SpecControllerTest, DomainCountIsBounded) {
  SpecControllerConfig c;
  c.max_domains = 2;
  auto ctl = Make(c);
  ctl->ChooseK("a");
  ctl->ChooseK("b");
  ctl->ChooseK("c");
  ctl->ChooseK("d");
  std::vector<DomainSnapshot> all = ctl->AllDomains();
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].domain, std::string(SpecController::kOverflowDomain));
  EXPECT_EQ(all[0].decisions, 2);  // c and d share it
  EXPECT_EQ(all[1].domain, "a");
  EXPECT_EQ(all[2].domain, "b");
}

TEST(SpecControllerTest, SnapshotsWhileRecording) {
  auto ctl = Make();
  SetTimings(*ctl, 1.0, 10.0, 0.5, 10.0);
  std::atomic<bool> done{false};
  std::thread metrics([&] {
    while (!done.load()) {
      for (const DomainSnapshot& s : ctl->AllDomains()) {
        ASSERT_GE(s.acceptance, 0.0);
        ASSERT_LE(s.acceptance, 1.0);
      }
    }
  });
  ScriptedDrafter drafter(0.8);
  Drive(*ctl, "chat", drafter, 5000);
  done.store(true);
  metrics.join();
  EXPECT_NEAR(ctl->Snapshot("chat").acceptance, 0.8, 0.01);
  EXPECT_EQ(ctl->Snapshot("chat").decisions, 5000);
}

}  // namespace
}  // namespace specnode

namespace specnode {
namespace {

TEST(SpecControllerTest, WilsonUpperBound) {
  EXPECT_DOUBLE_EQ(WilsonUpperBound(0, 0, 1.64), 1.0);
  EXPECT_LT(WilsonUpperBound(0, 5, 1.64), 0.4);  // 5 straight rejections: clearly bad
  EXPECT_GT(WilsonUpperBound(0, 3, 1.64), 0.4);  // 3 are not enough to tell
  EXPECT_GT(WilsonUpperBound(2, 6, 1.64), 0.4);  // 1 in 3 over 6: undecided
  EXPECT_LT(WilsonUpperBound(20, 200, 1.64), 0.15);
  EXPECT_GT(WilsonUpperBound(20, 200, 1.64), 0.1);
}

TEST(SpecControllerTest, HopelessDrafterIsDisabledEarly) {
  auto ctl = Make();
  for (int i = 0; i < 4; ++i) {
    ASSERT_EQ(ctl->ChooseK("chat"), 4) << i;  // warmup
    ASSERT_TRUE(ctl->RecordStep("chat", 4, 0).ok());
  }
  EXPECT_EQ(ctl->Snapshot("chat").mode, SpecMode::kWarmup);  // 4 rejections: not yet sure
  ASSERT_TRUE(ctl->RecordStep("chat", 4, 0).ok());
  EXPECT_EQ(ctl->Snapshot("chat").mode, SpecMode::kDisabled);
  EXPECT_EQ(ctl->ChooseK("chat"), 0);
  // A mediocre domain is not judged early: 1 of 2 positions pass.
  for (int i = 0; i < 7; ++i) ASSERT_TRUE(ctl->RecordStep("code", 4, i % 2).ok());
  EXPECT_EQ(ctl->Snapshot("code").mode, SpecMode::kWarmup);
  // early_z = 0: only the full window judges.
  SpecControllerConfig c;
  c.early_z = 0.0;
  auto patient = Make(c);
  for (int i = 0; i < 15; ++i) ASSERT_TRUE(patient->RecordStep("chat", 4, 0).ok());
  EXPECT_EQ(patient->Snapshot("chat").mode, SpecMode::kWarmup);
  ASSERT_TRUE(patient->RecordStep("chat", 4, 0).ok());
  EXPECT_EQ(patient->Snapshot("chat").mode, SpecMode::kDisabled);
}

TEST(SpecControllerTest, DrafterThatCanNeverWinDoesNotWarmUpNewDomains) {
  // Draft 8 ms/token, verify 10 + 3k ms, direct 10 ms: even all accepted, K drafts give
  // K + 1 tokens for 10 + 11K ms, never better than 10 ms per token.
  auto ctl = Make();
  SetTimings(*ctl, 8.0, 10.0, 3.0, 10.0);
  ASSERT_TRUE(ctl->CanNeverWin());
  EXPECT_EQ(ctl->ChooseK("new"), 0);  // no warm-up speculation
  EXPECT_EQ(ctl->Snapshot("new").mode, SpecMode::kWarmup);
  // Probed at the budgeted interval: a k=2 probe costs 16 + 16 - 10 = 22 ms more than a
  // direct step, at 2% of 10 ms that is one probe per 110 direct steps.
  int direct = 1;
  int k = 0;
  while ((k = ctl->ChooseK("new")) == 0) ASSERT_LT(++direct, 1000);
  EXPECT_NEAR(direct, 110, 1);  // ceil of a float quotient
  EXPECT_EQ(k, 2);
  // A drafter that can win still warms up with k_initial.
  auto fine = Make();
  SetTimings(*fine, 0.0, 10.0, 0.5, 10.0);
  ASSERT_FALSE(fine->CanNeverWin());
  EXPECT_EQ(fine->ChooseK("new"), 4);
}

TEST(SpecControllerTest, ExpensiveProbesAreSpacedOut) {
  // Draft 5 ms/token, verify 10 + 0.5k ms, direct 10 ms: a k=2 probe costs 10 + 11 - 10 =
  // 11 ms more than a direct step; at a 2% budget that is one probe per 55 direct steps.
  auto ctl = Make();
  SetTimings(*ctl, 5.0, 10.0, 0.5, 10.0);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(ctl->RecordStep("chat", 4, 0).ok());
  ASSERT_EQ(ctl->Snapshot("chat").mode, SpecMode::kDisabled);
  int direct = 0;
  while (ctl->ChooseK("chat") == 0) ASSERT_LT(++direct, 1000);
  EXPECT_EQ(direct, 55);
  // Cheap probes (prompt lookup: no draft time) keep the base interval.
  auto cheap = Make();
  SetTimings(*cheap, 0.0, 10.0, 0.05, 10.0);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(cheap->RecordStep("chat", 4, 0).ok());
  direct = 0;
  while (cheap->ChooseK("chat") == 0) ASSERT_LT(++direct, 1000);
  EXPECT_EQ(direct, 32);
  // Budget 0: always probe_every.
  SpecControllerConfig c;
  c.probe_overhead_budget = 0.0;
  auto fixed = Make(c);
  SetTimings(*fixed, 5.0, 10.0, 0.5, 10.0);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(fixed->RecordStep("chat", 4, 0).ok());
  direct = 0;
  while (fixed->ChooseK("chat") == 0) ASSERT_LT(++direct, 1000);
  EXPECT_EQ(direct, 32);
}

// ShadowK: the K a counterfactual proposal is scored at; asking changes no decision count.
TEST(SpecControllerTest, ShadowKChangesNothing) {
  auto ctl = spec_test::Make();
  EXPECT_EQ(ctl->ShadowK("code", false), ctl->config().k_initial);
  spec_test::SetTimings(*ctl, 1, 10, 0, 10);
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(ctl->RecordStep("code", 4, 4).ok());
  const DomainSnapshot before = ctl->Snapshot("code");
  EXPECT_EQ(ctl->ShadowK("code", false), before.k);
  EXPECT_EQ(ctl->Snapshot("code").decisions, before.decisions);
  // A disabled domain decodes directly, yet is scored at the best K for its acceptance.
  for (int i = 0; i < 300; ++i) ASSERT_TRUE(ctl->RecordStep("legal", 1, 0).ok());
  ASSERT_EQ(ctl->Snapshot("legal").mode, SpecMode::kDisabled);
  EXPECT_GE(ctl->ShadowK("legal", false), ctl->config().k_min);
}

// A drafter asked but never proposing in a domain is observed (π = 0): its goodput is a
// direct step's after the drafting attempt, not "unknown".
TEST(SpecControllerTest, NeverProposingIsObserved) {
  auto ctl = spec_test::Make(spec_test::ExactTimings());
  spec_test::SetTimings(*ctl, 1, 10, 0, 10);
  EXPECT_EQ(ctl->ExpectedGoodput("chat"), 0.0);
  for (int i = 0; i < 8; ++i) ctl->RecordProposal("chat", false);
  // k_initial (4) drafts' attempt: 4 ms, then a 10 ms direct step, for one token.
  EXPECT_NEAR(ctl->ExpectedGoodput("chat"), 1.0 / 0.014, 1e-9);
  // Such a drafter was never verified: no verification timings are needed for it, and its
  // a = 1 bound takes a verification as cheap as a direct step.
  auto unverified = spec_test::Make(spec_test::ExactTimings());
  for (int k : {1, 8}) ASSERT_TRUE(unverified->RecordDraftTime(k, k * 1e-3).ok());
  ASSERT_TRUE(unverified->RecordDirectTime(0.010).ok());
  for (int i = 0; i < 8; ++i) unverified->RecordProposal("chat", false);
  EXPECT_NEAR(unverified->ExpectedGoodput("chat"), 1.0 / 0.014, 1e-9);
  EXPECT_NEAR(unverified->BestCaseGoodput().value(), 9.0 / 0.018, 1e-9);
}

// Settled: enough evidence (positions or asks) for the router to hold other drafters'
// first tries to this estimate.
TEST(SpecControllerTest, SettledAfterMinObservations) {
  auto ctl = spec_test::Make(spec_test::ExactTimings());
  EXPECT_FALSE(ctl->Settled("code"));
  for (int i = 0; i < 15; ++i) ctl->RecordProposal("code", false);
  EXPECT_FALSE(ctl->Settled("code"));
  ctl->RecordProposal("code", false);  // 16 asks, never a proposal: settled
  EXPECT_TRUE(ctl->Settled("code"));
  for (int i = 0; i < 16; ++i) ASSERT_TRUE(ctl->RecordStep("chat", 1, 1).ok());
  EXPECT_TRUE(ctl->Settled("chat"));
}

}  // namespace
}  // namespace specnode
