// Tensor element types as numbered by GGUF/ggml, their block layouts and conversions.
//
// Quantised types store a row of `cols` values as cols/kBlock blocks. Layouts (bytes):
//   Q4_0: { f16 d; u8 qs[16]; }            value = d * ((q & 15) - 8), low nibbles = 0..15,
//                                          high nibbles = 16..31 of the block
//   Q4_1: { f16 d; f16 m; u8 qs[16]; }     value = d * (q & 15) + m, same nibble order
//   Q8_0: { f16 d; i8 qs[32]; }            value = d * q
// Plain types: F32, F16 (IEEE half), BF16 (upper half of an f32).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace specnode {

enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,  // storage only: converted at load (ggml_converted_types.h)
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ4_K = 12,  // storage only, as Q5_0 / Q5_1
  kQ5_K = 13,
  kQ6_K = 14,
  kBF16 = 30,
};

inline constexpr int kQuantBlock = 32;  // values per block for every quantised type here

struct BlockQ4_0 {
  uint16_t d;  // f16 scale
  uint8_t qs[16];
};
struct BlockQ4_1 {
  uint16_t d;  // f16 scale
  uint16_t m;  // f16 minimum
  uint8_t qs[16];
};
struct BlockQ8_0 {
  uint16_t d;  // f16 scale
  int8_t qs[32];
};
static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ8_0) == 34);

// Is `raw` one of the types above (the ones this engine reads)? The kernels compute with all
// but Q5_0, Q5_1 and the K-quants, which LoadLlamaWeights converts (ggml_converted_types.h).
bool IsSupportedGgmlType(uint32_t raw);
// F32, F16, BF16, Q4_0, Q4_1 or Q8_0: the types MatMul and the GPU upload take.
bool IsComputeGgmlType(GgmlType type);
// "Q4_1", "F32", ...; "type#N" for unknown numbers.
std::string_view GgmlTypeName(uint32_t raw);
// Values per block (1 for plain types). Only valid for supported types.
int GgmlBlockSize(GgmlType type);
// Bytes per block (element size for plain types). Only valid for supported types.
size_t GgmlBlockBytes(GgmlType type);
// Bytes of one row of `cols` values; cols must be a multiple of the block size.
inline size_t GgmlRowBytes(GgmlType type, int64_t cols) {
  return static_cast<size_t>(cols / GgmlBlockSize(type)) * GgmlBlockBytes(type);
}

float Fp16ToFp32(uint16_t h);
uint16_t Fp32ToFp16(float f);  // round to nearest even
inline float Bf16ToFp32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
uint16_t Fp32ToBf16(float f);  // round to nearest even

// Reference conversions, one row of `cols` values (scalar, the ground truth for kernels).
void DequantizeRow(GgmlType type, const void* src, float* dst /*[cols]*/, int64_t cols);
// Quantise with ggml's reference rounding (used by the GGUF writer and tests).
void QuantizeRow(GgmlType type, const float* src /*[cols]*/, void* dst, int64_t cols);

}  // namespace specnode
