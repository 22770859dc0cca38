// AVX-512 kernels over row-interleaved weights (cpu_repack.h; compiled with the AVX-512
// flags, run only when CpuFeatures::avx512, the VNNI ones only with avx512_vnni): one zmm
// lane per output row, 16 rows per instruction = two packed groups of 8 side by side (the
// packed layout is the AVX2 kernel's; a second group costs one 128/256-bit insert per chunk
// and no other work). Activations in natural order (QuantizeNaturalAvx512 /
// Quantize8NaturalAvx512).
//
// Int16 activations (matmul_quant_x8): chunk c of both groups (2 x 16 bytes) is widened to
// 32 int16 once per tile (vpmovzxbw; Q4: its low and high nibbles are the value pairs
// (2c, 2c + 1) and (2c + 16, 2c + 17) of 16 rows; Q8_0: vpmovsxbw, the pair (2c, 2c + 1)),
// and each token's pair is an embedded dword broadcast into vpdpwssd (vpmaddwd + vpaddd
// without VNNI): 16 dot instructions per block and token for 16 rows.
//
// Int8 activations (matmul_quant8_x8, VNNI): chunks c, c + 1 of both groups (2 x 32 bytes)
// are joined and one word permute (vpermw) gives each row's dword lane its two words, i.e.
// its quant bytes 2c .. 2c + 3: Q4 nibbles (mask / shift + mask) are values 2c .. 2c + 3 and
// 2c + 16 .. 2c + 19, Q8_0 bytes (sign bit flipped: quant + 128, vpdpbusd's unsigned
// operand) values 2c .. 2c + 3. One vpdpbusd then takes 4 values of 16 rows: 8 per block
// and token, half the int16 path's.
//
// K-quants (Q4_K, Q5_K, Q6_K), packed as cpu_repack_kquant.h: a 32-value sub-block is a Q4
// block whose nibbles may be completed by high bits (one widened high chunk, shifted and
// masked per nibble vector; int8: joined like the nibbles, one variable word shift) and,
// int16, re-centred (Q6_K: - 32; int8 subtracts 32 h16 from the sums instead), with its
// factors d * sc / -dmin * m converted per sub-block (d, dmin once per super-block); Q6_K
// scales the low and high nibbles' sums (its two 16-value halves) separately. Q5_0 / Q5_1
// blocks (bit 4 laid out as Q5_K's, cpu_repack.h) take the same dot paths with a Q4 block's
// factors (d_w and m_w / -16 d_w per block).
//
// Arithmetic per (row, token), block by block (PackedMatMulReference, and for int8
// PackedMatMulReference8 whose Q8_0 dot carries the +128 and is corrected by -128 d_w s_t);
// integer sums are exact in any order, every float step is per lane and FMAs are spelled
// out: results are bit-identical to the scalar references and batch invariant.
#include <algorithm>
#include <cassert>
#include <cstdint>
#include <cstring>
#include <utility>

#include "model/cpu/cpu_kernels.h"
#include "model/cpu/cpu_kernels_avx512_common.h"
#include "model/cpu/cpu_repack.h"
#include "model/cpu/cpu_repack_kquant.h"

namespace specnode::cpu_kernels {
namespace {

constexpr int kBlock = kQuantBlock;
// Tokens per pass over the weights: 8 accumulators + 8 block dots (16 for int16 Q4, which
// keeps the low- and high-nibble sums apart: two dependency chains per token) + the
// unpacked chunk fit the 32 zmm registers; 9..16 tokens go as two near-equal tiles.
// The chunk loops are unrolled completely (`#pragma GCC unroll 16`): partly unrolled, GCC
// 12 copied every accumulator once per iteration and spilled one (1536x576 Q4_1, 5 tokens,
// one thread: 98 -> 56 us).
constexpr int kTile = 8;
// Int8 keeps one dot per token: 12 tokens fit, so a K = 8 verification (9 tokens) unpacks
// the weights once (DecodeStep, 2 threads, int8, n = 9: 11.9 ms as 5 + 4, 9.5 ms as one).
constexpr int kTile8 = 12;
// Int8 Q6_K keeps two dots per token (its halves): 8 tokens, as int16.
constexpr int TileFor(bool int8, GgmlType type) {
  return int8 && type != GgmlType::kQ6_K ? kTile8 : kTile;
}

// The dword at p in all 16 lanes (a load the dot instruction can fold as {1to16}).
inline __m512i Broadcast32(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// 16 bytes of group a (lanes 0-7 after widening) and the same 16 bytes of group b.
inline __m256i Join128(const uint8_t* a, const uint8_t* b) {
  return _mm256_inserti128_si256(
      _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a))),
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(b)), 1);
}

// 32 bytes of group a and the same 32 bytes of group b.
inline __m512i Join256(const uint8_t* a, const uint8_t* b) {
  return _mm512_inserti64x4(
      _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a))),
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)), 1);
}

// Word indices turning [a.c | a.c+1 | b.c | b.c+1] (16-byte chunks, word i of a chunk is row
// i's) into dword lanes of rows a.0..7, b.0..7, each holding (chunk c word, chunk c+1 word).
struct PairOrder {
  alignas(64) int16_t idx[32];
  constexpr PairOrder() : idx() {
    for (int k = 0; k < 16; ++k) {
      const int base = k < 8 ? k : 8 + k;  // b's chunks start at word 16
      idx[2 * k] = static_cast<int16_t>(base);
      idx[2 * k + 1] = static_cast<int16_t>(base + 8);
    }
  }
};
constexpr PairOrder kPairOrder;

template <bool kVnni>
inline __m512i DotPairs(__m512i acc, __m512i w, __m512i x) {
  if constexpr (kVnni) {
    return _mm512_dpwssd_epi32(acc, w, x);
  } else {
    return _mm512_add_epi32(acc, _mm512_madd_epi16(w, x));
  }
}

// The per-block scale step shared by both activation widths: for each token,
// acc = fma(float(dot), d_w d_t, acc), then the Q4_1 / Q4_0 / int8-Q8_0 offset term.
template <GgmlType kType, bool kInt8, int T>
inline void ScaleBlock(const __m512i (&dot)[T], __m512 dw, __m512 mw, const float* const (&xd)[T],
                       const float* const (&xs)[T], int64_t b, __m512 (&acc)[T]) {
  constexpr bool kOffset = kType != GgmlType::kQ8_0 || kInt8;
#pragma GCC unroll 12
  for (int t = 0; t < T; ++t) {
    const __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(xd[t][b]));
    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[t]), scale, acc[t]);
    if constexpr (kOffset) acc[t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(xs[t][b]), acc[t]);
  }
}

// K-quants (cpu_repack_kquant.h). 8 byte factors of group a and 8 of group b
// (one per row) as 16 floats.
inline __m512 ByteFactors(const uint8_t* a, const uint8_t* b, bool is_signed) {
  const __m128i v = _mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(a)),
                                       _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b)));
  return _mm512_cvtepi32_ps(is_signed ? _mm512_cvtepi8_epi32(v) : _mm512_cvtepu8_epi32(v));
}

// The super-block's f16 d (and -dmin) of 16 rows, converted once for its 8 sub-blocks.
template <GgmlType kType>
inline void KSuperScales(const uint8_t* ha, const uint8_t* hb, __m512* d, __m512* neg_dmin) {
  *d = _mm512_cvtph_ps(Join128(ha, hb));
  if constexpr (kType != GgmlType::kQ6_K) {
    *neg_dmin = _mm512_xor_ps(_mm512_cvtph_ps(Join128(ha + 16, hb + 16)), _mm512_set1_ps(-0.0f));
  }
}

// Sub-block j's factors for the 16 rows of super-block heads ha, hb: d * sc_j and
// (-dmin) * m_j (Q4_K / Q5_K), or d * sc of its two halves (Q6_K: dw for values 0..15, dw2
// for 16..31).
template <GgmlType kType>
inline void KScales(const uint8_t* ha, const uint8_t* hb, int j, __m512 d, __m512 neg_dmin,
                    __m512* dw, __m512* mw, __m512* dw2) {
  if constexpr (kType == GgmlType::kQ6_K) {
    *dw = _mm512_mul_ps(d, ByteFactors(ha + 16 + 16 * j, hb + 16 + 16 * j, true));
    *dw2 = _mm512_mul_ps(d, ByteFactors(ha + 24 + 16 * j, hb + 24 + 16 * j, true));
  } else {
    *dw = _mm512_mul_ps(d, ByteFactors(ha + 32 + 8 * j, hb + 32 + 8 * j, false));
    *mw = _mm512_mul_ps(neg_dmin, ByteFactors(ha + 96 + 8 * j, hb + 96 + 8 * j, false));
  }
}

// v shifted so that bit `from` lands on bit 4 (a constant after unrolling).
inline __m512i ToBit4(__m512i v, int from) {
  return from <= 4 ? _mm512_slli_epi16(v, 4 - from) : _mm512_srli_epi16(v, from - 4);
}

// Sub-block quants qa, qb (16 rows) against T tokens: dot += the low nibbles' products
// (values 0..15), dot2 += the high nibbles' (16..31), codes completed with their high bits
// (Q5_K, Q6_K) and re-centred (Q6_K: - 32).
template <GgmlType kType, bool kVnni, int T>
inline void KDots(const uint8_t* qa, const uint8_t* qb, const uint8_t* const (&xq)[T], size_t xoff,
                  __m512i (&dot)[T], __m512i (&dot2)[T]) {
  constexpr int kHigh = KHighBits(kType);
  const __m512i nibble16 = _mm512_set1_epi16(0x0F);
  const __m512i high_mask = _mm512_set1_epi16(static_cast<int16_t>(((1 << kHigh) - 1) << 4));
  const __m512i center = _mm512_set1_epi16(32);
#pragma GCC unroll 16
  for (int c = 0; c < 8; ++c) {
    const __m512i raw = _mm512_cvtepu8_epi16(Join128(qa + 16 * c, qb + 16 * c));
    __m512i lo = _mm512_and_si512(raw, nibble16);  // values 2c, 2c + 1
    __m512i hi = _mm512_srli_epi16(raw, 4);        // values 2c + 16, 2c + 17
    if constexpr (kHigh > 0) {
      const size_t h = 128 + 16 * KHighChunk(kType, c);
      const __m512i bits = _mm512_cvtepu8_epi16(Join128(qa + h, qb + h));
      lo = _mm512_or_si512(lo, _mm512_and_si512(ToBit4(bits, KHighShift(kType, c, 0)), high_mask));
      hi = _mm512_or_si512(hi, _mm512_and_si512(ToBit4(bits, KHighShift(kType, c, 1)), high_mask));
    }
    if constexpr (kType == GgmlType::kQ6_K) {
      lo = _mm512_sub_epi16(lo, center);
      hi = _mm512_sub_epi16(hi, center);
    }
#pragma GCC unroll 12
    for (int t = 0; t < T; ++t) {
      const uint8_t* xb = xq[t] + xoff + 4 * c;  // int16 pair (2c, 2c + 1)
      dot[t] = DotPairs<kVnni>(dot[t], lo, Broadcast32(xb));
      dot2[t] = DotPairs<kVnni>(dot2[t], hi, Broadcast32(xb + 32));
    }
  }
}

// KDots over int8 activations (vpdpbusd: the codes are the unsigned operand, Q6_K's too,
// whose callers subtract 32 h16): chunk pair p (chunks 2p, 2p + 1) of both groups joined as
// the int8 Q4 path joins them, so a row's dword lane holds the codes of values 4p .. 4p + 3
// (low nibbles, into dot) and 4p + 16 .. 4p + 19 (high nibbles, into dot2; dot2 may be dot).
// The high chunk serving both chunks is joined the same way with itself, so a lane's low
// word carries chunk 2p's fields and its high word chunk 2p + 1's: one variable word shift
// puts each at bit 0.
template <GgmlType kType, int T>
inline void KDots8(const uint8_t* qa, const uint8_t* qb, const uint8_t* const (&xq)[T], size_t xoff,
                   __m512i order, __m512i (&dot)[T], __m512i (&dot2)[T]) {
  constexpr int kHigh = KHighBits(kType);
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  const __m512i field = _mm512_set1_epi8(static_cast<char>((1 << kHigh) - 1));
#pragma GCC unroll 4
  for (int p = 0; p < 4; ++p) {
    const __m512i z = _mm512_permutexvar_epi16(order, Join256(qa + 32 * p, qb + 32 * p));
    __m512i lo = _mm512_and_si512(z, nibble);                        // values 4p .. 4p + 3
    __m512i hi = _mm512_and_si512(_mm512_srli_epi16(z, 4), nibble);  // + 16
    if constexpr (kHigh > 0) {
      const int c = 2 * p;
      const size_t h = 128 + 16 * KHighChunk(kType, c);  // chunks c, c + 1 share it
      const __m128i ha = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qa + h));
      const __m128i hb = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qb + h));
      const __m512i hz = _mm512_permutexvar_epi16(
          order, _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set_m128i(ha, ha)),
                                    _mm256_set_m128i(hb, hb), 1));
      const __m512i shift_lo =
          _mm512_set1_epi32((KHighShift(kType, c + 1, 0) << 16) | KHighShift(kType, c, 0));
      const __m512i shift_hi =
          _mm512_set1_epi32((KHighShift(kType, c + 1, 1) << 16) | KHighShift(kType, c, 1));
      lo = _mm512_or_si512(
          lo, _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(hz, shift_lo), field), 4));
      hi = _mm512_or_si512(
          hi, _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(hz, shift_hi), field), 4));
    }
#pragma GCC unroll 12
    for (int t = 0; t < T; ++t) {
      const uint8_t* xb = xq[t] + xoff + 4 * p;
      dot[t] = _mm512_dpbusd_epi32(dot[t], lo, Broadcast32(xb));
      dot2[t] = _mm512_dpbusd_epi32(dot2[t], hi, Broadcast32(xb + 16));
    }
  }
}

// Q6_K's scale step: the two halves' dots, each with its own factor.
template <int T>
inline void ScaleHalves(const __m512i (&dot)[T], const __m512i (&dot2)[T], __m512 dw, __m512 dw2,
                        const float* const (&xd)[T], int64_t b, __m512 (&acc)[T]) {
#pragma GCC unroll 12
  for (int t = 0; t < T; ++t) {
    const __m512 dt = _mm512_set1_ps(xd[t][b]);
    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[t]), _mm512_mul_ps(dw, dt), acc[t]);
    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot2[t]), _mm512_mul_ps(dw2, dt), acc[t]);
  }
}

// The block's 16 weight scales, and the offset factor (Q4_1 / Q5_1: m_w; Q4_0: -8 d_w;
// Q5_0: -16 d_w; int8 Q8_0: -128 d_w; int16 Q8_0: unused).
template <GgmlType kType, bool kInt8>
inline void BlockScales(const uint8_t* ba, const uint8_t* bb, __m512* dw, __m512* mw) {
  *dw = _mm512_cvtph_ps(Join128(ba, bb));
  if constexpr (kType == GgmlType::kQ4_1 || kType == GgmlType::kQ5_1) {
    *mw = _mm512_cvtph_ps(Join128(ba + 16, bb + 16));
  } else if constexpr (kType == GgmlType::kQ4_0) {
    *mw = _mm512_mul_ps(*dw, _mm512_set1_ps(-8.0f));
  } else if constexpr (kType == GgmlType::kQ5_0) {
    *mw = _mm512_mul_ps(*dw, _mm512_set1_ps(-16.0f));
  } else if constexpr (kInt8) {
    *mw = _mm512_mul_ps(*dw, _mm512_set1_ps(-128.0f));
  } else {
    *mw = _mm512_setzero_ps();
  }
}

// Groups ga, gb (16 rows; gb == ga for a lone last group) against tokens [t0, t0 + T):
// out[t] = the 16 rows' results; pa, pb: the groups to prefetch block by block meanwhile
// (PrefetchBlock; nullptr: none).
template <GgmlType kType, bool kVnni, bool kInt8, int T>
void Tile16(const QuantMatMulArgs& a, const uint8_t* ga, const uint8_t* gb, int64_t t0,
            const uint8_t* pa, const uint8_t* pb, __m512 (&out)[T]) {
  constexpr bool kQ8 = kType == GgmlType::kQ8_0;
  constexpr bool kK = IsKQuantType(kType);
  constexpr bool kHighChunks = RunsPackedOnly(kType);  // K-quants, Q5_0, Q5_1
  static_assert(!kHighChunks || !kInt8 || kVnni, "int8 K-quant / Q5 kernels need VNNI");
  // K-quants: the average bytes of a 32-value block (super-blocks are 8 of them), what the
  // block-by-block prefetch steps by.
  constexpr size_t kBlockBytes = kK ? PackedKSuperBytes(kType) / 8 : PackedBlockBytes(kType);
  constexpr size_t kHead = PackedHeadBytes(kType);
  const uint8_t* xq[T];
  const float* xd[T];
  const float* xs[T];
  __m512 acc[T];
#pragma GCC unroll 12
  for (int t = 0; t < T; ++t) {
    const int64_t row = t0 + t;
    xq[t] = kInt8 ? reinterpret_cast<const uint8_t*>(a.x.qs8 + row * a.x.qs_stride)
                  : reinterpret_cast<const uint8_t*>(a.x.qs + row * a.x.qs_stride);
    xd[t] = a.x.d + row * a.x.ds_stride;
    xs[t] = a.x.s + row * a.x.ds_stride;
    acc[t] = _mm512_setzero_ps();
  }
  constexpr size_t kValueBytes = kInt8 ? 1 : 2;
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  const __m512i sign = _mm512_set1_epi8(static_cast<char>(0x80));
  const __m512i order = _mm512_load_si512(kPairOrder.idx);
  __m512 kd = _mm512_setzero_ps(), kneg_dmin = _mm512_setzero_ps();  // K: the super-block's
  for (int64_t b = 0; b < a.blocks; ++b) {
    PrefetchBlock<kBlockBytes>(pa, b);
    PrefetchBlock<kBlockBytes>(pb, b);
    if constexpr (kHighChunks) {
      __m512 dw, mw, dw2;
      const uint8_t *qa, *qb;  // the 32-value block's quants in groups a, b
      if constexpr (kK) {
        const size_t so = (b / 8) * PackedKSuperBytes(kType);
        const int j = static_cast<int>(b % 8);
        if (j == 0) KSuperScales<kType>(ga + so, gb + so, &kd, &kneg_dmin);
        KScales<kType>(ga + so, gb + so, j, kd, kneg_dmin, &dw, &mw, &dw2);
        const size_t qo = so + PackedKHeadBytes(kType) + j * PackedKSubBytes(kType);
        qa = ga + qo;
        qb = gb + qo;
      } else {
        BlockScales<kType, kInt8>(ga + b * kBlockBytes, gb + b * kBlockBytes, &dw, &mw);
        qa = ga + b * kBlockBytes + kHead;
        qb = gb + b * kBlockBytes + kHead;
      }
      __m512i dot[T], dot2[T];
#pragma GCC unroll 12
      for (int t = 0; t < T; ++t) dot[t] = dot2[t] = _mm512_setzero_si512();
      if constexpr (kInt8 && kType == GgmlType::kQ6_K) {
        KDots8<kType, T>(qa, qb, xq, b * kBlock, order, dot, dot2);
#pragma GCC unroll 12
        for (int t = 0; t < T; ++t) {  // codes q, not q - 32: subtract 32 Σ qs per half
          const int32_t* h = a.x.h16 + (t0 + t) * 2 * a.x.ds_stride + 2 * b;
          dot[t] = _mm512_sub_epi32(dot[t], _mm512_set1_epi32(32 * h[0]));
          dot2[t] = _mm512_sub_epi32(dot2[t], _mm512_set1_epi32(32 * h[1]));
        }
      } else if constexpr (kInt8) {
        KDots8<kType, T>(qa, qb, xq, b * kBlock, order, dot, dot);
      } else {
        KDots<kType, kVnni, T>(qa, qb, xq, b * kBlock * 2, dot, dot2);
      }
      if constexpr (kType == GgmlType::kQ6_K) {
        ScaleHalves<T>(dot, dot2, dw, dw2, xd, b, acc);
      } else {
        if constexpr (!kInt8) {
#pragma GCC unroll 12
          for (int t = 0; t < T; ++t) dot[t] = _mm512_add_epi32(dot[t], dot2[t]);
        }
        ScaleBlock<kType, kInt8, T>(dot, dw, mw, xd, xs, b, acc);
      }
      continue;
    }
    const uint8_t* ba = ga + b * kBlockBytes;
    const uint8_t* bb = gb + b * kBlockBytes;
    __m512 dw, mw;
    BlockScales<kType, kInt8>(ba, bb, &dw, &mw);
    const uint8_t* qa = ba + kHead;
    const uint8_t* qb = bb + kHead;
    const size_t xoff = b * kBlock * kValueBytes;
    __m512i dot[T];
#pragma GCC unroll 12
    for (int t = 0; t < T; ++t) dot[t] = _mm512_setzero_si512();
    if constexpr (kInt8) {
      // Chunk pairs: Q4 4 (values 4p .. 4p + 3 and + 16), Q8_0 8 (values 4p .. 4p + 3).
      constexpr int kPairs = kQ8 ? 8 : 4;
#pragma GCC unroll 16
      for (int p = 0; p < kPairs; ++p) {
        const __m512i z = _mm512_permutexvar_epi16(order, Join256(qa + 32 * p, qb + 32 * p));
        if constexpr (kQ8) {
          const __m512i u = _mm512_xor_si512(z, sign);
#pragma GCC unroll 12
          for (int t = 0; t < T; ++t) {
            dot[t] = _mm512_dpbusd_epi32(dot[t], u, Broadcast32(xq[t] + xoff + 4 * p));
          }
        } else {
          const __m512i lo = _mm512_and_si512(z, nibble);
          const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(z, 4), nibble);
#pragma GCC unroll 12
          for (int t = 0; t < T; ++t) {
            const uint8_t* xb = xq[t] + xoff + 4 * p;
            dot[t] = _mm512_dpbusd_epi32(dot[t], lo, Broadcast32(xb));
            dot[t] = _mm512_dpbusd_epi32(dot[t], hi, Broadcast32(xb + 16));
          }
        }
      }
    } else if constexpr (kQ8) {
#pragma GCC unroll 16
      for (int c = 0; c < 16; ++c) {
        const __m512i w = _mm512_cvtepi8_epi16(Join128(qa + 16 * c, qb + 16 * c));
#pragma GCC unroll 12
        for (int t = 0; t < T; ++t) {
          dot[t] = DotPairs<kVnni>(dot[t], w, Broadcast32(xq[t] + xoff + 4 * c));
        }
      }
    } else {
      const __m512i nibble16 = _mm512_set1_epi16(0x0F);
      // A second accumulator per token for the high nibbles: two dependency chains per
      // token instead of one.
      __m512i dot2[T];
#pragma GCC unroll 12
      for (int t = 0; t < T; ++t) dot2[t] = _mm512_setzero_si512();
#pragma GCC unroll 16
      for (int c = 0; c < 8; ++c) {
        const __m512i raw = _mm512_cvtepu8_epi16(Join128(qa + 16 * c, qb + 16 * c));
        const __m512i lo = _mm512_and_si512(raw, nibble16);  // values 2c, 2c + 1
        const __m512i hi = _mm512_srli_epi16(raw, 4);        // values 2c + 16, 2c + 17
#pragma GCC unroll 12
        for (int t = 0; t < T; ++t) {
          const uint8_t* xb = xq[t] + xoff + 4 * c;  // int16 pair (2c, 2c + 1)
          dot[t] = DotPairs<kVnni>(dot[t], lo, Broadcast32(xb));
          dot2[t] = DotPairs<kVnni>(dot2[t], hi, Broadcast32(xb + 32));
        }
      }
#pragma GCC unroll 12
      for (int t = 0; t < T; ++t) dot[t] = _mm512_add_epi32(dot[t], dot2[t]);
    }
    ScaleBlock<kType, kInt8, T>(dot, dw, mw, xd, xs, b, acc);
  }
#pragma GCC unroll 12
  for (int t = 0; t < T; ++t) out[t] = acc[t];
}

// Rows [r0, r0 + 16) ∩ [.., row_end) of tokens [t0, t0 + T).
template <int T>
inline void Store16(const QuantMatMulArgs& a, const __m512 (&v)[T], int64_t r0, int64_t row_end,
                    int64_t t0) {
  const __mmask16 mask = avx512::FirstLanes(static_cast<int>(std::min<int64_t>(16, row_end - r0)));
  for (int t = 0; t < T; ++t) _mm512_mask_storeu_ps(a.y + (t0 + t) * a.ldy + r0, mask, v[t]);
}

template <GgmlType kType, bool kVnni, bool kInt8, int T>
inline void RunTile(const QuantMatMulArgs& a, const uint8_t* ga, const uint8_t* gb, int64_t r0,
                    int64_t row_end, int64_t t0, const uint8_t* pa, const uint8_t* pb) {
  __m512 v[T];
  Tile16<kType, kVnni, kInt8, T>(a, ga, gb, t0, pa, pb, v);
  Store16<T>(a, v, r0, row_end, t0);
}

template <GgmlType kType, bool kVnni, bool kInt8, int... Ts>
inline void DispatchTile(int tile, const QuantMatMulArgs& a, const uint8_t* ga, const uint8_t* gb,
                         int64_t r0, int64_t row_end, int64_t t0, const uint8_t* pa,
                         const uint8_t* pb, std::integer_sequence<int, Ts...>) {
  // tile in [1, TileFor(kInt8, kType)]: exactly one instantiation runs.
  ((tile == Ts + 1 ? RunTile<kType, kVnni, kInt8, Ts + 1>(a, ga, gb, r0, row_end, t0, pa, pb)
                   : void()),
   ...);
}

template <GgmlType kType, bool kVnni, bool kInt8>
void RowsX16(const QuantMatMulArgs& a, int64_t row_begin, int64_t row_end) {
  assert(row_begin % kPackRows == 0);
  const size_t group_bytes = a.row_stride;
  const GroupSpan span = GroupsOf(row_begin, row_end);
  const int64_t g_end = span.end;
  PrefetchLeadGroups(a.w, group_bytes, span);
  for (int64_t g = span.begin; g < g_end; g += 2) {
    const uint8_t* ga = a.w + g * group_bytes;
    // A lone last group is paired with itself; its copy's lanes are not stored.
    const uint8_t* gb = g + 1 < g_end ? ga + group_bytes : ga;
    // The pair after this one (kPrefetchGroupsAhead = 2), prefetched by the first tile.
    const uint8_t* pa = PrefetchTarget(a.w, group_bytes, span, g);
    const uint8_t* pb = PrefetchTarget(a.w, group_bytes, span, g + 1);
    const int64_t r0 = g * kPackRows;
    for (int64_t t = 0; t < a.n;) {
      const int tile = NearEqualTile(a.n - t, TileFor(kInt8, kType));
      DispatchTile<kType, kVnni, kInt8>(tile, a, ga, gb, r0, row_end, t, t == 0 ? pa : nullptr,
                                        t == 0 ? pb : nullptr,
                                        std::make_integer_sequence<int, TileFor(kInt8, kType)>());
      t += tile;
    }
  }
}

template <bool kVnni, bool kInt8>
void MatMulX16(const QuantMatMulArgs& a, int64_t row_begin, int64_t row_end) {
  switch (a.type) {
    case GgmlType::kQ4_0:
      return RowsX16<GgmlType::kQ4_0, kVnni, kInt8>(a, row_begin, row_end);
    case GgmlType::kQ4_1:
      return RowsX16<GgmlType::kQ4_1, kVnni, kInt8>(a, row_begin, row_end);
    case GgmlType::kQ8_0:
      return RowsX16<GgmlType::kQ8_0, kVnni, kInt8>(a, row_begin, row_end);
    default:
      break;
  }
  // K-quants and Q5 (int8 with VNNI: the only int8 tables here).
  if constexpr (!kInt8 || kVnni) {
    switch (a.type) {
      case GgmlType::kQ5_0:
        return RowsX16<GgmlType::kQ5_0, kVnni, kInt8>(a, row_begin, row_end);
      case GgmlType::kQ5_1:
        return RowsX16<GgmlType::kQ5_1, kVnni, kInt8>(a, row_begin, row_end);
      case GgmlType::kQ4_K:
        return RowsX16<GgmlType::kQ4_K, kVnni, kInt8>(a, row_begin, row_end);
      case GgmlType::kQ5_K:
        return RowsX16<GgmlType::kQ5_K, kVnni, kInt8>(a, row_begin, row_end);
      default:
        return RowsX16<GgmlType::kQ6_K, kVnni, kInt8>(a, row_begin, row_end);
    }
  }
}

}  // namespace

void QuantizeNaturalAvx512(const float* x, int64_t blocks, GgmlType /*weight_type*/, int16_t* qs,
                           float* d, float* s) {
  for (int64_t b = 0; b < blocks; ++b) {
    _mm512_storeu_si512(qs + b * kBlock, avx512::QuantizeBlock(x + b * kBlock, d + b, s + b));
  }
}

void Quantize8NaturalAvx512(const float* x, int64_t blocks, GgmlType /*weight_type*/, int8_t* qs,
                            float* d, float* s) {
  for (int64_t b = 0; b < blocks; ++b) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs + b * kBlock),
                        avx512::QuantizeBlock8(x + b * kBlock, d + b, s + b));
  }
}

void MatMulQuantX8Avx512(const QuantMatMulArgs& a, int64_t row_begin, int64_t row_end) {
  MatMulX16<false, false>(a, row_begin, row_end);
}

void MatMulQuantX8Avx512Vnni(const QuantMatMulArgs& a, int64_t row_begin, int64_t row_end) {
  MatMulX16<true, false>(a, row_begin, row_end);
}

void MatMulQuant8X8Avx512Vnni(const QuantMatMulArgs& a, int64_t row_begin, int64_t row_end) {
  MatMulX16<true, true>(a, row_begin, row_end);
}

}  // namespace specnode::cpu_kernels
