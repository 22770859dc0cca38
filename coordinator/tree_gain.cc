#include "coordinator/tree_gain.h"

#include <cmath>

#include "coordinator/draft_tree.h"

namespace specnode {
namespace {

constexpr std::string_view kOverflow = "_overflow";

// Nodes the match walk keeps through the first `n` nodes of the tree, or nullopt when a
// token it needs is not committed yet.
std::optional<int> Walk(std::span<const int32_t> tokens, std::span<const int32_t> parents, int n,
                        size_t position, std::span<const int32_t> committed) {
  int32_t at = -1;
  for (int depth = 0;; ++depth) {
    const size_t p = position + depth;
    if (p >= committed.size()) return std::nullopt;
    int32_t next = -1;
    for (int32_t i = at + 1; i < n && next < 0; ++i) {
      if (parents[i] == at && tokens[i] == committed[p]) next = i;
    }
    if (next < 0) return depth;
    at = next;
  }
}

// Seconds of a pass of `nodes` drafts (a mean: interpolated between whole counts).
std::optional<double> VerifyAt(double nodes,
                               absl::FunctionRef<std::optional<double>(int)> verify_s) {
  const int lo = static_cast<int>(std::floor(nodes));
  const std::optional<double> a = verify_s(lo), b = verify_s(lo + 1);
  if (!a || !b) return std::nullopt;
  return *a + (*b - *a) * (nodes - lo);
}

}  // namespace

std::optional<TreeOutcome> ScoreTree(std::span<const int32_t> tokens,
                                     std::span<const int32_t> parents, size_t position,
                                     std::span<const int32_t> committed) {
  TreeOutcome o;
  o.tree_nodes = static_cast<int>(tokens.size());
  o.chain_nodes = ChainLength(parents);
  if (o.chain_nodes == o.tree_nodes) return std::nullopt;
  const std::optional<int> tree = Walk(tokens, parents, o.tree_nodes, position, committed);
  if (!tree) return std::nullopt;
  // The chain's walk ends no later than the tree's: its tokens are committed too.
  o.tree_accepted = *tree;
  o.chain_accepted = *Walk(tokens, parents, o.chain_nodes, position, committed);
  return o;
}

void TreeGain::Record(std::string_view domain, const TreeOutcome& o) {
  auto it = domains_.find(domain);
  if (it == domains_.end()) {
    if (static_cast<int>(domains_.size()) >= kMaxDomains) domain = kOverflow;
    it = domains_.try_emplace(std::string(domain)).first;
  }
  Window& w = it->second;
  w.steps.push_back(o);
  w.tree_accepted += o.tree_accepted;
  w.chain_accepted += o.chain_accepted;
  w.tree_nodes += o.tree_nodes;
  w.chain_nodes += o.chain_nodes;
  if (static_cast<int>(w.steps.size()) > kWindow) {
    const TreeOutcome& old = w.steps.front();
    w.tree_accepted -= old.tree_accepted;
    w.chain_accepted -= old.chain_accepted;
    w.tree_nodes -= old.tree_nodes;
    w.chain_nodes -= old.chain_nodes;
    w.steps.pop_front();
  }
}

TreeGain::Estimate TreeGain::Get(std::string_view domain) const {
  auto it = domains_.find(domain);
  if (it == domains_.end()) it = domains_.find(kOverflow);
  if (it == domains_.end() || it->second.steps.empty()) return {};
  const Window& w = it->second;
  const double n = static_cast<double>(w.steps.size());
  return {static_cast<int>(w.steps.size()), w.tree_accepted / n, w.chain_accepted / n,
          w.tree_nodes / n, w.chain_nodes / n};
}

bool TreeGain::PreferTree(std::string_view domain, double draft_s,
                          absl::FunctionRef<std::optional<double>(int)> verify_s) const {
  const Estimate e = Get(domain);
  if (e.steps < kMinSteps) return false;
  const std::optional<double> tree_s = VerifyAt(e.tree_nodes, verify_s);
  const std::optional<double> chain_s = VerifyAt(e.chain_nodes, verify_s);
  if (!tree_s || !chain_s) return false;
  return (1.0 + e.tree_accepted) * (draft_s + *chain_s) >
         (1.0 + e.chain_accepted) * (draft_s + *tree_s);
}

}  // namespace specnode
