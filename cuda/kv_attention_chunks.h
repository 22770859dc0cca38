// How the GPU's paged attention (cuda_kv_kernels.cu) cuts a row's context into chunks and
// merges them, as code that compiles for the host and the GPU (a host test,
// cuda/tests/kv_pool_host_test.cc, checks the cut).
//
// A row of context length L attends positions [0, L) (with a sliding window, the last
// `window` of them: WindowStart) in ChunkCount(L) chunks of about equal
// size (at least kChunkMin positions each, at most kMaxChunks chunks): a function of L only.
// Each chunk yields a partial (m, l, acc): the softmax's maximum, denominator and weighted V
// sum over its positions (the block's warps walking the chunk, then combined in warp order);
// the row's result merges the partials in chunk order with MergePartial, then acc / l.
// Decode and verification passes run each chunk in its own thread block (flash-decoding:
// a long context fills the GPU even at batch 1) and the last block of a row to finish merges;
// larger passes run a row's chunks one after the other in one block. Both do the same
// arithmetic in the same order, so a row's output is the same bits whichever way its pass
// ran it, and batch-invariant. Kept free of absl and C++20 (nvcc builds C++17). Pure
// functions, thread-safe.
#pragma once

#include <math.h>

#if defined(__CUDACC__)
#define SPECNODE_KV_HD __host__ __device__ __forceinline__
#else
#define SPECNODE_KV_HD inline
#endif

namespace specnode::kv_chunks {

inline constexpr int kChunkMin = 256;  // positions a chunk holds at least (when L allows)
inline constexpr int kMaxChunks = 16;  // chunks of one row at most
// Passes of at most this many rows run a row's chunks in separate blocks (their partials
// in a scratch sized for this many rows); larger passes have blocks enough.
inline constexpr int kChunkedRows = 64;
// Blocks a chunked pass aims at (query heads x rows x blocks per row), ~4 per SM of an H100.
inline constexpr int kTargetBlocks = 512;

// The first position a row of context length `length` attends: length - window for a
// sliding-window layer (window > 0) whose context is longer than its window, else 0 (the
// CPU's [max(0, p - window + 1), p] for the row at position p = length - 1). A windowed row
// cuts [WindowStart, length) into chunks as a row of length - WindowStart positions would.
SPECNODE_KV_HD int WindowStart(int length, int window) {
  return window > 0 && length > window ? length - window : 0;
}

// Chunks of a row of context length `length` (>= 0): 1 .. kMaxChunks.
SPECNODE_KV_HD int ChunkCount(int length) {
  const int c = (length + kChunkMin - 1) / kChunkMin;
  return c < 1 ? 1 : (c > kMaxChunks ? kMaxChunks : c);
}

// Chunk c's positions [*begin, *end) (possibly empty at the end of a short row).
SPECNODE_KV_HD void ChunkBounds(int length, int c, int* begin, int* end) {
  const int z = ChunkCount(length);
  const int size = (length + z - 1) / z;
  const int b = c * size;
  *begin = b < length ? b : length;
  *end = b + size < length ? b + size : length;
}

// Merges a chunk's partial (m_c, l_c, acc_c: one value of acc) into the running (m, l, acc):
// a chunk that saw no position (l_c == 0) is skipped; into an empty running state (l == 0)
// the chunk is copied exactly; otherwise both are rescaled to the larger maximum. Every
// product and sum spelled with fmaf / explicit roundings, so no compiler contraction differs
// between the kernels that call it.
SPECNODE_KV_HD void MergePartial(float m_c, float l_c, float acc_c, float* m, float* l,
                                 float* acc) {
  if (!(l_c > 0.0f)) return;
  if (!(*l > 0.0f)) {
    *m = m_c;
    *l = l_c;
    *acc = acc_c;
    return;
  }
  const float big = fmaxf(*m, m_c);
  const float a = expf(*m - big), b = expf(m_c - big);
  const float la = *l * a, acca = *acc * a;  // separate roundings (no fma contraction)
  *l = fmaf(l_c, b, la);
  *acc = fmaf(acc_c, b, acca);
  *m = big;
}

}  // namespace specnode::kv_chunks
