// Fused dequantise-matmul kernels. Layout of the work (see cuda_matmul.h for the contract):
//   block = kFusedWarpsPerBlock warps, one output row per warp; grid.x spans the rows of up
//   to kFusedMaxSegments matrices sharing x (Q/K/V in one launch), each block in one matrix;
//   gridDim.y = groups of kFusedTokenTile tokens, each with its own accumulators.
// Quantised rows: the 4 lanes of a quad share one 32-value block, each lane taking 8 values
// (a 4-byte slice of the nibbles, or 8 int8s), so one warp pass covers 8 blocks = 256
// columns with contiguous 32-bit / 16-bit weight loads and two float4 x loads per token.
// Plain rows: lane j takes columns j, j + 32, ... (coalesced scalar loads).
// Every token's accumulator sees the same operations in the same order whatever n is, and
// the xor-butterfly reduction is symmetric (a + b == b + a), which is what makes the result
// batch-invariant.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/cuda_matmul_kernels.h"

namespace specnode::cuda_internal {
namespace {

constexpr int kTile = kFusedTokenTile;
constexpr int kThreads = kFusedWarpsPerBlock * 32;

using Segments = SegmentTable;

// This block's matrix: (w, row_stride, rows, y) and its row for this warp, by selects (no
// dynamic indexing of the parameter struct).
struct RowOf {
  const uint8_t* w;
  size_t row_stride;
  int64_t rows;
  float* y;
  int64_t row;
};
__device__ __forceinline__ RowOf SelectRow(const Segments& s) {
  const SegmentPick p = PickSegment(s);
  return RowOf{p.w, p.row_stride, p.rows, p.y,
               static_cast<int64_t>(p.block) * kFusedWarpsPerBlock + threadIdx.x / 32};
}

__device__ __forceinline__ float HalfAt(const uint8_t* p) {
  return __half2float(__ushort_as_half(*reinterpret_cast<const unsigned short*>(p)));
}

// Each Quant type: kBytes per 32-value block, and Load(block, sub, q, d, m) which returns
// the 8 integer levels of quad lane `sub` (0..3) as floats in q, with the scale d and the
// offset m (0 for symmetric types), plus where those 8 values sit in the block: values
// q[0..3] at columns x0(sub)..+3 and q[4..7] at x1(sub)..+3.
struct Q4_0 {
  static constexpr int kBytes = 18;  // f16 d; u8 qs[16]
  static constexpr bool kHasMin = false;
  __device__ static int X0(int sub) { return 4 * sub; }
  __device__ static int X1(int sub) { return 16 + 4 * sub; }
  __device__ static void Load(const uint8_t* blk, int sub, float q[8], float& d, float& m) {
    d = HalfAt(blk);
    m = 0.0f;
    // qs starts at byte 2 of an 18-byte block: only 2-byte alignment is guaranteed.
    const auto* qs = reinterpret_cast<const unsigned short*>(blk + 2 + 4 * sub);
    const uint32_t packed = static_cast<uint32_t>(qs[0]) | (static_cast<uint32_t>(qs[1]) << 16);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      q[k] = static_cast<float>(static_cast<int>((packed >> (8 * k)) & 15u) - 8);
      q[4 + k] = static_cast<float>(static_cast<int>((packed >> (8 * k + 4)) & 15u) - 8);
    }
  }
};

struct Q4_1 {
  static constexpr int kBytes = 20;  // f16 d; f16 m; u8 qs[16]
  static constexpr bool kHasMin = true;
  __device__ static int X0(int sub) { return 4 * sub; }
  __device__ static int X1(int sub) { return 16 + 4 * sub; }
  __device__ static void Load(const uint8_t* blk, int sub, float q[8], float& d, float& m) {
    d = HalfAt(blk);
    m = HalfAt(blk + 2);
    // 20-byte blocks keep qs 4-byte aligned (data and row_stride are checked to be).
    const uint32_t packed = *reinterpret_cast<const uint32_t*>(blk + 4 + 4 * sub);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      q[k] = static_cast<float>((packed >> (8 * k)) & 15u);
      q[4 + k] = static_cast<float>((packed >> (8 * k + 4)) & 15u);
    }
  }
};

struct Q8_0 {
  static constexpr int kBytes = 34;  // f16 d; i8 qs[32]
  static constexpr bool kHasMin = false;
  __device__ static int X0(int sub) { return 8 * sub; }
  __device__ static int X1(int sub) { return 8 * sub + 4; }
  __device__ static void Load(const uint8_t* blk, int sub, float q[8], float& d, float& m) {
    d = HalfAt(blk);
    m = 0.0f;
    const auto* qs = reinterpret_cast<const unsigned short*>(blk + 2 + 8 * sub);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const unsigned short pair = qs[k];
      q[2 * k] = static_cast<float>(static_cast<int8_t>(pair & 0xff));
      q[2 * k + 1] = static_cast<float>(static_cast<int8_t>(pair >> 8));
    }
  }
};

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Writes acc[t] of every valid token of the tile; lane t stores token t (no dynamic
// indexing of acc, which would push it to local memory).
__device__ __forceinline__ void StoreTile(float (&acc)[kTile], int lane, int nt, int64_t t0,
                                          int64_t rows, int64_t row, float* y) {
#pragma unroll
  for (int t = 0; t < kTile; ++t) {
    if (t >= nt) break;  // warp-uniform: a short tile (decode) skips the idle reductions
    const float sum = WarpSum(acc[t]);
    if (lane == t) y[(t0 + t) * rows + row] = sum;
  }
}

template <typename Quant>
__global__ void __launch_bounds__(kThreads)
    FusedQuantKernel(const Segments segs, int64_t cols, const float* __restrict__ x, int64_t n) {
  const int lane = threadIdx.x & 31;
  const RowOf sel = SelectRow(segs);
  if (sel.row >= sel.rows) return;  // whole warp leaves together
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const int nt = static_cast<int>(min(static_cast<int64_t>(kTile), n - t0));
  const uint8_t* wrow = sel.w + sel.row * sel.row_stride;
  const float* xtile = x + t0 * cols;
  const int sub = lane & 3;
  const int x0 = Quant::X0(sub);
  const int x1 = Quant::X1(sub);

  float acc[kTile];
#pragma unroll
  for (int t = 0; t < kTile; ++t) acc[t] = 0.0f;

  const int64_t n_blocks = cols / 32;
  // Unrolled so that the weight loads of several passes are in flight at once (a decode
  // matmul is a few dependent passes of DRAM latency otherwise); the per-token order of
  // accumulation is unchanged.
#pragma unroll 4
  for (int64_t b = lane >> 2; b < n_blocks; b += 8) {
    float q[8], d, m;
    Quant::Load(wrow + b * Quant::kBytes, sub, q, d, m);
#pragma unroll
    for (int t = 0; t < kTile; ++t) {
      if (t < nt) {
        const float* xb = xtile + t * cols + b * 32;
        const float4 a = __ldg(reinterpret_cast<const float4*>(xb + x0));
        const float4 c = __ldg(reinterpret_cast<const float4*>(xb + x1));
        float s = q[0] * a.x;
        s = fmaf(q[1], a.y, s);
        s = fmaf(q[2], a.z, s);
        s = fmaf(q[3], a.w, s);
        s = fmaf(q[4], c.x, s);
        s = fmaf(q[5], c.y, s);
        s = fmaf(q[6], c.z, s);
        s = fmaf(q[7], c.w, s);
        float r = fmaf(d, s, acc[t]);
        if constexpr (Quant::kHasMin) {
          // Σ (d q + m) x = d Σ q x + m Σ x
          const float sx = ((a.x + a.y) + (a.z + a.w)) + ((c.x + c.y) + (c.z + c.w));
          r = fmaf(m, sx, r);
        }
        acc[t] = r;
      }
    }
  }
  StoreTile(acc, lane, nt, t0, sel.rows, sel.row, sel.y);
}

// Plain element types: ToFloat(bits) converts one element.
struct F32 {
  using Bits = float;
  __device__ static float ToFloat(float v) { return v; }
};
struct F16 {
  using Bits = unsigned short;
  __device__ static float ToFloat(unsigned short v) { return __half2float(__ushort_as_half(v)); }
};
struct BF16 {
  using Bits = unsigned short;
  __device__ static float ToFloat(unsigned short v) {
    return __uint_as_float(static_cast<unsigned int>(v) << 16);
  }
};

template <typename Plain>
__global__ void __launch_bounds__(kThreads)
    FusedPlainKernel(const Segments segs, int64_t cols, const float* __restrict__ x, int64_t n) {
  const int lane = threadIdx.x & 31;
  const RowOf sel = SelectRow(segs);
  if (sel.row >= sel.rows) return;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const int nt = static_cast<int>(min(static_cast<int64_t>(kTile), n - t0));
  const auto* wrow =
      reinterpret_cast<const typename Plain::Bits*>(sel.w + sel.row * sel.row_stride);
  const float* xtile = x + t0 * cols;

  float acc[kTile];
#pragma unroll
  for (int t = 0; t < kTile; ++t) acc[t] = 0.0f;

  for (int64_t j = lane; j < cols; j += 32) {
    const float wv = Plain::ToFloat(wrow[j]);
#pragma unroll
    for (int t = 0; t < kTile; ++t) {
      if (t < nt) acc[t] = fmaf(wv, __ldg(xtile + t * cols + j), acc[t]);
    }
  }
  StoreTile(acc, lane, nt, t0, sel.rows, sel.row, sel.y);
}

__global__ void ConvertToF16Kernel(const float* __restrict__ src, __half* __restrict__ dst,
                                   int64_t count) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = __float2half_rn(src[i]);
  }
}

__global__ void ConvertToBf16Kernel(const float* __restrict__ src, __nv_bfloat16* __restrict__ dst,
                                    int64_t count) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = __float2bfloat16_rn(src[i]);
  }
}

}  // namespace

SegmentTable MakeSegmentTable(const FusedSegment* segments, int count, int rows_per_block,
                              unsigned* blocks) {
  SegmentTable t{};
  unsigned first = 0;
  for (int i = 0; i < count; ++i) {
    t.w[i] = static_cast<const uint8_t*>(segments[i].w);
    t.row_stride[i] = segments[i].row_stride;
    t.rows[i] = segments[i].rows;
    t.y[i] = segments[i].y;
    t.first_block[i] = first;
    first += static_cast<unsigned>((segments[i].rows + rows_per_block - 1) / rows_per_block);
  }
  t.count = count;
  *blocks = first;
  return t;
}

cudaError_t LaunchFusedMatMulSegments(GgmlType type, const FusedSegment* segments, int count,
                                      int64_t cols, const float* x, int64_t n,
                                      cudaStream_t stream) {
  if (count < 1 || count > kFusedMaxSegments) return cudaErrorInvalidValue;
  unsigned blocks = 0;
  const Segments segs = MakeSegmentTable(segments, count, kFusedWarpsPerBlock, &blocks);
  const dim3 grid(blocks, static_cast<unsigned>((n + kTile - 1) / kTile));
  const dim3 block(kThreads);
  switch (type) {
    case GgmlType::kQ4_0:
      FusedQuantKernel<Q4_0><<<grid, block, 0, stream>>>(segs, cols, x, n);
      break;
    case GgmlType::kQ4_1:
      FusedQuantKernel<Q4_1><<<grid, block, 0, stream>>>(segs, cols, x, n);
      break;
    case GgmlType::kQ8_0:
      FusedQuantKernel<Q8_0><<<grid, block, 0, stream>>>(segs, cols, x, n);
      break;
    case GgmlType::kF32:
      FusedPlainKernel<F32><<<grid, block, 0, stream>>>(segs, cols, x, n);
      break;
    case GgmlType::kF16:
      FusedPlainKernel<F16><<<grid, block, 0, stream>>>(segs, cols, x, n);
      break;
    case GgmlType::kBF16:
      FusedPlainKernel<BF16><<<grid, block, 0, stream>>>(segs, cols, x, n);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t LaunchFusedMatMul(GgmlType type, const void* w, size_t row_stride, int64_t rows,
                              int64_t cols, const float* x, int64_t n, float* y,
                              cudaStream_t stream) {
  const FusedSegment one{w, row_stride, rows, y};
  return LaunchFusedMatMulSegments(type, &one, 1, cols, x, n, stream);
}

cudaError_t LaunchConvertFromF32(const float* src, void* dst, int64_t count, GgmlType dst_type,
                                 cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  constexpr int kBlock = 256;
  const int64_t blocks = (count + kBlock - 1) / kBlock;
  const unsigned grid = static_cast<unsigned>(blocks < 65535 ? blocks : 65535);
  switch (dst_type) {
    case GgmlType::kF16:
      ConvertToF16Kernel<<<grid, kBlock, 0, stream>>>(src, static_cast<__half*>(dst), count);
      break;
    case GgmlType::kBF16:
      ConvertToBf16Kernel<<<grid, kBlock, 0, stream>>>(src, static_cast<__nv_bfloat16*>(dst),
                                                       count);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace specnode::cuda_internal
