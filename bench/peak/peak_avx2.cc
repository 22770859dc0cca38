#include <immintrin.h>

#include "bench/peak/peak_kernels.h"

namespace specnode::bench_peak {
namespace {

// Independent dependency chains per loop: enough for latency x throughput of the longest
// chain step (int8: vpmaddubsw 5 + vpmaddwd 5 + vpaddd 1 cycles, two per cycle).
constexpr int kChains = 12;

float FmaF32(int64_t iters) {
  __m256 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_ps(0.001f * c);
  const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(1e-7f);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], a, b);
  }
  __m256 s = acc[0];
  for (int c = 1; c < kChains; ++c) s = _mm256_add_ps(s, acc[c]);
  return _mm256_cvtss_f32(s);
}

// The products' inputs do not depend on the accumulators (only the vpaddd chains do, one
// cycle each); an empty asm marks `b` changed every iteration, so the products cannot be
// hoisted out of the loop, and each chain has its own `x`, so they cannot be shared.
float MaddInt16(int64_t iters) {
  __m256i acc[6], x[6];
  for (int c = 0; c < 6; ++c) {
    acc[c] = _mm256_set1_epi32(c);
    x[c] = _mm256_set1_epi16(static_cast<int16_t>(3 + c));
  }
  __m256i b = _mm256_set1_epi16(-2);
  for (int64_t i = 0; i < iters; ++i) {
    __asm__ volatile("" : "+x"(b));
#pragma GCC unroll 6
    for (int c = 0; c < 6; ++c) acc[c] = _mm256_add_epi32(acc[c], _mm256_madd_epi16(x[c], b));
  }
  __m256i s = acc[0];
  for (int c = 1; c < 6; ++c) s = _mm256_add_epi32(s, acc[c]);
  return static_cast<float>(_mm256_extract_epi32(s, 0));
}

float MaddInt8(int64_t iters) {
  __m256i acc[6], x[6];
  for (int c = 0; c < 6; ++c) {
    acc[c] = _mm256_set1_epi32(c);
    x[c] = _mm256_set1_epi8(static_cast<int8_t>(3 + c));
  }
  __m256i b = _mm256_set1_epi8(-2);
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t i = 0; i < iters; ++i) {
    __asm__ volatile("" : "+x"(b));
#pragma GCC unroll 6
    for (int c = 0; c < 6; ++c) {
      const __m256i p = _mm256_maddubs_epi16(x[c], b);
      acc[c] = _mm256_add_epi32(acc[c], _mm256_madd_epi16(p, ones));
    }
  }
  __m256i s = acc[0];
  for (int c = 1; c < 6; ++c) s = _mm256_add_epi32(s, acc[c]);
  return static_cast<float>(_mm256_extract_epi32(s, 0));
}

}  // namespace

const PeakLoop kAvx2Loops[3] = {
    {"f32 FMA (ymm)", kChains * 16.0, &FmaF32},
    {"int16 vpmaddwd+vpaddd (ymm)", 6 * 32.0, &MaddInt16},
    {"int8 vpmaddubsw+vpmaddwd+vpaddd (ymm)", 6 * 64.0, &MaddInt8},
};

}  // namespace specnode::bench_peak
