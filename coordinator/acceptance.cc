#include "coordinator/acceptance.h"

#include <algorithm>
#include <cassert>
#include <vector>

#include "absl/strings/str_cat.h"

namespace specnode {

absl::StatusOr<AcceptanceRule> ParseAcceptanceRule(std::string_view name) {
  if (name == "match") return AcceptanceRule::kMatch;
  if (name == "ratio") return AcceptanceRule::kRatio;
  return absl::InvalidArgumentError(absl::StrCat("acceptance rule must be match or ratio, got \"",
                                                 absl::string_view(name.data(), name.size()),
                                                 "\""));
}

std::string_view AcceptanceRuleName(AcceptanceRule rule) {
  return rule == AcceptanceRule::kMatch ? "match" : "ratio";
}

namespace {

// Accepts drafts while each equals the target's token at its row (token_at(i) for row i);
// the outcome's next token is the target's at the first disagreement, or row k's.
template <typename TokenAt>
AcceptOutcome AcceptWhileEqual(std::span<const int32_t> drafts, TokenAt token_at) {
  const size_t k = drafts.size();
  AcceptOutcome out;
  for (size_t i = 0;; ++i) {
    const int32_t t = token_at(i);
    if (i == k || t != drafts[i]) {
      out.accepted = static_cast<int>(i);
      out.next_token = t;
      return out;
    }
  }
}

}  // namespace

AcceptOutcome AcceptGreedy(std::span<const int32_t> drafts, std::span<const float> target_logits,
                           int32_t vocab) {
  assert(target_logits.size() == (drafts.size() + 1) * static_cast<size_t>(vocab));
  return AcceptWhileEqual(
      drafts, [&](size_t i) { return ArgMax(target_logits.subspan(i * vocab, vocab)); });
}

AcceptOutcome AcceptMatch(std::span<const int32_t> drafts, std::span<const float> target_logits,
                          int32_t vocab, int64_t first_position, Sampler* sampler) {
  assert(target_logits.size() == (drafts.size() + 1) * static_cast<size_t>(vocab));
  // Sampling stops at the first mismatch: later rows' tokens are never drawn.
  return AcceptWhileEqual(drafts, [&](size_t i) {
    return sampler->Sample(target_logits.subspan(i * vocab, vocab),
                           first_position + static_cast<int64_t>(i));
  });
}

AcceptOutcome AcceptDrawn(std::span<const int32_t> drafts, std::span<const int32_t> t) {
  assert(t.size() == drafts.size() + 1);
  return AcceptWhileEqual(drafts, [&](size_t i) { return t[i]; });
}

AcceptOutcome AcceptRatio(std::span<const int32_t> drafts, std::span<const float> p,
                          std::span<const float> q, int32_t vocab, int64_t first_position,
                          const Sampler& sampler) {
  const size_t k = drafts.size();
  assert(p.size() == (k + 1) * static_cast<size_t>(vocab));
  assert(q.empty() || q.size() == k * static_cast<size_t>(vocab));
  AcceptOutcome out;
  for (size_t i = 0; i < k; ++i) {
    const int64_t position = first_position + static_cast<int64_t>(i);
    const std::span<const float> pi = p.subspan(i * vocab, vocab);
    const int32_t d = drafts[i];
    const double p_d = pi[d];
    const double q_d = q.empty() ? 1.0 : q[i * vocab + d];
    // q_d > 0 for a token the draft sampled; guard anyway so a bad drafter cannot divide by 0.
    const double ratio = q_d > 0.0 ? p_d / q_d : (p_d > 0.0 ? 1.0 : 0.0);
    // Accepted when U < ratio (ratio >= 1 always passes).
    if (sampler.Noise(position, NoiseStream::kAccept).Uniform(0) < ratio) continue;
    std::vector<float> residual(pi.begin(), pi.end());
    double mass = 0.0;
    for (int32_t t = 0; t < vocab; ++t) {
      const float qt = q.empty() ? (t == d ? 1.0f : 0.0f) : q[i * vocab + t];
      residual[t] = std::max(0.0f, residual[t] - qt);
      mass += residual[t];
    }
    out.accepted = static_cast<int>(i);
    // mass == 0 only if p <= q everywhere, i.e. p == q up to rounding, where rejection has
    // probability ~0; fall back to p itself.
    out.next_token = RaceDraw(mass > 0.0 ? std::span<const float>(residual) : pi,
                              sampler.Noise(position, NoiseStream::kResidual));
    return out;
  }
  out.accepted = static_cast<int>(k);
  out.next_token =
      sampler.SampleFrom(p.subspan(k * vocab, vocab), first_position + static_cast<int64_t>(k));
  return out;
}

AcceptOutcome AcceptFromHead(std::span<const int32_t> drafts, const HeadRows& rows,
                             int64_t first_position, std::span<const float> q, int32_t vocab,
                             const Sampler& sampler, AcceptanceRule rule,
                             std::vector<float>* p_scratch) {
  const size_t k = drafts.size();
  if (k > 0 && sampler.params().temperature != 0.0f && rule == AcceptanceRule::kRatio) {
    std::vector<float>& p = *p_scratch;
    p.resize((k + 1) * static_cast<size_t>(vocab));
    std::vector<float> dist;
    for (size_t r = 0; r <= k; ++r) {
      sampler.DistributionTopK(rows.Ids(r), rows.Values(r), vocab, &dist);
      std::copy(dist.begin(), dist.end(), p.begin() + r * vocab);
    }
    return AcceptRatio(drafts, p, q, vocab, first_position, sampler);
  }
  // Greedy, match, and a step without drafts: each row's own draw until the first mismatch
  // (greedy's draw is row's first id, SampleTopK at temperature 0).
  return AcceptWhileEqual(drafts, [&](size_t i) {
    return rows.Sample(i, sampler, first_position + static_cast<int64_t>(i));
  });
}

}  // namespace specnode
