#include "coordinator/draft_tree.h"

#include <cassert>
#include <unordered_set>

#include "absl/strings/str_format.h"

namespace specnode {

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

}  // namespace specnode
