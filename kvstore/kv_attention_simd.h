// Private to kv_attention_{avx2,avx512}.cc: the SIMD attention kernels written once over a
// vector-ISA traits class `I`, included by each ISA file after it defines its traits (and
// so compiled with that file's -m flags). Everything here is a template on `I`, whose
// types live in the including file's anonymous namespace, so the two instantiations never
// clash. See kv_attention_kernels.h for the contracts.
//
// Traits I provides (L = I::kLanes floats per vector V):
//   Zero, Set1, Load, Store, Add, Sub, Max, Fma(a, b, c) = a * b + c, Exp (0 below -87.3),
//   Hsum, Hmax, HsumMany(a[kReduce]) (lane k = Hsum(a[k]); kReduce = L), F16 (one half),
//   LoadF16 (L halves), LoadI8 (L int8 as floats), LoadU4 (L nibbles from L/2 bytes, value
//   order as kv_precision.h packs them, as floats 0..15), LoadU2 (L 2-bit codes from L/4
//   bytes, in value order, as floats 0..3), LoadU4EvenOdd (2L nibbles from L
//   bytes: the even-indexed values, then the odd-indexed ones),
//   Interleave (its inverse: even, odd -> values in order);
//   kAccHeads, kAccVectors: the register tile of accumulate (heads x vectors).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kvstore/kv_attention_kernels.h"

namespace specnode::kv_kernels::simd {

// Loops over the NH heads / NV vectors of a register tile carry `#pragma GCC unroll`: -O2
// does not unroll them on its own, and rolled they keep the accumulators in memory.

// Rows are gathered from pages all over the store; prefetch this many rows ahead.
inline constexpr int kPrefetchRows = 12;

template <class I, KvPrecision P>
inline typename I::V LoadCodes(const uint8_t* row, int d) {
  if constexpr (P == KvPrecision::kFull) {
    return I::LoadF16(row + 2 * d);
  } else if constexpr (P == KvPrecision::kInt8) {
    return I::LoadI8(row + 4 + d);
  } else if constexpr (P == KvPrecision::kInt2) {
    return I::LoadU2(row + 4 + d / 4);
  } else {
    return I::LoadU4(row + 4 + d / 2);
  }
}

// Codes of values [d, d + 2L) as two vectors: in order, except int4, which decodes its L
// bytes into the even-indexed values (low nibbles) and the odd-indexed ones (high nibbles),
// half the work of interleaving them; callers pair them with a query in the same order
// (scores) or re-interleave sums once per tile (accumulate).
template <class I, KvPrecision P>
inline void LoadCodes2(const uint8_t* row, int d, typename I::V* a, typename I::V* b) {
  if constexpr (P == KvPrecision::kInt4) {
    I::LoadU4EvenOdd(row + 4 + d / 2, a, b);
  } else {
    *a = LoadCodes<I, P>(row, d);
    *b = LoadCodes<I, P>(row, d + I::kLanes);
  }
}

// value = min + scale * code (f16 rows: scale 1, min 0).
struct ScaleMin {
  float scale = 1.0f;
  float min = 0.0f;
};

template <class I, KvPrecision P>
inline ScaleMin LoadScaleMin(const uint8_t* row) {
  ScaleMin sm;
  if constexpr (P == KvPrecision::kInt8) {
    std::memcpy(&sm.scale, row, 4);
  } else if constexpr (P == KvPrecision::kInt4 || P == KvPrecision::kInt2) {
    uint16_t h[2];
    std::memcpy(h, row, 4);
    sm.scale = I::F16(h[0]);
    sm.min = I::F16(h[1]);
  }
  return sm;
}

// A template like everything here: a plain inline function would be one symbol shared by
// the AVX2 and AVX-512 objects, and the linker could keep the AVX-512 build of it.
template <class I>
inline void PrefetchRow(const uint8_t* row, size_t bytes) {
  __builtin_prefetch(row);
  if (bytes > 64) __builtin_prefetch(row + 64);
  if (bytes > 128) __builtin_prefetch(row + 128);
  if (bytes > 192) __builtin_prefetch(row + 192);
}

// Scores of NH (<= 4) heads: s[h * ld + r] for r < n; rows [n, n_ahead) follow and are
// prefetched as the loop nears them (a chunk's successor). R = kReduce / NH rows at a time, so
// that their R * NH dot products are reduced together by one HsumMany (a transpose-add tree
// whose per-lane sum order is the same for every lane). A short last group repeats its last
// row (results dropped), so every row's score comes out of the same instruction sequence
// whatever n and its place in a group.
template <class I, KvPrecision P, int NH>
void ScoresHeads(const uint8_t* const* rows, int n, int n_ahead, const float* q, const float* qsum,
                 int hd, float* s, size_t ld) {
  using V = typename I::V;
  constexpr int L = I::kLanes;
  constexpr int K = I::kReduce;
  constexpr int R = K / NH;
  const size_t row_bytes = KvRowBytes(P, hd);
  for (int r0 = 0; r0 < n; r0 += R) {
    const uint8_t* rp[R];
#pragma GCC unroll 16
    for (int i = 0; i < R; ++i) {
      rp[i] = rows[std::min(r0 + i, n - 1)];
      if (r0 + i + kPrefetchRows < n_ahead) {
        PrefetchRow<I>(rows[r0 + i + kPrefetchRows], row_bytes);
      }
    }
    V acc[K];
#pragma GCC unroll 16
    for (int k = 0; k < K; ++k) acc[k] = I::Zero();
    int d = 0;
    for (; d + 2 * L <= hd; d += 2 * L) {
      V qa[NH], qb[NH];
#pragma GCC unroll 4
      for (int h = 0; h < NH; ++h) {
        qa[h] = I::Load(q + h * hd + d);
        qb[h] = I::Load(q + h * hd + d + L);
      }
#pragma GCC unroll 16
      for (int i = 0; i < R; ++i) {
        V xa, xb;
        LoadCodes2<I, P>(rp[i], d, &xa, &xb);
#pragma GCC unroll 4
        for (int h = 0; h < NH; ++h) {
          acc[i * NH + h] = I::Fma(qb[h], xb, I::Fma(qa[h], xa, acc[i * NH + h]));
        }
      }
    }
    if (d < hd) {  // head_dim an odd number of vectors
      V qa[NH];
#pragma GCC unroll 4
      for (int h = 0; h < NH; ++h) qa[h] = I::Load(q + h * hd + d);
#pragma GCC unroll 16
      for (int i = 0; i < R; ++i) {
        const V x = LoadCodes<I, P>(rp[i], d);
#pragma GCC unroll 4
        for (int h = 0; h < NH; ++h) acc[i * NH + h] = I::Fma(qa[h], x, acc[i * NH + h]);
      }
    }
    alignas(64) float dot[K];
    I::Store(dot, I::HsumMany(acc));
    for (int i = 0; i < R && r0 + i < n; ++i) {
      const ScaleMin sm = LoadScaleMin<I, P>(rp[i]);
#pragma GCC unroll 4
      for (int h = 0; h < NH; ++h) {
        float v = dot[i * NH + h];
        if constexpr (P == KvPrecision::kInt8) v = sm.scale * v;
        if constexpr (P == KvPrecision::kInt4 || P == KvPrecision::kInt2) {
          v = sm.min * qsum[h] + sm.scale * v;
        }
        s[h * ld + r0 + i] = v;
      }
    }
  }
}

// Rows per chunk of ScoresClass: a multiple of every ScoresHeads group size R (kReduce / NH
// for kReduce 8 or 16, NH 1..4), so chunking regroups no row, and small enough that a
// chunk's rows stay in L1 while every group of four heads reads them.
inline constexpr int kScoresChunk = 80;

template <class I, KvPrecision P>
void ScoresClass(const uint8_t* const* rows, int n, const KvQuery& q, float* s, size_t ld) {
  constexpr int L = I::kLanes;
  const int hd = q.head_dim;
  const float* qv = q.q;
  // int4: the query in LoadCodes2's even / odd order, 64-byte aligned as the query's vector
  // loads are; a block's heads outgrow the stack.
  alignas(64) float q_stack[P == KvPrecision::kInt4 ? 4 * 256 : 1];
  if constexpr (P == KvPrecision::kInt4) {
    thread_local std::vector<float> q_heap;
    float* q_eo = q_stack;
    if (q.g > 4) {
      q_heap.resize(static_cast<size_t>(q.g) * hd + 16);
      q_eo = q_heap.data() + (16 - reinterpret_cast<uintptr_t>(q_heap.data()) / 4 % 16) % 16;
    }
    for (int h = 0; h < q.g; ++h) {
      const float* src = q.q + static_cast<size_t>(h) * hd;
      float* dst = q_eo + static_cast<size_t>(h) * hd;
      int d = 0;
      for (; d + 2 * L <= hd; d += 2 * L) {
        for (int i = 0; i < L; ++i) {
          dst[d + i] = src[d + 2 * i];
          dst[d + L + i] = src[d + 2 * i + 1];
        }
      }
      for (; d < hd; ++d) dst[d] = src[d];  // a last single vector: natural order
    }
    qv = q_eo;
  }
  // f16 rows of several groups of heads (a block of query tokens) go in chunks, each read
  // from memory once and from L1 by the other groups; int rows do not (measured slower in
  // chunks: bench_kv_attention verify/int4, bench/README.md).
  const int chunk = P == KvPrecision::kFull && q.g > 4 ? kScoresChunk : n;
  constexpr int kGroup = 4;
  for (int r0 = 0; r0 < n; r0 += chunk) {
    const int nc = std::min(chunk, n - r0);
    const int ahead = n - r0;  // the first group reads the chunk from memory: prefetch on
    for (int h0 = 0; h0 < q.g; h0 += kGroup) {
      const float* qh = qv + static_cast<size_t>(h0) * hd;
      const float* qs = q.qsum + h0;
      float* sh = s + h0 * ld + r0;
      switch (std::min(kGroup, q.g - h0)) {
        case 1:
          ScoresHeads<I, P, 1>(rows + r0, nc, ahead, qh, qs, hd, sh, ld);
          break;
        case 2:
          ScoresHeads<I, P, 2>(rows + r0, nc, ahead, qh, qs, hd, sh, ld);
          break;
        case 3:
          ScoresHeads<I, P, 3>(rows + r0, nc, ahead, qh, qs, hd, sh, ld);
          break;
        default:
          ScoresHeads<I, P, 4>(rows + r0, nc, ahead, qh, qs, hd, sh, ld);
          break;
      }
    }
  }
}

template <class I>
void Scores(KvPrecision p, const uint8_t* const* rows, int n, const KvQuery& q, float* s,
            size_t ld) {
  switch (p) {
    case KvPrecision::kFull:
      return ScoresClass<I, KvPrecision::kFull>(rows, n, q, s, ld);
    case KvPrecision::kInt8:
      return ScoresClass<I, KvPrecision::kInt8>(rows, n, q, s, ld);
    case KvPrecision::kInt4:
      return ScoresClass<I, KvPrecision::kInt4>(rows, n, q, s, ld);
    case KvPrecision::kInt2:
      return ScoresClass<I, KvPrecision::kInt2>(rows, n, q, s, ld);
  }
}

template <class I>
float ExpSum(float* s, int n) {
  using V = typename I::V;
  constexpr int L = I::kLanes;
  const int padded = (n + L - 1) / L * L;
  for (int r = n; r < padded; ++r) s[r] = -std::numeric_limits<float>::infinity();
  V m = I::Set1(-std::numeric_limits<float>::infinity());
  for (int r = 0; r < padded; r += L) m = I::Max(m, I::Load(s + r));
  const V mx = I::Set1(I::Hmax(m));
  V sum0 = I::Zero(), sum1 = I::Zero();
  int r = 0;
  for (; r + 2 * L <= padded; r += 2 * L) {
    const V e0 = I::Exp(I::Sub(I::Load(s + r), mx));
    const V e1 = I::Exp(I::Sub(I::Load(s + r + L), mx));
    I::Store(s + r, e0);
    I::Store(s + r + L, e1);
    sum0 = I::Add(sum0, e0);
    sum1 = I::Add(sum1, e1);
  }
  if (r < padded) {
    const V e0 = I::Exp(I::Sub(I::Load(s + r), mx));
    I::Store(s + r, e0);
    sum0 = I::Add(sum0, e0);
  }
  return I::Hsum(I::Add(sum0, sum1));
}

// Row r's codes [d0, d0 + NV * L) for AccumulateTile (of nb rows of row_bytes), as NV
// vectors.
template <class I, KvPrecision P, int NV>
__attribute__((always_inline)) inline void LoadTileRow(const uint8_t* const* rows, int r, int nb,
                                                       int d0, size_t row_bytes, typename I::V* x) {
  constexpr int L = I::kLanes;
  // f16 rows have no weight pre-pass (which prefetches int rows): prefetch here, once.
  if constexpr (P == KvPrecision::kFull) {
    if (d0 == 0 && r + kPrefetchRows < nb) PrefetchRow<I>(rows[r + kPrefetchRows], row_bytes);
  }
  const uint8_t* row = rows[r];
  if constexpr (NV % 2 == 0) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; v += 2) LoadCodes2<I, P>(row, d0 + v * L, &x[v], &x[v + 1]);
  } else {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) x[v] = LoadCodes<I, P>(row, d0 + v * L);
  }
}

// out[h * hd + d0 + v * L] += Σ_{r < nr[h]} w[h * wld + r] * codes_r, for NH heads and NV
// vectors starting at column d0, over nb = max_h nr[h] (<= kAccumulateBlock) rows; rows
// [0, n_all = min_h nr[h]) are every head's. A head's FMAs are those of a tile of it alone.
template <class I, KvPrecision P, int NH, int NV>
void AccumulateTile(const uint8_t* const* rows, int nb, int n_all, const int* nr, const float* w,
                    size_t wld, int d0, int hd, float* out) {
  using V = typename I::V;
  constexpr int L = I::kLanes;
  V acc[NH][NV];
#pragma GCC unroll 4
  for (int h = 0; h < NH; ++h) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[h][v] = I::Zero();
  }
  const size_t row_bytes = KvRowBytes(P, hd);
  int r = 0;
  for (; r < n_all; ++r) {
    V x[NV];
    LoadTileRow<I, P, NV>(rows, r, nb, d0, row_bytes, x);
#pragma GCC unroll 4
    for (int h = 0; h < NH; ++h) {
      const V wv = I::Set1(w[h * wld + r]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[h][v] = I::Fma(wv, x[v], acc[h][v]);
    }
  }
  for (; r < nb; ++r) {  // the last rows of a causal block: only the later tokens' heads
    V x[NV];
    LoadTileRow<I, P, NV>(rows, r, nb, d0, row_bytes, x);
#pragma GCC unroll 4
    for (int h = 0; h < NH; ++h) {
      if (r >= nr[h]) continue;
      const V wv = I::Set1(w[h * wld + r]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[h][v] = I::Fma(wv, x[v], acc[h][v]);
    }
  }
  if constexpr (NV % 2 == 0 && P == KvPrecision::kInt4) {  // even / odd values -> in order
#pragma GCC unroll 4
    for (int h = 0; h < NH; ++h) {
#pragma GCC unroll 4
      for (int v = 0; v < NV; v += 2)
        I::Interleave(acc[h][v], acc[h][v + 1], &acc[h][v], &acc[h][v + 1]);
    }
  }
#pragma GCC unroll 4
  for (int h = 0; h < NH; ++h) {
    if (nr[h] == 0) continue;  // no row of this block: out untouched, as alone
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      float* o = out + h * hd + d0 + v * L;
      I::Store(o, I::Add(I::Load(o), acc[h][v]));
    }
  }
}

template <class I, KvPrecision P, int NH>
void AccumulateHeads(const uint8_t* const* rows, int nb, int n_all, const int* nr, const float* w,
                     size_t wld, int hd, float* out) {
  constexpr int L = I::kLanes;
  constexpr int NV = I::kAccVectors;
  int d0 = 0;
  for (; d0 + NV * L <= hd; d0 += NV * L) {
    AccumulateTile<I, P, NH, NV>(rows, nb, n_all, nr, w, wld, d0, hd, out);
  }
  for (; d0 < hd; d0 += L) AccumulateTile<I, P, NH, 1>(rows, nb, n_all, nr, w, wld, d0, hd, out);
}

template <class I, KvPrecision P>
void AccumulateClass(const uint8_t* const* rows, int n, const float* e, size_t ld, int g, int hd,
                     const int* head_rows, float* out) {
  constexpr int kMaxHeads = I::kAccHeads;
  alignas(64) float w[kMaxHeads * kAccumulateBlock];
  const size_t row_bytes = KvRowBytes(P, hd);
  for (int b0 = 0; b0 < n; b0 += kAccumulateBlock) {
    const int nb_block = std::min(kAccumulateBlock, n - b0);
    const uint8_t* const* brows = rows + b0;
    for (int r = 0; r < nb_block && r < 2 * kPrefetchRows; ++r) {
      PrefetchRow<I>(brows[r], row_bytes);
    }
    for (int h0 = 0; h0 < g; h0 += kMaxHeads) {
      const int nh = std::min(kMaxHeads, g - h0);
      // Rows of this block per head, and the rows every head of the group has.
      int nr[kMaxHeads] = {};
      int nb = 0, n_all = nb_block;
      for (int h = 0; h < nh; ++h) {
        const int rows_h = head_rows != nullptr ? head_rows[h0 + h] : n;
        nr[h] = std::clamp(rows_h - b0, 0, nb_block);
        nb = std::max(nb, nr[h]);
        n_all = std::min(n_all, nr[h]);
      }
      if (nb == 0) continue;
      // Row weights: e itself for f16 rows, e * scale (and the int4 bias Σ e * min) else.
      float bias[kMaxHeads] = {};
      const float* wp = e + h0 * ld + b0;
      size_t wld = ld;
      if constexpr (P != KvPrecision::kFull) {
        for (int r = 0; r < nb; ++r) {
          if (r + kPrefetchRows < nb) PrefetchRow<I>(brows[r + kPrefetchRows], row_bytes);
          const ScaleMin sm = LoadScaleMin<I, P>(brows[r]);
          for (int h = 0; h < nh; ++h) {
            if (r >= nr[h]) continue;
            const float eh = e[(h0 + h) * ld + b0 + r];
            w[h * kAccumulateBlock + r] = eh * sm.scale;
            if constexpr (P == KvPrecision::kInt4 || P == KvPrecision::kInt2) {
              bias[h] += eh * sm.min;
            }
          }
        }
        wp = w;
        wld = kAccumulateBlock;
      }
      float* oh = out + static_cast<size_t>(h0) * hd;
      switch (nh) {
        case 1:
          AccumulateHeads<I, P, 1>(brows, nb, n_all, nr, wp, wld, hd, oh);
          break;
        case 2:
          AccumulateHeads<I, P, std::min(2, kMaxHeads)>(brows, nb, n_all, nr, wp, wld, hd, oh);
          break;
        case 3:
          AccumulateHeads<I, P, std::min(3, kMaxHeads)>(brows, nb, n_all, nr, wp, wld, hd, oh);
          break;
        default:
          AccumulateHeads<I, P, kMaxHeads>(brows, nb, n_all, nr, wp, wld, hd, oh);
          break;
      }
      if constexpr (P == KvPrecision::kInt4 || P == KvPrecision::kInt2) {
        for (int h = 0; h < nh; ++h) {
          if (nr[h] == 0) continue;
          const typename I::V bv = I::Set1(bias[h]);
          for (int d = 0; d < hd; d += I::kLanes) {
            float* o = oh + h * hd + d;
            I::Store(o, I::Add(I::Load(o), bv));
          }
        }
      }
    }
  }
}

template <class I>
void Accumulate(KvPrecision p, const uint8_t* const* rows, int n, const float* e, size_t ld, int g,
                int hd, const int* head_rows, float* out) {
  switch (p) {
    case KvPrecision::kFull:
      return AccumulateClass<I, KvPrecision::kFull>(rows, n, e, ld, g, hd, head_rows, out);
    case KvPrecision::kInt8:
      return AccumulateClass<I, KvPrecision::kInt8>(rows, n, e, ld, g, hd, head_rows, out);
    case KvPrecision::kInt4:
      return AccumulateClass<I, KvPrecision::kInt4>(rows, n, e, ld, g, hd, head_rows, out);
    case KvPrecision::kInt2:
      return AccumulateClass<I, KvPrecision::kInt2>(rows, n, e, ld, g, hd, head_rows, out);
  }
}

}  // namespace specnode::kv_kernels::simd
