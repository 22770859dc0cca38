// Internal to cuda/: the GPU page pool's kernels (cuda_kv_kernels.cu) — encoding a pass's
// new K/V rows into pages of any precision class, paged attention over sequences whose
// tokens sit in pages of several classes (with the attention-mass observation the
// precision policy needs), demotion (re-encoding slots into pages of another class) and
// slot copies to and from a staging buffer (the host tier). cuda_page_pool.cc builds the
// tables and validates arguments; these launch and return cudaGetLastError(). Kept free of
// absl and model/ headers so nvcc (C++17) sees a small header.
//
// Arena layout (one device allocation, cuda_page_pool.h): a page of class c at byte offset
// `page` holds data[layer][slot][kv_head][K row | V row], rows in the formats
// kv_codec::RowFormat(c, V) (the CPU pool's layout, so a slot's bytes are the same on both).
// The byte offset of (slot s, layer l, kv head h, V?) is
//   page + (l * page_tokens + s) * SlotStride(c) + h * PairBytes(c) + V * KeyBytes(c),
//   SlotStride(c) = n_kv_heads * PairBytes(c), KeyBytes(c) = RowBytes(RowFormat(c, 0)).
// A token's table entry holds page + s * SlotStride(c) (its layer-0 base) and c.
//
// Every pointer is a device pointer; every launch is asynchronous on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "cuda/cuda_qmatvec_kernels.h"

namespace specnode::cuda_internal {

struct KvDeviceFormat {
  uint8_t* arena = nullptr;
  int n_kv_heads = 0;
  int head_dim = 0;  // even, <= 256
  int gqa_group = 1;
  int page_tokens = 0;
  int key_bytes[4] = {0, 0, 0, 0};   // a K row, per class (KvPrecision)
  int pair_bytes[4] = {0, 0, 0, 0};  // a kv head's K and V rows, per class
  int rotate = 0;                // rows stored Hadamard-rotated (head_dim a power of two)
  float hadamard_norm = 1.0f;    // 1 / sqrt(head_dim), computed as the CPU computes it
};

// One pass's tables (staged by the pool, uploaded with the backend's step tables).
struct KvDevicePass {
  // [n_tok, 3] per cached position of every sequence of the pass: byte offset of its
  // layer-0 base (low, high 32 bits), class (-1: evicted, no storage).
  const int32_t* tok = nullptr;
  // [n, 5] per row: first tok entry of its sequence, context length (position + 1), and
  // its mass observation: first key position lo, width (0: not observed), offset (floats)
  // of its [n_heads, width] block in `mass`. Fixed size per row, staged before `tok`, so
  // that a recorded pass of n rows finds both at the same addresses next time.
  const int32_t* rows = nullptr;
  // Σ over layers of softmax weight * context length, per observed row, query head and key
  // in [lo, lo + width): written at layer 0, added to at later layers (each value by one
  // thread per layer, in layer order: deterministic). Evicted keys get 0.
  float* mass = nullptr;
  int64_t n = 0;  // rows, <= 65535
};

// k, v: [n, n_kv_heads, head_dim] f32; row t is encoded (rotated first when rotate) into
// its position's slot (tok entry rows[t][0] + rows[t][1] - 1) in that slot's class.
cudaError_t LaunchKvEncode(const KvDeviceFormat& f, const KvDevicePass& p, int layer,
                           const float* k, const float* v, cudaStream_t stream);

// Scratch of the chunked (flash-decoding) attention: partials [kChunkedRows, n_heads,
// kMaxChunks, 2 + head_dim] f32 and counters [kChunkedRows, n_heads], zeroed once at
// allocation (each launch leaves them zero). Sizes in elements from KvAttentionScratchFloats
// and KvAttentionCounters. Owned by the pool; one launch at a time uses it (one stream).
struct KvAttentionScratch {
  float* partials = nullptr;
  unsigned* counters = nullptr;
};
size_t KvAttentionScratchFloats(const KvDeviceFormat& f);
size_t KvAttentionCounters(const KvDeviceFormat& f);

// q, out: [n, n_kv_heads * gqa_group, head_dim]. Row t attends positions [0, rows[t][1]) of
// its sequence (evicted ones skipped) — with window > 0 (a sliding-window layer) the last
// `window` of them only (kv_chunks::WindowStart) —, query head h reading kv head h / gqa_group;
// queries rotated like the rows and outputs rotated back when rotate. The context is cut into
// chunks and merged as kv_attention_chunks.h says; passes of at most kv_chunks::kChunkedRows rows
// spread a row's chunks over blocks using `scratch` (without scratch, or for larger passes,
// one block per row: the same bits).
// q16 (optional): out also rounded to int16 blocks there (LaunchQuantizeActs16's bytes,
// q16::WarpQuantizeBlock16), so that the output projection skips its own rounding.
cudaError_t LaunchKvAttention(const KvDeviceFormat& f, const KvDevicePass& p, int layer,
                              const float* q, float scale, int window, float* out,
                              const KvAttentionScratch& scratch, const Q16Acts* q16,
                              cudaStream_t stream);

// jobs: [n_jobs, 6]: from (offset low, high, class), to (offset low, high, class) token
// bases; every layer's K and V rows of `from` decoded and re-encoded into `to`. No two jobs
// may write the same slot or read one another's target (the pool flushes before reuse).
cudaError_t LaunchKvRecode(const KvDeviceFormat& f, int n_layers, const int32_t* jobs,
                           int64_t n_jobs, cudaStream_t stream);

// jobs: [n_jobs, 5]: slot token base (offset low, high), class, staging offset (low, high).
// A slot's bytes for layer l (SlotStride(class) of them) sit at staging offset
// + l * SlotStride(class) (KvPagePool::ReadSlot's host layout). to_staging: gather (swap
// out), else scatter (swap in).
cudaError_t LaunchKvCopySlots(const KvDeviceFormat& f, int n_layers, const int32_t* jobs,
                              int64_t n_jobs, uint8_t* staging, bool to_staging,
                              cudaStream_t stream);

}  // namespace specnode::cuda_internal
