// Internal to cuda/: launchers for the kernels in cuda_attention_kernels.cu. Arguments are
// validated by cuda_attention.cc; these only launch and return cudaGetLastError(). Kept free
// of absl and model/ headers beyond ggml_types.h so nvcc (C++17) sees a small header.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "model/gguf/ggml_types.h"

namespace specnode::cuda_internal {

// Largest head_dim the attention kernel handles (8 values per lane).
inline constexpr int kAttentionMaxHeadDim = 256;

cudaError_t LaunchKvWrite(const float* k, const float* v, const int32_t* rows, int64_t n,
                          int kv_dim, uint16_t* k_pool, uint16_t* v_pool, cudaStream_t stream);

// See CudaAttentionArgs (cuda_attention.h) for the meaning of each argument.
cudaError_t LaunchPagedAttention(const float* q, const uint16_t* k_pool, const uint16_t* v_pool,
                                 const int32_t* page_table, const int32_t* table_row,
                                 const int32_t* ctx, int64_t n, int n_heads, int n_kv_heads,
                                 int head_dim, int page_tokens, int max_pages, float scale,
                                 float* out, cudaStream_t stream);

// out[i, :] = row ids[i] of W (rows `row_stride` bytes apart, `cols` values of `type`).
cudaError_t LaunchEmbeddingRows(GgmlType type, const void* w, size_t row_stride, int64_t cols,
                                const int32_t* ids, int64_t n, float* out, cudaStream_t stream);

}  // namespace specnode::cuda_internal
