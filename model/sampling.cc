#include "model/sampling.h"

#include <algorithm>
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
  int32_t best = 0;
  for (int32_t i = 1; i < static_cast<int32_t>(logits.size()); ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return best;
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

void Sampler::Candidates(std::span<const float> logits, std::vector<int32_t>* ids,
                         std::vector<double>* weights, double* sum) const {
  const int32_t vocab = static_cast<int32_t>(logits.size());
  auto by_logit = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  int32_t keep = vocab;
  if (params_.top_k > 0 && params_.top_k < vocab) {
    // The top k in one pass: a heap whose front is the worst kept candidate (by_logit is
    // a total order on ids, so the set and its sorted order equal a partial sort's).
    keep = params_.top_k;
    ids->clear();
    ids->reserve(keep);
    for (int32_t i = 0; i < vocab; ++i) {
      if (static_cast<int32_t>(ids->size()) < keep) {
        ids->push_back(i);
        std::push_heap(ids->begin(), ids->end(), by_logit);
      } else if (by_logit(i, ids->front())) {
        std::pop_heap(ids->begin(), ids->end(), by_logit);
        ids->back() = i;
        std::push_heap(ids->begin(), ids->end(), by_logit);
      }
    }
    std::sort(ids->begin(), ids->end(), by_logit);
  } else {
    ids->resize(vocab);
    std::iota(ids->begin(), ids->end(), 0);
    if (params_.top_p < 1.0f) std::sort(ids->begin(), ids->end(), by_logit);
  }
  const float inv_t = 1.0f / params_.temperature;
  float max_logit = logits[(*ids)[0]];
  for (int32_t i = 0; i < keep; ++i) max_logit = std::max(max_logit, logits[(*ids)[i]]);
  std::vector<double>& p = *weights;
  p.resize(keep);
  *sum = 0.0;
  for (int32_t i = 0; i < keep; ++i) {
    p[i] = std::exp(static_cast<double>(logits[(*ids)[i]] - max_logit) * inv_t);
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

void Sampler::Distribution(std::span<const float> logits, std::vector<float>* probs) const {
  const int32_t vocab = static_cast<int32_t>(logits.size());
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
  double total = 0.0;
  for (float v : probs) total += v;
  const double r = rng_.Uniform() * total;
  double cumulative = 0.0;
  int32_t last_nonzero = 0;
  for (int32_t i = 0; i < static_cast<int32_t>(probs.size()); ++i) {
    if (probs[i] <= 0.0f) continue;
    cumulative += probs[i];
    last_nonzero = i;
    if (r < cumulative) return i;
  }
  return last_nonzero;  // rounding left r at the very top
}

int32_t Sampler::Sample(std::span<const float> logits) {
  if (params_.temperature == 0.0f) return ArgMax(logits);
  std::vector<int32_t> ids;
  std::vector<double> p;
  double sum = 0.0;
  Candidates(logits, &ids, &p, &sum);
  // SampleFrom over the dense vector, restricted to its non-zero entries: the same float
  // probabilities accumulated in the same (id) order, one uniform draw.
  std::vector<std::pair<int32_t, float>> kept(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) kept[i] = {ids[i], static_cast<float>(p[i] / sum)};
  // Without top-k / top-p the candidates are the whole vocabulary, already in id order.
  if (!std::is_sorted(kept.begin(), kept.end())) std::sort(kept.begin(), kept.end());
  double total = 0.0;
  for (const auto& [id, prob] : kept) total += prob;
  const double r = rng_.Uniform() * total;
  double cumulative = 0.0;
  int32_t last_nonzero = 0;
  for (const auto& [id, prob] : kept) {
    if (prob <= 0.0f) continue;
    cumulative += prob;
    last_nonzero = id;
    if (r < cumulative) return id;
  }
  return last_nonzero;
}

}  // namespace specnode
