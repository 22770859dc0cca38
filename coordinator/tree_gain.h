// TreeGain: what draft trees gain over their main chains, per domain, measured after the
// fact at no cost — the evidence the engine's per-step choice between verifying a drafter's
// tree or only its main chain rests on (docs/speculative.md "Draft trees", issue 39 item 3).
//
// Scoring. With the match rule (and greedy) the committed text is exactly what target-only
// decoding draws, whatever was verified (acceptance.h kMatch), so once the tokens after a
// step's position are committed, the walk the target would have made through any draft
// drafted there is known: at each kept node the committed token at its depth picks the child.
// ScoreTree replays that walk for the tree and for its main chain, so both outcomes are
// measured on every step — the one verified and the one that was not.
//
// Choice (PreferTree). Over the domain's last kWindow scored steps: the mean accepted nodes
// and mean node counts of the trees (A_t, n_t) and of their chains (A_c, n_c); with the
// verification line of the group's controller (SpecController::PredictVerifySeconds, by
// rows) and its draft time,
//   tree if (1 + A_t) / (t_draft + t_verify(n_t)) > (1 + A_c) / (t_draft + t_verify(n_c)),
// chains until kMinSteps steps were scored or the timings are known.
//
// Thread-compatible (the engine's step thread only).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "absl/functional/function_ref.h"

namespace specnode {

// One step's draft tree judged against the committed text.
struct TreeOutcome {
  int tree_nodes = 0;      // nodes of the tree
  int chain_nodes = 0;     // of those, its main chain's (draft_tree.h ChainLength)
  int tree_accepted = 0;   // nodes the match walk keeps through the tree
  int chain_accepted = 0;  // through the main chain alone
};

// The outcome of the tree (tokens, parents: draft_tree.h) drafted when the sequence held
// `position` committed tokens, against `committed` (the sequence's tokens now); nullopt
// while the walk needs a token not committed yet (its node's depth reaches the end), or when
// it holds no node beyond its chain.
std::optional<TreeOutcome> ScoreTree(std::span<const int32_t> tokens,
                                     std::span<const int32_t> parents, size_t position,
                                     std::span<const int32_t> committed);

class TreeGain {
 public:
  static constexpr int kWindow = 64;        // scored steps kept per domain
  static constexpr int kMinSteps = 8;       // before this, chains
  static constexpr int kMaxDomains = 1024;  // further domains share one entry

  void Record(std::string_view domain, const TreeOutcome& outcome);

  struct Estimate {
    int steps = 0;                                                                  // in the window
    double tree_accepted = 0, chain_accepted = 0, tree_nodes = 0, chain_nodes = 0;  // means
  };
  Estimate Get(std::string_view domain) const;

  // See the header comment. verify_s(n): a pass of n drafts + 1 rows, seconds (nullopt:
  // unknown); draft_s: the drafter's time for the step.
  bool PreferTree(std::string_view domain, double draft_s,
                  absl::FunctionRef<std::optional<double>(int)> verify_s) const;

 private:
  struct Window {
    std::deque<TreeOutcome> steps;
    int64_t tree_accepted = 0, chain_accepted = 0, tree_nodes = 0, chain_nodes = 0;
  };
  std::map<std::string, Window, std::less<>> domains_;
};

}  // namespace specnode
