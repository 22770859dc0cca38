// AVX-512 kernels (compiled with avx512f/bw/vl/dq/vnni; run only when CpuFeatures::avx512,
// and the VNNI table only when avx512_vnni). The integer dot is vpdpwssd (VNNI) or
// vpmaddwd + vpaddd: a compile-time branch of one template, giving two tables so one
// machine can test both.
//
// Q4 blocks go in groups of 4. One two-source permute (vpermt2d; Q4_0: vpermt2w) of the group's
// quant bytes puts in dword j = 4m + k bytes 4m .. 4m+3 of block k = j % 4; read as words, nibble
// p of each word (a shift and a mask) is then plane p, 32 int16 weights in which int32 lane
// j holds values of block j % 4 only. This file's Quantize writes the activations in the
// matching order (cpu_kernels.h): four vpmaddwd/vpdpwssd then accumulate the whole group
// into one int32 vector, whose scales are the 128-bit pattern (s_0, s_1, s_2, s_3)
// repeated: a plain broadcast load. Per group and token that is 4 dot instructions, one
// conversion and one FMA; per group, one permute and 6 shifts/masks for the weights.
// Q8_0 blocks (34 bytes, too far apart for one permute) go in pairs instead: each block is
// sign-extended (vpmovsxbw), then two dword permutes interleave them so that int32 lane i
// holds values of block b + (i & 1), scales (s_b, s_b+1) repeated; an odd last block is
// paired with zeros. Quantize picks the order from the weight type.
// Int8 activations (the VNNI table's quantize8 / matmul_quant8): vpdpbusd on the same
// transposed group, 2 nibble planes of bytes per group, or Q8_0 pairs as u8 (quant + 128).
// Float weights (F32/F16/BF16) are cpu_kernels_avx512_float.cc.
//
// Float rule for batch invariance: every float add here takes an FMA result or a sum, never
// a bare product, so -ffp-contract cannot fuse anything differently between tile sizes.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

#include "model/cpu/cpu_kernels.h"
#include "model/cpu/cpu_kernels_avx512_common.h"

namespace specnode::cpu_kernels {
namespace {

constexpr int kBlock = kQuantBlock;
using avx512::QuantizeBlock;
using avx512::QuantizeBlock8;
// Quantised weights: up to 12 tokens per weight load. n tokens go in ceil(n / 12) tiles of
// near-equal size (9: one tile of 9; 16: 8 + 8), each an instantiation for its exact size,
// so a verification pass of K + 1 <= 12 tokens streams the weights once. 8 split 9 tokens
// into 5 + 4 and made a 9-token step cost as much as a 16-token one (DecodeStep, 1
// thread, int16: n=9 52 ms vs n=16 58-62 ms; with 12: 31-33 ms); 16 spills registers
// (n=16 in one tile: 86 ms against 55 ms as 8 + 8).
constexpr int kQuantTile = 12;
constexpr int kChunk = 16;  // blocks whose scales are converted together
// Loops over a tile's tokens carry `#pragma GCC unroll`: -O2 does not unroll them on its
// own, and rolled they keep the per-token accumulators in memory.

// Word indices into a pair of natural-order blocks (a, b) (index 32 + i is b's value i)
// producing the cpu_kernels.h activation order: Q4 plane p (for blocks k = 0, 1 of the
// pair; blocks 2, 3 use the same indices on the other pair), or Q8_0 half `p` (0, 1).
struct ActOrder {
  alignas(64) int16_t q4[4][32];
  alignas(64) int16_t q8[2][32];
  constexpr ActOrder() : q4(), q8() {
    for (int p = 0; p < 4; ++p) {
      for (int w = 0; w < 32; ++w) {  // w = 2 * (4m + k) + h
        const int j = w / 2, m = j / 4, k = j % 4, i = 2 * m + w % 2;
        const int v = p == 0 ? 2 * i : p == 1 ? 2 * i + 16 : p == 2 ? 2 * i + 1 : 2 * i + 17;
        q4[p][w] = static_cast<int16_t>((k & 1) * 32 + v);
      }
    }
    for (int p = 0; p < 2; ++p) {
      for (int w = 0; w < 32; ++w) {  // value 2e + h of the pair, e = 16p + w / 2
        const int e = 16 * p + w / 2;
        q8[p][w] = static_cast<int16_t>((e & 1) * 32 + 2 * (e / 2) + w % 2);
      }
    }
  }
};
constexpr ActOrder kActOrder;

// Writes whole 128-value groups (Q4) or 64-value pairs (Q8_0); blocks past `blocks` are
// zero.
void Quantize(const float* x, int64_t blocks, GgmlType weight_type, int16_t* qs, float* d,
              float* s) {
  const int per = weight_type == GgmlType::kQ8_0 ? 2 : 4;
  for (int64_t g = 0; g < blocks; g += per) {
    __m512i q[4] = {};
    for (int k = 0; k < per; ++k) {
      const int64_t b = g + k;
      q[k] = b < blocks ? QuantizeBlock(x + b * kBlock, d + b, s + b) : _mm512_setzero_si512();
    }
    int16_t* out = qs + g * kBlock;
    if (per == 2) {
      for (int p = 0; p < 2; ++p) {
        const __m512i idx = _mm512_load_si512(kActOrder.q8[p]);
        _mm512_storeu_si512(out + 32 * p, _mm512_permutex2var_epi16(q[0], idx, q[1]));
      }
      continue;
    }
    // Dwords j with j % 4 >= 2 (words w with w & 4) come from blocks 2, 3.
    constexpr __mmask32 kHighPair = 0xF0F0F0F0u;
    for (int p = 0; p < 4; ++p) {
      const __m512i idx = _mm512_load_si512(kActOrder.q4[p]);
      _mm512_storeu_si512(out + 32 * p, _mm512_mask_blend_epi16(
                                            kHighPair, _mm512_permutex2var_epi16(q[0], idx, q[1]),
                                            _mm512_permutex2var_epi16(q[2], idx, q[3])));
    }
  }
}

// Dword indices into two natural-order block pairs (A = blocks 0|1, B = blocks 2|3; index
// 16 + i is B's dword i) giving the int8 Q4 planes (cpu_kernels.h): plane p's dword j = 4m + k
// is block k's dword m + 4p. And the Q8_0 pair order: dword l is block (l & 1)'s dword l / 2.
struct ActOrder8 {
  alignas(64) int32_t q4[2][16];
  alignas(64) int32_t q8[16];
  constexpr ActOrder8() : q4(), q8() {
    for (int p = 0; p < 2; ++p) {
      for (int j = 0; j < 16; ++j) {
        const int m = j / 4, k = j % 4;
        q4[p][j] = (k / 2) * 16 + (k % 2) * 8 + m + 4 * p;
      }
    }
    for (int l = 0; l < 16; ++l) q8[l] = (l & 1) * 8 + l / 2;
  }
};
constexpr ActOrder8 kActOrder8;

inline __m512i Join(__m256i lo, __m256i hi) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

void Quantize8(const float* x, int64_t blocks, GgmlType weight_type, int8_t* qs, float* d,
               float* s) {
  const int per = weight_type == GgmlType::kQ8_0 ? 2 : 4;
  for (int64_t g = 0; g < blocks; g += per) {
    __m256i q[4] = {};
    for (int k = 0; k < per; ++k) {
      const int64_t b = g + k;
      q[k] = b < blocks ? QuantizeBlock8(x + b * kBlock, d + b, s + b) : _mm256_setzero_si256();
    }
    int8_t* out = qs + g * kBlock;
    const __m512i a = Join(q[0], q[1]);
    if (per == 2) {
      _mm512_storeu_si512(out, _mm512_permutexvar_epi32(_mm512_load_si512(kActOrder8.q8), a));
      continue;
    }
    const __m512i b = Join(q[2], q[3]);
    for (int p = 0; p < 2; ++p) {
      _mm512_storeu_si512(out + 64 * p,
                          _mm512_permutex2var_epi32(a, _mm512_load_si512(kActOrder8.q4[p]), b));
    }
  }
}

// A token's activations; q points at int16 or int8 values (Act).
template <typename Act>
struct TileActs {
  const Act* q;
  const float* d;
  const float* s;
};

template <typename Act>
inline TileActs<Act> ActsFor(const QuantActs& x, int64_t t) {
  const Act* q;
  if constexpr (sizeof(Act) == 1) {
    q = x.qs8;
  } else {
    q = x.qs;
  }
  return {q + t * x.qs_stride, x.d + t * x.ds_stride, x.s + t * x.ds_stride};
}

using avx512::FirstLanes;

// The 16 blocks' first 4 bytes (f16 d, then f16 m or quants) with one masked gather; masked
// lanes read nothing, so a short last chunk never touches memory past the row.
inline __m512i GatherHeads(const uint8_t* chunk, __m512i offsets, int nbc) {
  return _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), FirstLanes(nbc), offsets, chunk, 1);
}

inline __m512i HeadOffsets(size_t block_bytes) {
  return _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                            _mm512_set1_epi32(static_cast<int>(block_bytes)));
}

// The 16 gathered dwords' low f16 halves (words 0..15) then high halves (words 16..31):
// one word permute, where two vpmovdw cost two uops each.
struct HalvesOrder {
  alignas(64) int16_t idx[32];
  constexpr HalvesOrder() : idx() {
    for (int i = 0; i < 16; ++i) {
      idx[i] = static_cast<int16_t>(2 * i);
      idx[16 + i] = static_cast<int16_t>(2 * i + 1);
    }
  }
};
constexpr HalvesOrder kHalvesOrder;

inline __m512i SplitHalves(__m512i g) {
  return _mm512_permutexvar_epi16(_mm512_load_si512(kHalvesOrder.idx), g);
}

// (s_g, s_g+1, s_g+2, s_g+3) repeated over 16 lanes, from a stored scale vector.
inline __m512 GroupScales(const float* scales) {
  return _mm512_broadcast_f32x4(_mm_load_ps(scales));
}

// (s_j, s_j+1) repeated over 16 lanes, from a stored scale vector.
inline __m512 PairScales(const float* scales) {
  double pair;
  std::memcpy(&pair, scales, sizeof(pair));
  return _mm512_castpd_ps(_mm512_set1_pd(pair));
}

// Q8_0 quants of blocks (j, j+1) at p, p + 34 (or j alone, zeros for j+1) + 128 as u8,
// dword-interleaved like the int8 activations (cpu_kernels.h).
template <bool kSecond>
inline __m512i PairWeightsQ8U8(const uint8_t* p) {
  const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m256i b = kSecond ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 34))
                            : _mm256_set1_epi8(static_cast<char>(0x80));  // -> 0 after the flip
  const __m512i ab = _mm512_xor_si512(Join(a, b), _mm512_set1_epi8(static_cast<char>(0x80)));
  return _mm512_permutexvar_epi32(_mm512_load_si512(kActOrder8.q8), ab);
}

// Q8_0 quants of blocks (j, j+1) at p, p + 34 (or j alone, zeros for j+1), widened and
// dword-interleaved: w[h] holds values 16h .. 16h+15 of both blocks.
template <bool kSecond>
inline void PairWeightsQ8(const uint8_t* p, __m512i* w) {
  const __m512i a = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  const __m512i b =
      kSecond ? _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 34)))
              : _mm512_setzero_si512();
  w[0] = _mm512_permutex2var_epi32(
      a, _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23), b);
  w[1] = _mm512_permutex2var_epi32(
      a, _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31), b);
}

inline __mmask64 FirstBytes(int64_t k) { return k >= 64 ? ~0ULL : k <= 0 ? 0ULL : (1ULL << k) - 1; }

// Permutation transposing 4 blocks' quants by dwords: output dword j = 4m + k is bytes
// 4m .. 4m+3 of block k, which starts bb*k bytes after the first block's quants. Q4_1's
// 20-byte blocks keep quants dword-aligned, so a dword permute (one uop, where the word
// permute Q4_0's 18-byte blocks need is two) does it.
template <size_t kBlockBytes>
inline __m512i TransposeIndex() {
  if constexpr (kBlockBytes % 4 == 0) {
    alignas(64) int32_t idx[16];
    for (int j = 0; j < 16; ++j) idx[j] = static_cast<int32_t>((kBlockBytes * (j % 4)) / 4 + j / 4);
    return _mm512_load_si512(idx);
  } else {
    alignas(64) int16_t idx[32];
    for (int w = 0; w < 32; ++w) {
      const int j = w / 2, m = j / 4, k = j % 4;
      idx[w] = static_cast<int16_t>((kBlockBytes * k + 4 * m) / 2 + w % 2);
    }
    return _mm512_load_si512(idx);
  }
}

// A group's quants transposed (16 bytes per block): `base` points at the first block's
// quants; `valid` bytes from base belong to the group's blocks (the rest is masked, never
// read, and comes out zero).
template <size_t kBlockBytes>
inline __m512i GroupPart(const uint8_t* base, int64_t valid, __m512i index) {
  const __m512i lo = _mm512_maskz_loadu_epi8(FirstBytes(valid), base);
  const __m512i hi = _mm512_maskz_loadu_epi8(FirstBytes(valid - 64), base + 64);
  if constexpr (kBlockBytes % 4 == 0) return _mm512_permutex2var_epi32(lo, index, hi);
  return _mm512_permutex2var_epi16(lo, index, hi);
}

// Blocks per segment: a row is processed in segments whose per-token scales fit on the
// stack (one segment for every SmolLM2-sized row). A multiple of the chunk and group sizes.
constexpr int kSegment = 256;

// Σ_p w[p] · x[p] over `kParts` int16 vectors, as int32 pairs.
template <bool kVnni, int kParts>
inline __m512i DotI16(const __m512i* w, const int16_t* x) {
  auto xv = [x](int p) { return _mm512_loadu_si512(x + 32 * p); };
  if constexpr (kVnni) {
    __m512i dot = _mm512_madd_epi16(w[0], xv(0));
#pragma GCC unroll 4
    for (int p = 1; p < kParts; ++p) dot = _mm512_dpwssd_epi32(dot, w[p], xv(p));
    return dot;
  } else if constexpr (kParts == 2) {
    return _mm512_add_epi32(_mm512_madd_epi16(w[0], xv(0)), _mm512_madd_epi16(w[1], xv(1)));
  } else {
    return _mm512_add_epi32(
        _mm512_add_epi32(_mm512_madd_epi16(w[0], xv(0)), _mm512_madd_epi16(w[1], xv(1))),
        _mm512_add_epi32(_mm512_madd_epi16(w[2], xv(2)), _mm512_madd_epi16(w[3], xv(3))));
  }
}

// Σ_p w[p] · x[p] over 2 u8 x s8 vectors (vpdpbusd), as int32 quads.
inline __m512i DotU8(const __m512i* w, const int8_t* x) {
  const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[0], _mm512_loadu_si512(x));
  return _mm512_dpbusd_epi32(dot, w[1], _mm512_loadu_si512(x + 64));
}

// Row `row` against tokens [t0, t0 + T), segment by segment:
//  1. scales: 16 blocks' d (and m) per masked gather; per token d_w*d_x is stored, and the
//     min term m_w*s_x (Q4_1) or -8 d_w*s_x (Q4_0) accumulated;
//  2. Q4: groups of 4 blocks, integer dots of the 4 planes into one int32 vector; Q8_0:
//     pairs of blocks. Converted and scaled by the stored scales (a broadcast load) into
//     the token's accumulator. One FMA chain per token is enough: a group's other work
//     outlasts the FMA's latency, and several tokens' chains interleave.
// Q4 weights are unsigned nibbles (Q4_0's -8 is folded into the min term). Int8
// activations (Act = int8_t, VNNI only): Q4 groups are 2 nibble planes of bytes, one
// vpdpbusd each; Q8_0 pairs are one u8 vector (quant + 128, the -128 d_w s_x in the min term).
template <GgmlType kType, bool kVnni, typename Act, int T>
void TileQuant(const QuantMatMulArgs& a, const uint8_t* row, int64_t t0, __m512* sums,
               int sums_stride) {
  constexpr bool kQ8 = kType == GgmlType::kQ8_0;
  constexpr bool kI8 = sizeof(Act) == 1;
  static_assert(!kI8 || kVnni, "int8 activations need vpdpbusd");
  constexpr size_t bb = kQ8                        ? sizeof(BlockQ8_0)
                        : kType == GgmlType::kQ4_1 ? sizeof(BlockQ4_1)
                                                   : sizeof(BlockQ4_0);
  constexpr int qoff = kType == GgmlType::kQ4_1 ? 4 : 2;
  const __m512i offsets = HeadOffsets(bb);
  const __m512i transpose = TransposeIndex<bb>();  // unused for Q8_0
  TileActs<Act> x[T];
  __m512 acc[T];
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) {
    x[t] = ActsFor<Act>(a.x, t0 + t);
    acc[t] = _mm512_setzero_ps();
  }
  alignas(64) float scales[T][kSegment];

  // Q4: group of blocks [g, g + 4) of the segment, `valid` quant bytes from its first
  // block's.
  auto group = [&](const uint8_t* q, const Act* const* xq, int g, int64_t valid)
      __attribute__((always_inline)) {
    const __m512i t = GroupPart<bb>(q, valid, transpose);
    if constexpr (kI8) {
      const __m512i low = _mm512_set1_epi8(0x0F);
      const __m512i w[2] = {_mm512_and_si512(t, low),
                            _mm512_and_si512(_mm512_srli_epi16(t, 4), low)};
#pragma GCC unroll 16
      for (int tt = 0; tt < T; ++tt) {
        const __m512i dot = DotU8(w, xq[tt] + g * kBlock);
        acc[tt] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), GroupScales(&scales[tt][g]), acc[tt]);
      }
    } else {
      const __m512i low = _mm512_set1_epi16(0x0F);
      const __m512i w[4] = {
          _mm512_and_si512(t, low), _mm512_and_si512(_mm512_srli_epi16(t, 4), low),
          _mm512_and_si512(_mm512_srli_epi16(t, 8), low), _mm512_srli_epi16(t, 12)};
#pragma GCC unroll 16
      for (int tt = 0; tt < T; ++tt) {
        const __m512i dot = DotI16<kVnni, 4>(w, xq[tt] + g * kBlock);
        acc[tt] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), GroupScales(&scales[tt][g]), acc[tt]);
      }
    }
  };
  // Q8_0: blocks (j, j+1) of the segment (or j alone) at q.
  auto pair = [&]<bool kSecond>(const uint8_t* q, const Act* const* xq, int j)
      __attribute__((always_inline)) {
    if constexpr (kI8) {
      const __m512i w = PairWeightsQ8U8<kSecond>(q);
#pragma GCC unroll 16
      for (int tt = 0; tt < T; ++tt) {
        const __m512i dot =
            _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, _mm512_loadu_si512(xq[tt] + j * kBlock));
        acc[tt] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), PairScales(&scales[tt][j]), acc[tt]);
      }
    } else {
      __m512i w[2];
      PairWeightsQ8<kSecond>(q, w);
#pragma GCC unroll 16
      for (int tt = 0; tt < T; ++tt) {
        const __m512 dot = _mm512_cvtepi32_ps(DotI16<kVnni, 2>(w, xq[tt] + j * kBlock));
        acc[tt] = _mm512_fmadd_ps(dot, PairScales(&scales[tt][j]), acc[tt]);
      }
    }
  };

  for (int64_t s0 = 0; s0 < a.blocks; s0 += kSegment) {
    const int nseg = static_cast<int>(std::min<int64_t>(kSegment, a.blocks - s0));
    const uint8_t* seg = row + s0 * bb;
    for (int c = 0; c < nseg; c += kChunk) {
      const __m512i heads = GatherHeads(seg + c * bb, offsets, nseg - c);
      const __m512i halves = SplitHalves(heads);
      const __m512 dw = _mm512_cvtph_ps(_mm512_castsi512_si256(halves));
      __m512 mw = _mm512_setzero_ps();
      if constexpr (kType == GgmlType::kQ4_1) {
        mw = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(halves, 1));
      } else if constexpr (kType == GgmlType::kQ4_0) {
        mw = _mm512_mul_ps(dw, _mm512_set1_ps(-8.0f));
      } else if constexpr (kI8) {
        mw = _mm512_mul_ps(dw, _mm512_set1_ps(-128.0f));
      }
#pragma GCC unroll 16
      for (int t = 0; t < T; ++t) {
        _mm512_store_ps(&scales[t][c], _mm512_mul_ps(dw, _mm512_loadu_ps(x[t].d + s0 + c)));
        if constexpr (!kQ8 || kI8) {
          acc[t] = _mm512_fmadd_ps(mw, _mm512_loadu_ps(x[t].s + s0 + c), acc[t]);
        }
      }
    }
    const Act* xq[T];
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) xq[t] = x[t].q + s0 * kBlock;
    const uint8_t* q = seg + qoff;
    // Loops step two groups (pairs) at a time: measurably faster than one at a time.
    if constexpr (kQ8) {
      int j = 0;
      for (; j + 4 <= nseg; j += 4, q += 4 * bb) {
        pair.template operator()<true>(q, xq, j);
        pair.template operator()<true>(q + 2 * bb, xq, j + 2);
      }
      if (j + 2 <= nseg) {
        pair.template operator()<true>(q, xq, j);
        j += 2;
        q += 2 * bb;
      }
      if (j < nseg) pair.template operator()<false>(q, xq, j);
    } else {
      constexpr int64_t kFull = bb * 3 + 16;  // quant bytes of a whole group from its first
      int g = 0;
      for (; g + 8 <= nseg; g += 8, q += 8 * bb) {
        group(q, xq, g, kFull);
        group(q + 4 * bb, xq, g + 4, kFull);
      }
      if (g + 4 <= nseg) {
        group(q, xq, g, kFull);
        g += 4;
        q += 4 * bb;
      }
      if (g < nseg) group(q, xq, g, bb * (nseg - g - 1) + 16);
    }
  }
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) sums[t * sums_stride] = acc[t];
}

// Rows are reduced 16 at a time: lane sums of rows i = 0..15 go to out[i]. A transpose-add
// tree whose shape is the same for every row (within each 128-bit quarter l0+l2, l1+l3,
// then their sum; then quarters (q0+q1)+(q2+q3)), so a row's result does not depend on its
// slot or on the other rows. About 3 instructions per row instead of ~12 for a lone
// horizontal sum.
constexpr int kRowBlock = 16;

void ReduceRows16(const __m512* v, float* out, int rows) {
  __m512 quad[4];  // quad[k]: quarter q of rows 4k..4k+3 in 128-bit lane q
  for (int k = 0; k < 4; ++k) {
    const __m512* r = v + 4 * k;
    const __m512 s01 =
        _mm512_add_ps(_mm512_unpacklo_ps(r[0], r[1]), _mm512_unpackhi_ps(r[0], r[1]));
    const __m512 s23 =
        _mm512_add_ps(_mm512_unpacklo_ps(r[2], r[3]), _mm512_unpackhi_ps(r[2], r[3]));
    const __m512d a = _mm512_castps_pd(s01), b = _mm512_castps_pd(s23);
    quad[k] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                            _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  // Per 128-bit lane q of quad[k]: rows 4k+0, 4k+1, 4k+2, 4k+3 (partial sums of quarter q).
  const __m512 h01 = _mm512_add_ps(_mm512_shuffle_f32x4(quad[0], quad[1], 0x88),
                                   _mm512_shuffle_f32x4(quad[0], quad[1], 0xDD));
  const __m512 h23 = _mm512_add_ps(_mm512_shuffle_f32x4(quad[2], quad[3], 0x88),
                                   _mm512_shuffle_f32x4(quad[2], quad[3], 0xDD));
  const __m512 all =
      _mm512_add_ps(_mm512_shuffle_f32x4(h01, h23, 0x88), _mm512_shuffle_f32x4(h01, h23, 0xDD));
  _mm512_mask_storeu_ps(out, FirstLanes(rows), all);
}

template <GgmlType kType, bool kVnni, typename Act, int... kTiles>
inline void TileDispatchImpl(int tile, const QuantMatMulArgs& a, const uint8_t* row, int64_t t0,
                             __m512* sums, int sums_stride, std::integer_sequence<int, kTiles...>) {
  ((tile == kTiles + 1 ? TileQuant<kType, kVnni, Act, kTiles + 1>(a, row, t0, sums, sums_stride)
                       : void()),
   ...);
}

// TileQuant for a run-time tile size in [1, kQuantTile].
template <GgmlType kType, bool kVnni, typename Act>
inline void TileDispatch(int tile, const QuantMatMulArgs& a, const uint8_t* row, int64_t t0,
                         __m512* sums, int sums_stride) {
  TileDispatchImpl<kType, kVnni, Act>(tile, a, row, t0, sums, sums_stride,
                                      std::make_integer_sequence<int, kQuantTile>());
}

template <GgmlType kType, bool kVnni, typename Act>
void RowsQuant(const QuantMatMulArgs& a, int64_t row_begin, int64_t row_end) {
  constexpr size_t bb = kType == GgmlType::kQ8_0   ? sizeof(BlockQ8_0)
                        : kType == GgmlType::kQ4_1 ? sizeof(BlockQ4_1)
                                                   : sizeof(BlockQ4_0);
  const size_t row_bytes = a.blocks * bb;
  const int64_t ahead = PrefetchRowsAhead(row_bytes);
  for (int64_t r = row_begin; r < std::min(row_begin + ahead, row_end); ++r) {
    PrefetchBytes(a.w + r * a.row_stride, row_bytes);
  }
  __m512 sums[kQuantTile][kRowBlock];
  for (int64_t r0 = row_begin; r0 < row_end; r0 += kRowBlock) {
    const int nr = static_cast<int>(std::min<int64_t>(kRowBlock, row_end - r0));
    for (int i = nr; i < kRowBlock; ++i) {
      for (int t = 0; t < kQuantTile; ++t) sums[t][i] = _mm512_setzero_ps();
    }
    // Token tiles over the block's rows (which stay in L1 between tiles): as few tiles as
    // possible, of near-equal sizes (9 tokens: 5 + 4).
    for (int64_t t0 = 0; t0 < a.n;) {
      const int tile = NearEqualTile(a.n - t0, kQuantTile);
      for (int i = 0; i < nr; ++i) {
        const int64_t r = r0 + i;
        const uint8_t* row = a.w + r * a.row_stride;
        if (t0 == 0 && r + ahead < row_end) PrefetchBytes(row + ahead * a.row_stride, row_bytes);
        TileDispatch<kType, kVnni, Act>(tile, a, row, t0, &sums[0][i], kRowBlock);
      }
      for (int t = 0; t < tile; ++t) ReduceRows16(sums[t], a.y + (t0 + t) * a.ldy + r0, nr);
      t0 += tile;
    }
  }
}

template <bool kVnni, typename Act = int16_t>
void MatMulQuant(const QuantMatMulArgs& a, int64_t row_begin, int64_t row_end) {
  if (a.type == GgmlType::kQ8_0) {
    RowsQuant<GgmlType::kQ8_0, kVnni, Act>(a, row_begin, row_end);
  } else if (a.type == GgmlType::kQ4_1) {
    RowsQuant<GgmlType::kQ4_1, kVnni, Act>(a, row_begin, row_end);
  } else {
    RowsQuant<GgmlType::kQ4_0, kVnni, Act>(a, row_begin, row_end);
  }
}

}  // namespace

// int8 needs vpdpbusd (vpmaddubsw would saturate Q8_0's 255 x 127 pairs): VNNI only.
// Float weights: cpu_kernels_avx512_float.cc.
const KernelTable kAvx512Kernels = {.name = "avx512",
                                    .quantize = &Quantize,
                                    .matmul_quant = &MatMulQuant<false>,
                                    .matmul_float = &MatMulFloatAvx512,
                                    .quantize8 = nullptr,
                                    .matmul_quant8 = nullptr,
                                    .quantize_x8 = &QuantizeNaturalAvx512,
                                    .matmul_quant_x8 = &MatMulQuantX8Avx512,
                                    .quantize8_x8 = nullptr,
                                    .matmul_quant8_x8 = nullptr,
                                    .swiglu = &SwiGluAvx2,
                                    .kquant_x8 = true,
                                    .q5_x8 = true};
const KernelTable kAvx512VnniKernels = {.name = "avx512-vnni",
                                        .quantize = &Quantize,
                                        .matmul_quant = &MatMulQuant<true>,
                                        .matmul_float = &MatMulFloatAvx512,
                                        .quantize8 = &Quantize8,
                                        .matmul_quant8 = &MatMulQuant<true, int8_t>,
                                        .quantize_x8 = &QuantizeNaturalAvx512,
                                        .matmul_quant_x8 = &MatMulQuantX8Avx512Vnni,
                                        .quantize8_x8 = &Quantize8NaturalAvx512,
                                        .matmul_quant8_x8 = &MatMulQuant8X8Avx512Vnni,
                                        .swiglu = &SwiGluAvx2,
                                        .kquant_x8 = true,
                                        .kquant8_x8 = true,
                                        .q5_x8 = true,
                                        .q5_8_x8 = true};

}  // namespace specnode::cpu_kernels
