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

// One kv head's group of query heads for one query token, prepared by the caller.
struct KvQuery {
  const float* q = nullptr;     // [g, head_dim]: rotated like the keys, times the softmax scale
  const float* qsum = nullptr;  // [g]: Σ_d q[h, d] (the int4 min term)
  int g = 1;
  int head_dim = 0;
};

// Attention-mass observation fused into accumulate (the critical-token policy's input).
// For rows r < n: sum[pos[r]] += weight * Σ_h e[h, r] * inv[h]; cnt[pos[r]] += g.
struct KvMassOut {
  float* sum = nullptr;          // indexed by position - base
  float* cnt = nullptr;          // indexed by position - base
  const int32_t* pos = nullptr;  // [n]: the position of each row of the call
  int first = 0;                 // rows [first, n) of the call are observed
  int n = 0;
  int32_t base = 0;              // position of sum[0] / cnt[0]
  float weight = 0.0f;           // the query's context length (mass relative to a uniform share)
  const float* inv = nullptr;    // [g]: 1 / Σ e[h, ·] over the query's whole context
};

struct KvAttentionKernels {
  const char* name;  // "scalar", "avx2", "avx512"
  // s[h * ld + r] = q_h · row_r for r < n, h < q.g; rows[r] points at a row of class p.
  void (*scores)(KvPrecision p, const uint8_t* const* rows, int n, const KvQuery& q, float* s,
                 size_t ld);
  // s[r] = exp(s[r] - max_r s[r]) for r < n (n >= 1), returning Σ_r s[r]. s must have room
  // for n rounded up to kScoresPad; [n, that) is overwritten. -inf scores give exactly 0.
  float (*exp_sum)(float* s, int n);
  // out[h * head_dim + d] += Σ_r e[h * ld + r] * row_r[d] for h < g, d < head_dim, the rows
  // of class p; mass (may be null) as KvMassOut says.
  void (*accumulate)(KvPrecision p, const uint8_t* const* rows, int n, const float* e, size_t ld,
                     int g, int head_dim, float* out, const KvMassOut* mass);
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
