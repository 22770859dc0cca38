// AVX2 kernel over row-interleaved weights (cpu_repack.h; compiled with -mavx2 -mfma
// -mf16c, run only when CpuFeatures::avx2): one ymm lane per output row, 8 rows per
// instruction, int16 activations in natural order (the avx2 table's Quantize).
//
// Per block and token: the activation pair (2c, 2c + 1) is broadcast (a load, no ALU op)
// and multiplied against chunk c's 8 rows by one vpmaddwd (int16 pairs -> int32 per row);
// the 16 products of a block are summed in int32 (exact), converted once and scaled by one
// FMA for all 8 rows. A Q4 chunk of 16 bytes is widened once per tile (vpmovzxbw, then its
// low and high nibbles are two pairs of values), a Q8_0 chunk by one vpmovsxbw. No gather,
// no horizontal sum: the accumulators are the 8 rows' results.
//
// Arithmetic (and so the bits of every result) is PackedMatMulReference's; FMAs are
// spelled out, so -ffp-contract has nothing to fuse.
#include <immintrin.h>

#include <algorithm>
#include <cassert>
#include <cstdint>

#include "model/cpu/cpu_kernels.h"
#include "model/cpu/cpu_repack.h"

namespace specnode::cpu_kernels {
namespace {

constexpr int kBlock = kQuantBlock;
constexpr int kTile = 4;  // tokens per pass over a group's weights

// The 32-bit word at p (two int16 activations) in all 8 lanes, as one load.
inline __m256i BroadcastPair(const int16_t* p) {
  return _mm256_castps_si256(_mm256_broadcast_ss(reinterpret_cast<const float*>(p)));
}

// Group `group` (8 rows) against tokens [t0, t0 + T): out[t] = the 8 rows' results.
template <GgmlType kType, int T>
void TileX8(const QuantMatMulArgs& a, const uint8_t* group, int64_t t0, __m256 (&out)[T]) {
  constexpr bool kQ8 = kType == GgmlType::kQ8_0;
  constexpr bool kQ41 = kType == GgmlType::kQ4_1;
  constexpr size_t kBlockBytes = PackedBlockBytes(kType);
  constexpr size_t kHead = PackedHeadBytes(kType);
  const int16_t* xq[T];
  const float* xd[T];
  const float* xs[T];
  __m256 acc[T];
#pragma GCC unroll 4
  for (int t = 0; t < T; ++t) {
    xq[t] = a.x.qs + (t0 + t) * a.x.qs_stride;
    xd[t] = a.x.d + (t0 + t) * a.x.ds_stride;
    xs[t] = a.x.s + (t0 + t) * a.x.ds_stride;
    acc[t] = _mm256_setzero_ps();
  }
  const __m256i nibble = _mm256_set1_epi16(0x0F);
  for (int64_t b = 0; b < a.blocks; ++b) {
    const uint8_t* blk = group + b * kBlockBytes;
    const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk)));
    __m256 mw = _mm256_setzero_ps();
    if constexpr (kQ41) {
      mw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 16)));
    } else if constexpr (!kQ8) {
      mw = _mm256_mul_ps(dw, _mm256_set1_ps(-8.0f));
    }
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
          dot[t] = _mm256_add_epi32(dot[t], _mm256_madd_epi16(w, BroadcastPair(xb)));
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
          const __m256i p = _mm256_add_epi32(_mm256_madd_epi16(lo, BroadcastPair(xb)),
                                             _mm256_madd_epi16(hi, BroadcastPair(xb + 16)));
          dot[t] = _mm256_add_epi32(dot[t], p);
        }
      }
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
      const __m256 scale = _mm256_mul_ps(dw, _mm256_broadcast_ss(xd[t] + b));
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[t]), scale, acc[t]);
      if constexpr (!kQ8) acc[t] = _mm256_fmadd_ps(mw, _mm256_broadcast_ss(xs[t] + b), acc[t]);
    }
  }
#pragma GCC unroll 4
  for (int t = 0; t < T; ++t) out[t] = acc[t];
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

template <GgmlType kType>
void RowsX8(const QuantMatMulArgs& a, int64_t row_begin, int64_t row_end) {
  assert(row_begin % kPackRows == 0);
  const size_t group_bytes = a.row_stride;
  const GroupSpan span = GroupsOf(row_begin, row_end);
  const int64_t g_end = span.end;
  const int64_t ahead = PrefetchFirstGroups(a.w, group_bytes, span);
  for (int64_t g = span.begin; g < g_end; ++g) {
    const uint8_t* group = a.w + g * group_bytes;
    if (g + ahead < g_end) PrefetchBytes(group + ahead * group_bytes, group_bytes);
    const int64_t r0 = g * kPackRows;
    // As few tiles as possible, of near-equal sizes (5 tokens: 3 + 2).
    for (int64_t t = 0; t < a.n;) {
      const int tile = NearEqualTile(a.n - t, kTile);
      switch (tile) {
        case 4: {
          __m256 v[4];
          TileX8<kType, 4>(a, group, t, v);
          StoreX8<4>(a, v, r0, row_end, t);
          break;
        }
        case 3: {
          __m256 v[3];
          TileX8<kType, 3>(a, group, t, v);
          StoreX8<3>(a, v, r0, row_end, t);
          break;
        }
        case 2: {
          __m256 v[2];
          TileX8<kType, 2>(a, group, t, v);
          StoreX8<2>(a, v, r0, row_end, t);
          break;
        }
        default: {
          __m256 v[1];
          TileX8<kType, 1>(a, group, t, v);
          StoreX8<1>(a, v, r0, row_end, t);
          break;
        }
      }
      t += tile;
    }
  }
}

}  // namespace

void MatMulQuantX8Avx2(const QuantMatMulArgs& a, int64_t row_begin, int64_t row_end) {
  switch (a.type) {
    case GgmlType::kQ4_0:
      return RowsX8<GgmlType::kQ4_0>(a, row_begin, row_end);
    case GgmlType::kQ4_1:
      return RowsX8<GgmlType::kQ4_1>(a, row_begin, row_end);
    default:
      return RowsX8<GgmlType::kQ8_0>(a, row_begin, row_end);
  }
}

}  // namespace specnode::cpu_kernels
