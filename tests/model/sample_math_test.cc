// The draw arithmetic a device repeats (model/llama/sample_math.h) against glibc and against
// the Sampler that uses it: exp and log within 1 ulp of the C library over their ranges, the
// noise unchanged, and the lane order of the sum the one the device's block folds.
#include "model/llama/sample_math.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "model/llama/sampling.h"

namespace specnode {
namespace {

// Distance in units in the last place between two finite non-negative doubles.
uint64_t Ulps(double a, double b) {
  const uint64_t x = sample::Bits(a), y = sample::Bits(b);
  return x > y ? x - y : y - x;
}

TEST(SampleMath, ExpIsWithinOneUlpOfTheCLibrary) {
  Rng rng(7);
  uint64_t worst = 0, differ = 0;
  constexpr int kDraws = 2'000'000;
  for (int i = 0; i < kDraws; ++i) {
    // The weights' range: (l - max) / T from 0 down to the underflow, denser near 0.
    const double u = rng.Uniform();
    const double x = i % 2 == 0 ? -745.0 * u : -40.0 * u * u;
    const double got = sample::Exp(x), want = std::exp(x);
    if (want < std::numeric_limits<double>::min()) continue;  // subnormal: not compared
    worst = std::max(worst, Ulps(got, want));
    differ += got != want;
  }
  EXPECT_LE(worst, 1u);
  // fdlibm's exp is not correctly rounded: about 1 in 10 results differ from glibc's in the
  // last bit (2^-52 relative, far below the float probabilities' 2^-24 resolution).
  EXPECT_LT(differ, kDraws / 5) << differ << " of " << kDraws << " differ";
}

TEST(SampleMath, ExpEdges) {
  EXPECT_EQ(sample::Exp(0.0), 1.0);
  EXPECT_EQ(sample::Exp(-0.0), 1.0);
  EXPECT_EQ(sample::Exp(-746.0), 0.0);
  EXPECT_EQ(sample::Exp(-std::numeric_limits<double>::infinity()), 0.0);
  EXPECT_EQ(sample::Exp(710.0), std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isnan(sample::Exp(std::nan(""))));
  // Positive arguments and the subnormal results stay close to glibc too.
  for (double x : {1e-300, 0.25, 1.0, 2.5, 100.0, 700.0, 709.7, -708.5, -720.0, -744.0}) {
    const double got = sample::Exp(x), want = std::exp(x);
    EXPECT_NEAR(got, want, std::abs(want) * 4e-16 + 1e-320) << x;
  }
}

TEST(SampleMath, LogIsWithinOneUlpOfTheCLibraryOnTheUniforms) {
  PositionNoise noise(42, 3, NoiseStream::kToken);
  uint64_t worst = 0, differ = 0;
  constexpr int kDraws = 2'000'000;
  for (int i = 0; i < kDraws; ++i) {
    const double u = noise.Uniform(static_cast<uint64_t>(i));
    const double got = -sample::Log(u), want = -std::log(u);
    worst = std::max(worst, Ulps(got, want));
    differ += got != want;
  }
  EXPECT_LE(worst, 1u);
  EXPECT_LT(differ, kDraws / 5) << differ << " of " << kDraws << " differ";
  // The uniforms' extremes, and around sqrt(2) and 1 where the reduction switches.
  for (double u : {0x1.0p-54, 1e-300, 0.5, 0.7071067811865475, 0.7071067811865476, 1.0 - 0x1.0p-54,
                   1.0 + 0x1.0p-52, 1.4142135623730950, 1.4142135623730951, 3.0, 1e300}) {
    EXPECT_LE(Ulps(std::abs(sample::Log(u)), std::abs(std::log(u))), 1u) << u;
  }
  EXPECT_EQ(sample::Log(1.0), 0.0);
}

TEST(SampleMath, NoiseIsTheSplitMixCellCentre) {
  // The formula the goldens were drawn with: PositionNoise::Uniform == NoiseUniform(key).
  PositionNoise noise(1234, 56, NoiseStream::kAccept);
  for (uint64_t i : {0ull, 1ull, 49151ull, 151935ull}) {
    EXPECT_EQ(noise.Uniform(i), sample::NoiseUniform(noise.key(), i));
    const double u = noise.Uniform(i);
    EXPECT_GT(u, 0.0);
    EXPECT_LT(u, 1.0);
  }
}

TEST(SampleMath, FoldLanesSumsInTheBlockOrder) {
  // Lanes folded 512, 256, ..., 1 apart: lane 0 + lane 512 first, and so on. A reference
  // spelled as the recursion on halves gives the same bits.
  std::vector<double> lanes(sample::kSumLanes);
  Rng rng(3);
  for (double& v : lanes) v = rng.Uniform() * std::pow(2.0, -60.0 * rng.Uniform());
  auto halves = [&](auto&& self, std::vector<double> v) -> double {
    if (v.size() == 1) return v[0];
    const size_t h = v.size() / 2;
    std::vector<double> next(h);
    for (size_t j = 0; j < h; ++j) next[j] = v[j] + v[j + h];
    return self(self, next);
  };
  const double want = halves(halves, lanes);
  EXPECT_EQ(sample::FoldLanes(lanes.data()), want);
}

// Top-p's cut: the shortest prefix whose weights, added in order, reach top_p * sum.
TEST(SampleMath, NucleusCutKeepsTheShortestPrefixReachingTopP) {
  const double w[4] = {4.0, 3.0, 2.0, 1.0};
  double kept = 0.0;
  EXPECT_EQ(sample::NucleusCut(w, 4, 0.5f, 10.0, &kept), 2);  // 4 < 5 <= 7
  EXPECT_EQ(kept, 7.0);
  EXPECT_EQ(sample::NucleusCut(w, 4, 0.25f, 10.0, &kept), 1);  // 4 >= 2.5
  EXPECT_EQ(kept, 4.0);
  EXPECT_EQ(sample::NucleusCut(w, 4, 0.75f, 10.0, &kept), 3);  // 7 < 7.5 <= 9
  EXPECT_EQ(kept, 9.0);
  EXPECT_EQ(sample::NucleusCut(w, 4, 0.7f, 10.0, &kept), 2);  // 0.7f is a bit below 0.7
  // A head of a larger row (sum 20) that does not reach the cut: 0, with the head's sum.
  EXPECT_EQ(sample::NucleusCut(w, 4, 0.9f, 20.0, &kept), 0);
  EXPECT_EQ(kept, 10.0);
  // The threshold is top_p widened from float, times the sum: 0.1f is a bit above 0.1.
  const double tenths[2] = {1.0, 9.0};
  EXPECT_EQ(sample::NucleusCut(tenths, 2, 0.1f, 10.0, &kept), 2);
}

}  // namespace
}  // namespace specnode
