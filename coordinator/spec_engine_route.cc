// SpeculativeEngine's routing across groups: where a new sequence starts, the one
// mid-sequence check, and shadow scoring of cheap drafters (see spec_engine.h).
#include <algorithm>
#include <chrono>
#include <string>

#include "absl/strings/str_format.h"

#include "coordinator/spec_engine.h"
#include "coordinator/spec_engine_seq.h"

namespace specnode {
namespace {

using Clock = std::chrono::steady_clock;

// Weight of a finished sequence's answer length in its domain's mean.
constexpr double kAnswerLengthAlpha = 0.25;
// Domains whose answer length is tracked (SpecControllerConfig::max_domains' default).
constexpr size_t kMaxTrackedDomains = 1024;

// "route code seq 7 start: [0] a 0.46/212 pi 0.40 k 4 rate 31.2 bound 96.1 [1] a 0.00/0
// pi 1.00 k 4 rate 0.0 bound inf -> 1 (first try)": per group its acceptance / window
// positions, proposal rate, next K, rate and bound.
std::string DescribeChoice(std::string_view what, const std::string& domain, SeqId id,
                           std::span<const DraftGroup> groups, const GroupChoice& c, int chosen) {
  std::string line = absl::StrFormat("route %s seq %d %s:", domain, id, what);
  for (size_t i = 0; i < c.rate.size(); ++i) {
    absl::StrAppendFormat(&line, " [%d]", i);
    if (groups[i].controller != nullptr) {
      const DomainSnapshot d = groups[i].controller->Snapshot(domain);
      absl::StrAppendFormat(&line, " a %.2f/%d pi %.2f k %d", d.acceptance, d.window_positions,
                            d.proposal_rate, d.k);
    }
    absl::StrAppendFormat(&line, " rate %.1f bound %.1f", c.rate[i], c.bound[i]);
  }
  absl::StrAppendFormat(&line, " -> %d%s", chosen, c.explore ? " (first try)" : "");
  return line;
}

}  // namespace

std::vector<GroupOption> SpeculativeEngine::GroupOptions(const Seq& s,
                                                         bool same_target_only) const {
  // Load per group = live sequences on the group's target (groups may share one).
  const std::vector<int> per_group = GroupLoads();
  std::vector<GroupOption> options(groups_.size());
  for (size_t i = 0; i < groups_.size(); ++i) {
    const DraftGroup& g = groups_[i];
    GroupOption& o = options[i];
    o.controller = g.controller;
    for (size_t j = 0; j < groups_.size(); ++j) {
      if (groups_[j].target == g.target) o.load += per_group[j];
    }
    o.eligible = !same_target_only || g.target == TargetOf(s);
    if (g.drafter != nullptr) {
      o.shadowed = g.drafter->CheapToShadow();
      o.uncached = g.drafter->Uncached(s.request.id, s.tokens);
    }
  }
  return options;
}

double SpeculativeEngine::ExpectedRemaining(const Seq& s) const {
  double left = s.request.max_new_tokens - s.stats.generated;
  auto it = domain_tokens_.find(s.request.domain);
  if (it != domain_tokens_.end()) left = std::min(left, it->second - s.stats.generated);
  return std::max(left, 1.0);
}

void SpeculativeEngine::NoteGenerated(const Seq& s) {
  if (s.stats.generated == 0) return;  // cancelled before answering: says nothing
  // Domains are the clients' to name: as many as a controller tracks, no more.
  if (domain_tokens_.size() >= kMaxTrackedDomains && !domain_tokens_.count(s.request.domain)) {
    return;
  }
  auto [it, fresh] = domain_tokens_.try_emplace(s.request.domain, s.stats.generated);
  if (!fresh) {
    it->second = kAnswerLengthAlpha * s.stats.generated + (1.0 - kAnswerLengthAlpha) * it->second;
  }
}

int SpeculativeEngine::StartGroup(const Seq& s) {
  const int64_t n = domain_starts_[s.request.domain]++;
  if (groups_.size() == 1) return 0;
  const GroupChoice choice = DomainRouter::ChooseGroupFor(
      s.request.domain, GroupOptions(s, /*same_target_only=*/false), ExpectedRemaining(s));
  // Every explore_every-th sequence re-explores the groups in turn, so an estimate that lost
  // a domain does not go stale — except a shadowed group (learnt on every step anyway) and
  // one that could not beat the choice even with every draft accepted.
  int chosen = choice.index;
  const int every = options_.explore_every;
  if (every > 0 && n % every == every - 1 && !choice.explore && choice.index >= 0) {
    const size_t turn = static_cast<size_t>((n / every) % static_cast<int64_t>(groups_.size()));
    const bool shadowed =
        groups_[turn].drafter != nullptr && groups_[turn].drafter->CheapToShadow();
    if (!shadowed &&
        (groups_[turn].controller == nullptr || choice.bound[turn] > choice.rate[choice.index])) {
      chosen = static_cast<int>(turn);
    }
  }
  if (options_.route_log) {
    options_.route_log(
        DescribeChoice("start", s.request.domain, s.request.id, groups_, choice, chosen));
  }
  return chosen;
}

void SpeculativeEngine::MaybeMove(Seq& s) {
  ++s.route_checks;
  if (groups_.size() < 2 || s.group < 0) return;
  const GroupChoice choice = DomainRouter::ChooseGroupFor(
      s.request.domain, GroupOptions(s, /*same_target_only=*/true), ExpectedRemaining(s));
  const int to = choice.index;
  if (options_.route_log) {
    options_.route_log(
        DescribeChoice("check", s.request.domain, s.request.id, groups_, choice, to));
  }
  if (to < 0 || to == s.group) return;
  // A first try moves at once (its estimate says it could win); otherwise only a clear
  // gain moves a sequence, so near-equal estimates do not make it flap.
  if (!choice.explore && !(choice.rate[to] > (1.0 + kMoveMargin) * choice.rate[s.group])) return;
  Drafter* from = groups_[s.group].drafter;
  // A drafter with state releases the sequence (it would catch up on return anyway); a
  // cheap one keeps it, as it shadows the sequence from now on.
  if (from != nullptr && !from->CheapToShadow()) from->Free(s.request.id);
  s.group = to;
  s.in_run = false;
  ++s.stats.group_moves;
}

void SpeculativeEngine::RecordTargetTime(const Seq& s, int k, double seconds) {
  const ModelRunner* target = TargetOf(s);
  for (size_t g = 0; g < groups_.size(); ++g) {
    SpecController* c = groups_[g].controller;
    if (c == nullptr || groups_[g].target != target) continue;
    const bool own = static_cast<int>(g) == s.group;
    if (!own && !groups_[g].drafter->CheapToShadow()) continue;
    if (k > 0) {
      c->RecordVerifyTime(k, seconds).IgnoreError();
    } else {
      c->RecordDirectTime(seconds).IgnoreError();
    }
  }
}

void SpeculativeEngine::ShadowScore(std::span<Seq* const> seqs, bool has_prefill) {
  for (size_t g = 0; g < groups_.size(); ++g) {
    Drafter* d = groups_[g].drafter;
    if (d == nullptr || !d->CheapToShadow()) continue;
    for (Seq* s : seqs) {
      if (s->group < 0 || s->prefilled < s->n_prompt) continue;
      if (s->group == static_cast<int>(g) && s->k > 0) {
        s->shadow_cursor[g] = s->tokens.size();  // its own run: a later move starts here
        continue;
      }
      // Its own sequence's direct steps (its controller chose K = 0: a disabled domain, or
      // one the cost model decodes directly) are scored as the run it would have made, so
      // the domain it sits out keeps being measured — and re-enabled once it pays.
      if (groups_[s->group].target != groups_[g].target) continue;
      SimulateRun(*s, g, has_prefill);
    }
  }
}

void SpeculativeEngine::SimulateRun(Seq& s, size_t g, bool has_prefill) {
  Drafter& d = *groups_[g].drafter;
  SpecController& c = *groups_[g].controller;
  const std::string& domain = s.request.domain;
  const std::span<const int32_t> known(s.tokens);
  // Decoding starts after the prompt and the token its prefill gave.
  size_t cur = std::max(s.shadow_cursor[g], static_cast<size_t>(s.n_prompt) + 1);
  while (cur < known.size()) {
    const bool in_run = s.shadow_in_run[g] != 0;
    const int k = c.ShadowK(domain, in_run);
    const DraftRequest request{s.request.id, known.first(cur), k, &s.sampler, domain, false};
    std::vector<Draft> drafts;
    const auto t0 = Clock::now();
    if (!d.Propose({&request, 1}, &drafts).ok() || drafts.size() != 1) break;
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    s.stats.draft_s += seconds;
    std::span<const int32_t> proposal(drafts[0].tokens);
    proposal = proposal.first(std::min(proposal.size(), static_cast<size_t>(k)));
    size_t passed = 0;
    while (passed < proposal.size() && cur + passed < known.size() &&
           proposal[passed] == known[cur + passed]) {
      ++passed;
    }
    // The step's outcome needs the target's token after the last one judged: wait for it.
    if (cur + passed >= known.size()) break;
    if (!has_prefill) c.RecordDraftTime(k, seconds).IgnoreError();
    c.RecordProposal(domain, !proposal.empty());
    if (!proposal.empty()) {
      const int judged = static_cast<int>(passed < proposal.size() ? passed + 1 : passed);
      c.RecordStep(domain, judged, static_cast<int>(passed), in_run).IgnoreError();
    }
    s.shadow_in_run[g] = !proposal.empty() && passed == proposal.size();
    cur += passed + 1;  // the accepted drafts and the target's own token
  }
  s.shadow_cursor[g] = cur;
}

}  // namespace specnode
