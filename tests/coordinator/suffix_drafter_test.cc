// The suffix index, the suffix drafter's trees and chains, and draft-tree helpers
// (coordinator/suffix_index.h, suffix_drafter.h, draft_tree.h).
#include <gtest/gtest.h>

#include <vector>

#include "coordinator/draft_tree.h"
#include "coordinator/suffix_drafter.h"
#include "coordinator/suffix_index.h"
#include "model/llama/kv_cache.h"

namespace specnode {
namespace {

using Tokens = std::vector<int32_t>;

TEST(SuffixIndexTest, CountsWhatFollowedTheLongestSuffix) {
  SuffixIndex index(4);
  // "1 2 3" three times, "1 2 4" once, then a context ending in "1 2".
  index.Append(Tokens{1, 2, 3, 9, 1, 2, 4, 9, 1, 2, 3, 9, 1, 2, 3, 9});
  const SuffixIndex::Match m = index.Longest(Tokens{7, 1, 2}, 1);
  EXPECT_EQ(m.n, 2);
  ASSERT_EQ(m.next.size(), 2u);
  EXPECT_EQ(m.next[0].token, 3);
  EXPECT_EQ(m.next[0].count, 3);
  EXPECT_EQ(m.next[1].token, 4);
  EXPECT_EQ(m.total, 4);
  // The longest suffix seen wins over a more frequent shorter one ("3 9 1 2": followed once
  // by 4, once by 3); its continuations tie, and the newest comes first.
  const SuffixIndex::Match longer = index.Longest(Tokens{3, 9, 1, 2}, 1);
  EXPECT_EQ(longer.n, 4);
  EXPECT_EQ(longer.next[0].token, 3);
  EXPECT_EQ(longer.total, 2);
  // Nothing shorter than min_n; nothing for an unseen suffix.
  EXPECT_EQ(index.Longest(Tokens{5, 2}, 2).n, 0);
  EXPECT_EQ(index.Longest(Tokens{5, 6}, 1).n, 0);
}

TEST(SuffixIndexTest, BreaksEndDocumentsAndTiesGoToTheNewest) {
  SuffixIndex index(3);
  index.Append(Tokens{1, 2});
  index.Break();
  index.Append(Tokens{5, 6});
  // "2 5" never occurred: the break kept the documents apart.
  EXPECT_EQ(index.Longest(Tokens{2}, 1).n, 0);
  index.Append(Tokens{1, 7, 1, 8});
  // Continuations of one n-gram come from every document, once each here: newest first.
  const SuffixIndex::Match m = index.Longest(Tokens{1}, 1);
  ASSERT_EQ(m.next.size(), 3u);
  EXPECT_EQ(m.next[0].token, 8);
  EXPECT_EQ(m.next[1].token, 7);
  EXPECT_EQ(m.next[2].token, 2);
}

TEST(SuffixIndexTest, KeepsAtMostKMaxNextContinuations) {
  SuffixIndex index(1);
  Tokens stream;
  for (int t = 0; t < 40; ++t) stream.insert(stream.end(), {1000, t});
  stream.insert(stream.end(), {1000, 3, 1000, 3});  // 3 is frequent: survives
  index.Append(stream);
  const SuffixIndex::Match m = index.Longest(Tokens{1000}, 1);
  EXPECT_EQ(static_cast<int>(m.next.size()), SuffixIndex::kMaxNext);
  EXPECT_EQ(m.next[0].token, 3);
}

TEST(DraftTreeTest, ValidatesShapesAndLaysPathsOut) {
  EXPECT_TRUE(ValidateTree(Tokens{5, 6, 7}, Tokens{-1, 0, 0}).ok());
  EXPECT_FALSE(ValidateTree(Tokens{5, 6}, Tokens{-1}).ok());
  EXPECT_FALSE(ValidateTree(Tokens{5, 6}, Tokens{-1, 1}).ok());  // parent after node
  EXPECT_FALSE(ValidateTree(Tokens{5, 6}, Tokens{-1, -2}).ok());
  EXPECT_FALSE(ValidateTree(Tokens{5, 5}, Tokens{-1, -1}).ok());  // twin siblings
  EXPECT_TRUE(ValidateTree(Tokens{5, 5}, Tokens{-1, 0}).ok());
  const Tokens parents = {-1, 0, 1, 0, 3, -1};
  EXPECT_EQ(ChainLength(parents), 3);
  EXPECT_EQ(TreeRowDepths(parents), (Tokens{0, 1, 2, 1, 2, 0}));
  Tokens path;
  TreeRowPath(parents, 4, &path);
  EXPECT_EQ(path, (Tokens{0, 3, 4}));
  Tokens rows, row_parents;
  TreePassRows(42, DraftTree{{5, 6, 7}, {-1, 0, 0}}, &rows, &row_parents);
  EXPECT_EQ(rows, (Tokens{42, 5, 6, 7}));
  EXPECT_EQ(row_parents, (Tokens{-1, 0, 1, 1}));
}

TEST(DraftTreeTest, MatchKeepsThePathTheTargetDraws) {
  // Root children 10 (node 0) and 20 (node 3); 10 -> 11 (1) -> 12 (2); 20 -> 21 (4).
  const DraftTree tree{{10, 11, 12, 20, 21}, {-1, 0, 1, -1, 3}};
  std::vector<int32_t> kept;
  // The target draws 20 at the root row, then 21 at node 3's row, then 99 at node 4's.
  EXPECT_EQ(AcceptTreeMatch(tree, Tokens{20, 0, 0, 0, 21, 99}, &kept), 99);
  EXPECT_EQ(kept, (Tokens{3, 4}));
  // The main chain all the way, then the bonus from the leaf's row.
  EXPECT_EQ(AcceptTreeMatch(tree, Tokens{10, 11, 12, 77, 0, 0}, &kept), 77);
  EXPECT_EQ(kept, (Tokens{0, 1, 2}));
  // Nothing drafted matches the root's draw: only the target's token.
  EXPECT_EQ(AcceptTreeMatch(tree, Tokens{30, 11, 12, 77, 21, 0}, &kept), 30);
  EXPECT_TRUE(kept.empty());
  // A draw at a node that is not on the kept path is never read (node 3's row says 21 but
  // the walk went down node 0, whose row drew 13).
  EXPECT_EQ(AcceptTreeMatch(tree, Tokens{10, 13, 0, 0, 21, 0}, &kept), 13);
  EXPECT_EQ(kept, (Tokens{0}));
}

SuffixDrafterOptions Options(int branch = 3) {
  SuffixDrafterOptions o;
  o.max_n = 6;
  o.min_n = 1;
  o.history_min_n = 2;
  o.branch = branch;
  o.min_share = 0.1;
  return o;
}

TEST(SuffixDrafterTest, RejectsBadOptions) {
  SuffixDrafterOptions o = Options();
  o.min_n = 0;
  EXPECT_FALSE(SuffixDrafter::Create(o).ok());
  o = Options();
  o.history_min_n = 7;
  EXPECT_FALSE(SuffixDrafter::Create(o).ok());
  o = Options();
  o.branch = 0;
  EXPECT_FALSE(SuffixDrafter::Create(o).ok());
  o = Options();
  o.min_share = 1.5;
  EXPECT_FALSE(SuffixDrafter::Create(o).ok());
}

// "6" was followed by "7 8" twice and by "9" once; "6 7 8" by 2, then by 4.
const Tokens kBranchy = {1, 6, 7, 8, 2, 6, 9, 3, 6, 7, 8, 4, 6};

TEST(SuffixDrafterTest, ChainsCopyTheMostFrequentContinuation) {
  auto d = std::move(SuffixDrafter::Create(Options())).value();
  EXPECT_EQ(d->name(), "suffix:6");
  DraftRequest r{.seq = 1, .context = kBranchy, .k = 4, .sampler = nullptr, .domain = ""};
  std::vector<Draft> drafts;
  ASSERT_TRUE(d->Propose({&r, 1}, &drafts).ok());
  ASSERT_EQ(drafts.size(), 1u);
  // 7 (2 of 3 after "6"), 8, then 4 (ties with 2: the newest), then 6 after "6 7 8 4".
  EXPECT_EQ(drafts[0].tokens, (Tokens{7, 8, 4, 6}));
  EXPECT_TRUE(drafts[0].q.empty());
  // The longest match beats frequency: after "2 6" the text went on "9" once.
  const Tokens longest = {1, 6, 7, 8, 2, 6, 9, 3, 6, 7, 8, 2, 6};
  DraftRequest r1{.seq = 3, .context = longest, .k = 1, .sampler = nullptr, .domain = ""};
  ASSERT_TRUE(d->Propose({&r1, 1}, &drafts).ok());
  EXPECT_EQ(drafts[0].tokens, (Tokens{9}));
  // Nothing repeated: no draft.
  const Tokens fresh = {1, 2, 3};
  DraftRequest r2{.seq = 2, .context = fresh, .k = 4, .sampler = nullptr, .domain = ""};
  ASSERT_TRUE(d->Propose({&r2, 1}, &drafts).ok());
  EXPECT_TRUE(drafts[0].tokens.empty());
}

TEST(SuffixDrafterTest, TreesBranchWhereTheTextDid) {
  auto d = std::move(SuffixDrafter::Create(Options())).value();
  const DraftTree tree = d->ProposeTree(1, kBranchy, "", 6, 3);
  ASSERT_TRUE(ValidateTree(tree.tokens, tree.parents).ok());
  // Best first: 7 (2/3), 8 (2/3), then 9, 4, 2 (1/3 each, in the order they were found),
  // then 3 under 9. Laid out with the chain 7 8 4 first.
  EXPECT_EQ(tree.tokens, (Tokens{7, 8, 4, 9, 2, 3}));
  EXPECT_EQ(tree.parents, (Tokens{-1, 0, 1, -1, 1, 3}));
  EXPECT_EQ(ChainLength(tree.parents), 3);
  // The budget is a hard cap; branch 1 gives the chain; equal calls give equal trees.
  EXPECT_EQ(d->ProposeTree(1, kBranchy, "", 3, 3).size(), 3);
  EXPECT_EQ(d->ProposeTree(1, kBranchy, "", 4, 1).tokens, (Tokens{7, 8, 4, 6}));
  const DraftTree again = d->ProposeTree(1, kBranchy, "", 6, 3);
  EXPECT_EQ(again.tokens, tree.tokens);
  EXPECT_EQ(again.parents, tree.parents);
  // min_share prunes the rare branches (1/3 < 0.5), never the best child.
  SuffixDrafterOptions o = Options();
  o.min_share = 0.5;
  auto strict = std::move(SuffixDrafter::Create(o)).value();
  const DraftTree pruned = strict->ProposeTree(1, kBranchy, "", 6, 3);
  EXPECT_EQ(pruned.tokens, (Tokens{7, 8, 4, 6, 2, 6}));
  EXPECT_EQ(pruned.parents, (Tokens{-1, 0, 1, 2, 1, 4}));
  EXPECT_EQ(ChainLength(pruned.parents), 4);
}

TEST(SuffixDrafterTest, FollowsAGrowingContextAndReindexesAnother) {
  auto d = std::move(SuffixDrafter::Create(Options(1))).value();
  Tokens context = {1, 2, 3, 1, 2};
  EXPECT_EQ(d->ProposeTree(1, context, "", 2, 1).tokens, (Tokens{3, 1}));
  context.insert(context.end(), {5, 1, 2});  // "1 2" now followed by 3 and 5: newest wins
  EXPECT_EQ(d->ProposeTree(1, context, "", 1, 1).tokens, (Tokens{5}));
  // Not an extension of what the sequence had: indexed afresh (no stale "1 2 -> 3").
  const Tokens other = {1, 2, 8, 1, 2};
  EXPECT_EQ(d->ProposeTree(1, other, "", 1, 1).tokens, (Tokens{8}));
}

TEST(SuffixDrafterTest, DraftsFromTheDomainHistory) {
  SuffixDrafterOptions o = Options(1);
  o.history_tokens = 64;
  auto d = std::move(SuffixDrafter::Create(o)).value();
  const Tokens first = {100, 31, 32, 33, 34, 35};
  EXPECT_TRUE(d->ProposeTree(1, first, "code", 3, 1).tokens.empty());
  d->Free(1);
  EXPECT_EQ(d->HistoryTokens("code"), 6);
  // A new request of the domain opens with "31 32": the history continues it.
  const Tokens second = {200, 31, 32};
  EXPECT_EQ(d->ProposeTree(2, second, "code", 3, 1).tokens, (Tokens{33, 34, 35}));
  // Another domain does not see it.
  EXPECT_TRUE(d->ProposeTree(3, second, "legal", 3, 1).tokens.empty());
  // Full: the oldest contexts go; the newest stays searchable.
  for (int s = 10; s < 40; ++s) {
    const Tokens c = {s * 10 + 1, s * 10 + 2, s * 10 + 3};
    d->ProposeTree(s, c, "code", 1, 1);
    d->Free(s);
  }
  EXPECT_LE(d->HistoryTokens("code"), 64);
  EXPECT_EQ(d->ProposeTree(50, Tokens{391, 392}, "code", 1, 1).tokens, (Tokens{393}));
  EXPECT_TRUE(d->ProposeTree(51, Tokens{31, 32}, "code", 1, 1).tokens.empty());
}

}  // namespace
}  // namespace specnode
