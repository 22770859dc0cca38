// The GPU page pool's kernels (contracts in cuda_kv_kernels.h).
//
// Encoding and demotion are one warp per row (kv_codec's per-value steps, the row's
// extremes reduced across lanes: the plan cuda/tests/kv_pool_host_test.cc simulates against
// kv_codec's serial EncodeRow, which is checked byte for byte against the CPU pool); slot
// copies one block per slot. Attention is the hot loop: one block of kWarps warps per (query
// head, row), warp w walking positions w, w + kWarps, ... with a running maximum,
// denominator and weighted V sum (lane holds values lane + 32 i), kGroup positions' loads
// in flight at a time (one DRAM latency per position was what a short context's
// 10-16 us a call on the H200 measured), warps combined in shared memory at the end. A token's
// class is uniform across its warp, so decoding branches per token, not per lane. Each row's block
// does the same work whatever else is in the pass: batch-invariant, as on the CPU.
#include <cuda_fp16.h>

#include <cmath>

#include "cuda/cuda_kv_kernels.h"
#include "cuda/kv_row_codec.h"

namespace specnode::cuda_internal {
namespace {

namespace codec = ::specnode::kv_codec;

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kPerLane = codec::kMaxHeadDim / 32;
constexpr int kRowThreads = 128;
constexpr int64_t kMaxBlocks = 65535;

__device__ __forceinline__ int64_t Offset(const int32_t* e) {
  return static_cast<int64_t>(static_cast<uint32_t>(e[0])) | (static_cast<int64_t>(e[1]) << 32);
}

// f.row_bytes[cls] by selects: indexing the kernel parameter's array with a run-time cls
// would copy it to local memory in every thread (and read it from there per position).
__device__ __forceinline__ int RowBytesOf(const KvDeviceFormat& f, int cls) {
  return cls == 0 ? f.row_bytes[0] : (cls == 1 ? f.row_bytes[1] : f.row_bytes[2]);
}

__device__ __forceinline__ int64_t LayerStride(const KvDeviceFormat& f, int cls) {
  return static_cast<int64_t>(f.page_tokens) * 2 * f.n_kv_heads * RowBytesOf(f, cls);
}

// Row (layer, kv head, K or V) of the token whose layer-0 base is `base`.
__device__ __forceinline__ uint8_t* RowAt(const KvDeviceFormat& f, int64_t base, int cls, int layer,
                                          int kv_head, int value) {
  return f.arena + base + layer * LayerStride(f, cls) +
         static_cast<int64_t>(2 * kv_head + value) * RowBytesOf(f, cls);
}

// Decoding in two steps, so that a warp can issue the loads of several rows before it
// uses any (KvAttentionKernel): RawHeader / RawAt load a row's header (bytes 0..3: int8's
// f32 scale, int4's f16 scale and min; nothing for f16) and value d's storage word (f16
// bits; the int8 byte; the int4 byte holding it), DecodeRaw turns them into the value
// (kv_codec::DecodeAt with the hardware's f16 conversion). The int4 header and every later
// row of the slot may start at an odd address (a row is 4 + head_dim / 2 bytes, odd when
// head_dim % 4 == 2): headers are read byte-wise; f16 rows (2 head_dim bytes at even
// offsets) load their values as aligned 16-bit words.
__device__ __forceinline__ uint32_t RawHeader(int cls, const uint8_t* row) {
  if (cls == codec::kFull) return 0;
  return static_cast<uint32_t>(row[0]) | (static_cast<uint32_t>(row[1]) << 8) |
         (static_cast<uint32_t>(row[2]) << 16) | (static_cast<uint32_t>(row[3]) << 24);
}
__device__ __forceinline__ uint32_t RawAt(int cls, const uint8_t* row, int d) {
  if (cls == codec::kFull) return *reinterpret_cast<const uint16_t*>(row + 2 * d);
  return cls == codec::kInt8 ? row[4 + d] : row[4 + d / 2];
}
__device__ __forceinline__ float HalfBits(uint32_t bits) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits & 0xffffu)));
}
__device__ __forceinline__ float DecodeRaw(int cls, uint32_t header, uint32_t raw, int d) {
  if (cls == codec::kFull) return HalfBits(raw);
  if (cls == codec::kInt8) {
    return codec::BitsFloat(header) * static_cast<float>(static_cast<int8_t>(raw & 0xffu));
  }
  const float q = static_cast<float>((d & 1) ? (raw >> 4) : (raw & 15u));
  return HalfBits(header >> 16) + HalfBits(header) * q;  // min + scale * q
}

// The Walsh-Hadamard transform of a row held by a warp (value lane + 32 i in x[i]): the
// CPU's butterflies (len 1, 2, 4, ...) in its order, lower element a + b, upper a - b, then
// the 1/sqrt(n) scaling: bit-identical to HadamardInPlace.
__device__ __forceinline__ void WarpHadamard(float (&x)[kPerLane], int n, float norm, int lane) {
  for (int len = 1; len < n && len < 32; len <<= 1) {
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const float other = __shfl_xor_sync(0xffffffffu, x[i], len);
      x[i] = (lane & len) ? other - x[i] : x[i] + other;
    }
  }
  // len >= 32 pairs registers i and i + len / 32 of the same lane.
#define SPECNODE_REGISTER_STAGE(step)                      \
  if (n > 32 * (step)) {                                   \
    _Pragma("unroll") for (int i = 0; i < kPerLane; ++i) { \
      if ((i & (step)) == 0) {                             \
        const float a = x[i], b = x[i + (step)];           \
        x[i] = a + b;                                      \
        x[i + (step)] = a - b;                             \
      }                                                    \
    }                                                      \
  }
  SPECNODE_REGISTER_STAGE(1)
  SPECNODE_REGISTER_STAGE(2)
  SPECNODE_REGISTER_STAGE(4)
#undef SPECNODE_REGISTER_STAGE
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) x[i] *= norm;
}

// Row i's stored form of value d = lane + 32 r (x[r] on that lane), every class: the bytes
// kv_codec::EncodeRow writes. The whole warp calls it (it shuffles).
__device__ __forceinline__ void WarpEncodeRow(int cls, const float (&x)[kPerLane], int hd, int lane,
                                              uint8_t* row) {
  if (cls == codec::kFull) {
#pragma unroll
    for (int r = 0; r < kPerLane; ++r) {
      const int d = lane + 32 * r;
      if (d < hd) codec::StoreU16(row + 2 * d, codec::FloatToHalf(x[r]));
    }
    return;
  }
  if (cls == codec::kInt8) {
    float amax = 0.0f;
#pragma unroll
    for (int r = 0; r < kPerLane; ++r) {
      if (lane + 32 * r < hd) amax = codec::AbsMaxStep(amax, x[r]);
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
      amax = codec::AbsMaxStep(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
    }
    const codec::Int8Params p = codec::Int8ParamsFor(amax);
    if (lane == 0) codec::StoreF32(row, p.scale);
#pragma unroll
    for (int r = 0; r < kPerLane; ++r) {
      const int d = lane + 32 * r;
      if (d < hd) row[4 + d] = codec::Int8Byte(x[r], p.inv);
    }
    return;
  }
  // int4: the extremes with their indices (lanes without values hold +inf / -inf at an index
  // past every value, which any value beats).
  codec::Extremes e{INFINITY, 1 << 30, -INFINITY, 1 << 30};
#pragma unroll
  for (int r = 0; r < kPerLane; ++r) {
    const int d = lane + 32 * r;
    if (d < hd) e = codec::Combine(e, codec::ExtremesOf(x[r], d));
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    codec::Extremes o;
    o.lo = __shfl_xor_sync(0xffffffffu, e.lo, offset);
    o.lo_at = __shfl_xor_sync(0xffffffffu, e.lo_at, offset);
    o.hi = __shfl_xor_sync(0xffffffffu, e.hi, offset);
    o.hi_at = __shfl_xor_sync(0xffffffffu, e.hi_at, offset);
    e = codec::Combine(e, o);
  }
  const codec::Int4Params p = codec::Int4ParamsFor(e.lo, e.hi);
  if (lane == 0) {
    codec::StoreU16(row, p.scale_h);
    codec::StoreU16(row + 2, p.min_h);
  }
  // Values d (even lane) and d + 1 (the next lane, same register) share byte d / 2.
#pragma unroll
  for (int r = 0; r < kPerLane; ++r) {
    const int d = lane + 32 * r;
    const int q = d < hd ? codec::Int4Level(x[r], p) : 0;
    const int q_next = __shfl_down_sync(0xffffffffu, q, 1);
    if (d < hd && (lane & 1) == 0) row[4 + d / 2] = static_cast<uint8_t>(q | (q_next << 4));
  }
}

// One warp per (token, KV head, K or V) row: loads it (value lane + 32 r in x[r]), rotates
// it in shuffles, encodes it in its token's class. Was one thread per row with the row in
// local memory: 27-42 us a call on an H200 (~30% of a SmolLM2 step).
__global__ void __launch_bounds__(kRowThreads)
    KvEncodeKernel(KvDeviceFormat f, KvDevicePass p, int layer, const float* __restrict__ k,
                   const float* __restrict__ v) {
  const int64_t total = p.n * f.n_kv_heads * 2;
  const int hd = f.head_dim;
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  // i is the same on every lane of a warp: the loop and its shuffles are warp-uniform.
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
       i < total; i += warps) {
    const int value = static_cast<int>(i % 2);
    const int h = static_cast<int>((i / 2) % f.n_kv_heads);
    const int64_t t = i / (2 * f.n_kv_heads);
    const int32_t* r = p.rows + 5 * t;
    const int32_t* e = p.tok + 3 * (static_cast<int64_t>(r[0]) + r[1] - 1);
    const int cls = e[2];
    const float* src = (value ? v : k) + (t * f.n_kv_heads + h) * hd;
    float x[kPerLane];
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int d = lane + 32 * j;
      x[j] = d < hd ? src[d] : 0.0f;
    }
    if (f.rotate) WarpHadamard(x, hd, f.hadamard_norm, lane);
    WarpEncodeRow(cls, x, hd, lane, RowAt(f, Offset(e), cls, layer, h, value));
  }
}

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
  RawRow k;
  LoadRaw(cls, kr, f.head_dim, lane, k);
  return ScoreRaw(cls, k, f.head_dim, q, lane);
}

// Positions a warp loads before it uses any (KvAttentionKernel).
constexpr int kGroup = 4;

// Warp `warp`'s share of one row's attention: positions warp, warp + kWarps, ... of its
// context in that order, kGroup at a time: first the group's table entries, then its K
// and V rows' raw words, all loads in flight together; then the online softmax over them
// in position order (the arithmetic of one position at a time, so the result does not
// depend on the grouping). m, l, acc: the warp's running maximum, denominator and
// weighted V sum (value lane + 32 i in acc[i]).
__device__ __forceinline__ void WalkPositions(const KvDeviceFormat& f, int layer, int kv_head,
                                              const int32_t* tok, int length, int warp, int lane,
                                              const float (&qr)[kPerLane], float& m, float& l,
                                              float (&acc)[kPerLane]) {
  const int hd = f.head_dim;
  for (int j0 = warp; j0 < length; j0 += kWarps * kGroup) {
    int cls[kGroup];
    int64_t base[kGroup];
#pragma unroll
    for (int u = 0; u < kGroup; ++u) {
      const int j = j0 + u * kWarps;
      cls[u] = -1;
      base[u] = 0;
      if (j < length) {
        cls[u] = tok[3 * j + 2];  // < 0: evicted
        base[u] = Offset(tok + 3 * j);
      }
    }
    RawRow kraw[kGroup], vraw[kGroup];
#pragma unroll
    for (int u = 0; u < kGroup; ++u) {
      if (cls[u] >= 0) {
        const uint8_t* kr = RowAt(f, base[u], cls[u], layer, kv_head, 0);
        LoadRaw(cls[u], kr, hd, lane, kraw[u]);
        LoadRaw(cls[u], kr + RowBytesOf(f, cls[u]), hd, lane, vraw[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < kGroup; ++u) {
      if (cls[u] < 0) continue;
      const float s = ScoreRaw(cls[u], kraw[u], hd, qr, lane);
      const float m_new = fmaxf(m, s);
      const float correction = expf(m - m_new);  // 0 on the first position (m = -inf)
      const float w = expf(s - m_new);
      l = l * correction + w;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const int d = lane + 32 * i;
        if (d < hd) {
          acc[i] = fmaf(w, DecodeRaw(cls[u], vraw[u].header, vraw[u].w[i], d), acc[i] * correction);
        }
      }
      m = m_new;
    }
  }
}

// Attention mass of an observed row (pass row r: r[2] = lo, r[3] = width, r[4] = offset):
// the normalised weight of each key in [lo, lo + width), times the context length, scored
// again (the same Score as the attention), added into p.mass for query head h.
__device__ __forceinline__ void AddMass(const KvDeviceFormat& f, const KvDevicePass& p, int layer,
                                        int kv_head, int h, const int32_t* r, const int32_t* tok,
                                        int warp, int lane, const float (&qr)[kPerLane], float big,
                                        float denom) {
  const int lo = r[2], width = r[3], length = r[1];
  if (width <= 0) return;
  float* mass = p.mass + r[4] + static_cast<int64_t>(h) * width;
  for (int jj = warp; jj < width; jj += kWarps) {
    const int32_t* e = tok + 3 * (lo + jj);
    const int cls = e[2];
    float w = 0.0f;
    if (cls >= 0) {
      const uint8_t* kr = RowAt(f, Offset(e), cls, layer, kv_head, 0);
      w = expf(Score(f, kr, cls, qr, lane) - big) / denom * static_cast<float>(length);
    }
    if (lane == 0) mass[jj] = layer == 0 ? w : mass[jj] + w;
  }
}

__global__ void __launch_bounds__(kThreads)
    KvAttentionKernel(KvDeviceFormat f, KvDevicePass p, int layer, const float* __restrict__ q,
                      float scale, float* __restrict__ out) {
  const int h = blockIdx.x;
  const int64_t t = blockIdx.y;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int hd = f.head_dim;
  const int n_heads = f.n_kv_heads * f.gqa_group;
  const int kv_head = h / f.gqa_group;
  const int32_t* r = p.rows + 5 * t;
  const int32_t* tok = p.tok + 3 * static_cast<int64_t>(r[0]);
  const int length = r[1];
  const float* qt = q + (t * n_heads + h) * hd;
  float qr[kPerLane], acc[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int d = lane + 32 * i;
    qr[i] = d < hd ? qt[d] : 0.0f;
    acc[i] = 0.0f;
  }
  // As the CPU: rotate the query into the rows' basis, then scale it.
  if (f.rotate) WarpHadamard(qr, hd, f.hadamard_norm, lane);
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) qr[i] *= scale;
  float m = -INFINITY, l = 0.0f;
  WalkPositions(f, layer, kv_head, tok, length, warp, lane, qr, m, l, acc);
  __shared__ float warp_m[kWarps], warp_l[kWarps];
  __shared__ float warp_acc[kWarps][codec::kMaxHeadDim];
  __shared__ float out_row[codec::kMaxHeadDim];
  if (lane == 0) {
    warp_m[warp] = m;
    warp_l[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int d = lane + 32 * i;
    if (d < hd) warp_acc[warp][d] = acc[i];
  }
  __syncthreads();
  // A warp that saw no position has l == 0 and is skipped.
  float big = -INFINITY;
  for (int w = 0; w < kWarps; ++w) {
    if (warp_l[w] > 0.0f) big = fmaxf(big, warp_m[w]);
  }
  float denom = 0.0f;
  for (int w = 0; w < kWarps; ++w) {
    if (warp_l[w] > 0.0f) denom += warp_l[w] * expf(warp_m[w] - big);
  }
  float* ot = out + (t * n_heads + h) * hd;
  for (int d = threadIdx.x; d < hd; d += kThreads) {
    float o = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      if (warp_l[w] > 0.0f) o += warp_acc[w][d] * expf(warp_m[w] - big);
    }
    if (f.rotate) {
      out_row[d] = o / denom;
    } else {
      ot[d] = o / denom;
    }
  }
  if (f.rotate) {
    __syncthreads();
    if (warp == 0) {
      float x[kPerLane];
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const int d = lane + 32 * i;
        x[i] = d < hd ? out_row[d] : 0.0f;
      }
      WarpHadamard(x, hd, f.hadamard_norm, lane);
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const int d = lane + 32 * i;
        if (d < hd) ot[d] = x[i];
      }
    }
  }
  AddMass(f, p, layer, kv_head, h, r, tok, warp, lane, qr, big, denom);
}

// One warp per row (job, layer, KV head, K or V): decoded value by value, re-encoded as
// KvEncodeKernel encodes. Both rows are in the stored (rotated) basis: no rotation here, as
// on the CPU.
__global__ void __launch_bounds__(kRowThreads)
    KvRecodeKernel(KvDeviceFormat f, int n_layers, const int32_t* __restrict__ jobs,
                   int64_t n_jobs) {
  const int64_t per_job = static_cast<int64_t>(n_layers) * f.n_kv_heads * 2;
  const int64_t total = n_jobs * per_job;
  const int hd = f.head_dim;
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
       i < total; i += warps) {
    const int32_t* job = jobs + 6 * (i / per_job);
    const int64_t rest = i % per_job;
    const int value = static_cast<int>(rest % 2);
    const int h = static_cast<int>((rest / 2) % f.n_kv_heads);
    const int layer = static_cast<int>(rest / (2 * f.n_kv_heads));
    const uint8_t* from = RowAt(f, Offset(job), job[2], layer, h, value);
    float x[kPerLane];
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int d = lane + 32 * j;
      x[j] = d < hd ? codec::DecodeAt(job[2], from, d) : 0.0f;
    }
    WarpEncodeRow(job[5], x, hd, lane, RowAt(f, Offset(job + 3), job[5], layer, h, value));
  }
}

// One block per (job, layer): that layer's SlotStride bytes, two at a time.
__global__ void __launch_bounds__(kRowThreads)
    KvCopySlotsKernel(KvDeviceFormat f, int n_layers, const int32_t* __restrict__ jobs,
                      int64_t n_jobs, uint8_t* __restrict__ staging, int to_staging) {
  for (int64_t b = blockIdx.x; b < n_jobs * n_layers; b += gridDim.x) {
    const int32_t* job = jobs + 5 * (b / n_layers);
    const int layer = static_cast<int>(b % n_layers);
    const int cls = job[2];
    const int64_t stride = 2 * static_cast<int64_t>(f.n_kv_heads) * RowBytesOf(f, cls);
    uint16_t* slot = reinterpret_cast<uint16_t*>(RowAt(f, Offset(job), cls, layer, 0, 0));
    uint16_t* host = reinterpret_cast<uint16_t*>(staging + Offset(job + 3) + layer * stride);
    for (int64_t i = threadIdx.x; i < stride / 2; i += blockDim.x) {
      if (to_staging) {
        host[i] = slot[i];
      } else {
        slot[i] = host[i];
      }
    }
  }
}

unsigned Blocks(int64_t threads, int per_block) {
  int64_t blocks = (threads + per_block - 1) / per_block;
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks);
}

}  // namespace

cudaError_t LaunchKvEncode(const KvDeviceFormat& f, const KvDevicePass& p, int layer,
                           const float* k, const float* v, cudaStream_t stream) {
  // One warp per row.
  KvEncodeKernel<<<Blocks(p.n * f.n_kv_heads * 2 * 32, kRowThreads), kRowThreads, 0, stream>>>(
      f, p, layer, k, v);
  return cudaGetLastError();
}

cudaError_t LaunchKvAttention(const KvDeviceFormat& f, const KvDevicePass& p, int layer,
                              const float* q, float scale, float* out, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(f.n_kv_heads * f.gqa_group), static_cast<unsigned>(p.n));
  KvAttentionKernel<<<grid, kThreads, 0, stream>>>(f, p, layer, q, scale, out);
  return cudaGetLastError();
}

cudaError_t LaunchKvRecode(const KvDeviceFormat& f, int n_layers, const int32_t* jobs,
                           int64_t n_jobs, cudaStream_t stream) {
  const int64_t rows = n_jobs * n_layers * f.n_kv_heads * 2;
  KvRecodeKernel<<<Blocks(rows * 32, kRowThreads), kRowThreads, 0, stream>>>(
      f, n_layers, jobs, n_jobs);  // one warp per row
  return cudaGetLastError();
}

cudaError_t LaunchKvCopySlots(const KvDeviceFormat& f, int n_layers, const int32_t* jobs,
                              int64_t n_jobs, uint8_t* staging, bool to_staging,
                              cudaStream_t stream) {
  KvCopySlotsKernel<<<Blocks(n_jobs * n_layers, 1), kRowThreads, 0, stream>>>(
      f, n_layers, jobs, n_jobs, staging, to_staging ? 1 : 0);
  return cudaGetLastError();
}

}  // namespace specnode::cuda_internal
