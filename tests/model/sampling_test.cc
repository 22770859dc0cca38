#include "model/llama/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace specnode {
namespace {

TEST(Sampling, ValidationNamesTheParameter) {
  SamplingParams p;
  p.temperature = -1;
  EXPECT_NE(ValidateSamplingParams(p).message().find("temperature"), std::string::npos);
  p = {};
  p.temperature = NAN;
  EXPECT_FALSE(ValidateSamplingParams(p).ok());
  p = {};
  p.top_p = 0.0f;
  EXPECT_NE(ValidateSamplingParams(p).message().find("top_p"), std::string::npos);
  p = {};
  p.top_p = 1.5f;
  EXPECT_FALSE(ValidateSamplingParams(p).ok());
  p = {};
  p.top_k = -2;
  EXPECT_NE(ValidateSamplingParams(p).message().find("top_k"), std::string::npos);
  EXPECT_TRUE(ValidateSamplingParams(SamplingParams{}).ok());
}

TEST(Sampling, GreedyTakesArgmaxLowestIdOnTies) {
  Sampler s(SamplingParams{});
  std::vector<float> logits = {0.1f, 3.0f, -2.0f, 3.0f};
  EXPECT_EQ(s.Sample(logits, 0), 1);
  std::vector<float> probs;
  s.Distribution(logits, &probs);
  EXPECT_EQ(probs, (std::vector<float>{0, 1, 0, 0}));
}

TEST(Sampling, SameSeedSamePositionSameToken) {
  SamplingParams p{0.9f, 0, 1.0f, 42};
  Sampler a(p), b(p);
  std::vector<float> logits = {0.5f, 0.2f, 0.1f, 0.0f, -0.3f};
  for (int i = 0; i < 100; ++i) EXPECT_EQ(a.Sample(logits, i), b.Sample(logits, i));
  // No state: the order of the calls does not matter, only the position.
  std::vector<int32_t> forward, backward(100);
  for (int i = 0; i < 100; ++i) forward.push_back(a.Sample(logits, i));
  for (int i = 99; i >= 0; --i) backward[i] = b.Sample(logits, i);
  EXPECT_EQ(forward, backward);
  // Another seed gives another sequence.
  Sampler c(SamplingParams{0.9f, 0, 1.0f, 43});
  int differ = 0;
  for (int i = 0; i < 100; ++i) differ += c.Sample(logits, i) != forward[i];
  EXPECT_GT(differ, 20);
  Rng r(7);
  // Pin the generators: they define reproducibility across builds.
  const uint64_t first = r.Next();
  Rng r2(7);
  EXPECT_EQ(first, r2.Next());
  EXPECT_NE(Rng(8).Next(), first);
  EXPECT_EQ(PositionNoise(7, 3, NoiseStream::kToken).Uniform(5),
            PositionNoise(7, 3, NoiseStream::kToken).Uniform(5));
}

// The noise of different seeds, positions, streams and indexes is independent: each
// uniform's mean and the correlation of neighbours over many keys (a broken mix — say,
// position and stream colliding — shows up as equal values or a correlation near 1).
TEST(Sampling, PositionNoiseIsUniformAndUncorrelated) {
  const int n = 20000;
  double sum = 0, sum_sq = 0;
  double corr_pos = 0, corr_stream = 0, corr_seed = 0, corr_index = 0;
  for (int i = 0; i < n; ++i) {
    const double u = PositionNoise(11, i, NoiseStream::kToken).Uniform(3);
    ASSERT_GT(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
    sum_sq += u * u;
    corr_pos += (u - 0.5) * (PositionNoise(11, i + 1, NoiseStream::kToken).Uniform(3) - 0.5);
    corr_stream += (u - 0.5) * (PositionNoise(11, i, NoiseStream::kAccept).Uniform(3) - 0.5);
    corr_seed += (u - 0.5) * (PositionNoise(12, i, NoiseStream::kToken).Uniform(3) - 0.5);
    corr_index += (u - 0.5) * (PositionNoise(11, i, NoiseStream::kToken).Uniform(4) - 0.5);
  }
  // Mean 1/2 and variance 1/12; 12 * E[(u-1/2)(v-1/2)] is the correlation, whose standard
  // error over n pairs is 1/sqrt(n) ~ 0.007: 0.04 is ~6 sigma.
  EXPECT_NEAR(sum / n, 0.5, 0.01);
  EXPECT_NEAR(sum_sq / n - (sum / n) * (sum / n), 1.0 / 12, 0.003);
  for (double c : {corr_pos, corr_stream, corr_seed, corr_index})
    EXPECT_LT(std::abs(12 * c / n), 0.04);
}

// The race picks t with probability p_t / sum(p), over positions (each position one
// draw): chi-square with 4 bins, critical value at 0.999 for 3 degrees of freedom = 16.27.
TEST(Sampling, RaceOverPositionsFollowsTheDistribution) {
  for (const std::vector<float>& probs :
       {std::vector<float>{0.1f, 0.2f, 0.3f, 0.4f}, std::vector<float>{0.97f, 0.01f, 0.01f, 0.01f},
        std::vector<float>{2.0f, 0.0f, 1.0f, 1.0f}}) {
    const int n = 20000;
    std::vector<int> counts(4, 0);
    for (int i = 0; i < n; ++i) counts[RaceDraw(probs, PositionNoise(5, i, NoiseStream::kToken))]++;
    double total = 0;
    for (float p : probs) total += p;
    double chi2 = 0;
    int bins = 0;
    for (int i = 0; i < 4; ++i) {
      const double e = n * probs[i] / total;
      if (e == 0) {
        EXPECT_EQ(counts[i], 0);
        continue;
      }
      chi2 += (counts[i] - e) * (counts[i] - e) / e;
      ++bins;
    }
    EXPECT_LT(chi2, bins == 4 ? 16.27 : 13.82) << "probs[0] " << probs[0];
  }
}

// The skip of RaceInOrder (no logarithm where 1 - u already loses) changes nothing: the
// winner equals a plain argmin of -ln(u_t) / p_t over many positions and a wide vocabulary.
TEST(Sampling, RaceEqualsPlainArgmin) {
  Rng gen(9);
  std::vector<float> probs(3000);
  for (float& p : probs) p = static_cast<float>(std::pow(gen.Uniform(), 6.0));
  probs[17] = 0.0f;
  for (int pos = 0; pos < 300; ++pos) {
    const PositionNoise noise(21, pos, NoiseStream::kToken);
    double best = INFINITY;
    int32_t want = -1;
    for (size_t t = 0; t < probs.size(); ++t) {
      if (!(probs[t] > 0)) continue;
      const double e = -std::log(noise.Uniform(t)) / probs[t];
      if (e < best) best = e, want = static_cast<int32_t>(t);
    }
    ASSERT_EQ(RaceDraw(probs, noise), want) << "position " << pos;
  }
}

TEST(Sampling, TopKKeepsOnlyKMostLikely) {
  SamplingParams p{1.0f, 2, 1.0f, 1};
  Sampler s(p);
  std::vector<float> logits = {1.0f, 5.0f, 4.0f, 0.0f};
  std::vector<float> probs;
  s.Distribution(logits, &probs);
  EXPECT_EQ(probs[0], 0.0f);
  EXPECT_EQ(probs[3], 0.0f);
  EXPECT_NEAR(probs[1], 1.0 / (1.0 + std::exp(-1.0)), 1e-6);
  for (int i = 0; i < 200; ++i) {
    int32_t t = s.Sample(logits, i);
    EXPECT_TRUE(t == 1 || t == 2);
  }
}

TEST(Sampling, TopPKeepsSmallestPrefixReachingP) {
  // Probabilities 0.5, 0.3, 0.2 (temperature 1): top_p 0.7 keeps {0, 1}.
  std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  Sampler s(SamplingParams{1.0f, 0, 0.7f, 3});
  std::vector<float> probs;
  s.Distribution(logits, &probs);
  EXPECT_NEAR(probs[0], 0.5 / 0.8, 1e-5);
  EXPECT_NEAR(probs[1], 0.3 / 0.8, 1e-5);
  EXPECT_EQ(probs[2], 0.0f);
  // top_p smaller than the top token's mass keeps exactly one token.
  Sampler one(SamplingParams{1.0f, 0, 0.1f, 3});
  one.Distribution(logits, &probs);
  EXPECT_EQ(probs, (std::vector<float>{1.0f, 0.0f, 0.0f}));
}

TEST(Sampling, TemperatureSharpensAndFlattens) {
  std::vector<float> logits = {1.0f, 0.0f};
  std::vector<float> cold, hot;
  Sampler(SamplingParams{0.5f, 0, 1.0f, 0}).Distribution(logits, &cold);
  Sampler(SamplingParams{2.0f, 0, 1.0f, 0}).Distribution(logits, &hot);
  EXPECT_NEAR(cold[0], 1 / (1 + std::exp(-2.0)), 1e-6);
  EXPECT_NEAR(hot[0], 1 / (1 + std::exp(-0.5)), 1e-6);
}

TEST(Sampling, EmpiricalFrequenciesMatchDistribution) {
  // Chi-square goodness of fit over 20000 draws, 3 degrees of freedom: the 0.999 quantile
  // is 16.27, so a correct sampler fails this with probability 0.001 for a given seed;
  // the seed is fixed, so the test is deterministic.
  std::vector<float> logits = {0.0f, 1.0f, 2.0f, 0.5f};
  Sampler s(SamplingParams{1.0f, 0, 1.0f, 2024});
  std::vector<float> probs;
  s.Distribution(logits, &probs);
  const int n = 20000;
  std::vector<int> counts(4, 0);
  for (int i = 0; i < n; ++i) counts[s.Sample(logits, i)]++;
  double chi2 = 0;
  for (int i = 0; i < 4; ++i) {
    const double e = n * probs[i];
    chi2 += (counts[i] - e) * (counts[i] - e) / e;
  }
  EXPECT_LT(chi2, 16.27);
}

TEST(Sampling, SampleFromIgnoresZeroEntries) {
  Sampler s(SamplingParams{1.0f, 0, 1.0f, 5});
  std::vector<float> probs = {0.0f, 0.0f, 2.0f, 0.0f};
  for (int i = 0; i < 50; ++i) EXPECT_EQ(s.SampleFrom(probs, i), 2);
}

// Without top-k / top-p the whole vocabulary is kept (a path with no id list): the
// distribution is softmax(logits / T), and top_k >= vocab is the same thing exactly.
TEST(Sampling, UnprunedDistributionIsTheSoftmax) {
  Rng gen(3);
  std::vector<float> logits(3000);
  for (float& l : logits) l = static_cast<float>(gen.Uniform() * 20.0 - 10.0);
  for (float temperature : {0.5f, 1.0f, 3.0f}) {
    std::vector<float> probs, probs_k;
    Sampler(SamplingParams{temperature, 0, 1.0f, 1}).Distribution(logits, &probs);
    Sampler(SamplingParams{temperature, 3000, 1.0f, 1}).Distribution(logits, &probs_k);
    EXPECT_EQ(probs, probs_k);
    double max_l = logits[0], sum = 0.0;
    for (float l : logits) max_l = std::max<double>(max_l, l);
    for (float l : logits) sum += std::exp((l - max_l) / temperature);
    for (size_t i = 0; i < logits.size(); ++i) {
      const double want = std::exp((logits[i] - max_l) / temperature) / sum;
      ASSERT_NEAR(probs[i], want, 1e-6 * want + 1e-12) << "id " << i << " T " << temperature;
    }
  }
}

// Sample's sparse top-k path draws exactly what SampleFrom(Distribution(...)) draws, seed
// for seed, over top-k / top-p / temperature settings and logits with many ties.
TEST(Sampling, SampleEqualsSampleFromDistribution) {
  Rng gen(7);
  for (int top_k : {0, 1, 5, 40, 1000}) {
    for (float top_p : {0.5f, 0.9f, 1.0f}) {
      for (float temperature : {0.3f, 1.0f, 2.5f}) {
        std::vector<float> logits(500);
        // Coarse values (multiples of 0.25): plenty of exact ties across the top-k border.
        for (float& l : logits) l = static_cast<float>(static_cast<int>(gen.Uniform() * 40)) * 0.25f;
        const SamplingParams params{temperature, top_k, top_p, 99};
        Sampler fast(params), dense(params);
        std::vector<float> probs;
        if (top_k > 0 && top_p == 1.0f) {
          // The kept set is the top k by (logit desc, id asc), ties at the border included
          // by id exactly as a full sort would.
          std::vector<int32_t> order(logits.size());
          for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
          std::stable_sort(order.begin(), order.end(),
                           [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
          dense.Distribution(logits, &probs);
          const size_t k = std::min<size_t>(top_k, logits.size());
          for (size_t r = 0; r < order.size(); ++r) {
            EXPECT_EQ(probs[order[r]] > 0.0f, r < k) << "rank " << r << " id " << order[r];
          }
        }
        for (int draw = 0; draw < 200; ++draw) {
          dense.Distribution(logits, &probs);
          ASSERT_EQ(fast.Sample(logits, draw), dense.SampleFrom(probs, draw))
              << "top_k " << top_k << " top_p " << top_p << " T " << temperature << " draw "
              << draw;
        }
      }
    }
  }
}

// A device head ships a row's TopK candidates instead of the row (Sampler::HeadCandidates):
// drawing from them must give exactly the token and distribution the whole row gives, for
// every parameter that prunes by top-k, with ties (quarter-step logits), +0 and -0.
TEST(Sampling, TopKCandidatesDrawExactlyWhatTheWholeRowDraws) {
  Rng gen(7);
  const int vocab = 300;
  std::vector<float> logits(vocab);
  for (float temperature : {0.0f, 0.3f, 1.0f, 2.5f}) {
    for (int top_k : {0, 1, 2, 7, 40, 299, 300, 1000}) {
      for (float top_p : {1.0f, 0.9f, 0.3f}) {
        for (int trial = 0; trial < 4; ++trial) {
          for (float& l : logits) {
            l = static_cast<float>(static_cast<int>(gen.Uniform() * 40) - 20) * 0.25f;
          }
          logits[5] = 0.0f;
          logits[6] = -0.0f;
          const SamplingParams params{temperature, top_k, top_p, 1234};
          Sampler s(params);
          const int n = s.HeadCandidates(vocab);
          if (temperature == 0.0f) {
            EXPECT_EQ(n, 1);
          } else {
            EXPECT_EQ(n, top_k > 0 && top_k < vocab ? top_k : 0) << top_k;
          }
          if (n == 0) continue;
          // A pass ships the largest HeadCandidates of its rows: more than this row needs.
          const int shipped = std::min(vocab, n + 3);
          std::vector<int32_t> ids(shipped);
          std::vector<float> values(shipped);
          TopK(logits, shipped, ids.data(), values.data());
          std::vector<float> whole, from_top;
          s.Distribution(logits, &whole);
          s.DistributionTopK(ids, values, vocab, &from_top);
          ASSERT_EQ(whole, from_top) << "T " << temperature << " k " << top_k << " p " << top_p;
          for (int64_t position = 0; position < 50; ++position) {
            ASSERT_EQ(s.Sample(logits, position), s.SampleTopK(ids, values, position))
                << "T " << temperature << " k " << top_k << " p " << top_p << " at " << position;
          }
        }
      }
    }
  }
}

TEST(Sampling, TopKOrdersByLogitThenLowerIdAndTreatsSignedZerosAlike) {
  const std::vector<float> logits = {1.0f, -0.0f, 3.0f, 0.0f, 3.0f, -1.0f};
  int32_t ids[5];
  float values[5];
  TopK(logits, 5, ids, values);
  EXPECT_EQ(std::vector<int32_t>(ids, ids + 5), (std::vector<int32_t>{2, 4, 0, 1, 3}));
  EXPECT_EQ(values[0], 3.0f);
  EXPECT_EQ(values[4], 0.0f);
  TopK(logits, 1, ids, values);
  EXPECT_EQ(ids[0], ArgMax(logits));
}

// The one-scan TopK (k <= kScanTopK) and the partial sort (beyond) give the comparator's
// order exactly, over rows with many ties (logits on a coarse grid).
TEST(Sampling, TopKScanEqualsTheSortedOrderWithTies) {
  std::mt19937 rng(7);
  for (int vocab : {1, 5, 64, 1000, 49152}) {
    std::vector<float> logits(vocab);
    for (float& x : logits) x = static_cast<float>(static_cast<int>(rng() % 41) - 20) * 0.5f;
    std::vector<int32_t> order(vocab);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
    for (int k : {1, 2, 8, kScanTopK, kScanTopK + 1, 200}) {
      if (k > vocab) continue;
      std::vector<int32_t> ids(k);
      std::vector<float> values(k);
      TopK(logits, k, ids.data(), values.data());
      ASSERT_EQ(ids, std::vector<int32_t>(order.begin(), order.begin() + k))
          << "vocab " << vocab << " k " << k;
      for (int i = 0; i < k; ++i) ASSERT_EQ(values[i], logits[ids[i]]);
    }
  }
}

// Samplers that prune nothing draw from DrawAt's parameters alone (a device's draw head):
// DrawRows gives Sample's token for greedy and sampled rows, over vocabularies around the
// sum's lane count, and flags rows that are not finite.
TEST(Sampling, DrawRowsDrawWhatSampleDraws) {
  Rng gen(11);
  for (int64_t vocab : {1, 7, 1023, 1024, 1025, 5000, 49152}) {
    for (float temperature : {0.0f, 0.05f, 0.7f, 1.0f, 2.5f}) {
      for (float top_p : {1.0f, 0.95f, 0.5f}) {
        const SamplingParams params{temperature, 0, top_p, 1234 + static_cast<uint64_t>(vocab)};
        Sampler sampler(params);
        ASSERT_TRUE(sampler.DrawsWithParams(vocab));
        constexpr int kRows = 6;
        std::vector<float> logits(static_cast<size_t>(kRows * vocab));
        for (float& l : logits) l = static_cast<float>(gen.Uniform() * 12.0 - 6.0);
        std::vector<sample::DrawParams> draws;
        for (int r = 0; r < kRows; ++r) draws.push_back(sampler.DrawAt(100 + r));
        std::vector<int32_t> ids(kRows);
        DrawRows(logits.data(), kRows, vocab, draws.data(), ids.data());
        for (int r = 0; r < kRows; ++r) {
          const std::span<const float> row(logits.data() + r * vocab, static_cast<size_t>(vocab));
          EXPECT_EQ(ids[r], sampler.Sample(row, 100 + r))
              << "vocab " << vocab << " T " << temperature << " top_p " << top_p << " row " << r;
        }
      }
    }
  }
  std::vector<float> bad = {0.0f, std::numeric_limits<float>::infinity(), 1.0f, 2.0f};
  const sample::DrawParams d[2] = {{5, 1.0f}, {5, 0.0f}};
  int32_t ids[2];
  DrawRows(bad.data(), 2, 2, d, ids);
  EXPECT_EQ(ids[0], -1);
  EXPECT_EQ(ids[1], 1);
}

TEST(Sampling, SamplersWithoutTopKDrawWithParams) {
  EXPECT_TRUE(Sampler({0.0f, 40, 0.9f, 1}).DrawsWithParams(100));  // greedy ignores the rest
  EXPECT_TRUE(Sampler({1.0f, 0, 1.0f, 1}).DrawsWithParams(100));
  EXPECT_TRUE(Sampler({1.0f, 100, 1.0f, 1}).DrawsWithParams(100));  // k >= vocab prunes nothing
  EXPECT_TRUE(Sampler({1.0f, 0, 0.9f, 1}).DrawsWithParams(100));    // top-p alone
  EXPECT_FALSE(Sampler({1.0f, 40, 1.0f, 1}).DrawsWithParams(100));
  EXPECT_FALSE(Sampler({1.0f, 40, 0.9f, 1}).DrawsWithParams(100));
  const sample::DrawParams greedy = Sampler({0.0f, 0, 0.9f, 9}).DrawAt(3);
  EXPECT_EQ(greedy.inv_t, 0.0f);
  EXPECT_EQ(greedy.top_p, 1.0f);
  const sample::DrawParams hot = Sampler({0.5f, 0, 0.8f, 9}).DrawAt(3);
  EXPECT_EQ(hot.inv_t, 2.0f);
  EXPECT_EQ(hot.top_p, 0.8f);
  EXPECT_EQ(hot.key, PositionNoise(9, 3, NoiseStream::kToken).key());
}

// The device's draw kernel (cuda/cuda_sample.cu) in its order on the host: kSumLanes
// threads, thread t taking ids t, t + kSumLanes, ...; each sums its lane and runs its own
// race (its own best, so its skips differ from the sequential race's), then the block keeps
// the smallest (entry, id). It must find the sequential draw's token: the skip never drops a
// possible winner, whatever order the entries come in.
int32_t BlockOrderDraw(std::span<const float> row, sample::DrawParams d) {
  constexpr int kThreads = sample::kSumLanes;
  float max_logit = row[0];
  for (float l : row) max_logit = std::max(max_logit, l);
  double lanes[kThreads] = {};
  for (int t = 0; t < kThreads; ++t) {
    for (size_t i = t; i < row.size(); i += kThreads) {
      lanes[t] = sample::Add(lanes[t], sample::LogitWeight(row[i], max_logit, d.inv_t));
    }
  }
  const double sum = sample::FoldLanes(lanes);
  double best = std::numeric_limits<double>::infinity();
  int32_t winner = -1;
  for (int t = 0; t < kThreads; ++t) {
    double mine = std::numeric_limits<double>::infinity();
    int32_t mine_id = -1;
    for (size_t i = t; i < row.size(); i += kThreads) {
      const double p = static_cast<float>(sample::LogitWeight(row[i], max_logit, d.inv_t) / sum);
      if (!(p > 0.0)) continue;
      const double u = sample::NoiseUniform(d.key, i);
      if (sample::RaceSkip(u, p, mine)) continue;
      const double e = sample::RaceEntry(u, p);
      if (e < mine) {
        mine = e;
        mine_id = static_cast<int32_t>(i);
      }
    }
    if (mine_id >= 0 && (mine < best || (mine == best && mine_id < winner))) {
      best = mine;
      winner = mine_id;
    }
  }
  return winner >= 0 ? winner : 0;
}

TEST(Sampling, TheDrawKernelsOrderFindsTheSequentialToken) {
  Rng gen(5);
  int differ_from_argmax = 0;
  for (int64_t vocab : {3, 1024, 3000, 49152}) {
    for (float temperature : {0.02f, 0.3f, 1.0f, 4.0f}) {
      Sampler sampler({temperature, 0, 1.0f, 77});
      std::vector<float> row(static_cast<size_t>(vocab));
      for (int trial = 0; trial < 8; ++trial) {
        // Quarter steps: ties in the weights, and so in the race's entries' inputs.
        for (float& l : row) l = static_cast<float>(static_cast<int>(gen.Uniform() * 48)) * 0.25f;
        const sample::DrawParams d = sampler.DrawAt(trial);
        int32_t want = 0;
        DrawRows(row.data(), 1, vocab, &d, &want);
        EXPECT_EQ(BlockOrderDraw(row, d), want)
            << "vocab " << vocab << " T " << temperature << " trial " << trial;
        differ_from_argmax += want != ArgMax(row);
      }
    }
  }
  EXPECT_GT(differ_from_argmax, 0);  // the draws are not all the arg max
}

// The device's top-p draw (cuda/cuda_sample.cu) in its order on the host: the whole row's
// lane sum as above, the row's head of sample::kNucleusHead sorted (the top-k kernel's),
// thread 0's cut over the head's weights, then one thread per kept entry racing it and the
// block's smallest (entry, id). -2 when the nucleus is wider than the head (the host draws
// that row).
int32_t BlockOrderNucleusDraw(std::span<const float> row, sample::DrawParams d) {
  const int64_t vocab = static_cast<int64_t>(row.size());
  const int k = static_cast<int>(std::min<int64_t>(sample::kNucleusHead, vocab));
  std::vector<int32_t> ids(k);
  std::vector<float> values(k);
  TopK(row, k, ids.data(), values.data());
  const float max_logit = values[0];
  double lanes[sample::kSumLanes] = {};
  for (size_t i = 0; i < row.size(); ++i) {
    lanes[i % sample::kSumLanes] =
        sample::Add(lanes[i % sample::kSumLanes], sample::LogitWeight(row[i], max_logit, d.inv_t));
  }
  const double sum = sample::FoldLanes(lanes);
  std::vector<double> w(k);
  for (int j = 0; j < k; ++j) w[j] = sample::LogitWeight(values[j], max_logit, d.inv_t);
  double kept_sum = 0.0;
  int keep = sample::NucleusCut(w.data(), k, d.top_p, sum, &kept_sum);
  if (keep == 0 && k < vocab) return -2;
  if (keep == 0) keep = k;
  double best = std::numeric_limits<double>::infinity();
  int32_t winner = -1;
  for (int j = 0; j < keep; ++j) {  // thread j, each with one entry: no skips
    const double p = static_cast<float>(sample::Div(w[j], kept_sum));
    if (!(p > 0.0)) continue;
    const double e = sample::RaceEntry(sample::NoiseUniform(d.key, ids[j]), p);
    if (e < best || (e == best && ids[j] < winner)) {
      best = e;
      winner = ids[j];
    }
  }
  return winner >= 0 ? winner : 0;
}

TEST(Sampling, TheNucleusKernelsOrderFindsTheSequentialToken) {
  Rng gen(9);
  int on_device = 0, on_host = 0, differ_from_argmax = 0;
  for (int64_t vocab : {3, 1000, 1024, 3000, 49152}) {
    for (float temperature : {0.05f, 0.5f, 1.0f, 3.0f}) {
      for (float top_p : {0.3f, 0.9f, 0.99f}) {
        Sampler sampler({temperature, 0, top_p, 31});
        std::vector<float> row(static_cast<size_t>(vocab));
        for (int trial = 0; trial < 4; ++trial) {
          // Quarter steps: ties in the weights, across the cut too.
          for (float& l : row) l = static_cast<float>(static_cast<int>(gen.Uniform() * 48)) * 0.25f;
          const sample::DrawParams d = sampler.DrawAt(trial);
          int32_t want = 0;
          DrawRows(row.data(), 1, vocab, &d, &want);
          ASSERT_EQ(want, sampler.Sample(row, trial));
          const int32_t got = BlockOrderNucleusDraw(row, d);
          if (got == -2) {
            ++on_host;
            continue;
          }
          ++on_device;
          EXPECT_EQ(got, want) << "vocab " << vocab << " T " << temperature << " top_p " << top_p
                               << " trial " << trial;
          differ_from_argmax += want != ArgMax(row);
        }
      }
    }
  }
  // Both outcomes occur: nuclei inside the head, and flat rows wider than it.
  EXPECT_GT(on_device, 100);
  EXPECT_GT(on_host, 0);
  EXPECT_GT(differ_from_argmax, 0);
}

}  // namespace
}  // namespace specnode
