#include "coordinator/domain_router.h"

#include <algorithm>
#include <cassert>

#include <cmath>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "coordinator/spec_controller.h"

namespace specnode {
namespace {

char LowerAscii(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

std::string Lowered(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = LowerAscii(c);
  return out;
}

bool IsWordByte(char c) {
  const unsigned char u = static_cast<unsigned char>(c);
  return u >= 0x80 || (u >= 'a' && u <= 'z') || (u >= 'A' && u <= 'Z') || (u >= '0' && u <= '9') ||
         u == '_';
}

// Whole-word occurrence of `keyword` (lowercased) in `text` (lowercased); see the header.
bool ContainsWord(std::string_view text, std::string_view keyword) {
  const bool need_left = IsWordByte(keyword.front());
  const bool need_right = IsWordByte(keyword.back());
  for (size_t pos = text.find(keyword); pos != std::string_view::npos;
       pos = text.find(keyword, pos + 1)) {
    const size_t end = pos + keyword.size();
    const bool left_ok = !need_left || pos == 0 || !IsWordByte(text[pos - 1]);
    const bool right_ok = !need_right || end == text.size() || !IsWordByte(text[end]);
    if (left_ok && right_ok) return true;
  }
  return false;
}

absl::Status RuleError(size_t index, std::string_view domain, std::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("router rule ", index, " (", std::string(domain), "): ", std::string(what)));
}

// Shared by the ChooseGroup overloads: eligible[i] false = never chosen; neutral[i] = a
// group without estimates by design (no drafter), chosen on load alone; loads empty = no
// load balancing.
int ChooseAmong(std::span<const double> goodputs, const std::vector<bool>* eligible,
                const std::vector<bool>* neutral = nullptr, std::span<const int> loads = {}) {
  auto is_eligible = [&](size_t i) { return eligible == nullptr || (*eligible)[i]; };
  auto is_neutral = [&](size_t i) { return neutral != nullptr && (*neutral)[i]; };
  int best = -1, untried = -1;
  double best_g = 0.0;
  for (size_t i = 0; i < goodputs.size(); ++i) {
    if (!is_eligible(i) || is_neutral(i)) continue;
    const double g = goodputs[i];
    if (!(g > 0.0)) {  // untried: explore it first (the least loaded of them)
      if (loads.empty()) return static_cast<int>(i);
      if (untried < 0 || loads[i] < loads[untried]) untried = static_cast<int>(i);
      continue;
    }
    if (best < 0 || g > best_g) {
      best = static_cast<int>(i);
      best_g = g;
    }
  }
  if (untried >= 0) return untried;
  if (loads.empty()) return best;
  // Near-equals (and groups without estimates): the least loaded, ties to the best goodput,
  // then the lowest index.
  int chosen = -1;
  for (size_t i = 0; i < goodputs.size(); ++i) {
    if (!is_eligible(i)) continue;
    if (!is_neutral(i) && goodputs[i] < DomainRouter::kNearBest * best_g) continue;
    if (chosen < 0 || loads[i] < loads[chosen] ||
        (loads[i] == loads[chosen] && !is_neutral(i) &&
         (is_neutral(chosen) || goodputs[i] > goodputs[chosen]))) {
      chosen = static_cast<int>(i);
    }
  }
  return chosen;
}

// Stands in for the goodput of a group that loses everywhere: positive (so it is not
// "untried"), below any real estimate.
constexpr double kLoserGoodput = 1e-9;

}  // namespace

bool DomainRouter::LosesEverywhere(const SpecController& controller) {
  int judged = 0;
  for (const DomainSnapshot& d : controller.AllDomains()) {
    if (d.mode == SpecMode::kWarmup) continue;
    if (d.mode != SpecMode::kDisabled && d.mode != SpecMode::kProbing) return false;
    ++judged;
  }
  return judged >= kLoserMinDomains;
}

absl::Status DomainRouter::ValidateDomainName(std::string_view name) {
  if (name.empty()) return absl::InvalidArgumentError("domain name is empty");
  if (name.size() > kMaxDomainNameBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("domain name longer than ", kMaxDomainNameBytes, " bytes"));
  }
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '.' || c == ':' || c == '-';
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat("domain name \"", std::string(name),
                                                     "\" has a character outside [A-Za-z0-9_.:-]"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<DomainRouter>> DomainRouter::Create(RouterConfig config) {
  if (absl::Status st = ValidateDomainName(config.default_domain); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("router default_domain: ", st.message()));
  }
  if (config.max_scan_bytes == 0) {
    return absl::InvalidArgumentError("router max_scan_bytes must be >= 1");
  }
  std::vector<CompiledRule> compiled;
  compiled.reserve(config.rules.size());
  for (size_t i = 0; i < config.rules.size(); ++i) {
    const DomainRule& rule = config.rules[i];
    if (absl::Status st = ValidateDomainName(rule.domain); !st.ok()) {
      return RuleError(i, rule.domain, std::string(st.message()));
    }
    if (rule.keywords.empty() && rule.regex.empty()) {
      return RuleError(i, rule.domain, "has neither keywords nor a regex");
    }
    CompiledRule c;
    for (size_t j = 0; j < rule.keywords.size(); ++j) {
      if (rule.keywords[j].empty()) {
        return RuleError(i, rule.domain, absl::StrCat("keyword ", j, " is empty"));
      }
      c.keywords.push_back(Lowered(rule.keywords[j]));
    }
    if (!rule.regex.empty()) {
      auto flags = std::regex::ECMAScript | std::regex::optimize;
      if (rule.regex_icase) flags |= std::regex::icase;
      try {
        c.regex = std::regex(rule.regex, flags);
      } catch (const std::regex_error& e) {
        return RuleError(i, rule.domain,
                         absl::StrCat("bad regex \"", rule.regex, "\": ", e.what()));
      }
      c.has_regex = true;
    }
    compiled.push_back(std::move(c));
  }
  return std::unique_ptr<DomainRouter>(new DomainRouter(std::move(config), std::move(compiled)));
}

DomainRouter::DomainRouter(RouterConfig config, std::vector<CompiledRule> compiled)
    : config_(std::move(config)), compiled_(std::move(compiled)) {}

bool DomainRouter::Matches(const CompiledRule& rule, std::string_view prompt,
                           std::string_view lowered) const {
  for (const std::string& kw : rule.keywords) {
    if (ContainsWord(lowered, kw)) return true;
  }
  if (rule.has_regex) {
    try {
      return std::regex_search(prompt.begin(), prompt.end(), rule.regex);
    } catch (const std::regex_error&) {
      return false;  // complexity / stack limits: treat as no match
    }
  }
  return false;
}

int DomainRouter::MatchRule(std::string_view prompt) const {
  if (prompt.size() > config_.max_scan_bytes) prompt = prompt.substr(0, config_.max_scan_bytes);
  const std::string lowered = Lowered(prompt);
  for (size_t i = 0; i < compiled_.size(); ++i) {
    if (Matches(compiled_[i], prompt, lowered)) return static_cast<int>(i);
  }
  return -1;
}

std::string DomainRouter::Classify(std::string_view request_domain, std::string_view prompt) const {
  if (!request_domain.empty()) return std::string(request_domain);
  const int rule = MatchRule(prompt);
  if (rule >= 0) return config_.rules[rule].domain;
  return config_.default_domain;
}

int DomainRouter::ChooseGroup(std::span<const double> goodputs) {
  return ChooseAmong(goodputs, nullptr);
}

int DomainRouter::ChooseGroup(std::string_view domain,
                              std::span<const SpecController* const> controllers) {
  std::vector<double> goodputs(controllers.size(), 0.0);
  std::vector<bool> eligible(controllers.size(), false);
  for (size_t i = 0; i < controllers.size(); ++i) {
    if (controllers[i] == nullptr) continue;
    eligible[i] = true;
    goodputs[i] = controllers[i]->ExpectedGoodput(domain);
    if (!(goodputs[i] > 0.0) &&
        (LosesEverywhere(*controllers[i]) || controllers[i]->CanNeverWin())) {
      // Not worth a first try: the engine's periodic exploration still visits it.
      goodputs[i] = kLoserGoodput;
    }
  }
  return ChooseAmong(goodputs, &eligible);
}

int DomainRouter::ChooseGroup(std::string_view domain,
                              std::span<const SpecController* const> controllers,
                              std::span<const int> loads) {
  assert(loads.size() == controllers.size());
  std::vector<double> goodputs(controllers.size(), 0.0);
  std::vector<bool> eligible(controllers.size(), true), neutral(controllers.size(), false);
  for (size_t i = 0; i < controllers.size(); ++i) {
    if (controllers[i] == nullptr) {
      neutral[i] = true;
      continue;
    }
    goodputs[i] = controllers[i]->ExpectedGoodput(domain);
    if (!(goodputs[i] > 0.0) &&
        (LosesEverywhere(*controllers[i]) || controllers[i]->CanNeverWin())) {
      goodputs[i] = kLoserGoodput;
    }
  }
  return ChooseAmong(goodputs, &eligible, &neutral, loads);
}

namespace {

// An option's rate over `remaining` tokens at `goodput` tokens/s after `catchup` seconds.
double RateOver(double remaining, double goodput, double catchup) {
  return remaining / (catchup + remaining / goodput);
}

// Among untried candidates (cand[i]), the least loaded with shadowed == want_shadowed,
// ties to the lower index; -1 when none.
int LeastLoaded(std::span<const GroupOption> options, const std::vector<bool>& cand,
                bool want_shadowed) {
  int best = -1;
  for (size_t i = 0; i < options.size(); ++i) {
    if (!cand[i] || options[i].shadowed != want_shadowed) continue;
    if (best < 0 || options[i].load < options[best].load) best = static_cast<int>(i);
  }
  return best;
}

}  // namespace

GroupChoice DomainRouter::ChooseGroupFor(std::string_view domain,
                                         std::span<const GroupOption> options, double remaining) {
  GroupChoice choice;
  choice.rate.assign(options.size(), 0.0);
  choice.bound.assign(options.size(), 0.0);
  remaining = std::max(remaining, 1.0);
  const size_t n = options.size();
  std::vector<bool> known(n, false), untried(n, false), neutral(n, false), eligible(n, false);
  std::vector<int> loads(n, 0);
  double best_known = 0.0;
  bool any_known = false;
  bool settled = true;  // the best known group's estimate (none known: nothing to wait for)
  for (size_t i = 0; i < n; ++i) {
    const GroupOption& o = options[i];
    loads[i] = o.load;
    if (!o.eligible) continue;
    if (o.controller == nullptr) {
      neutral[i] = eligible[i] = true;
      continue;
    }
    const double catchup = o.controller->PredictCatchupSeconds(o.uncached).value_or(0.0);
    const std::optional<double> best = o.controller->BestCaseGoodput();
    choice.bound[i] = best.has_value() && *best > 0.0 ? RateOver(remaining, *best, catchup)
                                                      : std::numeric_limits<double>::infinity();
    const double g = o.controller->ExpectedGoodput(domain);
    if (g > 0.0) {
      choice.rate[i] = RateOver(remaining, g, catchup);
    } else if (LosesEverywhere(*o.controller) || o.controller->CanNeverWin()) {
      choice.rate[i] = kLoserGoodput;
    } else {
      untried[i] = true;
      continue;
    }
    known[i] = eligible[i] = true;
    any_known |= choice.rate[i] > kLoserGoodput;
    if (choice.rate[i] > kLoserGoodput && choice.rate[i] > best_known) {
      best_known = choice.rate[i];
      settled = o.controller->Settled(domain);
    }
  }
  std::vector<bool> candidate(n, false);
  for (size_t i = 0; i < n; ++i) {
    candidate[i] = untried[i] && settled && choice.bound[i] > (1.0 + kExploreMargin) * best_known;
  }
  int explore = any_known ? -1 : LeastLoaded(options, candidate, true);
  if (explore < 0) explore = LeastLoaded(options, candidate, false);
  if (explore >= 0) {
    choice.index = explore;
    choice.explore = true;
    return choice;
  }
  choice.index = ChooseAmong(choice.rate, &eligible, &neutral, loads);
  return choice;
}

}  // namespace specnode
