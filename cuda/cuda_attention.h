// The KV-cache side of the Llama forward pass on the GPU: writing new K/V rows into a paged
// f16 pool, causal attention over it, and embedding rows. Host bookkeeping (which pages a
// sequence owns) is the KV manager's (kvstore/kv_store.h) over cuda_page_pool.h; this header
// is only the kernels.
//
// Pool layout (one K pool and one V pool per layer):
//   [n_pages * page_tokens, kv_dim] f16, kv_dim = n_kv_heads * head_dim; pool row
//   page * page_tokens + slot holds one token's K (or V) for every kv head.
// A sequence's position p lives in row pages[p / page_tokens] * page_tokens + p % page_tokens,
// `pages` being its page list.
//
// Every pointer is a DEVICE pointer. f16 values travel as their uint16_t bit patterns so
// host code needs no CUDA headers. Launches are asynchronous on `stream`; arguments are
// validated before any CUDA call (InvalidArgument), launch failures are Internal with
// file:line (cuda_check.h).
//
// Batch invariance: each (token, head) is computed by one thread block whose work depends
// only on that token's query and context, never on n or on the other tokens, so a token's
// attention output is bit-identical alone and in a batch (speculative verification relies
// on it, as on the CPU).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "model/cpu/cpu_matmul.h"

namespace specnode {

// k_pool[rows[i]] = f16(k[i]), v_pool[rows[i]] = f16(v[i]) for i < n.
// k, v: [n, kv_dim] f32; rows: [n] int32 pool rows; pools: [pool_rows, kv_dim] f16 bits.
absl::Status CudaKvWrite(const float* k, const float* v, const int32_t* rows, int64_t n,
                         int kv_dim, uint16_t* k_pool, uint16_t* v_pool,
                         cudaStream_t stream = nullptr);

// Causal attention of n query tokens over their sequences' cached K/V (the new tokens'
// rows must already be written). Token t attends to positions [0, ctx[t]) of the sequence
// whose page list is page_table row table_row[t]; query head h reads kv head
// h / (n_heads / n_kv_heads) (grouped-query attention). Softmax in f32 with a running
// maximum (one pass over the context per warp, then the warps' partial results combined).
struct CudaAttentionArgs {
  const float* q = nullptr;            // [n, n_heads, head_dim]
  const uint16_t* k_pool = nullptr;    // [pool_rows, n_kv_heads * head_dim] f16 bits
  const uint16_t* v_pool = nullptr;    // [pool_rows, n_kv_heads * head_dim] f16 bits
  const int32_t* page_table = nullptr; // [table_rows, max_pages] page ids
  const int32_t* table_row = nullptr;  // [n] page_table row of each token
  const int32_t* ctx = nullptr;        // [n] positions each token attends (its position + 1)
  int64_t n = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;    // 1..256
  int page_tokens = 0;
  int max_pages = 0;   // page_table row length
  float scale = 1.0f;  // applied to q·k
  float* out = nullptr;  // [n, n_heads, head_dim]
};
absl::Status CudaPagedAttention(const CudaAttentionArgs& args, cudaStream_t stream = nullptr);

// out[i] = row ids[i] of the embedding matrix `w` (any supported type), dequantised.
// ids: [n] int32 (checked by the caller against w.rows); out: [n, w.cols] f32.
absl::Status CudaEmbeddingRows(const WeightView& w, const int32_t* ids, int64_t n, float* out,
                               cudaStream_t stream = nullptr);

}  // namespace specnode
