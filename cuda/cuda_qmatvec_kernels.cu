// The quantised-activation matmul (see cuda_qmatvec_kernels.h for the work layout, q16_dot.h
// for the arithmetic and q16_order.h for the order of its float terms).
//
// Why staging through shared memory: GGUF blocks are 18 (Q4_0), 20 (Q4_1) or 34 (Q8_0) bytes,
// so a lane reading its own blocks gets 2- or 4-byte loads, and a decode step of small
// matrices keeps too few bytes in flight to approach DRAM bandwidth (measured on an H200:
// the per-row-warp kernel reached 48 GB/s at SmolLM2's shapes, 491 GB/s at 8B's). Here a
// thread block copies R rows x (4 G blocks) as 16-byte vectors, every load issued before
// the first is used, and several thread blocks per SM keep tens of KB in flight each.
#include <cuda_fp16.h>

#include "cuda/cuda_qmatvec_kernels.h"
#include "cuda/q16_dot.h"
#include "cuda/q16_kquant.h"
#include "cuda/q16_order.h"
#include "cuda/q16_stage.h"
#include "model/gguf/ggml_converted_types.h"

namespace specnode::cuda_internal {
namespace {

constexpr int kThreads = q16::kStageThreads;
// Thread blocks an SM must hold at once (caps registers at 65536 / (128 * 6) = 85): with
// 10-29 KB staged each, 6 keep 60-170 KB of weights in flight per SM, above the ~30 KB
// Little's law asks of HBM3e (../shared/GPU.md).
constexpr int kMinBlocksPerSm = 6;
constexpr int kTile = kQ16TokenTile;

using Segments = SegmentTable;  // cuda_matmul_kernels.h

struct Slab {
  const uint8_t* w;
  size_t row_stride;
  int64_t rows;
  float* y;
  int64_t row0;  // the thread block's first row
};

__device__ __forceinline__ Slab SelectSlab(const Segments& s, int rows_per_block) {
  const SegmentPick p = PickSegment(s);
  return Slab{p.w, p.row_stride, p.rows, p.y, static_cast<int64_t>(p.block) * rows_per_block};
}

// A quantised weight type (kType: GgmlType's value): one range of the canonical order
// (q16_order.h) a lane per stage, so a lane's partial is that range's p.
template <int kTypeValue>
struct Quant {
  static constexpr int kType = kTypeValue;
  static constexpr bool kPlain = false;
  static constexpr int kValues = q16::BlockValues(kType);  // values per block
  static constexpr int kBytes = q16::BlockBytes(kType);
  static constexpr int kPerLane = q16::RangeValues(kType) / kValues;  // blocks a lane per stage
  static constexpr int kSub = q16::SubBlocksPerBlock(kType);
};
using Q4_0 = Quant<q16::kTypeQ4_0>;
using Q4_1 = Quant<q16::kTypeQ4_1>;
using Q8_0 = Quant<q16::kTypeQ8_0>;
using Q4_K = Quant<q16::kTypeQ4_K>;
using Q5_K = Quant<q16::kTypeQ5_K>;
using Q6_K = Quant<q16::kTypeQ6_K>;

// F16 / BF16 rows, staged the same way, multiplied by f32 activations (CudaMatMulAlgo::
// kStaged): a "block" is 32 values (64 bytes), read from the stage as 16-bit words (rows
// keep only 2-byte alignment).
template <bool kBf16>
struct Plain16 {
  static constexpr int kBytes = 64;
  static constexpr int kValues = 32;
  static constexpr int kPerLane = 2;  // a 16 KB stage: 4 would spill registers
  static constexpr bool kPlain = true;
  __device__ static float ToFloat(unsigned short v) {
    return kBf16 ? __uint_as_float(static_cast<unsigned int>(v) << 16)
                 : __half2float(__ushort_as_half(v));
  }
};
using F16 = Plain16<false>;
using BF16 = Plain16<true>;

// The 16-byte units of one stage (q16_stage.h) and the loads per thread.
template <typename Q>
struct StageShape {
  static constexpr int kUnits = q16::StageUnits(Q::kPerLane, Q::kBytes);
  static constexpr int kSlots = (kUnits + kThreads - 1) / kThreads;
};

// Copies rows [row0, row0 + R) ∩ [0, rows), blocks [c0, c0 + cb) of each, into `stage` as
// q16_stage.h lays them out. All loads are issued before the first store.
template <typename Q>
__device__ __forceinline__ void StageRows(const Slab& slab, int rows_here, int64_t c0, int cb,
                                          int upr, uint8_t* stage) {
  uint4 v[StageShape<Q>::kSlots];
  const size_t chunk_off = static_cast<size_t>(c0) * Q::kBytes;
  const size_t chunk_bytes = static_cast<size_t>(cb) * Q::kBytes;
#pragma unroll
  for (int k = 0; k < StageShape<Q>::kSlots; ++k) {
    const int u = threadIdx.x + k * kThreads;
    int r, uu;
    q16::StageSlot(u, upr, &r, &uu);
    v[k] = make_uint4(0, 0, 0, 0);
    if (r < rows_here) {
      const uintptr_t start =
          reinterpret_cast<uintptr_t>(slab.w + (slab.row0 + r) * slab.row_stride + chunk_off);
      const uintptr_t base = start & ~uintptr_t{15};
      if (uu < q16::UnitsCovering(start, chunk_bytes)) {
        v[k] = __ldg(reinterpret_cast<const uint4*>(base) + uu);
      }
    }
  }
#pragma unroll
  for (int k = 0; k < StageShape<Q>::kSlots; ++k) {
    const int u = threadIdx.x + k * kThreads;
    if (u < rows_here * upr) reinterpret_cast<uint4*>(stage)[u] = v[k];
  }
}

// Sum over the G lanes of a row's group (aligned sub-warp; symmetric butterfly, so every
// lane ends with the same value).
__device__ __forceinline__ float GroupSum(float v, int lanes) {
  for (int offset = lanes >> 1; offset > 0; offset >>= 1) {
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  }
  return v;
}

// A lane's range of the staged chunk (blocks lane kPerLane .. + kPerLane, those below cb)
// dotted with the tile's tokens: p[t] is the range's partial of q16_order.h, from +0, its
// sub-blocks in order, each one's codes and factors read once for every token.
template <typename Q>
__device__ __forceinline__ void LaneRange(const uint8_t* srow, int lane, int cb, int64_t c0,
                                          int64_t cols, int64_t t0, int nt,
                                          const int16_t* __restrict__ xq,
                                          const float* __restrict__ xd,
                                          const float* __restrict__ xs, float (&p)[kTile]) {
  const int64_t n_sub = cols / q16::kBlock;
#pragma unroll
  for (int i = 0; i < Q::kPerLane; ++i) {
    const int b = lane * Q::kPerLane + i;
    if (b >= cb) break;
    const uint8_t* blk = srow + b * Q::kBytes;
    for (int j = 0; j < Q::kSub; ++j) {
      uint32_t cw[8];
      float f1, f2;
      q16::SubBlockCodes<Q::kType>(blk, j, cw, &f1, &f2);
      const int64_t sb = (c0 + b) * Q::kSub + j;
#pragma unroll
      for (int t = 0; t < kTile; ++t) {
        if (t < nt) {
          uint32_t xw[16];
          q16::LoadActWords(xq + (t0 + t) * cols + sb * q16::kBlock, xw);
          const int64_t di = (t0 + t) * n_sub + sb;
          p[t] = q16::SubBlockTerm<Q::kType>(cw, f1, f2, xw, __ldg(xd + di), __ldg(xs + di), p[t]);
        }
      }
    }
  }
}

// Adds the chunk's range partials of each token to its total in range order (q16_order.h):
// the group's lanes leave p in `fold` [kTile][kThreads], and lane t mod G, which owns token
// t's total, sums the group's first `ranges` entries one after the other. Every thread of
// the warp calls it (the group lies within the warp).
__device__ __forceinline__ void Fold(const float (&p)[kTile], int lane, int lanes, int ranges,
                                     int nt, float* fold, float (&total)[kTile]) {
#pragma unroll
  for (int t = 0; t < kTile; ++t) fold[t * kThreads + threadIdx.x] = p[t];
  __syncwarp();
  const int group0 = static_cast<int>(threadIdx.x) - lane;
#pragma unroll
  for (int t = 0; t < kTile; ++t) {
    if (t < nt && (t & (lanes - 1)) == lane) {
      for (int r = 0; r < ranges; ++r) total[t] = total[t] + fold[t * kThreads + group0 + r];
    }
  }
  __syncwarp();  // before the next chunk overwrites fold
}

// A lane's 16-bit blocks of the staged chunk dotted with the tile's f32 activations, value
// by value in order (fmaf), block by block.
template <typename Q>
__device__ __forceinline__ void PlainBlocks(const uint8_t* srow, int lane, int lanes, int cb,
                                            int64_t c0, int64_t cols, int64_t t0, int nt,
                                            const float* __restrict__ xf, float (&acc)[kTile]) {
#pragma unroll
  for (int i = 0; i < Q::kPerLane; ++i) {
    const int b = lane + i * lanes;
    if (b >= cb) break;
    const auto* wv = reinterpret_cast<const unsigned short*>(srow + b * Q::kBytes);
    float w[32];
#pragma unroll
    for (int k = 0; k < 32; ++k) w[k] = Q::ToFloat(wv[k]);
    const int64_t col = (c0 + b) * 32;
#pragma unroll
    for (int t = 0; t < kTile; ++t) {
      if (t < nt) {
        const float4* xv = reinterpret_cast<const float4*>(xf + (t0 + t) * cols + col);
        float a = acc[t];
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          const float4 q = __ldg(xv + k);
          a = fmaf(w[4 * k], q.x, a);
          a = fmaf(w[4 * k + 1], q.y, a);
          a = fmaf(w[4 * k + 2], q.z, a);
          a = fmaf(w[4 * k + 3], q.w, a);
        }
        acc[t] = a;
      }
    }
  }
}

// Thread block (blockIdx.x: a slab of rows; blockIdx.y: token tiles blockIdx.y *
// tiles_per_block + k). With tiles_per_block > 1 (a decode or verification pass whose rows
// fit one stage) the slab is staged once and every tile reuses it; otherwise each tile
// stages the row chunk by chunk. A token's arithmetic is the same either way.
template <typename Q>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    Q16MatVecKernel(const Segments segs, int64_t cols, int lanes_log2,
                    const int16_t* __restrict__ xq, const float* __restrict__ xd,
                    const float* __restrict__ xs, const float* __restrict__ xf, int64_t n,
                    int tiles_per_block) {
  __shared__ __align__(16) uint8_t stage[StageShape<Q>::kUnits * 16];
  __shared__ float fold[Q::kPlain ? 1 : kTile * kThreads];
  const int lanes = 1 << lanes_log2;
  const int rows_per_block = kThreads >> lanes_log2;
  const int local_row = threadIdx.x >> lanes_log2;
  const int lane = threadIdx.x & (lanes - 1);
  const Slab slab = SelectSlab(segs, rows_per_block);
  const int rows_here =
      static_cast<int>(min(static_cast<int64_t>(rows_per_block), slab.rows - slab.row0));
  const int64_t row = slab.row0 + local_row;
  const bool active = local_row < rows_here;
  const int64_t n_blocks = cols / Q::kValues;
  const int chunk = Q::kPerLane * lanes;
  const int upr = q16::UnitsPerRow(chunk, Q::kBytes);
  const bool one_chunk = n_blocks <= chunk;

  for (int tile = 0; tile < tiles_per_block; ++tile) {
    const int64_t t0 = (static_cast<int64_t>(blockIdx.y) * tiles_per_block + tile) * kTile;
    if (t0 >= n) break;  // block-uniform
    const int nt = static_cast<int>(min(static_cast<int64_t>(kTile), n - t0));
    // F16 / BF16: the lane's running sums; quantised: token t's total on lane t mod G.
    float acc[kTile];
#pragma unroll
    for (int t = 0; t < kTile; ++t) acc[t] = 0.0f;

    for (int64_t c0 = 0; c0 < n_blocks; c0 += chunk) {
      const int cb = static_cast<int>(min(static_cast<int64_t>(chunk), n_blocks - c0));
      if (!(one_chunk && tile > 0)) {  // else the row's only chunk is still staged
        StageRows<Q>(slab, rows_here, c0, cb, upr, stage);
        __syncthreads();
      }
      const uintptr_t start = reinterpret_cast<uintptr_t>(slab.w + row * slab.row_stride +
                                                          static_cast<size_t>(c0) * Q::kBytes);
      const uint8_t* srow = stage + q16::StagedRowOffset(local_row, upr, start);
      if constexpr (Q::kPlain) {
        if (active) PlainBlocks<Q>(srow, lane, lanes, cb, c0, cols, t0, nt, xf, acc);
      } else {
        float p[kTile];
#pragma unroll
        for (int t = 0; t < kTile; ++t) p[t] = 0.0f;
        if (active) LaneRange<Q>(srow, lane, cb, c0, cols, t0, nt, xq, xd, xs, p);
        Fold(p, lane, lanes, (cb + Q::kPerLane - 1) / Q::kPerLane, nt, fold, acc);
      }
      if (!one_chunk) __syncthreads();  // the stage is overwritten by the next chunk
    }
    if constexpr (Q::kPlain) {
      // Every thread takes part in the shuffles (inactive rows hold zeros).
#pragma unroll
      for (int t = 0; t < kTile; ++t) {
        if (t >= nt) break;  // block-uniform
        const float sum = GroupSum(acc[t], lanes);
        if (active && lane == 0) slab.y[(t0 + t) * slab.rows + row] = sum;
      }
    } else {
#pragma unroll
      for (int t = 0; t < kTile; ++t) {
        if (active && t < nt && (t & (lanes - 1)) == lane)
          slab.y[(t0 + t) * slab.rows + row] = acc[t];
      }
    }
  }
}

// One warp per 32-value block: lane j quantises value j; max and sum are exact, so the warp
// reductions give QuantizeBlock16's values.
__global__ void QuantizeActs16Kernel(const float* __restrict__ x, int64_t n_blocks_total,
                                     int16_t* __restrict__ qs, float* __restrict__ d,
                                     float* __restrict__ s) {
  const int64_t blk = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (blk >= n_blocks_total) return;  // whole warps leave together
  const int lane = threadIdx.x & 31;
  q16::WarpQuantizeBlock16(x[blk * 32 + lane], lane, qs + blk * 32, d + blk, s + blk);
}

// One launch's shape: lanes per row, its log2, the segment table and grid (token tiles
// spread over grid.y, or looped inside a block: tiles_per_block).
struct StagedLaunch {
  int lanes_log2 = 0;
  int tiles_per_block = 1;
  Segments segs{};
  dim3 grid;
};

StagedLaunch PlanLaunch(int per_lane, int64_t n_blocks, const FusedSegment* segments, int count,
                        int64_t n) {
  StagedLaunch l;
  const int lanes = Q16LanesPerRow(n_blocks, per_lane);
  while ((1 << l.lanes_log2) < lanes) ++l.lanes_log2;
  unsigned blocks = 0;
  l.segs = MakeSegmentTable(segments, count, kThreads / lanes, &blocks);
  // Decode and verification passes (n <= kQ16StagedTokens) over rows that fit one stage
  // reuse the staged rows for every token tile; larger passes spread tiles over blocks.
  const int64_t tiles = (n + kTile - 1) / kTile;
  const bool one_chunk = n_blocks <= per_lane * lanes;
  l.tiles_per_block = one_chunk && n <= kQ16StagedTokens ? static_cast<int>(tiles) : 1;
  l.grid = dim3(blocks, static_cast<unsigned>((tiles + l.tiles_per_block - 1) / l.tiles_per_block));
  return l;
}

template <typename Q>
void Launch(const StagedLaunch& l, int64_t cols, const Q16Acts* acts, const float* xf, int64_t n,
            cudaStream_t stream) {
  Q16MatVecKernel<Q><<<l.grid, kThreads, 0, stream>>>(
      l.segs, cols, l.lanes_log2, acts != nullptr ? acts->qs : nullptr,
      acts != nullptr ? acts->d : nullptr, acts != nullptr ? acts->s : nullptr, xf, n,
      l.tiles_per_block);
}

size_t Align16(size_t v) { return (v + 15) & ~size_t{15}; }

}  // namespace

int Q16LanesPerRow(int64_t blocks, int per_lane) {
  int lanes = 4;
  while (lanes < 32 && per_lane * lanes < blocks) lanes *= 2;
  return lanes;
}

bool Q16Runs(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1:
    case GgmlType::kQ8_0:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
      return true;
    default:
      return false;
  }
}

size_t Q16ActsBytes(int64_t n, int64_t cols) {
  const size_t values = static_cast<size_t>(n) * static_cast<size_t>(cols);
  const size_t blocks = values / 32;
  return Align16(values * sizeof(int16_t)) + 2 * Align16(blocks * sizeof(float));
}

Q16Acts Q16ActsAt(void* scratch, int64_t n, int64_t cols) {
  const size_t values = static_cast<size_t>(n) * static_cast<size_t>(cols);
  const size_t blocks = values / 32;
  auto* base = static_cast<uint8_t*>(scratch);
  const size_t d_off = Align16(values * sizeof(int16_t));
  const size_t s_off = d_off + Align16(blocks * sizeof(float));
  return Q16Acts{reinterpret_cast<int16_t*>(base), reinterpret_cast<float*>(base + d_off),
                 reinterpret_cast<float*>(base + s_off)};
}

cudaError_t LaunchQuantizeActs16(const float* x, int64_t n, int64_t cols, const Q16Acts& acts,
                                 cudaStream_t stream) {
  const int64_t blocks = n * (cols / 32);
  if (blocks <= 0) return cudaSuccess;
  constexpr int kWarps = 8;
  const int64_t grid = (blocks + kWarps - 1) / kWarps;
  if (grid > 0x7fffffff) return cudaErrorInvalidValue;
  QuantizeActs16Kernel<<<static_cast<unsigned>(grid), kWarps * 32, 0, stream>>>(x, blocks, acts.qs,
                                                                                acts.d, acts.s);
  return cudaGetLastError();
}

cudaError_t LaunchQ16MatVec(GgmlType type, const FusedSegment* segments, int count, int64_t cols,
                            const Q16Acts& acts, int64_t n, cudaStream_t stream) {
  if (count < 1 || count > kFusedMaxSegments || n < 1 || n > kQ16MaxTokens) {
    return cudaErrorInvalidValue;
  }
  const bool super = IsKQuantType(type);
  const StagedLaunch l =
      PlanLaunch(super ? 1 : 4, cols / (super ? 256 : 32), segments, count, n);  // kPerLane
  switch (type) {
    case GgmlType::kQ4_0:
      Launch<Q4_0>(l, cols, &acts, nullptr, n, stream);
      break;
    case GgmlType::kQ4_1:
      Launch<Q4_1>(l, cols, &acts, nullptr, n, stream);
      break;
    case GgmlType::kQ8_0:
      Launch<Q8_0>(l, cols, &acts, nullptr, n, stream);
      break;
    case GgmlType::kQ4_K:
      Launch<Q4_K>(l, cols, &acts, nullptr, n, stream);
      break;
    case GgmlType::kQ5_K:
      Launch<Q5_K>(l, cols, &acts, nullptr, n, stream);
      break;
    case GgmlType::kQ6_K:
      Launch<Q6_K>(l, cols, &acts, nullptr, n, stream);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t LaunchStaged16(GgmlType type, const FusedSegment* segments, int count, int64_t cols,
                           const float* x, int64_t n, cudaStream_t stream) {
  if (count < 1 || count > kFusedMaxSegments || n < 1 || n > kQ16MaxTokens) {
    return cudaErrorInvalidValue;
  }
  const StagedLaunch l = PlanLaunch(F16::kPerLane, cols / 32, segments, count, n);
  switch (type) {
    case GgmlType::kF16:
      Launch<F16>(l, cols, nullptr, x, n, stream);
      break;
    case GgmlType::kBF16:
      Launch<BF16>(l, cols, nullptr, x, n, stream);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace specnode::cuda_internal
