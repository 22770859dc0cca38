#include "cuda/cuda_embedding.h"

#include "absl/strings/str_cat.h"
#include "cuda/cuda_check.h"
#include "cuda/cuda_embedding_kernels.h"
#include "model/gguf/ggml_types.h"

namespace specnode {

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
