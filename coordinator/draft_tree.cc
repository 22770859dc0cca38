#include "coordinator/draft_tree.h"

#include <algorithm>
#include <cassert>
#include <queue>
#include <unordered_set>

#include "absl/strings/str_format.h"

namespace specnode {
namespace {

// A child not yet in the tree: the best-first frontier's entry.
struct Candidate {
  double score = 0;
  int64_t order = 0;  // tie-break: earlier pushes first (deterministic)
  int32_t parent = -1;
  int32_t token = 0;
  bool operator<(const Candidate& o) const {  // priority_queue pops the largest
    return score != o.score ? score < o.score : order > o.order;
  }
};

// The chain of best children first (each node's first-placed child is its best), the other
// nodes after in the order they were placed; parents re-numbered.
DraftTree LayOut(const std::vector<int32_t>& tokens, const std::vector<int32_t>& parents) {
  const int n = static_cast<int>(tokens.size());
  std::vector<int32_t> order;
  std::vector<char> placed(n, 0);
  for (int32_t at = -1;;) {
    int32_t best = -1;
    for (int i = 0; i < n && best < 0; ++i) {
      if (parents[i] == at) best = i;
    }
    if (best < 0) break;
    order.push_back(best);
    placed[best] = 1;
    at = best;
  }
  for (int i = 0; i < n; ++i) {
    if (!placed[i]) order.push_back(i);
  }
  std::vector<int32_t> new_index(n);
  for (int j = 0; j < n; ++j) new_index[order[j]] = j;
  DraftTree tree;
  for (int32_t old : order) {
    tree.tokens.push_back(tokens[old]);
    tree.parents.push_back(parents[old] < 0 ? -1 : new_index[parents[old]]);
  }
  return tree;
}

}  // namespace

absl::Status ValidateTree(std::span<const int32_t> tokens, std::span<const int32_t> parents) {
  if (tokens.size() != parents.size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("draft tree: %d tokens but %d parents", tokens.size(), parents.size()));
  }
  std::unordered_set<uint64_t> edges;  // (parent + 1) << 32 | token
  for (size_t i = 0; i < parents.size(); ++i) {
    const int32_t p = parents[i];
    if (p < -1 || p >= static_cast<int32_t>(i)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "draft tree: node %d has parent %d (a parent must precede its node, or be -1)", i, p));
    }
    const uint64_t edge = (static_cast<uint64_t>(p + 1) << 32) | static_cast<uint32_t>(tokens[i]);
    if (!edges.insert(edge).second) {
      return absl::InvalidArgumentError(
          absl::StrFormat("draft tree: node %d repeats token %d under parent %d", i, tokens[i], p));
    }
  }
  return absl::OkStatus();
}

int ChainLength(std::span<const int32_t> parents) {
  int n = 0;
  while (n < static_cast<int>(parents.size()) && parents[n] == n - 1) ++n;
  return n;
}

void TreePassRows(int32_t root, const DraftTree& tree, std::vector<int32_t>* tokens,
                  std::vector<int32_t>* row_parents) {
  tokens->assign(1, root);
  row_parents->assign(1, -1);
  for (int i = 0; i < tree.size(); ++i) {
    tokens->push_back(tree.tokens[i]);
    row_parents->push_back(tree.parents[i] + 1);
  }
}

int32_t AcceptTreeMatch(const DraftTree& tree, std::span<const int32_t> target,
                        std::vector<int32_t>* kept) {
  assert(static_cast<int>(target.size()) == tree.size() + 1);
  return AcceptTree(
      tree.tokens, tree.parents, [target](int32_t r) { return target[r]; }, kept);
}

int32_t AcceptTree(std::span<const int32_t> tokens, std::span<const int32_t> parents,
                   absl::FunctionRef<int32_t(int32_t row)> draw, std::vector<int32_t>* kept) {
  kept->clear();
  const int32_t n = static_cast<int32_t>(tokens.size());
  int32_t at = -1;  // the node whose row is being matched (-1: the root's row 0)
  for (;;) {
    const int32_t drawn = draw(at + 1);
    int32_t next = -1;
    // Children follow their parent; ValidateTree guarantees at most one child per token.
    for (int32_t i = at + 1; i < n; ++i) {
      if (parents[i] == at && tokens[i] == drawn) {
        next = i;
        break;
      }
    }
    if (next < 0) return drawn;
    kept->push_back(next);
    at = next;
  }
}

DraftTree GrowDraftTree(
    int max_nodes, int max_depth,
    absl::FunctionRef<void(std::span<const int32_t> path, std::vector<TreeChild>* out)> children) {
  std::vector<int32_t> tokens, parents, depths;
  std::vector<double> scores;
  std::priority_queue<Candidate> frontier;
  int64_t pushes = 0;
  std::vector<int32_t> path;
  std::vector<TreeChild> out;
  auto expand = [&](int32_t node) {
    path.clear();
    for (int32_t v = node; v >= 0; v = parents[v]) path.push_back(tokens[v]);
    std::reverse(path.begin(), path.end());
    out.clear();
    children(path, &out);
    const double base = node < 0 ? 1.0 : scores[node];
    for (const TreeChild& c : out)
      frontier.push(Candidate{base * c.share, pushes++, node, c.token});
  };
  if (max_nodes <= 0 || max_depth <= 0) return {};
  expand(-1);
  while (static_cast<int>(tokens.size()) < max_nodes && !frontier.empty()) {
    const Candidate c = frontier.top();
    frontier.pop();
    tokens.push_back(c.token);
    parents.push_back(c.parent);
    scores.push_back(c.score);
    depths.push_back(c.parent < 0 ? 0 : depths[c.parent] + 1);
    if (static_cast<int>(tokens.size()) < max_nodes && depths.back() + 1 < max_depth) {
      expand(static_cast<int32_t>(tokens.size()) - 1);
    }
  }
  return LayOut(tokens, parents);
}

}  // namespace specnode
