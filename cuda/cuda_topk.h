// The top-k head on the device: each row's k largest logits in TopK's order
// (model/llama/sampling.h), so a sampled step moves rows * k pairs instead of the rows
// (CudaBackend::FinishTopK). Thread-safety: stream-ordered like every kernel launch.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace specnode {

// The largest k a launch takes (the candidates are sorted in shared memory); a larger k is
// the host's (Backend::FinishTopK's default).
constexpr int kCudaTopKMax = 1024;

// x: [n, cols] finite or not; ids, values: [n, k] (row r's at r * k). Row r's k largest in
// TopK's order, values copied from x (a -0 stays -0), or ids[r * k] = -1 when the row holds
// a NaN or an infinity (the rest of that row unspecified). One block of 1024 threads per
// row: a radix select of the k-th largest key (cuda/topk_order.h), one sweep collecting the
// larger entries and the lowest-id equal ones, a bitonic sort of the k. InvalidArgument for
// k outside [1, min(cols, kCudaTopKMax)] or a bad shape.
absl::Status CudaTopKRows(const float* x, int64_t n, int64_t cols, int k, int32_t* ids,
                          float* values, cudaStream_t stream = nullptr);

}  // namespace specnode
