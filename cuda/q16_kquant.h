// The K-quants (Q4_K, Q5_K, Q6_K) in the quantised-activation matmul (cuda_qmatvec_kernels.cu):
// codes and factors read from a super-block in the file's layout
// (model/gguf/ggml_converted_types.h), as code that compiles for the host and the GPU, and
// the arithmetic of the CPU's K-quant kernels (model/cpu/cpu_repack_kquant.h, "Arithmetic
// of the kernels"), per row, token and 32-value sub-block j of super-block s, acc from +0:
//   Q4_K / Q5_K: dot = Σ q qs                      acc = fma(dot, (d sc_j) d_t, acc)
//                                                  acc = fma((-dmin) m_j, s_t, acc)
//   Q6_K:        dot_k = Σ (q - 32) qs over half k acc = fma(dot_2j, (d sc_2j) d_t, acc)
//                                                  acc = fma(dot_2j+1, (d sc_2j+1) d_t, acc)
// with the int16 activation blocks of q16_dot.h (d_t, s_t: the 32-value block's). One lane
// going through a row's super-blocks in order computes exactly the CPU's
// PackedKQuantReference; the kernel splits a row over lanes, so rows agree to f32 rounding.
// A host test (cuda/tests/q16_dot_test.cc) checks the codes against DecodeKQuantBlock and
// such a sequential row against PackedKQuantReference, bit for bit.
//
// Code words: cw[w] holds sub-block j's codes of values 4w .. 4w + 3 as bytes (w < 8),
// unsigned (Q4_K 0..15, Q5_K 0..31) or, for Q6_K, q - 32 as signed bytes, so that
// q16::Dot4 pairs them with the activation words xw[2w], xw[2w + 1].
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cuda/q16_dot.h"
#include "kvstore/kv_row_codec.h"

namespace specnode::q16 {

inline constexpr int kSuperValues = 256;  // values per K-quant super-block
inline constexpr int kSubBlocks = 8;      // 32-value sub-blocks per super-block

// 4 bytes at an even offset (K-quant super-blocks are 144, 176 or 210 bytes).
SPECNODE_Q16_HD uint32_t Load32(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
  const auto* h = reinterpret_cast<const unsigned short*>(p);
  return static_cast<uint32_t>(h[0]) | (static_cast<uint32_t>(h[1]) << 16);
#else
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
#endif
}
SPECNODE_Q16_HD uint16_t Load16(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const unsigned short*>(p);
#else
  uint16_t v;
  memcpy(&v, p, 2);
  return v;
#endif
}

// Q4_K / Q5_K: sub-block j's 6-bit scale and min (ggml's get_scale_min_k4) from the 12
// packed bytes.
SPECNODE_Q16_HD void KScaleMin(const uint8_t* scales, int j, int* sc, int* m) {
  if (j < 4) {
    *sc = scales[j] & 63;
    *m = scales[j + 4] & 63;
  } else {
    *sc = (scales[j + 4] & 0xf) | ((scales[j - 4] >> 6) << 4);
    *m = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
  }
}

// Q4_K: f16 d @0, f16 dmin @2, scales[12] @4, qs[128] @16.
SPECNODE_Q16_HD void Q4KCodes(const uint8_t* blk, int j, uint32_t cw[8]) {
  const uint8_t* qs = blk + 16 + 32 * (j / 2);
  const int shift = 4 * (j & 1);
  for (int w = 0; w < 8; ++w) cw[w] = (Load32(qs + 4 * w) >> shift) & 0x0f0f0f0fu;
}

// Q5_K: f16 d @0, f16 dmin @2, scales[12] @4, qh[32] @16, qs[128] @48.
SPECNODE_Q16_HD void Q5KCodes(const uint8_t* blk, int j, uint32_t cw[8]) {
  const uint8_t* qh = blk + 16;
  const uint8_t* qs = blk + 48 + 32 * (j / 2);
  const int shift = 4 * (j & 1);
  for (int w = 0; w < 8; ++w) {
    const uint32_t high = (Load32(qh + 4 * w) >> j) & 0x01010101u;
    cw[w] = ((Load32(qs + 4 * w) >> shift) & 0x0f0f0f0fu) | (high << 4);
  }
}

// Q6_K: ql[128] @0, qh[64] @128, int8 scales[16] @192, f16 d @208. Sub-block j is quarter
// j % 4 of the 128-value half j / 4.
SPECNODE_Q16_HD void Q6KCodes(const uint8_t* blk, int j, uint32_t cw[8]) {
  const int half = j / 4, quarter = j % 4;
  const uint8_t* ql = blk + 64 * half + 32 * (quarter & 1);
  const uint8_t* qh = blk + 128 + 32 * half;
  const int lo_shift = 4 * (quarter >> 1), hi_shift = 2 * quarter;
  for (int w = 0; w < 8; ++w) {
    const uint32_t code = ((Load32(ql + 4 * w) >> lo_shift) & 0x0f0f0f0fu) |
                          (((Load32(qh + 4 * w) >> hi_shift) & 0x03030303u) << 4);
    // q - 32 bytewise: (0x80 + q) - 32 >= 0x60 never borrows; flipping bit 7 back gives
    // q - 32 mod 256.
    cw[w] = ((code | 0x80808080u) - 0x20202020u) ^ 0x80808080u;
  }
}

// Σ over words [w0, w1) of cw[w] · (xw[2w], xw[2w + 1]).
SPECNODE_Q16_HD int DotCodes(const uint32_t cw[8], const uint32_t xw[16], int w0, int w1) {
  int acc = 0;
  for (int w = w0; w < w1; ++w) acc = Dot4(cw[w], xw[2 * w], xw[2 * w + 1], acc);
  return acc;
}

// The correctly rounded fused multiply-add on both sides (the CPU's std::fma).
SPECNODE_Q16_HD float Fma(float a, float b, float c) { return fmaf(a, b, c); }
// An f16's exact value.
SPECNODE_Q16_HD float HalfToFloatQ16(uint16_t h) { return kv_codec::HalfToFloat(h); }

// Sub-block j of super-block `blk` (kType: GgmlType's value, 12 Q4_K, 13 Q5_K, 14 Q6_K):
// its code words and two factors, f1 = d sc_j and f2 = (-dmin) m_j (Q4_K / Q5_K), or
// f1 = d sc_2j and f2 = d sc_2j+1 (Q6_K's halves). Shared by every token of a pass.
template <int kType>
SPECNODE_Q16_HD void KSubBlockCodes(const uint8_t* blk, int j, uint32_t cw[8], float* f1,
                                    float* f2) {
  if (kType == 14) {
    Q6KCodes(blk, j, cw);
    const float d = HalfToFloatQ16(Load16(blk + 208));
    const auto* sc = reinterpret_cast<const int8_t*>(blk + 192);
    *f1 = d * static_cast<float>(sc[2 * j]);
    *f2 = d * static_cast<float>(sc[2 * j + 1]);
    return;
  }
  if (kType == 12) {
    Q4KCodes(blk, j, cw);
  } else {
    Q5KCodes(blk, j, cw);
  }
  int sc, m;
  KScaleMin(blk + 4, j, &sc, &m);
  *f1 = HalfToFloatQ16(Load16(blk)) * static_cast<float>(sc);
  *f2 = (-HalfToFloatQ16(Load16(blk + 2))) * static_cast<float>(m);
}

// acc plus the sub-block dotted with one token's activation block (xw, d_t, s_t), in the
// CPU's order.
template <int kType>
SPECNODE_Q16_HD float KSubBlockApply(const uint32_t cw[8], float f1, float f2,
                                     const uint32_t xw[16], float d_t, float s_t, float acc) {
  if (kType == 14) {
    acc = Fma(static_cast<float>(DotCodes(cw, xw, 0, 4)), f1 * d_t, acc);
    return Fma(static_cast<float>(DotCodes(cw, xw, 4, 8)), f2 * d_t, acc);
  }
  acc = Fma(static_cast<float>(DotCodes(cw, xw, 0, 8)), f1 * d_t, acc);
  return Fma(f2, s_t, acc);
}

template <int kType>
SPECNODE_Q16_HD float KSubBlock(const uint8_t* blk, int j, const uint32_t xw[16], float d_t,
                                float s_t, float acc) {
  uint32_t cw[8];
  float f1, f2;
  KSubBlockCodes<kType>(blk, j, cw, &f1, &f2);
  return KSubBlockApply<kType>(cw, f1, f2, xw, d_t, s_t, acc);
}

}  // namespace specnode::q16
