// Device code shared by the GPU page pool's kernels (cuda_kv_kernels.cu: encoding,
// demotion, slot copies; cuda_kv_attention.cu: attention): where a token's rows sit in the
// arena (cuda_kv_kernels.h's layout), the two-step decoding of a stored row, and the
// Walsh-Hadamard transform of a row held by a warp. Included by .cu files only; every
// function is a forceinline device function in an unnamed namespace (one copy per file).
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/cuda_kv_kernels.h"
#include "kvstore/kv_row_codec.h"

namespace specnode::cuda_internal {
namespace {

namespace codec = ::specnode::kv_codec;

// Values of a row a lane holds (value lane + 32 i in slot i).
constexpr int kPerLane = codec::kMaxHeadDim / 32;

__device__ __forceinline__ int64_t Offset(const int32_t* e) {
  return static_cast<int64_t>(static_cast<uint32_t>(e[0])) | (static_cast<int64_t>(e[1]) << 32);
}

// a[cls] of a kernel parameter's array by selects: indexing it with a run-time cls would copy
// it to local memory in every thread (and read it from there per position).
__device__ __forceinline__ int ByClass(const int (&a)[4], int cls) {
  return cls == 0 ? a[0] : (cls == 1 ? a[1] : (cls == 2 ? a[2] : a[3]));
}
// Bytes of a K row, and of a kv head's K and V rows, of class cls.
__device__ __forceinline__ int KeyBytesOf(const KvDeviceFormat& f, int cls) {
  return ByClass(f.key_bytes, cls);
}
__device__ __forceinline__ int PairBytesOf(const KvDeviceFormat& f, int cls) {
  return ByClass(f.pair_bytes, cls);
}

__device__ __forceinline__ int64_t LayerStride(const KvDeviceFormat& f, int cls) {
  return static_cast<int64_t>(f.page_tokens) * f.n_kv_heads * PairBytesOf(f, cls);
}

// Row (layer, kv head, K or V) of the token whose layer-0 base is `base`.
__device__ __forceinline__ uint8_t* RowAt(const KvDeviceFormat& f, int64_t base, int cls, int layer,
                                          int kv_head, int value) {
  return f.arena + base + layer * LayerStride(f, cls) +
         static_cast<int64_t>(kv_head) * PairBytesOf(f, cls) + (value ? KeyBytesOf(f, cls) : 0);
}

// Decoding in two steps, so that a warp can issue the loads of several rows before it
// uses any (KvAttentionKernel): RawHeader / RawAt load a row's header (bytes 0..3: int8's
// f32 scale, int4's and int2's f16 scale and min; nothing for f16) and value d's storage
// word (f16 bits; the int8 byte; the int4 or int2 byte holding it), DecodeRaw turns them into the
// value (kv_codec::DecodeAt with the hardware's f16 conversion). The int4 header and every later
// row of the slot may start at an odd address (a row is 4 + head_dim / 2 bytes, odd when
// head_dim % 4 == 2): headers are read byte-wise; f16 rows (2 head_dim bytes at even
// offsets) load their values as aligned 16-bit words.
__device__ __forceinline__ uint32_t RawHeader(int cls, const uint8_t* row) {
  if (cls == codec::kFull) return 0;
  return static_cast<uint32_t>(row[0]) | (static_cast<uint32_t>(row[1]) << 8) |
         (static_cast<uint32_t>(row[2]) << 16) | (static_cast<uint32_t>(row[3]) << 24);
}
__device__ __forceinline__ uint32_t RawAt(int cls, const uint8_t* row, int d) {
  if (cls == codec::kFull) return *reinterpret_cast<const uint16_t*>(row + 2 * d);
  if (cls == codec::kInt8) return row[4 + d];
  return row[4 + (d >> (cls == codec::kInt2 ? 2 : 1))];  // int4: 2 values a byte, int2: 4
}
__device__ __forceinline__ float HalfBits(uint32_t bits) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits & 0xffffu)));
}
__device__ __forceinline__ float DecodeRaw(int cls, uint32_t header, uint32_t raw, int d) {
  if (cls == codec::kFull) return HalfBits(raw);
  if (cls == codec::kInt8) {
    return codec::BitsFloat(header) * static_cast<float>(static_cast<int8_t>(raw & 0xffu));
  }
  // int4: bits 4 (d % 2) .. +3 of the byte; int2: bits 2 (d % 4) .. +1 (one shift, one mask).
  const uint32_t shift = cls == codec::kInt2 ? 2u * (d & 3) : 4u * (d & 1);
  const float q = static_cast<float>((raw >> shift) & (cls == codec::kInt2 ? 3u : 15u));
  return HalfBits(header >> 16) + HalfBits(header) * q;  // min + scale * q
}

// The Walsh-Hadamard transform of a row held by a warp (value lane + 32 i in x[i]): the
// CPU's butterflies (len 1, 2, 4, ...) in its order, lower element a + b, upper a - b, then
// the 1/sqrt(n) scaling: bit-identical to HadamardInPlace.
__device__ __forceinline__ void WarpHadamard(float (&x)[kPerLane], int n, float norm, int lane) {
  for (int len = 1; len < n && len < 32; len <<= 1) {
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const float other = __shfl_xor_sync(0xffffffffu, x[i], len);
      x[i] = (lane & len) ? other - x[i] : x[i] + other;
    }
  }
  // len >= 32 pairs registers i and i + len / 32 of the same lane.
#define SPECNODE_REGISTER_STAGE(step)                      \
  if (n > 32 * (step)) {                                   \
    _Pragma("unroll") for (int i = 0; i < kPerLane; ++i) { \
      if ((i & (step)) == 0) {                             \
        const float a = x[i], b = x[i + (step)];           \
        x[i] = a + b;                                      \
        x[i + (step)] = a - b;                             \
      }                                                    \
    }                                                      \
  }
  SPECNODE_REGISTER_STAGE(1)
  SPECNODE_REGISTER_STAGE(2)
  SPECNODE_REGISTER_STAGE(4)
#undef SPECNODE_REGISTER_STAGE
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) x[i] *= norm;
}

}  // namespace
}  // namespace specnode::cuda_internal
