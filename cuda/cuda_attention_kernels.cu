// Paged-KV attention, KV writes and embedding rows (contracts in cuda_attention.h).
//
// Attention: one thread block of kWarps warps per (query head, token). Warp w walks the
// context positions w, w + kWarps, ... keeping a running maximum, denominator and weighted
// V sum (its lanes hold head_dim / 32 rounded up values each); the warps' partial results
// are then combined in shared memory. Each token's block does the same work whatever else
// is in the batch, so results are batch-invariant.
#include <cuda_fp16.h>

#include <cmath>

#include "cuda/cuda_attention_kernels.h"

namespace specnode::cuda_internal {
namespace {

// 8 warps: a decode token's block walks its context 8 positions at a time (the kernel is
// latency-bound at batch 1: n_heads blocks only).
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kPerLane = kAttentionMaxHeadDim / 32;
constexpr int kElementwiseThreads = 256;
constexpr int64_t kMaxBlocks = 65535;

__device__ __forceinline__ float HalfBits(uint16_t bits) {
  return __half2float(__ushort_as_half(bits));
}

__global__ void __launch_bounds__(kElementwiseThreads)
    KvWriteKernel(const float* __restrict__ k, const float* __restrict__ v,
                  const int32_t* __restrict__ rows, int64_t n, int kv_dim,
                  uint16_t* __restrict__ k_pool, uint16_t* __restrict__ v_pool) {
  const int64_t total = n * kv_dim;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t dst = static_cast<int64_t>(rows[i / kv_dim]) * kv_dim + i % kv_dim;
    k_pool[dst] = __half_as_ushort(__float2half_rn(k[i]));
    v_pool[dst] = __half_as_ushort(__float2half_rn(v[i]));
  }
}

__global__ void __launch_bounds__(kThreads)
    PagedAttentionKernel(const float* __restrict__ q, const uint16_t* __restrict__ k_pool,
                         const uint16_t* __restrict__ v_pool,
                         const int32_t* __restrict__ page_table,
                         const int32_t* __restrict__ table_row, const int32_t* __restrict__ ctx,
                         int n_heads, int n_kv_heads, int head_dim, int page_tokens, int max_pages,
                         float scale, float* __restrict__ out) {
  const int h = blockIdx.x;
  const int64_t t = blockIdx.y;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int kv_head = h / (n_heads / n_kv_heads);
  const int64_t kv_dim = static_cast<int64_t>(n_kv_heads) * head_dim;
  const float* qt = q + (t * n_heads + h) * head_dim;
  float qr[kPerLane], acc[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int d = lane + 32 * i;
    qr[i] = d < head_dim ? qt[d] : 0.0f;
    acc[i] = 0.0f;
  }
  const int32_t* pages = page_table + static_cast<int64_t>(table_row[t]) * max_pages;
  const int length = ctx[t];
  float m = -INFINITY, l = 0.0f;
  for (int j = warp; j < length; j += kWarps) {
    const int64_t row =
        static_cast<int64_t>(pages[j / page_tokens]) * page_tokens + j % page_tokens;
    const uint16_t* kr = k_pool + row * kv_dim + static_cast<int64_t>(kv_head) * head_dim;
    const uint16_t* vr = v_pool + row * kv_dim + static_cast<int64_t>(kv_head) * head_dim;
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int d = lane + 32 * i;
      if (d < head_dim) dot = fmaf(qr[i], HalfBits(kr[d]), dot);
    }
    // xor butterfly: every lane ends with the same sum, in the same order on each lane.
    for (int offset = 16; offset > 0; offset >>= 1) {
      dot += __shfl_xor_sync(0xffffffffu, dot, offset);
    }
    const float s = dot * scale;
    const float m_new = fmaxf(m, s);
    const float correction = expf(m - m_new);  // 0 on the first position (m = -inf)
    const float p = expf(s - m_new);
    l = l * correction + p;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int d = lane + 32 * i;
      if (d < head_dim) acc[i] = fmaf(p, HalfBits(vr[d]), acc[i] * correction);
    }
    m = m_new;
  }
  __shared__ float warp_m[kWarps], warp_l[kWarps];
  __shared__ float warp_acc[kWarps][kAttentionMaxHeadDim];
  if (lane == 0) {
    warp_m[warp] = m;
    warp_l[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int d = lane + 32 * i;
    if (d < head_dim) warp_acc[warp][d] = acc[i];
  }
  __syncthreads();
  // A warp that saw no position (length < kWarps) has l == 0 and is skipped.
  float big = -INFINITY;
  for (int w = 0; w < kWarps; ++w) {
    if (warp_l[w] > 0.0f) big = fmaxf(big, warp_m[w]);
  }
  float denom = 0.0f;
  for (int w = 0; w < kWarps; ++w) {
    if (warp_l[w] > 0.0f) denom += warp_l[w] * expf(warp_m[w] - big);
  }
  float* ot = out + (t * n_heads + h) * head_dim;
  for (int d = threadIdx.x; d < head_dim; d += kThreads) {
    float o = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      if (warp_l[w] > 0.0f) o += warp_acc[w][d] * expf(warp_m[w] - big);
    }
    ot[d] = o / denom;
  }
}

// Value c of a row of W, dequantised as model/ggml_types.cc's DequantizeRow does.
__device__ float DequantAt(GgmlType type, const uint8_t* row, int64_t c) {
  const int64_t b = c / 32;
  const int j = static_cast<int>(c % 32);
  switch (type) {
    case GgmlType::kF32:
      return reinterpret_cast<const float*>(row)[c];
    case GgmlType::kF16:
      return HalfBits(reinterpret_cast<const uint16_t*>(row)[c]);
    case GgmlType::kBF16:
      return __uint_as_float(static_cast<uint32_t>(reinterpret_cast<const uint16_t*>(row)[c])
                             << 16);
    case GgmlType::kQ8_0: {
      const uint8_t* blk = row + b * 34;
      const float d = HalfBits(static_cast<uint16_t>(blk[0] | (blk[1] << 8)));
      return d * static_cast<float>(static_cast<int8_t>(blk[2 + j]));
    }
    case GgmlType::kQ4_0: {
      const uint8_t* blk = row + b * 18;
      const float d = HalfBits(static_cast<uint16_t>(blk[0] | (blk[1] << 8)));
      const int q = j < 16 ? (blk[2 + j] & 15) : (blk[2 + j - 16] >> 4);
      return d * static_cast<float>(q - 8);
    }
    default: {  // kQ4_1
      const uint8_t* blk = row + b * 20;
      const float d = HalfBits(static_cast<uint16_t>(blk[0] | (blk[1] << 8)));
      const float m = HalfBits(static_cast<uint16_t>(blk[2] | (blk[3] << 8)));
      const int q = j < 16 ? (blk[4 + j] & 15) : (blk[4 + j - 16] >> 4);
      return d * static_cast<float>(q) + m;
    }
  }
}

__global__ void __launch_bounds__(kElementwiseThreads)
    EmbeddingRowsKernel(GgmlType type, const uint8_t* __restrict__ w, size_t row_stride,
                        int64_t cols, const int32_t* __restrict__ ids, float* __restrict__ out) {
  const int64_t i = blockIdx.x;
  const uint8_t* row = w + static_cast<size_t>(ids[i]) * row_stride;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    out[i * cols + c] = DequantAt(type, row, c);
}

}  // namespace

cudaError_t LaunchKvWrite(const float* k, const float* v, const int32_t* rows, int64_t n,
                          int kv_dim, uint16_t* k_pool, uint16_t* v_pool, cudaStream_t stream) {
  const int64_t total = n * kv_dim;
  int64_t blocks = (total + kElementwiseThreads - 1) / kElementwiseThreads;
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  KvWriteKernel<<<static_cast<unsigned>(blocks), kElementwiseThreads, 0, stream>>>(
      k, v, rows, n, kv_dim, k_pool, v_pool);
  return cudaGetLastError();
}

cudaError_t LaunchPagedAttention(const float* q, const uint16_t* k_pool, const uint16_t* v_pool,
                                 const int32_t* page_table, const int32_t* table_row,
                                 const int32_t* ctx, int64_t n, int n_heads, int n_kv_heads,
                                 int head_dim, int page_tokens, int max_pages, float scale,
                                 float* out, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(n_heads), static_cast<unsigned>(n));
  PagedAttentionKernel<<<grid, kThreads, 0, stream>>>(q, k_pool, v_pool, page_table, table_row, ctx,
                                                      n_heads, n_kv_heads, head_dim, page_tokens,
                                                      max_pages, scale, out);
  return cudaGetLastError();
}

cudaError_t LaunchEmbeddingRows(GgmlType type, const void* w, size_t row_stride, int64_t cols,
                                const int32_t* ids, int64_t n, float* out, cudaStream_t stream) {
  EmbeddingRowsKernel<<<static_cast<unsigned>(n), kElementwiseThreads, 0, stream>>>(
      type, static_cast<const uint8_t*>(w), row_stride, cols, ids, out);
  return cudaGetLastError();
}

}  // namespace specnode::cuda_internal
