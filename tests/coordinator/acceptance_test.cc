// The acceptance rules: greedy follows argmax exactly; both sampled rules emit tokens with
// the target's distribution whatever the draft proposes (chi-square over seeded trials);
// the match rule emits exactly what target-only sampling would, position by position.
#include "coordinator/acceptance.h"

#include <cmath>
#include <string>
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

// The target's logits for a chain row: log p, so that Sample at temperature 1 draws from p.
std::vector<float> LogitsOf(std::span<const float> probs) {
  std::vector<float> l(probs.size());
  for (size_t i = 0; i < probs.size(); ++i) l[i] = std::log(probs[i]);
  return l;
}

// The position of the context's last token + 1: the first drafted position.
constexpr int64_t kFirstPosition = 10;

struct SampledCase {
  AcceptanceRule rule;
  int k;
  float draft_sharpness;     // 0 = uniform draft (low acceptance); large = peaked, disagreeing
  bool deterministic_draft;  // one-hot q (n-gram style): the draft is argmax of Q
};

std::string CaseName(const testing::TestParamInfo<SampledCase>& info) {
  const SampledCase& c = info.param;
  return std::string(AcceptanceRuleName(c.rule)) + "_k" + std::to_string(c.k) + "_sharp" +
         std::to_string(static_cast<int>(c.draft_sharpness * 10)) +
         (c.deterministic_draft ? "_deterministic" : "_sampled");
}

// One verification step after context token `context`, as the engine runs it: the drafts
// (sampled drafts race with their position's noise, as ModelDrafter's do), the target rows
// along them, and the rule's outcome; returns the emitted tokens.
struct StepResult {
  std::vector<int32_t> drafts, emitted;
};
StepResult Step(const SampledCase& tc, const Chain& target, const Chain& draft, int context,
                Sampler* sampler) {
  StepResult r;
  std::vector<float> q, p, logits;
  int prev = context;
  for (int i = 0; i < tc.k; ++i) {
    const auto row = draft.Row(prev);
    int32_t d;
    if (tc.deterministic_draft) {
      d = ArgMax(row);
    } else {
      d = sampler->SampleFrom(row, kFirstPosition + i);
      q.insert(q.end(), row.begin(), row.end());
    }
    r.drafts.push_back(d);
    prev = d;
  }
  prev = context;
  for (int i = 0; i <= tc.k; ++i) {
    const auto row = target.Row(prev);
    p.insert(p.end(), row.begin(), row.end());
    const std::vector<float> l = LogitsOf(row);
    logits.insert(logits.end(), l.begin(), l.end());
    if (i < tc.k) prev = r.drafts[i];
  }
  const int vocab = target.vocab;
  const AcceptOutcome o = tc.rule == AcceptanceRule::kMatch
                              ? AcceptMatch(r.drafts, logits, vocab, kFirstPosition, sampler)
                              : AcceptRatio(r.drafts, p, q, vocab, kFirstPosition, *sampler);
  r.emitted.assign(r.drafts.begin(), r.drafts.begin() + o.accepted);
  r.emitted.push_back(o.next_token);
  return r;
}

class AcceptSampledTest : public testing::TestWithParam<SampledCase> {};

// The first two emitted tokens after context token c must be distributed as P(e1|c) P(e2|e1).
// When a step emits only one token, the second is what the next step draws at its position
// (target-only there, as after a rejection), so the joint is the target's. Each trial is a
// sequence of its own seed. df = 24; the 0.1% critical value is 51.2: with fixed seeds the
// test is deterministic, and a wrong rule (e.g. skipping the residual, or reusing the
// draft's noise for the ratio test) gives chi-square in the hundreds.
TEST_P(AcceptSampledTest, EmitsTheTargetDistribution) {
  const SampledCase tc = GetParam();
  constexpr int kVocab = 5;
  const Chain target = RandomChain(kVocab, 11, 3.0f);
  const Chain draft = RandomChain(kVocab, 97, tc.draft_sharpness);
  const int context = 3;
  constexpr int64_t kTrials = 60000;
  std::vector<int64_t> counts(kVocab * kVocab, 0);
  int64_t accepted_total = 0, first_accepted = 0;
  for (int64_t trial = 0; trial < kTrials; ++trial) {
    Sampler sampler(SamplingParams{1.0f, 0, 1.0f, static_cast<uint64_t>(trial) + 1000});
    StepResult r = Step(tc, target, draft, context, &sampler);
    accepted_total += static_cast<int64_t>(r.emitted.size()) - 1;
    first_accepted += r.emitted.size() > 1;
    if (r.emitted.size() < 2) {
      r.emitted.push_back(sampler.SampleFrom(target.Row(r.emitted[0]), kFirstPosition + 1));
    }
    counts[r.emitted[0] * kVocab + r.emitted[1]]++;
  }
  std::vector<double> expected(kVocab * kVocab);
  for (int a = 0; a < kVocab; ++a) {
    for (int b = 0; b < kVocab; ++b) {
      expected[a * kVocab + b] = target.Row(context)[a] * target.Row(a)[b];
    }
  }
  const double chi2 = ChiSquare(counts, expected, kTrials);
  EXPECT_LT(chi2, 51.2) << "acceptance " << static_cast<double>(accepted_total) / (kTrials * tc.k);

  // How often the first draft is accepted. Deterministic drafter: p(d) under both rules.
  // Sampled drafter: 1 - TV(p, q) under the ratio rule; under the match rule (both race
  // with the same noise) at least (1 - TV) / (1 + TV). 4.5 sigma of slack.
  const auto p0 = target.Row(context);
  const auto q0 = draft.Row(context);
  double tv = 0;
  for (int t = 0; t < kVocab; ++t) tv += 0.5 * std::abs(p0[t] - q0[t]);
  const double rate = static_cast<double>(first_accepted) / kTrials;
  const double want = tc.deterministic_draft ? p0[ArgMax(q0)] : 1.0 - tv;
  const double sigma = std::sqrt(want * (1 - want) / kTrials) + 1e-9;
  if (tc.deterministic_draft || tc.rule == AcceptanceRule::kRatio) {
    EXPECT_NEAR(rate, want, 4.5 * sigma) << "tv " << tv;
  } else {
    EXPECT_GT(rate, (1 - tv) / (1 + tv) - 4.5 * sigma) << "tv " << tv;
    EXPECT_LE(rate, want + 4.5 * sigma) << "tv " << tv;  // no rule beats the ratio rule
  }
}

INSTANTIATE_TEST_SUITE_P(Drafts, AcceptSampledTest,
                         testing::Values(SampledCase{AcceptanceRule::kRatio, 1, 0.0f, false},
                                         SampledCase{AcceptanceRule::kRatio, 2, 3.0f, false},
                                         SampledCase{AcceptanceRule::kRatio, 4, 8.0f, false},
                                         SampledCase{AcceptanceRule::kRatio, 3, 3.0f, true},
                                         SampledCase{AcceptanceRule::kRatio, 2, 0.5f, true},
                                         SampledCase{AcceptanceRule::kMatch, 1, 0.0f, false},
                                         SampledCase{AcceptanceRule::kMatch, 2, 3.0f, false},
                                         SampledCase{AcceptanceRule::kMatch, 4, 8.0f, false},
                                         SampledCase{AcceptanceRule::kMatch, 3, 3.0f, true},
                                         SampledCase{AcceptanceRule::kMatch, 2, 0.5f, true}),
                         CaseName);

// The match rule's defining property: whatever was drafted, the emitted tokens are the
// ones target-only sampling draws at those positions with the same seed.
TEST(AcceptMatchTest, EmitsWhatTargetOnlySamplingDraws) {
  constexpr int kVocab = 6;
  const Chain target = RandomChain(kVocab, 3, 2.0f);
  for (const SampledCase& tc : {SampledCase{AcceptanceRule::kMatch, 4, 1.0f, false},
                                SampledCase{AcceptanceRule::kMatch, 2, 4.0f, true},
                                SampledCase{AcceptanceRule::kMatch, 6, 0.0f, false}}) {
    const Chain draft = RandomChain(kVocab, 71, tc.draft_sharpness);
    for (uint64_t seed = 0; seed < 500; ++seed) {
      Sampler sampler(SamplingParams{1.0f, 0, 1.0f, seed});
      const StepResult r = Step(tc, target, draft, 2, &sampler);
      int prev = 2;
      for (size_t j = 0; j < r.emitted.size(); ++j) {
        const std::vector<float> l = LogitsOf(target.Row(prev));
        ASSERT_EQ(r.emitted[j], sampler.Sample(l, kFirstPosition + static_cast<int64_t>(j)))
            << "seed " << seed << " token " << j;
        prev = r.emitted[j];
      }
    }
  }
}

TEST(AcceptSampledTest, IdenticalDraftIsAlwaysAccepted) {
  constexpr int kVocab = 5;
  const Chain chain = RandomChain(kVocab, 5, 2.0f);
  for (AcceptanceRule rule : {AcceptanceRule::kMatch, AcceptanceRule::kRatio}) {
    for (uint64_t seed = 0; seed < 2000; ++seed) {
      Sampler sampler(SamplingParams{1.0f, 0, 1.0f, seed});
      const StepResult r = Step(SampledCase{rule, 3, 0, false}, chain, chain, 1, &sampler);
      ASSERT_EQ(r.emitted.size(), 4u) << AcceptanceRuleName(rule) << " seed " << seed;
    }
  }
}

TEST(AcceptanceRuleTest, ParsesItsNames) {
  EXPECT_EQ(*ParseAcceptanceRule("match"), AcceptanceRule::kMatch);
  EXPECT_EQ(*ParseAcceptanceRule("ratio"), AcceptanceRule::kRatio);
  const absl::StatusOr<AcceptanceRule> bad = ParseAcceptanceRule("greedy");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("match or ratio"), std::string::npos);
  EXPECT_EQ(AcceptanceRuleName(AcceptanceRule::kRatio), "ratio");
}

// A target that ships each row's largest logits (HeadRows) instead of the rows gives every
// rule the outcome the whole rows give: greedy, match and ratio (with and without a draft
// distribution), with drafts the target likes and drafts it does not, tied logits included.
TEST(AcceptFromHeadTest, TheHeadGivesTheOutcomeOfTheWholeRows) {
  const int vocab = 64, k = 4;
  Rng rng(3);
  std::vector<float> logits((k + 1) * vocab), q(k * vocab);
  for (float temperature : {0.0f, 0.7f, 1.5f}) {
    for (int top_k : {1, 3, 10}) {
      for (float top_p : {1.0f, 0.8f}) {
        for (int trial = 0; trial < 30; ++trial) {
          for (float& l : logits)
            l = static_cast<float>(static_cast<int>(rng.Uniform() * 24)) * 0.5f;
          std::vector<int32_t> drafts(k);
          for (int i = 0; i < k; ++i) {
            // Half the drafts are the row's arg max (accepted often), half anything.
            drafts[i] = trial % 2 == 0 ? ArgMax(std::span(logits).subspan(i * vocab, vocab))
                                       : static_cast<int32_t>(rng.Uniform() * vocab);
          }
          double sum = 0;
          for (float& v : q) sum += v = static_cast<float>(rng.Uniform());
          const SamplingParams params{temperature, top_k, top_p, 77};
          Sampler whole(params);
          const Sampler& head_sampler = whole;
          const int shipped = top_k + 2;
          std::vector<int32_t> ids((k + 1) * shipped);
          std::vector<float> values((k + 1) * shipped);
          for (int r = 0; r <= k; ++r) {
            TopK(std::span(logits).subspan(r * vocab, vocab), shipped, ids.data() + r * shipped,
                 values.data() + r * shipped);
          }
          const HeadRows head{shipped, ids.data(), values.data()};
          std::vector<float> scratch;
          for (AcceptanceRule rule : {AcceptanceRule::kMatch, AcceptanceRule::kRatio}) {
            for (bool with_q : {false, true}) {
              AcceptOutcome expected;
              if (temperature == 0.0f) {
                expected = AcceptGreedy(drafts, logits, vocab);
              } else if (rule == AcceptanceRule::kMatch) {
                expected = AcceptMatch(drafts, logits, vocab, 11, &whole);
              } else {
                std::vector<float> p, dist;
                for (int r = 0; r <= k; ++r) {
                  whole.Distribution(std::span(logits).subspan(r * vocab, vocab), &dist);
                  p.insert(p.end(), dist.begin(), dist.end());
                }
                expected = AcceptRatio(
                    drafts, p, with_q ? std::span<const float>(q) : std::span<const float>(), vocab,
                    11, whole);
              }
              const AcceptOutcome got = AcceptFromHead(
                  drafts, head, 11, with_q ? std::span<const float>(q) : std::span<const float>(),
                  vocab, head_sampler, rule, &scratch);
              ASSERT_EQ(got.accepted, expected.accepted)
                  << "T " << temperature << " k " << top_k << " p " << top_p << " trial " << trial;
              ASSERT_EQ(got.next_token, expected.next_token);
            }
          }
          // No drafts: the row's own draw.
          const AcceptOutcome none = AcceptFromHead({}, head, 5, {}, vocab, head_sampler,
                                                    AcceptanceRule::kRatio, &scratch);
          EXPECT_EQ(none.accepted, 0);
          EXPECT_EQ(none.next_token, whole.Sample(std::span(logits).first(vocab), 5));
        }
      }
    }
  }
}

}  // namespace
}  // namespace specnode
