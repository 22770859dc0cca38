#include "cuda/cuda_check.h"

#include <cublas_v2.h>

#include "absl/strings/str_cat.h"

namespace specnode {

absl::StatusOr<int> CudaDeviceCount() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    // Reset the runtime's "last error" so a later, unrelated launch check does not see it.
    (void)cudaGetLastError();
    return absl::UnavailableError(absl::StrCat("no CUDA device: ", cudaGetErrorString(error), " (",
                                               cudaGetErrorName(error), ")"));
  }
  return count;
}

namespace cuda_internal {

absl::Status CudaErrorToStatus(cudaError_t error, const char* expr, const char* file, int line) {
  // The runtime also records a failed call as the "last error"; reset it so that the next
  // launch check (cudaGetLastError) does not report this failure a second time. Sticky
  // errors (a corrupted context) cannot be reset and keep being reported, as they should.
  (void)cudaGetLastError();
  return absl::InternalError(absl::StrCat(file, ":", line, ": ", expr,
                                          " failed: ", cudaGetErrorString(error), " (",
                                          cudaGetErrorName(error), ")"));
}

absl::Status CublasErrorToStatus(cublasStatus_t status, const char* expr, const char* file,
                                 int line) {
  return absl::InternalError(absl::StrCat(file, ":", line, ": ", expr,
                                          " failed: ", cublasGetStatusString(status), " (",
                                          cublasGetStatusName(status), ")"));
}

}  // namespace cuda_internal
}  // namespace specnode
