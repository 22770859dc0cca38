// Embedding rows (contract in cuda_embedding.h): one block per row, threads over its columns.
#include <cuda_fp16.h>

#include "cuda/cuda_embedding_kernels.h"

namespace specnode::cuda_internal {
namespace {

constexpr int kElementwiseThreads = 256;

__device__ __forceinline__ float HalfBits(uint16_t bits) {
  return __half2float(__ushort_as_half(bits));
}

// Value c of a row of W, dequantised as model/ggml_types.cc's DequantizeRow does.
__device__ float DequantAt(GgmlType type, const uint8_t* row, int64_t c) {
  const int64_t b = c / 32;
  const int j = static_cast<int>(c % 32);
  switch (type) {
    case GgmlType::kF32:
      return reinterpret_cast<const float*>(row)[c];
    case GgmlType::kF16:
      return HalfBits(reinterpret_cast<const uint16_t*>(row)[c]);
    case GgmlType::kBF16:
      return __uint_as_float(static_cast<uint32_t>(reinterpret_cast<const uint16_t*>(row)[c])
                             << 16);
    case GgmlType::kQ8_0: {
      const uint8_t* blk = row + b * 34;
      const float d = HalfBits(static_cast<uint16_t>(blk[0] | (blk[1] << 8)));
      return d * static_cast<float>(static_cast<int8_t>(blk[2 + j]));
    }
    case GgmlType::kQ4_0: {
      const uint8_t* blk = row + b * 18;
      const float d = HalfBits(static_cast<uint16_t>(blk[0] | (blk[1] << 8)));
      const int q = j < 16 ? (blk[2 + j] & 15) : (blk[2 + j - 16] >> 4);
      return d * static_cast<float>(q - 8);
    }
    default: {  // kQ4_1
      const uint8_t* blk = row + b * 20;
      const float d = HalfBits(static_cast<uint16_t>(blk[0] | (blk[1] << 8)));
      const float m = HalfBits(static_cast<uint16_t>(blk[2] | (blk[3] << 8)));
      const int q = j < 16 ? (blk[4 + j] & 15) : (blk[4 + j - 16] >> 4);
      return d * static_cast<float>(q) + m;
    }
  }
}

__global__ void __launch_bounds__(kElementwiseThreads)
    EmbeddingRowsKernel(GgmlType type, const uint8_t* __restrict__ w, size_t row_stride,
                        int64_t cols, const int32_t* __restrict__ ids, float* __restrict__ out) {
  const int64_t i = blockIdx.x;
  const uint8_t* row = w + static_cast<size_t>(ids[i]) * row_stride;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    out[i * cols + c] = DequantAt(type, row, c);
}

}  // namespace

cudaError_t LaunchEmbeddingRows(GgmlType type, const void* w, size_t row_stride, int64_t cols,
                                const int32_t* ids, int64_t n, float* out, cudaStream_t stream) {
  EmbeddingRowsKernel<<<static_cast<unsigned>(n), kElementwiseThreads, 0, stream>>>(
      type, static_cast<const uint8_t*>(w), row_stride, cols, ids, out);
  return cudaGetLastError();
}

}  // namespace specnode::cuda_internal
