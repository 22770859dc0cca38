// The arithmetic of the quantised-activation matmul (cuda_qmatvec_kernels.cu) as code that
// compiles for the host and for the GPU: a token's activations rounded to int16 blocks, and
// one weight block's integer dot with such a block.
//
// It is the CPU's default arithmetic (model/cpu/cpu_kernels.h, "Quantised weights"; the
// scalar table in model/cpu/cpu_kernels_scalar.cc is the ground truth): per block b of 32
// values
//   d_b = max|x| / 32767,  qs[j] = round_nearest_even(x[j] * (1 / d_b)),  s_b = d_b * Σ qs,
// and a weight block contributes
//   Q4_0: d_w d_b Σ (q_w - 8) qs        (q_w = nibble 0..15; the signed dot of the scalar table)
//   Q4_1: d_w d_b Σ q_w qs  +  m_w s_b  (the m_w s_b terms summed apart, added at the end)
//   Q8_0: d_w d_b Σ q_w qs              (q_w signed)
// so the GPU sees exactly the activations the CPU sees, and the integer sums equal the CPU's
// (exact: |Σ| <= 15 * 32767 * 32 < 2^31 for the nibbles, 128 * 32767 * 32 for Q8_0). Only the
// order in which a row's float block terms are added differs (the CPU goes block by block,
// the GPU splits a row over lanes), so rows agree to f32 rounding, not bit for bit.
//
// On the GPU the integer dots are __dp2a_lo / __dp2a_hi (int16 pair x int8 pair + int32, one
// instruction); on the host the same sums are spelled out. A host test
// (cuda/tests/q16_dot_test.cc, no GPU needed) checks QuantizeBlock16 byte for byte against the
// CPU's scalar quantiser and every Dot* against the scalar table's integer dots.
//
// Word layouts (little-endian 32-bit words, as the kernels load them):
//   activations: xw[k] = qs[2k] | qs[2k + 1] << 16, k < 16;
//   Q4_0 / Q4_1 quants: qw[k] = bytes 4k..4k+3 of the block's 16 quant bytes, k < 4; byte i
//     holds value i in its low nibble and value i + 16 in its high nibble;
//   Q8_0 quants: qw[k] = int8 values 4k..4k+3, k < 8.
// Kept free of absl and of C++20 (nvcc compiles this project's kernels as C++17). Pure
// functions, thread-safe.
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <cmath>

#if defined(__CUDACC__)
#define SPECNODE_Q16_HD __host__ __device__ __forceinline__
#else
#define SPECNODE_Q16_HD inline
#endif

namespace specnode::q16 {

inline constexpr int kBlock = 32;      // values per activation / weight block
inline constexpr int kLevels = 32767;  // largest |qs|

// d_b from the block's max |x| (IEEE division, as the CPU's amax / 32767.0f).
SPECNODE_Q16_HD float Scale(float amax) { return amax / static_cast<float>(kLevels); }
// 1 / d_b, 0 for an all-zero block.
SPECNODE_Q16_HD float InverseScale(float d) { return d != 0.0f ? 1.0f / d : 0.0f; }
// qs[j]: x * (1 / d) rounded to nearest, ties to even.
SPECNODE_Q16_HD int Level(float x, float inv) {
#if defined(__CUDA_ARCH__)
  return __float2int_rn(x * inv);
#else
  return static_cast<int>(std::nearbyint(x * inv));
#endif
}
// s_b from d_b and the block's exact integer sum (|sum| <= 32 * 32767 < 2^24: exact in f32).
SPECNODE_Q16_HD float Sum(float d, int level_sum) { return d * static_cast<float>(level_sum); }

// One block of 32 values, sequentially (the host's reference; the GPU kernel computes the
// same max and sum across a warp: both are exact, so their order does not matter).
SPECNODE_Q16_HD void QuantizeBlock16(const float* x, int16_t* qs, float* d, float* s) {
  float amax = 0.0f;
  for (int j = 0; j < kBlock; ++j) {
    const float a = fabsf(x[j]);
    amax = a > amax ? a : amax;
  }
  const float db = Scale(amax);
  const float inv = InverseScale(db);
  int sum = 0;
  for (int j = 0; j < kBlock; ++j) {
    const int q = Level(x[j], inv);
    qs[j] = static_cast<int16_t>(q);
    sum += q;
  }
  *d = db;
  *s = Sum(db, sum);
}

#if defined(__CUDACC__)
// One block of 32 values on a warp, lane j holding value j (every lane calls it): the
// block's max |x| and level sum are warp reductions, exact, so qs[j], *d and *s are
// QuantizeBlock16's. Used by every kernel that writes int16 activations
// (cuda_qmatvec_kernels.cu's QuantizeActs16Kernel, the RMSNorm and SwiGLU of cuda_ops.cu).
__device__ __forceinline__ void WarpQuantizeBlock16(float v, int lane, int16_t* qs, float* d,
                                                    float* s) {
  float amax = fabsf(v);
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float o = __shfl_xor_sync(0xffffffffu, amax, offset);
    amax = o > amax ? o : amax;
  }
  const float db = Scale(amax);
  const int q = Level(v, InverseScale(db));
  qs[lane] = static_cast<int16_t>(q);
  const int sum = __reduce_add_sync(0xffffffffu, q);
  if (lane == 0) {
    *d = db;
    *s = Sum(db, sum);
  }
}
#endif

// One activation block: 32 int16 values as the 16 words above (4 vector loads on the GPU;
// 16-byte aligned).
SPECNODE_Q16_HD void LoadActWords(const int16_t* x, uint32_t xw[16]) {
#if defined(__CUDA_ARCH__)
  const uint4* xv = reinterpret_cast<const uint4*>(x);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint4 q = __ldg(xv + k);
    xw[4 * k] = q.x;
    xw[4 * k + 1] = q.y;
    xw[4 * k + 2] = q.z;
    xw[4 * k + 3] = q.w;
  }
#else
  memcpy(xw, x, 64);
#endif
}

// acc + a.lo16 * b.byte0 + a.hi16 * b.byte1 (signed), and the same with bytes 2, 3.
SPECNODE_Q16_HD int Dp2aLo(uint32_t a, uint32_t b, int acc) {
#if defined(__CUDA_ARCH__)
  return __dp2a_lo(static_cast<int>(a), static_cast<int>(b), acc);
#else
  return acc + static_cast<int16_t>(a & 0xffffu) * static_cast<int8_t>(b & 0xffu) +
         static_cast<int16_t>(a >> 16) * static_cast<int8_t>((b >> 8) & 0xffu);
#endif
}
SPECNODE_Q16_HD int Dp2aHi(uint32_t a, uint32_t b, int acc) {
#if defined(__CUDA_ARCH__)
  return __dp2a_hi(static_cast<int>(a), static_cast<int>(b), acc);
#else
  return acc + static_cast<int16_t>(a & 0xffffu) * static_cast<int8_t>((b >> 16) & 0xffu) +
         static_cast<int16_t>(a >> 16) * static_cast<int8_t>(b >> 24);
#endif
}

// Σ over 4 signed bytes of `q` times activations xw[0] (values 0, 1) and xw[1] (2, 3).
SPECNODE_Q16_HD int Dot4(uint32_t q, uint32_t x01, uint32_t x23, int acc) {
  return Dp2aHi(x23, q, Dp2aLo(x01, q, acc));
}

// Nibbles 0..15 in each byte -> the same minus 8 as signed bytes, without carries between
// bytes: (v | 0x80) - 8 is 0x78 + v >= 0x78, and flipping bit 7 back gives v - 8 mod 256.
SPECNODE_Q16_HD uint32_t MinusEight(uint32_t nibbles) {
  return ((nibbles | 0x80808080u) - 0x08080808u) ^ 0x80808080u;
}

// Σ_j (q_j - offset) qs[j] over a Q4 block (offset 8 for Q4_0, 0 for Q4_1).
template <int kOffset>
SPECNODE_Q16_HD int DotQ4(const uint32_t qw[4], const uint32_t xw[16]) {
  int acc = 0;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int k = 0; k < 4; ++k) {
    uint32_t lo = qw[k] & 0x0f0f0f0fu;
    uint32_t hi = (qw[k] >> 4) & 0x0f0f0f0fu;
    if (kOffset == 8) {
      lo = MinusEight(lo);
      hi = MinusEight(hi);
    }
    acc = Dot4(lo, xw[2 * k], xw[2 * k + 1], acc);
    acc = Dot4(hi, xw[8 + 2 * k], xw[8 + 2 * k + 1], acc);
  }
  return acc;
}

// Σ_j q_j qs[j] over a Q8_0 block.
SPECNODE_Q16_HD int DotQ8(const uint32_t qw[8], const uint32_t xw[16]) {
  int acc = 0;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int k = 0; k < 8; ++k) acc = Dot4(qw[k], xw[2 * k], xw[2 * k + 1], acc);
  return acc;
}

}  // namespace specnode::q16
