// Paged attention over a pass's rows (contract in cuda_kv_kernels.h; the chunking and the
// merge in kv_attention_chunks.h).
//
// A row's context is cut into chunks (kv_chunks::ChunkCount, a function of its length). A
// chunk is walked by one block's kWarps warps, warp w taking positions c0 + w, c0 + w +
// kWarps, ... with a running maximum, denominator and weighted V sum (lane holds values lane
// + 32 i), kGroup positions' loads in flight at a time (one DRAM latency per position was
// what a short context's 10-16 us a call on the H200 measured); the warps are combined in
// shared memory into the chunk's partial, and the partials merged in chunk order.
//   - Decode and verification passes (n <= kv_chunks::kChunkedRows) run KvChunkKernel: Z
//     blocks per (query head, row), block z taking chunks z, z + Z, ..., each partial to the
//     scratch; the block that completes a row's count merges them (flash-decoding: a long
//     context fills the GPU at batch 1). Z depends on n only (a recorded CUDA graph replays
//     with longer contexts); the result does not depend on Z.
//   - Larger passes run KvAttentionKernel: one block per (query head, row), its chunks in
//     order.
// Both compute the same partials and merge them in the same order: a row's output is the
// same bits either way, and batch-invariant. A token's class is uniform across its warp, so
// decoding branches per token, not per lane.
#include <cuda_fp16.h>

#include <cmath>

#include "cuda/cuda_kv_kernels.h"
#include "cuda/kv_attention_chunks.h"
#include "cuda/kv_device_rows.cuh"
#include "cuda/q16_dot.h"

namespace specnode::cuda_internal {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;  // >= codec::kMaxHeadDim: thread d holds value d
static_assert(kThreads >= codec::kMaxHeadDim, "one thread per value of a row");
// Two blocks per SM (<= 128 registers): attention is latency-bound, and 16 warps an SM keep
// twice the positions' loads in flight of 8 (the chunk kernel then spills ~24 bytes).
constexpr int kMinBlocksPerSm = 2;

// One row's raw words on a warp (value lane + 32 i in w[i]), loaded before use.
struct RawRow {
  uint32_t header;
  uint32_t w[kPerLane];
};
__device__ __forceinline__ void LoadRaw(int cls, const uint8_t* row, int hd, int lane, RawRow& r) {
  r.header = RawHeader(cls, row);
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int d = lane + 32 * i;
    r.w[i] = d < hd ? RawAt(cls, row, d) : 0u;
  }
}

// Softmax score of a key row for one warp (every lane returns the same value).
__device__ __forceinline__ float ScoreRaw(int cls, const RawRow& k, int hd,
                                          const float (&q)[kPerLane], int lane) {
  float dot = 0.0f;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int d = lane + 32 * i;
    if (d < hd) dot = fmaf(q[i], DecodeRaw(cls, k.header, k.w[i], d), dot);
  }
  // xor butterfly: every lane ends with the same sum, in the same order on each lane.
  for (int offset = 16; offset > 0; offset >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
  return dot;
}

__device__ __forceinline__ float Score(const KvDeviceFormat& f, const uint8_t* kr, int cls,
                                       const float (&q)[kPerLane], int lane) {
  // (the K row's format: int4 for the cold class)
  const int kf = codec::RowFormat(cls, 0);
  RawRow k;
  LoadRaw(kf, kr, f.head_dim, lane, k);
  return ScoreRaw(kf, k, f.head_dim, q, lane);
}

// Positions a warp loads before it uses any (KvAttentionKernel).
constexpr int kGroup = 4;

// Warp `warp`'s share of chunk [c0, c1) of a row's context: positions c0 + warp,
// c0 + warp + kWarps, ... in that order, kGroup at a time: first the group's table entries, then
// its K and V rows' raw words, all loads in flight together; then the online softmax over them in
// position order (the arithmetic of one position at a time, so the result does not depend on the
// grouping). m, l, acc: the warp's running maximum, denominator and weighted V sum (value lane + 32
// i in acc[i]).
__device__ __forceinline__ void WalkPositions(const KvDeviceFormat& f, int layer, int kv_head,
                                              const int32_t* tok, int c0, int c1, int warp,
                                              int lane, const float (&qr)[kPerLane], float& m,
                                              float& l, float (&acc)[kPerLane]) {
  const int hd = f.head_dim;
  for (int j0 = c0 + warp; j0 < c1; j0 += kWarps * kGroup) {
    int cls[kGroup];
    int64_t base[kGroup];
#pragma unroll
    for (int u = 0; u < kGroup; ++u) {
      const int j = j0 + u * kWarps;
      cls[u] = -1;
      base[u] = 0;
      if (j < c1) {
        cls[u] = tok[3 * j + 2];  // < 0: evicted
        base[u] = Offset(tok + 3 * j);
      }
    }
    RawRow kraw[kGroup], vraw[kGroup];
#pragma unroll
    for (int u = 0; u < kGroup; ++u) {
      if (cls[u] >= 0) {
        const uint8_t* kr = RowAt(f, base[u], cls[u], layer, kv_head, 0);
        LoadRaw(codec::RowFormat(cls[u], 0), kr, hd, lane, kraw[u]);
        LoadRaw(codec::RowFormat(cls[u], 1), kr + KeyBytesOf(f, cls[u]), hd, lane, vraw[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < kGroup; ++u) {
      if (cls[u] < 0) continue;
      const float s = ScoreRaw(codec::RowFormat(cls[u], 0), kraw[u], hd, qr, lane);
      const float m_new = fmaxf(m, s);
      const float correction = expf(m - m_new);  // 0 on the first position (m = -inf)
      const float w = expf(s - m_new);
      l = fmaf(l, correction, w);  // pinned: no contraction choice
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const int d = lane + 32 * i;
        if (d < hd) {
          acc[i] = fmaf(w, DecodeRaw(codec::RowFormat(cls[u], 1), vraw[u].header, vraw[u].w[i], d),
                        acc[i] * correction);
        }
      }
      m = m_new;
    }
  }
}

// Attention mass of an observed row (pass row r: r[2] = lo, r[3] = width, r[4] = offset):
// the normalised weight of each key in [lo, lo + width), times the context length, scored
// again (the same Score as the attention), added into p.mass for query head h; keys before
// the window's start `s0` add 0 (AddKvPassMass does not count them for this layer).
__device__ __forceinline__ void AddMass(const KvDeviceFormat& f, const KvDevicePass& p, int layer,
                                        int kv_head, int h, const int32_t* r, const int32_t* tok,
                                        int warp, int lane, const float (&qr)[kPerLane], float big,
                                        float denom, int s0) {
  const int lo = r[2], width = r[3], length = r[1];
  if (width <= 0) return;
  float* mass = p.mass + r[4] + static_cast<int64_t>(h) * width;
  for (int jj = warp; jj < width; jj += kWarps) {
    const int32_t* e = tok + 3 * (lo + jj);
    const int cls = e[2];
    float w = 0.0f;
    if (cls >= 0 && lo + jj >= s0) {
      const uint8_t* kr = RowAt(f, Offset(e), cls, layer, kv_head, 0);
      w = expf(Score(f, kr, cls, qr, lane) - big) / denom * static_cast<float>(length);
    }
    if (lane == 0) mass[jj] = layer == 0 ? w : mass[jj] + w;
  }
}

// A block's shared memory: the warps' states of the chunk being combined, the output row
// (rotated back when the rows are), whether this block merges the row.
struct AttnShared {
  float warp_m[kWarps], warp_l[kWarps];
  float warp_acc[kWarps][codec::kMaxHeadDim];
  float out_row[codec::kMaxHeadDim];
  int merges;
};

// Query head h of pass row t, as the CPU prepares it: rotated into the rows' basis, scaled
// (value lane + 32 i in qr[i]).
__device__ __forceinline__ void LoadQuery(const KvDeviceFormat& f, const float* q, int64_t t, int h,
                                          float scale, int lane, float (&qr)[kPerLane]) {
  const int hd = f.head_dim;
  const float* qt = q + (t * f.n_kv_heads * f.gqa_group + h) * hd;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int d = lane + 32 * i;
    qr[i] = d < hd ? qt[d] : 0.0f;
  }
  if (f.rotate) WarpHadamard(qr, hd, f.hadamard_norm, lane);
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) qr[i] *= scale;
}

// A chunk's partial, block-wide: every thread gets its maximum *m_c and denominator *l_c,
// thread d < head_dim its weighted V sum *acc_c for value d. A warp that saw no position
// (l == 0) is skipped; a chunk that saw none has l_c == 0.
__device__ __forceinline__ void ChunkPartial(const KvDeviceFormat& f, int layer, int kv_head,
                                             const int32_t* tok, int c0, int c1, int warp, int lane,
                                             const float (&qr)[kPerLane], AttnShared& sh,
                                             float* m_c, float* l_c, float* acc_c) {
  const int hd = f.head_dim;
  float m = -INFINITY, l = 0.0f, acc[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) acc[i] = 0.0f;
  WalkPositions(f, layer, kv_head, tok, c0, c1, warp, lane, qr, m, l, acc);
  if (lane == 0) {
    sh.warp_m[warp] = m;
    sh.warp_l[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int d = lane + 32 * i;
    if (d < hd) sh.warp_acc[warp][d] = acc[i];
  }
  __syncthreads();
  float big = -INFINITY, denom = 0.0f, o = 0.0f;
  for (int w = 0; w < kWarps; ++w) {
    if (sh.warp_l[w] > 0.0f) big = fmaxf(big, sh.warp_m[w]);
  }
  const int d = threadIdx.x;
  for (int w = 0; w < kWarps; ++w) {
    if (sh.warp_l[w] > 0.0f) {
      const float e = expf(sh.warp_m[w] - big);
      denom = fmaf(sh.warp_l[w], e, denom);
      if (d < hd) o = fmaf(sh.warp_acc[w][d], e, o);
    }
  }
  __syncthreads();  // the next chunk reuses sh
  *m_c = big;
  *l_c = denom;
  *acc_c = o;
}

// Row t's output for query head h, acc / l (thread d: value d), rotated back when the rows
// are, and (q16.qs set) its 32-value blocks rounded to int16 by the warp holding each; then
// its attention mass (AddMass) with the merged maximum and denominator.
__device__ __forceinline__ void FinishRow(const KvDeviceFormat& f, const KvDevicePass& p, int layer,
                                          int h, int64_t t, const float (&qr)[kPerLane], float m,
                                          float l, float acc, float* out, const Q16Acts& q16,
                                          AttnShared& sh, int warp, int lane, int s0) {
  const int hd = f.head_dim;
  const int32_t* r = p.rows + 5 * t;
  const int32_t* tok = p.tok + 3 * static_cast<int64_t>(r[0]);
  const int64_t base = (t * f.n_kv_heads * f.gqa_group + h) * hd;  // the row's first value
  float* ot = out + base;
  // Block b of the row (32 values, one on each lane) to int16 (ProduceQ16ForPool's layout).
  auto quantize = [&](float v, int b) {
    if (q16.qs == nullptr) return;
    const int64_t blk = base / q16::kBlock + b;
    q16::WarpQuantizeBlock16(v, lane, q16.qs + blk * q16::kBlock, q16.d + blk, q16.s + blk);
  };
  const int d = threadIdx.x;
  const float o = d < hd ? acc / l : 0.0f;
  if (!f.rotate) {
    if (d < hd) ot[d] = o;
    if (warp < hd / q16::kBlock) quantize(o, warp);  // warp-uniform: hd is a multiple of 32
  } else {
    if (d < hd) sh.out_row[d] = o;
    __syncthreads();
    if (warp == 0) {
      float x[kPerLane];
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const int dd = lane + 32 * i;
        x[i] = dd < hd ? sh.out_row[dd] : 0.0f;
      }
      WarpHadamard(x, hd, f.hadamard_norm, lane);
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const int dd = lane + 32 * i;
        if (dd < hd) ot[dd] = x[i];
        if (32 * i < hd && hd % q16::kBlock == 0) quantize(x[i], i);
      }
    }
  }
  AddMass(f, p, layer, h / f.gqa_group, h, r, tok, warp, lane, qr, m, l, s0);
}

// Larger passes: one block per (query head h = blockIdx.x, row t = blockIdx.y), the row's
// chunks one after the other, each partial merged as it completes.
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    KvAttentionKernel(KvDeviceFormat f, KvDevicePass p, int layer, const float* __restrict__ q,
                      float scale, int window, float* __restrict__ out, Q16Acts q16) {
  __shared__ AttnShared sh;
  const int h = blockIdx.x;
  const int64_t t = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int32_t* r = p.rows + 5 * t;
  const int32_t* tok = p.tok + 3 * static_cast<int64_t>(r[0]);
  const int length = r[1];
  float qr[kPerLane];
  LoadQuery(f, q, t, h, scale, lane, qr);
  float m = -INFINITY, l = 0.0f, acc = 0.0f;
  const int s0 = kv_chunks::WindowStart(length, window), span = length - s0;
  const int z = kv_chunks::ChunkCount(span);
  for (int c = 0; c < z; ++c) {
    int c0, c1;
    kv_chunks::ChunkBounds(span, c, &c0, &c1);
    float m_c, l_c, acc_c;
    ChunkPartial(f, layer, h / f.gqa_group, tok, s0 + c0, s0 + c1, warp, lane, qr, sh, &m_c, &l_c,
                 &acc_c);
    kv_chunks::MergePartial(m_c, l_c, acc_c, &m, &l, &acc);
  }
  FinishRow(f, p, layer, h, t, qr, m, l, acc, out, q16, sh, warp, lane, s0);
}

// Decode and verification passes: blocks (h, t, z) for z < gridDim.z, block z computing
// chunks z, z + gridDim.z, ... of row t into `partials` [t][h][chunk][2 + head_dim] (m, l,
// acc); the block whose chunks complete the row's count in `counters` [t][h] (zero between
// launches: the merging block resets it) merges them in chunk order and finishes the row.
// A row of one chunk is finished by its block directly.
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    KvChunkKernel(KvDeviceFormat f, KvDevicePass p, int layer, const float* __restrict__ q,
                  float scale, int window, float* __restrict__ out, float* __restrict__ partials,
                  unsigned* __restrict__ counters, Q16Acts q16) {
  __shared__ AttnShared sh;
  const int h = blockIdx.x;
  const int64_t t = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int hd = f.head_dim, n_heads = f.n_kv_heads * f.gqa_group;
  const int32_t* r = p.rows + 5 * t;
  const int32_t* tok = p.tok + 3 * static_cast<int64_t>(r[0]);
  const int length = r[1];
  const int s0 = kv_chunks::WindowStart(length, window), span = length - s0;
  const int z = kv_chunks::ChunkCount(span);
  if (static_cast<int>(blockIdx.z) >= z) return;  // block-uniform
  float qr[kPerLane];
  LoadQuery(f, q, t, h, scale, lane, qr);
  const int64_t row_slot = t * n_heads + h;
  float* row_partials = partials + row_slot * kv_chunks::kMaxChunks * (2 + hd);
  float m_c = -INFINITY, l_c = 0.0f, acc_c = 0.0f;
  unsigned mine = 0;
  for (int c = blockIdx.z; c < z; c += gridDim.z, ++mine) {
    int c0, c1;
    kv_chunks::ChunkBounds(span, c, &c0, &c1);
    ChunkPartial(f, layer, h / f.gqa_group, tok, s0 + c0, s0 + c1, warp, lane, qr, sh, &m_c, &l_c,
                 &acc_c);
    if (z == 1) break;
    float* pc = row_partials + c * (2 + hd);
    if (threadIdx.x == 0) {
      pc[0] = m_c;
      pc[1] = l_c;
    }
    if (static_cast<int>(threadIdx.x) < hd) pc[2 + threadIdx.x] = acc_c;
  }
  float m = -INFINITY, l = 0.0f, acc = 0.0f;
  if (z == 1) {
    kv_chunks::MergePartial(m_c, l_c, acc_c, &m, &l, &acc);
  } else {
    __threadfence();  // the partials are visible before the count says so
    __syncthreads();
    if (threadIdx.x == 0) {
      const unsigned before = atomicAdd(counters + row_slot, mine);
      sh.merges = before + mine == static_cast<unsigned>(z);
      if (sh.merges) counters[row_slot] = 0;  // for the next launch
    }
    __syncthreads();
    if (!sh.merges) return;  // block-uniform
    __threadfence();
    for (int c = 0; c < z; ++c) {
      const float* pc = row_partials + c * (2 + hd);
      const float a = static_cast<int>(threadIdx.x) < hd ? __ldcg(pc + 2 + threadIdx.x) : 0.0f;
      kv_chunks::MergePartial(__ldcg(pc), __ldcg(pc + 1), a, &m, &l, &acc);
    }
  }
  FinishRow(f, p, layer, h, t, qr, m, l, acc, out, q16, sh, warp, lane, s0);
}

}  // namespace

cudaError_t LaunchKvAttention(const KvDeviceFormat& f, const KvDevicePass& p, int layer,
                              const float* q, float scale, int window, float* out,
                              const KvAttentionScratch& scratch, const Q16Acts* q16,
                              cudaStream_t stream) {
  const Q16Acts rounding = q16 != nullptr ? *q16 : Q16Acts{nullptr, nullptr, nullptr};
  const int n_heads = f.n_kv_heads * f.gqa_group;
  if (p.n <= kv_chunks::kChunkedRows && scratch.partials != nullptr &&
      scratch.counters != nullptr) {
    // Blocks per row: enough that heads x rows x Z fill the GPU at batch 1 (a function of
    // n only, so a recorded graph stays valid as contexts grow).
    const int64_t per_row = (kv_chunks::kTargetBlocks + n_heads * p.n - 1) / (n_heads * p.n);
    const unsigned z = static_cast<unsigned>(
        per_row < 1 ? 1 : (per_row > kv_chunks::kMaxChunks ? kv_chunks::kMaxChunks : per_row));
    const dim3 grid(static_cast<unsigned>(n_heads), static_cast<unsigned>(p.n), z);
    KvChunkKernel<<<grid, kThreads, 0, stream>>>(f, p, layer, q, scale, window, out,
                                                 scratch.partials, scratch.counters, rounding);
    return cudaGetLastError();
  }
  const dim3 grid(static_cast<unsigned>(n_heads), static_cast<unsigned>(p.n));
  KvAttentionKernel<<<grid, kThreads, 0, stream>>>(f, p, layer, q, scale, window, out, rounding);
  return cudaGetLastError();
}

size_t KvAttentionScratchFloats(const KvDeviceFormat& f) {
  return static_cast<size_t>(kv_chunks::kChunkedRows) * f.n_kv_heads * f.gqa_group *
         kv_chunks::kMaxChunks * (2 + f.head_dim);
}
size_t KvAttentionCounters(const KvDeviceFormat& f) {
  return static_cast<size_t>(kv_chunks::kChunkedRows) * f.n_kv_heads * f.gqa_group;
}

}  // namespace specnode::cuda_internal
