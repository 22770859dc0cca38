// The quantised-activation matmul (see cuda_qmatvec_kernels.h for the work layout and
// q16_dot.h for the arithmetic).
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

__device__ __forceinline__ float HalfAt(const uint8_t* p) {
  return __half2float(__ushort_as_half(*reinterpret_cast<const unsigned short*>(p)));
}

// Each weight type: kBytes per block, kWords quant words, Load(block in shared memory) ->
// quant words, scale d, min m; Dot(quant words, activation words) -> the integer sum.
struct Q4_0 {
  static constexpr bool kPlain = false;
  static constexpr int kValues = 32;  // values per block
  static constexpr int kPerLane = 4;  // blocks a lane dots per stage
  static constexpr bool kSuper = false;
  static constexpr int kBytes = 18;  // f16 d; u8 qs[16]
  static constexpr int kWords = 4;
  static constexpr bool kHasMin = false;
  __device__ static void Load(const uint8_t* blk, uint32_t* qw, float& d, float& m) {
    d = HalfAt(blk);
    m = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; ++k) qw[k] = q16::Load32(blk + 2 + 4 * k);  // 2-byte aligned
  }
  __device__ static int Dot(const uint32_t* qw, const uint32_t* xw) {
    return q16::DotQ4<8>(qw, xw);
  }
};

struct Q4_1 {
  static constexpr bool kPlain = false;
  static constexpr int kValues = 32;  // values per block
  static constexpr int kPerLane = 4;  // blocks a lane dots per stage
  static constexpr bool kSuper = false;
  static constexpr int kBytes = 20;  // f16 d; f16 m; u8 qs[16] (4-byte aligned)
  static constexpr int kWords = 4;
  static constexpr bool kHasMin = true;
  __device__ static void Load(const uint8_t* blk, uint32_t* qw, float& d, float& m) {
    d = HalfAt(blk);
    m = HalfAt(blk + 2);
#pragma unroll
    for (int k = 0; k < 4; ++k) qw[k] = *reinterpret_cast<const uint32_t*>(blk + 4 + 4 * k);
  }
  __device__ static int Dot(const uint32_t* qw, const uint32_t* xw) {
    return q16::DotQ4<0>(qw, xw);
  }
};

struct Q8_0 {
  static constexpr bool kPlain = false;
  static constexpr int kValues = 32;  // values per block
  static constexpr int kPerLane = 4;  // blocks a lane dots per stage
  static constexpr bool kSuper = false;
  static constexpr int kBytes = 34;  // f16 d; i8 qs[32]
  static constexpr int kWords = 8;
  static constexpr bool kHasMin = false;
  __device__ static void Load(const uint8_t* blk, uint32_t* qw, float& d, float& m) {
    d = HalfAt(blk);
    m = 0.0f;
#pragma unroll
    for (int k = 0; k < 8; ++k) qw[k] = q16::Load32(blk + 2 + 4 * k);  // 2-byte aligned
  }
  __device__ static int Dot(const uint32_t* qw, const uint32_t* xw) { return q16::DotQ8(qw, xw); }
};

// The K-quants: 256-value super-blocks in the file's layout (q16_kquant.h), one a lane per
// stage; kType is GgmlType's value.
template <int kTypeValue, int kBlockBytes>
struct KQuant {
  static constexpr int kBytes = kBlockBytes;
  static constexpr int kValues = 256;
  static constexpr int kPerLane = 1;
  static constexpr bool kSuper = true;
  static constexpr bool kPlain = false;
  static constexpr bool kHasMin = false;
  static constexpr int kType = kTypeValue;
};
using Q4_K = KQuant<12, 144>;
using Q5_K = KQuant<13, 176>;
using Q6_K = KQuant<14, 210>;

// F16 / BF16 rows, staged the same way, multiplied by f32 activations (CudaMatMulAlgo::
// kStaged): a "block" is 32 values (64 bytes), read from the stage as 16-bit words (rows
// keep only 2-byte alignment).
template <bool kBf16>
struct Plain16 {
  static constexpr int kBytes = 64;
  static constexpr int kValues = 32;
  static constexpr int kPerLane = 2;  // a 16 KB stage: 4 would spill registers
  static constexpr bool kPlain = true;
  static constexpr bool kHasMin = false;
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

// One token's activation block (32 int16 values as 16 words), 4 vector loads.
__device__ __forceinline__ void LoadActs(const int16_t* x, uint32_t (&xw)[16]) {
  const uint4* xv = reinterpret_cast<const uint4*>(x);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint4 q = __ldg(xv + k);
    xw[4 * k] = q.x;
    xw[4 * k + 1] = q.y;
    xw[4 * k + 2] = q.z;
    xw[4 * k + 3] = q.w;
  }
}

// A lane's 32-value blocks of the staged chunk (lane, lane + G, ...) dotted with the tile's
// tokens, block by block in order.
template <typename Q>
__device__ __forceinline__ void Blocks(const uint8_t* srow, int lane, int lanes, int cb, int64_t c0,
                                       int64_t cols, int64_t t0, int nt,
                                       const int16_t* __restrict__ xq, const float* __restrict__ xd,
                                       const float* __restrict__ xs, float (&acc)[kTile],
                                       float (&acc_min)[kTile]) {
  const int64_t n_blocks = cols / 32;
#pragma unroll
  for (int i = 0; i < Q::kPerLane; ++i) {
    const int b = lane + i * lanes;
    if (b >= cb) break;
    uint32_t qw[Q::kWords];
    float dw, mw;
    Q::Load(srow + b * Q::kBytes, qw, dw, mw);
    const int64_t blk = c0 + b;
#pragma unroll
    for (int t = 0; t < kTile; ++t) {
      if (t < nt) {
        uint32_t xw[16];
        LoadActs(xq + (t0 + t) * cols + blk * 32, xw);
        const int isum = Q::Dot(qw, xw);
        const int64_t di = (t0 + t) * n_blocks + blk;
        // As the CPU's RowDot: the integer sum times d_w d_b; Q4_1's m_w s_b apart.
        acc[t] = fmaf(static_cast<float>(isum), dw * __ldg(xd + di), acc[t]);
        if constexpr (Q::kHasMin) acc_min[t] = fmaf(mw, __ldg(xs + di), acc_min[t]);
      }
    }
  }
}

// A lane's K-quant super-block of the staged chunk: its 8 sub-blocks in order, each one's
// codes and factors read once for every token of the tile (q16_kquant.h).
template <typename Q>
__device__ __forceinline__ void SuperBlocks(const uint8_t* srow, int lane, int lanes, int cb,
                                            int64_t c0, int64_t cols, int64_t t0, int nt,
                                            const int16_t* __restrict__ xq,
                                            const float* __restrict__ xd,
                                            const float* __restrict__ xs, float (&acc)[kTile]) {
  const int64_t n_blocks = cols / 32;
  if (lane >= cb) return;
  const uint8_t* blk = srow + lane * Q::kBytes;
  const int64_t first = (c0 + lane) * q16::kSubBlocks;  // its first 32-value block
  for (int j = 0; j < q16::kSubBlocks; ++j) {
    uint32_t cw[8];
    float f1, f2;
    q16::KSubBlockCodes<Q::kType>(blk, j, cw, &f1, &f2);
#pragma unroll
    for (int t = 0; t < kTile; ++t) {
      if (t < nt) {
        uint32_t xw[16];
        LoadActs(xq + (t0 + t) * cols + (first + j) * 32, xw);
        const int64_t di = (t0 + t) * n_blocks + first + j;
        acc[t] =
            q16::KSubBlockApply<Q::kType>(cw, f1, f2, xw, __ldg(xd + di), __ldg(xs + di), acc[t]);
      }
    }
  }
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
    float acc[kTile], acc_min[kTile];
#pragma unroll
    for (int t = 0; t < kTile; ++t) acc[t] = acc_min[t] = 0.0f;

    for (int64_t c0 = 0; c0 < n_blocks; c0 += chunk) {
      const int cb = static_cast<int>(min(static_cast<int64_t>(chunk), n_blocks - c0));
      if (!(one_chunk && tile > 0)) {  // else the row's only chunk is still staged
        StageRows<Q>(slab, rows_here, c0, cb, upr, stage);
        __syncthreads();
      }
      if (active) {
        const uintptr_t start = reinterpret_cast<uintptr_t>(slab.w + row * slab.row_stride +
                                                            static_cast<size_t>(c0) * Q::kBytes);
        const uint8_t* srow = stage + q16::StagedRowOffset(local_row, upr, start);
        if constexpr (Q::kPlain) {
          PlainBlocks<Q>(srow, lane, lanes, cb, c0, cols, t0, nt, xf, acc);
        } else if constexpr (Q::kSuper) {
          SuperBlocks<Q>(srow, lane, lanes, cb, c0, cols, t0, nt, xq, xd, xs, acc);
        } else {
          Blocks<Q>(srow, lane, lanes, cb, c0, cols, t0, nt, xq, xd, xs, acc, acc_min);
        }
      }
      if (!one_chunk) __syncthreads();  // the stage is overwritten by the next chunk
    }
    // Every thread takes part in the shuffles (inactive rows hold zeros).
#pragma unroll
    for (int t = 0; t < kTile; ++t) {
      if (t >= nt) break;  // block-uniform
      float sum = GroupSum(acc[t], lanes);
      if constexpr (Q::kHasMin) sum += GroupSum(acc_min[t], lanes);
      if (active && lane == 0) slab.y[(t0 + t) * slab.rows + row] = sum;
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
