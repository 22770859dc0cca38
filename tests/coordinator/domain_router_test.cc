// DomainRouter: the routing table (explicit domain, rules in order, default), rule
// validation, and group choice by goodput.
#include "coordinator/domain_router.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "coordinator/spec_controller.h"
#include "tests/coordinator/spec_controller_test_util.h"

namespace specnode {
namespace {

DomainRule Rule(std::string domain, std::vector<std::string> keywords, std::string regex = "",
                bool regex_icase = true) {
  DomainRule r;
  r.domain = std::move(domain);
  r.keywords = std::move(keywords);
  r.regex = std::move(regex);
  r.regex_icase = regex_icase;
  return r;
}

RouterConfig TableConfig() {
  RouterConfig c;
  c.default_domain = "chat";
  c.rules = {
      Rule("summarize", {"tl;dr"}, R"(^\s*summari[sz]e\b)"),
      Rule("code", {"python", "c++", "#include", "function"}, R"(\bdef\s+\w+\s*\()"),
      Rule("finance", {"stock", "bond", "balance sheet"}, R"(\$\d)"),
  };
  return c;
}

std::unique_ptr<DomainRouter> MakeRouter(RouterConfig config) {
  auto r = DomainRouter::Create(std::move(config));
  EXPECT_TRUE(r.ok()) << r.status();
  return std::move(r).value();
}

TEST(DomainRouterTest, RoutingTable) {
  auto router = MakeRouter(TableConfig());
  struct Row {
    const char* request_domain;
    const char* prompt;
    const char* want;
  };
  const Row table[] = {
      // The explicit domain wins over every rule.
      {"finance", "Write a Python function that reverses a list.", "finance"},
      {"legal", "What is a bond?", "legal"},
      // Keywords: case-insensitive, whole words.
      {"", "Write a Python function that reverses a list.", "code"},
      {"", "WRITE A PYTHON SCRIPT", "code"},
      {"", "Is this bond investment-grade?", "finance"},
      {"", "How do I read a Balance  Sheet?", "chat"},  // two spaces: not the phrase
      {"", "How do I read a balance sheet?", "finance"},
      {"", "Stocks rallied today.", "chat"},  // "stock" is not a word of it
      {"", "Bondage of the will", "chat"},    // "bond" inside a word
      {"", "What is new in C++20?", "code"},  // keyword edge "+" needs no boundary
      {"", "fix my #include <stdio.h> line", "code"},
      {"", "a function_pointer question", "chat"},  // '_' is a word character
      // Regexes: searched, case-insensitive by default.
      {"", "def add(a, b):\n    return a + b", "code"},
      {"", "It costs $5 more.", "finance"},
      {"", "  Summarize the following passage: the stock fell.", "summarize"},
      {"", "SUMMARISE this", "summarize"},
      // First matching rule in configuration order: summarize (0) before finance (2).
      {"", "Summarise: bond yields rose and a Python library shipped.", "summarize"},
      // code (1) before finance (2).
      {"", "A Python function to price a bond", "code"},
      // Nothing matches: default.
      {"", "Tell me a joke about cats.", "chat"},
      {"", "", "chat"},
  };
  for (const Row& row : table) {
    EXPECT_EQ(router->Classify(row.request_domain, row.prompt), row.want)
        << "domain='" << row.request_domain << "' prompt='" << row.prompt << "'";
  }
  EXPECT_EQ(router->MatchRule("A Python function to price a bond"), 1);
  EXPECT_EQ(router->MatchRule("nothing here"), -1);
}

TEST(DomainRouterTest, RuleOrderDecides) {
  RouterConfig c = TableConfig();
  std::swap(c.rules[0], c.rules[2]);  // finance first now
  auto router = MakeRouter(c);
  EXPECT_EQ(router->Classify("", "Summarise: bond yields rose."), "finance");
}

TEST(DomainRouterTest, CaseSensitiveRegexOnRequest) {
  RouterConfig c;
  c.rules = {Rule("shout", {}, "HELLO", /*regex_icase=*/false)};
  auto router = MakeRouter(c);
  EXPECT_EQ(router->Classify("", "HELLO there"), "shout");
  EXPECT_EQ(router->Classify("", "hello there"), "default");
}

TEST(DomainRouterTest, KeywordsRespectUtf8Words) {
  RouterConfig c;
  c.rules = {Rule("food", {"caf"}), Rule("cafe", {"café"})};
  auto router = MakeRouter(c);
  EXPECT_EQ(router->Classify("", "un café noir"), "cafe");  // "caf" is inside "café"
  EXPECT_EQ(router->Classify("", "the caf is open"), "food");
}

TEST(DomainRouterTest, ScansOnlyThePromptPrefix) {
  RouterConfig c;
  c.max_scan_bytes = 32;
  c.rules = {Rule("code", {"python"})};
  auto router = MakeRouter(c);
  EXPECT_EQ(router->Classify("", "python " + std::string(100, 'x')), "code");
  EXPECT_EQ(router->Classify("", std::string(100, 'x') + " python"), "default");
}

TEST(DomainRouterTest, BadRulesAreInvalidArgument) {
  auto expect_error = [](RouterConfig c, const std::string& needle) {
    auto r = DomainRouter::Create(std::move(c));
    ASSERT_FALSE(r.ok()) << needle;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(r.status().message()).find(needle), std::string::npos) << r.status();
  };
  RouterConfig bad_regex = TableConfig();
  bad_regex.rules[1].regex = "([a-z";
  expect_error(bad_regex, "rule 1 (code)");
  expect_error(bad_regex, "bad regex");

  RouterConfig empty_domain;
  empty_domain.rules = {Rule("", {"x"})};
  expect_error(empty_domain, "rule 0");

  RouterConfig bad_chars;
  bad_chars.rules = {Rule("chat", {"x"}), Rule("a b", {"y"})};
  expect_error(bad_chars, "rule 1 (a b)");

  RouterConfig nothing;
  nothing.rules = {Rule("chat", {})};
  expect_error(nothing, "neither keywords nor a regex");

  RouterConfig empty_kw;
  empty_kw.rules = {Rule("chat", {"ok", ""})};
  expect_error(empty_kw, "keyword 1 is empty");

  RouterConfig bad_default;
  bad_default.default_domain = "";
  expect_error(bad_default, "default_domain");

  RouterConfig zero_scan;
  zero_scan.max_scan_bytes = 0;
  expect_error(zero_scan, "max_scan_bytes");

  EXPECT_TRUE(DomainRouter::ValidateDomainName("finance.v2:eu-1").ok());
  EXPECT_FALSE(DomainRouter::ValidateDomainName(std::string(65, 'a')).ok());
  EXPECT_FALSE(DomainRouter::ValidateDomainName("fin\"ance").ok());
}

TEST(DomainRouterTest, ChooseGroupByGoodput) {
  using V = std::vector<double>;
  EXPECT_EQ(DomainRouter::ChooseGroup(V{}), -1);
  EXPECT_EQ(DomainRouter::ChooseGroup(V{120.0}), 0);
  EXPECT_EQ(DomainRouter::ChooseGroup(V{120.0, 250.0, 90.0}), 1);   // best
  EXPECT_EQ(DomainRouter::ChooseGroup(V{120.0, 250.0, 250.0}), 1);  // tie: lowest index
  EXPECT_EQ(DomainRouter::ChooseGroup(V{120.0, 0.0, 500.0}), 1);    // untried first
  EXPECT_EQ(DomainRouter::ChooseGroup(V{120.0, 500.0, 0.0, 0.0}), 2);
  EXPECT_EQ(DomainRouter::ChooseGroup(V{std::nan(""), 500.0}), 0);  // NaN = untried
}

TEST(DomainRouterTest, ChooseGroupOverControllers) {
  auto g0 = SpecController::Create({}).value();
  auto g1 = SpecController::Create({}).value();
  // 1 ms per draft token, a flat 10 ms verification, a 10 ms direct step.
  for (SpecController* g : {g0.get(), g1.get()}) spec_test::SetTimings(*g, 1, 10, 0, 10);
  std::vector<const SpecController*> groups = {g0.get(), g1.get()};
  // Nothing observed for "code" anywhere: group 0 is tried first.
  EXPECT_EQ(DomainRouter::ChooseGroup("code", groups), 0);
  // Group 0 has seen "code" at 60%: group 1 (untried) is explored next.
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(g0->RecordStep("code", 1, i % 5 < 3 ? 1 : 0).ok());
  EXPECT_GT(g0->ExpectedGoodput("code"), 0.0);
  EXPECT_EQ(DomainRouter::ChooseGroup("code", groups), 1);
  // Group 1's drafter is better at code (90%): it wins.
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(g1->RecordStep("code", 1, i % 10 < 9 ? 1 : 0).ok());
  EXPECT_GT(g1->ExpectedGoodput("code"), g0->ExpectedGoodput("code"));
  EXPECT_EQ(DomainRouter::ChooseGroup("code", groups), 1);
  // For finance group 1 is poor (disabled: direct goodput 100/s); group 0 speculates.
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(g0->RecordStep("finance", 1, i % 10 < 8 ? 1 : 0).ok());
    ASSERT_TRUE(g1->RecordStep("finance", 1, i % 10 < 2 ? 1 : 0).ok());
  }
  EXPECT_EQ(g1->Snapshot("finance").mode, SpecMode::kDisabled);
  // Direct goodput less the probes' share (2 + 10 - 10 = 2 ms extra per 32 direct steps).
  EXPECT_NEAR(g1->ExpectedGoodput("finance"), 100.0 / (1 + 2.0 / 320), 1e-9);
  EXPECT_EQ(DomainRouter::ChooseGroup("finance", groups), 0);
  // A null entry (group down) is skipped.
  std::vector<const SpecController*> with_hole = {nullptr, g1.get()};
  EXPECT_EQ(DomainRouter::ChooseGroup("code", with_hole), 1);
  std::vector<const SpecController*> all_null = {nullptr};
  EXPECT_EQ(DomainRouter::ChooseGroup("code", all_null), -1);
}

// A drafter whose drafts cost more than even full acceptance saves (a deep self-draft on a
// compute-bound CPU) gets no first try; cheap drafters and unknown timings do.
TEST(DomainRouterTest, GroupThatCanNeverWinIsNotTriedFirst) {
  auto cheap = SpecController::Create({}).value();
  auto costly = SpecController::Create({}).value();
  EXPECT_FALSE(costly->CanNeverWin());  // no timings yet
  spec_test::SetTimings(*cheap, 0.1, 10, 2, 10);
  // Each draft token costs 7 ms (2/3 of a 10 ms target step) plus 3 ms of verification.
  spec_test::SetTimings(*costly, 7, 10, 3, 10);
  EXPECT_FALSE(cheap->CanNeverWin());
  EXPECT_TRUE(costly->CanNeverWin());
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(cheap->RecordStep("chat", 1, i % 10 < 7).ok());
  std::vector<const SpecController*> groups = {cheap.get(), costly.get()};
  EXPECT_EQ(DomainRouter::ChooseGroup("chat", groups), 0);  // costly is untried on chat
  EXPECT_EQ(DomainRouter::ChooseGroup("chat", groups, std::vector<int>{5, 0}), 0);
  // Alone (nothing else to choose) it is still chosen.
  std::vector<const SpecController*> alone = {costly.get()};
  EXPECT_EQ(DomainRouter::ChooseGroup("chat", alone), 0);
}

// Cluster groups (each its own target): near-equal groups share the load; a clearly better
// group still wins; groups without a drafter go by load alone.
TEST(DomainRouterTest, ChooseGroupBalancesLoadAmongNearEquals) {
  auto g0 = SpecController::Create({}).value();
  auto g1 = SpecController::Create({}).value();
  std::vector<const SpecController*> groups = {g0.get(), g1.get()};
  using L = std::vector<int>;
  // Both untried: the less loaded one is explored first.
  EXPECT_EQ(DomainRouter::ChooseGroup("chat", groups, L{3, 1}), 1);
  EXPECT_EQ(DomainRouter::ChooseGroup("chat", groups, L{0, 0}), 0);
  for (SpecController* g : {g0.get(), g1.get()}) {
    spec_test::SetTimings(*g, 1, 10, 0, 10);
    for (int i = 0; i < 100; ++i) ASSERT_TRUE(g->RecordStep("chat", 1, i % 10 < 8 ? 1 : 0).ok());
  }
  // The same drafter on both: equal goodput, the less loaded wins; equal loads: index 0.
  EXPECT_DOUBLE_EQ(g0->ExpectedGoodput("chat"), g1->ExpectedGoodput("chat"));
  EXPECT_EQ(DomainRouter::ChooseGroup("chat", groups, L{5, 2}), 1);
  EXPECT_EQ(DomainRouter::ChooseGroup("chat", groups, L{2, 5}), 0);
  EXPECT_EQ(DomainRouter::ChooseGroup("chat", groups, L{4, 4}), 0);
  // Group 1 much worse on chat (disabled: direct goodput): group 0 whatever the load.
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(g1->RecordStep("chat", 1, 0).ok());
  ASSERT_LT(g1->ExpectedGoodput("chat"), DomainRouter::kNearBest * g0->ExpectedGoodput("chat"));
  EXPECT_EQ(DomainRouter::ChooseGroup("chat", groups, L{9, 0}), 0);
  // Direct groups (no controller): load only.
  std::vector<const SpecController*> direct = {nullptr, nullptr, nullptr};
  EXPECT_EQ(DomainRouter::ChooseGroup("chat", direct, L{2, 1, 1}), 1);
  EXPECT_EQ(DomainRouter::ChooseGroup("chat", direct, L{0, 1, 1}), 0);
}

// A group disabled on every domain it was judged on (two or more) gets no first try on a
// new domain; one good domain, or a single judged domain, keeps the first try.
TEST(DomainRouterTest, GroupThatLosesEverywhereIsNotTriedFirst) {
  auto good = SpecController::Create({}).value();
  auto bad = SpecController::Create({}).value();
  for (SpecController* g : {good.get(), bad.get()}) spec_test::SetTimings(*g, 1, 10, 0, 10);
  std::vector<const SpecController*> groups = {good.get(), bad.get()};
  auto feed = [](SpecController* g, const char* domain, int percent) {
    for (int i = 0; i < 100; ++i) ASSERT_TRUE(g->RecordStep(domain, 1, i % 100 < percent).ok());
  };
  feed(good.get(), "summarize", 30);                             // good is disabled on summarize
  EXPECT_EQ(DomainRouter::ChooseGroup("summarize", groups), 1);  // bad: untried, explored
  feed(bad.get(), "chat", 5);
  EXPECT_FALSE(DomainRouter::LosesEverywhere(*bad));  // one judged domain only
  feed(bad.get(), "code", 5);
  EXPECT_TRUE(DomainRouter::LosesEverywhere(*bad));
  EXPECT_FALSE(DomainRouter::LosesEverywhere(*good));  // never judged on two domains
  // good (disabled on summarize, direct goodput) beats bad's stand-in there.
  EXPECT_EQ(DomainRouter::ChooseGroup("summarize", groups), 0);
  // On a new domain both are untried: good first as before, then bad is skipped.
  EXPECT_EQ(DomainRouter::ChooseGroup("finance", groups), 0);
  feed(good.get(), "finance", 80);
  EXPECT_EQ(DomainRouter::ChooseGroup("finance", groups), 0);
  // One domain where bad speculates freely: it is no longer a loser.
  feed(bad.get(), "edit", 90);
  EXPECT_FALSE(DomainRouter::LosesEverywhere(*bad));
  EXPECT_EQ(DomainRouter::ChooseGroup("legal", groups), 0);
  feed(good.get(), "legal", 50);
  EXPECT_EQ(DomainRouter::ChooseGroup("legal", groups), 1);
}

// Per-sequence choice: a group's rate counts its catch-up on the sequence's context; an
// untried group is explored only while its a = 1 bound beats the best known rate (settled,
// by kExploreMargin); a
// shadowed group goes first only when nothing is known, and is otherwise learnt for free.
TEST(DomainRouterTest, ChooseGroupForWeighsCatchUpAndExploresOnlyWhatCouldWin) {
  auto lookup = SpecController::Create({}).value();  // shadowed (prompt lookup)
  auto model = SpecController::Create({}).value();   // a draft model
  // 1 ms per draft token, a flat 10 ms verification, a 10 ms direct step: at a = 1 the best
  // K (8) gives 9 tokens in 18 ms.
  for (SpecController* g : {lookup.get(), model.get()}) spec_test::SetTimings(*g, 1, 10, 0, 10);
  ASSERT_NEAR(model->BestCaseGoodput().value(), 500.0, 1e-9);
  ASSERT_TRUE(model->RecordCatchupTime(100, 1.0).ok());  // 10 ms per caught-up token
  auto options = [&](int64_t uncached) {
    std::vector<GroupOption> o(2);
    o[0].controller = lookup.get();
    o[0].shadowed = true;
    o[1].controller = model.get();
    o[1].uncached = uncached;
    return o;
  };
  const double remaining = 96;
  // Nothing known for "summarize": the shadowed group first.
  GroupChoice c = DomainRouter::ChooseGroupFor("summarize", options(300), remaining);
  EXPECT_EQ(c.index, 0);
  EXPECT_TRUE(c.explore);
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(lookup->RecordStep("summarize", 1, i % 5 < 4).ok());
  const double g_lookup = lookup->ExpectedGoodput("summarize");
  ASSERT_GT(g_lookup, 200.0);
  // A 300-token prompt costs the model 3 s to catch up: even at a = 1 its rate over 96
  // tokens (96 / (3 + 96 / 500) = 30/s) cannot beat the lookup's, so it is not tried.
  c = DomainRouter::ChooseGroupFor("summarize", options(300), remaining);
  EXPECT_EQ(c.index, 0);
  EXPECT_FALSE(c.explore);
  EXPECT_NEAR(c.rate[0], g_lookup, 1e-9);
  EXPECT_NEAR(c.bound[1], 96.0 / (3.0 + 96.0 / 500.0), 1e-9);
  // A 10-token context (0.1 s) could win: explored.
  c = DomainRouter::ChooseGroupFor("summarize", options(10), remaining);
  EXPECT_EQ(c.index, 1);
  EXPECT_TRUE(c.explore);
  // Once known, the better drafter wins only where its catch-up does not eat the gain.
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(model->RecordStep("summarize", 1, i % 20 < 19).ok());
  const double g_model = model->ExpectedGoodput("summarize");
  ASSERT_GT(g_model, g_lookup);
  c = DomainRouter::ChooseGroupFor("summarize", options(0), remaining);
  EXPECT_EQ(c.index, 1);
  EXPECT_NEAR(c.rate[1], g_model, 1e-9);
  c = DomainRouter::ChooseGroupFor("summarize", options(300), remaining);
  EXPECT_EQ(c.index, 0);
  EXPECT_NEAR(c.rate[1], remaining / (3.0 + remaining / g_model), 1e-9);
  // An ineligible group (its target does not hold the sequence) is never chosen.
  std::vector<GroupOption> o = options(0);
  o[1].eligible = false;
  EXPECT_EQ(DomainRouter::ChooseGroupFor("summarize", o, remaining).index, 0);
  o[0].eligible = false;
  EXPECT_EQ(DomainRouter::ChooseGroupFor("summarize", o, remaining).index, -1);
  // Something known on "code" (the model), the shadowed group untried: no first try for it
  // (its steps are scored on the model's sequences).
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(model->RecordStep("code", 1, i % 10 < 9).ok());
  c = DomainRouter::ChooseGroupFor("code", options(0), remaining);
  EXPECT_EQ(c.index, 1);
  EXPECT_FALSE(c.explore);
  // A first try waits until the best known estimate is settled: four early steps of the
  // lookup on "chat" (25% accepted) hold the model back; sixteen let it be tried.
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(lookup->RecordStep("chat", 1, i == 0).ok());
  ASSERT_FALSE(lookup->Settled("chat"));
  c = DomainRouter::ChooseGroupFor("chat", options(10), remaining);
  EXPECT_EQ(c.index, 0);
  EXPECT_FALSE(c.explore);
  for (int i = 0; i < 12; ++i) ASSERT_TRUE(lookup->RecordStep("chat", 1, i % 4 == 0).ok());
  ASSERT_TRUE(lookup->Settled("chat"));
  c = DomainRouter::ChooseGroupFor("chat", options(10), remaining);
  EXPECT_EQ(c.index, 1);
  EXPECT_TRUE(c.explore);
  // A group with no timings at all has an unbounded optimism: always worth a first try.
  auto fresh = SpecController::Create({}).value();
  o = options(300);
  o[1].controller = fresh.get();
  c = DomainRouter::ChooseGroupFor("summarize", o, remaining);
  EXPECT_EQ(c.index, 1);
  EXPECT_TRUE(c.explore);
  EXPECT_TRUE(std::isinf(c.bound[1]));
}

}  // namespace
}  // namespace specnode
