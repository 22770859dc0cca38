// TreeGain (coordinator/tree_gain.h): trees scored against the committed text after the
// fact, per-domain means over a window, and the tree-or-chain choice from the costs.
#include "coordinator/tree_gain.h"

#include <gtest/gtest.h>

#include <optional>
#include <vector>

namespace specnode {
namespace {

using Tokens = std::vector<int32_t>;

// Drafted at position 2: chain 10 -> 11 -> 12, a branch 20 under the root and 21 under 10.
const Tokens kTokens = {10, 11, 12, 20, 21};
const Tokens kParents = {-1, 0, 1, -1, 0};

TEST(TreeGainTest, ScoresTheTreeAndItsChainAgainstTheCommittedText) {
  // The text went 10, 21, 7: the chain keeps 1 node, the tree 2 (through the branch 21).
  auto o = ScoreTree(kTokens, kParents, 2, Tokens{1, 2, 10, 21, 7});
  ASSERT_TRUE(o.has_value());
  EXPECT_EQ(o->tree_nodes, 5);
  EXPECT_EQ(o->chain_nodes, 3);
  EXPECT_EQ(o->tree_accepted, 2);
  EXPECT_EQ(o->chain_accepted, 1);
  // Until the token after the last kept node is committed, nothing is decided.
  EXPECT_FALSE(ScoreTree(kTokens, kParents, 2, Tokens{1, 2, 10, 21}).has_value());
  EXPECT_FALSE(ScoreTree(kTokens, kParents, 2, Tokens{1, 2}).has_value());
  // The chain all the way: both keep 3.
  o = ScoreTree(kTokens, kParents, 2, Tokens{1, 2, 10, 11, 12, 13});
  ASSERT_TRUE(o.has_value());
  EXPECT_EQ(o->tree_accepted, 3);
  EXPECT_EQ(o->chain_accepted, 3);
  // Nothing matches: both 0, decided by the first token.
  o = ScoreTree(kTokens, kParents, 2, Tokens{1, 2, 99});
  ASSERT_TRUE(o.has_value());
  EXPECT_EQ(o->tree_accepted, 0);
  EXPECT_EQ(o->chain_accepted, 0);
  // A chain has nothing to score.
  EXPECT_FALSE(ScoreTree(Tokens{10, 11}, Tokens{-1, 0}, 2, Tokens{1, 2, 10, 11, 5}).has_value());
}

TEST(TreeGainTest, ChoosesTheTreeOnlyWhereItsGainPaysForItsRows) {
  TreeGain gain;
  const TreeOutcome branchy{8, 3, 2, 1};  // the tree keeps one node more than its chain
  // Rows cost 10% of a 10 ms pass each.
  auto cheap = [](int n) -> std::optional<double> { return 0.010 + 0.001 * n; };
  auto dear = [](int n) -> std::optional<double> { return 0.010 + 0.004 * n; };
  auto unknown = [](int) -> std::optional<double> { return std::nullopt; };
  for (int i = 0; i < TreeGain::kMinSteps - 1; ++i) gain.Record("code", branchy);
  EXPECT_FALSE(gain.PreferTree("code", 0.0, cheap));  // chains until enough evidence
  gain.Record("code", branchy);
  // (1 + 2) / 18 ms > (1 + 1) / 13 ms with cheap rows; (1 + 2) / 42 ms < 2 / 22 ms dear.
  EXPECT_TRUE(gain.PreferTree("code", 0.0, cheap));
  EXPECT_FALSE(gain.PreferTree("code", 0.0, dear));
  EXPECT_FALSE(gain.PreferTree("code", 0.0, unknown));
  EXPECT_FALSE(gain.PreferTree("prose", 0.0, cheap));  // another domain: no evidence
  // The window forgets: a run of trees that gain nothing turns the choice.
  for (int i = 0; i < TreeGain::kWindow; ++i) gain.Record("code", TreeOutcome{8, 3, 1, 1});
  const TreeGain::Estimate e = gain.Get("code");
  EXPECT_EQ(e.steps, TreeGain::kWindow);
  EXPECT_DOUBLE_EQ(e.tree_accepted, 1.0);
  EXPECT_DOUBLE_EQ(e.chain_nodes, 3.0);
  EXPECT_FALSE(gain.PreferTree("code", 0.0, cheap));
}

TEST(TreeGainTest, DomainsBeyondTheBoundShareOneEntry) {
  TreeGain gain;
  for (int d = 0; d < TreeGain::kMaxDomains; ++d)
    gain.Record("d" + std::to_string(d), {4, 2, 1, 0});
  gain.Record("late-a", TreeOutcome{4, 2, 2, 0});
  gain.Record("late-b", TreeOutcome{4, 2, 2, 0});
  EXPECT_EQ(gain.Get("late-a").steps, 2);  // both in the overflow entry
  EXPECT_EQ(gain.Get("never-seen").steps, 2);
  EXPECT_EQ(gain.Get("d5").steps, 1);
}

}  // namespace
}  // namespace specnode
