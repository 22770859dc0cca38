#include "model/cpu/cpu_ops.h"

#include "model/cpu/cpu_kernels.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace specnode {
namespace {

std::vector<float> RandomVector(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

class RmsNormTest : public ::testing::TestWithParam<int> {};

TEST_P(RmsNormTest, MatchesDoubleReference) {
  const int dim = GetParam();
  const int n = 3;
  auto x = RandomVector(n * dim, 1);
  auto w = RandomVector(dim, 2);
  std::vector<float> y(n * dim);
  RmsNorm(x.data(), w.data(), n, dim, 1e-5f, y.data());
  for (int r = 0; r < n; ++r) {
    double ss = 0;
    for (int i = 0; i < dim; ++i) ss += double(x[r * dim + i]) * x[r * dim + i];
    const double scale = 1.0 / std::sqrt(ss / dim + 1e-5);
    for (int i = 0; i < dim; ++i) {
      const double expected = x[r * dim + i] * scale * w[i];
      EXPECT_NEAR(y[r * dim + i], expected, 1e-5 * (1 + std::abs(expected)));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dims, RmsNormTest, ::testing::Values(1, 7, 64, 576, 4096));

TEST(RmsNorm, InPlaceEqualsOutOfPlace) {
  auto x = RandomVector(2 * 96, 3);
  auto w = RandomVector(96, 4);
  std::vector<float> y(x.size());
  RmsNorm(x.data(), w.data(), 2, 96, 1e-6f, y.data());
  RmsNorm(x.data(), w.data(), 2, 96, 1e-6f, x.data());
  EXPECT_EQ(x, y);
}

TEST(RopeNorm, RotatesAdjacentPairsByPositionTimesFrequency) {
  const int n_heads = 2, head_dim = 8, rope_dim = 8;
  const float base = 10000.0f;
  auto x = RandomVector(3 * n_heads * head_dim, 5);
  auto orig = x;
  const int32_t pos[3] = {0, 1, 1000};
  RopeNorm(x.data(), pos, 3, n_heads, head_dim, rope_dim, base);
  for (int t = 0; t < 3; ++t) {
    for (int h = 0; h < n_heads; ++h) {
      for (int i = 0; i < rope_dim / 2; ++i) {
        const double theta = pos[t] * std::pow(double(base), -2.0 * i / rope_dim);
        const float* o = &orig[(t * n_heads + h) * head_dim + 2 * i];
        const float* r = &x[(t * n_heads + h) * head_dim + 2 * i];
        EXPECT_NEAR(r[0], o[0] * std::cos(theta) - o[1] * std::sin(theta), 1e-5);
        EXPECT_NEAR(r[1], o[0] * std::sin(theta) + o[1] * std::cos(theta), 1e-5);
      }
    }
  }
}

// The forward pass computes the angles once per pass (RopeAngles) and rotates every layer's
// q and k with them (RopeApply): bit-identical to rotating with freshly computed angles.
TEST(RopeNorm, AnglesTableThenApplyIsBitIdenticalToOnePass) {
  const int n_heads = 3, head_dim = 16, rope_dim = 12;
  const float base = 10000.0f;
  const int32_t pos[4] = {0, 7, 513, 4095};
  auto x = RandomVector(4 * n_heads * head_dim, 9);
  auto want = x;
  for (int t = 0; t < 4; ++t) {
    for (int i = 0; i < rope_dim / 2; ++i) {
      const double theta = double(pos[t]) * std::pow(double(base), -2.0 * i / rope_dim);
      const float c = static_cast<float>(std::cos(theta)), sn = static_cast<float>(std::sin(theta));
      for (int h = 0; h < n_heads; ++h) {
        float* p = &want[(t * n_heads + h) * head_dim + 2 * i];
        const float a = p[0], b = p[1];
        p[0] = a * c - b * sn;
        p[1] = a * sn + b * c;
      }
    }
  }
  std::vector<float> table(4 * rope_dim);
  RopeAngles(pos, 4, rope_dim, base, table.data());
  auto got = x;
  RopeApply(got.data(), table.data(), 4, n_heads, head_dim, rope_dim);
  EXPECT_EQ(got, want);
  RopeNorm(x.data(), pos, 4, n_heads, head_dim, rope_dim, base);
  EXPECT_EQ(x, want);
}

// NeoX mode (Qwen, Gemma): dim i pairs with dim i + rope_dim/2, turned by pair i's angle of
// the same table; dims past rope_dim untouched. Shapes: full and partial rotary dims.
class RopeNeoxTest : public ::testing::TestWithParam<std::pair<int, int>> {};

TEST_P(RopeNeoxTest, RotatesHalvesByPositionTimesFrequency) {
  const auto [head_dim, rope_dim] = GetParam();
  const int n_heads = 3, n = 4;
  const float base = 1000000.0f;
  const int32_t pos[n] = {0, 1, 77, 8191};
  auto x = RandomVector(n * n_heads * head_dim, 12);
  const auto orig = x;
  std::vector<float> table(n * rope_dim);
  RopeAngles(pos, n, rope_dim, base, table.data());
  RopeApply(x.data(), table.data(), n, n_heads, head_dim, rope_dim, /*neox=*/true);
  const int half = rope_dim / 2;
  for (int t = 0; t < n; ++t) {
    for (int h = 0; h < n_heads; ++h) {
      const float* o = &orig[(t * n_heads + h) * head_dim];
      const float* r = &x[(t * n_heads + h) * head_dim];
      for (int i = 0; i < half; ++i) {
        const double theta = pos[t] * std::pow(double(base), -2.0 * i / rope_dim);
        EXPECT_NEAR(r[i], o[i] * std::cos(theta) - o[i + half] * std::sin(theta), 1e-5);
        EXPECT_NEAR(r[i + half], o[i + half] * std::cos(theta) + o[i] * std::sin(theta), 1e-5);
      }
      for (int i = rope_dim; i < head_dim; ++i) EXPECT_EQ(r[i], o[i]);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dims, RopeNeoxTest,
                         ::testing::Values(std::pair{8, 8}, std::pair{64, 64}, std::pair{128, 64},
                                           std::pair{256, 256}));

// GeGLU (Gemma): gelu's tanh form times up; close to the exact (erf) GELU, exact at the
// ends, in place allowed. Shapes: a few lengths across the range of gate values.
class GeGluTest : public ::testing::TestWithParam<int> {};

TEST_P(GeGluTest, TanhGeluTimesUp) {
  const int n = GetParam();
  std::vector<float> gate(n), up = RandomVector(n, 21), out(n);
  for (int i = 0; i < n; ++i) gate[i] = -12.0f + 24.0f * static_cast<float>(i) / std::max(1, n - 1);
  GeGlu(gate.data(), up.data(), n, out.data());
  for (int i = 0; i < n; ++i) {
    const double g = gate[i];
    const double tanh_form =
        0.5 * g * (1 + std::tanh(std::sqrt(2 / M_PI) * (g + 0.044715 * g * g * g))) * up[i];
    const double erf_form = 0.5 * g * (1 + std::erf(g / std::sqrt(2.0))) * up[i];
    EXPECT_NEAR(out[i], tanh_form, 1e-6 * (1 + std::abs(tanh_form))) << "g=" << g;
    EXPECT_NEAR(out[i], erf_form, 2e-3 * (1 + std::abs(up[i]))) << "g=" << g;
  }
  std::vector<float> in_place = gate;
  GeGlu(in_place.data(), up.data(), n, in_place.data());
  EXPECT_EQ(in_place, out);
}

INSTANTIATE_TEST_SUITE_P(Lengths, GeGluTest, ::testing::Values(1, 17, 2048));

// Llama 3.1's rope_freqs.weight: pair i's angle divided by its factor (ggml rope_ext).
TEST(RopeAngles, FrequencyFactorsDivideEachPairsAngle) {
  const int rope_dim = 8;
  const float base = 500000.0f, factors[4] = {1.0f, 2.0f, 4.0f, 8.0f};
  const int32_t pos[2] = {3, 9000};
  std::vector<float> table(2 * rope_dim), plain(2 * rope_dim);
  RopeAngles(pos, 2, rope_dim, base, table.data(), factors);
  RopeAngles(pos, 2, rope_dim, base, plain.data());
  for (int t = 0; t < 2; ++t) {
    for (int i = 0; i < rope_dim / 2; ++i) {
      const double theta = pos[t] * std::pow(double(base), -2.0 * i / rope_dim) / factors[i];
      EXPECT_FLOAT_EQ(table[t * rope_dim + 2 * i], static_cast<float>(std::cos(theta)));
      EXPECT_FLOAT_EQ(table[t * rope_dim + 2 * i + 1], static_cast<float>(std::sin(theta)));
    }
    // Factor 1 leaves pair 0 as it was.
    EXPECT_EQ(table[t * rope_dim], plain[t * rope_dim]);
  }
}

TEST(RopeNorm, LeavesDimsBeyondRopeDimAlone) {
  auto x = RandomVector(16, 6);
  auto orig = x;
  const int32_t pos[1] = {17};
  RopeNorm(x.data(), pos, 1, 1, 16, 8, 10000.0f);
  for (int i = 8; i < 16; ++i) EXPECT_EQ(x[i], orig[i]);
  EXPECT_NE(x[0], orig[0]);
}

TEST(RopeNorm, DotProductDependsOnlyOnRelativePosition) {
  // The property attention relies on: <R(p)q, R(p+d)k> is independent of p.
  auto q = RandomVector(64, 7), k = RandomVector(64, 8);
  auto dot_at = [&](int32_t p, int32_t d) {
    auto qq = q, kk = k;
    RopeNorm(qq.data(), &p, 1, 1, 64, 64, 10000.0f);
    int32_t pk = p + d;
    RopeNorm(kk.data(), &pk, 1, 1, 64, 64, 10000.0f);
    double s = 0;
    for (int i = 0; i < 64; ++i) s += double(qq[i]) * kk[i];
    return s;
  };
  EXPECT_NEAR(dot_at(0, 5), dot_at(300, 5), 1e-3);
  EXPECT_NEAR(dot_at(10, 0), dot_at(2000, 0), 1e-3);
}

TEST(SoftmaxInPlace, SumsToOneAndIsShiftInvariant) {
  std::vector<float> a = {1.0f, 2.0f, 3.0f, -1000.0f};
  std::vector<float> b = {1001.0f, 1002.0f, 1003.0f, 0.0f};
  SoftmaxInPlace(a.data(), 4);
  SoftmaxInPlace(b.data(), 4);
  double sum = 0;
  for (int i = 0; i < 4; ++i) {
    sum += a[i];
    EXPECT_NEAR(a[i], b[i], 1e-6);
  }
  EXPECT_NEAR(sum, 1.0, 1e-6);
  EXPECT_NEAR(a[2] / a[1], std::exp(1.0), 1e-4);
}

TEST(SwiGlu, MatchesFormula) {
  std::vector<float> g = {-3.0f, 0.0f, 0.5f, 4.0f}, u = {2.0f, 5.0f, -1.0f, 0.25f}, out(4);
  SwiGlu(g.data(), u.data(), 4, out.data());
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(out[i], g[i] / (1 + std::exp(-g[i])) * u[i], 1e-6);
  }
}

// Every table's swiglu equals the scalar reference bit for bit (so the kernel level does not
// change SwiGLU's bits), including odd lengths (vector body + scalar tail), ±0, subnormals,
// the clamp range's edges, ±inf and NaN; and the reference is within 3e-7 relative (~2.5
// ulp; absolute 1e-30 near silu's zero) of the exact formula, in double, over [-87, 87].
TEST(SwiGlu, EveryTableEqualsScalarAndFormula) {
  std::vector<float> g, u;
  for (int i = -90000; i <= 90000; i += 7) {
    g.push_back(static_cast<float>(i) * 0.001f);
    u.push_back(1.0f + static_cast<float>(i % 13) * 0.25f);
  }
  for (float v :
       {0.0f, -0.0f, 1e-40f, -1e-40f, 87.0f, -87.0f, 88.0f, -88.0f, 87.5f, -88.5f, 1e30f, -1e30f,
        std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
        std::numeric_limits<float>::quiet_NaN()}) {
    g.push_back(v);
    u.push_back(3.0f);
  }
  const int64_t n = static_cast<int64_t>(g.size());
  std::vector<float> want(n);
  cpu_kernels::SwiGluScalar(g.data(), u.data(), n, want.data());
  for (int64_t i = 0; i < n; ++i) {
    if (std::fabs(g[i]) > 87.0f || !std::isfinite(g[i])) continue;
    const double ref = g[i] / (1.0 + std::exp(-static_cast<double>(g[i]))) * u[i];
    EXPECT_NEAR(want[i], ref, std::fabs(ref) * 3e-7 + 1e-30) << "gate " << g[i];
  }
  EXPECT_TRUE(std::isnan(want[n - 1]));
  EXPECT_EQ(want[n - 5], 1e30f * 3.0f);  // silu(g) = g for large g
  for (const cpu_kernels::KernelTable* k : cpu_kernels::SupportedKernels()) {
    for (const int64_t len : {n, n - 1, int64_t{7}, int64_t{1}, int64_t{0}}) {
      const int64_t off = n - len;  // the specials sit at the end: every length covers some
      std::vector<float> got(len, -1.0f);
      k->swiglu(g.data() + off, u.data() + off, len, got.data());
      for (int64_t i = 0; i < len; ++i) {
        ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[off + i]))
            << k->name << " len " << len << " gate " << g[off + i];
      }
    }
  }
}

}  // namespace
}  // namespace specnode
