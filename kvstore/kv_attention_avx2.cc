// AVX2 attention kernels (compiled with -mavx2 -mfma -mf16c; run only when
// CpuFeatures::avx2). 8 floats per vector; the accumulate tile is 3 heads x 4 vectors (32
// columns): 12 accumulators of the 16 ymm registers (SmolLM2's GQA group is 3).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kvstore/kv_attention_kernels.h"
#include "kvstore/kv_attention_simd.h"

namespace specnode::kv_kernels {
namespace {

struct Avx2 {
  using V = __m256;
  static constexpr int kLanes = 8;
  static constexpr int kAccHeads = 3;
  static constexpr int kAccVectors = 4;

  static V Zero() { return _mm256_setzero_ps(); }
  static V Set1(float x) { return _mm256_set1_ps(x); }
  static V Load(const float* p) { return _mm256_loadu_ps(p); }
  static void Store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V Add(V a, V b) { return _mm256_add_ps(a, b); }
  static V Sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V Max(V a, V b) { return _mm256_max_ps(a, b); }
  static V Fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static float Hsum(V v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static float Hmax(V v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static constexpr int kReduce = 8;
  // Lane k = Hsum(a[k]) for k < 8, by a transpose-add tree (7 adds, 14 shuffles) in which
  // every lane's sum has the same association. Its output lane 4L + m is the sum of its
  // input 2m + L, so inputs are taken in the order that undoes that.
  static inline __attribute__((always_inline)) V HsumMany(const V* a) {
    auto in = [a](int i) { return a[(i % 2) * 4 + i / 2]; };
    V t[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      const V x = in(2 * i), y = in(2 * i + 1);
      t[i] = _mm256_add_ps(_mm256_permute2f128_ps(x, y, 0x20), _mm256_permute2f128_ps(x, y, 0x31));
    }
    const V v0 = _mm256_add_ps(_mm256_unpacklo_ps(t[0], t[1]), _mm256_unpackhi_ps(t[0], t[1]));
    const V v1 = _mm256_add_ps(_mm256_unpacklo_ps(t[2], t[3]), _mm256_unpackhi_ps(t[2], t[3]));
    const __m256d d0 = _mm256_castps_pd(v0), d1 = _mm256_castps_pd(v1);
    return _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(d0, d1)),
                         _mm256_castpd_ps(_mm256_unpackhi_pd(d0, d1)));
  }
  static float F16(uint16_t h) { return _cvtsh_ss(h); }
  static V LoadF16(const uint8_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static V LoadI8(const uint8_t* p) {
    return _mm256_cvtepi32_ps(
        _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  static V LoadU4(const uint8_t* p) {
    int32_t bytes;
    std::memcpy(&bytes, p, 4);
    const __m128i b = _mm_cvtsi32_si128(bytes);
    const __m128i m = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_and_si128(b, m);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)));
  }
  // 8 two-bit codes from 2 bytes: the 16 bits in every lane, lane i shifted right by 2i.
  static V LoadU2(const uint8_t* p) {
    uint16_t bits;
    std::memcpy(&bits, p, 2);
    const __m256i b = _mm256_set1_epi32(bits);
    const __m256i shift = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
    return _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(b, shift), _mm256_set1_epi32(3)));
  }
  static void LoadU4EvenOdd(const uint8_t* p, V* even, V* odd) {
    const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    *even = _mm256_cvtepi32_ps(_mm256_and_si256(b, _mm256_set1_epi32(0x0F)));
    *odd = _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4));
  }
  static void Interleave(V even, V odd, V* lo, V* hi) {
    const V a = _mm256_unpacklo_ps(even, odd);  // e0 o0 e1 o1 | e4 o4 e5 o5
    const V b = _mm256_unpackhi_ps(even, odd);  // e2 o2 e3 o3 | e6 o6 e7 o7
    *lo = _mm256_permute2f128_ps(a, b, 0x20);
    *hi = _mm256_permute2f128_ps(a, b, 0x31);
  }

  // exp(x) as 2^n * p(r), |r| <= ln2/2, Cephes' degree-6 polynomial (~1 ulp); 0 for
  // x < -87.33 (below FLT_MIN, and -inf).
  static V Exp(V x) {
    const V keep = _mm256_cmp_ps(x, _mm256_set1_ps(-87.33f), _CMP_GE_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.33f)), _mm256_set1_ps(88.37f));
    const V fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                 _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    V r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), r);
    V y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i n = _mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127));
    const V pow2 = _mm256_castsi256_ps(_mm256_slli_epi32(n, 23));
    return _mm256_and_ps(keep, _mm256_mul_ps(y, pow2));
  }
};

// F16C, round to nearest even: Fp32ToFp16's rounding, inf and NaN (quiet, top payload
// bits) exactly.
void EncodeF16(const float* x, int n, uint8_t* row) {
  for (int i = 0; i < n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(row + 2 * i), h);
  }
}

}  // namespace

const KvAttentionKernels kAvx2KvKernels = {"avx2", &simd::Scores<Avx2>, &simd::ExpSum<Avx2>,
                                           &simd::Accumulate<Avx2>, &EncodeF16};

}  // namespace specnode::kv_kernels
