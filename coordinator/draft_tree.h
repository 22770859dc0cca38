// Draft trees: candidate continuations sharing prefixes, verified by the target in one pass
// (docs/speculative.md "Draft trees").
//
// A tree of n nodes is two parallel arrays: node i drafts tokens[i] as the continuation of
// its parent, parents[i] in [-1, i) — -1 meaning the sequence's committed context itself.
// Parents precede children, so a node's depth (0 for a child of the context) is known when
// it is reached, and the chain a drafter believes most is laid out first: nodes
// [0, ChainLength) have parents[i] == i - 1. A chain of k tokens is the tree with parents
// {-1, 0, 1, .., k-2}.
//
// Pure functions over spans; thread-compatible.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"

namespace specnode {

struct DraftTree {
  std::vector<int32_t> tokens;   // [n]
  std::vector<int32_t> parents;  // [n], parents[i] in [-1, i)
  int size() const { return static_cast<int>(tokens.size()); }
};

// InvalidArgument unless tokens and parents have the same size, every parent lies in
// [-1, i), and no node has two children drafting the same token (a duplicate would be
// verified twice and could never both be kept).
absl::Status ValidateTree(std::span<const int32_t> tokens, std::span<const int32_t> parents);

// The longest prefix of nodes that is a chain: parents[i] == i - 1.
int ChainLength(std::span<const int32_t> parents);

// Depths and paths of a tree's nodes: TreeRowDepths / TreeRowPath (model/llama/kv_cache.h),
// which read parents the same way.

// The tokens a verification pass feeds for the tree: `root` (the sequence's newest token,
// not yet in the target's cache) then every node's token, with each pass row's parent row:
// row 0 has -1, row 1 + i has parents[i] + 1. The attention of row r covers the cached
// context and the rows on its path to row 0 (model/llama/kv_cache.h KvPassEntry::parents).
void TreePassRows(int32_t root, const DraftTree& tree, std::vector<int32_t>* tokens,
                  std::vector<int32_t>* row_parents);

// The match rule on a tree (acceptance.h AcceptMatch, generalised): `target[r]` is the
// token the target draws at pass row r (r = 0 the root's row, 1 + i node i's), each with
// the noise of its absolute position, so the draw at a node is the one target-only decoding
// would make after that node's path. Walks from the root: at each kept row, the child whose
// token equals the target's draw there is kept; the first row with no such child ends the
// walk. `kept` gets the kept nodes (a root-to-leaf path, in order); the function returns
// the target's draw at the last kept row (the bonus token). target.size() == tree.size() + 1.
int32_t AcceptTreeMatch(const DraftTree& tree, std::span<const int32_t> target,
                        std::vector<int32_t>* kept);
// The same walk with each row's draw computed when the walk reaches it (draw(r) for pass
// row r; only the rows on the kept path and the row after it are drawn).
int32_t AcceptTree(std::span<const int32_t> tokens, std::span<const int32_t> parents,
                   absl::FunctionRef<int32_t(int32_t row)> draw, std::vector<int32_t>* kept);

// A candidate child of a node: its token and its share in (0, 1] of the node's
// continuations (the probability the drafter gives it after the node).
struct TreeChild {
  int32_t token = 0;
  double share = 0;
};

// Grows a draft tree best first, the way the training-free drafters do (suffix_drafter.h,
// recycling_drafter.h): a node's score is the product of the shares on its path; the
// frontier's best candidate becomes a node (ties: the earlier candidate) until max_nodes
// nodes are placed, and each placed node shallower than max_depth - 1 is expanded by
// `children(path, out)`, `path` the node's tokens from the context's first child to it
// (empty: the context itself), *out its candidates best first (cleared before each call;
// no token twice). Laid out chain first: the chain of each node's first-placed child from
// the context, then the other nodes in placement order.
DraftTree GrowDraftTree(
    int max_nodes, int max_depth,
    absl::FunctionRef<void(std::span<const int32_t> path, std::vector<TreeChild>* out)> children);

}  // namespace specnode
