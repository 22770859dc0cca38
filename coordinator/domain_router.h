// DomainRouter: names the domain of a request and picks the drafter / group that serves it.
//
// Classify(request_domain, prompt) returns, in order of precedence:
//   1. the request's explicit `domain` field when non-empty (returned as given; the front
//      end validates it with ValidateDomainName);
//   2. the domain of the first rule, in configuration order, that matches the prompt;
//   3. RouterConfig::default_domain.
// A rule matches when any of its keywords or its regular expression matches. Only the
// first `max_scan_bytes` bytes of the prompt are examined (the domain of a request shows
// at its start, and std::regex's recursive matcher must not see unbounded input).
//
// Keywords: case-insensitive (ASCII) WHOLE-WORD matches. A word character is an ASCII
// letter, digit or '_', or any byte >= 0x80 (so UTF-8 words are not split). A keyword
// edge that is a word character must sit at a word boundary of the prompt; an edge that
// is not (e.g. the "+" of "c++", the "#" of "#include") needs no boundary. Keywords may
// hold several words ("balance sheet"). "stock" does not match "stocks": list both, or
// use a regular expression for stems.
//
// Regular expressions: ECMAScript grammar (std::regex), searched anywhere in the prompt
// (std::regex_search), case-insensitive unless DomainRule::regex_icase is false. They are
// compiled in Create; a bad pattern is InvalidArgument naming the rule index and domain
// (std::regex_error never leaves this module). A matching error at run time (complexity
// or stack limits) counts as no match.
//
// Groups. The engine routes with ChooseGroupFor (below): per sequence, each group's catch-up
// on the context included, first tries only while they could win, shadowed groups learnt
// without one. ChooseGroup, the per-domain choice without a sequence, picks among several
// drafters or groups the one for a domain:
// the lowest-index group with no observations for the domain (exploration: every group
// is tried once per domain), else the group with the best recent goodput (tokens/s as
// estimated by its SpecController from its windowed acceptance and live timings), ties to
// the lowest index. Estimates of groups that are not chosen for a domain age (their
// acceptance window for it stops moving); the engine re-explores periodically
// (SpecEngineOptions::explore_every). A group that lost everywhere — disabled on every
// domain it was judged on, at least kLoserMinDomains of them — gets no first try on a new
// domain, nor does a group that cannot win anywhere (SpecController::CanNeverWin: even at
// 100% acceptance its drafts cost more than they save, by its live timings): a first try
// costs a whole sequence (a draft model also prefills the prompt), and measured on SmolLM2
// the self-draft's first tries cost the router 5-20% on long-prompt domains; both are
// still visited by the periodic exploration.
//
// Thread-safety: immutable after Create; Classify and ChooseGroup are const and may be
// called from any thread concurrently. No method throws.
#pragma once

#include <cstddef>
#include <memory>
#include <regex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace specnode {

class SpecController;

struct DomainRule {
  std::string domain;                 // valid domain name (ValidateDomainName)
  std::vector<std::string> keywords;  // whole-word, case-insensitive; empty ones rejected
  std::string regex;                  // ECMAScript; empty = none
  bool regex_icase = true;
};

// One group as a candidate for one sequence (DomainRouter::ChooseGroupFor).
struct GroupOption {
  const SpecController* controller = nullptr;  // null: direct decoding (no drafter, no estimate)
  bool eligible = true;   // false: may not take the sequence (its KV is on another target)
  int load = 0;           // live sequences on the group's target
  bool shadowed = false;  // learns its acceptance on other groups' steps (Drafter::CheapToShadow)
  int64_t uncached = 0;   // context tokens its drafter must catch up on (Drafter::Uncached)
};

// What ChooseGroupFor decided.
struct GroupChoice {
  int index = -1;        // the chosen option; -1 when none is eligible
  bool explore = false;  // index had no estimate for the domain: a first try
  // Per option: expected tokens/s over the sequence's remaining tokens, its catch-up
  // included; 0 where unknown (untried), ineligible or direct (null controller).
  std::vector<double> rate;
  // Per option: the optimistic rate (goodput at a = 1, catch-up included; +inf while the
  // group has no timings), what re-exploring it could at best give; 0 where not eligible
  // or direct.
  std::vector<double> bound;
};

struct RouterConfig {
  std::vector<DomainRule> rules;  // first match wins
  std::string default_domain = "default";
  size_t max_scan_bytes = 8192;  // prompt bytes examined by rules, >= 1
};

class DomainRouter {
 public:
  static constexpr size_t kMaxDomainNameBytes = 64;

  // InvalidArgument when a rule has an invalid domain name, no keyword and no regex, an
  // empty keyword, or a regex that does not compile (message: "rule <i> (<domain>): ...");
  // when default_domain is invalid; when max_scan_bytes == 0.
  static absl::StatusOr<std::unique_ptr<DomainRouter>> Create(RouterConfig config);

  // A domain name is 1..kMaxDomainNameBytes bytes of [A-Za-z0-9_.:-] (safe as a metrics
  // label and a log token). InvalidArgument otherwise.
  static absl::Status ValidateDomainName(std::string_view name);

  // See the header comment. Returns a domain name; never fails.
  std::string Classify(std::string_view request_domain, std::string_view prompt) const;

  // Index of the rule that matches `prompt` first, -1 when none does (for diagnostics).
  int MatchRule(std::string_view prompt) const;

  // goodputs[i]: group i's expected tokens/s for the domain; a value that is not > 0
  // (0, negative, NaN) means "no observations". Returns the chosen index as described in
  // the header comment; -1 when goodputs is empty.
  static int ChooseGroup(std::span<const double> goodputs);
  // The same over each group's controller: goodputs[i] = controllers[i]->ExpectedGoodput(
  // domain) (a null controller is never chosen unless all are null: then -1).
  static int ChooseGroup(std::string_view domain,
                         std::span<const SpecController* const> controllers);
  // With load balancing (a cluster's groups, each its own target): loads[i] = sequences
  // live on group i's target. Untried groups are still explored first (the least loaded of
  // them); otherwise, among the
  // groups whose goodput is at least kNearBest x the best one's, and the groups with a null
  // controller (no drafter: direct decoding, no estimate), the least loaded wins, ties to
  // the higher goodput, then the lower index. Identical groups thus share the load instead
  // of the first one taking every request.
  static constexpr double kNearBest = 0.9;
  static int ChooseGroup(std::string_view domain,
                         std::span<const SpecController* const> controllers,
                         std::span<const int> loads);
  // The engine's choice for one sequence of `domain` with `remaining` tokens still to
  // generate (expected), given each group's catch-up on the sequence's context. A group's
  // rate is remaining / (catch-up seconds + remaining / goodput): a draft model prefills
  // the whole prompt before its first draft, which on a long-prompt domain can cost more
  // than speculation saves (measured on the Qwen2.5 pair: summarise prompts of ~300 tokens,
  // 96 answer tokens). In order:
  //   1. Untried groups (no estimate for the domain) are explored only while they could
  //      win: their optimistic rate — goodput at a = 1 (BestCaseGoodput), catch-up included
  //      — must beat the best known rate by more than kExploreMargin, and only once the
  //      best known group's estimate is settled (SpecController::Settled: a few early
  //      steps misjudge prompt lookup on a summary, and a first try of a draft model costs
  //      its catch-up on the whole context); a group with no timings at all always could. When
  //      no group has an estimate yet and a shadowed one is untried, it goes first (its
  //      steps cost no catch-up and score the others' only where they are shadowed too;
  //      the first sequence then measures the baseline the others' bounds are held to).
  //      Otherwise the first untried non-shadowed candidate, the least loaded, wins (a
  //      shadowed one is learnt on the others' steps without a first try). Groups that lose
  //      everywhere or can never win (as ChooseGroup) count as known and worst.
  //   2. Otherwise the best rate, with ChooseGroup's load rule among near-equals (and
  //      direct groups).
  static constexpr double kExploreMargin = 0.1;
  static GroupChoice ChooseGroupFor(std::string_view domain, std::span<const GroupOption> options,
                                    double remaining);

  // True when `controller` is disabled (or probing) on every domain past warmup, and there
  // are at least kLoserMinDomains such domains.
  static constexpr int kLoserMinDomains = 2;
  static bool LosesEverywhere(const SpecController& controller);

  const RouterConfig& config() const { return config_; }

 private:
  struct CompiledRule {
    std::vector<std::string> keywords;  // lowercased
    bool has_regex = false;
    std::regex regex;
  };

  explicit DomainRouter(RouterConfig config, std::vector<CompiledRule> compiled);
  bool Matches(const CompiledRule& rule, std::string_view prompt, std::string_view lowered) const;

  RouterConfig config_;
  std::vector<CompiledRule> compiled_;
};

}  // namespace specnode
