// Internal to cuda/: launchers for the quantised-activation matmul (cuda_qmatvec_kernels.cu),
// CudaMatMulAlgo::kQuantAct in cuda_matmul.h. Arguments are validated by CudaMatMul; these
// only launch and return cudaGetLastError(). Kept free of absl so nvcc sees a small header.
//
// Two kernels per product:
//   1. QuantizeActs16: x [n, cols] f32 -> int16 blocks (q16_dot.h: the CPU's default
//      activation rounding), one warp per 32-value block;
//   2. Q16MatVec: y [n, rows] = Σ over blocks of the weight block's integer dot with the
//      activation block (q16_dot.h), for Q4_0, Q4_1 and Q8_0 weights in their GGUF layout,
//      and for Q4_K, Q5_K and Q6_K super-blocks in theirs with the CPU's K-quant arithmetic
//      (q16_kquant.h: each 32-value sub-block's codes against its activation block).
//      Each thread block stages a slab of weight rows into shared memory with 16-byte loads
//      (whatever the 18/20/34-byte block layout: rows are copied as byte ranges, aligned down
//      to 16 bytes), then a group of G lanes dots each row, G from the row length only: lane
//      l takes range l of the stage's chunk (q16_order.h: 128 values, or one K-quant
//      super-block), and the owner of each token adds the ranges' partials in order. A
//      (row, token) result is thus the canonical order of q16_order.h whatever n, the token
//      tile or the rows per thread block — the same bits as the tensor-core kernel of larger
//      passes (cuda_mma_kernels.h) — which keeps it batch-invariant. F16 / BF16 rows
//      (LaunchStaged16) keep a lane per strided block and a butterfly sum.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "cuda/cuda_matmul_kernels.h"
#include "model/gguf/ggml_types.h"

namespace specnode::cuda_internal {

// Tokens per pass over the staged weights (each further tile re-reads W).
inline constexpr int kQ16TokenTile = 8;
// Largest n one launch handles (gridDim.y <= 65535).
inline constexpr int64_t kQ16MaxTokens = int64_t{65535} * kQ16TokenTile;
// Passes of up to this many tokens whose rows fit one stage (cols <= 4096) stage the weights
// once for all their token tiles (a verification pass of K = 8 is 2 tiles).
inline constexpr int64_t kQ16StagedTokens = 32;

// Where one call's quantised activations live (device pointers): qs [n, cols] int16,
// d and s [n, cols / 32] f32. qs 16-byte aligned (rows of x are read as 16-byte vectors).
struct Q16Acts {
  int16_t* qs;
  float* d;
  float* s;
};

// Bytes of scratch Q16Acts needs for n tokens of `cols` (qs, then d and s, each 16-byte
// aligned from a 16-byte aligned base); Q16ActsAt lays them out in that scratch.
size_t Q16ActsBytes(int64_t n, int64_t cols);
Q16Acts Q16ActsAt(void* scratch, int64_t n, int64_t cols);

// acts = x [n, cols] rounded to int16 blocks; cols a multiple of 32.
cudaError_t LaunchQuantizeActs16(const float* x, int64_t n, int64_t cols, const Q16Acts& acts,
                                 cudaStream_t stream);

// segments[i].y [n, rows_i] = acts · W_iᵀ for 1..kFusedMaxSegments matrices of `type`
// (Q16Runs) sharing the activations, in one launch; cols a multiple of the type's block.
cudaError_t LaunchQ16MatVec(GgmlType type, const FusedSegment* segments, int count, int64_t cols,
                            const Q16Acts& acts, int64_t n, cudaStream_t stream);

// segments[i].y [n, rows_i] = x · W_iᵀ for F16 / BF16 matrices (CudaMatMulAlgo::kStaged):
// the same staging, with f32 activations x [n, cols] (16-byte aligned; cols a multiple of
// 32), each row's values summed by fmaf in order within a lane's blocks.
cudaError_t LaunchStaged16(GgmlType type, const FusedSegment* segments, int count, int64_t cols,
                           const float* x, int64_t n, cudaStream_t stream);

// Lanes that dot one row (4, 8, 16 or 32) for rows of `blocks` blocks (32 values; 256 for
// the K-quants), `per_lane` blocks a lane per stage (4; 1 for the K-quants): the fewest that
// cover the row in one stage, at most 32. Fixed by the row length alone.
int Q16LanesPerRow(int64_t blocks, int per_lane);

// Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K: the weight types LaunchQ16MatVec takes.
bool Q16Runs(GgmlType type);

}  // namespace specnode::cuda_internal
