// AVX2 kernel over row-interleaved weights (cpu_repack.h; compiled with -mavx2 -mfma
// -mf16c, run only when CpuFeatures::avx2): one ymm lane per output row, 8 rows per
// instruction, int16 or int8 activations in natural order (the avx2 table's Quantize /
// Quantize8).
//
// Per block and token: the activation pair (2c, 2c + 1) is broadcast (a load, no ALU op)
// and multiplied against chunk c's 8 rows by one vpmaddwd (int16 pairs -> int32 per row);
// the 16 products of a block are summed in int32 (exact), converted once and scaled by one
// FMA for all 8 rows. A Q4 chunk of 16 bytes is widened once per tile (vpmovzxbw, then its
// low and high nibbles are two pairs of values), a Q8_0 chunk by one vpmovsxbw. No gather,
// no horizontal sum: the accumulators are the 8 rows' results.
//
// Int8 activations (MatMulQuant8X8Avx2): vpmaddubsw multiplies 32 u8 x s8 pairs, so each
// row's lane needs 4 consecutive quant bytes; chunks c and c + 1 hold 2 per row, and one
// word unpack (lo/hi) + insert per chunk pair and tile joins them: dword i = row i's quant
// bytes 2c .. 2c + 3. Q4: the low / high nibbles are then values 2c .. 2c + 3 / + 16, times
// the token's 4 activations broadcast as one dword; the pair sums (|·| <= 2 * 15 * 128)
// are added in int16 over the whole block (8 terms per word: |Σ| <= 30720, no wrap) and
// widened once per block by vpmaddwd with ones, so a block costs 8 vpmaddubsw + 8 vpaddw
// per token against the int16 kernel's 16 vpmaddwd + 16 vpaddd. Q8_0 has no such headroom
// (|q| <= 128): the signs move onto the activations (vpsignb, as the natural avx2 int8
// kernel does), |q| is the unsigned operand, each pair sum is widened at once, and
// Σ (q + 128) qs = Σ q qs + 128 Σ qs in int32 reproduces PackedMatMulReference8's dot
// exactly (activations |qs| <= 127, as the quantiser makes them).
//
// K-quants (Q4_K, Q5_K, Q6_K; TileKX8, int8 TileK8X8): per 32-value sub-block the Q4 paths
// above, with high bits or'ed into the widened nibbles (int16: Q6_K's codes re-centred;
// int8: corrected by 32 h16), and the low / high nibble sums kept apart for Q6_K's two
// per-half scales (cpu_repack_kquant.h). Q5_0 / Q5_1 blocks run the same tiles (their bit 4
// is laid out as Q5_K's) with a Q4 block's per-block factors (BlockWalk).
//
// Arithmetic (and so the bits of every result) is PackedMatMulReference's (int8:
// PackedMatMulReference8's); FMAs are spelled out, so -ffp-contract has nothing to fuse.
#include <immintrin.h>

#include <algorithm>
#include <cassert>
#include <cstdint>

#include "model/cpu/cpu_kernels.h"
#include "model/cpu/cpu_repack.h"
#include "model/cpu/cpu_repack_kquant.h"

namespace specnode::cpu_kernels {
namespace {

constexpr int kBlock = kQuantBlock;
constexpr int kTile = 4;   // tokens per pass over a group's weights (int16)
constexpr int kTile8 = 4;  // the same for int8 activations

// The 32-bit word at p in all 8 lanes, as one load: two int16 activations (the int16 tile's
// pair 2c, 2c + 1) or four int8 ones (the int8 tile's values 2c .. 2c + 3).
inline __m256i BroadcastDword(const void* p) {
  return _mm256_castps_si256(_mm256_broadcast_ss(static_cast<const float*>(p)));
}

// Token pointers and the 8-row accumulators of one tile of T tokens (both widths).
template <typename Act, int T>
struct TileTokens {
  const Act* xq[T];
  const float* xd[T];
  const float* xs[T];
  __m256 acc[T];

  TileTokens(const Act* qs, const QuantActs& x, int64_t t0) {
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      xq[t] = qs + (t0 + t) * x.qs_stride;
      xd[t] = x.d + (t0 + t) * x.ds_stride;
      xs[t] = x.s + (t0 + t) * x.ds_stride;
      acc[t] = _mm256_setzero_ps();
    }
  }

  // Block b's scale step (cpu_repack.h): acc = fma(float(dot), d_w * d_t, acc), then, when
  // the type has a minimum term, acc = fma(mw, s_t, acc).
  template <bool kMin>
  void AddBlock(const __m256i (&dot)[T], __m256 dw, __m256 mw, int64_t b) {
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      const __m256 scale = _mm256_mul_ps(dw, _mm256_broadcast_ss(xd[t] + b));
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[t]), scale, acc[t]);
      if constexpr (kMin) acc[t] = _mm256_fmadd_ps(mw, _mm256_broadcast_ss(xs[t] + b), acc[t]);
    }
  }

  // Q6_K's scale step: the sums of block b's two 16-value halves, each with its own factor
  // (cpu_repack_kquant.h): acc = fma(float(dot), dw d_t, acc), then the same for dot2, dw2.
  void AddHalves(const __m256i (&dot)[T], const __m256i (&dot2)[T], __m256 dw, __m256 dw2,
                 int64_t b) {
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      const __m256 dt = _mm256_broadcast_ss(xd[t] + b);
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[t]), _mm256_mul_ps(dw, dt), acc[t]);
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot2[t]), _mm256_mul_ps(dw2, dt), acc[t]);
    }
  }
};

// A packed block's 8 row scales d_w, and the multiplier of s_t in its minimum term: m_w
// (Q4_1, Q5_1), -8 d_w (Q4_0), -16 d_w (Q5_0), -128 d_w (Q8_0 with int8 activations), none
// (Q8_0, int16).
template <GgmlType kType, bool kInt8>
inline void BlockScales(const uint8_t* blk, __m256* dw, __m256* mw) {
  *dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk)));
  if constexpr (kType == GgmlType::kQ4_1 || kType == GgmlType::kQ5_1) {
    *mw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 16)));
  } else if constexpr (kType == GgmlType::kQ4_0) {
    *mw = _mm256_mul_ps(*dw, _mm256_set1_ps(-8.0f));
  } else if constexpr (kType == GgmlType::kQ5_0) {
    *mw = _mm256_mul_ps(*dw, _mm256_set1_ps(-16.0f));
  } else if constexpr (kInt8) {
    *mw = _mm256_mul_ps(*dw, _mm256_set1_ps(-128.0f));
  } else {
    *mw = _mm256_setzero_ps();
  }
}

// K-quants (cpu_repack_kquant.h). 8 byte factors (one per row) as floats.
inline __m256 ByteFactors(const uint8_t* p, bool is_signed) {
  const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm256_cvtepi32_ps(is_signed ? _mm256_cvtepi8_epi32(v) : _mm256_cvtepu8_epi32(v));
}

// The super-block's f16 d (and -dmin) of 8 rows, converted once for its 8 sub-blocks.
template <GgmlType kType>
inline void KSuperScales(const uint8_t* h, __m256* d, __m256* neg_dmin) {
  *d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h)));
  if constexpr (kType != GgmlType::kQ6_K) {
    *neg_dmin =
        _mm256_xor_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + 16))),
                      _mm256_set1_ps(-0.0f));
  }
}

// Sub-block j's factors for the 8 rows of the super-block at h: d * sc_j and (-dmin) * m_j
// (Q4_K / Q5_K), or d * sc of its two halves (Q6_K: dw for values 0..15, dw2 for 16..31).
template <GgmlType kType>
inline void KScales(const uint8_t* h, int j, __m256 d, __m256 neg_dmin, __m256* dw, __m256* mw,
                    __m256* dw2) {
  if constexpr (kType == GgmlType::kQ6_K) {
    *dw = _mm256_mul_ps(d, ByteFactors(h + 16 + 16 * j, true));
    *dw2 = _mm256_mul_ps(d, ByteFactors(h + 24 + 16 * j, true));
  } else {
    *dw = _mm256_mul_ps(d, ByteFactors(h + 32 + 8 * j, false));
    *mw = _mm256_mul_ps(neg_dmin, ByteFactors(h + 96 + 8 * j, false));
  }
}

// Average bytes of a walked 32-value block of 8 rows: what the block-by-block prefetch
// steps by (a K-quant super-block holds 8 of them).
constexpr size_t WalkBlockBytes(GgmlType type) {
  return IsKQuantType(type) ? PackedKSuperBytes(type) / 8 : PackedBlockBytes(type);
}

// Walks a group's 32-value K-quant blocks in order: block b's quants and factors, d / dmin
// converted once at each super-block's first block.
template <GgmlType kType>
struct BlockWalk {
  __m256 d = _mm256_setzero_ps();
  __m256 neg_dmin = _mm256_setzero_ps();

  const uint8_t* Next(const uint8_t* group, int64_t b, __m256* dw, __m256* mw, __m256* dw2) {
    const uint8_t* h = group + (b / 8) * PackedKSuperBytes(kType);
    const int j = static_cast<int>(b % 8);
    if (j == 0) KSuperScales<kType>(h, &d, &neg_dmin);
    KScales<kType>(h, j, d, neg_dmin, dw, mw, dw2);
    return h + PackedKHeadBytes(kType) + j * PackedKSubBytes(kType);
  }
};

// Q5_0 / Q5_1: each block carries its own factors (BlockScales); the quants follow them.
template <GgmlType kType>
requires(IsQ5Type(kType)) struct BlockWalk<kType> {
  const uint8_t* Next(const uint8_t* group, int64_t b, __m256* dw, __m256* mw, __m256*) {
    const uint8_t* blk = group + b * PackedBlockBytes(kType);
    BlockScales<kType, false>(blk, dw, mw);
    return blk + PackedHeadBytes(kType);
  }
};

// v shifted so that bit `from` lands on bit 4 (a constant after unrolling).
inline __m256i ToBit4(__m256i v, int from) {
  return from <= 4 ? _mm256_slli_epi16(v, 4 - from) : _mm256_srli_epi16(v, from - 4);
}

// Group `group`'s super-blocks (K-quants) or Q5 blocks against tokens [t0, t0 + T): out[t] =
// the 8 rows' results (PackedKQuantReference's / PackedMatMulReference's arithmetic); `pf`
// as TileX8.
template <GgmlType kType, int T>
void TileKX8(const QuantMatMulArgs& a, const uint8_t* group, int64_t t0, const uint8_t* pf,
             __m256 (&out)[T]) {
  constexpr int kHigh = KHighBits(kType);
  constexpr bool kQ6 = kType == GgmlType::kQ6_K;
  TileTokens<int16_t, T> tok(a.x.qs, a.x, t0);
  const auto& xq = tok.xq;
  const __m256i nibble = _mm256_set1_epi16(0x0F);
  const __m256i high_mask = _mm256_set1_epi16(static_cast<int16_t>(((1 << kHigh) - 1) << 4));
  const __m256i center = _mm256_set1_epi16(32);
  BlockWalk<kType> walk;
  for (int64_t b = 0; b < a.blocks; ++b) {
    PrefetchBlock<WalkBlockBytes(kType)>(pf, b);
    __m256 dw, mw, dw2;
    const uint8_t* q = walk.Next(group, b, &dw, &mw, &dw2);
    __m256i dot[T], dot2[T];
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) dot[t] = dot2[t] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int c = 0; c < 8; ++c) {
      const __m256i raw =
          _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16 * c)));
      __m256i lo = _mm256_and_si256(raw, nibble);  // values 2c, 2c + 1
      __m256i hi = _mm256_srli_epi16(raw, 4);      // values 2c + 16, 2c + 17
      if constexpr (kHigh > 0) {
        const __m256i bits = _mm256_cvtepu8_epi16(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 128 + 16 * KHighChunk(kType, c))));
        lo =
            _mm256_or_si256(lo, _mm256_and_si256(ToBit4(bits, KHighShift(kType, c, 0)), high_mask));
        hi =
            _mm256_or_si256(hi, _mm256_and_si256(ToBit4(bits, KHighShift(kType, c, 1)), high_mask));
      }
      if constexpr (kQ6) {
        lo = _mm256_sub_epi16(lo, center);
        hi = _mm256_sub_epi16(hi, center);
      }
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t) {
        const int16_t* xb = xq[t] + b * kBlock + 2 * c;
        dot[t] = _mm256_add_epi32(dot[t], _mm256_madd_epi16(lo, BroadcastDword(xb)));
        dot2[t] = _mm256_add_epi32(dot2[t], _mm256_madd_epi16(hi, BroadcastDword(xb + 16)));
      }
    }
    if constexpr (kQ6) {
      tok.AddHalves(dot, dot2, dw, dw2, b);
    } else {
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t) dot[t] = _mm256_add_epi32(dot[t], dot2[t]);
      tok.template AddBlock<true>(dot, dw, mw, b);
    }
  }
#pragma GCC unroll 4
  for (int t = 0; t < T; ++t) out[t] = tok.acc[t];
}

// Group `group` (8 rows) against tokens [t0, t0 + T): out[t] = the 8 rows' results; `pf`:
// the group to prefetch block by block meanwhile (PrefetchBlock; nullptr: none).
template <GgmlType kType, int T>
void TileX8(const QuantMatMulArgs& a, const uint8_t* group, int64_t t0, const uint8_t* pf,
            __m256 (&out)[T]) {
  constexpr bool kQ8 = kType == GgmlType::kQ8_0;
  constexpr size_t kBlockBytes = PackedBlockBytes(kType);
  constexpr size_t kHead = PackedHeadBytes(kType);
  TileTokens<int16_t, T> tok(a.x.qs, a.x, t0);
  const auto& xq = tok.xq;
  const __m256i nibble = _mm256_set1_epi16(0x0F);
  for (int64_t b = 0; b < a.blocks; ++b) {
    const uint8_t* blk = group + b * kBlockBytes;
    PrefetchBlock<kBlockBytes>(pf, b);
    __m256 dw, mw;
    BlockScales<kType, false>(blk, &dw, &mw);
    const uint8_t* q = blk + kHead;
    __m256i dot[T];
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) dot[t] = _mm256_setzero_si256();
    if constexpr (kQ8) {
#pragma GCC unroll 2
      for (int c = 0; c < 16; ++c) {
        const __m256i w =
            _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16 * c)));
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) {
          const int16_t* xb = xq[t] + b * kBlock + 2 * c;
          dot[t] = _mm256_add_epi32(dot[t], _mm256_madd_epi16(w, BroadcastDword(xb)));
        }
      }
    } else {
#pragma GCC unroll 2
      for (int c = 0; c < 8; ++c) {
        const __m256i raw =
            _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16 * c)));
        const __m256i lo = _mm256_and_si256(raw, nibble);  // values 2c, 2c + 1
        const __m256i hi = _mm256_srli_epi16(raw, 4);      // values 2c + 16, 2c + 17
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) {
          const int16_t* xb = xq[t] + b * kBlock + 2 * c;
          const __m256i p = _mm256_add_epi32(_mm256_madd_epi16(lo, BroadcastDword(xb)),
                                             _mm256_madd_epi16(hi, BroadcastDword(xb + 16)));
          dot[t] = _mm256_add_epi32(dot[t], p);
        }
      }
    }
    tok.template AddBlock<!kQ8>(dot, dw, mw, b);
  }
#pragma GCC unroll 4
  for (int t = 0; t < T; ++t) out[t] = tok.acc[t];
}

// Chunks c and c + 1 of a block's quants as 8 dword lanes: lane i = row i's quant bytes
// 2c .. 2c + 3 (chunk c holds bytes 2c, 2c + 1 of row i at 2i, chunk c + 1 the next two).
inline __m256i JoinChunkPair(const uint8_t* chunk) {
  const __m128i c0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(chunk));
  const __m128i c1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(chunk + 16));
  return _mm256_set_m128i(_mm_unpackhi_epi16(c0, c1), _mm_unpacklo_epi16(c0, c1));
}

// Σ of the 32 int8 values at p, in all 8 dword lanes (exact).
inline __m256i BlockSum(const int8_t* p) {
  const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  __m256i v = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), x), _mm256_set1_epi16(1));
  v = _mm256_add_epi32(v, _mm256_shuffle_epi32(v, 0x4E));
  v = _mm256_add_epi32(v, _mm256_shuffle_epi32(v, 0xB1));
  return _mm256_add_epi32(v, _mm256_permute2x128_si256(v, v, 1));
}

// TileX8 over int8 activations (a.x.qs8, natural order).
template <GgmlType kType, int T>
void Tile8X8(const QuantMatMulArgs& a, const uint8_t* group, int64_t t0, const uint8_t* pf,
             __m256 (&out)[T]) {
  constexpr bool kQ8 = kType == GgmlType::kQ8_0;
  constexpr size_t kBlockBytes = PackedBlockBytes(kType);
  constexpr size_t kHead = PackedHeadBytes(kType);
  TileTokens<int8_t, T> tok(a.x.qs8, a.x, t0);
  const auto& xq = tok.xq;
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < a.blocks; ++b) {
    const uint8_t* blk = group + b * kBlockBytes;
    PrefetchBlock<kBlockBytes>(pf, b);
    __m256 dw, mw;
    BlockScales<kType, true>(blk, &dw, &mw);
    const uint8_t* q = blk + kHead;
    __m256i dot[T];
    if constexpr (kQ8) {
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) dot[t] = _mm256_setzero_si256();
#pragma GCC unroll 8
      for (int c = 0; c < 16; c += 2) {
        const __m256i w = JoinChunkPair(q + 16 * c);
        const __m256i uw = _mm256_sign_epi8(w, w);  // |q| as unsigned bytes (128 for -128)
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) {
          const __m256i x = BroadcastDword(xq[t] + b * kBlock + 2 * c);
          const __m256i p = _mm256_maddubs_epi16(uw, _mm256_sign_epi8(x, w));
          dot[t] = _mm256_add_epi32(dot[t], _mm256_madd_epi16(p, ones));
        }
      }
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        const __m256i sum = BlockSum(xq[t] + b * kBlock);
        dot[t] = _mm256_add_epi32(dot[t], _mm256_slli_epi32(sum, 7));  // + 128 Σ qs
      }
    } else {
      __m256i part[T];  // int16 pair sums, two words per row
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) part[t] = _mm256_setzero_si256();
#pragma GCC unroll 4
      for (int c = 0; c < 8; c += 2) {
        const __m256i w = JoinChunkPair(q + 16 * c);
        const __m256i lo = _mm256_and_si256(w, nibble);                        // 2c .. 2c + 3
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), nibble);  // + 16
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) {
          const int8_t* xb = xq[t] + b * kBlock + 2 * c;
          const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, BroadcastDword(xb)),
                                             _mm256_maddubs_epi16(hi, BroadcastDword(xb + 16)));
          part[t] = _mm256_add_epi16(part[t], p);
        }
      }
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) dot[t] = _mm256_madd_epi16(part[t], ones);
    }
    tok.template AddBlock<true>(dot, dw, mw, b);
  }
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) out[t] = tok.acc[t];
}

// TileKX8 over int8 activations (vpmaddubsw, the codes unsigned, Q5's too; Q6_K's halves are
// corrected by 32 h16 as cpu_repack_kquant.h says). A row's dword lane holds the codes of
// values 2c .. 2c + 3 (JoinChunkPair), their high bits joined the same way from the one high
// chunk serving chunks c, c + 1 (low word: chunk c's fields, high word: c + 1's, taken by
// two shifts and a word blend). vpmaddubsw's int16 pair sums (|·| <= 2 * 63 * 128) are
// added in int16 for two chunk pairs at most (|Σ| <= 32256, no saturation; Q4_K's four
// with codes below 16) and widened by vpmaddwd with ones.
template <GgmlType kType, int T>
void TileK8X8(const QuantMatMulArgs& a, const uint8_t* group, int64_t t0, const uint8_t* pf,
              __m256 (&out)[T]) {
  constexpr int kHigh = KHighBits(kType);
  constexpr bool kQ6 = kType == GgmlType::kQ6_K;
  TileTokens<int8_t, T> tok(a.x.qs8, a.x, t0);
  const auto& xq = tok.xq;
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  const __m256i field = _mm256_set1_epi8(static_cast<char>((1 << kHigh) - 1));
  const __m256i ones = _mm256_set1_epi16(1);
  BlockWalk<kType> walk;
  for (int64_t b = 0; b < a.blocks; ++b) {
    PrefetchBlock<WalkBlockBytes(kType)>(pf, b);
    __m256 dw, mw, dw2;
    const uint8_t* q = walk.Next(group, b, &dw, &mw, &dw2);
    __m256i dot[T], dot2[T], part[T], part2[T];
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
      dot[t] = dot2[t] = _mm256_setzero_si256();
      part[t] = part2[t] = _mm256_setzero_si256();
    }
#pragma GCC unroll 4
    for (int c = 0; c < 8; c += 2) {
      const __m256i w = JoinChunkPair(q + 16 * c);
      __m256i lo = _mm256_and_si256(w, nibble);                        // 2c .. 2c + 3
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), nibble);  // + 16
      if constexpr (kHigh > 0) {
        const __m128i hc =
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 128 + 16 * KHighChunk(kType, c)));
        const __m256i hz = _mm256_set_m128i(_mm_unpackhi_epi16(hc, hc), _mm_unpacklo_epi16(hc, hc));
        auto bits = [&](int part_index) {
          const __m256i a0 = _mm256_srli_epi16(hz, KHighShift(kType, c, part_index));
          const __m256i a1 = _mm256_srli_epi16(hz, KHighShift(kType, c + 1, part_index));
          return _mm256_slli_epi16(_mm256_and_si256(_mm256_blend_epi16(a0, a1, 0xAA), field), 4);
        };
        lo = _mm256_or_si256(lo, bits(0));
        hi = _mm256_or_si256(hi, bits(1));
      }
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t) {
        const int8_t* xb = xq[t] + b * kBlock + 2 * c;
        const __m256i plo = _mm256_maddubs_epi16(lo, BroadcastDword(xb));
        const __m256i phi = _mm256_maddubs_epi16(hi, BroadcastDword(xb + 16));
        if constexpr (kQ6) {
          part[t] = _mm256_add_epi16(part[t], plo);
          part2[t] = _mm256_add_epi16(part2[t], phi);
        } else {
          part[t] = _mm256_add_epi16(part[t], _mm256_add_epi16(plo, phi));
        }
      }
      // Widen before int16 sums could saturate: Q4_K after all four pairs, the others after
      // every second.
      if (kType != GgmlType::kQ4_K ? c % 4 == 2 : c == 6) {
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) {
          dot[t] = _mm256_add_epi32(dot[t], _mm256_madd_epi16(part[t], ones));
          part[t] = _mm256_setzero_si256();
          if constexpr (kQ6) {
            dot2[t] = _mm256_add_epi32(dot2[t], _mm256_madd_epi16(part2[t], ones));
            part2[t] = _mm256_setzero_si256();
          }
        }
      }
    }
    if constexpr (kQ6) {
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t) {  // codes q, not q - 32: subtract 32 Σ qs per half
        const int32_t* hs = a.x.h16 + (t0 + t) * 2 * a.x.ds_stride + 2 * b;
        dot[t] = _mm256_sub_epi32(dot[t], _mm256_set1_epi32(32 * hs[0]));
        dot2[t] = _mm256_sub_epi32(dot2[t], _mm256_set1_epi32(32 * hs[1]));
      }
      tok.AddHalves(dot, dot2, dw, dw2, b);
    } else {
      tok.template AddBlock<true>(dot, dw, mw, b);
    }
  }
#pragma GCC unroll 4
  for (int t = 0; t < T; ++t) out[t] = tok.acc[t];
}

// Writes the rows [r0, r0 + 8) ∩ [.., row_end) of tokens [t0, t0 + T).
template <int T>
inline void StoreX8(const QuantMatMulArgs& a, const __m256 (&v)[T], int64_t r0, int64_t row_end,
                    int64_t t0) {
  const int64_t valid = std::min<int64_t>(kPackRows, row_end - r0);
  for (int t = 0; t < T; ++t) {
    float* y = a.y + (t0 + t) * a.ldy + r0;
    if (valid == kPackRows) {
      _mm256_storeu_ps(y, v[t]);
    } else {
      alignas(32) float tmp[kPackRows];
      _mm256_store_ps(tmp, v[t]);
      std::copy(tmp, tmp + valid, y);
    }
  }
}

// One tile of T tokens against one group: TileX8 (int16) or Tile8X8 (int8).
template <GgmlType kType, bool kInt8, int T>
inline void RunTile(const QuantMatMulArgs& a, const uint8_t* group, int64_t r0, int64_t row_end,
                    int64_t t, const uint8_t* pf) {
  __m256 v[T];
  if constexpr (RunsPackedOnly(kType) && kInt8) {
    TileK8X8<kType, T>(a, group, t, pf, v);
  } else if constexpr (RunsPackedOnly(kType)) {
    TileKX8<kType, T>(a, group, t, pf, v);
  } else if constexpr (kInt8) {
    Tile8X8<kType, T>(a, group, t, pf, v);
  } else {
    TileX8<kType, T>(a, group, t, pf, v);
  }
  StoreX8<T>(a, v, r0, row_end, t);
}

template <GgmlType kType, bool kInt8>
void RowsX8(const QuantMatMulArgs& a, int64_t row_begin, int64_t row_end) {
  static_assert(kTile == 4 && kTile8 == 4, "the switch below covers tiles of 1..4");
  assert(row_begin % kPackRows == 0);
  const size_t group_bytes = a.row_stride;
  const GroupSpan span = GroupsOf(row_begin, row_end);
  const int64_t g_end = span.end;
  PrefetchLeadGroups(a.w, group_bytes, span);
  for (int64_t g = span.begin; g < g_end; ++g) {
    const uint8_t* group = a.w + g * group_bytes;
    const uint8_t* ahead = PrefetchTarget(a.w, group_bytes, span, g);
    const int64_t r0 = g * kPackRows;
    // As few tiles as possible, of near-equal sizes (5 tokens: 3 + 2); the first prefetches.
    for (int64_t t = 0; t < a.n;) {
      const int tile = NearEqualTile(a.n - t, kInt8 ? kTile8 : kTile);
      const uint8_t* pf = t == 0 ? ahead : nullptr;
      switch (tile) {
        case 4:
          RunTile<kType, kInt8, 4>(a, group, r0, row_end, t, pf);
          break;
        case 3:
          RunTile<kType, kInt8, 3>(a, group, r0, row_end, t, pf);
          break;
        case 2:
          RunTile<kType, kInt8, 2>(a, group, r0, row_end, t, pf);
          break;
        default:
          RunTile<kType, kInt8, 1>(a, group, r0, row_end, t, pf);
          break;
      }
      t += tile;
    }
  }
}

template <bool kInt8>
void MatMulX8(const QuantMatMulArgs& a, int64_t row_begin, int64_t row_end) {
  switch (a.type) {
    case GgmlType::kQ4_0:
      return RowsX8<GgmlType::kQ4_0, kInt8>(a, row_begin, row_end);
    case GgmlType::kQ4_1:
      return RowsX8<GgmlType::kQ4_1, kInt8>(a, row_begin, row_end);
    case GgmlType::kQ8_0:
      return RowsX8<GgmlType::kQ8_0, kInt8>(a, row_begin, row_end);
    case GgmlType::kQ5_0:
      return RowsX8<GgmlType::kQ5_0, kInt8>(a, row_begin, row_end);
    case GgmlType::kQ5_1:
      return RowsX8<GgmlType::kQ5_1, kInt8>(a, row_begin, row_end);
    default:
      break;
  }
  switch (a.type) {
    case GgmlType::kQ4_K:
      return RowsX8<GgmlType::kQ4_K, kInt8>(a, row_begin, row_end);
    case GgmlType::kQ5_K:
      return RowsX8<GgmlType::kQ5_K, kInt8>(a, row_begin, row_end);
    default:
      return RowsX8<GgmlType::kQ6_K, kInt8>(a, row_begin, row_end);
  }
}

}  // namespace

void MatMulQuantX8Avx2(const QuantMatMulArgs& a, int64_t row_begin, int64_t row_end) {
  MatMulX8<false>(a, row_begin, row_end);
}

void MatMulQuant8X8Avx2(const QuantMatMulArgs& a, int64_t row_begin, int64_t row_end) {
  MatMulX8<true>(a, row_begin, row_end);
}

}  // namespace specnode::cpu_kernels
