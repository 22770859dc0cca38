#include "model/gguf/ggml_converted_types.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>

namespace specnode {
namespace {

// Sub-block j's 6-bit scale and min (ggml's get_scale_min_k4).
void ScaleMin(const uint8_t* s, int j, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// The inverse of ScaleMin for 8 pairs of 6-bit values.
void PackScaleMin(const int* sc, const int* m, uint8_t* s) {
  for (int j = 0; j < 4; ++j) {
    s[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    s[j + 4] = static_cast<uint8_t>(m[j] | ((m[j + 4] >> 4) << 6));
    s[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0x0F) | ((m[j + 4] & 0x0F) << 4));
  }
}

int RoundClamp(float v, int lo, int hi) {
  return std::clamp(static_cast<int>(std::nearbyint(v)), lo, hi);
}

int CeilClamp(float v, int lo, int hi) {
  return std::clamp(static_cast<int>(std::ceil(v)), lo, hi);
}

// An f16 super-block factor no smaller than v (so 6- or 8-bit multiples of it reach v).
uint16_t Fp16AtLeast(float v) { return Fp32ToFp16(v * (1.0f + 1.0f / 512.0f)); }

// Q4_K / Q5_K: the 256 values' 4-bit (or 5-bit, with qh) codes.
template <typename Block>
void AffineCodes(const Block& b, const uint8_t* qh, uint8_t* q) {
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      const uint8_t byte = b.qs[32 * c + l];
      q[64 * c + l] = byte & 0x0F;
      q[64 * c + 32 + l] = byte >> 4;
    }
  }
  if (qh != nullptr) {
    for (int j = 0; j < 8; ++j) {
      for (int l = 0; l < 32; ++l) q[32 * j + l] |= ((qh[l] >> j) & 1) << 4;
    }
  }
}

// Q4_K / Q5_K: the codes q[256] and, per 32-value sub-block, the factors d * sc_j and
// dmin * m_j.
template <typename Block>
void DecodeAffine(const Block& b, const uint8_t* qh, uint8_t* q, float* scale, float* offset) {
  const float d = Fp16ToFp32(b.d);
  const float dmin = Fp16ToFp32(b.dmin);
  for (int j = 0; j < 8; ++j) {
    int sc, m;
    ScaleMin(b.scales, j, &sc, &m);
    scale[j] = d * static_cast<float>(sc);
    offset[j] = dmin * static_cast<float>(m);
  }
  AffineCodes(b, qh, q);
}

// Q6_K: the 6-bit codes (value = d * sc * (code - 32)).
void Q6KCodes(const BlockQ6K& b, uint8_t* q) {
  for (int h = 0; h < 2; ++h) {
    const uint8_t* ql = b.ql + 64 * h;
    const uint8_t* qh = b.qh + 32 * h;
    uint8_t* out = q + 128 * h;
    for (int l = 0; l < 32; ++l) {
      out[l] = static_cast<uint8_t>((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4));
      out[l + 32] = static_cast<uint8_t>((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4));
      out[l + 64] = static_cast<uint8_t>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
      out[l + 96] = static_cast<uint8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
    }
  }
}

// Q6_K: codes q - 32 in [-32, 31] and the per-16 scales d * sc.
void DecodeQ6K(const BlockQ6K& b, int8_t* q, float* scale) {
  const float d = Fp16ToFp32(b.d);
  for (int i = 0; i < 16; ++i) scale[i] = d * static_cast<float>(b.scales[i]);
  uint8_t codes[kKQuantBlock];
  Q6KCodes(b, codes);
  for (int i = 0; i < kKQuantBlock; ++i) q[i] = static_cast<int8_t>(codes[i] - 32);
}

// Q5_0 / Q5_1: the 32 five-bit codes.
template <typename Block>
void DecodeQ5(const Block& b, uint8_t* q) {
  uint32_t qh;
  std::memcpy(&qh, b.qh, 4);
  for (int j = 0; j < 16; ++j) {
    q[j] = static_cast<uint8_t>((b.qs[j] & 0x0F) | (((qh >> j) & 1) << 4));
    q[j + 16] = static_cast<uint8_t>((b.qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
  }
}

template <typename Block>
void EncodeQ5(const uint8_t* q, Block* b) {
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    b->qs[j] = static_cast<uint8_t>((q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4));
    qh |= static_cast<uint32_t>((q[j] >> 4) & 1) << j;
    qh |= static_cast<uint32_t>((q[j + 16] >> 4) & 1) << (j + 16);
  }
  std::memcpy(b->qh, &qh, 4);
}

void DequantizeBlock(GgmlType type, const uint8_t* src, float* y) {
  if (type == GgmlType::kQ5_0 || type == GgmlType::kQ5_1) {
    uint8_t q[32];
    if (type == GgmlType::kQ5_0) {
      BlockQ5_0 b;
      std::memcpy(&b, src, sizeof(b));
      DecodeQ5(b, q);
      const float d = Fp16ToFp32(b.d);
      for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(q[j] - 16) * d;
    } else {
      BlockQ5_1 b;
      std::memcpy(&b, src, sizeof(b));
      DecodeQ5(b, q);
      const float d = Fp16ToFp32(b.d), m = Fp16ToFp32(b.m);
      for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(q[j]) * d + m;
    }
    return;
  }
  if (type == GgmlType::kQ6_K) {
    BlockQ6K b;
    std::memcpy(&b, src, sizeof(b));
    int8_t q[kKQuantBlock];
    float scale[16];
    DecodeQ6K(b, q, scale);
    for (int i = 0; i < kKQuantBlock; ++i) y[i] = scale[i / 16] * static_cast<float>(q[i]);
    return;
  }
  uint8_t q[kKQuantBlock];
  float scale[8], offset[8];
  if (type == GgmlType::kQ4_K) {
    BlockQ4K b;
    std::memcpy(&b, src, sizeof(b));
    DecodeAffine(b, nullptr, q, scale, offset);
  } else {
    BlockQ5K b;
    std::memcpy(&b, src, sizeof(b));
    DecodeAffine(b, b.qh, q, scale, offset);
  }
  for (int i = 0; i < kKQuantBlock; ++i) {
    y[i] = scale[i / 32] * static_cast<float>(q[i]) - offset[i / 32];
  }
}

// Q4_K / Q5_K encoding with `levels` - 1 as the largest code: per sub-block an affine grid
// from -dmin * m_j (at or below min(0, lo)) up to at least hi, its min and scale rounded up
// to 6-bit multiples of the block's factors so the grid always covers the values.
template <typename Block>
void EncodeAffine(const float* x, int levels, Block* b, uint8_t* q) {
  float hi[8], minv[8], max_min = 0.0f;
  for (int j = 0; j < 8; ++j) {
    const float* s = x + 32 * j;
    minv[j] = -std::min(0.0f, *std::min_element(s, s + 32));
    hi[j] = *std::max_element(s, s + 32);
    max_min = std::max(max_min, minv[j]);
  }
  b->dmin = Fp16AtLeast(max_min / 63.0f);
  const float dmin = Fp16ToFp32(b->dmin);
  int sc[8], m[8];
  float needed[8], max_needed = 0.0f;
  for (int j = 0; j < 8; ++j) {
    m[j] = dmin > 0.0f ? CeilClamp(minv[j] / dmin, 0, 63) : 0;
    needed[j] = (hi[j] + dmin * static_cast<float>(m[j])) / static_cast<float>(levels - 1);
    max_needed = std::max(max_needed, needed[j]);
  }
  b->d = Fp16AtLeast(max_needed / 63.0f);
  const float d = Fp16ToFp32(b->d);
  for (int j = 0; j < 8; ++j) {
    sc[j] = d > 0.0f ? CeilClamp(needed[j] / d, 0, 63) : 0;
    const float step = d * static_cast<float>(sc[j]);
    const float off = dmin * static_cast<float>(m[j]);
    for (int l = 0; l < 32; ++l) {
      const int i = 32 * j + l;
      q[i] = step > 0.0f ? static_cast<uint8_t>(RoundClamp((x[i] + off) / step, 0, levels - 1)) : 0;
    }
  }
  PackScaleMin(sc, m, b->scales);
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      b->qs[32 * c + l] =
          static_cast<uint8_t>((q[64 * c + l] & 0x0F) | ((q[64 * c + 32 + l] & 0x0F) << 4));
    }
  }
}

void QuantizeBlock(GgmlType type, const float* x, uint8_t* dst) {
  uint8_t q[kKQuantBlock];
  if (type == GgmlType::kQ5_0) {
    // ggml's reference: the scale maps the largest-magnitude value to code 0.
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 32; ++j) {
      if (std::fabs(x[j]) > amax) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    const float d = max / -16.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    BlockQ5_0 b{};
    b.d = Fp32ToFp16(d);
    for (int j = 0; j < 32; ++j) {
      q[j] = static_cast<uint8_t>(
          std::min(31, static_cast<int>(static_cast<int8_t>(x[j] * id + 16.5f))));
    }
    EncodeQ5(q, &b);
    std::memcpy(dst, &b, sizeof(b));
    return;
  }
  if (type == GgmlType::kQ5_1) {
    const float lo = *std::min_element(x, x + 32), hi = *std::max_element(x, x + 32);
    const float d = (hi - lo) / 31.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    BlockQ5_1 b{};
    b.d = Fp32ToFp16(d);
    b.m = Fp32ToFp16(lo);
    for (int j = 0; j < 32; ++j) {
      q[j] = static_cast<uint8_t>(std::min(31, static_cast<int>((x[j] - lo) * id + 0.5f)));
    }
    EncodeQ5(q, &b);
    std::memcpy(dst, &b, sizeof(b));
    return;
  }
  if (type == GgmlType::kQ4_K) {
    BlockQ4K b{};
    EncodeAffine(x, 16, &b, q);
    std::memcpy(dst, &b, sizeof(b));
  } else if (type == GgmlType::kQ5_K) {
    BlockQ5K b{};
    EncodeAffine(x, 32, &b, q);
    for (int l = 0; l < 32; ++l) {
      uint8_t bits = 0;
      for (int j = 0; j < 8; ++j) bits |= static_cast<uint8_t>(((q[32 * j + l] >> 4) & 1) << j);
      b.qh[l] = bits;
    }
    std::memcpy(dst, &b, sizeof(b));
  } else {
    BlockQ6K b{};
    float scale[16], max_scale = 0.0f;
    for (int i = 0; i < 16; ++i) {
      float amax = 0.0f;
      for (int l = 0; l < 16; ++l) amax = std::max(amax, std::fabs(x[16 * i + l]));
      scale[i] = amax / 31.0f;
      max_scale = std::max(max_scale, scale[i]);
    }
    b.d = Fp16AtLeast(max_scale / 127.0f);
    const float d = Fp16ToFp32(b.d);
    int code[kKQuantBlock];  // q + 32 in [0, 63]
    for (int i = 0; i < 16; ++i) {
      b.scales[i] = static_cast<int8_t>(d > 0.0f ? CeilClamp(scale[i] / d, 0, 127) : 0);
      const float step = d * static_cast<float>(b.scales[i]);
      for (int l = 0; l < 16; ++l) {
        const int k = 16 * i + l;
        code[k] = (step > 0.0f ? RoundClamp(x[k] / step, -32, 31) : 0) + 32;
      }
    }
    for (int h = 0; h < 2; ++h) {
      const int* v = code + 128 * h;
      for (int l = 0; l < 32; ++l) {
        b.ql[64 * h + l] = static_cast<uint8_t>((v[l] & 0x0F) | ((v[l + 64] & 0x0F) << 4));
        b.ql[64 * h + 32 + l] =
            static_cast<uint8_t>((v[l + 32] & 0x0F) | ((v[l + 96] & 0x0F) << 4));
        b.qh[32 * h + l] = static_cast<uint8_t>((v[l] >> 4) | ((v[l + 32] >> 4) << 2) |
                                                ((v[l + 64] >> 4) << 4) | ((v[l + 96] >> 4) << 6));
      }
    }
    std::memcpy(dst, &b, sizeof(b));
  }
}

}  // namespace

void DequantizeConvertedRow(GgmlType type, const void* src, float* dst, int64_t cols) {
  const int bs = GgmlBlockSize(type);
  assert(IsConvertedType(type) && cols % bs == 0);
  const auto* bytes = static_cast<const uint8_t*>(src);
  const size_t bb = GgmlBlockBytes(type);
  for (int64_t b = 0; b < cols / bs; ++b) DequantizeBlock(type, bytes + b * bb, dst + b * bs);
}

void QuantizeConvertedRow(GgmlType type, const float* src, void* dst, int64_t cols) {
  const int bs = GgmlBlockSize(type);
  assert(IsConvertedType(type) && cols % bs == 0);
  auto* bytes = static_cast<uint8_t*>(dst);
  const size_t bb = GgmlBlockBytes(type);
  for (int64_t b = 0; b < cols / bs; ++b) QuantizeBlock(type, src + b * bs, bytes + b * bb);
}

void DecodeQ5Block(GgmlType type, const void* src, Q5Codes* out) {
  assert(type == GgmlType::kQ5_0 || type == GgmlType::kQ5_1);
  *out = Q5Codes{};
  if (type == GgmlType::kQ5_0) {
    BlockQ5_0 b;
    std::memcpy(&b, src, sizeof(b));
    out->d = b.d;
    DecodeQ5(b, out->q);
    return;
  }
  BlockQ5_1 b;
  std::memcpy(&b, src, sizeof(b));
  out->d = b.d;
  out->m = b.m;
  DecodeQ5(b, out->q);
}

void DecodeKQuantBlock(GgmlType type, const void* src, KQuantCodes* out) {
  assert(IsKQuantType(type));
  *out = KQuantCodes{};
  if (type == GgmlType::kQ6_K) {
    BlockQ6K b;
    std::memcpy(&b, src, sizeof(b));
    out->d = b.d;
    std::memcpy(out->sc, b.scales, 16);
    Q6KCodes(b, out->q);
    return;
  }
  auto affine = [&](const auto& b, const uint8_t* qh) {
    out->d = b.d;
    out->dmin = b.dmin;
    for (int j = 0; j < 8; ++j) {
      int sc, m;
      ScaleMin(b.scales, j, &sc, &m);
      out->sc[j] = static_cast<uint8_t>(sc);
      out->m[j] = static_cast<uint8_t>(m);
    }
    AffineCodes(b, qh, out->q);
  };
  if (type == GgmlType::kQ4_K) {
    BlockQ4K b;
    std::memcpy(&b, src, sizeof(b));
    affine(b, nullptr);
  } else {
    BlockQ5K b;
    std::memcpy(&b, src, sizeof(b));
    affine(b, b.qh);
  }
}

GgmlType ComputeTypeOf(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_K:
      return GgmlType::kQ4_1;
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
      return GgmlType::kQ8_0;
    default:
      return type;
  }
}

void ConvertRowToComputeType(GgmlType type, const void* src, void* dst, int64_t cols) {
  const int bs = GgmlBlockSize(type);
  assert(IsConvertedType(type) && cols % bs == 0);
  const auto* in = static_cast<const uint8_t*>(src);
  auto* out = static_cast<uint8_t*>(dst);
  const size_t bb = GgmlBlockBytes(type);
  if (type == GgmlType::kQ5_0) {
    // Exact: Q8_0 with the same scale and the codes re-centred.
    for (int64_t b = 0; b < cols / bs; ++b) {
      BlockQ5_0 k;
      std::memcpy(&k, in + b * bb, sizeof(k));
      uint8_t q[32];
      DecodeQ5(k, q);
      BlockQ8_0 o;
      o.d = k.d;
      for (int j = 0; j < 32; ++j) o.qs[j] = static_cast<int8_t>(q[j] - 16);
      std::memcpy(out + b * sizeof(BlockQ8_0), &o, sizeof(o));
    }
    return;
  }
  if (type != GgmlType::kQ4_K) {
    // Requantised from the exact values, one block at a time.
    float values[kKQuantBlock];
    const size_t out_bytes = GgmlRowBytes(GgmlType::kQ8_0, bs);
    for (int64_t b = 0; b < cols / bs; ++b) {
      DequantizeBlock(type, in + b * bb, values);
      QuantizeRow(GgmlType::kQ8_0, values, out + b * out_bytes, bs);
    }
    return;
  }
  for (int64_t b = 0; b < cols / kKQuantBlock; ++b) {
    BlockQ4K k;
    std::memcpy(&k, in + b * sizeof(BlockQ4K), sizeof(k));
    uint8_t q[kKQuantBlock];
    float scale[8], offset[8];
    DecodeAffine(k, nullptr, q, scale, offset);
    for (int j = 0; j < 8; ++j) {
      BlockQ4_1 o;
      o.d = Fp32ToFp16(scale[j]);
      o.m = Fp32ToFp16(-offset[j]);
      const uint8_t* s = q + 32 * j;
      for (int l = 0; l < 16; ++l) o.qs[l] = static_cast<uint8_t>(s[l] | (s[l + 16] << 4));
      std::memcpy(out + (b * 8 + j) * sizeof(BlockQ4_1), &o, sizeof(o));
    }
  }
}

}  // namespace specnode
