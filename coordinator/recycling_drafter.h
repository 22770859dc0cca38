// Token recycling: draft trees from the target's own verification logits, without training
// (Luo et al. 2024, "Turning Trash into Treasure: Accelerating Inference of Large Language
// Models with Token Recycling").
//
// Every verification pass computes, for each token it fed, the target's distribution of
// the token after it — and speculative decoding throws most of those rows away. This
// drafter keeps, for every token id it has seen fed, the top_k candidates of the latest row
// the target returned after it (an adjacency table, node-wide: across sequences and
// domains, updated online by ObserveTarget), and drafts by walking the table from the
// sequence's last token: a node's children are its token's candidates, at most `branch`,
// grown best first (draft_tree.h GrowDraftTree) with each rank's share measured online —
// how often the target's next top token was at rank r of the row the table held for that
// token (hits per rank over lookups, so a table that goes stale rates itself down).
//
// A row whose pass drew on the device returns only its drawn token (k = 1 < top_k): it is
// merged in front of the row's older candidates instead of replacing them.
//
// Deterministic given its observations: q is one-hot on each drafted token (proposals carry
// no q rows). Not thread-safe (the engine calls drafters from its step loop only).
// Memory: top_k int32 per token id up to the largest id observed (151,936 ids x 8 = 4.6 MiB).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/draft_tree.h"
#include "coordinator/drafter.h"

namespace specnode {

struct RecyclingDrafterOptions {
  int top_k = 8;   // candidates kept per token (the target's top-k asked for), [1, 32]
  int branch = 4;  // children per tree node at most, [1, top_k]
  // Token ids at or above this are not kept (the table's bound; a vocabulary is smaller).
  int32_t max_token_id = 1 << 20;
};

class RecyclingDrafter final : public Drafter {
 public:
  // InvalidArgument unless 1 <= top_k <= 32, 1 <= branch <= top_k and max_token_id >= 1.
  static absl::StatusOr<std::unique_ptr<RecyclingDrafter>> Create(
      const RecyclingDrafterOptions& options);

  std::string name() const override;  // "recycle:<top_k>"
  // A chain per request (the best candidate after each token, up to r.k), or with
  // r.max_nodes > 0 and branch > 1 a tree of up to max_nodes nodes, at most r.k deep.
  // Empty where the last token has no row yet.
  absl::Status Propose(std::span<const DraftRequest> requests, std::vector<Draft>* drafts) override;
  bool CheapToShadow() const override { return true; }
  int ObservedTopK() const override { return options_.top_k; }
  void ObserveTarget(std::span<const int32_t> tokens, std::span<const int32_t> ids, int k) override;
  void Free(SeqId) override {}  // nothing per sequence: the table is the node's

  // The tree after `last` (Propose's, for tests): at most max_nodes nodes, none deeper than
  // max_depth (a node at depth d is the (d+1)-th drafted token), `branch` children a node.
  DraftTree ProposeTree(int32_t last, int max_nodes, int branch, int max_depth) const;
  // The candidates held for `token` (best first; empty when none).
  std::vector<int32_t> Row(int32_t token) const;
  // The measured share of rank r (see the header comment); a prior before any lookup.
  double RankShare(int r) const;

 private:
  explicit RecyclingDrafter(const RecyclingDrafterOptions& options);
  int32_t* MutableRow(int32_t token);  // grows the table; null beyond max_token_id
  const int32_t* FindRow(int32_t token) const;

  RecyclingDrafterOptions options_;
  std::vector<int32_t> table_;  // [ids, top_k], -1 = empty slot
  std::vector<int64_t> hits_;   // [top_k]: the target's next top token was at rank r
  int64_t lookups_ = 0;         // observations of a token that had a row
};

}  // namespace specnode
