// Storage-only GGUF types: ggml's "K-quants" Q4_K, Q5_K and Q6_K, what most GGUF files on
// the hub use (Q4_K_M = Q4_K with Q6_K for some matrices, Q5_K_M = Q5_K + Q6_K, Q6_K), and
// Q5_0 / Q5_1, which llama.cpp's K-quant mixes fall back to for matrices whose rows are not
// whole 256-value blocks (SmolLM2's 576-wide ones, for instance).
//
// The CPU's x8 kernels run the K-quants as stored (repacked, model/cpu/cpu_repack_kquant.h).
// Everything else that cannot — Q5_0 / Q5_1 always, K-quants on kernel tables without
// K-quant kernels (CPUs without AVX2), with SPECNODE_REPACK=0 or SPECNODE_KQUANT_NATIVE=0,
// on a GPU, and K-quant column slices that cut a super-block — is converted once at load
// (ConvertToComputeType, llama_weights.h) into a 32-value compute type:
//   Q5_0 -> Q8_0  exact (the same f16 scale; codes q - 16 in [-16, 15]);
//   Q5_1 -> Q8_0  requantised (as Q5_K below);
//   Q4_K -> Q4_1  each 32-value sub-block keeps its nibbles; its scale d*sc and offset
//                 -dmin*m (f32 products of the block's f16 and 6-bit factors) are rounded
//                 to Q4_1's f16 d and m: a relative error <= 2^-11 on each;
//   Q5_K -> Q8_0  requantised from the exact dequantised values (|error| <= half a Q8_0
//   Q6_K -> Q8_0  step, max|x| / 254 of each 32 values: an eighth of a Q6_K step or less).
// Converted matrices run at Q4_1 / Q8_0 speed and bytes (Q5_K and Q6_K take 8.5 bits per
// weight instead of 5.5 / 6.56) and move a model's logits by far more than the native
// kernels' float rounding (docs/model-engine.md, "K-quant files").
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

// Q4_K, Q5_K or Q6_K: the types the CPU's x8 kernels also run natively (cpu_repack_kquant.h).
constexpr bool IsKQuantType(GgmlType type) {
  return type == GgmlType::kQ4_K || type == GgmlType::kQ5_K || type == GgmlType::kQ6_K;
}

// Q5_0 or Q5_1: the 32-value types the CPU's x8 kernels also run natively (cpu_repack.h).
constexpr bool IsQ5Type(GgmlType type) {
  return type == GgmlType::kQ5_0 || type == GgmlType::kQ5_1;
}

// One K-quant super-block as integer codes and its factors (for repacking):
//   Q4_K / Q5_K: value i = (d * sc[j]) * q[i] - dmin * m[j], j = i / 32 (sc, m < 64,
//                q < 16 / 32);
//   Q6_K:        value i = (d * int8(sc[i / 16])) * (q[i] - 32), q < 64.
struct KQuantCodes {
  uint16_t d = 0;       // f16
  uint16_t dmin = 0;    // f16 (Q4_K / Q5_K)
  uint8_t sc[16] = {};  // Q4_K / Q5_K: sc[0..7]; Q6_K: the 16 int8 scales' bytes
  uint8_t m[8] = {};    // Q4_K / Q5_K
  uint8_t q[256] = {};
};
// IsKQuantType(type); src: one block of GgmlBlockBytes(type) bytes.
void DecodeKQuantBlock(GgmlType type, const void* src, KQuantCodes* out);

// One Q5_0 / Q5_1 block as its 32 five-bit codes and f16 factors (for repacking):
//   Q5_0: value i = d * (q[i] - 16);  Q5_1: value i = d * q[i] + m   (q < 32).
struct Q5Codes {
  uint16_t d = 0;  // f16
  uint16_t m = 0;  // f16 (Q5_1; 0 for Q5_0)
  uint8_t q[32] = {};
};
// type Q5_0 or Q5_1; src: one block of GgmlBlockBytes(type) bytes.
void DecodeQ5Block(GgmlType type, const void* src, Q5Codes* out);

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
