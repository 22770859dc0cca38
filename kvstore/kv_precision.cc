#include "kvstore/kv_precision.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "kvstore/kv_row_codec.h"
#include "model/gguf/ggml_types.h"

namespace specnode {

std::string_view KvPrecisionName(KvPrecision p) {
  switch (p) {
    case KvPrecision::kFull:
      return "f16";
    case KvPrecision::kInt8:
      return "int8";
    case KvPrecision::kInt4:
      return "int4";
    case KvPrecision::kInt2:
      return "int2";
  }
  return "?";
}

size_t KvRowBytes(KvPrecision p, int head_dim) {
  switch (p) {
    case KvPrecision::kFull:
      return 2 * static_cast<size_t>(head_dim);
    case KvPrecision::kInt8:
      return 4 + static_cast<size_t>(head_dim);
    case KvPrecision::kInt4:
      return 4 + static_cast<size_t>(head_dim) / 2;
    case KvPrecision::kInt2:
      return 4 + (static_cast<size_t>(head_dim) + 3) / 4;
  }
  return 0;
}

size_t KvPairBytes(KvPrecision c, int head_dim) {
  return KvRowBytes(KvRowFormat(c, false), head_dim) + KvRowBytes(KvRowFormat(c, true), head_dim);
}

namespace {

// Nearest integer, ties to even, as the quantisers of ggml_types do.
inline int RoundNearest(float v) { return static_cast<int>(std::nearbyint(v)); }

inline uint16_t LoadU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
inline void StoreU16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }

struct Int4Header {
  float scale;
  float min;
};
inline Int4Header LoadInt4Header(const uint8_t* row) {
  return {Fp16ToFp32(LoadU16(row)), Fp16ToFp32(LoadU16(row + 2))};
}
inline float LoadF32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}

}  // namespace

void KvEncodeRow(KvPrecision p, const float* x, int head_dim, uint8_t* row) {
  assert(head_dim % 2 == 0);
  switch (p) {
    case KvPrecision::kFull:
      for (int i = 0; i < head_dim; ++i) StoreU16(row + 2 * i, Fp32ToFp16(x[i]));
      return;
    case KvPrecision::kInt8: {
      float amax = 0.0f;
      for (int i = 0; i < head_dim; ++i) amax = std::max(amax, std::fabs(x[i]));
      const float scale = amax / 127.0f;
      const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
      std::memcpy(row, &scale, 4);
      for (int i = 0; i < head_dim; ++i) {
        row[4 + i] = static_cast<uint8_t>(static_cast<int8_t>(std::clamp(RoundNearest(x[i] * inv), -127, 127)));
      }
      return;
    }
    case KvPrecision::kInt4: {
      float lo = x[0], hi = x[0];
      for (int i = 1; i < head_dim; ++i) {
        lo = std::min(lo, x[i]);
        hi = std::max(hi, x[i]);
      }
      // The stored (f16-rounded) scale and min are what decoding uses, so quantise
      // against those, not the exact ones.
      const uint16_t scale_h = Fp32ToFp16((hi - lo) / 15.0f);
      const uint16_t min_h = Fp32ToFp16(lo);
      const float scale = Fp16ToFp32(scale_h);
      const float min = Fp16ToFp32(min_h);
      const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
      StoreU16(row, scale_h);
      StoreU16(row + 2, min_h);
      for (int i = 0; i < head_dim; i += 2) {
        const int q0 = std::clamp(RoundNearest((x[i] - min) * inv), 0, 15);
        const int q1 = std::clamp(RoundNearest((x[i + 1] - min) * inv), 0, 15);
        row[4 + i / 2] = static_cast<uint8_t>(q0 | (q1 << 4));
      }
      return;
    }
    case KvPrecision::kInt2:
      kv_codec::EncodeInt2Row(x, head_dim, row);
      return;
  }
}

void KvDecodeRow(KvPrecision p, const uint8_t* row, int head_dim, float* out) {
  switch (p) {
    case KvPrecision::kFull:
      for (int i = 0; i < head_dim; ++i) out[i] = Fp16ToFp32(LoadU16(row + 2 * i));
      return;
    case KvPrecision::kInt8: {
      const float scale = LoadF32(row);
      for (int i = 0; i < head_dim; ++i) out[i] = scale * static_cast<int8_t>(row[4 + i]);
      return;
    }
    case KvPrecision::kInt4: {
      const Int4Header h = LoadInt4Header(row);
      for (int i = 0; i < head_dim; i += 2) {
        const uint8_t b = row[4 + i / 2];
        out[i] = h.min + h.scale * (b & 15);
        out[i + 1] = h.min + h.scale * (b >> 4);
      }
      return;
    }
    case KvPrecision::kInt2:
      for (int i = 0; i < head_dim; ++i) out[i] = kv_codec::DecodeAt(kv_codec::kInt2, row, i);
      return;
  }
}

double KvMaxAbsError(KvPrecision p, double lo, double hi) {
  const double amax = std::max(std::fabs(lo), std::fabs(hi));
  switch (p) {
    case KvPrecision::kFull:
      return amax * std::ldexp(1.0, -11) + 6e-8;  // half: 11-bit significand, subnormal floor
    case KvPrecision::kInt8:
      return amax / 127.0 / 2.0 * 1.0001;
    case KvPrecision::kInt4:
      // scale and min are themselves f16-rounded; allow for both.
      return (hi - lo) / 15.0 / 2.0 * 1.01 + amax * std::ldexp(1.0, -10) + 6e-8;
    case KvPrecision::kInt2:
      // Every value lies in [lo, hi] and is stored as the nearest of four levels centred on
      // the mean, spaced by at most 2 sigma <= (hi - lo): clipped or not, within the span
      // (plus the f16 rounding of scale and min).
      return (hi - lo) * 1.01 + amax * std::ldexp(1.0, -9) + 6e-8;
  }
  return 0.0;
}

bool IsPowerOfTwo(int n) { return n > 0 && (n & (n - 1)) == 0; }

void HadamardInPlace(float* x, int n) {
  assert(IsPowerOfTwo(n));
  // Every output of a stage is one a + b or a - b of the same two inputs whatever the
  // vector width, so the SSE2 stages give the scalar butterflies' bits (checked against
  // kv_codec::Hadamard, the scalar form, in kv_pool_host_test and kv_precision_test).
#if defined(__SSE2__)
  if (n >= 4) {
    for (int i = 0; i < n; i += 4) {
      // len 1: [x0 + x1, x0 - x1, x2 + x3, x2 - x3]
      const __m128 v = _mm_loadu_ps(x + i);
      const __m128 a1 = _mm_shuffle_ps(v, v, _MM_SHUFFLE(2, 2, 0, 0));
      const __m128 b1 = _mm_shuffle_ps(v, v, _MM_SHUFFLE(3, 3, 1, 1));
      const __m128 s1 = _mm_add_ps(a1, b1), d1 = _mm_sub_ps(a1, b1);
      const __m128 v1 =
          _mm_shuffle_ps(_mm_unpacklo_ps(s1, d1), _mm_unpackhi_ps(s1, d1), _MM_SHUFFLE(1, 0, 1, 0));
      // len 2: [y0 + y2, y1 + y3, y0 - y2, y1 - y3]
      const __m128 a2 = _mm_movelh_ps(v1, v1);
      const __m128 b2 = _mm_movehl_ps(v1, v1);
      const __m128 s2 = _mm_add_ps(a2, b2), d2 = _mm_sub_ps(a2, b2);
      _mm_storeu_ps(x + i, _mm_shuffle_ps(s2, d2, _MM_SHUFFLE(3, 2, 1, 0)));
    }
    for (int len = 4; len < n; len <<= 1) {
      for (int i = 0; i < n; i += 2 * len) {
        for (int j = i; j < i + len; j += 4) {
          const __m128 a = _mm_loadu_ps(x + j), b = _mm_loadu_ps(x + j + len);
          _mm_storeu_ps(x + j, _mm_add_ps(a, b));
          _mm_storeu_ps(x + j + len, _mm_sub_ps(a, b));
        }
      }
    }
    const __m128 norm = _mm_set1_ps(1.0f / std::sqrt(static_cast<float>(n)));
    for (int i = 0; i < n; i += 4) _mm_storeu_ps(x + i, _mm_mul_ps(_mm_loadu_ps(x + i), norm));
    return;
  }
#endif
  HadamardInPlaceScalar(x, n);
}

void HadamardInPlaceScalar(float* x, int n) {
  assert(IsPowerOfTwo(n));
  kv_codec::Hadamard(x, n);  // the butterflies the GPU runs too (kv_row_codec.h)
}

}  // namespace specnode
