// Shared by the AVX-512 kernel files only (cpu_kernels_avx512*.cc, compiled with the
// AVX-512 flags): include it from nowhere else, or an inline function here could be
// emitted with AVX-512 instructions into code that runs on any CPU.
#pragma once

// GCC 12's AVX-512 headers build their "undefined" vectors as self-initialised locals, which
// -Wuninitialized reports at every inlined use; the diagnostics are spurious.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include "model/gguf/ggml_types.h"

namespace specnode::cpu_kernels::avx512 {

// A mask of the first k of 16 lanes (k >= 16: all).
inline __mmask16 FirstLanes(int k) {
  return static_cast<__mmask16>(k >= 16 ? 0xFFFFu : (1u << k) - 1u);
}

// One block's 32 values rounded to integers of at most `qmax` in magnitude (as int32, values
// 0..15 in q[0], 16..31 in q[1]), with d = max|x| / qmax and s = d * Σ q.
inline void QuantizeBlockTo(const float* xb, float qmax, __m512i* q, float* d, float* s) {
  const __m512 v0 = _mm512_loadu_ps(xb), v1 = _mm512_loadu_ps(xb + 16);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
  const float db = amax / qmax;
  const float id = db != 0.0f ? 1.0f / db : 0.0f;
  const __m512 vid = _mm512_set1_ps(id);
  // Round to nearest even (default MXCSR), as the scalar nearbyint.
  q[0] = _mm512_cvtps_epi32(_mm512_mul_ps(v0, vid));
  q[1] = _mm512_cvtps_epi32(_mm512_mul_ps(v1, vid));
  *d = db;
  *s = db * static_cast<float>(_mm512_reduce_add_epi32(_mm512_add_epi32(q[0], q[1])));
}

// One block: 32 values rounded to int16 (natural order), its d and s.
inline __m512i QuantizeBlock(const float* xb, float* d, float* s) {
  __m512i q[2];
  QuantizeBlockTo(xb, 32767.0f, q, d, s);
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtsepi32_epi16(q[0])),
                            _mm512_cvtsepi32_epi16(q[1]), 1);
}

// One block rounded to int8 (natural order), its d and s.
inline __m256i QuantizeBlock8(const float* xb, float* d, float* s) {
  __m512i q[2];
  QuantizeBlockTo(xb, 127.0f, q, d, s);
  return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm512_cvtsepi32_epi8(q[0])),
                                 _mm512_cvtsepi32_epi8(q[1]), 1);
}

}  // namespace specnode::cpu_kernels::avx512
