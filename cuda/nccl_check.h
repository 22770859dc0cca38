// NCCL member of the check-macro family (cuda/cuda_check.h: CUDA and cuBLAS;
// tensor-parallel/mpi_check.h: MPI). Every failing ncclResult_t becomes an absl::Status
// naming the call and where it was made.
//
//   SPECNODE_NCCL_RETURN_IF_ERROR(ncclAllReduce(...));
//     on failure returns from the enclosing function with
//       InternalError("cuda/nccl_communicator.cc:42: ncclAllReduce(...) failed:
//                      <ncclGetErrorString> (ncclResult 3)")
//     ncclInProgress is NOT a failure (non-blocking communicators return it while an
//     operation is being enqueued or initialised); callers poll ncclCommGetAsyncError.
//   SPECNODE_NCCL_STATUS(expr): the same check as an absl::Status value.
//
// Compiled only in CUDA builds (SPECNODE_HAVE_NCCL). The message format is stable.
#pragma once

#include <nccl.h>

#include "absl/status/status.h"

namespace specnode::nccl_internal {

// Builds InternalError("<file>:<line>: <expr> failed: <reason> (ncclResult N)").
absl::Status NcclErrorToStatus(ncclResult_t result, const char* expr, const char* file, int line);

inline absl::Status NcclStatus(ncclResult_t result, const char* expr, const char* file, int line) {
  if (result == ncclSuccess || result == ncclInProgress) return absl::OkStatus();
  return NcclErrorToStatus(result, expr, file, line);
}

}  // namespace specnode::nccl_internal

#define SPECNODE_NCCL_STATUS(expr) \
  ::specnode::nccl_internal::NcclStatus((expr), #expr, __FILE__, __LINE__)

#define SPECNODE_NCCL_RETURN_IF_ERROR(expr)                                                       \
  do {                                                                                            \
    const ncclResult_t specnode_nccl_result_ = (expr);                                            \
    if (specnode_nccl_result_ != ncclSuccess && specnode_nccl_result_ != ncclInProgress) {        \
      return ::specnode::nccl_internal::NcclErrorToStatus(specnode_nccl_result_, #expr, __FILE__, \
                                                          __LINE__);                              \
    }                                                                                             \
  } while (0)
