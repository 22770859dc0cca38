// The exact acceptance rules of speculative decoding: the tokens they emit are distributed
// exactly as if the target had sampled them one by one, whatever the draft proposed.
//
// A step verified k drafts d_1..d_k with the target's rows 0..k (row i is the target's
// next-token distribution after the context and d_1..d_i). The outcome is the number n of
// accepted drafts and one more token from the target (at the first rejection, or the bonus
// token of row k when all were accepted). A step therefore always emits n + 1 tokens.
//
// Positions: row i predicts the token at position first_position + i of the sequence (the
// sequence's committed length before the step), the position whose noise (sampling.h) the
// rules draw with.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "model/llama/sampling.h"

namespace specnode {

// How a sampled (temperature > 0) verification accepts drafts. Greedy requests always use
// AcceptGreedy, which both rules reduce to.
enum class AcceptanceRule {
  // Default. The target's token at each position is drawn exactly as target-only decoding
  // draws it (Sampler::Sample with the position's noise); a draft is accepted iff it equals
  // that token. Seeded output is then the same text with or without speculation, whatever
  // the drafter, K or batch. For a deterministic drafter the acceptance probability is
  // p(d), as under the ratio test; a model drafter that races with the same noise
  // (ModelDrafter does) is accepted with probability at least (1 - TV) / (1 + TV), TV the
  // total variation between p and q (the ratio rule's is 1 - TV); measured in
  // docs/speculative.md.
  kMatch,
  // Leviathan et al. 2023 / Chen et al. 2023: accept d with probability min(1, p(d)/q(d)),
  // resample from norm(max(0, p - q)) at the first rejection. Maximal acceptance for a
  // given q, but the text of a seed depends on what was drafted.
  kRatio,
};

// "match" | "ratio"; InvalidArgument naming the accepted values otherwise.
absl::StatusOr<AcceptanceRule> ParseAcceptanceRule(std::string_view name);
std::string_view AcceptanceRuleName(AcceptanceRule rule);

struct AcceptOutcome {
  int accepted = 0;        // n, the accepted prefix of the drafts
  int32_t next_token = 0;  // the target's token after them
};

// Greedy: accept while d_i == argmax(target row i-1); next = argmax of the first row that
// disagreed (or of the last row). Uses no randomness, so speculative greedy output equals
// target-only greedy output whenever the target's rows equal its one-at-a-time rows.
//   target_logits: [k + 1, vocab]
AcceptOutcome AcceptGreedy(std::span<const int32_t> drafts, std::span<const float> target_logits,
                           int32_t vocab);

// kMatch: t_i = sampler->Sample(row i, first_position + i); accept while d_i == t_i; next =
// t at the first mismatch (or t_k). Stops sampling at the first mismatch.
//   target_logits: [k + 1, vocab]
AcceptOutcome AcceptMatch(std::span<const int32_t> drafts, std::span<const float> target_logits,
                          int32_t vocab, int64_t first_position, Sampler* sampler);

// kRatio: accept d_i if U_i < p_i(d_i) / q_i(d_i), U_i the uniform of position
// first_position + i's kAccept stream; at the first rejection race over norm(max(0, p_i −
// q_i)) with its kResidual noise; if all pass, the bonus is SampleFrom(p_k) at its position.
//   p: [k + 1, vocab] target distributions (Sampler::Distribution of the target logits)
//   q: [k, vocab] draft distributions, or empty for a deterministic drafter (q_i one-hot on
//      d_i: accept with probability p_i(d_i), residual = p_i without d_i)
AcceptOutcome AcceptRatio(std::span<const int32_t> drafts, std::span<const float> p,
                          std::span<const float> q, int32_t vocab, int64_t first_position,
                          const Sampler& sampler);

// A step's outcome from the target's own tokens t [drafts.size() + 1] (each row's draw:
// ModelRunner::ForwardDrawn): accept while d_i == t_i, next = t at the first mismatch (or
// t_k). What AcceptMatch (sampled) and AcceptGreedy (greedy: t the arg maxes) give from the
// rows those tokens were drawn from.
AcceptOutcome AcceptDrawn(std::span<const int32_t> drafts, std::span<const int32_t> t);

// A pass's rows as their k largest logits (ModelRunner::ForwardTopK; k = 1 from
// ForwardArgMax, with values null: greedy draws only): row r's ids at ids[r * k, r * k + k),
// its logits at values likewise, in TopK's order (model/llama/sampling.h). Borrowed.
struct HeadRows {
  int k = 1;
  const int32_t* ids = nullptr;
  const float* values = nullptr;

  std::span<const int32_t> Ids(size_t r) const { return {ids + r * k, static_cast<size_t>(k)}; }
  std::span<const float> Values(size_t r) const {
    return values == nullptr ? std::span<const float>()
                             : std::span<const float>(values + r * k, static_cast<size_t>(k));
  }
  // Row r's draw at `position`: Sampler::SampleTopK (k >= sampler.HeadCandidates(vocab)).
  int32_t Sample(size_t r, const Sampler& sampler, int64_t position) const {
    return sampler.SampleTopK(Ids(r), Values(r), position);
  }
};

// What a pass's head returns for its samplers (Sampler::HeadCandidates), folded over them
// with Add: each row's k largest logits, k the most any sampler needs, or the whole rows
// (k == 0) as soon as one needs them; values only when some sampler draws at temperature > 0
// (else the arg max: k == 1). Shared by the engine's target passes and a draft model's rounds.
struct HeadPlan {
  int k = 1;
  bool sampled = false;

  void Add(const Sampler& sampler, int64_t vocab) {
    const int need = sampler.HeadCandidates(vocab);
    k = need == 0 || k == 0 ? 0 : std::max(k, need);
    sampled = sampled || sampler.params().temperature != 0.0f;
  }
  // The head rows from row `first_row` on of what the runner returned (k > 0).
  HeadRows Rows(const std::vector<int32_t>& ids, const std::vector<float>& values,
                size_t first_row) const {
    return {k, ids.data() + first_row * k, sampled ? values.data() + first_row * k : nullptr};
  }
};

// A step's outcome from head rows [drafts.size() + 1] instead of the whole rows, for a
// sampler whose draws need only them (0 < sampler.HeadCandidates(vocab) <= rows.k): no
// drafts -> the row's draw; greedy -> AcceptGreedy; else `rule`'s AcceptMatch or AcceptRatio
// (q as AcceptRatio's; p_scratch holds its target distributions). The same outcome the
// whole rows give, so the head a runner returns never changes the text.
AcceptOutcome AcceptFromHead(std::span<const int32_t> drafts, const HeadRows& rows,
                             int64_t first_position, std::span<const float> q, int32_t vocab,
                             const Sampler& sampler, AcceptanceRule rule,
                             std::vector<float>* p_scratch);

}  // namespace specnode
