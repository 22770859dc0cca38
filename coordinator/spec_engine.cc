#include "coordinator/spec_engine.h"

#include <algorithm>
#include <cassert>
#include <chrono>

#include "absl/strings/str_format.h"
#include "coordinator/acceptance.h"
#include "coordinator/request_validator.h"
#include "coordinator/spec_engine_seq.h"
#include "model/status_macros.h"

namespace specnode {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

SpeculativeEngine::SpeculativeEngine(ModelRunner* target, std::vector<DraftGroup> groups,
                                     SpecEngineOptions options)
    : target_(target),
      groups_(std::move(groups)),
      options_(std::move(options)),
      group_starts_(groups_.size(), 0),
      tree_gain_(groups_.size()) {
  targets_.push_back(target_);
  for (DraftGroup& g : groups_) {
    if (g.target == nullptr) g.target = target_;
    if (std::find(targets_.begin(), targets_.end(), g.target) == targets_.end()) {
      targets_.push_back(g.target);
    }
    assert((g.drafter == nullptr) == (g.controller == nullptr));
    assert(g.target->vocab_size() == target_->vocab_size());
    assert(g.target->max_positions() == target_->max_positions());
    if (g.drafter != nullptr && g.drafter->ObservedTopK() > 0 &&
        std::find(observers_.begin(), observers_.end(), g.drafter) == observers_.end()) {
      observers_.push_back(g.drafter);
      observe_k_ = std::min(std::max(observe_k_, g.drafter->ObservedTopK()), target_->vocab_size());
    }
  }
  assert(options_.max_model_len >= 0 && options_.max_model_len <= target_->max_positions());
}

void SpeculativeEngine::FreeInDrafters(SeqId id) {
  for (DraftGroup& g : groups_) {
    if (g.drafter != nullptr) g.drafter->Free(id);
  }
}

ModelRunner* SpeculativeEngine::TargetOf(const Seq& s) const {
  return s.group < 0 ? target_ : groups_[s.group].target;
}

std::vector<int> SpeculativeEngine::GroupLoads() const {
  std::vector<int> loads(groups_.size(), 0);
  for (const auto& [id, s] : seqs_) {
    if (s->group >= 0) ++loads[s->group];
  }
  return loads;
}

SpeculativeEngine::~SpeculativeEngine() = default;

absl::Status SpeculativeEngine::Start(const SpecRequest& request) {
  if (seqs_.count(request.id)) {
    return absl::InvalidArgumentError(absl::StrFormat("sequence %d already exists", request.id));
  }
  // The request checks every way in shares (request_validator.h).
  SPECNODE_RETURN_IF_ERROR(ValidateRequest(request.prompt, request.max_new_tokens, request.sampling,
                                           request.domain, limits()));
  auto s = std::make_unique<Seq>(request);
  s->tokens = std::move(s->request.prompt);
  s->request.prompt.clear();
  s->n_prompt = static_cast<int32_t>(s->tokens.size());
  s->stats.prompt_tokens = s->n_prompt;
  s->shadow_in_run.assign(groups_.size(), 0);
  s->shadow_cursor.assign(groups_.size(), 0);
  if (!groups_.empty()) s->group = StartGroup(*s);
  if (s->group >= 0) ++group_starts_[s->group];
  if (options_.prefix_cache) {
    // Never the whole prompt: the last prompt token's logits give the first new token.
    const std::span<const int32_t> prompt(s->tokens.data(), s->tokens.size() - 1);
    s->prefilled = std::max(0, TargetOf(*s)->MatchPrefix(request.id, prompt));
    s->stats.cached_tokens = s->prefilled;
  }
  seqs_[request.id] = std::move(s);
  return absl::OkStatus();
}

bool SpeculativeEngine::HasRoomFor(int64_t tokens) const {
  for (ModelRunner* t : targets_) {
    const std::optional<ModelRunner::KvRoom> room = t->Room(tokens);
    if (!room.has_value() || room->needed <= room->available) return true;
  }
  return false;
}

absl::Status SpeculativeEngine::Park(SeqId id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrFormat("no sequence %d", id));
  Seq& s = *it->second;
  if (s.parked || s.prefilled < s.n_prompt) {
    return absl::FailedPreconditionError(
        absl::StrFormat("sequence %d is %s", id, s.parked ? "already parked" : "prefilling"));
  }
  SPECNODE_RETURN_IF_ERROR(TargetOf(s)->SwapOut(id));
  FreeInDrafters(id);
  s.parked = true;
  s.in_run = false;
  return absl::OkStatus();
}

absl::Status SpeculativeEngine::Resume(SeqId id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrFormat("no sequence %d", id));
  Seq& s = *it->second;
  if (!s.parked) return absl::OkStatus();
  SPECNODE_RETURN_IF_ERROR(TargetOf(s)->SwapIn(id));
  s.parked = false;
  return absl::OkStatus();
}

absl::Status SpeculativeEngine::Heartbeat(double idle_s) {
  const auto now = Clock::now();
  // Pings `ping` when `key` has had nothing for idle_s on `clock` (its first sight starts
  // the clock).
  auto ping_if_idle = [&](auto& clock, auto* key, auto&& ping) -> absl::Status {
    auto [it, fresh] = clock.try_emplace(key, now);
    if (fresh || Seconds(it->second, now) < idle_s) return absl::OkStatus();
    absl::Status st = ping();
    it->second = Clock::now();
    return st;
  };
  for (ModelRunner* t : targets_) {
    SPECNODE_RETURN_IF_ERROR(ping_if_idle(last_pass_, t, [t] { return t->Ping(); }));
  }
  // Drafters (a draft model on another rank) are pinged every idle_s on a clock of their
  // own: drafting does not reset it, and pings are cheap.
  for (DraftGroup& g : groups_) {
    if (g.drafter == nullptr) continue;
    Drafter* d = g.drafter;
    SPECNODE_RETURN_IF_ERROR(ping_if_idle(last_draft_ping_, d, [d] { return d->Ping(); }));
  }
  return absl::OkStatus();
}

bool SpeculativeEngine::Parked(SeqId id) const {
  auto it = seqs_.find(id);
  return it != seqs_.end() && it->second->parked;
}

bool SpeculativeEngine::Prefilling(SeqId id) const {
  auto it = seqs_.find(id);
  return it != seqs_.end() && it->second->prefilled < it->second->n_prompt;
}

const SpecSeqStats& SpeculativeEngine::Stats(SeqId id) const {
  auto it = seqs_.find(id);
  assert(it != seqs_.end());
  return it->second->stats;
}

std::span<const int32_t> SpeculativeEngine::Tokens(SeqId id) const {
  auto it = seqs_.find(id);
  assert(it != seqs_.end());
  return it->second->tokens;
}

int SpeculativeEngine::Group(SeqId id) const {
  auto it = seqs_.find(id);
  return it == seqs_.end() ? -1 : it->second->group;
}

void SpeculativeEngine::Finish(SeqId id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return;
  const Seq& s = *it->second;
  // Whatever of the sequence is still whole full-precision pages stays for later requests
  // (a follow-up turn, a recompute after preemption). A prefilling or parked sequence has
  // nothing new to give.
  if (options_.prefix_cache && !s.parked && s.prefilled == s.n_prompt) {
    TargetOf(s)->PublishPrefix(id, s.tokens);
  }
  TargetOf(s)->Free(id);
  FreeInDrafters(id);
  NoteGenerated(s);
  seqs_.erase(it);
}

void SpeculativeEngine::Emit(Seq& s, std::span<const int32_t> tokens, SeqStepResult* result) {
  for (int32_t t : tokens) {
    if (!s.request.ignore_stop && options_.stop_tokens.count(t)) {
      s.finished = true;
      result->finish = FinishReason::kStop;
      return;
    }
    s.tokens.push_back(t);
    result->tokens.push_back(t);
    if (++s.stats.generated >= s.request.max_new_tokens) {
      s.finished = true;
      result->finish = FinishReason::kLength;
      return;
    }
  }
}

absl::Status SpeculativeEngine::Step(std::span<const SeqId> ids, std::vector<SeqStepResult>* out) {
  std::vector<Seq*> seqs;
  for (SeqId id : ids) {
    auto it = seqs_.find(id);
    if (it == seqs_.end() || it->second->finished || it->second->parked) {
      return absl::InvalidArgumentError(
          absl::StrFormat("sequence %d is unknown, finished or parked", id));
    }
    if (std::find(seqs.begin(), seqs.end(), it->second.get()) != seqs.end()) {
      return absl::InvalidArgumentError(absl::StrFormat("sequence %d listed twice", id));
    }
    seqs.push_back(it->second.get());
  }

  // The batch regime of this step's costs (SpecController::SetBatchSize): the sequences
  // that share a target pass.
  {
    std::map<ModelRunner*, int> per_target;
    for (Seq* s : seqs) ++per_target[TargetOf(*s)];
    for (DraftGroup& g : groups_) {
      if (g.controller != nullptr) g.controller->SetBatchSize(per_target[g.target]);
    }
  }

  // Plan: prefill chunks under the budget; K per decoding sequence.
  int32_t budget = options_.prefill_budget;
  bool has_prefill = false;
  std::vector<std::vector<Seq*>> by_group(groups_.size());
  for (Seq* s : seqs) {
    s->k = 0;
    s->chunk = 0;
    s->drafts.clear();
    s->q.clear();
    s->parents.clear();
    // The target's pass boundary (ModelRunner::PassBoundary): a pass holds rows of this
    // sequence between two of its multiples only, so the rows see the cache that decoding
    // one token at a time would show them (mixed KV demotes at those boundaries).
    const int32_t boundary = TargetOf(*s)->PassBoundary();
    if (s->prefilled < s->n_prompt) {
      s->chunk = std::min(budget, s->n_prompt - s->prefilled);
      if (boundary > 0) s->chunk = std::min(s->chunk, boundary - s->prefilled % boundary);
      budget -= s->chunk;
      has_prefill |= s->chunk > 0;
      continue;
    }
    if (options_.route_moves && s->stats.group_moves == 0 && s->route_checks < kRouteChecks &&
        s->stats.steps >= (s->route_checks + 1) * kRouteCheckSteps) {
      MaybeMove(*s);
    }
    if (s->group < 0 || groups_[s->group].drafter == nullptr) continue;
    int k = options_.adaptive ? groups_[s->group].controller->ChooseK(s->request.domain, s->in_run)
                              : options_.fixed_k;
    // A step emits up to k + 1 tokens and caches positions up to len + k - 1.
    const int32_t len = static_cast<int32_t>(s->tokens.size());
    k = std::min(k, s->request.max_new_tokens - s->stats.generated - 1);
    k = std::min(k, target_->max_positions() - len);
    // Rows at positions len - 1 .. len - 1 + k.
    if (boundary > 0) k = std::min(k, boundary - 1 - (len - 1) % boundary);
    s->k = std::max(k, 0);
    if (s->k > 0) by_group[s->group].push_back(s);
  }

  // Draft, one batched call per group.
  std::vector<double> draft_share(groups_.size(), 0.0), catchup_share(groups_.size(), 0.0);
  for (size_t g = 0; g < groups_.size(); ++g) {
    if (by_group[g].empty()) continue;
    std::vector<DraftRequest> requests;
    for (Seq* s : by_group[g]) {
      requests.push_back({s->request.id, s->tokens, s->k, &s->sampler, s->request.domain,
                          options_.acceptance == AcceptanceRule::kRatio,
                          TreeBudget(*s, TargetOf(*s)->PassBoundary())});
    }
    // Sync (a draft model catching up on context it has not seen: a sequence's first
    // speculative step, or the first after steps at K = 0 or with another drafter) is part
    // of what speculating costs — the sequences' draft_s count it — but not a cost of K: a
    // drafter that often sits out would otherwise carry its catch-ups in the intercept of
    // its draft-time line for every step (measured on the Qwen2.5 pair under the router:
    // 27 ms against 7.5 ms drafting alone), and the router would under-rate it.
    int64_t uncached = 0;
    for (const DraftRequest& r : requests)
      uncached += groups_[g].drafter->Uncached(r.seq, r.context);
    const auto t0 = Clock::now();
    SPECNODE_RETURN_IF_ERROR(groups_[g].drafter->Sync(requests));
    const auto t1 = Clock::now();
    // The router weighs a first try on a sequence with its catch-up (ChooseGroupFor); only
    // catch-ups long enough to time are (a call's fixed cost would swamp a few tokens).
    if (uncached >= kMinCatchupSample) {
      groups_[g].controller->RecordCatchupTime(uncached, Seconds(t0, t1)).IgnoreError();
    }
    std::vector<Draft> drafts;
    SPECNODE_RETURN_IF_ERROR(groups_[g].drafter->Propose(requests, &drafts));
    draft_share[g] = Seconds(t1, Clock::now()) / by_group[g].size();
    catchup_share[g] = Seconds(t0, t1) / by_group[g].size();
    for (size_t i = 0; i < by_group[g].size(); ++i) {
      TakeDraft(*by_group[g][i], drafts[i], requests[i].max_nodes);
    }
  }

  // One pass per target: prefill chunks, and [last token, drafts...] per decoding sequence.
  std::vector<Pass> passes;
  std::vector<std::vector<int32_t>> inputs(seqs.size());
  std::vector<size_t> pass_of(seqs.size(), 0), row_of(seqs.size(), 0);
  std::vector<size_t> rows;
  for (size_t i = 0; i < seqs.size(); ++i) {
    Seq* s = seqs[i];
    const bool prefill = s->prefilled < s->n_prompt;
    if (prefill && s->chunk == 0) continue;
    ModelRunner* runner = TargetOf(*s);
    size_t p = 0;
    while (p < passes.size() && passes[p].runner != runner) ++p;
    if (p == passes.size()) {
      passes.emplace_back().runner = runner;
      rows.push_back(0);
    }
    pass_of[i] = p;
    row_of[i] = rows[p];
    passes[p].head.Add(s->sampler, target_->vocab_size());
    // A drafter that recycles the target's candidates needs them whenever the head is cut.
    if (passes[p].head.k > 0) passes[p].head.k = std::max(passes[p].head.k, observe_k_);
    if (prefill) {
      inputs[i].assign(s->tokens.begin() + s->prefilled,
                       s->tokens.begin() + s->prefilled + s->chunk);
      passes[p].batch.push_back({s->request.id, inputs[i], false});
      rows[p] += 1;
    } else {
      inputs[i].push_back(s->tokens.back());
      inputs[i].insert(inputs[i].end(), s->drafts.begin(), s->drafts.end());
      const bool verify = !s->drafts.empty();
      passes[p].batch.push_back({s->request.id, inputs[i], verify,
                                 s->tree() ? s->row_parents : std::span<const int32_t>()});
      rows[p] += verify ? inputs[i].size() : 1;
    }
    passes[p].tokens += inputs[i].size();
  }
  PlanDraws(seqs, inputs, pass_of, passes);
  SPECNODE_RETURN_IF_ERROR(RunPasses(passes));
  // A pass's time is shared by its input tokens: a sequence verifying K drafts brought K+1
  // rows and pays for K+1, so in a large batch the controller sees what its drafts cost.
  auto target_share_of = [&](size_t i) {
    if (inputs[i].empty()) return 0.0;
    const Pass& p = passes[pass_of[i]];
    return p.seconds * inputs[i].size() / p.tokens;
  };

  // Sample and accept, per sequence. Each draw's noise is a function of the sequence's seed
  // and the position drawn (sampling.h), so the results depend neither on the split over
  // the pool nor on the order.
  std::vector<AcceptOutcome> outcomes(seqs.size());
  std::vector<int32_t> first_token(seqs.size(), -1);
  if (p_.size() < seqs.size()) p_.resize(seqs.size());
  auto accept = [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end; ++i) {
      if (inputs[i].empty()) continue;  // a prefill with no chunk this step
      AcceptSeq(*seqs[i], passes[pass_of[i]], row_of[i], &p_[i], &first_token[i], &outcomes[i]);
    }
  };
  if (options_.pool != nullptr && seqs.size() > 1) {
    options_.pool->ParallelFor(static_cast<int64_t>(seqs.size()), 1, accept);
  } else {
    accept(0, static_cast<int64_t>(seqs.size()), 0);
  }

  // Roll back, commit, feed the controllers (in order, on this thread).
  out->clear();
  for (size_t i = 0; i < seqs.size(); ++i) {
    Seq* s = seqs[i];
    SeqStepResult result;
    result.id = s->request.id;
    if (s->prefilled < s->n_prompt) {
      s->prefilled += s->chunk;
      // After every chunk, not only the last: mixed KV demotes a long prompt's old tokens
      // between chunks (at its pass boundaries), and only full-precision pages are shared,
      // so the prompt's pages are published while they still are (the cache keeps them;
      // the sequence's own tokens move to demoted pages).
      if (options_.prefix_cache) {
        TargetOf(*s)->PublishPrefix(s->request.id, std::span(s->tokens.data(), s->prefilled));
      }
      if (first_token[i] >= 0) Emit(*s, {&first_token[i], 1}, &result);
      s->stats.target_s += target_share_of(i);
      out->push_back(std::move(result));
      continue;
    }
    const int k = static_cast<int>(s->drafts.size());
    const int32_t len = static_cast<int32_t>(s->tokens.size());
    const AcceptOutcome& outcome = outcomes[i];
    // Of a tree, the depth it reached: what "every draft accepted" means for it.
    const int depth = s->tree() ? s->tree_depth : k;
    std::vector<int32_t> emitted;
    if (s->tree()) {
      // Keep the last committed token's row and the kept path's in the target cache.
      std::vector<int32_t> rows = {0};
      for (int32_t node : s->kept) {
        rows.push_back(node + 1);
        emitted.push_back(s->drafts[node]);
      }
      SPECNODE_RETURN_IF_ERROR(TargetOf(*s)->KeepRows(s->request.id, len - 1, rows));
    } else {
      if (k > 0) {
        // Keep the last committed token and the accepted drafts in the target cache.
        SPECNODE_RETURN_IF_ERROR(TargetOf(*s)->Truncate(s->request.id, len + outcome.accepted));
      }
      emitted.assign(s->drafts.begin(), s->drafts.begin() + outcome.accepted);
    }
    const bool was_in_run = s->in_run;
    s->in_run = k > 0 && outcome.accepted == depth;
    emitted.push_back(outcome.next_token);
    Emit(*s, emitted, &result);
    ScoreTrees(*s);
    result.k = k;
    result.accepted = outcome.accepted;
    s->stats.steps++;
    const double target_share = target_share_of(i);
    s->stats.target_s += target_share;
    if (s->group >= 0 && groups_[s->group].controller != nullptr) {
      SpecController& c = *groups_[s->group].controller;
      if (s->k > 0) {
        // Drafting ran (even if it proposed nothing): its cost counts.
        s->stats.draft_s += draft_share[s->group] + catchup_share[s->group];
        if (!has_prefill) c.RecordDraftTime(s->k, draft_share[s->group]).IgnoreError();
        // Whether it proposed anything: a prompt-lookup drafter without a match does not,
        // and the router must not rate it by its proposals' acceptance alone.
        c.RecordProposal(s->request.domain, k > 0);
      }
      if (k > 0) {
        s->stats.spec_steps++;
        s->stats.tree_steps += s->tree();
        s->stats.drafted += k;
        s->stats.accepted += outcome.accepted;
        // A tree's positions are its depth: the controller's K is how deep it may go.
        c.RecordStep(s->request.domain, depth, outcome.accepted, was_in_run).IgnoreError();
      }
      if (!has_prefill) RecordTargetTime(*s, k, target_share);
    }
    out->push_back(std::move(result));
  }
  ShadowScore(seqs, has_prefill);
  ObserveTarget(seqs, inputs, pass_of, row_of, passes);
  return absl::OkStatus();
}

void SpeculativeEngine::PlanDraws(std::span<Seq* const> seqs,
                                  const std::vector<std::vector<int32_t>>& inputs,
                                  const std::vector<size_t>& pass_of, std::vector<Pass>& passes) {
  const int32_t vocab = target_->vocab_size();
  for (Pass& pass : passes) pass.drawn = pass.head.k == 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const Seq* s = seqs[i];
    if (inputs[i].empty()) continue;
    // The ratio rule needs a sampled verification's distributions, pruning samplers the row.
    const bool ratio = options_.acceptance == AcceptanceRule::kRatio && !s->drafts.empty() &&
                       s->sampler.params().temperature != 0.0f;
    if (ratio || !s->sampler.DrawsWithParams(vocab)) passes[pass_of[i]].drawn = false;
  }
  for (size_t i = 0; i < seqs.size(); ++i) {
    const Seq* s = seqs[i];
    Pass& pass = passes[pass_of[i]];
    if (inputs[i].empty() || !pass.drawn) continue;
    const int64_t position = static_cast<int64_t>(s->tokens.size());
    if (s->prefilled < s->n_prompt) {  // one row, drawn only when it ends the prompt
      const bool last = s->prefilled + s->chunk == s->n_prompt;
      pass.draws.push_back(last ? s->sampler.DrawAt(position) : sample::DrawParams{});
      continue;
    }
    // Row j draws the token after its path: position + j on a chain, + its depth in a tree.
    for (size_t j = 0; j <= s->drafts.size(); ++j) {
      const int64_t offset = s->tree() ? s->row_depth[j] : static_cast<int64_t>(j);
      pass.draws.push_back(s->sampler.DrawAt(position + offset));
    }
  }
}

absl::Status SpeculativeEngine::RunPasses(std::vector<Pass>& passes) {
  // Lengths before the step, to undo the passes that succeeded if another failed.
  std::vector<std::vector<int32_t>> before(passes.size());
  for (size_t p = 0; p < passes.size(); ++p) {
    for (const BatchEntry& e : passes[p].batch)
      before[p].push_back(passes[p].runner->Length(e.seq));
  }
  const auto t0 = Clock::now();
  absl::Status first_error;
  std::vector<bool> begun(passes.size(), false), done(passes.size(), false);
  for (size_t p = 0; p < passes.size() && first_error.ok(); ++p) {
    first_error = passes[p].runner->BeginForward(passes[p].batch);
    begun[p] = first_error.ok();
  }
  for (size_t p = 0; p < passes.size(); ++p) {
    if (!begun[p]) continue;
    Pass& pass = passes[p];
    absl::Status st = pass.drawn         ? pass.runner->EndForwardDrawn(pass.draws, &pass.ids)
                      : pass.head.k == 0 ? pass.runner->EndForward(&pass.logits)
                      : pass.head.sampled || pass.head.k > 1
                          ? pass.runner->EndForwardTopK(pass.head.k, &pass.ids, &pass.values)
                          : pass.runner->EndForwardArgMax(&pass.ids);
    const auto end = Clock::now();
    passes[p].seconds = Seconds(t0, end);
    last_pass_[passes[p].runner] = end;
    done[p] = st.ok();
    if (first_error.ok()) first_error = std::move(st);
  }
  if (first_error.ok()) return absl::OkStatus();
  for (size_t p = 0; p < passes.size(); ++p) {
    if (!done[p]) continue;
    for (size_t j = 0; j < passes[p].batch.size(); ++j) {
      // Best effort: a runner that cannot truncate is broken and fails every later call.
      (void)passes[p].runner->Truncate(passes[p].batch[j].seq, before[p][j]);
    }
  }
  return first_error;
}

}  // namespace specnode
