#include "coordinator/spec_engine.h"

#include <algorithm>
#include <cassert>
#include <chrono>

#include "absl/strings/str_format.h"
#include "coordinator/acceptance.h"
#include "model/status_macros.h"

namespace specnode {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

struct SpeculativeEngine::Seq {
  explicit Seq(const SpecRequest& r) : request(r), sampler(r.sampling) {}
  SpecRequest request;  // prompt moved into tokens
  std::vector<int32_t> tokens;
  int32_t n_prompt = 0;
  int32_t prefilled = 0;  // prompt tokens in the target cache
  Sampler sampler;
  int group = -1;
  SpecSeqStats stats;
  bool finished = false;
  bool in_run = false;  // the last step was speculative and accepted every draft
  // This step's plan.
  int k = 0;
  int32_t chunk = 0;
  std::vector<int32_t> drafts;
  std::vector<float> q;
};

SpeculativeEngine::SpeculativeEngine(ModelRunner* target, std::vector<DraftGroup> groups,
                                     SpecEngineOptions options)
    : target_(target), groups_(std::move(groups)), options_(std::move(options)) {}

SpeculativeEngine::~SpeculativeEngine() = default;

absl::Status SpeculativeEngine::Start(const SpecRequest& request) {
  if (seqs_.count(request.id)) {
    return absl::InvalidArgumentError(absl::StrFormat("sequence %d already exists", request.id));
  }
  if (request.prompt.empty()) return absl::InvalidArgumentError("the prompt is empty");
  for (int32_t id : request.prompt) {
    if (id < 0 || id >= target_->vocab_size()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "prompt token id %d outside the vocabulary [0, %d)", id, target_->vocab_size()));
    }
  }
  SPECNODE_RETURN_IF_ERROR(ValidateSamplingParams(request.sampling));
  if (request.max_new_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("max_new_tokens must be >= 1, got %d", request.max_new_tokens));
  }
  if (static_cast<int64_t>(request.prompt.size()) + request.max_new_tokens >
      target_->max_positions()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("prompt of %d tokens plus %d new tokens exceeds the context length %d",
                        request.prompt.size(), request.max_new_tokens, target_->max_positions()));
  }
  auto s = std::make_unique<Seq>(request);
  s->tokens = std::move(s->request.prompt);
  s->request.prompt.clear();
  s->n_prompt = static_cast<int32_t>(s->tokens.size());
  s->stats.prompt_tokens = s->n_prompt;
  if (!groups_.empty()) {
    std::vector<const SpecController*> controllers;
    for (const DraftGroup& g : groups_) controllers.push_back(g.controller);
    s->group = groups_.size() == 1 ? 0 : DomainRouter::ChooseGroup(request.domain, controllers);
    const int64_t n = domain_starts_[request.domain]++;
    const int every = options_.explore_every;
    if (groups_.size() > 1 && every > 0 && n % every == every - 1) {
      s->group = static_cast<int>((n / every) % groups_.size());
    }
  }
  seqs_[request.id] = std::move(s);
  return absl::OkStatus();
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
  target_->Free(id);
  for (DraftGroup& g : groups_) g.drafter->Free(id);
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
    if (it == seqs_.end() || it->second->finished) {
      return absl::InvalidArgumentError(absl::StrFormat("sequence %d is unknown or finished", id));
    }
    if (std::find(seqs.begin(), seqs.end(), it->second.get()) != seqs.end()) {
      return absl::InvalidArgumentError(absl::StrFormat("sequence %d listed twice", id));
    }
    seqs.push_back(it->second.get());
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
    if (s->prefilled < s->n_prompt) {
      s->chunk = std::min(budget, s->n_prompt - s->prefilled);
      budget -= s->chunk;
      has_prefill |= s->chunk > 0;
      continue;
    }
    if (s->group < 0) continue;
    int k = options_.adaptive
                ? groups_[s->group].controller->ChooseK(s->request.domain, s->in_run)
                : options_.fixed_k;
    // A step emits up to k + 1 tokens and caches positions up to len + k - 1.
    const int32_t len = static_cast<int32_t>(s->tokens.size());
    k = std::min(k, s->request.max_new_tokens - s->stats.generated - 1);
    k = std::min(k, target_->max_positions() - len);
    s->k = std::max(k, 0);
    if (s->k > 0) by_group[s->group].push_back(s);
  }

  // Draft, one batched call per group.
  std::vector<double> draft_share(groups_.size(), 0.0);
  for (size_t g = 0; g < groups_.size(); ++g) {
    if (by_group[g].empty()) continue;
    std::vector<DraftRequest> requests;
    for (Seq* s : by_group[g]) {
      requests.push_back({s->request.id, s->tokens, s->k, &s->sampler, s->request.domain});
    }
    // Sync (a draft model catching up on context it has not seen, e.g. the first
    // speculative step of a sequence or a probe of a disabled domain) is part of what
    // speculating costs, so it is timed with the proposal.
    const auto t0 = Clock::now();
    SPECNODE_RETURN_IF_ERROR(groups_[g].drafter->Sync(requests));
    std::vector<Draft> drafts;
    SPECNODE_RETURN_IF_ERROR(groups_[g].drafter->Propose(requests, &drafts));
    draft_share[g] = Seconds(t0, Clock::now()) / by_group[g].size();
    for (size_t i = 0; i < by_group[g].size(); ++i) {
      Seq* s = by_group[g][i];
      s->drafts = std::move(drafts[i].tokens);
      s->q = std::move(drafts[i].q);
      if (s->drafts.size() > static_cast<size_t>(s->k)) s->drafts.resize(s->k);
    }
  }

  // One target pass: prefill chunks, and [last token, drafts...] per decoding sequence.
  std::vector<std::vector<int32_t>> inputs(seqs.size());
  std::vector<BatchEntry> batch;
  std::vector<size_t> row_of(seqs.size(), 0);
  size_t rows = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    Seq* s = seqs[i];
    if (s->prefilled < s->n_prompt) {
      if (s->chunk == 0) continue;
      inputs[i].assign(s->tokens.begin() + s->prefilled,
                       s->tokens.begin() + s->prefilled + s->chunk);
      batch.push_back({s->request.id, inputs[i], false});
      row_of[i] = rows++;
      continue;
    }
    inputs[i].push_back(s->tokens.back());
    inputs[i].insert(inputs[i].end(), s->drafts.begin(), s->drafts.end());
    const bool verify = !s->drafts.empty();
    batch.push_back({s->request.id, inputs[i], verify});
    row_of[i] = rows;
    rows += verify ? inputs[i].size() : 1;
  }
  const auto t0 = Clock::now();
  if (!batch.empty()) SPECNODE_RETURN_IF_ERROR(target_->Forward(batch, &logits_));
  // The pass's time is shared by input tokens: a sequence verifying K drafts brought K+1
  // rows and pays for K+1, so in a large batch the controller sees what its drafts cost.
  const double target_s = batch.empty() ? 0.0 : Seconds(t0, Clock::now());
  size_t batch_tokens = 0;
  for (const BatchEntry& e : batch) batch_tokens += e.tokens.size();
  auto target_share_of = [&](size_t i) {
    return batch_tokens == 0 ? 0.0 : target_s * inputs[i].size() / batch_tokens;
  };

  // Accept, roll back, commit, feed the controllers.
  const int32_t vocab = target_->vocab_size();
  out->clear();
  for (size_t i = 0; i < seqs.size(); ++i) {
    Seq* s = seqs[i];
    SeqStepResult result;
    result.id = s->request.id;
    const bool greedy = s->request.sampling.temperature == 0.0f;  // for acceptance
    const float* row0 = logits_.data() + row_of[i] * vocab;
    if (s->prefilled < s->n_prompt) {
      s->prefilled += s->chunk;
      if (s->chunk > 0 && s->prefilled == s->n_prompt) {
        const std::span<const float> row(row0, vocab);
        const int32_t first = s->sampler.Sample(row);
        Emit(*s, {&first, 1}, &result);
      }
      s->stats.target_s += target_share_of(i);
      out->push_back(std::move(result));
      continue;
    }
    const int k = static_cast<int>(s->drafts.size());
    const int32_t len = static_cast<int32_t>(s->tokens.size());
    AcceptOutcome outcome;
    if (k == 0) {
      const std::span<const float> row(row0, vocab);
      outcome.next_token = s->sampler.Sample(row);
    } else {
      const std::span<const float> rows_k(row0, static_cast<size_t>(k + 1) * vocab);
      if (greedy) {
        outcome = AcceptGreedy(s->drafts, rows_k, vocab);
      } else {
        p_.resize(static_cast<size_t>(k + 1) * vocab);
        std::vector<float> dist;
        for (int r = 0; r <= k; ++r) {
          s->sampler.Distribution(rows_k.subspan(static_cast<size_t>(r) * vocab, vocab), &dist);
          std::copy(dist.begin(), dist.end(), p_.begin() + static_cast<size_t>(r) * vocab);
        }
        outcome = AcceptSampled(s->drafts, p_, s->q, vocab, &s->sampler);
      }
      // Keep the last committed token and the accepted drafts in the target cache.
      SPECNODE_RETURN_IF_ERROR(target_->Truncate(s->request.id, len + outcome.accepted));
    }
    const bool was_in_run = s->in_run;
    s->in_run = k > 0 && outcome.accepted == k;
    std::vector<int32_t> emitted(s->drafts.begin(), s->drafts.begin() + outcome.accepted);
    emitted.push_back(outcome.next_token);
    Emit(*s, emitted, &result);
    result.k = k;
    result.accepted = outcome.accepted;
    s->stats.steps++;
    const double target_share = target_share_of(i);
    s->stats.target_s += target_share;
    if (s->group >= 0) {
      SpecController& c = *groups_[s->group].controller;
      if (s->k > 0) {
        // Drafting ran (even if it proposed nothing): its cost counts.
        s->stats.draft_s += draft_share[s->group];
        if (!has_prefill) c.RecordDraftTime(s->k, draft_share[s->group]).IgnoreError();
      }
      if (k > 0) {
        s->stats.spec_steps++;
        s->stats.drafted += k;
        s->stats.accepted += outcome.accepted;
        c.RecordStep(s->request.domain, k, outcome.accepted, was_in_run).IgnoreError();
        if (!has_prefill) c.RecordVerifyTime(k, target_share).IgnoreError();
      } else if (!has_prefill) {
        c.RecordDirectTime(target_share).IgnoreError();
      }
    }
    out->push_back(std::move(result));
  }
  return absl::OkStatus();
}

}  // namespace specnode
