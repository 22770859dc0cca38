// The tensor-core form of the quantised-activation matmul (cuda_mma_kernels.cu): how a
// thread block stages weights and activations into shared memory, where each lane's mma
// fragments come from, and how a warp turns the integer products into the float terms of
// q16_order.h — as code that compiles for the host and the GPU, so that a host test
// (cuda/tests/q16_mma_test.cc) replays a whole thread block, with an emulator of the PTX
// mma in place of the instruction, and checks it against q16::CanonicalRow bit for bit.
//
// Exact integer products on int8 tensor cores: an int16 activation is qs = 256 hi + lo
// (hi = qs >> 8 signed, lo = qs & 255 unsigned), so a 16-value dot is
//   Σ w qs = 256 Σ w hi + Σ w lo
// — mma.m16n8k16 .s8.s8 on the hi bytes, the product times 256, then .u8.s8 on the lo
// bytes, accumulated in int32 (exact: |Σ| <= 32 * 128 * 32767 < 2^27 for a 32-value block).
//
// Work layout: a thread block takes kMmaTokens tokens x kMmaRows rows; its 4 warps each a
// 32 x 32 corner (WarpToken0, WarpRow0): 2 x 4 mma tiles of 16 tokens x 8 rows. A stage holds
// kMmaStageSub 32-value sub-blocks (128 values) of every row and token:
//   w  [kMmaRows][kMmaStride]   weight codes (s8, SubBlockCodes' bytes in value order)
//   hi [kMmaTokens][kMmaStride] activation hi bytes (s8), lo: lo bytes (u8)
//   wf [kMmaRows][kMmaStageSub][2]   f1, f2;  xf [kMmaTokens][kMmaStageSub][2]  d_t, s_t
// Rows are kMmaStride = 144 bytes apart so that a fragment load (8 rows x 4 words) touches 32
// distinct banks. mma operands: A = activations [16 tokens x 16 values] row-major, B =
// weights [16 values x 8 rows] column-major (a row's values contiguous), C [token][row].
// Kept free of absl and of C++20. Pure functions; a MmaStage is one thread block's.
#pragma once

#include <stdint.h>
#include <string.h>

#include "cuda/q16_order.h"

#if defined(__CUDA_ARCH__)
#define SPECNODE_Q16_UNROLL _Pragma("unroll")
#else
#define SPECNODE_Q16_UNROLL
#endif

namespace specnode::q16 {

inline constexpr int kMmaThreads = 128;  // 4 warps
inline constexpr int kMmaTokens = 64;    // tokens of a thread block
inline constexpr int kMmaRows = 64;      // weight rows of a thread block
inline constexpr int kMmaStageSub = 4;   // 32-value sub-blocks per stage
inline constexpr int kMmaStride = 144;   // bytes between staged rows (128 values + 16)
inline constexpr int kMmaTilesM = 2;     // 16-token mma tiles per warp
inline constexpr int kMmaTilesN = 4;     // 8-row mma tiles per warp
// Stage items (a row's or token's sub-block) per thread, of each kind.
inline constexpr int kMmaItems = kMmaRows * kMmaStageSub / kMmaThreads;
static_assert(kMmaRows == kMmaTokens, "one item count for weights and activations");

struct MmaStage {
  uint8_t w[kMmaRows * kMmaStride];
  uint8_t hi[kMmaTokens * kMmaStride];
  uint8_t lo[kMmaTokens * kMmaStride];
  float wf[kMmaRows * kMmaStageSub * 2];
  float xf[kMmaTokens * kMmaStageSub * 2];
};

// A warp's accumulators: [mma tile along tokens][along rows][fragment element].
using MmaInts = int[kMmaTilesM][kMmaTilesN][4];
using MmaFloats = float[kMmaTilesM][kMmaTilesN][4];

// Words a = qs0 | qs1 << 16 and b = qs2 | qs3 << 16 of four int16 values -> their lo bytes
// (u8) and hi bytes (s8), value order, so that qs = 256 hi + lo.
SPECNODE_Q16_HD void SplitHiLo(uint32_t a, uint32_t b, uint32_t* lo, uint32_t* hi) {
#if defined(__CUDA_ARCH__)
  *lo = __byte_perm(a, b, 0x6420);
  *hi = __byte_perm(a, b, 0x7531);
#else
  *lo = (a & 0xffu) | ((a >> 8) & 0xff00u) | ((b & 0xffu) << 16) | ((b << 8) & 0xff000000u);
  *hi = ((a >> 8) & 0xffu) | ((a >> 16) & 0xff00u) | ((b << 8) & 0xff0000u) | (b & 0xff000000u);
#endif
}

// The warp's corner of the thread block's tile.
SPECNODE_Q16_HD int WarpToken0(int warp) { return (warp & 1) * 32; }
SPECNODE_Q16_HD int WarpRow0(int warp) { return (warp >> 1) * 32; }

// Fragments of mma.m16n8k16 with 8-bit inputs (PTX ISA, "Matrix fragments for mma.m16n8k16"):
// lane = 4 g + t. A register i (< 2): token tile0 + g + 8 i, values k0 + 4 t .. + 3. B: row
// tile0 + g, values k0 + 4 t .. + 3. C element e (< 4): token g + 8 (e / 2), row 2 t + e % 2
// of the tile. Byte offsets into the staged matrices.
SPECNODE_Q16_HD int AFragOffset(int lane, int token0, int k0, int i) {
  return (token0 + (lane >> 2) + 8 * i) * kMmaStride + k0 + 4 * (lane & 3);
}
SPECNODE_Q16_HD int BFragOffset(int lane, int row0, int k0) {
  return (row0 + (lane >> 2)) * kMmaStride + k0 + 4 * (lane & 3);
}
SPECNODE_Q16_HD int CFragToken(int lane, int e) { return (lane >> 2) + 8 * (e >> 1); }
SPECNODE_Q16_HD int CFragRow(int lane, int e) { return 2 * (lane & 3) + (e & 1); }

// 8 words to a 16-byte aligned place in the stage.
SPECNODE_Q16_HD void Store8Words(uint8_t* dst, const uint32_t v[8]) {
#if defined(__CUDA_ARCH__)
  reinterpret_cast<uint4*>(dst)[0] = make_uint4(v[0], v[1], v[2], v[3]);
  reinterpret_cast<uint4*>(dst)[1] = make_uint4(v[4], v[5], v[6], v[7]);
#else
  memcpy(dst, v, 32);
#endif
}

// Stage item `item` (< kMmaRows kMmaStageSub) of the weights: local row item / 4's sub-block
// item % 4, i.e. sub-block sb0 + item % 4 of the row at `row` (nullptr past the matrix's
// rows). Sub-blocks at or past `nsub` and missing rows stage zeros.
template <int kType>
SPECNODE_Q16_HD void StageWeightItem(const uint8_t* row, int64_t sb0, int nsub, int item,
                                     MmaStage* st) {
  const int r = item / kMmaStageSub, j = item % kMmaStageSub;
  uint32_t cw[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  float f1 = 0.0f, f2 = 0.0f;
  if (row != nullptr && j < nsub) {
    int jj;
    const uint8_t* blk = BlockOf<kType>(row, sb0 + j, &jj);
    SubBlockCodes<kType>(blk, jj, cw, &f1, &f2);
  }
  Store8Words(st->w + r * kMmaStride + j * kBlock, cw);
  st->wf[(r * kMmaStageSub + j) * 2] = f1;
  st->wf[(r * kMmaStageSub + j) * 2 + 1] = f2;
}

// Stage item `item` of the activations: local token item / 4's sub-block item % 4 from its
// int16 row qs and its d, s (nullptr past the pass's tokens).
SPECNODE_Q16_HD void StageActItem(const int16_t* qs, const float* d, const float* s, int64_t sb0,
                                  int nsub, int item, MmaStage* st) {
  const int m = item / kMmaStageSub, j = item % kMmaStageSub;
  uint32_t lo[8] = {0, 0, 0, 0, 0, 0, 0, 0}, hi[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  float dt = 0.0f, stt = 0.0f;
  if (qs != nullptr && j < nsub) {
    uint32_t xw[16];
    LoadActWords(qs + (sb0 + j) * kBlock, xw);
    for (int w = 0; w < 8; ++w) SplitHiLo(xw[2 * w], xw[2 * w + 1], &lo[w], &hi[w]);
    dt = d[sb0 + j];
    stt = s[sb0 + j];
  }
  Store8Words(st->hi + m * kMmaStride + j * kBlock, hi);
  Store8Words(st->lo + m * kMmaStride + j * kBlock, lo);
  st->xf[(m * kMmaStageSub + j) * 2] = dt;
  st->xf[(m * kMmaStageSub + j) * 2 + 1] = stt;
}

// p plus the warp's integer products of staged sub-block j (c: a whole sub-block's dot, or
// for Q6_K half `half`'s) as q16_order.h's terms, each (token, row) element on its own.
template <int kType>
SPECNODE_Q16_HD void ApplyTile(int half, const MmaInts& c, const MmaStage& st, int warp, int lane,
                               int j, MmaFloats& p) {
  SPECNODE_Q16_UNROLL
  for (int mt = 0; mt < kMmaTilesM; ++mt) {
    SPECNODE_Q16_UNROLL
    for (int nt = 0; nt < kMmaTilesN; ++nt) {
      SPECNODE_Q16_UNROLL
      for (int e = 0; e < 4; ++e) {
        const int m = WarpToken0(warp) + 16 * mt + CFragToken(lane, e);
        const int r = WarpRow0(warp) + 8 * nt + CFragRow(lane, e);
        const float* wf = st.wf + (r * kMmaStageSub + j) * 2;
        const float* xf = st.xf + (m * kMmaStageSub + j) * 2;
        float& acc = p[mt][nt][e];
        if (kType == kTypeQ6_K) {
          acc = HalfTerm(c[mt][nt][e], wf[half], xf[0], acc);
        } else {
          acc = ApplyDots<kType>(c[mt][nt][e], 0, wf[0], wf[1], xf[0], xf[1], acc);
        }
      }
    }
  }
}

// The warp's step for staged sub-block j: integer products by `mma` (mma(c, k0, lo): c += the
// warp's A · B over staged values k0 .. k0 + 15, A the lo bytes if `lo` else the hi bytes),
// then ApplyTile.
template <int kType, typename Mma>
SPECNODE_Q16_HD void WarpSubBlock(const MmaStage& st, int warp, int lane, int j, Mma& mma,
                                  MmaFloats& p) {
  MmaInts c;
  const int halves = kType == kTypeQ6_K ? 2 : 1;
  SPECNODE_Q16_UNROLL
  for (int h = 0; h < halves; ++h) {
    SPECNODE_Q16_UNROLL
    for (int mt = 0; mt < kMmaTilesM; ++mt) {
      SPECNODE_Q16_UNROLL
      for (int nt = 0; nt < kMmaTilesN; ++nt) {
        SPECNODE_Q16_UNROLL
        for (int e = 0; e < 4; ++e) c[mt][nt][e] = 0;
      }
    }
    const int k0 = j * kBlock + 16 * h;
    const int k1 = halves == 1 ? k0 + 16 : -1;  // the block's second half, unless on its own
    mma(c, k0, false);
    if (k1 >= 0) mma(c, k1, false);
    SPECNODE_Q16_UNROLL
    for (int mt = 0; mt < kMmaTilesM; ++mt) {
      SPECNODE_Q16_UNROLL
      for (int nt = 0; nt < kMmaTilesN; ++nt) {
        SPECNODE_Q16_UNROLL
        for (int e = 0; e < 4; ++e) c[mt][nt][e] *= 256;
      }
    }
    mma(c, k0, true);
    if (k1 >= 0) mma(c, k1, true);
    ApplyTile<kType>(halves == 1 ? 1 : h, c, st, warp, lane, j, p);
  }
}

// Whether the stage ending at sub-block sb_end (exclusive) of a row of `subs` ends a range.
template <int kType>
SPECNODE_Q16_HD bool StageEndsRange(int64_t sb_end, int64_t subs) {
  return sb_end == subs || sb_end % (RangeValues(kType) / kBlock) == 0;
}

// total = total + p, p = +0, element by element (a range ends).
SPECNODE_Q16_HD void AddRange(MmaFloats& p, MmaFloats& total) {
  SPECNODE_Q16_UNROLL
  for (int mt = 0; mt < kMmaTilesM; ++mt) {
    SPECNODE_Q16_UNROLL
    for (int nt = 0; nt < kMmaTilesN; ++nt) {
      SPECNODE_Q16_UNROLL
      for (int e = 0; e < 4; ++e) {
        total[mt][nt][e] = total[mt][nt][e] + p[mt][nt][e];
        p[mt][nt][e] = 0.0f;
      }
    }
  }
}

}  // namespace specnode::q16
