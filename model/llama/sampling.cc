#include "model/llama/sampling.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "model/llama/sample_math.h"

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

using sample::kGolden;
using sample::Mix;

uint64_t SplitMix64(uint64_t* x) { return Mix(*x += kGolden); }
uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

// The exponential race over n entries: id_of(i) and prob_of(i) in ascending id order
// (entries <= 0 never win). Shared by the dense SampleFrom/RaceDraw and the sparse Sample
// so both see the same floats, the same noise per id and the same tie order.
template <typename IdOf, typename ProbOf>
int32_t RaceInOrder(const PositionNoise& noise, size_t n, IdOf id_of, ProbOf prob_of) {
  double best = std::numeric_limits<double>::infinity();
  int32_t winner = -1;
  for (size_t i = 0; i < n; ++i) {
    const double p = prob_of(i);
    if (!(p > 0.0)) continue;
    const int32_t id = id_of(i);
    const double u = noise.Uniform(static_cast<uint64_t>(id));
    // An entry that cannot beat the best is skipped without a logarithm (sample_math.h); a
    // skipped entry would have lost anyway, so any order of the entries (a device's
    // threads) finds the same winner.
    if (sample::RaceSkip(u, p, best)) continue;
    const double e = sample::RaceEntry(u, p);
    if (e < best) {  // strict: the lowest id wins a tie
      best = e;
      winner = id;
    }
  }
  return winner >= 0 ? winner : 0;
}

}  // namespace

PositionNoise::PositionNoise(uint64_t seed, int64_t position, NoiseStream stream)
    : key_(Mix(Mix(seed + kGolden) ^
               Mix((static_cast<uint64_t>(position) << 2 | static_cast<uint64_t>(stream)) +
                   2 * kGolden))) {}

PositionNoise PositionNoise::FromKey(uint64_t key) {
  PositionNoise noise;
  noise.key_ = key;
  return noise;
}

double PositionNoise::Uniform(uint64_t index) const { return sample::NoiseUniform(key_, index); }

int32_t RaceDraw(std::span<const float> probs, const PositionNoise& noise) {
  return RaceInOrder(
      noise, probs.size(), [](size_t i) { return static_cast<int32_t>(i); },
      [&](size_t i) { return probs[i]; });
}

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
// (Candidates) and unpruned (DenseProbabilities) paths and the device's draws, so all give
// the same bits.
using sample::LogitWeight;

float MaxLogit(const float* logits, size_t n) {
  float max_logit = logits[0];
  for (size_t i = 0; i < n; ++i) max_logit = std::max(max_logit, logits[i]);
  return max_logit;
}

// The weight sum of a whole row of n logits in sample::kSumLanes interleaved lanes and their
// fixed tree: the order the device's draw kernel sums in (sample_math.h). Stores the
// weights into w [n] unless null.
double LaneWeightSum(const float* logits, size_t n, float max_logit, float inv_t, double* w) {
  double lanes[sample::kSumLanes] = {};
  for (size_t i = 0; i < n; ++i) {
    const double weight = LogitWeight(logits[i], max_logit, inv_t);
    if (w != nullptr) w[i] = weight;
    lanes[i % sample::kSumLanes] += weight;
  }
  return sample::FoldLanes(lanes);
}

// The arithmetic after a selection: weights of n logits in descending order at inv_t, and
// top-p's cut of them against their own sequential sum (top_p < 1); returns how many are
// kept, with weights [keep] and *sum their sum.
int32_t WeighSorted(const float* sorted_logits, int32_t n, float inv_t, float top_p,
                    std::vector<double>* weights, double* sum) {
  const float max_logit = MaxLogit(sorted_logits, static_cast<size_t>(n));
  std::vector<double>& p = *weights;
  p.resize(n);
  *sum = 0.0;
  for (int32_t i = 0; i < n; ++i) {
    p[i] = LogitWeight(sorted_logits[i], max_logit, inv_t);
    *sum += p[i];
  }
  int32_t keep = n;
  if (top_p < 1.0f) {
    double kept_sum = 0.0;
    keep = sample::NucleusCut(p.data(), n, top_p, *sum, &kept_sum);
    if (keep == 0) keep = n;  // rounding kept the cut from closing: keep them all
    *sum = kept_sum;
  }
  p.resize(keep);
  return keep;
}

// Top-p alone over a whole row (no top-k), as a device does it: the row's weight sum in
// LaneWeightSum's order, then the cut (sample::NucleusCut) over the sample::kNucleusHead
// largest logits, sorted; only a nucleus wider than those sorts the rest. ids, weights
// [keep] of the kept, descending logit (ties lower id first), and *sum their sum.
void NucleusCandidates(std::span<const float> logits, float inv_t, float top_p,
                       std::vector<int32_t>* ids, std::vector<double>* weights, double* sum) {
  const size_t vocab = logits.size();
  const float max_logit = MaxLogit(logits.data(), vocab);
  const double row_sum = LaneWeightSum(logits.data(), vocab, max_logit, inv_t, nullptr);
  auto by_logit = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  ids->resize(vocab);
  std::iota(ids->begin(), ids->end(), 0);
  size_t sorted = std::min<size_t>(sample::kNucleusHead, vocab);
  std::partial_sort(ids->begin(), ids->begin() + sorted, ids->end(), by_logit);
  std::vector<double>& w = *weights;
  auto cut = [&] {
    w.resize(sorted);
    for (size_t i = 0; i < sorted; ++i) w[i] = LogitWeight(logits[(*ids)[i]], max_logit, inv_t);
    return sample::NucleusCut(w.data(), static_cast<int>(sorted), top_p, row_sum, sum);
  };
  int keep = cut();
  if (keep == 0 && sorted < vocab) {  // wider than the head: the rest sorted after it
    std::sort(ids->begin() + static_cast<std::ptrdiff_t>(sorted), ids->end(), by_logit);
    sorted = vocab;
    keep = cut();
  }
  if (keep == 0) keep = static_cast<int>(vocab);  // rounding: the whole row, *sum its sum
  ids->resize(keep);
  w.resize(keep);
}

// The race over kept candidates (ids [n] in any order, weights / sum) with `noise`:
// SampleFrom over the dense vector, restricted to its non-zero entries — the same float
// probabilities raced with the same noise per id in the same (id) order.
int32_t RaceKeptWith(std::span<const int32_t> ids, const std::vector<double>& weights, double sum,
                     const PositionNoise& noise) {
  std::vector<std::pair<int32_t, float>> kept(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    kept[i] = {ids[i], static_cast<float>(weights[i] / sum)};
  }
  // Pruned candidates come in logit order: back to id order.
  std::sort(kept.begin(), kept.end());
  return RaceInOrder(
      noise, kept.size(), [&](size_t i) { return kept[i].first; },
      [&](size_t i) { return kept[i].second; });
}

}  // namespace

Sampler::Sampler(const SamplingParams& params) : params_(params) {}

void Sampler::Candidates(std::span<const float> logits, std::vector<int32_t>* ids,
                         std::vector<double>* weights, double* sum) const {
  const int32_t vocab = static_cast<int32_t>(logits.size());
  auto by_logit = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  // Candidates sorted by logit (descending, ties by id): top-k or top-p prunes here (the
  // unpruned case goes to DenseProbabilities instead).
  assert(!KeepsWholeVocabulary(logits.size()));
  int32_t keep = vocab;
  if (params_.top_k > 0 && params_.top_k < vocab) {
    ids->resize(vocab);
    std::iota(ids->begin(), ids->end(), 0);
    keep = params_.top_k;
    std::partial_sort(ids->begin(), ids->begin() + keep, ids->end(), by_logit);
  } else {
    NucleusCandidates(logits, 1.0f / params_.temperature, params_.top_p, ids, weights, sum);
    return;
  }
  std::vector<float> sorted(keep);
  for (int32_t i = 0; i < keep; ++i) sorted[i] = logits[(*ids)[i]];
  ids->resize(Weigh(sorted.data(), keep, weights, sum));
}

int32_t Sampler::Weigh(const float* sorted_logits, int32_t n, std::vector<double>* weights,
                       double* sum) const {
  return WeighSorted(sorted_logits, n, 1.0f / params_.temperature, params_.top_p, weights, sum);
}

int32_t Sampler::RaceKept(std::span<const int32_t> ids, const std::vector<double>& weights,
                          double sum, int64_t position) const {
  return RaceKeptWith(ids, weights, sum, Noise(position, NoiseStream::kToken));
}

int Sampler::HeadCandidates(int64_t vocab) const {
  if (params_.temperature == 0.0f) return 1;
  return params_.top_k > 0 && params_.top_k < vocab ? params_.top_k : 0;
}

int32_t Sampler::SampleTopK(std::span<const int32_t> ids, std::span<const float> values,
                            int64_t position) const {
  if (params_.temperature == 0.0f) return ids[0];
  const int32_t n = params_.top_k;
  assert(n > 0 && ids.size() >= static_cast<size_t>(n) && values.size() >= ids.size());
  std::vector<double> p;
  double sum = 0.0;
  const int32_t keep = Weigh(values.data(), n, &p, &sum);
  return RaceKept(ids.first(keep), p, sum, position);
}

void Sampler::DistributionTopK(std::span<const int32_t> ids, std::span<const float> values,
                               int64_t vocab, std::vector<float>* probs) const {
  probs->assign(vocab, 0.0f);
  if (params_.temperature == 0.0f) {
    (*probs)[ids[0]] = 1.0f;
    return;
  }
  const int32_t n = params_.top_k;
  assert(n > 0 && ids.size() >= static_cast<size_t>(n) && values.size() >= ids.size());
  std::vector<double> p;
  double sum = 0.0;
  const int32_t keep = Weigh(values.data(), n, &p, &sum);
  for (int32_t i = 0; i < keep; ++i) (*probs)[ids[i]] = static_cast<float>(p[i] / sum);
}

bool Sampler::KeepsWholeVocabulary(size_t vocab) const {
  return (params_.top_k <= 0 || static_cast<size_t>(params_.top_k) >= vocab) &&
         params_.top_p >= 1.0f;
}

namespace {

// Candidates' arithmetic without its id list: the same weights (LogitWeight), sum and
// quotients, for a row of `vocab` logits at 1 / temperature `inv_t`.
void DenseProbabilitiesAt(const float* logits, size_t vocab, float inv_t, float* probs) {
  thread_local std::vector<double> w;  // scratch, per thread (samplers run on the pool)
  w.resize(vocab);
  const double sum = LaneWeightSum(logits, vocab, MaxLogit(logits, vocab), inv_t, w.data());
  for (size_t i = 0; i < vocab; ++i) probs[i] = static_cast<float>(w[i] / sum);
}

}  // namespace

void Sampler::DenseProbabilities(std::span<const float> logits, float* probs) const {
  DenseProbabilitiesAt(logits.data(), logits.size(), 1.0f / params_.temperature, probs);
}

bool Sampler::DrawsWithParams(int64_t vocab) const {
  return params_.temperature == 0.0f || params_.top_k <= 0 || params_.top_k >= vocab;
}

sample::DrawParams Sampler::DrawAt(int64_t position) const {
  assert(params_.temperature >= 0.0f);
  if (params_.temperature == 0.0f) return {Noise(position, NoiseStream::kToken).key(), 0.0f};
  return {Noise(position, NoiseStream::kToken).key(), 1.0f / params_.temperature, params_.top_p};
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

int32_t Sampler::SampleFrom(std::span<const float> probs, int64_t position) const {
  return RaceDraw(probs, Noise(position, NoiseStream::kToken));
}

int32_t Sampler::Sample(std::span<const float> logits, int64_t position) {
  if (params_.temperature == 0.0f) return ArgMax(logits);
  if (KeepsWholeVocabulary(logits.size())) {
    // The whole vocabulary in id order: no id list, no pairs, no sort check.
    dense_probs_.resize(logits.size());
    DenseProbabilities(logits, dense_probs_.data());
    return SampleFrom(dense_probs_, position);
  }
  std::vector<int32_t> ids;
  std::vector<double> p;
  double sum = 0.0;
  Candidates(logits, &ids, &p, &sum);
  return RaceKept(ids, p, sum, position);
}

void TopK(std::span<const float> logits, int k, int32_t* ids, float* values) {
  assert(k > 0 && static_cast<size_t>(k) <= logits.size());
  if (k > kScanTopK) {
    std::vector<int32_t> order(logits.size());
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    for (int i = 0; i < k; ++i) {
      ids[i] = order[i];
      values[i] = logits[order[i]];
    }
    return;
  }
  // One scan keeping the k best in order: ids rise, so an equal logit never displaces an
  // earlier id (the ties rule), and most logits fail the first comparison with the k-th.
  int filled = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    const float v = logits[i];
    if (filled == k && !(v > values[k - 1])) continue;
    int j = filled < k ? filled++ : k - 1;
    for (; j > 0 && v > values[j - 1]; --j) {
      values[j] = values[j - 1];
      ids[j] = ids[j - 1];
    }
    values[j] = v;
    ids[j] = static_cast<int32_t>(i);
  }
}

namespace {

// No NaN or infinity in row [n] (the host heads' check; sampling.cc stands alone, so it does
// not call the CPU kernels' AllFinite).
bool RowFinite(const float* row, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(row[i])) return false;
  }
  return true;
}

}  // namespace

absl::Status ValidateHeadK(int k, int64_t vocab) {
  if (k > 0 && k <= vocab) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("top-k head of ", k, " over a vocabulary of ", vocab));
}

void ArgMaxRows(const float* logits, int64_t rows, int64_t vocab, int32_t* ids) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = logits + r * vocab;
    ids[r] = RowFinite(row, vocab) ? ArgMax({row, static_cast<size_t>(vocab)}) : -1;
  }
}

void TopKRows(const float* logits, int64_t rows, int64_t vocab, int k, int32_t* ids,
              float* values) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = logits + r * vocab;
    if (!RowFinite(row, vocab)) {
      ids[r * k] = -1;
      continue;
    }
    TopK({row, static_cast<size_t>(vocab)}, k, ids + r * k, values + r * k);
  }
}

void DrawRows(const float* logits, int64_t rows, int64_t vocab, const sample::DrawParams* draws,
              int32_t* ids) {
  std::vector<float> probs;
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = logits + r * vocab;
    const std::span<const float> span(row, static_cast<size_t>(vocab));
    if (!RowFinite(row, vocab)) {
      ids[r] = -1;
    } else if (draws[r].inv_t == 0.0f) {
      ids[r] = ArgMax(span);
    } else if (draws[r].top_p < 1.0f) {
      std::vector<int32_t> kept;
      std::vector<double> weights;
      double sum = 0.0;
      NucleusCandidates(span, draws[r].inv_t, draws[r].top_p, &kept, &weights, &sum);
      ids[r] = RaceKeptWith(kept, weights, sum, PositionNoise::FromKey(draws[r].key));
    } else {
      probs.resize(static_cast<size_t>(vocab));
      DenseProbabilitiesAt(row, static_cast<size_t>(vocab), draws[r].inv_t, probs.data());
      ids[r] = RaceDraw(probs, PositionNoise::FromKey(draws[r].key));
    }
  }
}

absl::Status CheckDrawCount(const char* where, size_t draws, int64_t rows) {
  if (static_cast<int64_t>(draws) == rows) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(where, ": ", draws, " draws for ", rows, " logit rows"));
}

}  // namespace specnode
