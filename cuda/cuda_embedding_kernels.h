// Internal to cuda/: the launcher of the kernel in cuda_embedding_kernels.cu. Arguments are
// validated by cuda_embedding.cc; it only launches and return cudaGetLastError(). Kept free
// of absl and model/ headers beyond ggml_types.h so nvcc (C++17) sees a small header.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "model/gguf/ggml_types.h"

namespace specnode::cuda_internal {

// out[i, :] = row ids[i] of W (rows `row_stride` bytes apart, `cols` values of `type`).
cudaError_t LaunchEmbeddingRows(GgmlType type, const void* w, size_t row_stride, int64_t cols,
                                const int32_t* ids, int64_t n, float* out, cudaStream_t stream);

}  // namespace specnode::cuda_internal
