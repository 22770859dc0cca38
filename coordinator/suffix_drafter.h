// Suffix drafting: frequency-ranked draft trees from suffix matches, without training
// (SuffixDecoding, Oliaro et al. 2024; SAM-Decoding, Hu et al. 2024).
//
// Two SuffixIndex sources (coordinator/suffix_index.h):
//   1. the sequence's own context (prompt and output so far), indexed incrementally as it
//      grows (a context that is not an extension of the last one seen is re-indexed);
//   2. the domain's history: the contexts of this drafter's finished sequences of the same
//      domain (memory bounded; the oldest contexts dropped when full).
// A node is expanded by matching the longest suffix (up to max_n tokens) of the context
// followed by the node's path: the own context's match wins over the history's unless the
// history's is longer; own matches need min_n tokens, history matches history_min_n. The
// node's children are the tokens that followed that suffix, at most `branch` of them, each
// with a share >= min_share of the suffix's continuations; a child's score is its parent's
// times its share. Nodes are added best score first until the budget is spent, then laid out
// with the chain of best children first (draft_tree.h), so a chain consumer reads the most
// likely path as a prompt-lookup drafter would.
//
// Deterministic: q is one-hot on each drafted token (proposals carry no q rows).
// Not thread-safe (the engine calls drafters from its step loop only).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/draft_tree.h"
#include "coordinator/drafter.h"
#include "coordinator/suffix_index.h"

namespace specnode {

struct SuffixDrafterOptions {
  int max_n = 8;  // longest suffix matched
  int min_n = 2;  // shortest suffix accepted in the own context
  int history_min_n = 3;
  int branch = 3;                    // children per node at most (1: chains only)
  double min_share = 0.1;            // a child's share of its suffix's continuations, at least
  int64_t history_tokens = 1 << 18;  // per domain; 0 = no history
  int history_domains = 64;          // further domains share one overflow history
};

class SuffixDrafter final : public Drafter {
 public:
  // InvalidArgument unless 1 <= min_n <= history_min_n <= max_n <= 64, branch >= 1,
  // 0 <= min_share <= 1, history_tokens >= 0, history_domains >= 1.
  static absl::StatusOr<std::unique_ptr<SuffixDrafter>> Create(const SuffixDrafterOptions& options);

  std::string name() const override;
  // A chain per request (the tree of r.k nodes built with branch 1), or with
  // r.max_nodes > 0 and branch > 1 a tree of up to max_nodes nodes, at most r.k deep.
  absl::Status Propose(std::span<const DraftRequest> requests, std::vector<Draft>* drafts) override;
  bool CheapToShadow() const override { return true; }
  // Moves the sequence's last context into its domain's history.
  void Free(SeqId seq) override;

  // The tree of at most max_nodes nodes, none deeper than max_depth (a node at depth d is
  // the (d+1)-th drafted token), for `context` (Propose with DraftRequest::max_nodes, tests).
  // Updates the sequence's own index to `context`. Empty when nothing matches.
  DraftTree ProposeTree(SeqId seq, std::span<const int32_t> context, std::string_view domain,
                        int max_nodes, int branch, int max_depth = 1 << 30);
  // Tokens held in `domain`'s history (tests, metrics).
  int64_t HistoryTokens(std::string_view domain) const;

 private:
  struct SeqState {
    std::vector<int32_t> tokens;
    std::unique_ptr<SuffixIndex> index;
    std::string domain;
  };
  struct History {
    std::vector<std::vector<int32_t>> contexts;  // oldest first
    int64_t tokens = 0;
    std::unique_ptr<SuffixIndex> index;
  };

  explicit SuffixDrafter(const SuffixDrafterOptions& options) : options_(options) {}
  SeqState& Catch(SeqId seq, std::span<const int32_t> context, std::string_view domain);
  const History* FindHistory(std::string_view domain) const;
  History& HistoryFor(std::string_view domain);
  // The continuations of context + path: the better of the own and the history match.
  SuffixIndex::Match Continuations(const SeqState& s, const History* h,
                                   std::span<const int32_t> tail) const;

  SuffixDrafterOptions options_;
  std::unordered_map<SeqId, SeqState> seqs_;
  std::map<std::string, History, std::less<>> histories_;
};

}  // namespace specnode
