#include "model/gguf/ggml_types.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"

namespace specnode {
namespace {

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Independent decoding of an IEEE half through double arithmetic.
double ReferenceHalf(uint16_t h) {
  const int sign = (h & 0x8000) ? -1 : 1;
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  if (exp == 0) return sign * std::ldexp(mant, -24);
  if (exp == 31) {
    return mant == 0 ? sign * std::numeric_limits<double>::infinity()
                     : std::numeric_limits<double>::quiet_NaN();
  }
  return sign * std::ldexp(1024 + mant, exp - 25);
}

TEST(Fp16Test, DecodeExhaustiveMatchesReference) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float got = Fp16ToFp32(static_cast<uint16_t>(h));
    const double want = ReferenceHalf(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << h;
      // Payload and sign survive decoding.
      EXPECT_EQ(Bits(got) >> 31, h >> 15) << h;
      EXPECT_EQ((Bits(got) >> 13) & 0x3ff, h & 0x3ff) << h;
    } else {
      ASSERT_EQ(static_cast<double>(got), want) << "half 0x" << std::hex << h;
      ASSERT_EQ(std::signbit(got), (h & 0x8000) != 0) << h;
    }
  }
}

TEST(Fp16Test, EncodeRoundTripsEveryHalf) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = Fp16ToFp32(static_cast<uint16_t>(h));
    const uint16_t back = Fp32ToFp16(f);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(Fp16ToFp32(back))) << h;
    } else {
      ASSERT_EQ(back, h) << "half 0x" << std::hex << h;
    }
  }
}

// Midpoints between adjacent halves tie to even; one float ulp either side goes to the
// nearer half. Covers subnormals, the normal range and overflow to infinity.
TEST(Fp16Test, EncodeRoundsToNearestEven) {
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    const double lo = ReferenceHalf(static_cast<uint16_t>(h));
    const double hi = h + 1 < 0x7c00 ? ReferenceHalf(static_cast<uint16_t>(h + 1)) : 65536.0;
    const float mid = static_cast<float>((lo + hi) / 2);  // exact: 12 significant bits
    ASSERT_EQ(static_cast<double>(mid), (lo + hi) / 2);
    const uint16_t even = (h & 1) ? static_cast<uint16_t>(h + 1) : static_cast<uint16_t>(h);
    for (float sign : {1.0f, -1.0f}) {
      const uint16_t s = sign < 0 ? 0x8000 : 0;
      ASSERT_EQ(Fp32ToFp16(sign * mid), s | even) << "half 0x" << std::hex << h;
      ASSERT_EQ(Fp32ToFp16(sign * std::nextafter(mid, 0.0f)), s | h) << std::hex << h;
      ASSERT_EQ(Fp32ToFp16(sign * std::nextafter(mid, 1e30f)), s | (h + 1)) << std::hex << h;
    }
  }
}

TEST(Fp16Test, EncodeSpecialValues) {
  EXPECT_EQ(Fp32ToFp16(0.0f), 0x0000);
  EXPECT_EQ(Fp32ToFp16(-0.0f), 0x8000);
  EXPECT_EQ(Fp32ToFp16(1.0f), 0x3c00);
  EXPECT_EQ(Fp32ToFp16(65504.0f), 0x7bff);
  EXPECT_EQ(Fp32ToFp16(65519.99f), 0x7bff);
  EXPECT_EQ(Fp32ToFp16(65520.0f), 0x7c00);
  EXPECT_EQ(Fp32ToFp16(1e30f), 0x7c00);
  EXPECT_EQ(Fp32ToFp16(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_EQ(Fp32ToFp16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(Fp32ToFp16(std::ldexp(1.0f, -25)), 0x0000);  // tie to even (zero)
  EXPECT_EQ(Fp32ToFp16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(Fp32ToFp16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(Fp32ToFp16(-std::numeric_limits<float>::denorm_min()), 0x8000);
  const uint16_t nan = Fp32ToFp16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(std::isnan(Fp16ToFp32(nan)));
  // A signalling NaN whose payload lives only in the low bits must not become infinity.
  EXPECT_TRUE(std::isnan(Fp16ToFp32(Fp32ToFp16(FromBits(0x7f800001u)))));
}

#if defined(__FLT16_MAX__)
// The compiler's own _Float16 conversion is an independent reference.
TEST(Fp16Test, EncodeMatchesCompilerFloat16OnRandomBits) {
  std::mt19937 rng(123);
  for (int i = 0; i < 2000000; ++i) {
    const float f = FromBits(rng());
    if (std::isnan(f)) continue;
    const _Float16 h = static_cast<_Float16>(f);
    uint16_t want;
    std::memcpy(&want, &h, 2);
    ASSERT_EQ(Fp32ToFp16(f), want) << "float bits 0x" << std::hex << Bits(f);
  }
}
#endif

TEST(Bf16Test, RoundsToNearestEven) {
  EXPECT_EQ(Fp32ToBf16(1.0f), 0x3f80);
  EXPECT_EQ(Fp32ToBf16(-2.0f), 0xc000);
  EXPECT_EQ(Fp32ToBf16(FromBits(0x3f808000u)), 0x3f80);  // tie, even stays
  EXPECT_EQ(Fp32ToBf16(FromBits(0x3f818000u)), 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(Fp32ToBf16(FromBits(0x3f808001u)), 0x3f81);
  EXPECT_EQ(Fp32ToBf16(FromBits(0x7f7fffffu)), 0x7f80);  // max float rounds to inf
  EXPECT_EQ(Fp32ToBf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_TRUE(std::isnan(Bf16ToFp32(Fp32ToBf16(FromBits(0x7f800001u)))));
  EXPECT_TRUE(std::isnan(Bf16ToFp32(Fp32ToBf16(std::numeric_limits<float>::quiet_NaN()))));
  // Random values: the result is one of the two neighbouring bf16 values, the nearer one.
  std::mt19937 rng(7);
  for (int i = 0; i < 1000000; ++i) {
    const uint32_t u = rng();
    const float f = FromBits(u);
    if (!std::isfinite(f) || (u & 0x7fffffffu) >= 0x7f7f8000u) continue;
    const uint16_t got = Fp32ToBf16(f);
    const double lo = Bf16ToFp32(static_cast<uint16_t>(u >> 16));
    const double hi = Bf16ToFp32(static_cast<uint16_t>((u >> 16) + 1));
    const double dl = std::fabs(f - lo), dh = std::fabs(hi - f);
    const uint16_t want = dl < dh   ? static_cast<uint16_t>(u >> 16)
                          : dh < dl ? static_cast<uint16_t>((u >> 16) + 1)
                                    : static_cast<uint16_t>(((u >> 16) + ((u >> 16) & 1)));
    ASSERT_EQ(got, want) << std::hex << u;
  }
}

TEST(GgmlTypesTest, NamesAndSizes) {
  EXPECT_EQ(GgmlTypeName(0), "F32");
  EXPECT_EQ(GgmlTypeName(3), "Q4_1");
  EXPECT_EQ(GgmlTypeName(8), "Q8_0");
  EXPECT_EQ(GgmlTypeName(30), "BF16");
  EXPECT_EQ(GgmlTypeName(12), "Q4_K");
  EXPECT_EQ(GgmlTypeName(10), "Q2_K");  // known to ggml, unsupported here
  EXPECT_EQ(GgmlTypeName(4), "type#4");
  EXPECT_EQ(GgmlTypeName(77), "type#77");
  EXPECT_EQ(GgmlTypeName(0xffffffffu), "type#>1023");
  for (uint32_t t : {0u, 1u, 2u, 3u, 8u, 30u}) EXPECT_TRUE(IsSupportedGgmlType(t)) << t;
  for (uint32_t t : {4u, 5u, 9u, 10u, 11u, 15u, 29u, 31u, 1000u}) EXPECT_FALSE(IsSupportedGgmlType(t)) << t;
  for (uint32_t t : {6u, 7u, 12u, 13u, 14u}) EXPECT_TRUE(IsSupportedGgmlType(t)) << t;  // converted at load
  EXPECT_EQ(GgmlBlockSize(GgmlType::kF32), 1);
  EXPECT_EQ(GgmlBlockSize(GgmlType::kQ4_1), 32);
  EXPECT_EQ(GgmlBlockBytes(GgmlType::kF16), 2u);
  EXPECT_EQ(GgmlBlockBytes(GgmlType::kQ4_0), 18u);
  EXPECT_EQ(GgmlBlockBytes(GgmlType::kQ4_1), 20u);
  EXPECT_EQ(GgmlBlockBytes(GgmlType::kQ8_0), 34u);
  EXPECT_EQ(GgmlRowBytes(GgmlType::kQ8_0, 576), 18u * 34u);
  EXPECT_EQ(GgmlRowBytes(GgmlType::kBF16, 10), 20u);
}

// Golden blocks, hand-computed from ggml's reference quantisers: these pin the nibble
// order (low nibbles = values 0..15, high nibbles = values 16..31).
TEST(QuantGoldenTest, Q4_0) {
  float x[32];
  for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j % 16 - 8);  // max-abs is -8
  BlockQ4_0 b;
  QuantizeRow(GgmlType::kQ4_0, x, &b, 32);
  EXPECT_EQ(b.d, 0x3c00);  // d = -8 / -8 = 1
  for (int j = 0; j < 16; ++j) EXPECT_EQ(b.qs[j], j | (j << 4)) << j;
  float y[32];
  DequantizeRow(GgmlType::kQ4_0, &b, y, 32);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], x[j]) << j;
}

TEST(QuantGoldenTest, Q4_0PositiveMaxClipsOppositeEnd) {
  float x[32] = {};
  x[0] = 8.0f;   // max-abs positive: d = -1, q = (int)(-x + 8.5)
  x[1] = -8.0f;  // would be q = 16: clipped to 15 -> value 7 * -1 = -7
  x[17] = 3.0f;  // high nibble of byte 1
  BlockQ4_0 b;
  QuantizeRow(GgmlType::kQ4_0, x, &b, 32);
  EXPECT_EQ(b.d, Fp32ToFp16(-1.0f));
  EXPECT_EQ(b.qs[0], 0 | (8 << 4));
  EXPECT_EQ(b.qs[1], 15 | (5 << 4));
  float y[32];
  DequantizeRow(GgmlType::kQ4_0, &b, y, 32);
  EXPECT_EQ(y[0], 8.0f);
  EXPECT_EQ(y[1], -7.0f);
  EXPECT_EQ(y[17], 3.0f);
}

TEST(QuantGoldenTest, Q4_1) {
  float x[32];
  for (int j = 0; j < 32; ++j) x[j] = 10.0f + static_cast<float>((j * 7) % 16);
  BlockQ4_1 b;
  QuantizeRow(GgmlType::kQ4_1, x, &b, 32);
  EXPECT_EQ(b.d, 0x3c00);  // (25 - 10) / 15
  EXPECT_EQ(b.m, Fp32ToFp16(10.0f));
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(b.qs[j] & 15, (j * 7) % 16) << j;
    EXPECT_EQ(b.qs[j] >> 4, ((j + 16) * 7) % 16) << j;
  }
  float y[32];
  DequantizeRow(GgmlType::kQ4_1, &b, y, 32);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], x[j]) << j;
}

TEST(QuantGoldenTest, Q8_0) {
  float x[32];
  for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j - 16) * 0.5f;  // amax 8 at j=0
  BlockQ8_0 b;
  QuantizeRow(GgmlType::kQ8_0, x, &b, 32);
  EXPECT_EQ(b.d, Fp32ToFp16(8.0f / 127.0f));
  EXPECT_EQ(b.qs[0], -127);
  EXPECT_EQ(b.qs[16], 0);
  EXPECT_EQ(b.qs[31], static_cast<int8_t>(std::round(7.5f * 127.0f / 8.0f)));
  EXPECT_EQ(b.qs[17], 8);  // 0.5 * 127 / 8 = 7.94 rounds to 8
}

TEST(QuantGoldenTest, ZeroBlocksStayZero) {
  const float x[32] = {};
  for (GgmlType t : {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ8_0}) {
    uint8_t buf[64];
    QuantizeRow(t, x, buf, 32);
    float y[32];
    DequantizeRow(t, buf, y, 32);
    for (float v : y) EXPECT_EQ(v, 0.0f) << GgmlTypeName(static_cast<uint32_t>(t));
  }
}

TEST(QuantGoldenTest, NonFiniteInputsDoNotCrash) {
  float x[32];
  for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j);
  x[3] = std::numeric_limits<float>::quiet_NaN();
  x[9] = std::numeric_limits<float>::infinity();
  x[20] = -std::numeric_limits<float>::infinity();
  for (GgmlType t : {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ8_0, GgmlType::kF16,
                     GgmlType::kBF16, GgmlType::kF32}) {
    uint8_t buf[128];
    float y[32];
    QuantizeRow(t, x, buf, 32);
    DequantizeRow(t, buf, y, 32);  // values unspecified; only defined behaviour matters
  }
}

// ---- Round trip error bounds, parameterised over type and row length.

class QuantRoundTripTest : public ::testing::TestWithParam<std::tuple<GgmlType, int>> {};

// Rows mixing scales: each block draws its own magnitude, with a few special blocks
// (constant, single spike, tiny values in the f16-subnormal range of the scale).
std::vector<float> MakeRow(int cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> log_scale(-6.0f, 6.0f);
  std::vector<float> x(cols);
  for (int b = 0; b * 32 < cols; ++b) {
    const float scale = std::exp2(log_scale(rng));
    const int kind = b % 5;
    for (int j = b * 32; j < std::min(cols, b * 32 + 32); ++j) {
      if (kind == 1) {
        x[j] = scale;
      } else if (kind == 2) {
        x[j] = j == b * 32 + 7 ? 100.0f * scale : 0.01f * scale * normal(rng);
      } else {
        x[j] = scale * normal(rng);
      }
    }
  }
  return x;
}

TEST_P(QuantRoundTripTest, ErrorWithinReferenceBounds) {
  const auto [type, cols] = GetParam();
  const std::vector<float> x = MakeRow(cols, static_cast<uint32_t>(cols) * 31 + 5);
  std::vector<uint8_t> q(GgmlRowBytes(type, cols));
  std::vector<float> y(cols);
  QuantizeRow(type, x.data(), q.data(), cols);
  DequantizeRow(type, q.data(), y.data(), cols);
  const double h = std::ldexp(1.0, -11);     // f16 relative rounding
  const double tiny = std::ldexp(1.0, -25);  // f16 absolute rounding near zero
  for (int b = 0; b * 32 < cols; ++b) {
    const int lo = b * 32, hi = std::min(cols, lo + 32);
    double amax = 0, mn = x[lo], mx = x[lo];
    for (int j = lo; j < hi; ++j) {
      amax = std::max(amax, std::fabs(static_cast<double>(x[j])));
      mn = std::min(mn, static_cast<double>(x[j]));
      mx = std::max(mx, static_cast<double>(x[j]));
    }
    for (int j = lo; j < hi; ++j) {
      double bound = 0;
      switch (type) {
        case GgmlType::kF32:
          bound = 0;
          break;
        case GgmlType::kF16:
          bound = std::fabs(x[j]) * h + tiny;
          break;
        case GgmlType::kBF16:
          bound = std::fabs(x[j]) * std::ldexp(1.0, -8);
          break;
        case GgmlType::kQ8_0: {
          const double d = amax / 127;
          bound = 0.5 * d + 127 * (d * h + tiny) + 1e-6 * amax;
          break;
        }
        case GgmlType::kQ4_0: {
          const double d = amax / 8;  // values at the far end may clip by a whole step
          bound = d + 8 * (d * h + tiny) + 1e-6 * amax;
          break;
        }
        case GgmlType::kQ4_1: {
          const double d = (mx - mn) / 15;
          bound = 0.5 * d + 15 * (d * h + tiny) + std::fabs(mn) * h + tiny + 1e-6 * amax;
          break;
        }
        default:
          FAIL() << "no bound for this type (K-quants: ggml_converted_types_test.cc)";
      }
      ASSERT_LE(std::fabs(static_cast<double>(y[j]) - x[j]), bound)
          << GgmlTypeName(static_cast<uint32_t>(type)) << " cols " << cols << " index " << j
          << " x " << x[j] << " y " << y[j];
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllTypes, QuantRoundTripTest,
    ::testing::Combine(::testing::Values(GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16,
                                         GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1),
                       ::testing::Values(32, 64, 96, 256, 576, 4096)),
    [](const auto& info) {
      return std::string(GgmlTypeName(static_cast<uint32_t>(std::get<0>(info.param)))) + "_" +
             std::to_string(std::get<1>(info.param));
    });

}  // namespace
}  // namespace specnode
