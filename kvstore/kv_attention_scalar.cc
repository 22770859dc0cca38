// Portable attention kernels (the reference the SIMD tables are tested against, and the
// fallback for CPUs without AVX2 or head_dim % 16 != 0), and the kernel selection.
// Unlike the SIMD kernels, these decode one row at a time to a stack buffer.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kvstore/kv_attention_kernels.h"
#include "model/cpu/cpu_features.h"

namespace specnode::kv_kernels {
namespace {

// IEEE half to float, branch-light and inlinable (the same values as Fp16ToFp32): the
// half's exponent and mantissa placed in a float's low bits and scaled by 2^112 is exact
// for normal and subnormal halves; infinities and NaNs get the float's maximal exponent.
inline float HalfToFloat(uint16_t h) {
  const uint32_t em = h & 0x7fffu;
  uint32_t bits = em << 13;
  float f;
  std::memcpy(&f, &bits, 4);
  f *= 0x1p112f;
  std::memcpy(&bits, &f, 4);
  if (em >= 0x7c00u) bits = (em << 13) | 0x7f800000u;
  bits |= static_cast<uint32_t>(h & 0x8000u) << 16;
  std::memcpy(&f, &bits, 4);
  return f;
}

// codes[i] for values [d0, d0 + n) of a row (d0, n even): the value for f16, the integer
// for int8 / int4 / int2.
template <KvPrecision P>
inline void DecodeCodes(const uint8_t* row, int d0, int n, float* codes) {
  if constexpr (P == KvPrecision::kFull) {
    for (int i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, row + 2 * (d0 + i), 2);
      codes[i] = HalfToFloat(h);
    }
  } else if constexpr (P == KvPrecision::kInt8) {
    for (int i = 0; i < n; ++i) codes[i] = static_cast<int8_t>(row[4 + d0 + i]);
  } else if constexpr (P == KvPrecision::kInt2) {
    for (int i = 0; i < n; ++i) {
      const int d = d0 + i;
      codes[i] = static_cast<float>((row[4 + d / 4] >> (2 * (d & 3))) & 3);
    }
  } else {
    for (int i = 0; i < n; i += 2) {
      const uint8_t b = row[4 + (d0 + i) / 2];
      codes[i] = static_cast<float>(b & 15);
      codes[i + 1] = static_cast<float>(b >> 4);
    }
  }
}

// value = min + scale * code.
template <KvPrecision P>
inline void LoadScaleMin(const uint8_t* row, float* scale, float* min) {
  *scale = 1.0f;
  *min = 0.0f;
  if constexpr (P == KvPrecision::kInt8) {
    std::memcpy(scale, row, 4);
  } else if constexpr (P == KvPrecision::kInt4 || P == KvPrecision::kInt2) {
    uint16_t h[2];
    std::memcpy(h, row, 4);
    *scale = HalfToFloat(h[0]);
    *min = HalfToFloat(h[1]);
  }
}

// Σ_d a[d] b[d] with 4 partial sums (d % 4): one running sum would chain every add.
inline float Dot(const float* a, const float* b, int n) {
  float p0 = 0.0f, p1 = 0.0f, p2 = 0.0f, p3 = 0.0f;
  int d = 0;
  for (; d + 4 <= n; d += 4) {
    p0 += a[d] * b[d];
    p1 += a[d + 1] * b[d + 1];
    p2 += a[d + 2] * b[d + 2];
    p3 += a[d + 3] * b[d + 3];
  }
  for (; d < n; ++d) p0 += a[d] * b[d];
  return (p0 + p1) + (p2 + p3);
}

// The scalar code decodes one row's codes to a stack buffer (head_dim <= 256), then dots
// every head with it.
template <KvPrecision P>
void ScoresClass(const uint8_t* const* rows, int n, const KvQuery& q, float* s, size_t ld) {
  const int hd = q.head_dim;
  float codes[256];
  for (int r = 0; r < n; ++r) {
    DecodeCodes<P>(rows[r], 0, hd, codes);
    float scale, min;
    LoadScaleMin<P>(rows[r], &scale, &min);
    for (int h = 0; h < q.g; ++h) {
      float v = Dot(q.q + static_cast<size_t>(h) * hd, codes, hd);
      if constexpr (P == KvPrecision::kInt8) v = scale * v;
      if constexpr (P == KvPrecision::kInt4 || P == KvPrecision::kInt2) {
        v = min * q.qsum[h] + scale * v;
      }
      s[h * ld + r] = v;
    }
  }
}

void Scores(KvPrecision p, const uint8_t* const* rows, int n, const KvQuery& q, float* s,
            size_t ld) {
  switch (p) {
    case KvPrecision::kFull:
      return ScoresClass<KvPrecision::kFull>(rows, n, q, s, ld);
    case KvPrecision::kInt8:
      return ScoresClass<KvPrecision::kInt8>(rows, n, q, s, ld);
    case KvPrecision::kInt4:
      return ScoresClass<KvPrecision::kInt4>(rows, n, q, s, ld);
    case KvPrecision::kInt2:
      return ScoresClass<KvPrecision::kInt2>(rows, n, q, s, ld);
  }
}

float ExpSum(float* s, int n) {
  const float mx = *std::max_element(s, s + n);
  double sum = 0.0;
  for (int r = 0; r < n; ++r) {
    s[r] = std::exp(s[r] - mx);
    sum += s[r];
  }
  const int padded = (n + kScoresPad - 1) / kScoresPad * kScoresPad;
  std::fill(s + n, s + padded, 0.0f);
  return static_cast<float>(sum);
}

template <KvPrecision P>
void AccumulateClass(const uint8_t* const* rows, int n, const float* e, size_t ld, int g, int hd,
                     const int* head_rows, float* out) {
  float codes[256];
  for (int r = 0; r < n; ++r) {
    DecodeCodes<P>(rows[r], 0, hd, codes);
    float scale, min;
    LoadScaleMin<P>(rows[r], &scale, &min);
    for (int h = 0; h < g; ++h) {
      if (head_rows != nullptr && r >= head_rows[h]) continue;
      const float w = e[h * ld + r] * scale;
      float* oh = out + static_cast<size_t>(h) * hd;
      for (int d = 0; d < hd; ++d) oh[d] += w * codes[d];
    }
  }
  if constexpr (P == KvPrecision::kInt4 || P == KvPrecision::kInt2) {  // Σ e * min per head
    for (int h = 0; h < g; ++h) {
      const int nh = head_rows != nullptr ? head_rows[h] : n;
      float bias = 0.0f;
      for (int r = 0; r < nh; ++r) {
        float scale, min;
        LoadScaleMin<P>(rows[r], &scale, &min);
        bias += e[h * ld + r] * min;
      }
      float* oh = out + static_cast<size_t>(h) * hd;
      for (int d = 0; d < hd; ++d) oh[d] += bias;
    }
  }
}

void Accumulate(KvPrecision p, const uint8_t* const* rows, int n, const float* e, size_t ld, int g,
                int hd, const int* head_rows, float* out) {
  switch (p) {
    case KvPrecision::kFull:
      return AccumulateClass<KvPrecision::kFull>(rows, n, e, ld, g, hd, head_rows, out);
    case KvPrecision::kInt8:
      return AccumulateClass<KvPrecision::kInt8>(rows, n, e, ld, g, hd, head_rows, out);
    case KvPrecision::kInt4:
      return AccumulateClass<KvPrecision::kInt4>(rows, n, e, ld, g, hd, head_rows, out);
    case KvPrecision::kInt2:
      return AccumulateClass<KvPrecision::kInt2>(rows, n, e, ld, g, hd, head_rows, out);
  }
}

// The reference encoder is kv_precision's own.
void EncodeF16(const float* x, int n, uint8_t* row) { KvEncodeRow(KvPrecision::kFull, x, n, row); }

}  // namespace

const KvAttentionKernels kScalarKvKernels = {"scalar", &Scores, &ExpSum, &Accumulate, &EncodeF16};

const KvAttentionKernels& SelectedKvKernels(int head_dim) {
  if (head_dim % 16 != 0) return kScalarKvKernels;
  const CpuFeatures& f = GetCpuFeatures();
  if (f.avx512) return kAvx512KvKernels;
  if (f.avx2) return kAvx2KvKernels;
  return kScalarKvKernels;
}

std::vector<const KvAttentionKernels*> SupportedKvKernels() {
  std::vector<const KvAttentionKernels*> tables = {&kScalarKvKernels};
  const CpuFeatures& f = GetCpuFeatures();
  if (f.avx2) tables.push_back(&kAvx2KvKernels);
  if (f.avx512) tables.push_back(&kAvx512KvKernels);
  return tables;
}

}  // namespace specnode::kv_kernels
