// Helpers shared by the host tests of the quantised-activation matmul's arithmetic
// (q16_dot_test.cc, q16_mma_test.cc): random weights and activations rounded by the CPU's
// own quantisers, in the layouts its kernels take.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "cuda/q16_dot.h"
#include "cuda/q16_order.h"
#include "model/cpu/cpu_kernels.h"
#include "model/gguf/ggml_converted_types.h"
#include "model/gguf/ggml_types.h"

namespace specnode::q16_test {

inline constexpr int kB = q16::kBlock;

inline uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// `tokens` rows of `cols` random activations (outliers every `outlier_every` values) rounded
// by the CPU's scalar quantiser, in the strides its kernels take, and the CPU's matmul
// arguments over them (w, row_stride and blocks for the caller to set).
struct ScalarActs {
  int64_t qs_stride = 0, ds_stride = 0;
  std::vector<int16_t> qs;
  std::vector<float> d, s;
  std::vector<float> y;
  cpu_kernels::QuantMatMulArgs args;
};

inline void QuantizeTokens(GgmlType type, int64_t tokens, int64_t cols, int64_t rows, uint32_t seed,
                           int outlier_every, ScalarActs* a) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(tokens * cols);
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = normal(rng) * (i % outlier_every == 0 ? 25.0f : 1.0f);
  }
  const int64_t blocks = cols / kB;
  a->qs_stride = (cols + 127) / 128 * 128;
  a->ds_stride = (blocks + 15) / 16 * 16;
  a->qs.assign(tokens * a->qs_stride + 128, 0);
  a->d.assign(tokens * a->ds_stride + 16, 0.0f);
  a->s.assign(tokens * a->ds_stride + 16, 0.0f);
  for (int64_t t = 0; t < tokens; ++t) {
    cpu_kernels::kScalarKernels.quantize(
        x.data() + t * cols, blocks, type, a->qs.data() + t * a->qs_stride,
        a->d.data() + t * a->ds_stride, a->s.data() + t * a->ds_stride);
  }
  a->y.assign(tokens * rows, 0.0f);
  a->args.type = type;
  a->args.blocks = blocks;
  a->args.x = {a->qs.data(), nullptr,      a->d.data(), a->s.data(),
               nullptr,      a->qs_stride, a->ds_stride};
  a->args.n = tokens;
  a->args.y = a->y.data();
  a->args.ldy = rows;
}

// Rows of random weights of any type the quantised-activation matmul runs, in ggml's layout:
// normals of 0.05 (every other row shifted by 0.01) for Q4_0 / Q4_1 / Q8_0; for the
// K-quants a spread that varies within each sub-block (0.05 (1 + i % 7), every other row
// shifted by 0.02), so that their 6-bit scales and mins differ.
inline std::vector<uint8_t> Rows(GgmlType type, int64_t rows, int64_t cols, uint32_t seed) {
  const bool k = IsKQuantType(type);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const size_t row_bytes = GgmlRowBytes(type, cols);
  std::vector<uint8_t> w(rows * row_bytes);
  std::vector<float> row(cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (size_t i = 0; i < row.size(); ++i) {
      row[i] = k ? normal(rng) * 0.05f * (1.0f + static_cast<float>(i % 7)) + (r % 2 ? 0.02f : 0.0f)
                 : normal(rng) * 0.05f + (r % 2 ? 0.01f : 0.0f);
    }
    if (k) {
      QuantizeConvertedRow(type, row.data(), w.data() + r * row_bytes, cols);
    } else {
      QuantizeRow(type, row.data(), w.data() + r * row_bytes, cols);
    }
  }
  return w;
}

// q16::CanonicalRow for a run-time type: one row of `cols` values dotted with one token's
// int16 activations (qs [cols], d and s [cols / 32]).
inline float CanonicalOf(GgmlType type, const uint8_t* row, int64_t cols, const int16_t* qs,
                         const float* d, const float* s) {
  switch (type) {
    case GgmlType::kQ4_0:
      return q16::CanonicalRow<q16::kTypeQ4_0>(row, cols, qs, d, s);
    case GgmlType::kQ4_1:
      return q16::CanonicalRow<q16::kTypeQ4_1>(row, cols, qs, d, s);
    case GgmlType::kQ8_0:
      return q16::CanonicalRow<q16::kTypeQ8_0>(row, cols, qs, d, s);
    case GgmlType::kQ4_K:
      return q16::CanonicalRow<q16::kTypeQ4_K>(row, cols, qs, d, s);
    case GgmlType::kQ5_K:
      return q16::CanonicalRow<q16::kTypeQ5_K>(row, cols, qs, d, s);
    default:
      return q16::CanonicalRow<q16::kTypeQ6_K>(row, cols, qs, d, s);
  }
}

}  // namespace specnode::q16_test
