#include <immintrin.h>

#include "bench/peak/peak_kernels.h"

namespace specnode::bench_peak {
namespace {

// Sums by storing (GCC 12's _mm512_reduce_* helpers warn about uninitialised temporaries).
float Sum(__m512 v) {
  alignas(64) float f[16];
  _mm512_store_ps(f, v);
  float s = 0.0f;
  for (float x : f) s += x;
  return s;
}
float Sum(__m512i v) {
  alignas(64) int32_t f[16];
  _mm512_store_si512(f, v);
  int64_t s = 0;
  for (int32_t x : f) s += x;
  return static_cast<float>(s);
}

constexpr int kChains = 12;  // as peak_avx2.cc

float FmaF32(int64_t iters) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(0.001f * c);
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(1e-7f);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], a, b);
  }
  __m512 s = acc[0];
  for (int c = 1; c < kChains; ++c) s = _mm512_add_ps(s, acc[c]);
  return Sum(s);
}

float MaddInt16(int64_t iters) {
  __m512i acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_epi32(c);
  const __m512i b = _mm512_set1_epi16(-2);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) {
      acc[c] = _mm512_add_epi32(acc[c], _mm512_madd_epi16(acc[c], b));
    }
  }
  __m512i s = acc[0];
  for (int c = 1; c < kChains; ++c) s = _mm512_add_epi32(s, acc[c]);
  return Sum(s);
}

__attribute__((target("avx512vnni"))) float DpwssdInt16(int64_t iters) {
  __m512i acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_epi32(c);
  const __m512i a = _mm512_set1_epi16(3), b = _mm512_set1_epi16(-2);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpwssd_epi32(acc[c], a, b);
  }
  __m512i s = acc[0];
  for (int c = 1; c < kChains; ++c) s = _mm512_add_epi32(s, acc[c]);
  return Sum(s);
}

__attribute__((target("avx512vnni"))) float DpbusdInt8(int64_t iters) {
  __m512i acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_epi32(c);
  const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-2);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbusd_epi32(acc[c], a, b);
  }
  __m512i s = acc[0];
  for (int c = 1; c < kChains; ++c) s = _mm512_add_epi32(s, acc[c]);
  return Sum(s);
}

}  // namespace

const PeakLoop kAvx512Loops[2] = {
    {"f32 FMA (zmm)", kChains * 32.0, &FmaF32},
    {"int16 vpmaddwd+vpaddd (zmm)", kChains * 64.0, &MaddInt16},
};
const PeakLoop kVnniLoops[2] = {
    {"int16 vpdpwssd (zmm)", kChains * 64.0, &DpwssdInt16},
    {"int8 vpdpbusd (zmm)", kChains * 128.0, &DpbusdInt8},
};

}  // namespace specnode::bench_peak
