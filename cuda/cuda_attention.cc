#include "cuda/cuda_attention.h"

#include "absl/strings/str_cat.h"
#include "cuda/cuda_attention_kernels.h"
#include "cuda/cuda_check.h"
#include "model/gguf/ggml_types.h"

namespace specnode {

absl::Status CudaKvWrite(const float* k, const float* v, const int32_t* rows, int64_t n,
                         int kv_dim, uint16_t* k_pool, uint16_t* v_pool, cudaStream_t stream) {
  if (n < 0 || kv_dim <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("CudaKvWrite: need n >= 0 and kv_dim > 0, got n=", n, " kv_dim=", kv_dim));
  }
  if (n == 0) return absl::OkStatus();
  if (k == nullptr || v == nullptr || rows == nullptr || k_pool == nullptr || v_pool == nullptr) {
    return absl::InvalidArgumentError("CudaKvWrite: null pointer");
  }
  SPECNODE_CUDA_RETURN_IF_ERROR(
      cuda_internal::LaunchKvWrite(k, v, rows, n, kv_dim, k_pool, v_pool, stream));
  return absl::OkStatus();
}

absl::Status CudaPagedAttention(const CudaAttentionArgs& a, cudaStream_t stream) {
  if (a.n < 0 || a.n > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("CudaPagedAttention: n must be in [0, 65535], got ", a.n));
  }
  if (a.n == 0) return absl::OkStatus();
  if (a.n_heads <= 0 || a.n_kv_heads <= 0 || a.n_heads % a.n_kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("CudaPagedAttention: n_heads (", a.n_heads,
                     ") must be a positive multiple of n_kv_heads (", a.n_kv_heads, ")"));
  }
  if (a.head_dim <= 0 || a.head_dim > cuda_internal::kAttentionMaxHeadDim) {
    return absl::InvalidArgumentError(absl::StrCat("CudaPagedAttention: head_dim must be in [1, ",
                                                   cuda_internal::kAttentionMaxHeadDim,
                                                   "], got ", a.head_dim));
  }
  if (a.page_tokens <= 0 || a.max_pages <= 0) {
    return absl::InvalidArgumentError("CudaPagedAttention: page_tokens and max_pages must be > 0");
  }
  if (a.q == nullptr || a.k_pool == nullptr || a.v_pool == nullptr || a.page_table == nullptr ||
      a.table_row == nullptr || a.ctx == nullptr || a.out == nullptr) {
    return absl::InvalidArgumentError("CudaPagedAttention: null pointer");
  }
  SPECNODE_CUDA_RETURN_IF_ERROR(cuda_internal::LaunchPagedAttention(
      a.q, a.k_pool, a.v_pool, a.page_table, a.table_row, a.ctx, a.n, a.n_heads, a.n_kv_heads,
      a.head_dim, a.page_tokens, a.max_pages, a.scale, a.out, stream));
  return absl::OkStatus();
}

absl::Status CudaEmbeddingRows(const WeightView& w, const int32_t* ids, int64_t n, float* out,
                               cudaStream_t stream) {
  if (!IsComputeGgmlType(w.type)) {
    return absl::InvalidArgumentError("CudaEmbeddingRows: unsupported type");
  }
  if (n < 0 || n > 0x7fffffff) {
    return absl::InvalidArgumentError(absl::StrCat("CudaEmbeddingRows: bad n ", n));
  }
  if (GgmlBlockSize(w.type) > 1 && w.cols % kQuantBlock != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("CudaEmbeddingRows: cols ", w.cols, " not a multiple of 32"));
  }
  if (n == 0 || w.cols == 0) return absl::OkStatus();
  if (w.data == nullptr || ids == nullptr || out == nullptr) {
    return absl::InvalidArgumentError("CudaEmbeddingRows: null pointer");
  }
  SPECNODE_CUDA_RETURN_IF_ERROR(cuda_internal::LaunchEmbeddingRows(w.type, w.data, w.row_stride,
                                                                   w.cols, ids, n, out, stream));
  return absl::OkStatus();
}

}  // namespace specnode
