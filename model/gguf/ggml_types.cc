#include "model/gguf/ggml_types.h"

#include <algorithm>
#include <array>
#include <cassert>
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "model/gguf/ggml_converted_types.h"

namespace specnode {
namespace {

// Names for every type number ggml has used, supported or not, so error messages about
// foreign files say "Q4_K" rather than a bare number. Gaps were removed from ggml.
constexpr std::string_view kKnownNames[] = {
    "F32",    "F16",   "Q4_0",  "Q4_1",   "",      "",      "Q5_0",    "Q5_1",   "Q8_0",    "Q8_1",
    "Q2_K",   "Q3_K",  "Q4_K",  "Q5_K",   "Q6_K",  "Q8_K",  "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S",
    "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS", "I8",    "I16",   "I32",     "I64",    "F64",     "IQ1_M",
    "BF16",   "",      "",      "",       "TQ1_0", "TQ2_0", "",        "",       "",        "MXFP4",
};
constexpr uint32_t kNamedTypes = sizeof(kKnownNames) / sizeof(kKnownNames[0]);

// "type#N" strings must outlive the call (we return string_view), so they live in a table
// built once. Numbers past the table share one name; callers that need the exact number
// print it themselves (the GGUF reader does).
constexpr uint32_t kNumberedTypes = 1024;

const std::array<std::string, kNumberedTypes>& NumberedNames() {
  static const auto* names = [] {
    auto* t = new std::array<std::string, kNumberedTypes>;
    for (uint32_t i = 0; i < kNumberedTypes; ++i) (*t)[i] = absl::StrCat("type#", i);
    return t;
  }();
  return *names;
}

uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// ggml casts (x + 8.5f) etc. straight to an integer; that is undefined for NaN or huge
// values in C++, so clamp first. For finite in-range inputs this equals the plain cast.
int TruncClamp(float v, int hi) {
  if (!(v >= 0.0f)) return 0;  // also catches NaN
  if (v >= static_cast<float>(hi)) return hi;
  return static_cast<int>(v);
}

int8_t RoundClampI8(float v) {
  if (std::isnan(v)) return 0;
  float r = std::round(v);
  return static_cast<int8_t>(std::clamp(r, -128.0f, 127.0f));
}

void QuantizeQ4_0(const float* x, uint8_t* dst, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += kQuantBlock, dst += sizeof(BlockQ4_0)) {
    BlockQ4_0 y;
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < kQuantBlock; ++j) {
      if (amax < std::fabs(x[j])) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y.d = Fp32ToFp16(d);
    for (int j = 0; j < kQuantBlock / 2; ++j) {
      const int q0 = TruncClamp(x[j] * id + 8.5f, 15);
      const int q1 = TruncClamp(x[kQuantBlock / 2 + j] * id + 8.5f, 15);
      y.qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
    std::memcpy(dst, &y, sizeof(y));
  }
}

void QuantizeQ4_1(const float* x, uint8_t* dst, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += kQuantBlock, dst += sizeof(BlockQ4_1)) {
    BlockQ4_1 y;
    float min = x[0], max = x[0];
    for (int j = 1; j < kQuantBlock; ++j) {
      if (x[j] < min) min = x[j];
      if (x[j] > max) max = x[j];
    }
    const float d = (max - min) / 15.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y.d = Fp32ToFp16(d);
    y.m = Fp32ToFp16(min);
    for (int j = 0; j < kQuantBlock / 2; ++j) {
      const int q0 = TruncClamp((x[j] - min) * id + 0.5f, 15);
      const int q1 = TruncClamp((x[kQuantBlock / 2 + j] - min) * id + 0.5f, 15);
      y.qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
    std::memcpy(dst, &y, sizeof(y));
  }
}

void QuantizeQ8_0(const float* x, uint8_t* dst, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += kQuantBlock, dst += sizeof(BlockQ8_0)) {
    BlockQ8_0 y;
    float amax = 0.0f;
    for (int j = 0; j < kQuantBlock; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y.d = Fp32ToFp16(d);
    for (int j = 0; j < kQuantBlock; ++j) y.qs[j] = RoundClampI8(x[j] * id);
    std::memcpy(dst, &y, sizeof(y));
  }
}

}  // namespace

bool IsSupportedGgmlType(uint32_t raw) {
  switch (static_cast<GgmlType>(raw)) {
    case GgmlType::kF32:
    case GgmlType::kF16:
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1:
    case GgmlType::kQ8_0:
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
    case GgmlType::kBF16:
      return true;
  }
  return false;
}

bool IsComputeGgmlType(GgmlType type) {
  return IsSupportedGgmlType(static_cast<uint32_t>(type)) && !IsConvertedType(type);
}

std::string_view GgmlTypeName(uint32_t raw) {
  if (raw < kNamedTypes && !kKnownNames[raw].empty()) return kKnownNames[raw];
  if (raw < kNumberedTypes) return NumberedNames()[raw];
  return "type#>1023";
}

int GgmlBlockSize(GgmlType type) {
  switch (type) {
    case GgmlType::kF32:
    case GgmlType::kF16:
    case GgmlType::kBF16:
      return 1;
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1:
    case GgmlType::kQ8_0:
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1:
      return kQuantBlock;
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
      return kKQuantBlock;
  }
  assert(false && "GgmlBlockSize: unsupported type");
  return 1;
}

size_t GgmlBlockBytes(GgmlType type) {
  switch (type) {
    case GgmlType::kF32:
      return 4;
    case GgmlType::kF16:
    case GgmlType::kBF16:
      return 2;
    case GgmlType::kQ4_0:
      return sizeof(BlockQ4_0);
    case GgmlType::kQ4_1:
      return sizeof(BlockQ4_1);
    case GgmlType::kQ8_0:
      return sizeof(BlockQ8_0);
    case GgmlType::kQ5_0:
      return sizeof(BlockQ5_0);
    case GgmlType::kQ5_1:
      return sizeof(BlockQ5_1);
    case GgmlType::kQ4_K:
      return sizeof(BlockQ4K);
    case GgmlType::kQ5_K:
      return sizeof(BlockQ5K);
    case GgmlType::kQ6_K:
      return sizeof(BlockQ6K);
  }
  assert(false && "GgmlBlockBytes: unsupported type");
  return 1;
}

float Fp16ToFp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24, exact in float.
    const float v = static_cast<float>(mant) * 5.9604644775390625e-08f;
    return sign ? -v : v;
  }
  if (exp == 31) return BitsFloat(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  return BitsFloat(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t Fp32ToFp16(float f) {
  uint32_t x = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) {
    if (x == 0x7f800000u) return sign | 0x7c00u;
    // NaN: keep the top payload bits, force quiet so it cannot become infinity.
    return static_cast<uint16_t>(sign | 0x7e00u | ((x >> 13) & 0x3ffu));
  }
  if (x >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 rounds to infinity
  if (x < 0x38800000u) {
    // Result is a half subnormal (or zero): units of 2^-24, rounded to nearest even.
    const uint32_t e = x >> 23;
    if (e < 102) return sign;  // below 2^-25: rounds to zero (2^-25 itself ties to 0)
    const uint32_t mant = (x & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;  // 14..24
    uint32_t q = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits. A
  // carry out of the mantissa correctly bumps the exponent.
  uint32_t h = (x - 0x38000000u) >> 13;
  const uint32_t rem = x & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

uint16_t Fp32ToBf16(float f) {
  const uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet
  return static_cast<uint16_t>((u + (0x7fffu + ((u >> 16) & 1u))) >> 16);
}

void DequantizeRow(GgmlType type, const void* src, float* dst, int64_t cols) {
  assert(cols % GgmlBlockSize(type) == 0);
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(cols) * 4);
      return;
    case GgmlType::kF16: {
      const auto* s = static_cast<const uint8_t*>(src);
      for (int64_t i = 0; i < cols; ++i) {
        uint16_t h;
        std::memcpy(&h, s + 2 * i, 2);
        dst[i] = Fp16ToFp32(h);
      }
      return;
    }
    case GgmlType::kBF16: {
      const auto* s = static_cast<const uint8_t*>(src);
      for (int64_t i = 0; i < cols; ++i) {
        uint16_t h;
        std::memcpy(&h, s + 2 * i, 2);
        dst[i] = Bf16ToFp32(h);
      }
      return;
    }
    case GgmlType::kQ4_0: {
      const auto* bytes = static_cast<const uint8_t*>(src);
      for (int64_t b = 0; b < cols / kQuantBlock; ++b, dst += kQuantBlock) {
        BlockQ4_0 blk;
        std::memcpy(&blk, bytes + b * sizeof(blk), sizeof(blk));
        const float d = Fp16ToFp32(blk.d);
        for (int j = 0; j < kQuantBlock / 2; ++j) {
          dst[j] = static_cast<float>((blk.qs[j] & 0x0f) - 8) * d;
          dst[j + kQuantBlock / 2] = static_cast<float>((blk.qs[j] >> 4) - 8) * d;
        }
      }
      return;
    }
    case GgmlType::kQ4_1: {
      const auto* bytes = static_cast<const uint8_t*>(src);
      for (int64_t b = 0; b < cols / kQuantBlock; ++b, dst += kQuantBlock) {
        BlockQ4_1 blk;
        std::memcpy(&blk, bytes + b * sizeof(blk), sizeof(blk));
        const float d = Fp16ToFp32(blk.d);
        const float m = Fp16ToFp32(blk.m);
        for (int j = 0; j < kQuantBlock / 2; ++j) {
          dst[j] = static_cast<float>(blk.qs[j] & 0x0f) * d + m;
          dst[j + kQuantBlock / 2] = static_cast<float>(blk.qs[j] >> 4) * d + m;
        }
      }
      return;
    }
    case GgmlType::kQ8_0: {
      const auto* bytes = static_cast<const uint8_t*>(src);
      for (int64_t b = 0; b < cols / kQuantBlock; ++b, dst += kQuantBlock) {
        BlockQ8_0 blk;
        std::memcpy(&blk, bytes + b * sizeof(blk), sizeof(blk));
        const float d = Fp16ToFp32(blk.d);
        for (int j = 0; j < kQuantBlock; ++j) dst[j] = static_cast<float>(blk.qs[j]) * d;
      }
      return;
    }
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
      DequantizeConvertedRow(type, src, dst, cols);
      return;
  }
  assert(false && "DequantizeRow: unsupported type");
}

void QuantizeRow(GgmlType type, const float* src, void* dst, int64_t cols) {
  assert(cols % GgmlBlockSize(type) == 0);
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(cols) * 4);
      return;
    case GgmlType::kF16:
    case GgmlType::kBF16: {
      auto* d = static_cast<uint8_t*>(dst);
      for (int64_t i = 0; i < cols; ++i) {
        const uint16_t h = type == GgmlType::kF16 ? Fp32ToFp16(src[i]) : Fp32ToBf16(src[i]);
        std::memcpy(d + 2 * i, &h, 2);
      }
      return;
    }
    case GgmlType::kQ4_0:
      QuantizeQ4_0(src, static_cast<uint8_t*>(dst), cols / kQuantBlock);
      return;
    case GgmlType::kQ4_1:
      QuantizeQ4_1(src, static_cast<uint8_t*>(dst), cols / kQuantBlock);
      return;
    case GgmlType::kQ8_0:
      QuantizeQ8_0(src, static_cast<uint8_t*>(dst), cols / kQuantBlock);
      return;
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
      QuantizeConvertedRow(type, src, dst, cols);
      return;
  }
  assert(false && "QuantizeRow: unsupported type");
}

}  // namespace specnode
