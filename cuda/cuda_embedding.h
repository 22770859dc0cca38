// Embedding rows on the GPU: row ids[i] of the token-embedding matrix, dequantised from
// its GGUF type, for the pass's first op. (KV writes and attention are the page pool's:
// cuda_page_pool.h, cuda_kv_kernels.h.)
//
// Every pointer is a DEVICE pointer; the launch is asynchronous on `stream`; arguments are
// validated before any CUDA call (InvalidArgument), launch failures are Internal with
// file:line (cuda_check.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "model/gguf/weight_view.h"

namespace specnode {

// out[i] = row ids[i] of the embedding matrix `w` (any supported type), dequantised.
// ids: [n] int32 (checked by the caller against w.rows); out: [n, w.cols] f32.
absl::Status CudaEmbeddingRows(const WeightView& w, const int32_t* ids, int64_t n, float* out,
                               cudaStream_t stream = nullptr);

}  // namespace specnode
