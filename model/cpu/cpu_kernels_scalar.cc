// Portable kernels: baseline C++ only (the compiler may still use SSE2 on x86-64). The
// ground truth for the SIMD files' arithmetic, and the only path on non-x86 machines.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "model/cpu/cpu_kernels.h"
#include "model/gguf/ggml_types.h"

namespace specnode::cpu_kernels {
namespace {

constexpr int kBlock = kQuantBlock;

float LoadF16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return Fp16ToFp32(h);
}

// Same arithmetic as the SIMD versions (division for d and 1/d, round-to-nearest-even of
// x * (1/d)), so every path sees identical quantised activations. kMax: 32767 or 127.
template <typename Q, int kMax>
void QuantizeTo(const float* x, int64_t blocks, Q* qs, float* d, float* s) {
  for (int64_t b = 0; b < blocks; ++b) {
    const float* xb = x + b * kBlock;
    float amax = 0.0f;
    for (int j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(xb[j]));
    const float db = amax / static_cast<float>(kMax);
    const float id = db != 0.0f ? 1.0f / db : 0.0f;
    int sum = 0;
    for (int j = 0; j < kBlock; ++j) {
      const int q = static_cast<int>(std::nearbyint(xb[j] * id));
      qs[b * kBlock + j] = static_cast<Q>(q);
      sum += q;
    }
    d[b] = db;
    s[b] = db * static_cast<float>(sum);
  }
}

void Quantize(const float* x, int64_t blocks, GgmlType /*weight_type*/, int16_t* qs, float* d,
              float* s) {
  QuantizeTo<int16_t, 32767>(x, blocks, qs, d, s);
}

void Quantize8(const float* x, int64_t blocks, GgmlType /*weight_type*/, int8_t* qs, float* d,
               float* s) {
  QuantizeTo<int8_t, 127>(x, blocks, qs, d, s);
}

// Integer dot of one weight block with 32 activation values.
template <typename Q>
int DotQ4(const uint8_t* qs, const Q* x, int offset) {
  int sum = 0;
  for (int j = 0; j < 16; ++j) {
    sum += ((qs[j] & 15) - offset) * x[j];
    sum += ((qs[j] >> 4) - offset) * x[j + 16];
  }
  return sum;
}

template <typename Q>
int DotQ8(const int8_t* qs, const Q* x) {
  int sum = 0;
  for (int j = 0; j < kBlock; ++j) sum += qs[j] * x[j];
  return sum;
}

// One (row, token) result. Q4_0 subtracts its offset inside the integer dot here; the SIMD
// kernels use the unsigned dot plus -8 d_w s_b, which is equal up to float rounding.
template <typename Q>
float RowDot(GgmlType type, const uint8_t* row, int64_t blocks, const Q* xq, const float* xd,
             const float* xs) {
  float acc = 0.0f, acc_min = 0.0f;
  for (int64_t b = 0; b < blocks; ++b) {
    const Q* xb = xq + b * kBlock;
    switch (type) {
      case GgmlType::kQ4_0: {
        const uint8_t* blk = row + b * sizeof(BlockQ4_0);
        const float dd = LoadF16(blk) * xd[b];
        acc += static_cast<float>(DotQ4(blk + 2, xb, 8)) * dd;
        break;
      }
      case GgmlType::kQ4_1: {
        const uint8_t* blk = row + b * sizeof(BlockQ4_1);
        const float dd = LoadF16(blk) * xd[b];
        acc += static_cast<float>(DotQ4(blk + 4, xb, 0)) * dd;
        acc_min += LoadF16(blk + 2) * xs[b];
        break;
      }
      default: {  // kQ8_0
        const uint8_t* blk = row + b * sizeof(BlockQ8_0);
        const float dd = LoadF16(blk) * xd[b];
        acc += static_cast<float>(DotQ8(reinterpret_cast<const int8_t*>(blk + 2), xb)) * dd;
        break;
      }
    }
  }
  return acc + acc_min;
}

template <bool kInt8>
void MatMulQuant(const QuantMatMulArgs& a, int64_t row_begin, int64_t row_end) {
  for (int64_t r = row_begin; r < row_end; ++r) {
    const uint8_t* row = a.w + r * a.row_stride;
    for (int64_t t = 0; t < a.n; ++t) {
      const float* d = a.x.d + t * a.x.ds_stride;
      const float* s = a.x.s + t * a.x.ds_stride;
      a.y[t * a.ldy + r] =
          kInt8 ? RowDot(a.type, row, a.blocks, a.x.qs8 + t * a.x.qs_stride, d, s)
                : RowDot(a.type, row, a.blocks, a.x.qs + t * a.x.qs_stride, d, s);
    }
  }
}

// Float weights: each row is converted a chunk at a time (reused by every token), then
// dotted with 8 interleaved partial sums per token so the compiler can vectorise the loop.
constexpr int64_t kChunk = 256;  // multiple of 8: lane k always holds columns = k mod 8

void MatMulFloat(const FloatMatMulArgs& a, int64_t row_begin, int64_t row_end) {
  const size_t elem = a.type == GgmlType::kF32 ? 4 : 2;
  float wbuf[kChunk];
  std::vector<float> lanes(a.n * 8);
  for (int64_t r = row_begin; r < row_end; ++r) {
    const uint8_t* row = a.w + r * a.row_stride;
    std::fill(lanes.begin(), lanes.end(), 0.0f);
    for (int64_t c0 = 0; c0 < a.cols; c0 += kChunk) {
      const int64_t len = std::min(kChunk, a.cols - c0);
      DequantizeRow(a.type, row + c0 * elem, wbuf, len);
      for (int64_t t = 0; t < a.n; ++t) {
        const float* xt = a.x + t * a.ldx + c0;
        float* acc = &lanes[t * 8];
        int64_t j = 0;
        for (; j + 8 <= len; j += 8) {
          for (int k = 0; k < 8; ++k) acc[k] += wbuf[j + k] * xt[j + k];
        }
        for (; j < len; ++j) acc[j & 7] += wbuf[j] * xt[j];
      }
    }
    for (int64_t t = 0; t < a.n; ++t) {
      const float* acc = &lanes[t * 8];
      a.y[t * a.ldy + r] =
          ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    }
  }
}

}  // namespace

void SwiGluScalar(const float* gate, const float* up, int64_t n, float* out) {
  namespace c = swiglu_exp;
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    float x = -g;
    x = c::kLo > x ? c::kLo : x;  // maxps(kLo, x) / minps(kHi, x): NaN passes through
    x = c::kHi < x ? c::kHi : x;
    const float kf = std::fma(x, c::kLog2e, c::kMagic);
    const float k = kf - c::kMagic;
    const float r = std::fma(k, -c::kLn2Lo, std::fma(k, -c::kLn2Hi, x));
    float p = c::kP[0];
    for (int j = 1; j < 6; ++j) p = std::fma(p, r, c::kP[j]);
    const float e = std::fma(p, r * r, r) + 1.0f;
    uint32_t bits;
    std::memcpy(&bits, &kf, 4);
    bits = (bits + 127u) << 23;
    float scale;
    std::memcpy(&scale, &bits, 4);
    out[i] = g / std::fma(e, scale, 1.0f) * up[i];
  }
}

// Natural-order quantisers for the x8 path, though no scalar x8 kernel is in the table
// (PackedMatMulReference is the tests' reference).
const KernelTable kScalarKernels = {.name = "scalar",
                                    .quantize = &Quantize,
                                    .matmul_quant = &MatMulQuant<false>,
                                    .matmul_float = &MatMulFloat,
                                    .quantize8 = &Quantize8,
                                    .matmul_quant8 = &MatMulQuant<true>,
                                    .quantize_x8 = &Quantize,
                                    .matmul_quant_x8 = nullptr,
                                    .quantize8_x8 = &Quantize8,
                                    .matmul_quant8_x8 = nullptr,
                                    .swiglu = &SwiGluScalar};

}  // namespace specnode::cpu_kernels
