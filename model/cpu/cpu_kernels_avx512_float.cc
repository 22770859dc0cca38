// AVX-512 kernels for F32 / F16 / BF16 weights (compiled with avx512f/bw/vl; run only when
// CpuFeatures::avx512). Both AVX-512 kernel tables (cpu_kernels_avx512.cc) use them. The
// activations stay f32: one weight load serves up to kTile tokens, each with its own FMA
// chain in a fixed order, so results are batch-invariant (cpu_kernels.h).

#include <algorithm>
#include <cstdint>

#include "model/cpu/cpu_kernels.h"
#include "model/cpu/cpu_kernels_avx512_common.h"

namespace specnode::cpu_kernels {
namespace {

constexpr int kTile = 4;  // tokens per weight load when n >= 4

using avx512::FirstLanes;

// Up to 16 weights of a float-type row as f32; masked lanes are zero and not read.
template <GgmlType kType>
inline __m512 Load16(const uint8_t* p, __mmask16 m) {
  if constexpr (kType == GgmlType::kF32) {
    return _mm512_maskz_loadu_ps(m, p);
  } else if constexpr (kType == GgmlType::kF16) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
  } else {
    const __m512i h = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(h, 16));
  }
}

template <GgmlType kType, int T>
void TileFloat(const FloatMatMulArgs& a, const uint8_t* row, int64_t r, int64_t t0) {
  constexpr size_t elem = kType == GgmlType::kF32 ? 4 : 2;
  __m512 acc[T];
#pragma GCC unroll 4
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t j = 0; j < a.cols; j += 16) {
    const __mmask16 m = FirstLanes(static_cast<int>(std::min<int64_t>(16, a.cols - j)));
    const __m512 wv = Load16<kType>(row + j * elem, m);
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
      acc[t] = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(m, a.x + (t0 + t) * a.ldx + j), acc[t]);
    }
  }
#pragma GCC unroll 4
  for (int t = 0; t < T; ++t) a.y[(t0 + t) * a.ldy + r] = _mm512_reduce_add_ps(acc[t]);
}

template <GgmlType kType>
void RowsFloat(const FloatMatMulArgs& a, int64_t row_begin, int64_t row_end) {
  for (int64_t r = row_begin; r < row_end; ++r) {
    const uint8_t* row = a.w + r * a.row_stride;
    int64_t t = 0;
    for (; t + kTile <= a.n; t += kTile) TileFloat<kType, kTile>(a, row, r, t);
    for (; t < a.n; ++t) TileFloat<kType, 1>(a, row, r, t);
  }
}

}  // namespace

void MatMulFloatAvx512(const FloatMatMulArgs& a, int64_t row_begin, int64_t row_end) {
  switch (a.type) {
    case GgmlType::kF16:
      return RowsFloat<GgmlType::kF16>(a, row_begin, row_end);
    case GgmlType::kBF16:
      return RowsFloat<GgmlType::kBF16>(a, row_begin, row_end);
    default:
      return RowsFloat<GgmlType::kF32>(a, row_begin, row_end);
  }
}

}  // namespace specnode::cpu_kernels
