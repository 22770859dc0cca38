// The exact acceptance rules of speculative decoding (Leviathan et al. 2023; Chen et al.
// 2023): the tokens they emit are distributed exactly as if the target had sampled them one
// by one, whatever the draft proposed.
//
// A step verified k drafts d_1..d_k with the target's distributions p_1..p_{k+1} (p_i is the
// target's next-token distribution after the context and d_1..d_{i-1}). The outcome is the
// number n of accepted drafts and one more token from the target: the resampled token at
// the first rejection, or the bonus token drawn from p_{k+1} when all were accepted. A step
// therefore always emits n + 1 tokens.
#pragma once

#include <cstdint>
#include <span>

#include "model/llama/sampling.h"

namespace specnode {

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

// Sampled: accept d_i with probability min(1, p_i(d_i) / q_i(d_i)); at the first rejection
// draw from norm(max(0, p_i − q_i)); if all pass draw the bonus from p_{k+1}.
//   p: [k + 1, vocab] target distributions (Sampler::Distribution of the target logits)
//   q: [k, vocab] draft distributions, or empty for a deterministic drafter (q_i one-hot on
//      d_i: accept with probability p_i(d_i), residual = p_i without d_i)
// Draws from sampler's stream (Uniform for the tests, SampleFrom for the residual/bonus).
AcceptOutcome AcceptSampled(std::span<const int32_t> drafts, std::span<const float> p,
                            std::span<const float> q, int32_t vocab, Sampler* sampler);

}  // namespace specnode
