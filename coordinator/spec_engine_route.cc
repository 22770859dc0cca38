// SpeculativeEngine's routing across groups: where a new sequence starts, the one
// mid-sequence check, and shadow scoring of cheap drafters (see spec_engine.h).
#include <algorithm>
#include <chrono>

#include "coordinator/spec_engine.h"
#include "coordinator/spec_engine_seq.h"

namespace specnode {
namespace {

using Clock = std::chrono::steady_clock;

// Weight of a finished sequence's answer length in its domain's mean.
constexpr double kAnswerLengthAlpha = 0.25;

// What a counterfactual proposal would have scored against what the target emitted: the
// positions a verification would have judged (censored at the emitted length: beyond it
// the target's tokens are unknown) and how many of them passed.
struct ShadowOutcome {
  int judged = 0;
  int passed = 0;
};

ShadowOutcome ScoreAgainst(std::span<const int32_t> proposal, std::span<const int32_t> emitted) {
  ShadowOutcome o;
  const size_t n = std::min(proposal.size(), emitted.size());
  while (static_cast<size_t>(o.passed) < n && proposal[o.passed] == emitted[o.passed]) ++o.passed;
  // A mismatch within the emitted tokens is one judged, failed position.
  o.judged = static_cast<size_t>(o.passed) < n ? o.passed + 1 : o.passed;
  return o;
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
  const int every = options_.explore_every;
  if (every > 0 && n % every == every - 1 && !choice.explore && choice.index >= 0) {
    const size_t turn = static_cast<size_t>((n / every) % static_cast<int64_t>(groups_.size()));
    const bool shadowed = groups_[turn].drafter != nullptr && groups_[turn].drafter->CheapToShadow();
    if (!shadowed && (groups_[turn].controller == nullptr ||
                      choice.bound[turn] > choice.rate[choice.index])) {
      return static_cast<int>(turn);
    }
  }
  return choice.index;
}

void SpeculativeEngine::MaybeMove(Seq& s) {
  s.route_checked = true;
  if (groups_.size() < 2 || s.group < 0) return;
  const GroupChoice choice = DomainRouter::ChooseGroupFor(
      s.request.domain, GroupOptions(s, /*same_target_only=*/true), ExpectedRemaining(s));
  const int to = choice.index;
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
    SpecController& c = *groups_[g].controller;
    std::vector<Seq*> scored;
    std::vector<DraftRequest> requests;
    for (Seq* s : seqs) {
      if (s->emitted.empty() || s->group == static_cast<int>(g) || s->group < 0) continue;
      if (groups_[s->group].target != groups_[g].target) continue;
      scored.push_back(s);
      const int k = c.ShadowK(s->request.domain, s->shadow_in_run[g] != 0);
      requests.push_back({s->request.id, std::span(s->tokens.data(), s->len_before), k,
                          &s->sampler, s->request.domain, false});
    }
    if (requests.empty()) continue;
    const auto t0 = Clock::now();
    std::vector<Draft> drafts;
    if (!d->Propose(requests, &drafts).ok() || drafts.size() != requests.size()) continue;
    const double share =
        std::chrono::duration<double>(Clock::now() - t0).count() / static_cast<double>(scored.size());
    for (size_t i = 0; i < scored.size(); ++i) {
      Seq& s = *scored[i];
      const std::string& domain = s.request.domain;
      s.stats.draft_s += share;
      if (!has_prefill) c.RecordDraftTime(requests[i].k, share).IgnoreError();
      std::vector<int32_t>& proposal = drafts[i].tokens;
      if (proposal.size() > static_cast<size_t>(requests[i].k)) proposal.resize(requests[i].k);
      c.RecordProposal(domain, !proposal.empty());
      if (proposal.empty()) continue;
      const ShadowOutcome o = ScoreAgainst(proposal, s.emitted);
      c.RecordStep(domain, o.judged, o.passed, s.shadow_in_run[g] != 0).IgnoreError();
      s.shadow_in_run[g] = o.judged == o.passed;
    }
  }
}

}  // namespace specnode
