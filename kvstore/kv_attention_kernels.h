// Private to kvstore/: the per-instruction-set kernels behind KvStore::Attend.
//
// Attention reads cached rows in their stored class (kv_precision.h) and never decodes a
// whole row to memory: the score kernel dots the query with the quantised row, the
// accumulate kernel adds weight * quantised row to the output, both on the fly. With the
// row layouts of kv_precision.h, for a query q and a row r:
//   f16   q·r = Σ q[d] f16(r[d])
//   int8  q·r = scale_r Σ q[d] i8[d]
//   int4  q·r = min_r Σ q[d] + scale_r Σ q[d] u4[d]     (Σ q[d] computed once per query)
// and w * r adds w * scale_r * (i8 | u4) per value plus, for int4, w * min_r to every
// value (summed per head as one bias and added once per call).
//
// Each of kv_attention_{scalar,avx2,avx512}.cc is compiled for its own ISA and exports one
// table. Only kv_store.cc (and tests) call them, and only after GetCpuFeatures() confirmed
// the CPU has the ISA; the tables themselves are constant data, so linking them executes
// nothing. The SIMD tables need head_dim % 16 == 0 (KvStore falls back to scalar
// otherwise).
//
// Determinism: every kernel computes a row's score with an instruction sequence that
// depends only on the row and the query (rows are reduced in groups, a short group padded
// with copies of its last row), and sums over rows in row order (accumulate: in fixed
// blocks of kAccumulateBlock rows counted from the call's first row; exp_sum: lane-wise
// then across lanes, which depends only on n). KvStore hands each call the positions of
// one class in position order, which depend only on the block table and the query's
// position, so a query's output is the same whatever the batch or the threads.
//
// Thread-safety: pure functions of their arguments; concurrent calls on disjoint outputs
// are safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvstore/kv_precision.h"

namespace specnode::kv_kernels {

// Rows handed to one accumulate call are processed in blocks of this many (partial sums
// per block, added to out in block order).
inline constexpr int kAccumulateBlock = 64;
// Scores buffers must have room for n rounded up to this many floats (exp_sum pads).
inline constexpr int kScoresPad = 16;

// Query heads prepared by the caller: one kv head's group of query heads for one query
// token, or those groups of several query tokens one after the other (a verification or
// prefill block asks every cached row once for all of its tokens).
struct KvQuery {
  const float* q = nullptr;     // [g, head_dim]: rotated like the keys, times the softmax scale
  const float* qsum = nullptr;  // [g]: Σ_d q[h, d] (the int4 min term)
  int g = 1;                    // heads (not necessarily a GQA group)
  int head_dim = 0;
};

struct KvAttentionKernels {
  const char* name;  // "scalar", "avx2", "avx512"
  // s[h * ld + r] = q_h · row_r for r < n, h < q.g; rows[r] points at a row of class p.
  void (*scores)(KvPrecision p, const uint8_t* const* rows, int n, const KvQuery& q, float* s,
                 size_t ld);
  // s[r] = exp(s[r] - max_r s[r]) for r < n (n >= 1), returning Σ_r s[r]. s must have room
  // for n rounded up to kScoresPad; [n, that) is overwritten. -inf scores give exactly 0.
  float (*exp_sum)(float* s, int n);
  // out[h * head_dim + d] += Σ_{r < n_h} e[h * ld + r] * row_r[d] for h < g, d < head_dim,
  // the rows of class p, where n_h = head_rows[h] (0 <= n_h <= n) or n when head_rows is
  // null. A head's sum is the one a call with n = n_h for that head alone computes, bit for
  // bit (the rows a causal query does not see are skipped, not weighted by zero), and
  // e[h * ld + r] for r >= n_h is not read.
  void (*accumulate)(KvPrecision p, const uint8_t* const* rows, int n, const float* e, size_t ld,
                     int g, int head_dim, const int* head_rows, float* out);
  // The f16 row of x (kv_precision.h, KvPrecision::kFull): row[2i, 2i + 2) = Fp32ToFp16(x[i])
  // for i < n, little-endian, bit for bit (round to nearest even, inf, NaN payloads; F16C
  // in the SIMD tables), n % 16 == 0 in the SIMD tables, n even in the scalar one (it is
  // KvEncodeRow). The write path's encoder.
  void (*encode_f16)(const float* x, int n, uint8_t* row);
};

// Defined one per ISA file. Calling a table's functions needs the matching CPU support:
// avx2: CpuFeatures::avx2; avx512: CpuFeatures::avx512.
extern const KvAttentionKernels kScalarKvKernels;
extern const KvAttentionKernels kAvx2KvKernels;
extern const KvAttentionKernels kAvx512KvKernels;

// The best table GetCpuFeatures() allows (honours SPECNODE_CPU) for rows of head_dim
// values: scalar unless head_dim % 16 == 0.
const KvAttentionKernels& SelectedKvKernels(int head_dim);
// Every table this CPU can run, scalar first (tests iterate over these).
std::vector<const KvAttentionKernels*> SupportedKvKernels();

}  // namespace specnode::kv_kernels
