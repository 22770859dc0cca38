// The GPU layout check of `serve --check-config` (node/serve/gpu_layout.h) with injected
// inventories: 2 nodes x 8 GPUs, CUDA_VISIBLE_DEVICES subsets and its rules, repeated
// GPUs, too few GPUs, a draft on a GPU of its own, hosts against the rank mapping.
#include "node/serve/gpu_layout.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace specnode {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A placement's YAML flow map.
std::string At(int rank, const std::string& device, const std::string& host = "") {
  return absl::StrCat("{rank: ", rank, ", device: \"", device, "\"",
                      host.empty() ? "" : absl::StrCat(", host: ", host), "}");
}

Topology Parse(const std::string& groups) {
  absl::StatusOr<ServeConfig> c = ParseServeConfig(
      absl::StrCat("speculation:\n  draft: /models/draft.gguf\ntopology:\n  groups:\n", groups),
      "t.yaml");
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? c->topology : Topology{};
}

// Groups of `ranks` ranks from `first`: a draft on the first, the target on the rest, at
// cuda:(rank - base) on `host`.
std::string Group(const std::string& name, int first, int ranks, int base,
                  const std::string& host = "") {
  std::string g = absl::StrCat(
      "    - name: ", name, "\n      draft: ", At(first, absl::StrCat("cuda:", first - base), host),
      "\n      target:\n");
  for (int r = first + 1; r < first + ranks; ++r) {
    absl::StrAppend(&g, "        - ", At(r, absl::StrCat("cuda:", r - base), host), "\n");
  }
  return g;
}

// As cluster-configs/gpu-1node-8gpu.yaml: group a a draft GPU + a TP-4 target, group b a
// draft GPU + a TP-2 target.
Topology OneNode() { return Parse(Group("a", 0, 5, 0) + Group("b", 5, 3, 0)); }

// As cluster-configs/gpu-2node-16gpu.yaml: that on each node (groups nodeA, nodeA-2,
// nodeB, nodeB-2), cuda:N = the rank's local rank.
Topology TwoNodes() {
  return Parse(Group("nodeA", 0, 5, 0, "nodeA") + Group("nodeA-2", 5, 3, 0, "nodeA") +
               Group("nodeB", 8, 5, 8, "nodeB") + Group("nodeB-2", 13, 3, 8, "nodeB"));
}

NodeGpus Gpus(int n, std::optional<std::string> cvd = std::nullopt) {
  absl::StatusOr<NodeGpus> g = NodeWithGpus(n, cvd, absl::StrCat(n, " GPUs"));
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? *g : NodeGpus{};
}

GpuLayout Plan(const Topology& t, int ranks_per_node, std::vector<NodeGpus> nodes) {
  absl::StatusOr<GpuLayout> l = PlanGpuLayout(t, ranks_per_node, "test", std::move(nodes));
  EXPECT_TRUE(l.ok()) << l.status();
  return l.ok() ? *l : GpuLayout{};
}

const RankGpu& RankOf(const GpuLayout& l, int rank) {
  for (const RankGpu& p : l.ranks) {
    if (p.rank == rank) return p;
  }
  ADD_FAILURE() << "no rank " << rank;
  static const RankGpu kNone;
  return kNone;
}

std::vector<int> Range(int lo, int hi) {  // [lo, hi)
  std::vector<int> v;
  for (int i = lo; i < hi; ++i) v.push_back(i);
  return v;
}

TEST(GpuLayoutTest, TwoNodesOfEightGpusFit) {
  const Topology t = TwoNodes();
  EXPECT_EQ(RanksPerNodeFromHosts(t), 8);
  const GpuLayout l = Plan(t, 8, {Gpus(8), Gpus(8)});
  EXPECT_TRUE(l.ok()) << DescribeGpuLayout(l, "  ");
  ASSERT_EQ(l.ranks.size(), 16u);
  for (const RankGpu& p : l.ranks) {
    EXPECT_EQ(p.node, p.rank / 8);
    EXPECT_EQ(p.local_rank, p.rank % 8);
    EXPECT_EQ(p.gpu, std::to_string(p.rank % 8));  // the shipped config: cuda:N = local rank
    EXPECT_EQ(p.problem, "");
  }
  EXPECT_EQ(RankOf(l, 0).role, "coordinator + draft of group nodeA");
  EXPECT_EQ(RankOf(l, 8).role, "draft of group nodeB");
  EXPECT_EQ(RankOf(l, 11).role, "target of group nodeB (TP rank 2 of 4)");
  EXPECT_EQ(RankOf(l, 13).role, "draft of group nodeB-2");
  EXPECT_EQ(RankOf(l, 15).role, "target of group nodeB-2 (TP rank 1 of 2)");
  const std::string text = DescribeGpuLayout(l, "  ");
  EXPECT_THAT(text, HasSubstr("16 ranks on 2 nodes, 8 per node (test): mpirun --map-by "
                              "ppr:8:node puts rank r on node r / 8 as local rank r % 8\n"
                              "  each node: 8 GPUs visible (8 GPUs)\n"));
  EXPECT_THAT(text, HasSubstr("\n  rank 9: node 1 (host nodeB), local rank 1, target of group "
                              "nodeB (TP rank 0 of 4), cuda:1 = GPU 1\n"));
}

TEST(GpuLayoutTest, NoGpusFailsEveryGpuRankNamingItsNode) {
  const GpuLayout l = Plan(TwoNodes(), 8, {Gpus(0), Gpus(0)});
  EXPECT_FALSE(l.ok());
  EXPECT_EQ(l.FailingRanks(), Range(0, 16));
  EXPECT_EQ(RankOf(l, 12).problem, "does not exist on node 1 (0 GPUs visible)");
  EXPECT_THAT(DescribeGpuLayout(l, ""),
              HasSubstr("\nrank 0: node 0 (host nodeA), local rank 0, coordinator + draft of "
                        "group nodeA, cuda:0: does not exist on node 0 (0 GPUs visible)"));
}

TEST(GpuLayoutTest, TooFewGpusFailTheRanksBeyondThem) {
  const GpuLayout l = Plan(OneNode(), 8, {Gpus(6)});
  EXPECT_EQ(l.FailingRanks(), std::vector<int>({6, 7}));
  EXPECT_EQ(RankOf(l, 7).problem, "does not exist on node 0 (6 GPUs visible)");
  // Nodes may differ: the second node's 4 GPUs fail its ranks 12-15 only.
  const GpuLayout two = Plan(TwoNodes(), 8, {Gpus(8), Gpus(4)});
  EXPECT_EQ(two.FailingRanks(), Range(12, 16));
  const std::string text = DescribeGpuLayout(two, "");
  EXPECT_THAT(text,
              HasSubstr("\nnode 0: 8 GPUs visible (8 GPUs)\nnode 1: 4 GPUs visible (4 GPUs)"));
}

TEST(GpuLayoutTest, CudaVisibleDevicesSubsetRenumbersTheGpus) {
  const NodeGpus upper = Gpus(8, "4,5,6,7");
  EXPECT_THAT(upper.visible, ElementsAre("4", "5", "6", "7"));
  const GpuLayout l = Plan(OneNode(), 8, {upper});
  EXPECT_EQ(RankOf(l, 0).gpu, "4");  // cuda:0 is the first GPU listed
  EXPECT_EQ(RankOf(l, 3).gpu, "7");
  EXPECT_EQ(l.FailingRanks(), Range(4, 8));
  EXPECT_THAT(DescribeGpuLayout(l, ""), HasSubstr("the node: 4 GPUs visible: 4,5,6,7 (8 GPUs)"));
  // Listed order is CUDA's order.
  EXPECT_THAT(Gpus(8, "2,1").visible, ElementsAre("2", "1"));
  EXPECT_THAT(Gpus(8, " 01 , 3").visible, ElementsAre("1", "3"));
}

TEST(GpuLayoutTest, CudaVisibleDevicesFollowsCudasRules) {
  // Unset: every GPU; set and empty: none.
  EXPECT_THAT(Gpus(3).visible, ElementsAre("0", "1", "2"));
  EXPECT_TRUE(Gpus(8, "").visible.empty());
  // An entry naming no GPU hides itself and every entry after it.
  const NodeGpus hidden = Gpus(8, "0,9,1,2");
  EXPECT_THAT(hidden.visible, ElementsAre("0"));
  EXPECT_EQ(hidden.note,
            "CUDA_VISIBLE_DEVICES entry \"9\" names none of the node's 8 GPUs: CUDA hides it and "
            "the 2 entries after it");
  EXPECT_THAT(Gpus(8, "3,-1,4").visible, ElementsAre("3"));
  EXPECT_EQ(Gpus(8, "1,x").note,
            "CUDA_VISIBLE_DEVICES entry \"x\" names none of the node's 8 GPUs: CUDA hides it");
  EXPECT_EQ(Gpus(8, "1,8,2").note,
            "CUDA_VISIBLE_DEVICES entry \"8\" names none of the node's 8 GPUs: CUDA hides it and "
            "the entry after it");
  // UUIDs cannot be checked away from the node: taken as GPUs of it.
  EXPECT_THAT(Gpus(2, "GPU-8f3a,MIG-77").visible, ElementsAre("GPU-8f3a", "MIG-77"));
  // A repeat is refused, however spelt.
  for (const char* cvd : {"0,0", "1,01", "GPU-8f3a,GPU-8f3a"}) {
    absl::StatusOr<NodeGpus> g = NodeWithGpus(8, std::string(cvd), "x");
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument) << cvd;
    EXPECT_THAT(g.status().message(), HasSubstr("twice")) << cvd;
  }
  EXPECT_FALSE(NodeWithGpus(-1, std::nullopt, "x").ok());
}

TEST(GpuLayoutTest, NodeSeenByRuntimeNamesTheListedGpus) {
  absl::StatusOr<NodeGpus> g = NodeSeenByRuntime(2, std::string("3,5,7"), "runtime");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_THAT(g->visible, ElementsAre("3", "5"));
  EXPECT_EQ(g->note, "CUDA_VISIBLE_DEVICES lists 3, the runtime shows 2");
  g = NodeSeenByRuntime(4, std::nullopt, "runtime");
  ASSERT_TRUE(g.ok());
  EXPECT_THAT(g->visible, ElementsAre("0", "1", "2", "3"));
  EXPECT_FALSE(NodeSeenByRuntime(3, std::string("1,2"), "runtime").ok());
  EXPECT_FALSE(NodeSeenByRuntime(1, std::string("1,1"), "runtime").ok());
}

TEST(GpuLayoutTest, TwoRanksOnOneGpuFailBoth) {
  // Group b's draft (rank 4) on cuda:1, which target rank 1 of group a already opens.
  const Topology t = Parse(absl::StrCat("    - name: a\n      draft: ", At(0, "cuda:0"),
                                        "\n      target: [", At(1, "cuda:1"), ", ", At(2, "cuda:2"),
                                        "]\n", "    - name: b\n      draft: ", At(3, "cuda:1"),
                                        "\n      target: [", At(4, "cuda:3"), "]\n"));
  const GpuLayout l = Plan(t, 5, {Gpus(8)});
  EXPECT_EQ(l.FailingRanks(), std::vector<int>({1, 3}));
  EXPECT_EQ(RankOf(l, 1).problem, "GPU 1 of node 0 is opened by rank 3 too (one GPU per rank)");
  EXPECT_EQ(RankOf(l, 3).problem, "GPU 1 of node 0 is opened by rank 1 too (one GPU per rank)");
  // On different nodes the same index is a different GPU.
  EXPECT_TRUE(Plan(t, 3, {Gpus(8), Gpus(8)}).ok());
}

TEST(GpuLayoutTest, ADraftOnAGpuOfItsOwn) {
  // The 1-node config: drafts on GPUs 0 and 5, targets on the rest: one GPU per rank.
  const GpuLayout l = Plan(OneNode(), 8, {Gpus(8)});
  EXPECT_TRUE(l.ok()) << DescribeGpuLayout(l, "  ");
  EXPECT_EQ(RankOf(l, 5).role, "draft of group b");
  EXPECT_EQ(RankOf(l, 5).gpu, "5");
  // Rank 0 drafting for both groups on one GPU is one process on one GPU: no conflict.
  const Topology shared =
      Parse(absl::StrCat("    - name: a\n      draft: ", At(0, "cuda:0"), "\n      target: [",
                         At(1, "cuda:1"), "]\n    - name: b\n      draft: ", At(0, "cuda:0"),
                         "\n      target: [", At(2, "cuda:2"), "]\n"));
  const GpuLayout s = Plan(shared, 3, {Gpus(3)});
  EXPECT_TRUE(s.ok()) << DescribeGpuLayout(s, "  ");
  EXPECT_EQ(RankOf(s, 0).role, "coordinator + draft of group a, draft of group b");
  // A draft sharing a target's GPU fails both.
  const Topology clash = Parse(absl::StrCat("    - name: a\n      draft: ", At(0, "cuda:1"),
                                            "\n      target: [", At(1, "cuda:1"), "]\n"));
  EXPECT_EQ(Plan(clash, 2, {Gpus(2)}).FailingRanks(), std::vector<int>({0, 1}));
}

TEST(GpuLayoutTest, CpuRanksNeedNoGpu) {
  const Topology t = Parse(absl::StrCat("    - name: a\n      draft: {rank: 0}\n      target: [",
                                        At(1, "cuda:0"), "]\n"));
  EXPECT_TRUE(UsesGpus(t));
  const GpuLayout l = Plan(t, 2, {Gpus(1)});
  EXPECT_TRUE(l.ok());
  EXPECT_THAT(DescribeGpuLayout(l, ""),
              HasSubstr("\nrank 0: node 0, local rank 0, coordinator + draft of group a, cpu\n"));
  EXPECT_FALSE(
      UsesGpus(Parse("    - name: a\n      draft: {rank: 0}\n      target: [{rank: "
                     "1}]\n")));
}

TEST(GpuLayoutTest, HostsMustFollowTheMapping) {
  // All 16 ranks on one node: node B's ranks land beside node A's, on the same GPUs.
  const GpuLayout l = Plan(TwoNodes(), 16, {Gpus(16)});
  EXPECT_EQ(l.FailingRanks(), Range(0, 16));
  EXPECT_EQ(RankOf(l, 1).problem, "GPU 1 of node 0 is opened by rank 9 too (one GPU per rank)");
  EXPECT_EQ(RankOf(l, 9).problem,
            "GPU 1 of node 0 is opened by rank 1 too (one GPU per rank); host nodeB, but it lands "
            "on node 0, whose rank 0 names host nodeA");
  EXPECT_EQ(l.hint,
            "the config's hosts hold 8 ranks each: check with --ranks-per-node 8 and launch with "
            "mpirun --map-by ppr:8:node");
  // 4 per node: nodeA's ranks 4-7 land on a second node, nodeB's 12-15 on a fourth.
  const GpuLayout four = Plan(TwoNodes(), 4, {Gpus(8), Gpus(8), Gpus(8), Gpus(8)});
  EXPECT_EQ(four.FailingRanks(), std::vector<int>({4, 5, 6, 7, 12, 13, 14, 15}));
  EXPECT_EQ(RankOf(four, 5).problem,
            "host nodeA, but it lands on node 1 and rank 0, on node 0, names host nodeA too");
  EXPECT_THAT(DescribeGpuLayout(four, ""), HasSubstr("\n(the config's hosts hold 8 ranks each"));
}

TEST(GpuLayoutTest, RanksPerNodeFromHostsNeedsEqualRunsInRankOrder) {
  auto hosts = [](const std::vector<std::string>& h) {
    std::string groups =
        absl::StrCat("    - name: a\n      draft: ", At(0, "cuda:0", h[0]), "\n      target:\n");
    for (size_t r = 1; r < h.size(); ++r) {
      absl::StrAppend(&groups, "        - ", At(r, absl::StrCat("cuda:", r), h[r]), "\n");
    }
    return RanksPerNodeFromHosts(Parse(groups));
  };
  EXPECT_EQ(hosts({"a", "a", "b", "b"}), 2);
  EXPECT_EQ(hosts({"a", "a", "a", "b"}), 3);  // the last node may hold fewer
  EXPECT_EQ(hosts({"a", "b", "b", "b"}), std::nullopt);
  EXPECT_EQ(hosts({"a", "b", "a", "b"}), std::nullopt);  // round robin is not ppr:R:node
  EXPECT_EQ(hosts({"a", "a", "", "b"}), std::nullopt);
  EXPECT_EQ(RanksPerNodeFromHosts(OneNode()), std::nullopt);  // no hosts
}

TEST(GpuLayoutTest, RefusesBadArguments) {
  EXPECT_EQ(PlanGpuLayout(OneNode(), 0, "x", {Gpus(8)}).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<GpuLayout> l = PlanGpuLayout(TwoNodes(), 8, "x", {Gpus(8)});
  EXPECT_EQ(l.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(l.status().message(), HasSubstr("16 ranks at 8 per node need 2 nodes' GPUs, got 1"));
}

TEST(GpuLayoutTest, RankRanges) {
  EXPECT_EQ(RankRanges({}), "");
  EXPECT_EQ(RankRanges({3}), "3");
  EXPECT_EQ(RankRanges({0, 1, 2, 3, 5, 7, 8}), "0-3, 5, 7-8");
}

}  // namespace
}  // namespace specnode
