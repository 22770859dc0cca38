// The acceptance rules: greedy follows argmax exactly; sampled acceptance emits tokens with
// the target's distribution whatever the draft proposes (chi-square over seeded trials).
#include "coordinator/acceptance.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace specnode {
namespace {

TEST(AcceptGreedyTest, AcceptsWhileArgmaxAgrees) {
  // vocab 4, k = 3; argmax rows: 2, 1, 3, 0.
  const std::vector<float> logits = {0, 1, 5, 2, /**/ 0, 9, 1, 1, /**/ 1, 2, 3, 4, /**/ 7, 1, 1, 1};
  AcceptOutcome all = AcceptGreedy(std::vector<int32_t>{2, 1, 3}, logits, 4);
  EXPECT_EQ(all.accepted, 3);
  EXPECT_EQ(all.next_token, 0);  // the bonus token
  AcceptOutcome second = AcceptGreedy(std::vector<int32_t>{2, 0, 3}, logits, 4);
  EXPECT_EQ(second.accepted, 1);
  EXPECT_EQ(second.next_token, 1);  // the target's own choice at the first disagreement
  AcceptOutcome none = AcceptGreedy(std::vector<int32_t>{}, std::span(logits).first(4), 4);
  EXPECT_EQ(none.accepted, 0);
  EXPECT_EQ(none.next_token, 2);
}

// A toy "language model" over a small vocabulary: next-token distribution given the
// previous token (a Markov chain), for target P and draft Q.
struct Chain {
  int vocab;
  std::vector<float> probs;  // [vocab (prev), vocab (next)]
  std::span<const float> Row(int prev) const {
    return std::span<const float>(probs).subspan(static_cast<size_t>(prev) * vocab, vocab);
  }
};

Chain RandomChain(int vocab, uint64_t seed, float sharpness) {
  Rng rng(seed);
  Chain c{vocab, std::vector<float>(static_cast<size_t>(vocab) * vocab)};
  for (int a = 0; a < vocab; ++a) {
    double sum = 0;
    for (int b = 0; b < vocab; ++b) {
      const double w = std::exp(sharpness * rng.Uniform());
      c.probs[a * vocab + b] = static_cast<float>(w);
      sum += w;
    }
    for (int b = 0; b < vocab; ++b) c.probs[a * vocab + b] /= sum;
  }
  return c;
}

// Pearson chi-square of observed counts against expected probabilities.
double ChiSquare(const std::vector<int64_t>& counts, const std::vector<double>& expected_p,
                 int64_t n) {
  double chi2 = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double e = expected_p[i] * n;
    chi2 += (counts[i] - e) * (counts[i] - e) / e;
  }
  return chi2;
}

struct SampledCase {
  int k;
  float draft_sharpness;     // 0 = uniform draft (low acceptance); large = peaked, disagreeing
  bool deterministic_draft;  // one-hot q (n-gram style): the draft is argmax of Q
};

class AcceptSampledTest : public testing::TestWithParam<SampledCase> {};

// The first two emitted tokens after context token c must be distributed as P(e1|c) P(e2|e1).
// When a step emits only one token, the second is drawn from the target chain directly (what
// the next step would do), so the joint is the target's. df = 24; the 0.1% critical value is
// 51.2: with fixed seeds the test is deterministic, and a wrong rule (e.g. skipping the
// residual) gives chi-square in the thousands.
TEST_P(AcceptSampledTest, EmitsTheTargetDistribution) {
  const SampledCase tc = GetParam();
  constexpr int kVocab = 5;
  const Chain target = RandomChain(kVocab, 11, 3.0f);
  const Chain draft = RandomChain(kVocab, 97, tc.draft_sharpness);
  SamplingParams sp;
  sp.temperature = 1.0f;
  sp.seed = 1234;
  Sampler sampler(sp);
  const int context = 3;
  constexpr int64_t kTrials = 60000;
  std::vector<int64_t> counts(kVocab * kVocab, 0);
  int64_t accepted_total = 0;
  for (int64_t trial = 0; trial < kTrials; ++trial) {
    std::vector<int32_t> drafts;
    std::vector<float> q, p;
    int prev = context;
    for (int i = 0; i < tc.k; ++i) {
      const auto row = draft.Row(prev);
      int32_t d;
      if (tc.deterministic_draft) {
        d = ArgMax(row);
      } else {
        d = sampler.SampleFrom(row);
        q.insert(q.end(), row.begin(), row.end());
      }
      drafts.push_back(d);
      prev = d;
    }
    prev = context;
    for (int i = 0; i <= tc.k; ++i) {
      const auto row = target.Row(prev);
      p.insert(p.end(), row.begin(), row.end());
      if (i < tc.k) prev = drafts[i];
    }
    const AcceptOutcome o = AcceptSampled(drafts, p, q, kVocab, &sampler);
    accepted_total += o.accepted;
    std::vector<int32_t> emitted(drafts.begin(), drafts.begin() + o.accepted);
    emitted.push_back(o.next_token);
    if (emitted.size() < 2) emitted.push_back(sampler.SampleFrom(target.Row(emitted[0])));
    counts[emitted[0] * kVocab + emitted[1]]++;
  }
  std::vector<double> expected(kVocab * kVocab);
  for (int a = 0; a < kVocab; ++a) {
    for (int b = 0; b < kVocab; ++b) {
      expected[a * kVocab + b] = target.Row(context)[a] * target.Row(a)[b];
    }
  }
  const double chi2 = ChiSquare(counts, expected, kTrials);
  EXPECT_LT(chi2, 51.2) << "k=" << tc.k << " acceptance "
                        << static_cast<double>(accepted_total) / (kTrials * tc.k);
}

INSTANTIATE_TEST_SUITE_P(Drafts, AcceptSampledTest,
                         testing::Values(SampledCase{1, 0.0f, false}, SampledCase{2, 3.0f, false},
                                         SampledCase{4, 8.0f, false}, SampledCase{3, 3.0f, true},
                                         SampledCase{2, 0.5f, true}));

TEST(AcceptSampledTest, IdenticalDraftIsAlwaysAccepted) {
  constexpr int kVocab = 5;
  const Chain chain = RandomChain(kVocab, 5, 2.0f);
  SamplingParams sp;
  sp.temperature = 1.0f;
  Sampler sampler(sp);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<int32_t> drafts;
    std::vector<float> q, p;
    int prev = 1;
    for (int i = 0; i < 3; ++i) {
      const auto row = chain.Row(prev);
      drafts.push_back(sampler.SampleFrom(row));
      q.insert(q.end(), row.begin(), row.end());
      p.insert(p.end(), row.begin(), row.end());
      prev = drafts.back();
    }
    const auto row = chain.Row(prev);
    p.insert(p.end(), row.begin(), row.end());
    ASSERT_EQ(AcceptSampled(drafts, p, q, kVocab, &sampler).accepted, 3);
  }
}

}  // namespace
}  // namespace specnode
