// One cached K or V row in the KV store's formats (kvstore/kv_precision.h), as code that
// compiles for the host and for the GPU: encode, decode, and the Walsh-Hadamard rotation.
// Lives with the store's formats; the GPU page pool's kernels (cuda/cuda_kv_kernels.cu,
// cuda/kv_device_rows.cuh) call these, and a host test (cuda/tests/kv_pool_host_test.cc, no
// GPU needed) checks them byte for byte against the CPU
// pool's KvEncodeRow / KvDecodeRow / HadamardInPlace, so a GPU-encoded page holds the bytes a
// CPU-encoded one would for the same f32 row (the swap tier's bytes move between them).
//
// Why not call kv_precision.cc from the kernels: it uses the host's f16 conversion and
// std::nearbyint; these spell the same IEEE operations (round to nearest even, f32
// arithmetic without contraction where the CPU has none) in a form nvcc and the host
// compiler both accept. Kept free of absl and of C++20 (nvcc compiles this project's kernels
// as C++17).
//
// Row formats (head_dim d even, <= 256; kvstore/kv_precision.h has the layouts): 0 f16
// (2d bytes), 1 int8 + f32 scale (4 + d), 2 int4 + f16 scale and min (4 + d / 2), 3 int2
// + f16 scale and min (4 + ceil(d / 4)). A class's K and V rows use RowFormat(class, V):
// its own format, but int4 for the keys of class 3 (the cold class). `row` needs no alignment (an
// int4 row is odd-sized when d % 4 == 2): loads are byte-wise.
//
// The int2 format is defined here only (kv_precision.cc calls it): its encoder sums over the
// row (mean, spread, the error of each candidate scale), and a sum's bits depend on its
// order, so the order is spelled as the GPU's warp takes it (Int2LaneSum) and every
// product and sum is one rounding (MulRn / AddRn: nvcc would contract a * b + c into one
// fma).
//
// Pure functions, thread-safe.
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <cmath>

#if defined(__CUDACC__)
#define SPECNODE_HD __host__ __device__ __forceinline__
#else
#define SPECNODE_HD inline
#endif

namespace specnode::kv_codec {

// KvPrecision's values.
enum : int { kFull = 0, kInt8 = 1, kInt4 = 2, kInt2 = 3 };
inline constexpr int kNumClasses = 4;

inline constexpr int kMaxHeadDim = 256;

SPECNODE_HD uint32_t FloatBits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
SPECNODE_HD float BitsFloat(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// IEEE half (bits) to float, exact.
SPECNODE_HD float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t em = h & 0x7fffu;
  if (em >= 0x7c00u) return BitsFloat(sign | 0x7f800000u | ((em & 0x3ffu) << 13));
  if (em >= 0x0400u) return BitsFloat(sign | ((em + 0x1c000u) << 13));  // rebias 15 -> 127
  // Subnormal: em * 2^-24, exact in float.
  return BitsFloat(sign | FloatBits(static_cast<float>(em) * 5.9604644775390625e-08f));
}

// Float to IEEE half bits, round to nearest even (as model/gguf's Fp32ToFp16); NaN stays a
// (quiet) NaN.
SPECNODE_HD uint16_t FloatToHalf(float f) {
  const uint32_t x = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);
  if (a >= 0x47800000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 2^16 (or inf)
  if (a >= 0x38800000u) {
    // Normal half: drop 13 mantissa bits with round-half-even; a carry out of the mantissa
    // bumps the exponent (and 65520.. rounds into infinity), as it should.
    const uint32_t odd = (a >> 13) & 1u;
    return static_cast<uint16_t>(sign | ((a - 0x38000000u + 0xfffu + odd) >> 13));
  }
  // Below 2^-14: a subnormal half, the value in units of 2^-24, rounded half-even.
  const uint32_t e = a >> 23;
  if (e < 102) return sign;  // below 2^-25 (a tie at 2^-25 itself rounds to even 0 too)
  const uint32_t m = (a & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126 - e;  // 14..24
  uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  return static_cast<uint16_t>(sign | q);
}

SPECNODE_HD float RoundEven(float v) {
#if defined(__CUDA_ARCH__)
  return rintf(v);
#else
  return std::nearbyint(v);
#endif
}

SPECNODE_HD int ClampInt(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }

SPECNODE_HD uint16_t LoadU16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
SPECNODE_HD void StoreU16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v & 0xffu);
  p[1] = static_cast<uint8_t>(v >> 8);
}
SPECNODE_HD float LoadF32(const uint8_t* p) {
  return BitsFloat(static_cast<uint32_t>(LoadU16(p)) |
                   (static_cast<uint32_t>(LoadU16(p + 2)) << 16));
}
SPECNODE_HD void StoreF32(uint8_t* p, float v) {
  const uint32_t u = FloatBits(v);
  StoreU16(p, static_cast<uint16_t>(u & 0xffffu));
  StoreU16(p + 2, static_cast<uint16_t>(u >> 16));
}

SPECNODE_HD int RowBytes(int cls, int head_dim) {
  if (cls == kFull) return 2 * head_dim;
  if (cls == kInt8) return 4 + head_dim;
  return cls == kInt4 ? 4 + head_dim / 2 : 4 + (head_dim + 3) / 4;
}

// KvRowFormat / KvPairBytes (kv_precision.h): class c's K (value 0) or V (value 1) row
// format, and the bytes of a kv head's K and V rows of one token in class c.
SPECNODE_HD int RowFormat(int cls, int value) { return cls == kInt2 && !value ? kInt4 : cls; }
SPECNODE_HD int PairBytes(int cls, int head_dim) {
  return RowBytes(RowFormat(cls, 0), head_dim) + RowBytes(RowFormat(cls, 1), head_dim);
}

// One IEEE rounding each, never fused (host code is compiled without contraction:
// kvstore/CMakeLists.txt).
SPECNODE_HD float MulRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
SPECNODE_HD float AddRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
SPECNODE_HD float SubRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
SPECNODE_HD float DivRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
SPECNODE_HD float SqrtRn(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

// The steps of EncodeRow's int8 and int4 classes, one value at a time, so that the GPU's
// warp-per-row encoder (cuda_kv_kernels.cu, KvEncodeKernel) runs the same arithmetic with
// the row spread over lanes. Its cross-lane reductions give EncodeRow's max / min / max
// because each picks one element: AbsMaxStep's result is the largest |x| whatever the order,
// and Extremes keeps, like EncodeRow's sequential scan (std::min / std::max's choices), the
// first index attaining the minimum (resp. maximum) under <, which fixes the sign of a zero
// extreme: a lexicographic choice over (value, index), the same in any order (rows without
// NaN; a NaN row's bytes may differ).
SPECNODE_HD float AbsMaxStep(float amax, float x) {
  const float a = fabsf(x);
  return amax < a ? a : amax;
}
struct Int8Params {
  float scale, inv;
};
SPECNODE_HD Int8Params Int8ParamsFor(float amax) {
  const float scale = amax / 127.0f;
  return Int8Params{scale, scale > 0.0f ? 1.0f / scale : 0.0f};
}
SPECNODE_HD uint8_t Int8Byte(float x, float inv) {
  return static_cast<uint8_t>(
      static_cast<int8_t>(ClampInt(static_cast<int>(RoundEven(x * inv)), -127, 127)));
}

struct Extremes {
  float lo;
  int lo_at;
  float hi;
  int hi_at;
};
SPECNODE_HD Extremes ExtremesOf(float x, int at) { return Extremes{x, at, x, at}; }
SPECNODE_HD Extremes Combine(const Extremes& a, const Extremes& b) {
  Extremes r = a;
  if (b.lo < a.lo || (!(a.lo < b.lo) && b.lo_at < a.lo_at)) {
    r.lo = b.lo;
    r.lo_at = b.lo_at;
  }
  if (a.hi < b.hi || (!(b.hi < a.hi) && b.hi_at < a.hi_at)) {
    r.hi = b.hi;
    r.hi_at = b.hi_at;
  }
  return r;
}

// Quantise against the stored (f16-rounded) scale and min, which decoding uses.
struct Int4Params {
  uint16_t scale_h, min_h;
  float min, inv;
};
SPECNODE_HD Int4Params Int4ParamsFor(float lo, float hi) {
  const uint16_t scale_h = FloatToHalf((hi - lo) / 15.0f);
  const uint16_t min_h = FloatToHalf(lo);
  const float scale = HalfToFloat(scale_h);
  return Int4Params{scale_h, min_h, HalfToFloat(min_h), scale > 0.0f ? 1.0f / scale : 0.0f};
}
SPECNODE_HD int Int4Level(float x, const Int4Params& p) {
  const float d = x - p.min;
  return ClampInt(static_cast<int>(RoundEven(d * p.inv)), 0, 15);
}

// --- int2: the cold tier. value = min + scale * q, q in [0, 3], byte d / 4 holding q[d] in
// bits 2 (d % 4) .. 2 (d % 4) + 1. Four levels cannot span a row's extremes usefully, so the
// scale is chosen, not derived: the levels are centred on the row's mean, spaced by
// Int2Span(k) x its standard deviation, and the k with the least squared error over the
// row wins (the first of equals). For Gaussian-like rows (what the Hadamard rotation makes of
// K and V rows) the best uniform 4-level spacing is ~1.0 sigma; the list brackets it, and its
// wide end serves rows with heavy tails.
inline constexpr int kInt2Candidates = 8;
SPECNODE_HD float Int2Span(int k) {
  switch (k) {
    case 0:
      return 0.7f;
    case 1:
      return 0.85f;
    case 2:
      return 1.0f;
    case 3:
      return 1.15f;
    case 4:
      return 1.3f;
    case 5:
      return 1.5f;
    case 6:
      return 1.75f;
    default:
      return 2.0f;
  }
}

// Sums over a row in the GPU warp's order: value d into partial d % 32 (increasing d, from
// +0), then partials at xor distance 16, 8, 4, 2, 1 added pairwise (lane 0's result; every
// lane's is the same, a + b being b + a). `p` holds the 32 partials and is consumed.
SPECNODE_HD float Int2LaneSum(float* p) {
  for (int off = 16; off > 0; off >>= 1) {
    float next[32];
    for (int l = 0; l < 32; ++l) next[l] = AddRn(p[l], p[l ^ off]);
    for (int l = 0; l < 32; ++l) p[l] = next[l];
  }
  return p[0];
}

struct Int2Params {
  uint16_t scale_h, min_h;
  float scale, min, inv;
};
// Candidate k's stored (f16) scale and min for a row of this mean and standard deviation;
// quantisation runs against the stored values, which decoding uses.
SPECNODE_HD Int2Params Int2ParamsFor(float mean, float sigma, int k) {
  Int2Params p;
  p.scale_h = FloatToHalf(MulRn(sigma, Int2Span(k)));
  p.scale = HalfToFloat(p.scale_h);
  p.min_h = FloatToHalf(SubRn(mean, MulRn(1.5f, p.scale)));
  p.min = HalfToFloat(p.min_h);
  p.inv = p.scale > 0.0f ? DivRn(1.0f, p.scale) : 0.0f;
  return p;
}
SPECNODE_HD int Int2Level(float x, const Int2Params& p) {
  return ClampInt(static_cast<int>(RoundEven(MulRn(SubRn(x, p.min), p.inv))), 0, 3);
}
SPECNODE_HD float Int2Value(int q, float scale, float min) {
  return AddRn(min, MulRn(scale, static_cast<float>(q)));
}
// Squared error of x stored with p.
SPECNODE_HD float Int2Error(float x, const Int2Params& p) {
  const float e = SubRn(x, Int2Value(Int2Level(x, p), p.scale, p.min));
  return MulRn(e, e);
}

// The serial form of the int2 encoder: every sum in Int2LaneSum's order.
SPECNODE_HD void EncodeInt2Row(const float* x, int head_dim, uint8_t* row) {
  float p[32];
  for (int l = 0; l < 32; ++l) p[l] = 0.0f;
  for (int d = 0; d < head_dim; ++d) p[d & 31] = AddRn(p[d & 31], x[d]);
  const float n = static_cast<float>(head_dim);
  const float mean = DivRn(Int2LaneSum(p), n);
  for (int l = 0; l < 32; ++l) p[l] = 0.0f;
  for (int d = 0; d < head_dim; ++d) {
    const float c = SubRn(x[d], mean);
    p[d & 31] = AddRn(p[d & 31], MulRn(c, c));
  }
  const float sigma = SqrtRn(DivRn(Int2LaneSum(p), n));
  int best = 0;
  float best_err = 0.0f;
  for (int k = 0; k < kInt2Candidates; ++k) {
    const Int2Params c = Int2ParamsFor(mean, sigma, k);
    for (int l = 0; l < 32; ++l) p[l] = 0.0f;
    for (int d = 0; d < head_dim; ++d) p[d & 31] = AddRn(p[d & 31], Int2Error(x[d], c));
    const float err = Int2LaneSum(p);
    if (k == 0 || err < best_err) {
      best = k;
      best_err = err;
    }
  }
  const Int2Params c = Int2ParamsFor(mean, sigma, best);
  StoreU16(row, c.scale_h);
  StoreU16(row + 2, c.min_h);
  for (int i = 0; i < (head_dim + 3) / 4; ++i) row[4 + i] = 0;
  for (int d = 0; d < head_dim; ++d) {
    row[4 + d / 4] = static_cast<uint8_t>(row[4 + d / 4] | (Int2Level(x[d], c) << (2 * (d & 3))));
  }
}

// Encodes x[head_dim] into row (KvEncodeRow's bytes).
SPECNODE_HD void EncodeRow(int cls, const float* x, int head_dim, uint8_t* row) {
  if (cls == kFull) {
    for (int i = 0; i < head_dim; ++i) StoreU16(row + 2 * i, FloatToHalf(x[i]));
    return;
  }
  if (cls == kInt8) {
    float amax = 0.0f;
    for (int i = 0; i < head_dim; ++i) amax = AbsMaxStep(amax, x[i]);
    const Int8Params p = Int8ParamsFor(amax);
    StoreF32(row, p.scale);
    for (int i = 0; i < head_dim; ++i) row[4 + i] = Int8Byte(x[i], p.inv);
    return;
  }
  if (cls == kInt2) {
    EncodeInt2Row(x, head_dim, row);
    return;
  }
  Extremes e = ExtremesOf(x[0], 0);
  for (int i = 1; i < head_dim; ++i) e = Combine(e, ExtremesOf(x[i], i));
  const Int4Params p = Int4ParamsFor(e.lo, e.hi);
  StoreU16(row, p.scale_h);
  StoreU16(row + 2, p.min_h);
  for (int i = 0; i < head_dim; i += 2) {
    row[4 + i / 2] = static_cast<uint8_t>(Int4Level(x[i], p) | (Int4Level(x[i + 1], p) << 4));
  }
}

// Value d of a row (KvDecodeRow's out[d]).
SPECNODE_HD float DecodeAt(int cls, const uint8_t* row, int d) {
  if (cls == kFull) return HalfToFloat(LoadU16(row + 2 * d));
  if (cls == kInt8) return LoadF32(row) * static_cast<float>(static_cast<int8_t>(row[4 + d]));
  if (cls == kInt2) {
    const int q = (row[4 + d / 4] >> (2 * (d & 3))) & 3;
    return Int2Value(q, HalfToFloat(LoadU16(row)), HalfToFloat(LoadU16(row + 2)));
  }
  const uint8_t b = row[4 + d / 2];
  const float q = static_cast<float>((d & 1) ? (b >> 4) : (b & 15));
  const float min = HalfToFloat(LoadU16(row + 2)), scale = HalfToFloat(LoadU16(row));
#if defined(__CUDA_ARCH__)
  // Two roundings, as the CPU's KvDecodeRow (nvcc would fuse this into one FMA).
  return __fadd_rn(min, __fmul_rn(scale, q));
#else
  return min + scale * q;
#endif
}

SPECNODE_HD void DecodeRow(int cls, const uint8_t* row, int head_dim, float* out) {
  for (int d = 0; d < head_dim; ++d) out[d] = DecodeAt(cls, row, d);
}

// HadamardInPlace's transform (n a power of two): the same butterflies in the same order,
// then the same 1/sqrt(n) scaling, so the result is bit-identical.
SPECNODE_HD void Hadamard(float* x, int n) {
  for (int len = 1; len < n; len <<= 1) {
    for (int i = 0; i < n; i += 2 * len) {
      for (int j = i; j < i + len; ++j) {
        const float a = x[j], b = x[j + len];
        x[j] = a + b;
        x[j + len] = a - b;
      }
    }
  }
  const float norm = 1.0f / sqrtf(static_cast<float>(n));
  for (int i = 0; i < n; ++i) x[i] *= norm;
}

}  // namespace specnode::kv_codec
