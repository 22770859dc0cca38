// Token sampling from logits: greedy, temperature, top-k, top-p, with a seeded generator
// whose stream is defined by this code (not by the standard library's distributions), so
// the same seed gives the same tokens on every platform and build.
//
// Order of operations (as llama.cpp and HF do): temperature scaling -> top-k -> softmax ->
// top-p (smallest set whose probability reaches top_p, at least one token) -> renormalise
// -> draw. temperature == 0 means greedy (argmax, lowest id on ties), ignoring the rest.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"

namespace specnode {

struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy; otherwise (0, 100]
  int top_k = 0;             // 0 = off; otherwise keep the k most likely
  float top_p = 1.0f;        // (0, 1]; 1 = off
  uint64_t seed = 0;
};

// InvalidArgument naming the parameter when out of range (negative or NaN temperature,
// top_k < 0, top_p outside (0, 1]).
absl::Status ValidateSamplingParams(const SamplingParams& params);

// xoshiro256** seeded through splitmix64. Deterministic across platforms.
class Rng {
 public:
  explicit Rng(uint64_t seed);
  uint64_t Next();
  // Uniform in [0, 1) with 53 random bits.
  double Uniform();

 private:
  uint64_t s_[4];
};

// Index of the largest logit (lowest index on ties). logits must be non-empty.
int32_t ArgMax(std::span<const float> logits);

// One sampler per sequence: owns the generator stream. Not thread-safe.
class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);

  // Draws a token id from logits ([vocab]). Bit-identical to SampleFrom(Distribution(..))
  // but, with top-k on, touches only the k candidates after one selection pass (the dense
  // path sorted and normalised the whole vocabulary: 4-6% of a 16-sequence serve step).
  int32_t Sample(std::span<const float> logits);

  // The distribution Sample draws from, as a dense [vocab] vector of probabilities (zeros
  // outside the kept set). Greedy gives a one-hot vector. Used by speculative acceptance.
  void Distribution(std::span<const float> logits, std::vector<float>* probs) const;

  // Draws an index from a probability vector (need not be normalised; sum > 0).
  int32_t SampleFrom(std::span<const float> probs);

  const SamplingParams& params() const { return params_; }
  Rng& rng() { return rng_; }

 private:
  // The kept candidates when top-k or top-p prunes (temperature > 0, not
  // KeepsWholeVocabulary): ids in descending logit order (ties: lower id first), and their
  // unnormalised weights exp((l - max) / T) with their sum.
  void Candidates(std::span<const float> logits, std::vector<int32_t>* ids,
                  std::vector<double>* weights, double* sum) const;

  // No top-k / top-p pruning: every id is a candidate.
  bool KeepsWholeVocabulary(size_t vocab) const;
  // probs[vocab] = Candidates' weights / sum in id order, without building its id list (the
  // unpruned case is most sampled requests; the lists cost more than the exps there).
  void DenseProbabilities(std::span<const float> logits, float* probs) const;

  SamplingParams params_;
  Rng rng_;
  std::vector<float> dense_probs_;  // scratch of Sample
};

}  // namespace specnode
