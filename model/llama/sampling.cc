#include "model/llama/sampling.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace specnode {

absl::Status ValidateSamplingParams(const SamplingParams& p) {
  if (!(p.temperature >= 0.0f && p.temperature <= 100.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("temperature must be in [0, 100], got ", p.temperature));
  }
  if (p.top_k < 0) {
    return absl::InvalidArgumentError(absl::StrCat("top_k must be >= 0, got ", p.top_k));
  }
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("top_p must be in (0, 1], got ", p.top_p));
  }
  return absl::OkStatus();
}

namespace {
uint64_t SplitMix64(uint64_t* x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
}  // namespace

namespace {

// Inverse-CDF draw with one uniform from rng over n entries in id order: id_of(i) and
// prob_of(i) (need not be normalised; entries <= 0 are never drawn). Shared by the dense
// SampleFrom and the sparse Sample so both accumulate the same floats in the same order.
template <typename IdOf, typename ProbOf>
int32_t DrawInOrder(Rng* rng, size_t n, IdOf id_of, ProbOf prob_of) {
  double total = 0.0;
  for (size_t i = 0; i < n; ++i) total += prob_of(i);
  const double r = rng->Uniform() * total;
  double cumulative = 0.0;
  int32_t last_nonzero = 0;
  for (size_t i = 0; i < n; ++i) {
    const float p = prob_of(i);
    if (p <= 0.0f) continue;
    cumulative += p;
    last_nonzero = id_of(i);
    if (r < cumulative) return last_nonzero;
  }
  return last_nonzero;  // rounding left r at the very top
}

}  // namespace

Rng::Rng(uint64_t seed) {
  for (uint64_t& s : s_) s = SplitMix64(&seed);
}

uint64_t Rng::Next() {
  const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = Rotl(s_[3], 45);
  return result;
}

double Rng::Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

int32_t ArgMax(std::span<const float> logits) {
  // The largest value first, over 16 independent lanes (the compiler turns the fixed-width
  // inner loop into vector max instructions; the old compare-and-index chain ran one
  // element per few cycles, 4% of a greedy 16-sequence step), then its first position.
  constexpr size_t kLanes = 16;
  const size_t n = logits.size();
  float lanes[kLanes];
  for (size_t j = 0; j < kLanes; ++j) lanes[j] = logits[0];
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) {
      lanes[j] = logits[i + j] > lanes[j] ? logits[i + j] : lanes[j];
    }
  }
  float best = lanes[0];
  for (size_t j = 1; j < kLanes; ++j) best = lanes[j] > best ? lanes[j] : best;
  for (; i < n; ++i) best = logits[i] > best ? logits[i] : best;
  for (size_t k = 0; k < n; ++k) {
    if (logits[k] == best) return static_cast<int32_t>(k);
  }
  return 0;  // NaN at id 0 (the old loop kept id 0 then too)
}

namespace {

// The unnormalised weight of a logit, exp((l - max) / T): one expression for the pruned
// (Candidates) and unpruned (DenseProbabilities) paths, so both give the same bits.
double LogitWeight(float logit, float max_logit, float inv_t) {
  return std::exp(static_cast<double>(logit - max_logit) * inv_t);
}

}  // namespace

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

void Sampler::Candidates(std::span<const float> logits, std::vector<int32_t>* ids,
                         std::vector<double>* weights, double* sum) const {
  const int32_t vocab = static_cast<int32_t>(logits.size());
  auto by_logit = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  // Candidates sorted by logit (descending, ties by id): top-k or top-p prunes here (the
  // unpruned case goes to DenseProbabilities instead).
  assert(!KeepsWholeVocabulary(logits.size()));
  ids->resize(vocab);
  std::iota(ids->begin(), ids->end(), 0);
  int32_t keep = vocab;
  if (params_.top_k > 0 && params_.top_k < vocab) {
    keep = params_.top_k;
    std::partial_sort(ids->begin(), ids->begin() + keep, ids->end(), by_logit);
  } else if (params_.top_p < 1.0f) {
    std::sort(ids->begin(), ids->end(), by_logit);
  }
  const float inv_t = 1.0f / params_.temperature;
  float max_logit = logits[(*ids)[0]];
  for (int32_t i = 0; i < keep; ++i) max_logit = std::max(max_logit, logits[(*ids)[i]]);
  std::vector<double>& p = *weights;
  p.resize(keep);
  *sum = 0.0;
  for (int32_t i = 0; i < keep; ++i) {
    p[i] = LogitWeight(logits[(*ids)[i]], max_logit, inv_t);
    *sum += p[i];
  }
  if (params_.top_p < 1.0f) {
    // ids[0..keep) are sorted here: keep the shortest prefix reaching top_p.
    double cumulative = 0.0;
    int32_t cut = keep;
    for (int32_t i = 0; i < keep; ++i) {
      cumulative += p[i] / *sum;
      if (cumulative >= params_.top_p) {
        cut = i + 1;
        break;
      }
    }
    keep = cut;
    *sum = std::accumulate(p.begin(), p.begin() + keep, 0.0);
  }
  ids->resize(keep);
  p.resize(keep);
}

bool Sampler::KeepsWholeVocabulary(size_t vocab) const {
  return (params_.top_k <= 0 || static_cast<size_t>(params_.top_k) >= vocab) &&
         params_.top_p >= 1.0f;
}

void Sampler::DenseProbabilities(std::span<const float> logits, float* probs) const {
  // Candidates' arithmetic without its id list: the same weights (LogitWeight), sum and
  // quotients.
  const size_t vocab = logits.size();
  const float inv_t = 1.0f / params_.temperature;
  float max_logit = logits[0];
  for (size_t i = 0; i < vocab; ++i) max_logit = std::max(max_logit, logits[i]);
  double sum = 0.0;
  thread_local std::vector<double> w;  // scratch, per thread (samplers run on the pool)
  w.resize(vocab);
  for (size_t i = 0; i < vocab; ++i) {
    w[i] = LogitWeight(logits[i], max_logit, inv_t);
    sum += w[i];
  }
  for (size_t i = 0; i < vocab; ++i) probs[i] = static_cast<float>(w[i] / sum);
}

void Sampler::Distribution(std::span<const float> logits, std::vector<float>* probs) const {
  const int32_t vocab = static_cast<int32_t>(logits.size());
  if (params_.temperature != 0.0f && KeepsWholeVocabulary(logits.size())) {
    probs->resize(vocab);
    DenseProbabilities(logits, probs->data());
    return;
  }
  probs->assign(vocab, 0.0f);
  if (params_.temperature == 0.0f) {
    (*probs)[ArgMax(logits)] = 1.0f;
    return;
  }
  std::vector<int32_t> ids;
  std::vector<double> p;
  double sum = 0.0;
  Candidates(logits, &ids, &p, &sum);
  for (size_t i = 0; i < ids.size(); ++i) (*probs)[ids[i]] = static_cast<float>(p[i] / sum);
}

int32_t Sampler::SampleFrom(std::span<const float> probs) {
  return DrawInOrder(
      &rng_, probs.size(), [](size_t i) { return static_cast<int32_t>(i); },
      [&](size_t i) { return probs[i]; });
}

int32_t Sampler::Sample(std::span<const float> logits) {
  if (params_.temperature == 0.0f) return ArgMax(logits);
  if (KeepsWholeVocabulary(logits.size())) {
    // The whole vocabulary in id order: no id list, no pairs, no sort check.
    dense_probs_.resize(logits.size());
    DenseProbabilities(logits, dense_probs_.data());
    return SampleFrom(dense_probs_);
  }
  std::vector<int32_t> ids;
  std::vector<double> p;
  double sum = 0.0;
  Candidates(logits, &ids, &p, &sum);
  // SampleFrom over the dense vector, restricted to its non-zero entries: the same float
  // probabilities accumulated in the same (id) order, one uniform draw.
  std::vector<std::pair<int32_t, float>> kept(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) kept[i] = {ids[i], static_cast<float>(p[i] / sum)};
  // Pruned candidates come in logit order: back to id order.
  std::sort(kept.begin(), kept.end());
  return DrawInOrder(
      &rng_, kept.size(), [&](size_t i) { return kept[i].first; },
      [&](size_t i) { return kept[i].second; });
}

}  // namespace specnode
