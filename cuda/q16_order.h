// The canonical order of the quantised-activation matmul's float arithmetic, shared by its
// two kernels — the dp2a one of decode and verification (cuda_qmatvec_kernels.cu) and the
// tensor-core one of larger passes (cuda_mma_kernels.cu) — so that a (row, token) result is
// the same bits whichever kernel computes it, and batch invariance survives the switch
// between them at kQ16MmaMinTokens tokens (cuda_mma_kernels.h).
//
// The integer part is exact in both kernels (dp2a on int16 activations; int8 mma on the
// activations split as 256 hi + lo, q16_mma.h), so only the float terms need an order:
//   - a row is cut into ranges of RangeValues: 128 values (4 blocks) for Q4_0, Q4_1, Q8_0,
//     256 (one super-block, 8 sub-blocks) for Q4_K, Q5_K, Q6_K;
//   - a range's partial p starts at +0 and takes its 32-value sub-blocks in order, each by
//     ApplyDots (the CPU's per-block terms, q16_dot.h and q16_kquant.h):
//       Q4_0, Q8_0:        p = fma(dot, d_w d_t, p)
//       Q4_1:              p = fma(dot, d_w d_t, p);  p = fma(m_w, s_t, p)
//       Q4_K, Q5_K:        p = fma(dot, (d sc_j) d_t, p);  p = fma((-dmin) m_j, s_t, p)
//       Q6_K:              p = fma(dot_lo, (d sc_2j) d_t, p);  p = fma(dot_hi, (d sc_2j+1) d_t, p)
//     (dot_lo / dot_hi: the sub-block's first and second 16 values);
//   - the row's result is ((0 + p_0) + p_1) + ... over its ranges in order.
// CanonicalRow spells this out on the host; the tests (cuda/tests/q16_mma_test.cc on the
// host, cuda/tests/cuda_mma_test.cc on a GPU) hold both kernels to it bit for bit. Against
// the CPU (block after block, one accumulator) rows agree to f32 rounding.
//
// Code words (SubBlockCodes): cw[w] holds the sub-block's codes of values 4w .. 4w + 3 as
// bytes, signed where the type's codes are (Q4_0 q - 8, Q8_0 q, Q6_K q - 32) and unsigned
// otherwise (Q4_1 0..15, Q4_K 0..15, Q5_K 0..31): each fits an s8, which is how the
// tensor-core kernel reads them. Kept free of absl and of C++20 (nvcc builds C++17). Pure
// functions, thread-safe.
#pragma once

#include <stdint.h>

#include "cuda/q16_dot.h"
#include "cuda/q16_kquant.h"

namespace specnode::q16 {

// GgmlType's values (model/gguf/ggml_types.h) for the template arguments.
inline constexpr int kTypeQ4_0 = 2;
inline constexpr int kTypeQ4_1 = 3;
inline constexpr int kTypeQ8_0 = 8;
inline constexpr int kTypeQ4_K = 12;
inline constexpr int kTypeQ5_K = 13;
inline constexpr int kTypeQ6_K = 14;

SPECNODE_Q16_HD constexpr bool IsKQuant(int type) { return type >= kTypeQ4_K && type <= kTypeQ6_K; }
// Whether a sub-block adds a min term fma(f2, s_t, p).
SPECNODE_Q16_HD constexpr bool HasMin(int type) {
  return type == kTypeQ4_1 || type == kTypeQ4_K || type == kTypeQ5_K;
}
// Values of one block in the file (32, or a 256-value super-block) and its bytes.
SPECNODE_Q16_HD constexpr int BlockValues(int type) { return IsKQuant(type) ? 256 : 32; }
SPECNODE_Q16_HD constexpr int BlockBytes(int type) {
  return type == kTypeQ4_0   ? 18
         : type == kTypeQ4_1 ? 20
         : type == kTypeQ8_0 ? 34
         : type == kTypeQ4_K ? 144
         : type == kTypeQ5_K ? 176
                             : 210;
}
// Values of one range of the order above, and 32-value sub-blocks of a block.
SPECNODE_Q16_HD constexpr int RangeValues(int type) { return IsKQuant(type) ? 256 : 128; }
SPECNODE_Q16_HD constexpr int SubBlocksPerBlock(int type) { return BlockValues(type) / kBlock; }

// Sub-block j (< SubBlocksPerBlock) of the block at `blk` (2-byte aligned): its code words
// and factors, f1 = d_w (Q4_0, Q4_1, Q8_0) or the K-quant's f1 (q16_kquant.h), f2 = m_w
// (Q4_1), the K-quant's f2, or 0.
template <int kType>
SPECNODE_Q16_HD void SubBlockCodes(const uint8_t* blk, int j, uint32_t cw[8], float* f1,
                                   float* f2) {
  if (IsKQuant(kType)) {
    KSubBlockCodes<kType>(blk, j, cw, f1, f2);
    return;
  }
  *f1 = HalfToFloatQ16(Load16(blk));
  *f2 = kType == kTypeQ4_1 ? HalfToFloatQ16(Load16(blk + 2)) : 0.0f;
  if (kType == kTypeQ8_0) {
    for (int w = 0; w < 8; ++w) cw[w] = Load32(blk + 2 + 4 * w);
    return;
  }
  const uint8_t* qs = blk + (kType == kTypeQ4_1 ? 4 : 2);
  for (int w = 0; w < 4; ++w) {
    const uint32_t q = Load32(qs + 4 * w);
    uint32_t lo = q & 0x0f0f0f0fu, hi = (q >> 4) & 0x0f0f0f0fu;
    if (kType == kTypeQ4_0) {
      lo = MinusEight(lo);
      hi = MinusEight(hi);
    }
    cw[w] = lo;      // values 4w .. 4w + 3
    cw[w + 4] = hi;  // values 16 + 4w ..
  }
}

// p plus one sub-block's terms, from its integer dots with the token's activation block:
// dot0 over values 0..15, dot1 over 16..31 (types other than Q6_K only use their sum).
// Q6_K's term of one 16-value half: fma(dot, f d_t, p).
SPECNODE_Q16_HD float HalfTerm(int dot, float f, float d_t, float p) {
  return Fma(static_cast<float>(dot), f * d_t, p);
}

template <int kType>
SPECNODE_Q16_HD float ApplyDots(int dot0, int dot1, float f1, float f2, float d_t, float s_t,
                                float p) {
  if (kType == kTypeQ6_K) return HalfTerm(dot1, f2, d_t, HalfTerm(dot0, f1, d_t, p));
  p = Fma(static_cast<float>(dot0 + dot1), f1 * d_t, p);
  if (HasMin(kType)) p = Fma(f2, s_t, p);
  return p;
}

// The same with the dots computed here (dp2a on the GPU): the dp2a kernel's sub-block step.
template <int kType>
SPECNODE_Q16_HD float SubBlockTerm(const uint32_t cw[8], float f1, float f2, const uint32_t xw[16],
                                   float d_t, float s_t, float p) {
  return ApplyDots<kType>(DotCodes(cw, xw, 0, 4), DotCodes(cw, xw, 4, 8), f1, f2, d_t, s_t, p);
}

// Sub-block `sb` (32-value index along the row) of a row: the block holding it and its
// index within that block.
template <int kType>
SPECNODE_Q16_HD const uint8_t* BlockOf(const uint8_t* row, int64_t sb, int* j) {
  constexpr int kSub = SubBlocksPerBlock(kType);
  *j = static_cast<int>(sb % kSub);
  return row + (sb / kSub) * BlockBytes(kType);
}

// One row of `cols` values (a multiple of BlockValues) dotted with one token's int16
// activations (qs [cols], d and s [cols / 32]) in the canonical order. The host's reference.
template <int kType>
inline float CanonicalRow(const uint8_t* row, int64_t cols, const int16_t* qs, const float* d,
                          const float* s) {
  constexpr int kRangeSub = RangeValues(kType) / kBlock;
  const int64_t subs = cols / kBlock;
  float y = 0.0f;
  for (int64_t r0 = 0; r0 < subs; r0 += kRangeSub) {
    float p = 0.0f;
    for (int64_t sb = r0; sb < subs && sb < r0 + kRangeSub; ++sb) {
      int j;
      const uint8_t* blk = BlockOf<kType>(row, sb, &j);
      uint32_t cw[8], xw[16];
      float f1, f2;
      SubBlockCodes<kType>(blk, j, cw, &f1, &f2);
      for (int w = 0; w < 16; ++w) {
        xw[w] = static_cast<uint16_t>(qs[sb * kBlock + 2 * w]) |
                (static_cast<uint32_t>(static_cast<uint16_t>(qs[sb * kBlock + 2 * w + 1])) << 16);
      }
      p = SubBlockTerm<kType>(cw, f1, f2, xw, d[sb], s[sb], p);
    }
    y = y + p;
  }
  return y;
}

}  // namespace specnode::q16
