// The token-recycling drafter (coordinator/recycling_drafter.h): its table of the target's
// candidates, the ranks' measured shares, the chains and trees it grows, and the engine
// feeding it the target's rows (a tiny model: it drafts only from what it was shown).
#include "coordinator/recycling_drafter.h"

#include <gtest/gtest.h>

#include <vector>

#include "coordinator/draft_tree.h"
#include "model/llama/kv_cache.h"
#include "tests/coordinator/spec_controller_test_util.h"
#include "tests/coordinator/spec_engine_test_util.h"

namespace specnode {
namespace {

using Tokens = std::vector<int32_t>;

std::unique_ptr<RecyclingDrafter> Make(int top_k = 4, int branch = 2) {
  RecyclingDrafterOptions o;
  o.top_k = top_k;
  o.branch = branch;
  return std::move(RecyclingDrafter::Create(o)).value();
}

TEST(RecyclingDrafterTest, RefusesBadOptionsNamingThem) {
  for (auto [top_k, branch, max_id] :
       {std::tuple{0, 1, 10}, std::tuple{33, 1, 10}, std::tuple{4, 0, 10}, std::tuple{4, 5, 10},
        std::tuple{4, 2, 0}}) {
    auto d = RecyclingDrafter::Create({top_k, branch, max_id});
    ASSERT_FALSE(d.ok()) << top_k << " " << branch;
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(d.status().message().find("top_k"), std::string_view::npos);
  }
  EXPECT_EQ(Make(8)->name(), "recycle:8");
  EXPECT_EQ(Make(8)->ObservedTopK(), 8);
}

TEST(RecyclingDrafterTest, KeepsTheLatestRowsAndMergesDrawnTokens) {
  auto d = Make(/*top_k=*/3);
  EXPECT_TRUE(d->Row(5).empty());
  // Two rows of three candidates: tokens 5 and 9.
  d->ObserveTarget(Tokens{5, 9}, Tokens{1, 2, 3, 4, 5, 6}, 3);
  EXPECT_EQ(d->Row(5), (Tokens{1, 2, 3}));
  EXPECT_EQ(d->Row(9), (Tokens{4, 5, 6}));
  // A newer full row replaces the old one; wider rows are cut to top_k.
  d->ObserveTarget(Tokens{5}, Tokens{7, 1, 8, 2}, 4);
  EXPECT_EQ(d->Row(5), (Tokens{7, 1, 8}));
  // A drawn token (k = 1) goes in front, the older candidates after it, none twice.
  d->ObserveTarget(Tokens{5, 9}, Tokens{8, 2}, 1);
  EXPECT_EQ(d->Row(5), (Tokens{8, 7, 1}));
  EXPECT_EQ(d->Row(9), (Tokens{2, 4, 5}));
  // Rows without candidates (-1: non-finite logits), tokens past the bound: ignored.
  d->ObserveTarget(Tokens{9}, Tokens{-1, -1, -1}, 3);
  EXPECT_EQ(d->Row(9), (Tokens{2, 4, 5}));
  auto small = RecyclingDrafter::Create({2, 1, 10});
  (*small)->ObserveTarget(Tokens{10, 3}, Tokens{1, 2, 4, 5}, 2);
  EXPECT_TRUE((*small)->Row(10).empty());
  EXPECT_EQ((*small)->Row(3), (Tokens{4, 5}));
}

TEST(RecyclingDrafterTest, RankSharesFollowWhereTheTargetsNextTopTokenWas) {
  auto d = Make(/*top_k=*/3);
  // Before any lookup the prior keeps the ranks in order.
  EXPECT_GT(d->RankShare(0), d->RankShare(1));
  EXPECT_GT(d->RankShare(1), d->RankShare(2));
  d->ObserveTarget(Tokens{5}, Tokens{1, 2, 3}, 3);
  // Each next row's best is the old row's second candidate: rank 1 earns the hits.
  for (int i = 0; i < 20; ++i) {
    const Tokens row = d->Row(5);
    d->ObserveTarget(Tokens{5}, Tokens{row[1], row[0], row[2]}, 3);
  }
  EXPECT_GT(d->RankShare(1), 0.9);
  EXPECT_LT(d->RankShare(0), 0.1);
  EXPECT_LT(d->RankShare(2), 0.1);
}

TEST(RecyclingDrafterTest, ChainsFollowTheBestCandidateAndTreesBranchBestFirst) {
  auto d = Make(/*top_k=*/3, /*branch=*/2);
  // 1 -> {2, 3, 4}, 2 -> {5, 6, 7}, 3 -> {8, 9, 10}, 5 -> {11, 12, 13}.
  d->ObserveTarget(Tokens{1, 2, 3, 5}, Tokens{2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13}, 3);
  std::vector<Draft> drafts;
  const Tokens context = {9, 1};
  DraftRequest chain{1, context, 3, nullptr, "d", false, 0};
  ASSERT_TRUE(d->Propose({&chain, 1}, &drafts).ok());
  EXPECT_EQ(drafts[0].tokens, (Tokens{2, 5, 11}));
  EXPECT_TRUE(drafts[0].parents.empty());
  // No row for the last token: nothing to propose.
  const Tokens unseen = {1, 42};
  DraftRequest none{1, unseen, 3, nullptr, "d", false, 0};
  ASSERT_TRUE(d->Propose({&none, 1}, &drafts).ok());
  EXPECT_TRUE(drafts[0].tokens.empty());
  // A tree of 5 nodes at most 3 deep, grown best first at the prior's shares (rank 0: 1/2,
  // rank 1: 1/4; products along the path; ties to the earlier candidate): 2 (.5), 3 (.25),
  // 5 (.25), 6 (.125), 8 (.125) — laid out with the chain 2 -> 5 first.
  DraftRequest tree{1, context, 3, nullptr, "d", false, 5};
  ASSERT_TRUE(d->Propose({&tree, 1}, &drafts).ok());
  const Draft& t = drafts[0];
  EXPECT_EQ(t.tokens, (Tokens{2, 5, 3, 6, 8}));
  EXPECT_EQ(t.parents, (Tokens{-1, 0, -1, 0, 2}));
  EXPECT_TRUE(ValidateTree(t.tokens, t.parents).ok());
  // Depth bound: with k = 1 only the root's children (at most `branch` of them).
  DraftRequest shallow{1, context, 1, nullptr, "d", false, 5};
  ASSERT_TRUE(d->Propose({&shallow, 1}, &drafts).ok());
  EXPECT_EQ(drafts[0].tokens, (Tokens{2, 3}));
  EXPECT_EQ(drafts[0].parents, (Tokens{-1, -1}));
}

using spec_engine_test::NewController;
using spec_engine_test::SpecEngineTest;

// The engine feeds the drafter the target's rows: it starts with an empty table, learns
// from the target's own passes and then drafts — and greedy text stays the target's.
TEST_F(SpecEngineTest, RecyclingLearnsFromTheTargetsRows) {
  auto base_runner = MakeRunner("full");
  SpeculativeEngine base(base_runner.get(), {}, {});
  auto requests = Prompts(0.0f, 48, 3);
  const auto expected = Run(base, requests);
  auto runner = MakeRunner("full");
  auto drafter = Make(/*top_k=*/8, /*branch=*/4);
  auto controller = NewController();
  SpecEngineOptions options;
  options.adaptive = false;
  options.fixed_k = 3;
  SpeculativeEngine engine(runner.get(), {{drafter.get(), controller.get()}}, options);
  EXPECT_EQ(Run(engine, requests, runner.get()), expected);
  // Every token the target was fed has a row of eight candidates.
  const std::span<const int32_t> prompt(requests[0].prompt);
  EXPECT_EQ(drafter->Row(expected[0][3]).size(), 8u);
  EXPECT_EQ(drafter->Row(prompt.back()).size(), 8u);
  const DomainSnapshot snap = controller->Snapshot(requests[0].domain);
  EXPECT_GT(snap.drafted, 0);
  EXPECT_GT(snap.accepted, 0);
}

}  // namespace
}  // namespace specnode
