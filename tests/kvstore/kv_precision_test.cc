#include "kvstore/kv_precision.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"

namespace specnode {
namespace {

using Param = std::tuple<KvPrecision, int, float>;  // class, head_dim, value scale

class KvPrecisionTest : public ::testing::TestWithParam<Param> {};

TEST_P(KvPrecisionTest, RoundTripWithinStatedBound) {
  const auto [prec, hd, scale] = GetParam();
  std::mt19937 gen(hd * 7 + static_cast<int>(prec));
  std::normal_distribution<float> dist(0.3f, scale);
  std::vector<uint8_t> row(KvRowBytes(prec, hd) + 3);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<float> x(hd), y(hd);
    for (float& v : x) v = dist(gen);
    if (trial == 0) std::fill(x.begin(), x.end(), 0.0f);         // all zero
    if (trial == 1) std::fill(x.begin(), x.end(), -scale);      // constant
    // Unaligned rows must work (pages pack rows of odd sizes).
    uint8_t* r = row.data() + (trial % 3);
    KvEncodeRow(prec, x.data(), hd, r);
    KvDecodeRow(prec, r, hd, y.data());
    const double lo = *std::min_element(x.begin(), x.end());
    const double hi = *std::max_element(x.begin(), x.end());
    const double bound = KvMaxAbsError(prec, lo, hi);
    for (int i = 0; i < hd; ++i) {
      ASSERT_LE(std::abs(double(y[i]) - x[i]), bound)
          << KvPrecisionName(prec) << " hd=" << hd << " i=" << i << " x=" << x[i];
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Classes, KvPrecisionTest,
    ::testing::Combine(::testing::Values(KvPrecision::kFull, KvPrecision::kInt8, KvPrecision::kInt4,
                                         KvPrecision::kInt2),
                       ::testing::Values(2, 6, 64, 128, 256),
                       ::testing::Values(0.01f, 1.0f, 40.0f)));

TEST(KvPrecision, RowBytesAndOrdering) {
  EXPECT_EQ(KvRowBytes(KvPrecision::kFull, 64), 128u);
  EXPECT_EQ(KvRowBytes(KvPrecision::kInt8, 64), 68u);
  EXPECT_EQ(KvRowBytes(KvPrecision::kInt4, 64), 36u);
  EXPECT_EQ(KvRowBytes(KvPrecision::kInt2, 64), 20u);
  EXPECT_EQ(KvRowBytes(KvPrecision::kInt2, 6), 6u);  // 4 + ceil(6 / 4)
  EXPECT_EQ(KvPrecisionName(KvPrecision::kInt4), "int4");
  EXPECT_EQ(KvPrecisionName(KvPrecision::kInt2), "int2");
}

// Squared error of a row stored in class p.
double StoredError(KvPrecision p, const std::vector<float>& x) {
  const int hd = static_cast<int>(x.size());
  std::vector<uint8_t> row(KvRowBytes(p, hd));
  std::vector<float> y(hd);
  KvEncodeRow(p, x.data(), hd, row.data());
  KvDecodeRow(p, row.data(), hd, y.data());
  double e = 0.0;
  for (int i = 0; i < hd; ++i) e += (double(y[i]) - x[i]) * (double(y[i]) - x[i]);
  return e;
}

// The cold tier chooses its spacing: on Gaussian rows (what rotation makes of K and V) its
// error is well below that of four levels spanning the row's extremes, and within 10% of
// the best uniform 4-level quantiser's (~0.119 sigma^2 per value for a Gaussian).
TEST(KvPrecision, Int2SpacingBeatsMinMaxLevels) {
  std::mt19937 gen(3);
  std::normal_distribution<float> dist(0.5f, 2.0f);
  double int2 = 0.0, minmax = 0.0, var = 0.0;
  const int hd = 64;
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> x(hd);
    for (float& v : x) v = dist(gen);
    int2 += StoredError(KvPrecision::kInt2, x);
    const float lo = *std::min_element(x.begin(), x.end());
    const float hi = *std::max_element(x.begin(), x.end());
    const float step = (hi - lo) / 3.0f;
    double mean = 0.0;
    for (float v : x) mean += v / hd;
    for (float v : x) {
      const float y = lo + step * std::nearbyint((v - lo) / step);
      minmax += (double(y) - v) * (double(y) - v);
      var += (v - mean) * (v - mean);
    }
  }
  EXPECT_LT(int2, 0.75 * minmax);
  EXPECT_LT(int2, 1.10 * 0.1188 * var);
  // And the ordering of the classes by error holds.
  std::vector<float> x(hd);
  for (float& v : x) v = dist(gen);
  EXPECT_LT(StoredError(KvPrecision::kInt4, x), StoredError(KvPrecision::kInt2, x));
}

TEST(KvPrecision, Int2UsesAllFourLevelsInValueOrder) {
  // Values at the four levels of a row whose mean and spread put them on a grid.
  std::vector<float> x(32), y(32);
  for (int i = 0; i < 32; ++i) x[i] = static_cast<float>(i % 4) - 1.5f;
  std::vector<uint8_t> row(KvRowBytes(KvPrecision::kInt2, 32));
  KvEncodeRow(KvPrecision::kInt2, x.data(), 32, row.data());
  KvDecodeRow(KvPrecision::kInt2, row.data(), 32, y.data());
  for (int i = 0; i < 32; ++i) EXPECT_NEAR(y[i], x[i], 0.1f) << i;
  EXPECT_EQ(row[4], 0b11100100);  // codes 0, 1, 2, 3 of values 0..3
}

TEST(KvPrecision, Int4UsesAllSixteenLevels) {
  std::vector<float> x(32), y(32);
  for (int i = 0; i < 32; ++i) x[i] = static_cast<float>(i % 16);
  std::vector<uint8_t> row(KvRowBytes(KvPrecision::kInt4, 32));
  KvEncodeRow(KvPrecision::kInt4, x.data(), 32, row.data());
  KvDecodeRow(KvPrecision::kInt4, row.data(), 32, y.data());
  for (int i = 0; i < 32; ++i) EXPECT_FLOAT_EQ(y[i], x[i]);
}

}  // namespace
// The SIMD stages of HadamardInPlace against the plain butterflies (HadamardInPlaceScalar),
// bit for bit: every
// power of two up to 512, ordinary values, outliers, signed zeros, infinities and NaN.
TEST(HadamardTest, InPlaceEqualsScalarButterfliesBitForBit) {
  std::mt19937 gen(5);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  for (int n = 1; n <= 512; n *= 2) {
    for (int variant = 0; variant < 4; ++variant) {
      std::vector<float> x(n);
      for (float& v : x) v = dist(gen);
      if (variant == 1) x[n / 2] = 1e30f;
      if (variant == 2) std::fill(x.begin(), x.end(), -0.0f);
      if (variant == 3 && n >= 2) {
        x[0] = INFINITY;
        x[n - 1] = NAN;
      }
      std::vector<float> want = x;
      HadamardInPlaceScalar(want.data(), n);
      HadamardInPlace(x.data(), n);
      ASSERT_EQ(0, std::memcmp(x.data(), want.data(), n * sizeof(float)))
          << "n=" << n << " variant " << variant;
    }
  }
}

}  // namespace specnode
