#include "coordinator/acceptance.h"

#include <algorithm>
#include <cassert>
#include <vector>

namespace specnode {

AcceptOutcome AcceptGreedy(std::span<const int32_t> drafts, std::span<const float> target_logits,
                           int32_t vocab) {
  const size_t k = drafts.size();
  assert(target_logits.size() == (k + 1) * static_cast<size_t>(vocab));
  AcceptOutcome out;
  for (size_t i = 0; i <= k; ++i) {
    const int32_t best = ArgMax(target_logits.subspan(i * vocab, vocab));
    if (i == k || best != drafts[i]) {
      out.accepted = static_cast<int>(i);
      out.next_token = best;
      return out;
    }
  }
  return out;  // unreachable: the loop returns at i == k
}

AcceptOutcome AcceptSampled(std::span<const int32_t> drafts, std::span<const float> p,
                            std::span<const float> q, int32_t vocab, Sampler* sampler) {
  const size_t k = drafts.size();
  assert(p.size() == (k + 1) * static_cast<size_t>(vocab));
  assert(q.empty() || q.size() == k * static_cast<size_t>(vocab));
  AcceptOutcome out;
  for (size_t i = 0; i < k; ++i) {
    const std::span<const float> pi = p.subspan(i * vocab, vocab);
    const int32_t d = drafts[i];
    const double p_d = pi[d];
    const double q_d = q.empty() ? 1.0 : q[i * vocab + d];
    // q_d > 0 for a token the draft sampled; guard anyway so a bad drafter cannot divide by 0.
    const double ratio = q_d > 0.0 ? p_d / q_d : (p_d > 0.0 ? 1.0 : 0.0);
    if (sampler->rng().Uniform() < ratio) continue;  // accepted (ratio >= 1 always passes)
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
    out.next_token = mass > 0.0 ? sampler->SampleFrom(residual) : sampler->SampleFrom(pi);
    return out;
  }
  out.accepted = static_cast<int>(k);
  out.next_token = sampler->SampleFrom(p.subspan(k * vocab, vocab));
  return out;
}

}  // namespace specnode
