// AVX2 + FMA + F16C kernels (compiled with -mavx2 -mfma -mf16c; run only when
// CpuFeatures::avx2). Activations stay in natural order; a block's 32 weights are widened
// to int16 (Q4: one vpmovzxbw of its 16 bytes, then the low and high nibbles are values
// 0..15 and 16..31; Q8_0: two vpmovsxbw) and dotted by two vpmaddwd (int16 pairs -> int32).
// Int8 activations (ActQuant::kInt8, opt-in): the block's 32 weights as bytes (Q4: low
// nibbles then high nibbles, unsigned; Q8_0: their absolute values, the activations taking
// the weights' signs, vpsignb) against the 32 int8 activations by one vpmaddubsw (u8 x s8
// pairs -> int16: at most 2 * 15 * 127 or 2 * 128 * 127, no saturation) and one vpmaddwd by
// ones (-> int32): half the multiply instructions per block of the int16 path (bench_peak:
// about twice its throughput on the AMD VM of 2026-12-01). The float steps around the
// integer dot are the int16 path's.
//
// Float rule for batch invariance: every float add here takes an FMA result or a sum, never
// a bare product, so -ffp-contract cannot fuse anything differently between tile sizes.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "model/cpu/cpu_kernels.h"

namespace specnode::cpu_kernels {
namespace {

constexpr int kBlock = kQuantBlock;
constexpr int kTile = 4;  // tokens per weight load, at most (quantised: tiles of 1..4)
// Loops over a tile's tokens carry `#pragma GCC unroll`: -O2 does not unroll them on its
// own, and rolled they keep the per-token accumulators in memory.

inline float HsumPs(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline int HsumEpi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

// One block of 32 activations rounded to integers at step d = max|x| / kMax (the scalar
// QuantizeTo's arithmetic: division for d and 1/d, x * (1/d) rounded to nearest even by the
// default MXCSR): q[i] holds values 8i..8i+7 as int32; returns Σ q, *d the step.
template <int kMax>
inline int RoundBlock(const float* xb, __m256i (&q)[4], float* d) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 v[4];
  for (int i = 0; i < 4; ++i) v[i] = _mm256_loadu_ps(xb + 8 * i);
  __m256 m = _mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1]));
  m = _mm256_max_ps(m, _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  const float amax = _mm_cvtss_f32(m4);
  const float db = amax / static_cast<float>(kMax);
  const float id = db != 0.0f ? 1.0f / db : 0.0f;
  const __m256 vid = _mm256_set1_ps(id);
  for (int i = 0; i < 4; ++i) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], vid));
  *d = db;
  return HsumEpi32(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
}

void Quantize(const float* x, int64_t blocks, GgmlType /*weight_type*/, int16_t* qs, float* d,
              float* s) {
  for (int64_t b = 0; b < blocks; ++b) {
    __m256i q[4];
    const int sum = RoundBlock<32767>(x + b * kBlock, q, &d[b]);
    // packs interleaves 128-bit lanes; the 64-bit permute restores element order.
    for (int h = 0; h < 2; ++h) {
      const __m256i p = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[2 * h], q[2 * h + 1]), 0xD8);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs + b * kBlock + 16 * h), p);
    }
    s[b] = d[b] * static_cast<float>(sum);
  }
}

// The int8 activations of one token (as the scalar QuantizeTo<int8_t, 127>), values in
// natural order.
void Quantize8(const float* x, int64_t blocks, GgmlType /*weight_type*/, int8_t* qs, float* d,
               float* s) {
  for (int64_t b = 0; b < blocks; ++b) {
    __m256i q[4];
    const int sum = RoundBlock<127>(x + b * kBlock, q, &d[b]);
    // |q| <= 127: the saturating packs are exact; they interleave 128-bit lanes
    // (dwords of 4 values: 0 2 4 6 | 1 3 5 7), which the dword permute puts back in order.
    const __m256i p01 = _mm256_packs_epi32(q[0], q[1]);
    const __m256i p23 = _mm256_packs_epi32(q[2], q[3]);
    const __m256i p = _mm256_packs_epi16(p01, p23);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs + b * kBlock),
                        _mm256_permutevar8x32_epi32(p, order));
    s[b] = d[b] * static_cast<float>(sum);
  }
}

// Pointers to token t's activations for a tile starting at t0.
struct TileActs {
  const int16_t* q;
  const int8_t* q8;
  const float* d;
  const float* s;
};

inline TileActs ActsFor(const QuantActs& x, int64_t t) {
  return {x.qs != nullptr ? x.qs + t * x.qs_stride : nullptr,
          x.qs8 != nullptr ? x.qs8 + t * x.qs_stride : nullptr, x.d + t * x.ds_stride,
          x.s + t * x.ds_stride};
}

// The first 4 bytes (f16 d, then f16 m or quants) of `nbc` (<= 8) blocks by one masked
// gather; masked lanes read nothing. (Assembling them with scalar loads costs more than
// the rest of a row: branchy, serial, and a stall when reloaded as a vector.)
inline __m256i GatherHeads(const uint8_t* chunk, __m256i offsets, int nbc) {
  const __m256i mask =
      _mm256_cmpgt_epi32(_mm256_set1_epi32(nbc), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  return _mm256_mask_i32gather_epi32(_mm256_setzero_si256(), reinterpret_cast<const int*>(chunk),
                                     offsets, mask, 1);
}

// The low (kHigh = false) or high f16 of each gathered dword, as 8 floats.
template <bool kHigh>
inline __m256 HalvesToPs(__m256i g) {
  const __m256i pick =
      kHigh ? _mm256_setr_epi8(2, 3, 6, 7, 10, 11, 14, 15, -1, -1, -1, -1, -1, -1, -1, -1, 2, 3, 6,
                               7, 10, 11, 14, 15, -1, -1, -1, -1, -1, -1, -1, -1)
            : _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1, 0, 1, 4, 5,
                               8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(g, pick), 0x08);
  return _mm256_cvtph_ps(_mm256_castsi256_si128(packed));
}

// Blocks per segment: a row is processed in segments whose per-token scales fit on the
// stack (one segment for every SmolLM2-sized row).
constexpr int kSegment = 256;

// Row `row` against tokens [t0, t0 + T), segment by segment:
//  1. scales, 8 blocks at a time: per token d_w*d_x is stored, and the min term m_w*s_x
//     (Q4_1) or -8 d_w*s_x (Q4_0) accumulated;
//  2. blocks: integer dot, converted and scaled by the stored scale (a broadcast load),
//     alternating between two accumulators per token (two FMA chains).
template <GgmlType kType, int T, bool kInt8>
void TileQuant(const QuantMatMulArgs& a, const uint8_t* row, int64_t r, int64_t t0) {
  constexpr bool kQ8 = kType == GgmlType::kQ8_0;
  const bool q4_1 = a.type == GgmlType::kQ4_1;
  const size_t bb = kQ8 ? sizeof(BlockQ8_0) : q4_1 ? sizeof(BlockQ4_1) : sizeof(BlockQ4_0);
  const int qoff = kQ8 ? 2 : q4_1 ? 4 : 2;
  TileActs x[T];
  __m256 acc0[T], acc1[T], acc_min[T];
#pragma GCC unroll 4
  for (int t = 0; t < T; ++t) {
    x[t] = ActsFor(a.x, t0 + t);
    acc0[t] = acc1[t] = acc_min[t] = _mm256_setzero_ps();
  }
  const __m256i offsets = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                             _mm256_set1_epi32(static_cast<int>(bb)));
  alignas(32) float scales[T][kSegment];

  auto block8 = [&](const uint8_t* p, const int8_t* const* xq, int j, __m256* acc)
      __attribute__((always_inline)) {
    // The 32 weights as bytes in value order (Q4: low nibbles are values 0..15).
    __m256i w;
    if constexpr (kQ8) {
      w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    } else {
      const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
      const __m128i m = _mm_set1_epi8(0x0F);
      w = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m), _mm_and_si128(q, m));
    }
    const __m256i uw = kQ8 ? _mm256_sign_epi8(w, w) : w;  // |w| (Q8_0) as unsigned bytes
    const __m256i ones = _mm256_set1_epi16(1);
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
      __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[t] + j * kBlock));
      if constexpr (kQ8) x = _mm256_sign_epi8(x, w);  // the weights' signs moved over
      const __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(uw, x), ones);
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_broadcast_ss(&scales[t][j]), acc[t]);
    }
  };

  auto block = [&](const uint8_t* p, const int16_t* const* xq, int j, __m256* acc)
      __attribute__((always_inline)) {
    __m256i w0, w1;  // weights for values 0..15 and 16..31
    if constexpr (kQ8) {
      w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
      w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)));
    } else {
      const __m256i q = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
      w0 = _mm256_and_si256(q, _mm256_set1_epi16(0x0F));
      w1 = _mm256_srli_epi16(q, 4);
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
      const int16_t* xb = xq[t] + j * kBlock;
      const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb));
      const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + 16));
      const __m256i dot = _mm256_add_epi32(_mm256_madd_epi16(w0, x0), _mm256_madd_epi16(w1, x1));
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_broadcast_ss(&scales[t][j]), acc[t]);
    }
  };

  for (int64_t s0 = 0; s0 < a.blocks; s0 += kSegment) {
    const int nseg = static_cast<int>(std::min<int64_t>(kSegment, a.blocks - s0));
    const uint8_t* seg = row + s0 * bb;
    for (int c = 0; c < nseg; c += 8) {
      const __m256i heads = GatherHeads(seg + c * bb, offsets, nseg - c);
      const __m256 dw = HalvesToPs<false>(heads);
      __m256 mw = _mm256_setzero_ps();
      if constexpr (!kQ8) {
        mw = q4_1 ? HalvesToPs<true>(heads) : _mm256_mul_ps(dw, _mm256_set1_ps(-8.0f));
      }
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t) {
        _mm256_store_ps(&scales[t][c], _mm256_mul_ps(dw, _mm256_loadu_ps(x[t].d + s0 + c)));
        if constexpr (!kQ8) {
          acc_min[t] = _mm256_fmadd_ps(mw, _mm256_loadu_ps(x[t].s + s0 + c), acc_min[t]);
        }
      }
    }
    const uint8_t* p = seg + qoff;
    int j = 0;
    if constexpr (kInt8) {
      const int8_t* xq[T];
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t) xq[t] = x[t].q8 + s0 * kBlock;
      for (; j + 2 <= nseg; j += 2, p += 2 * bb) {
        block8(p, xq, j, acc0);
        block8(p + bb, xq, j + 1, acc1);
      }
      if (j < nseg) block8(p, xq, j, acc0);
    } else {
      const int16_t* xq[T];
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t) xq[t] = x[t].q + s0 * kBlock;
      for (; j + 2 <= nseg; j += 2, p += 2 * bb) {
        block(p, xq, j, acc0);
        block(p + bb, xq, j + 1, acc1);
      }
      if (j < nseg) block(p, xq, j, acc0);
    }
  }
#pragma GCC unroll 4
  for (int t = 0; t < T; ++t) {
    const __m256 sum = _mm256_add_ps(_mm256_add_ps(acc0[t], acc1[t]), acc_min[t]);
    a.y[(t0 + t) * a.ldy + r] = HsumPs(sum);
  }
}

template <GgmlType kType, bool kInt8>
void RowsQuant(const QuantMatMulArgs& a, int64_t row_begin, int64_t row_end) {
  const size_t row_bytes = a.blocks * (kType == GgmlType::kQ8_0    ? sizeof(BlockQ8_0)
                                       : a.type == GgmlType::kQ4_1 ? sizeof(BlockQ4_1)
                                                                   : sizeof(BlockQ4_0));
  const int64_t ahead = PrefetchRowsAhead(row_bytes);
  for (int64_t r = row_begin; r < std::min(row_begin + ahead, row_end); ++r) {
    PrefetchBytes(a.w + r * a.row_stride, row_bytes);
  }
  for (int64_t r = row_begin; r < row_end; ++r) {
    const uint8_t* row = a.w + r * a.row_stride;
    if (r + ahead < row_end) PrefetchBytes(row + ahead * a.row_stride, row_bytes);
    // As few tiles as possible, of near-equal sizes (5 tokens: 3 + 2).
    for (int64_t t = 0; t < a.n;) {
      const int tile = NearEqualTile(a.n - t, kTile);
      switch (tile) {
        case 4:
          TileQuant<kType, 4, kInt8>(a, row, r, t);
          break;
        case 3:
          TileQuant<kType, 3, kInt8>(a, row, r, t);
          break;
        case 2:
          TileQuant<kType, 2, kInt8>(a, row, r, t);
          break;
        default:
          TileQuant<kType, 1, kInt8>(a, row, r, t);
          break;
      }
      t += tile;
    }
  }
}

template <bool kInt8>
void MatMulQuant(const QuantMatMulArgs& a, int64_t row_begin, int64_t row_end) {
  if (a.type == GgmlType::kQ8_0) {
    RowsQuant<GgmlType::kQ8_0, kInt8>(a, row_begin, row_end);
  } else {  // Q4_0 and Q4_1 share one instance; the type picks offsets and the min term
    RowsQuant<GgmlType::kQ4_1, kInt8>(a, row_begin, row_end);
  }
}

// Eight weights of a float-type row as f32.
template <GgmlType kType>
inline __m256 Load8(const uint8_t* p) {
  if constexpr (kType == GgmlType::kF32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  } else if constexpr (kType == GgmlType::kF16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  } else {
    const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
  }
}

template <GgmlType kType, int T>
void TileFloat(const FloatMatMulArgs& a, const uint8_t* row, int64_t r, int64_t t0) {
  constexpr size_t elem = kType == GgmlType::kF32 ? 4 : 2;
  __m256 acc[T];
#pragma GCC unroll 4
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 8 <= a.cols; j += 8) {
    const __m256 wv = Load8<kType>(row + j * elem);
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
      acc[t] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(a.x + (t0 + t) * a.ldx + j), acc[t]);
    }
  }
  if (j < a.cols) {  // tail: zero-padded copies, identical for every tile size
    const int64_t rem = a.cols - j;
    alignas(32) uint8_t wbuf[32] = {};
    std::memcpy(wbuf, row + j * elem, rem * elem);
    const __m256 wv = Load8<kType>(wbuf);
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
      alignas(32) float xbuf[8] = {};
      std::memcpy(xbuf, a.x + (t0 + t) * a.ldx + j, rem * sizeof(float));
      acc[t] = _mm256_fmadd_ps(wv, _mm256_load_ps(xbuf), acc[t]);
    }
  }
#pragma GCC unroll 4
  for (int t = 0; t < T; ++t) a.y[(t0 + t) * a.ldy + r] = HsumPs(acc[t]);
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

void MatMulFloat(const FloatMatMulArgs& a, int64_t row_begin, int64_t row_end) {
  switch (a.type) {
    case GgmlType::kF16:
      return RowsFloat<GgmlType::kF16>(a, row_begin, row_end);
    case GgmlType::kBF16:
      return RowsFloat<GgmlType::kBF16>(a, row_begin, row_end);
    default:
      return RowsFloat<GgmlType::kF32>(a, row_begin, row_end);
  }
}

}  // namespace

void SwiGluAvx2(const float* gate, const float* up, int64_t n, float* out) {
  namespace c = swiglu_exp;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    __m256 x = _mm256_xor_ps(g, _mm256_set1_ps(-0.0f));  // -g: the sign flip of the scalar -g
    x = _mm256_max_ps(_mm256_set1_ps(c::kLo), x);
    x = _mm256_min_ps(_mm256_set1_ps(c::kHi), x);
    const __m256 kf = _mm256_fmadd_ps(x, _mm256_set1_ps(c::kLog2e), _mm256_set1_ps(c::kMagic));
    const __m256 k = _mm256_sub_ps(kf, _mm256_set1_ps(c::kMagic));
    const __m256 r = _mm256_fmadd_ps(k, _mm256_set1_ps(-c::kLn2Lo),
                                     _mm256_fmadd_ps(k, _mm256_set1_ps(-c::kLn2Hi), x));
    __m256 p = _mm256_set1_ps(c::kP[0]);
    for (int j = 1; j < 6; ++j) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c::kP[j]));
    const __m256 e =
        _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    const __m256 scale = _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_castps_si256(kf), _mm256_set1_epi32(127)), 23));
    const __m256 den = _mm256_fmadd_ps(e, scale, _mm256_set1_ps(1.0f));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(g, den), _mm256_loadu_ps(up + i)));
  }
  SwiGluScalar(gate + i, up + i, n - i, out + i);
}

// The x8 path's activations are this table's natural-order ones.
const KernelTable kAvx2Kernels = {.name = "avx2",
                                  .quantize = &Quantize,
                                  .matmul_quant = &MatMulQuant<false>,
                                  .matmul_float = &MatMulFloat,
                                  .quantize8 = &Quantize8,
                                  .matmul_quant8 = &MatMulQuant<true>,
                                  .quantize_x8 = &Quantize,
                                  .matmul_quant_x8 = &MatMulQuantX8Avx2,
                                  .quantize8_x8 = &Quantize8,
                                  .matmul_quant8_x8 = &MatMulQuant8X8Avx2,
                                  .swiglu = &SwiGluAvx2,
                                  .kquant_x8 = true,
                                  .kquant8_x8 = true,
                                  .q5_x8 = true,
                                  .q5_8_x8 = true};

}  // namespace specnode::cpu_kernels
