#include "kvstore/kv_byte_budget.h"

#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace specnode {
namespace {

// SmolLM2's slot bytes per class (30 layers x 3 kv heads x K and V rows of 64).
const std::array<int64_t, kNumKvPrecisions> kSlot = {23040, 12240, 6480, 3600};

int64_t Bytes(const std::vector<KvPrecision>& c) {
  int64_t b = 0;
  for (KvPrecision p : c) b += kSlot[static_cast<int>(p)];
  return b;
}

double Error(std::span<const BudgetToken> t, const std::vector<KvPrecision>& c) {
  double e = 0.0;
  for (size_t i = 0; i < t.size(); ++i) e += t[i].mass * kClassError[static_cast<int>(c[i])];
  return e;
}

TEST(ByteBudget, FitsTheAllowanceAndNeverRaisesAToken) {
  std::mt19937 gen(7);
  std::exponential_distribution<float> mass(1.0f);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<BudgetToken> t(1 + gen() % 40);
    for (BudgetToken& b : t) {
      b.mass = mass(gen);
      b.best = static_cast<KvPrecision>(1 + gen() % 3);  // int8, int4 or int2
    }
    const int64_t floor_bytes = static_cast<int64_t>(t.size()) * kSlot[3];
    const int64_t allowance = floor_bytes + static_cast<int64_t>(gen() % 200000);
    const auto c = ChooseClassesForBudget(t, allowance, kSlot, KvPrecision::kInt2);
    ASSERT_TRUE(c.has_value());
    EXPECT_LE(Bytes(*c), allowance);
    for (size_t i = 0; i < t.size(); ++i) {
      EXPECT_GE(static_cast<int>((*c)[i]), static_cast<int>(t[i].best)) << "raised above its best";
    }
    // Maximal: no single further upgrade fits.
    for (size_t i = 0; i < t.size(); ++i) {
      const int k = static_cast<int>((*c)[i]);
      if (k > static_cast<int>(t[i].best)) {
        EXPECT_GT(Bytes(*c) + kSlot[k - 1] - kSlot[k], allowance) << "token " << i << " left";
      }
    }
  }
}

TEST(ByteBudget, MoreMassNeverGetsALessPreciseClass) {
  std::mt19937 gen(11);
  std::uniform_real_distribution<float> mass(0.0f, 8.0f);
  for (int trial = 0; trial < 100; ++trial) {
    std::vector<BudgetToken> t(30);
    for (BudgetToken& b : t) b = {mass(gen), KvPrecision::kInt8};
    const int64_t allowance = 30 * kSlot[3] + static_cast<int64_t>(gen() % 250000);
    const auto c = ChooseClassesForBudget(t, allowance, kSlot, KvPrecision::kInt2);
    ASSERT_TRUE(c.has_value());
    for (size_t i = 0; i < t.size(); ++i) {
      for (size_t j = 0; j < t.size(); ++j) {
        if (t[i].mass > t[j].mass) {
          EXPECT_LE(static_cast<int>((*c)[i]), static_cast<int>((*c)[j]) + 1)
              << "mass " << t[i].mass << " vs " << t[j].mass;
        }
      }
    }
  }
}

// Against every assignment of 6 tokens: the greedy choice is within the error of the best
// one whose bytes fit, give or take one upgrade's worth (the fractional optimum's gap).
TEST(ByteBudget, NearTheExhaustiveOptimum) {
  std::mt19937 gen(5);
  std::exponential_distribution<float> mass(0.5f);
  for (int trial = 0; trial < 60; ++trial) {
    std::vector<BudgetToken> t(6);
    for (BudgetToken& b : t) b = {mass(gen), KvPrecision::kInt8};
    const int64_t allowance = 6 * kSlot[3] + static_cast<int64_t>(gen() % 60000);
    const auto c = ChooseClassesForBudget(t, allowance, kSlot, KvPrecision::kInt2);
    ASSERT_TRUE(c.has_value());
    double best = 1e30;
    std::vector<KvPrecision> a(6);
    for (int code = 0; code < 729; ++code) {
      int x = code;
      for (int i = 0; i < 6; ++i, x /= 3) a[i] = static_cast<KvPrecision>(1 + x % 3);
      if (Bytes(a) <= allowance) best = std::min(best, Error(t, a));
    }
    const float top = std::max_element(t.begin(), t.end(), [](auto& x, auto& y) {
                        return x.mass < y.mass;
                      })->mass;
    EXPECT_LE(Error(t, *c), best + top * (kClassError[2] - kClassError[1]) + 1e-12) << trial;
  }
}

TEST(ByteBudget, NothingFitsIsNullopt) {
  std::vector<BudgetToken> t(4, {1.0f, KvPrecision::kInt8});
  EXPECT_FALSE(ChooseClassesForBudget(t, 4 * kSlot[3] - 1, kSlot, KvPrecision::kInt2).has_value());
  const auto c = ChooseClassesForBudget(t, 4 * kSlot[3], kSlot, KvPrecision::kInt2);
  ASSERT_TRUE(c.has_value());
  for (KvPrecision p : *c) EXPECT_EQ(p, KvPrecision::kInt2);
  // A generous allowance: every token at its best, no further.
  const auto all = ChooseClassesForBudget(t, 1 << 30, kSlot, KvPrecision::kInt2);
  for (KvPrecision p : *all) EXPECT_EQ(p, KvPrecision::kInt8);
}

// The model's per-class errors are the codec's: mean squared error per value of Gaussian
// rows of 64 stored in each class, within 25%.
TEST(ByteBudget, ClassErrorsAreTheCodecs) {
  std::mt19937 gen(1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (int c = 1; c < kNumKvPrecisions; ++c) {
    const KvPrecision p = static_cast<KvPrecision>(c);
    double se = 0.0;
    int n = 0;
    for (int trial = 0; trial < 400; ++trial) {
      std::vector<float> x(64), y(64);
      for (float& v : x) v = dist(gen);
      std::vector<uint8_t> row(KvRowBytes(p, 64));
      KvEncodeRow(p, x.data(), 64, row.data());
      KvDecodeRow(p, row.data(), 64, y.data());
      for (int i = 0; i < 64; ++i, ++n) se += (double(y[i]) - x[i]) * (double(y[i]) - x[i]);
    }
    const double mse = se / n;
    EXPECT_NEAR(mse, kClassError[c], 0.25 * kClassError[c]) << KvPrecisionName(p);
  }
}

}  // namespace
}  // namespace specnode
