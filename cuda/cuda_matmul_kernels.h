// Internal to cuda/: launchers for the matmul kernels in cuda_matmul_kernels.cu. The
// arguments are already validated by CudaMatMul (cuda_matmul.cc); these only launch and
// return cudaGetLastError(). Kept free of absl and model/ so nvcc sees a small header.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "model/gguf/ggml_types.h"

namespace specnode::cuda_internal {

// Tokens processed per kernel pass: each group of this many tokens re-reads W.
inline constexpr int kFusedTokenTile = 8;
// Output rows per thread block (one warp each).
inline constexpr int kFusedWarpsPerBlock = 4;
// Largest n one launch handles (gridDim.y <= 65535).
inline constexpr int64_t kFusedMaxTokens = int64_t{65535} * kFusedTokenTile;

// Matrices one launch multiplies by the same x (Q/K/V, gate/up).
inline constexpr int kFusedMaxSegments = 3;

// One matrix of a launch: rows of `cols` values of the launch's type, `row_stride` bytes
// apart, and its output y [n, rows]. Device pointers; rows >= 1.
struct FusedSegment {
  const void* w;
  size_t row_stride;
  int64_t rows;
  float* y;
};

// A launch's matrices as a kernel parameter (by value): thread block b of grid.x belongs to
// the last segment whose first_block <= b. Shared by the fused and the quantised-activation
// kernels (cuda_qmatvec_kernels.cu).
struct SegmentTable {
  const uint8_t* w[kFusedMaxSegments];
  size_t row_stride[kFusedMaxSegments];
  int64_t rows[kFusedMaxSegments];
  float* y[kFusedMaxSegments];
  unsigned first_block[kFusedMaxSegments];
  int count;
};

#if defined(__CUDACC__)
// This thread block's segment, the last whose first_block <= blockIdx.x, picked by selects
// (indexing the parameter's arrays with a run-time value would copy them to local memory
// in every thread), and the block's index within it.
struct SegmentPick {
  const uint8_t* w;
  size_t row_stride;
  int64_t rows;
  float* y;
  unsigned block;
};
__device__ __forceinline__ SegmentPick PickSegment(const SegmentTable& s) {
  SegmentPick p{s.w[0], s.row_stride[0], s.rows[0], s.y[0], 0};
  unsigned first = 0;
#pragma unroll
  for (int i = 1; i < kFusedMaxSegments; ++i) {
    if (i < s.count && blockIdx.x >= s.first_block[i]) {
      p = SegmentPick{s.w[i], s.row_stride[i], s.rows[i], s.y[i], 0};
      first = s.first_block[i];
    }
  }
  p.block = blockIdx.x - first;
  return p;
}
#endif

// The table of segments[0, count) (1..kFusedMaxSegments) with `rows_per_block` output rows
// per thread block; *blocks: the thread blocks they take (grid.x).
SegmentTable MakeSegmentTable(const FusedSegment* segments, int count, int rows_per_block,
                              unsigned* blocks);

// y[n, rows] = x[n, cols] · Wᵀ; w: rows of `cols` values of `type`, `row_stride` bytes
// apart; x: [n, cols]; y: [n, rows]. All device pointers; n >= 1, rows >= 1.
cudaError_t LaunchFusedMatMul(GgmlType type, const void* w, size_t row_stride, int64_t rows,
                              int64_t cols, const float* x, int64_t n, float* y,
                              cudaStream_t stream);

// The same for 1..kFusedMaxSegments matrices of one type sharing x, in one launch; each
// output row is computed exactly as LaunchFusedMatMul computes it.
cudaError_t LaunchFusedMatMulSegments(GgmlType type, const FusedSegment* segments, int count,
                                      int64_t cols, const float* x, int64_t n, cudaStream_t stream);

// dst[count] = src[count] rounded to nearest even in `dst_type` (kF16 or kBF16).
cudaError_t LaunchConvertFromF32(const float* src, void* dst, int64_t count, GgmlType dst_type,
                                 cudaStream_t stream);

}  // namespace specnode::cuda_internal
