// Token sampling from logits: greedy, temperature, top-k, top-p. The randomness of a sampled
// token is a pure function of (seed, position in the sequence): counter-based noise defined
// by this code (not by the standard library's distributions), so the same seed gives the
// same token at the same position whatever else ran before it — batch mates, preemption,
// the drafts speculation proposed, a restart.
//
// A draw is an exponential race (equivalent to Gumbel-max): token t gets E_t = -ln(u_t) with
// u_t the position's uniform for id t, and the winner is argmin over p_t > 0 of E_t / p_t,
// which is t with probability p_t / sum(p). Because the noise is indexed by token id, the
// target and a draft model that race with the same position's noise pick the same token
// whenever their distributions are close — what the `match` acceptance rule relies on.
//
// Order of operations (as llama.cpp and HF do): temperature scaling -> top-k -> softmax ->
// top-p (smallest set whose probability reaches top_p, at least one token) -> renormalise
// -> draw. temperature == 0 means greedy (argmax, lowest id on ties), ignoring the rest.
// The arithmetic is sample_math.h's, fixed so that a device repeats it bit for bit: weights
// exp((l - max) / T) in double; with top-k the k's sum in logit order, without it the whole
// row's in sample::kSumLanes lanes; top-p keeps the shortest logit-ordered prefix whose
// weights, added in order, reach top_p times that sum (sample::NucleusCut).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "model/llama/sample_math.h"

namespace specnode {

struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy; otherwise (0, 100]
  int top_k = 0;             // 0 = off; otherwise keep the k most likely
  float top_p = 1.0f;        // (0, 1]; 1 = off
  uint64_t seed = 0;
};

// What a request that names no sampling gets from the node: the ZeroMQ protocol
// (docs/protocol.md) and `specnode generate` alike, so one prompt and seed sample the same
// text either way. The OpenAI API keeps OpenAI's defaults instead (temperature 1, and a
// fresh seed per request without one: what its clients assume; docs/openai-api.md).
inline constexpr SamplingParams kDefaultSampling{0.7f, 0, 1.0f, 0};

// InvalidArgument naming the parameter when out of range (negative or NaN temperature,
// top_k < 0, top_p outside (0, 1]).
absl::Status ValidateSamplingParams(const SamplingParams& params);

// xoshiro256** seeded through splitmix64. Deterministic across platforms. A sequential
// generator for benchmarks and tests; sampling uses PositionNoise.
class Rng {
 public:
  explicit Rng(uint64_t seed);
  uint64_t Next();
  // Uniform in [0, 1) with 53 random bits.
  double Uniform();

 private:
  uint64_t s_[4];
};

// What a position's randomness is used for: independent streams of the same position.
enum class NoiseStream : uint64_t {
  kToken = 0,     // the token drawn at the position (target and drafter alike)
  kAccept = 1,    // the ratio acceptance rule's uniform
  kResidual = 2,  // the ratio rule's draw from the residual distribution
};

// The noise of one (seed, position, stream): a family of independent uniforms indexed by
// token id. Cheap to make (a few multiplies); copyable; immutable, so thread-safe.
class PositionNoise {
 public:
  PositionNoise(uint64_t seed, int64_t position, NoiseStream stream);
  // The noise whose key() is `key` (a DrawParams' key).
  static PositionNoise FromKey(uint64_t key);
  // Uniform in the open interval (0, 1), 53 random bits; a function of the key and index only.
  double Uniform(uint64_t index) const;
  // What Uniform is a function of besides the index (sample::NoiseUniform): a device's
  // draw takes it instead of the seed and position.
  uint64_t key() const { return key_; }

 private:
  PositionNoise() = default;
  uint64_t key_ = 0;
};

// The exponential race over probs ([n], need not be normalised; entries <= 0 or NaN never
// win) with noise's uniform for each index: index t wins with probability probs[t]/sum.
// Ties go to the lowest index. probs must hold at least one positive entry (else 0).
int32_t RaceDraw(std::span<const float> probs, const PositionNoise& noise);

// Index of the largest logit (lowest index on ties). logits must be non-empty.
int32_t ArgMax(std::span<const float> logits);

// A row's k largest logits, the order every sampler path uses: descending logit, ties to the
// lower id (+0 and -0 are equal logits). ids [k] and values [k]; 0 < k <= logits.size().
// The host reference of a device head (Backend::FinishTopK). Up to kScanTopK candidates in
// one scan of the row (what a host head and the token-recycling drafter ask for per pass
// row); more by a partial sort.
inline constexpr int kScanTopK = 64;
void TopK(std::span<const float> logits, int k, int32_t* ids, float* values);

// InvalidArgument unless 0 < k <= vocab: the k a top-k head (ForwardTopK) can return.
absl::Status ValidateHeadK(int k, int64_t vocab);

// The host's heads of `rows` rows of `vocab` logits: each row's ArgMax (ids [rows]) or TopK
// (ids, values [rows * k]); a row holding a NaN or an infinity gets id -1 (its first).
void ArgMaxRows(const float* logits, int64_t rows, int64_t vocab, int32_t* ids);
void TopKRows(const float* logits, int64_t rows, int64_t vocab, int k, int32_t* ids, float* values);

// The host's draws of `rows` rows of `vocab` logits with per-row DrawParams (draws [rows]):
// ids[r] is what Sampler::Sample gives for row r when the row's sampler DrawsWithParams and
// draws[r] = sampler.DrawAt(position) — the reference of a device's draw kernel
// (Backend::FinishDraws). A row holding a NaN or an infinity gets -1.
void DrawRows(const float* logits, int64_t rows, int64_t vocab, const sample::DrawParams* draws,
              int32_t* ids);

// InvalidArgument naming `where` unless there is one draw per logit row (what every drawn
// head checks before it runs).
absl::Status CheckDrawCount(const char* where, size_t draws, int64_t rows);

// One sampler per sequence: its parameters and scratch. Holds no generator state (the noise
// is a function of the seed and the position), so calls commute. Not thread-safe (scratch).
class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);

  // The token at `position` (0-based index in the sequence, prompt included, of the token
  // being drawn) from logits ([vocab]), racing with Noise(position, kToken). Bit-identical
  // to SampleFrom(Distribution(..), position) but, with top-k on, touches only the k
  // candidates after one selection pass. Greedy (temperature 0) is ArgMax.
  int32_t Sample(std::span<const float> logits, int64_t position);

  // The distribution Sample draws from, as a dense [vocab] vector of probabilities (zeros
  // outside the kept set). Greedy gives a one-hot vector. Used by speculative acceptance.
  void Distribution(std::span<const float> logits, std::vector<float>* probs) const;

  // How many of a row's largest logits this sampler needs to draw (SampleTopK) and to give
  // its distribution (DistributionTopK): 1 greedy, top_k where top-k prunes a vocabulary of
  // `vocab`, 0 where a draw needs the whole row (no top-k: the softmax sums every logit).
  // A device then ships those candidates instead of the row (ModelRunner::ForwardTopK).
  int HeadCandidates(int64_t vocab) const;

  // Sample and Distribution from a row's TopK candidates alone: ids and values [>= n] in
  // TopK's order, n = HeadCandidates(vocab) > 0 (extra candidates after the first n are
  // ignored). Bit-identical to Sample / Distribution of the whole row, so a step may take
  // either path (speculative or not, device or host head) and draw the same token.
  int32_t SampleTopK(std::span<const int32_t> ids, std::span<const float> values,
                     int64_t position) const;
  void DistributionTopK(std::span<const int32_t> ids, std::span<const float> values, int64_t vocab,
                        std::vector<float>* probs) const;

  // True when Sample needs nothing but DrawAt's parameters and the row: greedy, or sampled
  // with no top-k pruning a vocabulary of `vocab` (top-p or not: the OpenAI API's default
  // and its usual top_p). A device then draws the row where its logits are
  // (ModelRunner::ForwardDrawn).
  bool DrawsWithParams(int64_t vocab) const;
  // The row's draw parameters at `position` (DrawsWithParams only): the kToken noise key,
  // 1 / temperature (0 for greedy) and top_p (1 for greedy).
  sample::DrawParams DrawAt(int64_t position) const;

  // Draws an index from a probability vector (need not be normalised; sum > 0) at
  // `position`: RaceDraw with Noise(position, kToken).
  int32_t SampleFrom(std::span<const float> probs, int64_t position) const;

  // The noise of this sequence's seed at a position.
  PositionNoise Noise(int64_t position, NoiseStream stream) const {
    return PositionNoise(params_.seed, position, stream);
  }

  const SamplingParams& params() const { return params_; }

 private:
  // The kept candidates when top-k or top-p prunes (temperature > 0, not
  // KeepsWholeVocabulary): ids in descending logit order (ties: lower id first), and their
  // unnormalised weights exp((l - max) / T) with their sum.
  void Candidates(std::span<const float> logits, std::vector<int32_t>* ids,
                  std::vector<double>* weights, double* sum) const;
  // The arithmetic after a top-k selection: weights of n candidate logits in descending
  // order, their sum, and top-p's cut; returns how many are kept.
  int32_t Weigh(const float* sorted_logits, int32_t n, std::vector<double>* weights,
                double* sum) const;
  // The race over kept candidates (ids [n] in any order, weights / sum) at `position`.
  int32_t RaceKept(std::span<const int32_t> ids, const std::vector<double>& weights, double sum,
                   int64_t position) const;

  // No top-k / top-p pruning: every id is a candidate.
  bool KeepsWholeVocabulary(size_t vocab) const;
  // probs[vocab] = Candidates' weights / sum in id order, without building its id list (the
  // unpruned case is most sampled requests; the lists cost more than the exps there).
  void DenseProbabilities(std::span<const float> logits, float* probs) const;

  SamplingParams params_;
  std::vector<float> dense_probs_;  // scratch of Sample
};

}  // namespace specnode
