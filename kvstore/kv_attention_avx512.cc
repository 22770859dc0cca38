// AVX-512 attention kernels (compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq
// -mavx2 -mfma -mf16c; run only when CpuFeatures::avx512). 16 floats per vector; the
// accumulate tile is 4 heads x 4 vectors (64 columns) in 16 of the 32 zmm registers.

// GCC 12's AVX-512 headers build their "undefined" vectors as self-initialised locals, which
// -Wuninitialized reports at every inlined use; the diagnostics are spurious.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstdint>
#include <cstring>

#include "kvstore/kv_attention_kernels.h"
#include "kvstore/kv_attention_simd.h"

namespace specnode::kv_kernels {
namespace {

struct Avx512 {
  using V = __m512;
  static constexpr int kLanes = 16;
  static constexpr int kAccHeads = 4;
  static constexpr int kAccVectors = 4;

  static V Zero() { return _mm512_setzero_ps(); }
  static V Set1(float x) { return _mm512_set1_ps(x); }
  static V Load(const float* p) { return _mm512_loadu_ps(p); }
  static void Store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V Add(V a, V b) { return _mm512_add_ps(a, b); }
  static V Sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V Max(V a, V b) { return _mm512_max_ps(a, b); }
  static V Fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static float Hsum(V v) {
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static float Hmax(V v) {
    const __m256 h = _mm256_max_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static constexpr int kReduce = 16;
  // Lane k = Hsum(a[k]) for k < 16, by a transpose-add tree (15 adds, 30 shuffles) in which
  // every lane's sum has the same association. Its output lane 4L + m is the sum of its m-th
  // input of 128-bit lane L's group, so inputs are taken in the order that undoes that.
  static inline __attribute__((always_inline)) V HsumMany(const V* a) {
    auto in = [a](int i) { return a[(i % 4) * 4 + i / 4]; };
    V t[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
      const V x = in(2 * i), y = in(2 * i + 1);
      t[i] = _mm512_add_ps(_mm512_shuffle_f32x4(x, y, 0x44), _mm512_shuffle_f32x4(x, y, 0xEE));
    }
    V u[4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      u[j] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2 * j], t[2 * j + 1], 0x88),
                           _mm512_shuffle_f32x4(t[2 * j], t[2 * j + 1], 0xDD));
    }
    const V v0 = _mm512_add_ps(_mm512_unpacklo_ps(u[0], u[1]), _mm512_unpackhi_ps(u[0], u[1]));
    const V v1 = _mm512_add_ps(_mm512_unpacklo_ps(u[2], u[3]), _mm512_unpackhi_ps(u[2], u[3]));
    const __m512d d0 = _mm512_castps_pd(v0), d1 = _mm512_castps_pd(v1);
    return _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(d0, d1)),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(d0, d1)));
  }
  static float F16(uint16_t h) { return _cvtsh_ss(h); }
  static V LoadF16(const uint8_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static V LoadI8(const uint8_t* p) {
    return _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static V LoadU4(const uint8_t* p) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    const __m128i m = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_and_si128(b, m);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)));
  }
  // 16 two-bit codes from 4 bytes: the 32 bits in every lane, lane i shifted right by 2i.
  static V LoadU2(const uint8_t* p) {
    uint32_t bits;
    std::memcpy(&bits, p, 4);
    const __m512i b = _mm512_set1_epi32(static_cast<int>(bits));
    const __m512i shift =
        _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    return _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srlv_epi32(b, shift), _mm512_set1_epi32(3)));
  }
  static void LoadU4EvenOdd(const uint8_t* p, V* even, V* odd) {
    const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    *even = _mm512_cvtepi32_ps(_mm512_and_si512(b, _mm512_set1_epi32(0x0F)));
    *odd = _mm512_cvtepi32_ps(_mm512_srli_epi32(b, 4));
  }
  static void Interleave(V even, V odd, V* lo, V* hi) {
    const __m512i i_lo = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512i i_hi =
        _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
    *lo = _mm512_permutex2var_ps(even, i_lo, odd);
    *hi = _mm512_permutex2var_ps(even, i_hi, odd);
  }

  // exp(x) as 2^n * p(r), |r| <= ln2/2, Cephes' degree-6 polynomial (~1 ulp); 0 for
  // x < -87.33 (below FLT_MIN, and -inf).
  static V Exp(V x) {
    const __mmask16 tiny = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.33f), _CMP_LT_OQ);
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.33f)), _mm512_set1_ps(88.37f));
    const V fx = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    V r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), r);
    V y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    const __m512i n = _mm512_add_epi32(_mm512_cvtps_epi32(fx), _mm512_set1_epi32(127));
    const V pow2 = _mm512_castsi512_ps(_mm512_slli_epi32(n, 23));
    return _mm512_maskz_mul_ps(static_cast<__mmask16>(~tiny), y, pow2);
  }
};

// F16C, round to nearest even: Fp32ToFp16's rounding, inf and NaN (quiet, top payload
// bits) exactly.
void EncodeF16(const float* x, int n, uint8_t* row) {
  for (int i = 0; i < n; i += 16) {
    const __m256i h = _mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(row + 2 * i), h);
  }
}

}  // namespace

const KvAttentionKernels kAvx512KvKernels = {"avx512", &simd::Scores<Avx512>, &simd::ExpSum<Avx512>,
                                             &simd::Accumulate<Avx512>, &EncodeF16};

}  // namespace specnode::kv_kernels
