// Storage-only types (K-quants, Q5_0, Q5_1): decoding of hand-built blocks, encode/decode
// round trips, and the load-time conversion into the kernels' 32-value types. (The decoder is also
// checked against gguf-py's independent dequantiser by tests/oracle/test_tiny_models.py.)
#include "model/gguf/ggml_converted_types.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

namespace specnode {
namespace {

template <typename Block>
std::vector<float> Decode(GgmlType type, const Block& b) {
  std::vector<float> y(kKQuantBlock);
  DequantizeRow(type, &b, y.data(), kKQuantBlock);
  return y;
}

TEST(ConvertedTypes, TypesAndSizes) {
  for (GgmlType t : {GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K}) {
    EXPECT_TRUE(IsSupportedGgmlType(static_cast<uint32_t>(t)));
    EXPECT_FALSE(IsComputeGgmlType(t));
    EXPECT_EQ(GgmlBlockSize(t), 256);
  }
  for (GgmlType t : {GgmlType::kQ5_0, GgmlType::kQ5_1}) {
    EXPECT_TRUE(IsSupportedGgmlType(static_cast<uint32_t>(t)));
    EXPECT_FALSE(IsComputeGgmlType(t));
    EXPECT_EQ(GgmlBlockSize(t), 32);
    EXPECT_EQ(ComputeTypeOf(t), GgmlType::kQ8_0);
  }
  EXPECT_EQ(GgmlRowBytes(GgmlType::kQ5_0, 64), 44u);
  EXPECT_EQ(GgmlRowBytes(GgmlType::kQ5_1, 64), 48u);
  EXPECT_EQ(GgmlRowBytes(GgmlType::kQ4_K, 512), 288u);
  EXPECT_EQ(GgmlRowBytes(GgmlType::kQ5_K, 256), 176u);
  EXPECT_EQ(GgmlRowBytes(GgmlType::kQ6_K, 256), 210u);
  EXPECT_EQ(ComputeTypeOf(GgmlType::kQ4_K), GgmlType::kQ4_1);
  EXPECT_EQ(ComputeTypeOf(GgmlType::kQ5_K), GgmlType::kQ8_0);
  EXPECT_EQ(ComputeTypeOf(GgmlType::kQ6_K), GgmlType::kQ8_0);
  EXPECT_EQ(ComputeTypeOf(GgmlType::kQ4_1), GgmlType::kQ4_1);
  EXPECT_TRUE(IsComputeGgmlType(GgmlType::kQ8_0));
}

// Scales 1..8, mins 0..7 (all below 16, so the packed bytes are easy to write down), and
// scales 33 / 63 and mins 48 / 17 (exercising the high bits of the packing) in a second
// block.
TEST(ConvertedTypes, Q4KDecodesHandBuiltBlocks) {
  BlockQ4K b{};
  b.d = Fp32ToFp16(0.5f);
  b.dmin = Fp32ToFp16(0.25f);
  const uint8_t scales[12] = {
      1, 2, 3, 4, 0, 1, 2, 3, 5 | (4 << 4), 6 | (5 << 4), 7 | (6 << 4), 8 | (7 << 4)};
  std::memcpy(b.scales, scales, 12);
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l)
      b.qs[32 * c + l] = static_cast<uint8_t>((l % 16) | ((15 - l % 16) << 4));
  }
  const std::vector<float> y = Decode(GgmlType::kQ4_K, b);
  for (int i = 0; i < 256; ++i) {
    const int j = i / 32, l = i % 32;
    const int q = j % 2 == 0 ? l % 16 : 15 - l % 16;
    const float want =
        0.5f * static_cast<float>(j + 1) * static_cast<float>(q) - 0.25f * static_cast<float>(j);
    ASSERT_EQ(y[i], want) << "value " << i;
  }
  // sc_0 = 33, m_0 = 48 (low 6 bits in bytes 0 / 4); sc_4 = 63, m_4 = 17 (low nibbles in
  // byte 8, high 2 bits in the top of bytes 0 / 4).
  BlockQ4K h{};
  h.d = Fp32ToFp16(1.0f);
  h.dmin = Fp32ToFp16(1.0f);
  h.scales[0] = static_cast<uint8_t>(33 | ((63 >> 4) << 6));
  h.scales[4] = static_cast<uint8_t>(48 | ((17 >> 4) << 6));
  h.scales[8] = static_cast<uint8_t>((63 & 0xF) | ((17 & 0xF) << 4));
  std::memset(h.qs, 0x11, sizeof(h.qs));  // every code 1
  const std::vector<float> z = Decode(GgmlType::kQ4_K, h);
  EXPECT_EQ(z[0], 33.0f - 48.0f);
  EXPECT_EQ(z[4 * 32], 63.0f - 17.0f);
  EXPECT_EQ(z[32], 0.0f);  // sub-block 1: scale 0, min 0
}

TEST(ConvertedTypes, Q5KFifthBitComesFromQh) {
  BlockQ5K b{};
  b.d = Fp32ToFp16(1.0f);
  b.dmin = Fp32ToFp16(0.0f);
  const uint8_t scales[12] = {1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1};  // every sc 1, min 0
  std::memcpy(b.scales, scales, 12);
  std::memset(b.qs, 0x00, sizeof(b.qs));
  for (int l = 0; l < 32; ++l) b.qh[l] = static_cast<uint8_t>(1u << (l % 8));  // sub-block l%8
  const std::vector<float> y = Decode(GgmlType::kQ5_K, b);
  for (int i = 0; i < 256; ++i) {
    const int j = i / 32, l = i % 32;
    ASSERT_EQ(y[i], l % 8 == j ? 16.0f : 0.0f) << "value " << i;
  }
}

// Q5_0 / Q5_1: value i's fifth bit is bit i of the little-endian qh.
TEST(ConvertedTypes, Q5DecodeHandBuiltBlocks) {
  BlockQ5_0 a{};
  a.d = Fp32ToFp16(0.5f);
  const uint32_t qh = 0x80010002u;  // values 1, 16 and 31 have the fifth bit
  std::memcpy(a.qh, &qh, 4);
  for (int j = 0; j < 16; ++j) a.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  float y[32];
  DequantizeRow(GgmlType::kQ5_0, &a, y, 32);
  for (int i = 0; i < 32; ++i) {
    const int q = (i < 16 ? i : 15 - (i - 16)) + (i == 1 || i == 16 || i == 31 ? 16 : 0);
    ASSERT_EQ(y[i], 0.5f * static_cast<float>(q - 16)) << i;
  }
  BlockQ5_1 b{};
  b.d = Fp32ToFp16(0.25f);
  b.m = Fp32ToFp16(-1.0f);
  std::memcpy(b.qh, &qh, 4);
  std::memcpy(b.qs, a.qs, 16);
  DequantizeRow(GgmlType::kQ5_1, &b, y, 32);
  for (int i = 0; i < 32; ++i) {
    const int q = (i < 16 ? i : 15 - (i - 16)) + (i == 1 || i == 16 || i == 31 ? 16 : 0);
    ASSERT_EQ(y[i], 0.25f * static_cast<float>(q) - 1.0f) << i;
  }
  // Q5_0 converts to Q8_0 exactly.
  BlockQ8_0 c;
  ConvertRowToComputeType(GgmlType::kQ5_0, &a, &c, 32);
  float z[32];
  DequantizeRow(GgmlType::kQ5_0, &a, y, 32);
  DequantizeRow(GgmlType::kQ8_0, &c, z, 32);
  for (int i = 0; i < 32; ++i) ASSERT_EQ(z[i], y[i]) << i;
}

TEST(ConvertedTypes, Q6KDecodesHandBuiltBlock) {
  BlockQ6K b{};
  b.d = Fp32ToFp16(0.5f);
  for (int i = 0; i < 16; ++i) b.scales[i] = static_cast<int8_t>(i % 2 == 0 ? i + 1 : -(i + 1));
  // Codes: value 128h + 32r + l gets code (r * 16 + l % 16) ^ (h * 63): low nibbles from ql,
  // top 2 bits from qh.
  std::vector<int> code(256);
  for (int h = 0; h < 2; ++h) {
    for (int r = 0; r < 4; ++r) {
      for (int l = 0; l < 32; ++l) code[128 * h + 32 * r + l] = (r * 16 + l % 16) ^ (h * 63);
    }
  }
  for (int h = 0; h < 2; ++h) {
    for (int l = 0; l < 32; ++l) {
      const int* v = code.data() + 128 * h;
      b.ql[64 * h + l] = static_cast<uint8_t>((v[l] & 15) | ((v[l + 64] & 15) << 4));
      b.ql[64 * h + 32 + l] = static_cast<uint8_t>((v[l + 32] & 15) | ((v[l + 96] & 15) << 4));
      b.qh[32 * h + l] = static_cast<uint8_t>((v[l] >> 4) | ((v[l + 32] >> 4) << 2) |
                                              ((v[l + 64] >> 4) << 4) | ((v[l + 96] >> 4) << 6));
    }
  }
  const std::vector<float> y = Decode(GgmlType::kQ6_K, b);
  for (int i = 0; i < 256; ++i) {
    const float want =
        0.5f * static_cast<float>(b.scales[i / 16]) * static_cast<float>(code[i] - 32);
    ASSERT_EQ(y[i], want) << "value " << i;
  }
}

std::vector<float> RandomRow(int cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> log_scale(-4.0f, 4.0f);
  std::vector<float> x(cols);
  for (int b = 0; b * 32 < cols; ++b) {
    const float scale = std::exp2(log_scale(rng));
    const float shift = b % 3 == 0 ? 2.0f * scale : 0.0f;  // some all-positive sub-blocks
    for (int j = 0; j < 32; ++j) x[32 * b + j] = shift + scale * normal(rng);
  }
  return x;
}

class ConvertedRowTest : public ::testing::TestWithParam<std::tuple<GgmlType, int>> {};

// Encode then decode: each value within a step of its sub-block's grid (RMS well under).
TEST_P(ConvertedRowTest, RoundTripStaysOnTheGrid) {
  const auto [type, cols] = GetParam();
  const std::vector<float> x = RandomRow(cols, static_cast<uint32_t>(cols) + 3);
  std::vector<uint8_t> q(GgmlRowBytes(type, cols));
  std::vector<float> y(cols);
  QuantizeRow(type, x.data(), q.data(), cols);
  DequantizeRow(type, q.data(), y.data(), cols);
  const bool k = GgmlBlockSize(type) == 256;
  const int sub = type == GgmlType::kQ6_K ? 16 : 32;
  const double levels = type == GgmlType::kQ4_K                              ? 15
                        : type == GgmlType::kQ5_K || type == GgmlType::kQ5_1 ? 31
                        : type == GgmlType::kQ5_0                            ? 32
                                                                             : 62;
  const double h = std::ldexp(1.0, -10);
  for (int s = 0; s * sub < cols; ++s) {
    double lo = 0, hi = 0, sq = 0;
    for (int j = s * sub; j < (s + 1) * sub; ++j) {
      lo = std::min(lo, static_cast<double>(x[j]));
      hi = std::max(hi, static_cast<double>(x[j]));
    }
    // The encoder rounds scales and mins up to multiples of the super-block's factors (so
    // nothing clips): a sub-block's step exceeds span / levels by at most those factors,
    // ~max|x| / 63 of the super-block over the levels.
    // Q5_0 / Q5_1 (ggml's reference rounding): half a step of their own grid plus the f16
    // rounding of d and m, except that Q5_0 may clip its far end by a whole step.
    double super = 0;
    const int sb = s * sub / 256;
    for (int j = sb * 256; j < (sb + 1) * 256; ++j) {
      super = std::max(super, std::fabs(static_cast<double>(x[j])));
    }
    const bool symmetric = type == GgmlType::kQ6_K || type == GgmlType::kQ5_0;
    const double span = symmetric ? 2 * std::max(hi, -lo) : hi - lo;
    const double step = k ? (span + 4 * super / 63) / levels : span / levels;
    const double slack = k ? 1e-6 * super : (span + std::fabs(lo)) * h;
    const double steps = type == GgmlType::kQ5_0 ? 1.0 : 0.5;
    for (int j = s * sub; j < (s + 1) * sub; ++j) {
      const double e = std::fabs(static_cast<double>(y[j]) - x[j]);
      ASSERT_LE(e, steps * step + slack)
          << GgmlTypeName(static_cast<uint32_t>(type)) << " value " << j;
      sq += e * e;
    }
    EXPECT_LE(std::sqrt(sq / sub), 0.4 * step + slack);
  }
}

// The load-time conversion agrees with exact decoding: Q4_K -> Q4_1 up to the f16 rounding
// of each sub-block's scale and offset; Q5_K / Q6_K -> Q8_0 up to half a Q8_0 step.
TEST_P(ConvertedRowTest, ConversionMatchesExactDecoding) {
  const auto [type, cols] = GetParam();
  const std::vector<float> x = RandomRow(cols, static_cast<uint32_t>(cols) * 7 + 1);
  std::vector<uint8_t> q(GgmlRowBytes(type, cols));
  QuantizeRow(type, x.data(), q.data(), cols);
  std::vector<float> exact(cols), converted(cols);
  DequantizeRow(type, q.data(), exact.data(), cols);
  const GgmlType ct = ComputeTypeOf(type);
  std::vector<uint8_t> c(GgmlRowBytes(ct, cols));
  ConvertRowToComputeType(type, q.data(), c.data(), cols);
  DequantizeRow(ct, c.data(), converted.data(), cols);
  const double h = std::ldexp(1.0, -11);
  for (int b = 0; b * 32 < cols; ++b) {
    double amax = 0;
    for (int j = 32 * b; j < 32 * b + 32; ++j)
      amax = std::max(amax, std::fabs(static_cast<double>(exact[j])));
    for (int j = 32 * b; j < 32 * b + 32; ++j) {
      const double bound = type == GgmlType::kQ5_0 ? 0.0  // exact
                           : ct == GgmlType::kQ4_1 ? 4 * amax * h + 1e-7
                                                   : amax / 254 + amax * h + 1e-7;
      ASSERT_LE(std::fabs(static_cast<double>(converted[j]) - exact[j]), bound)
          << GgmlTypeName(static_cast<uint32_t>(type)) << " value " << j;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Types, ConvertedRowTest,
    ::testing::Combine(::testing::Values(GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ4_K,
                                         GgmlType::kQ5_K, GgmlType::kQ6_K),
                       ::testing::Values(256, 768, 2048)),
    [](const auto& info) {
      return std::string(GgmlTypeName(static_cast<uint32_t>(std::get<0>(info.param)))) + "_" +
             std::to_string(std::get<1>(info.param));
    });

}  // namespace
}  // namespace specnode
