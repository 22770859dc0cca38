// Internal to cuda/: the tensor-core form of CudaMatMulAlgo::kQuantAct (cuda_matmul.h) for
// passes of kQ16MmaMinTokens tokens or more (prefill, large verification trees, batch decode
// at high occupancy). Weights in their GGUF layout (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K) times
// the int16 activation blocks of LaunchQuantizeActs16 (cuda_qmatvec_kernels.h), on int8
// mma.sync (sm_80 and newer; q16_mma.h), with the float terms added in the canonical order of
// q16_order.h: every (row, token) result is the same bits as the dp2a kernel's
// (LaunchQ16MatVec), so a pass's results do not depend on which kernel its size picked.
// Arguments are validated by CudaMatMul; this only launches and returns cudaGetLastError().
// Kept free of absl so nvcc sees a small header.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/cuda_matmul_kernels.h"
#include "cuda/cuda_qmatvec_kernels.h"
#include "model/gguf/ggml_types.h"

namespace specnode::cuda_internal {

// Passes of at least this many tokens run on tensor cores when the context allows
// (CudaMatMulContext::tensor_cores); fewer stay on the dp2a kernel, whose weight reads are
// shared by at most 8 tokens a tile but which keeps more bytes in flight per token.
inline constexpr int64_t kQ16MmaMinTokens = 32;

// segments[i].y [n, rows_i] = acts · W_iᵀ for 1..kFusedMaxSegments matrices of `type`
// (Q16Runs) sharing the activations, in one launch; cols a multiple of the type's block;
// 1 <= n <= kQ16MaxTokens. Thread block: 64 tokens x 64 rows of one segment.
cudaError_t LaunchQ16Mma(GgmlType type, const FusedSegment* segments, int count, int64_t cols,
                         const Q16Acts& acts, int64_t n, cudaStream_t stream);

}  // namespace specnode::cuda_internal
