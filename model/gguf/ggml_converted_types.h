// Storage-only GGUF types, converted at load: ggml's "K-quants" Q4_K, Q5_K and Q6_K, what
// most GGUF files on the hub use (Q4_K_M = Q4_K with Q6_K for some matrices, Q5_K_M = Q5_K
// + Q6_K, Q6_K), and Q5_0 / Q5_1, which llama.cpp's K-quant mixes fall back to for matrices
// whose rows are not whole 256-value blocks (SmolLM2's 576-wide ones, for instance).
//
// The CPU kernels compute with 32-value blocks (Q4_0 / Q4_1 / Q8_0), so such a matrix is
// converted once at load (LoadLlamaWeights) into its compute type:
//   Q5_0 -> Q8_0  exact (the same f16 scale; codes q - 16 in [-16, 15]);
//   Q5_1 -> Q8_0  requantised (as Q5_K below);
//   Q4_K -> Q4_1  each 32-value sub-block keeps its nibbles; its scale d*sc and offset
//                 -dmin*m (f32 products of the block's f16 and 6-bit factors) are rounded
//                 to Q4_1's f16 d and m: a relative error <= 2^-11 on each, two orders of
//                 magnitude under the 4-bit quantisation step itself;
//   Q5_K -> Q8_0  requantised from the exact dequantised values (|error| <= half a Q8_0
//   Q6_K -> Q8_0  step, max|x| / 254 of each 32 values: an eighth of a Q6_K step or less).
// The matrices then run at Q4_1 / Q8_0 speed (Q5_K and Q6_K take 8.5 bits per weight
// instead of 5.5 / 6.56).
//
// Layouts (ggml's; values in natural order):
//   Q5_0: f16 d, qh (u32, bit i: the fifth bit of value i), qs[16] (value i < 16 in the low
//         nibble of qs[i], value i + 16 in its high nibble); value = d * (q - 16).
//   Q5_1: f16 d, f16 m, qh, qs as Q5_0; value = d * q + m.
// and, with 256 values per super-block:
//   Q4_K: f16 d, f16 dmin, scales[12] (8 pairs of 6-bit scale sc_j and min m_j, packed as
//         ggml's get_scale_min_k4), qs[128]: for chunk c < 4, bytes 32c .. 32c+31 hold
//         sub-block 2c in their low nibbles and 2c+1 in their high ones.
//         value = d * sc_j * q - dmin * m_j for sub-block j (32 values).
//   Q5_K: f16 d, f16 dmin, scales[12] as Q4_K, qh[32] (bit j of qh[l]: the fifth bit of
//         value l of sub-block j), qs[128] as Q4_K's nibbles. q in [0, 31].
//   Q6_K: ql[128], qh[64], int8 scales[16] (one per 16 values), f16 d. For half h < 2 and
//         l < 32, values 128h + l, +32, +64, +96 take the low nibble of ql[64h + l], of
//         ql[64h + 32 + l], the high nibble of ql[64h + l], of ql[64h + 32 + l], and bits
//         0-1, 2-3, 4-5, 6-7 of qh[32h + l] as their top two bits; value = d * sc * (q - 32).
#pragma once

#include <cstdint>

#include "model/gguf/ggml_types.h"

namespace specnode {

inline constexpr int kKQuantBlock = 256;  // values per K-quant super-block

struct BlockQ4K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qs[128];
};
struct BlockQ5K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[32];
  uint8_t qs[128];
};
struct BlockQ6K {
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint16_t d;
};
static_assert(sizeof(BlockQ4K) == 144);
static_assert(sizeof(BlockQ5K) == 176);
static_assert(sizeof(BlockQ6K) == 210);
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[16];
};
struct BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[16];
};
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);

inline bool IsConvertedType(GgmlType type) {
  return type == GgmlType::kQ4_K || type == GgmlType::kQ5_K || type == GgmlType::kQ6_K ||
         type == GgmlType::kQ5_0 || type == GgmlType::kQ5_1;
}

// Exact dequantisation (ggml's order of operations). cols % GgmlBlockSize(type) == 0.
void DequantizeConvertedRow(GgmlType type, const void* src, float* dst /*[cols]*/, int64_t cols);

// A valid encoding of src (Q5_0 / Q5_1: ggml's reference rounding; K-quants: plain
// rounding, not ggml's search for the best scales): for writing test models.
void QuantizeConvertedRow(GgmlType type, const float* src /*[cols]*/, void* dst, int64_t cols);

// The 32-value type the kernels run a converted type as (see above); `type` otherwise.
GgmlType ComputeTypeOf(GgmlType type);

// One row of a converted-type matrix in its compute type: dst holds
// GgmlRowBytes(ComputeTypeOf(type), cols) bytes.
void ConvertRowToComputeType(GgmlType type, const void* src, void* dst, int64_t cols);

}  // namespace specnode
