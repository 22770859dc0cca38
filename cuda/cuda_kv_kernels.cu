// The GPU page pool's kernels (contracts in cuda_kv_kernels.h).
//
// Encoding and demotion are one warp per row (kv_codec's per-value steps, the row's
// extremes reduced across lanes: the plan cuda/tests/kv_pool_host_test.cc simulates against
// kv_codec's serial EncodeRow, which is checked byte for byte against the CPU pool); slot
// copies one block per slot. Attention is cuda_kv_attention.cu; the device helpers both use
// (row addresses, two-step decoding, the warp's Hadamard) are kv_device_rows.cuh.
#include <cuda_fp16.h>

#include <cmath>

#include "cuda/cuda_kv_kernels.h"
#include "cuda/kv_device_rows.cuh"
#include "kvstore/kv_row_codec.h"

namespace specnode::cuda_internal {
namespace {

constexpr int kRowThreads = 128;
constexpr int64_t kMaxBlocks = 65535;

// Σ over a row held by a warp, kv_codec::Int2LaneSum's order: `partial` is the lane's own
// sum over its values in increasing d; the xor butterfly leaves every lane the same total.
__device__ __forceinline__ float WarpLaneSum(float partial) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    partial = codec::AddRn(partial, __shfl_xor_sync(0xffffffffu, partial, offset));
  }
  return partial;
}

// kv_codec::EncodeInt2Row with the row spread over the warp (value d = lane + 32 r in x[r]):
// lane l's partial sums are the serial form's partial l, so every sum has its bits.
__device__ __forceinline__ void WarpEncodeInt2Row(const float (&x)[kPerLane], int hd, int lane,
                                                  uint8_t* row) {
  const float n = static_cast<float>(hd);
  float s = 0.0f;
#pragma unroll
  for (int r = 0; r < kPerLane; ++r) {
    if (lane + 32 * r < hd) s = codec::AddRn(s, x[r]);
  }
  const float mean = codec::DivRn(WarpLaneSum(s), n);
  s = 0.0f;
#pragma unroll
  for (int r = 0; r < kPerLane; ++r) {
    if (lane + 32 * r < hd) {
      const float c = codec::SubRn(x[r], mean);
      s = codec::AddRn(s, codec::MulRn(c, c));
    }
  }
  const float sigma = codec::SqrtRn(codec::DivRn(WarpLaneSum(s), n));
  int best = 0;
  float best_err = 0.0f;
  for (int k = 0; k < codec::kInt2Candidates; ++k) {
    const codec::Int2Params c = codec::Int2ParamsFor(mean, sigma, k);
    s = 0.0f;
#pragma unroll
    for (int r = 0; r < kPerLane; ++r) {
      if (lane + 32 * r < hd) s = codec::AddRn(s, codec::Int2Error(x[r], c));
    }
    const float err = WarpLaneSum(s);
    if (k == 0 || err < best_err) {
      best = k;
      best_err = err;
    }
  }
  const codec::Int2Params c = codec::Int2ParamsFor(mean, sigma, best);
  if (lane == 0) {
    codec::StoreU16(row, c.scale_h);
    codec::StoreU16(row + 2, c.min_h);
  }
  // Values d .. d + 3 (lanes l .. l + 3, l % 4 == 0, same register) share byte d / 4.
#pragma unroll
  for (int r = 0; r < kPerLane; ++r) {
    const int d = lane + 32 * r;
    const int q = d < hd ? codec::Int2Level(x[r], c) : 0;
    const int q1 = __shfl_down_sync(0xffffffffu, q, 1);
    const int q2 = __shfl_down_sync(0xffffffffu, q, 2);
    const int q3 = __shfl_down_sync(0xffffffffu, q, 3);
    if (d < hd && (lane & 3) == 0) {
      row[4 + d / 4] = static_cast<uint8_t>(q | (q1 << 2) | (q2 << 4) | (q3 << 6));
    }
  }
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
  if (cls == codec::kInt2) {
    WarpEncodeInt2Row(x, hd, lane, row);
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
    WarpEncodeRow(codec::RowFormat(cls, value), x, hd, lane,
                  RowAt(f, Offset(e), cls, layer, h, value));
  }
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
      x[j] = d < hd ? codec::DecodeAt(codec::RowFormat(job[2], value), from, d) : 0.0f;
    }
    WarpEncodeRow(codec::RowFormat(job[5], value), x, hd, lane,
                  RowAt(f, Offset(job + 3), job[5], layer, h, value));
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
    const int64_t stride = static_cast<int64_t>(f.n_kv_heads) * PairBytesOf(f, cls);
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
