// The tensor-core quantised-activation matmul (see cuda_mma_kernels.h; the staging, fragments
// and float terms are q16_mma.h's, shared with the host test that replays a thread block).
//
// Per stage of 128 values: every thread stages kMmaItems weight sub-blocks (codes decoded
// from the file's layout, as the dp2a kernel decodes them) and kMmaItems activation
// sub-blocks (split into hi and lo bytes), then each warp runs its 2 x 4 mma tiles over the
// stage's sub-blocks, adding each sub-block's terms to the range partials p, and p to the
// totals where a range of q16_order.h ends. One stage buffer: the weights are re-read by
// every 64-token tile, which at prefill sizes is compute-, not bandwidth-bound.
#include "cuda/cuda_mma_kernels.h"
#include "cuda/q16_mma.h"

namespace specnode::cuda_internal {
namespace {

using q16::kMmaRows;
using q16::kMmaThreads;
using q16::kMmaTokens;

// c += A · B for one 16 x 8 x 16 tile; A holds signed (hi) or unsigned (lo) bytes.
__device__ __forceinline__ void MmaHi(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t b) {
#if __CUDA_ARCH__ >= 800
  asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
      "{%0,%1,%2,%3};"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a0), "r"(a1), "r"(b));
#endif
}
__device__ __forceinline__ void MmaLo(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t b) {
#if __CUDA_ARCH__ >= 800
  asm("mma.sync.aligned.m16n8k16.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
      "{%0,%1,%2,%3};"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a0), "r"(a1), "r"(b));
#endif
}

// The warp's products over staged values k0 .. k0 + 15 (q16::WarpSubBlock's `mma`):
// fragments loaded from the stage as q16_mma.h places them, then 2 x 4 mma.
struct DeviceMma {
  const q16::MmaStage* st;
  int warp, lane;
  __device__ __forceinline__ void operator()(q16::MmaInts& c, int k0, bool lo) const {
    const uint8_t* a = lo ? st->lo : st->hi;
    uint32_t af[q16::kMmaTilesM][2], bf[q16::kMmaTilesN];
#pragma unroll
    for (int mt = 0; mt < q16::kMmaTilesM; ++mt) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        af[mt][i] = *reinterpret_cast<const uint32_t*>(
            a + q16::AFragOffset(lane, q16::WarpToken0(warp) + 16 * mt, k0, i));
      }
    }
#pragma unroll
    for (int nt = 0; nt < q16::kMmaTilesN; ++nt) {
      bf[nt] = *reinterpret_cast<const uint32_t*>(
          st->w + q16::BFragOffset(lane, q16::WarpRow0(warp) + 8 * nt, k0));
    }
#pragma unroll
    for (int mt = 0; mt < q16::kMmaTilesM; ++mt) {
#pragma unroll
      for (int nt = 0; nt < q16::kMmaTilesN; ++nt) {
        if (lo) {
          MmaLo(c[mt][nt], af[mt][0], af[mt][1], bf[nt]);
        } else {
          MmaHi(c[mt][nt], af[mt][0], af[mt][1], bf[nt]);
        }
      }
    }
  }
};

// This thread's items of the stage of sub-blocks sb0 .. sb0 + nsub - 1.
template <int kType>
__device__ __forceinline__ void StageTile(const SegmentPick& seg, int64_t row0, int64_t tok0,
                                          int64_t n, int64_t cols, const int16_t* __restrict__ xq,
                                          const float* __restrict__ xd,
                                          const float* __restrict__ xs, int64_t sb0, int nsub,
                                          q16::MmaStage* st) {
  const int64_t subs = cols / q16::kBlock;
#pragma unroll
  for (int k = 0; k < q16::kMmaItems; ++k) {
    const int item = threadIdx.x + k * kMmaThreads;
    const int64_t row = row0 + item / q16::kMmaStageSub;
    q16::StageWeightItem<kType>(row < seg.rows ? seg.w + row * seg.row_stride : nullptr, sb0, nsub,
                                item, st);
    const int64_t tok = tok0 + item / q16::kMmaStageSub;
    const bool here = tok < n;
    q16::StageActItem(here ? xq + tok * cols : nullptr, here ? xd + tok * subs : nullptr,
                      here ? xs + tok * subs : nullptr, sb0, nsub, item, st);
  }
}

// y [tok, row] for the thread's fragment elements inside the pass and the segment.
__device__ __forceinline__ void StoreTile(const q16::MmaFloats& total, const SegmentPick& seg,
                                          int64_t row0, int64_t tok0, int64_t n, int warp,
                                          int lane) {
#pragma unroll
  for (int mt = 0; mt < q16::kMmaTilesM; ++mt) {
#pragma unroll
    for (int nt = 0; nt < q16::kMmaTilesN; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t tok = tok0 + q16::WarpToken0(warp) + 16 * mt + q16::CFragToken(lane, e);
        const int64_t row = row0 + q16::WarpRow0(warp) + 8 * nt + q16::CFragRow(lane, e);
        if (tok < n && row < seg.rows) seg.y[tok * seg.rows + row] = total[mt][nt][e];
      }
    }
  }
}

// blockIdx.x: a 64-row slab of a segment (SegmentTable); blockIdx.y: 64 tokens.
template <int kType>
__global__ void __launch_bounds__(kMmaThreads)
    Q16MmaKernel(const SegmentTable segs, int64_t cols, const int16_t* __restrict__ xq,
                 const float* __restrict__ xd, const float* __restrict__ xs, int64_t n) {
  __shared__ __align__(16) q16::MmaStage st;
  const SegmentPick seg = PickSegment(segs);
  const int64_t row0 = static_cast<int64_t>(seg.block) * kMmaRows;
  const int64_t tok0 = static_cast<int64_t>(blockIdx.y) * kMmaTokens;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t subs = cols / q16::kBlock;
  q16::MmaFloats p, total;
#pragma unroll
  for (int mt = 0; mt < q16::kMmaTilesM; ++mt) {
#pragma unroll
    for (int nt = 0; nt < q16::kMmaTilesN; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) p[mt][nt][e] = total[mt][nt][e] = 0.0f;
    }
  }
  DeviceMma mma{&st, warp, lane};
  for (int64_t sb0 = 0; sb0 < subs; sb0 += q16::kMmaStageSub) {
    const int nsub = static_cast<int>(min(static_cast<int64_t>(q16::kMmaStageSub), subs - sb0));
    StageTile<kType>(seg, row0, tok0, n, cols, xq, xd, xs, sb0, nsub, &st);
    __syncthreads();
    for (int j = 0; j < nsub; ++j) q16::WarpSubBlock<kType>(st, warp, lane, j, mma, p);
    if (q16::StageEndsRange<kType>(sb0 + nsub, subs)) q16::AddRange(p, total);
    __syncthreads();  // the next stage overwrites st
  }
  StoreTile(total, seg, row0, tok0, n, warp, lane);
}

template <int kType>
void Launch(const SegmentTable& segs, unsigned blocks, int64_t cols, const Q16Acts& acts, int64_t n,
            cudaStream_t stream) {
  const dim3 grid(blocks, static_cast<unsigned>((n + kMmaTokens - 1) / kMmaTokens));
  Q16MmaKernel<kType><<<grid, kMmaThreads, 0, stream>>>(segs, cols, acts.qs, acts.d, acts.s, n);
}

}  // namespace

cudaError_t LaunchQ16Mma(GgmlType type, const FusedSegment* segments, int count, int64_t cols,
                         const Q16Acts& acts, int64_t n, cudaStream_t stream) {
  if (count < 1 || count > kFusedMaxSegments || n < 1 || n > kQ16MaxTokens) {
    return cudaErrorInvalidValue;
  }
  unsigned blocks = 0;
  const SegmentTable segs = MakeSegmentTable(segments, count, kMmaRows, &blocks);
  switch (type) {
    case GgmlType::kQ4_0:
      Launch<q16::kTypeQ4_0>(segs, blocks, cols, acts, n, stream);
      break;
    case GgmlType::kQ4_1:
      Launch<q16::kTypeQ4_1>(segs, blocks, cols, acts, n, stream);
      break;
    case GgmlType::kQ8_0:
      Launch<q16::kTypeQ8_0>(segs, blocks, cols, acts, n, stream);
      break;
    case GgmlType::kQ4_K:
      Launch<q16::kTypeQ4_K>(segs, blocks, cols, acts, n, stream);
      break;
    case GgmlType::kQ5_K:
      Launch<q16::kTypeQ5_K>(segs, blocks, cols, acts, n, stream);
      break;
    case GgmlType::kQ6_K:
      Launch<q16::kTypeQ6_K>(segs, blocks, cols, acts, n, stream);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace specnode::cuda_internal
