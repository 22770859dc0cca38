// Error checking for CUDA runtime and cuBLAS calls: every failure becomes an absl::Status
// that names the call and where it was made, never an abort or an exception.
//
//   SPECNODE_CUDA_RETURN_IF_ERROR(cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice));
//     on failure returns from the enclosing function (which returns absl::Status or
//     absl::StatusOr<T>) with
//       InternalError("cuda/foo.cc:42: cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice)
//                      failed: invalid argument (cudaErrorInvalidValue)")
//   SPECNODE_CUBLAS_RETURN_IF_ERROR(cublasGemmEx(...));
//     the same for cublasStatus_t, with cublasGetStatusString's text.
//   SPECNODE_CUDA_RETURN_IF_LAUNCH_ERROR("RmsNormKernel");
//     after a kernel launch: returns cudaGetLastError() as above, naming the kernel.
//     Launch errors (bad configuration) are caught here; errors while the kernel runs are
//     asynchronous and surface at the next synchronising call on the stream.
//   SPECNODE_CUDA_STATUS(expr) / SPECNODE_CUBLAS_STATUS(expr)
//     the same checks as an absl::Status value (OK on success), for code that must not
//     return early (e.g. collecting the first error while still cleaning up).
//
// The message format "<file>:<line>: <expr> failed: <reason>" is stable; tests match it.
#pragma once

#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace specnode {

// Number of CUDA devices visible to this process. When the runtime cannot report devices
// (no driver, driver older than the runtime, no device, CUDA_VISIBLE_DEVICES empty) the
// result is UnavailableError("no CUDA device: <cudaGetErrorString> (<error name>)")
// instead of an abort, so callers (and tests) can fall back or skip. May return 0 only if
// the runtime itself reports success with zero devices.
absl::StatusOr<int> CudaDeviceCount();

namespace cuda_internal {

// Builds InternalError("<file>:<line>: <expr> failed: <reason>"). Only called on failure.
absl::Status CudaErrorToStatus(cudaError_t error, const char* expr, const char* file, int line);
absl::Status CublasErrorToStatus(cublasStatus_t status, const char* expr, const char* file,
                                 int line);

inline absl::Status CudaStatus(cudaError_t error, const char* expr, const char* file, int line) {
  if (error == cudaSuccess) return absl::OkStatus();
  return CudaErrorToStatus(error, expr, file, line);
}
inline absl::Status CublasStatus(cublasStatus_t status, const char* expr, const char* file,
                                 int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return CublasErrorToStatus(status, expr, file, line);
}

}  // namespace cuda_internal
}  // namespace specnode

#define SPECNODE_CUDA_STATUS(expr) \
  ::specnode::cuda_internal::CudaStatus((expr), #expr, __FILE__, __LINE__)

#define SPECNODE_CUBLAS_STATUS(expr) \
  ::specnode::cuda_internal::CublasStatus((expr), #expr, __FILE__, __LINE__)

#define SPECNODE_CUDA_RETURN_IF_ERROR(expr)                                                      \
  do {                                                                                           \
    const cudaError_t specnode_cuda_error_ = (expr);                                             \
    if (specnode_cuda_error_ != cudaSuccess) {                                                   \
      return ::specnode::cuda_internal::CudaErrorToStatus(specnode_cuda_error_, #expr, __FILE__, \
                                                          __LINE__);                             \
    }                                                                                            \
  } while (0)

#define SPECNODE_CUBLAS_RETURN_IF_ERROR(expr)                                               \
  do {                                                                                      \
    const cublasStatus_t specnode_cublas_status_ = (expr);                                  \
    if (specnode_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                                 \
      return ::specnode::cuda_internal::CublasErrorToStatus(specnode_cublas_status_, #expr, \
                                                            __FILE__, __LINE__);            \
    }                                                                                       \
  } while (0)

// `kernel_name` is a string literal naming the kernel just launched.
#define SPECNODE_CUDA_RETURN_IF_LAUNCH_ERROR(kernel_name)                      \
  do {                                                                         \
    const cudaError_t specnode_cuda_error_ = cudaGetLastError();               \
    if (specnode_cuda_error_ != cudaSuccess) {                                 \
      return ::specnode::cuda_internal::CudaErrorToStatus(                     \
          specnode_cuda_error_, "launch of " kernel_name, __FILE__, __LINE__); \
    }                                                                          \
  } while (0)
